"""attnzoo.training: training and evaluation (``train-model``, ``evaluate-model``) and the model-zoo builder
(``python -m attnzoo.training.zoo``). The data sets they read are :mod:`attnzoo.data`'s.

Each name below is imported from its module at its first use (:func:`attnzoo.lazy.lazy_exports`): the commands'
entry module loads without torch, so that a bad command line is refused at once.
"""

import warnings
from typing import TYPE_CHECKING, Any

from attnzoo.lazy import lazy_exports

if TYPE_CHECKING:  # for type checkers; at run time each name is imported at its first use
    from attnzoo.training.train import TrainConfig, evaluate, evaluate_checkpoint, train

__all__ = ["TrainConfig", "train", "evaluate", "evaluate_checkpoint"]

_exported, __dir__ = lazy_exports(__name__, {"attnzoo.training.train": tuple(__all__)})

#: The data sets' names this package re-exported before they were :mod:`attnzoo.data`'s alone: still read here,
#: with a DeprecationWarning, for one release.
_MOVED_TO_DATA = frozenset(
    "DIGITS_CLASSES SHAPES_CLASSES SHAPES_SEG_CLASSES ImageSet TensorDataset load_data shapes shapes_images".split()
)


def __getattr__(name: str) -> Any:
    if name in _MOVED_TO_DATA:
        warnings.warn(
            f"attnzoo.training.{name} is deprecated: import it from attnzoo.data", DeprecationWarning, stacklevel=2
        )
        import attnzoo.data

        return getattr(attnzoo.data, name)
    return _exported(name)
