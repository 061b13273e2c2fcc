"""Segmenter: a ViT encoder with a linear or mask-transformer decoder.

Strudel et al., "Segmenter: Transformer for Semantic Segmentation", ICCV 2021. The encoder is the same timm
``VisionTransformer`` as the classifier (with the variant's attention); the decoders follow the paper's
section 3.2: ``linear`` maps each patch token to class logits; ``mask`` (the mask transformer) appends K
learnable class embeddings to the patch tokens, runs a few transformer blocks, and takes the scalar products
of L2-normalised patch and class embeddings as K masks. Logits are upsampled bilinearly to the input size.

Any input size: the image is padded (bottom/right, zeros) to a multiple of the patch size, the position
embedding is resampled to the new grid (timm ``dynamic_img_size``), and the logits are cropped back.
:meth:`Segmenter.forward_sliding` runs sliding-window inference for images larger than the training size.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

__all__ = ["Segmenter", "LinearDecoder", "MaskTransformerDecoder", "DECODERS"]


class LinearDecoder(nn.Module):
    """Per-patch linear classifier (Segmenter's baseline decoder)."""

    def __init__(self, num_classes: int, encoder_dim: int) -> None:
        super().__init__()
        self.head = nn.Linear(encoder_dim, num_classes)

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """(B, h*w, D) patch tokens -> (B, K, h, w) logits."""
        B = tokens.shape[0]
        return self.head(tokens).transpose(1, 2).reshape(B, -1, grid[0], grid[1])


class MaskTransformerDecoder(nn.Module):
    """Segmenter's mask transformer (standard attention blocks; the variant lives in the encoder)."""

    def __init__(
        self,
        num_classes: int,
        encoder_dim: int,
        dim: int | None = None,
        depth: int = 2,
        num_heads: int | None = None,
        mlp_ratio: float = 4.0,
        drop_path_rate: float = 0.0,
    ) -> None:
        super().__init__()
        dim = dim or encoder_dim
        num_heads = num_heads or max(1, dim // 64)
        self.num_classes = num_classes
        self.scale = dim**-0.5
        self.proj_dec = nn.Linear(encoder_dim, dim)
        self.cls_emb = nn.Parameter(torch.zeros(1, num_classes, dim))
        self.blocks = nn.ModuleList(
            [
                Block(
                    dim, num_heads, mlp_ratio=mlp_ratio, qkv_bias=True, drop_path=drop_path_rate * i / max(1, depth - 1)
                )
                for i in range(depth)
            ]
        )
        self.decoder_norm = nn.LayerNorm(dim)
        self.proj_patch = nn.Parameter(self.scale * torch.randn(dim, dim))
        self.proj_classes = nn.Parameter(self.scale * torch.randn(dim, dim))
        self.mask_norm = nn.LayerNorm(num_classes)
        trunc_normal_(self.cls_emb, std=0.02)

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """(B, h*w, D) patch tokens -> (B, K, h, w) mask logits."""
        B = tokens.shape[0]
        x = torch.cat([self.proj_dec(tokens), self.cls_emb.expand(B, -1, -1)], dim=1)
        for blk in self.blocks:
            x = blk(x)
        x = self.decoder_norm(x)
        patches = x[:, : -self.num_classes] @ self.proj_patch
        classes = x[:, -self.num_classes :] @ self.proj_classes
        patches = F.normalize(patches, dim=-1)
        classes = F.normalize(classes, dim=-1)
        masks = self.mask_norm(patches @ classes.transpose(1, 2))  # (B, h*w, K)
        return masks.transpose(1, 2).reshape(B, self.num_classes, grid[0], grid[1])


DECODERS = ("linear", "mask")


class Segmenter(nn.Module):
    """ViT encoder + decoder; ``forward`` returns (B, K, H, W) logits for (B, 3, H, W) images of any size.

    Args:
        encoder: A timm ``VisionTransformer`` built with ``num_classes=0`` and ``dynamic_img_size=True``.
        num_classes: K.
        decoder: ``linear`` or ``mask``.
        decoder_depth: Blocks of the mask transformer.
    """

    def __init__(
        self, encoder: VisionTransformer, num_classes: int, decoder: str = "linear", decoder_depth: int = 2
    ) -> None:
        super().__init__()
        if decoder not in DECODERS:
            raise ValueError(f"unknown decoder {decoder!r}; valid: {', '.join(DECODERS)}")
        self.encoder = encoder
        self.num_classes = num_classes
        self.num_features = encoder.num_features  # timm's name for the width the head reads (save_for_hf records it)
        self.patch_size = encoder.patch_embed.patch_size[0]
        size = encoder.patch_embed.img_size
        self.img_size: tuple[int, int] = (int(size[0]), int(size[1]))
        dim = encoder.embed_dim
        self.decoder: LinearDecoder | MaskTransformerDecoder
        if decoder == "linear":
            self.decoder = LinearDecoder(num_classes, dim)
        else:
            attn = cast(nn.Module, encoder.blocks[0].attn)
            heads = cast(int, attn.num_heads)  # every attention layer sets its int num_heads
            self.decoder = MaskTransformerDecoder(num_classes, dim, depth=decoder_depth, num_heads=heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"Segmenter expects images of shape (batch, 3, H, W), got {tuple(x.shape)}")
        H, W = x.shape[-2:]
        p = self.patch_size
        pad_h, pad_w = (-H) % p, (-W) % p
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        Hp, Wp = H + pad_h, W + pad_w
        tokens = self.encoder.forward_features(x)[:, self.encoder.num_prefix_tokens :]
        masks = self.decoder(tokens, (Hp // p, Wp // p))
        masks = F.interpolate(masks, size=(Hp, Wp), mode="bilinear", align_corners=False)
        return masks[:, :, :H, :W]

    @torch.no_grad()
    def forward_sliding(
        self, x: torch.Tensor, window: tuple[int, int] | None = None, stride: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """Sliding-window inference: average the logits of overlapping windows (default: training size,
        stride 2/3 of it). Images no larger than the window take a single forward pass."""
        H, W = x.shape[-2:]
        wh, ww = window or self.img_size
        if H <= wh and W <= ww:
            return self(x)
        sh, sw = stride or (max(1, wh * 2 // 3), max(1, ww * 2 // 3))
        logits = x.new_zeros(x.shape[0], self.num_classes, H, W)
        count = x.new_zeros(1, 1, H, W)
        rows = max(1, math.ceil((H - wh) / sh) + 1) if H > wh else 1
        cols = max(1, math.ceil((W - ww) / sw) + 1) if W > ww else 1
        for r in range(rows):
            for c in range(cols):
                y0 = max(0, min(r * sh, H - wh))
                x0 = max(0, min(c * sw, W - ww))
                crop = x[:, :, y0 : y0 + wh, x0 : x0 + ww]
                logits[:, :, y0 : y0 + crop.shape[-2], x0 : x0 + crop.shape[-1]] += self(crop)
                count[:, :, y0 : y0 + crop.shape[-2], x0 : x0 + crop.shape[-1]] += 1
        return logits / count
