"""attnzoo.training: data sets (``shapes``, ``digits``, image folders, ADE20K-layout folders), training and
evaluation (``train-model``, ``evaluate-model``) and the model-zoo builder (``python -m attnzoo.training.zoo``)."""

from attnzoo.data.datasets import (
    DIGITS_CLASSES,
    SHAPES_CLASSES,
    SHAPES_SEG_CLASSES,
    ImageSet,
    TensorDataset,
    load_data,
    shapes,
    shapes_images,
)
from attnzoo.training.train import TrainConfig, evaluate, evaluate_checkpoint, train

__all__ = [
    "SHAPES_CLASSES",
    "SHAPES_SEG_CLASSES",
    "DIGITS_CLASSES",
    "ImageSet",
    "TensorDataset",
    "load_data",
    "shapes",
    "shapes_images",
    "TrainConfig",
    "train",
    "evaluate",
    "evaluate_checkpoint",
]
