"""PyTorch itself: the model run eagerly (the reference every other target is checked against) and through
``torch.compile``."""

from attnzoo.runtime.targets import Target

from .compile import COMPILE, CompileBackend
from .eager import EAGER, TorchBackend, TorchSession

__all__ = ["TARGET", "EAGER", "COMPILE", "TorchBackend", "TorchSession", "CompileBackend"]

TARGET = Target(
    "pytorch",
    "PyTorch",
    "the PyTorch model itself, eager and torch.compile (Inductor), on the CPU or a CUDA GPU",
    backends=(EAGER, COMPILE),
    order=0,
)
