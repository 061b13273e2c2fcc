"""Convolutional stem for small images: a drop-in ``embed_layer`` for timm's ``VisionTransformer``.

Xiao et al., "Early Convolutions Help Transformers See Better", NeurIPS 2021 (arXiv:2106.14881): replacing the
ViT's single patchify convolution by a few stride-2 3x3 convolutions (BatchNorm, ReLU) and a final 1x1
convolution makes ViTs train faster and more stably, most of all on small data. Only the stem changes: the
tokens, and so every attention variant, are exactly as with patchify.
"""

from __future__ import annotations

import math

from timm.layers import PatchEmbed
from torch import nn

__all__ = ["ConvStemPatchEmbed"]


class ConvStemPatchEmbed(PatchEmbed):
    """timm ``PatchEmbed`` whose ``proj`` is ``log2(patch_size)`` stride-2 3x3 convs + BN + ReLU, then a 1x1 conv.

    Takes ``PatchEmbed``'s constructor keywords; ``patch_size`` must be a power of two. Channel widths double
    at each stage up to ``embed_dim / 2``.
    """

    def __init__(self, img_size=224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768, **kwargs):
        super().__init__(img_size=img_size, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim, **kwargs)
        p = self.patch_size[0]
        stages = int(round(math.log2(p))) if p > 1 else 0
        if self.patch_size[0] != self.patch_size[1] or 2**stages != p:
            raise ValueError(f"ConvStemPatchEmbed needs a square power-of-two patch size, got {self.patch_size}")
        layers, width = [], in_chans
        for i in range(stages):
            out = max(8, embed_dim // 2 ** (stages - i))
            layers += [
                nn.Conv2d(width, out, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(out),
                nn.ReLU(inplace=True),
            ]
            width = out
        layers.append(nn.Conv2d(width, embed_dim, 1))
        # timm infers PatchEmbed.proj as the Conv2d it builds; its forward only needs (B, C, H, W) -> (B, D, h, w).
        self.proj = nn.Sequential(*layers)  # type: ignore[assignment]
