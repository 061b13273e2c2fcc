"""attnzoo.training: data sets (``shapes``, ``digits``, image folders, ADE20K-layout folders), training and
evaluation (``train-model``, ``evaluate-model``) and the model-zoo builder (``python -m attnzoo.training.zoo``).

Each name below is imported from its module at its first use (:func:`attnzoo.lazy.lazy_exports`): the commands'
entry module loads without torch, so that a bad command line is refused at once.
"""

from typing import TYPE_CHECKING

from attnzoo.lazy import lazy_exports

if TYPE_CHECKING:  # for type checkers; at run time each name is imported at its first use
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

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "attnzoo.data.datasets": (
            "DIGITS_CLASSES",
            "SHAPES_CLASSES",
            "SHAPES_SEG_CLASSES",
            "ImageSet",
            "TensorDataset",
            "load_data",
            "shapes",
            "shapes_images",
        ),
        "attnzoo.training.train": ("TrainConfig", "evaluate", "evaluate_checkpoint", "train"),
    },
)
