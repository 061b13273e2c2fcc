"""The AOTInductor target: the model compiled ahead of time by ``torch.export`` and Inductor into one ``.pt2``
package that runs without the model's Python code, on the CPU (fp32) or a CUDA GPU (fp32, fp16).

The modules, by role:

- :mod:`.package`: the program exported with a dynamic batch, compiled into a package, checked before it is opened
  and loaded; the backend's cache of packages compiled from the module (:func:`~.package.cached_package`); where a
  package can be compiled here (:func:`~.package.aoti_problem`) and how it computes the MAE variants' L1 core
  (:data:`~.package.MAE_IMPL`);
- :mod:`.backend`: the ``aoti`` backend, which loads a package ``export-model`` verified or compiles one from the
  module into its cache;
- :mod:`.format` and :mod:`.schema`: ``--format aoti``, a package verified against eager PyTorch before it is
  written, and its report ``<package>.pt2.json``.

A test that replaces a function patches it in :mod:`.package`, which the backend and the format call through.
"""

from attnzoo.runtime.targets import Target

from .backend import AOTI, AotiBackend, AotiSession
from .schema import AOTIReport

__all__ = ["TARGET", "AOTI", "AotiBackend", "AotiSession", "AOTIReport"]

TARGET = Target(
    "aoti",
    "AOTInductor",
    "torch.export compiled ahead of time by Inductor into one .pt2 package (CPU fp32, CUDA fp32/fp16), run without "
    "the model's Python code",
    backends=(AOTI,),
    formats={"aoti": "attnzoo.targets.aoti.format:FORMAT"},
    reports={"aoti": AOTIReport},
    order=10,
)
