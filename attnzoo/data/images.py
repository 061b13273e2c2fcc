"""The in-memory form every data set loads into (:class:`ImageSet`), and gray-to-RGB conversion.

Apart from :mod:`attnzoo.data.datasets` so that the loaders of :mod:`attnzoo.data.fashion` and
:mod:`attnzoo.data.datasets` both build on it without importing each other both ways.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

__all__ = ["ImageSet", "gray_to_rgb"]


@dataclass
class ImageSet:
    """One split of a data set held in memory."""

    images: np.ndarray  # uint8 (N, H, W, 3)
    labels: np.ndarray  # int64 (N,)
    masks: np.ndarray | None  # uint8 (N, H, W) class indices, or None (classification only)
    class_names: list[str]
    name: str

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, n: int | None) -> ImageSet:
        """The first ``n`` samples (all when ``n`` is None)."""
        if n is None or n >= len(self):
            return self
        masks = None if self.masks is None else self.masks[:n]
        return ImageSet(self.images[:n], self.labels[:n], masks, self.class_names, self.name)


def gray_to_rgb(gray: np.ndarray, size: int, resample=Image.Resampling.BILINEAR) -> np.ndarray:
    """(N, h, w) uint8 gray images -> (N, size, size, 3) uint8, resized with ``resample`` when the size differs."""
    if gray.shape[1:] != (size, size):
        gray = (
            np.stack([np.asarray(Image.fromarray(g).resize((size, size), resample)) for g in gray])
            if len(gray)
            else np.zeros((0, size, size), np.uint8)
        )
    return np.repeat(gray[..., None], 3, axis=-1)
