"""attnzoo.data: the data sets every layer above reads.

- :mod:`.fashion`: Fashion-MNIST (its official IDX files ship with the package), as classification and as composed
  segmentation scenes;
- :mod:`.datasets`: the procedural ``shapes`` set, scikit-learn's ``digits``, users' image folders and
  ADE20K-layout folders, and :func:`~attnzoo.data.datasets.load_data`, which names them all.
"""

from attnzoo.data.datasets import (
    BUILTIN_DATA,
    DIGITS_CLASSES,
    SHAPES_CLASSES,
    SHAPES_SEG_CLASSES,
    ImageSet,
    TensorDataset,
    load_data,
    shapes,
    shapes_images,
)

__all__ = [
    "BUILTIN_DATA",
    "SHAPES_CLASSES",
    "SHAPES_SEG_CLASSES",
    "DIGITS_CLASSES",
    "ImageSet",
    "TensorDataset",
    "load_data",
    "shapes",
    "shapes_images",
]
