"""The ExecuTorch target: ``torch.export`` of the model lowered to the XNNPACK delegate in one ``.pte`` program, run
by ExecuTorch's runtime on the CPU (fp32, dynamic int8 Linear layers with the extra math fp32).

The modules, by role:

- :mod:`.program`: the program lowered (and quantized at int8), its graph's nodes inside and outside the delegates,
  written, checked before ExecuTorch's runtime sees it and loaded on the one CPU threadpool; the backend's cache of
  programs lowered from the module (:func:`~.program.cached_program`);
- :mod:`.backend`: the ``executorch`` backend, which loads a program ``export-model`` verified or lowers one from the
  module into its cache;
- :mod:`.format` and :mod:`.schema`: ``--format executorch``, a program verified against eager PyTorch before it is
  written, and its report ``<program>.pte.json``.

A test that replaces a function patches it in :mod:`.program`, which the backend and the format call through.
"""

from attnzoo.runtime.targets import Target

from .backend import EXECUTORCH, ExecuTorchBackend, ExecuTorchSession
from .schema import ExecuTorchReport

__all__ = ["TARGET", "EXECUTORCH", "ExecuTorchBackend", "ExecuTorchSession", "ExecuTorchReport"]

TARGET = Target(
    "executorch",
    "ExecuTorch",
    "torch.export lowered to the XNNPACK delegate in one .pte program, run by ExecuTorch's runtime (CPU fp32, "
    "dynamic int8)",
    requires=("executorch",),
    install="pip install 'attnzoo[executorch]'",
    backends=(EXECUTORCH,),
    formats={"executorch": "attnzoo.targets.executorch.format:FORMAT"},
    reports={"executorch": ExecuTorchReport},
    order=50,
)
