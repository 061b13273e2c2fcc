"""The TensorRT target: one builder for ``export-model``, ``bench-latency`` and the demo, the ``tensorrt`` backend
that runs its engines, and ``--format tensorrt``.

Two libraries, one API:

- ``tensorrt_rtx`` (NVIDIA TensorRT for RTX, ``pip install tensorrt-rtx``) builds engines **ahead of time, with
  no GPU**, for a named compute capability (``SM75`` ... ``SM121``), or for ``CURRENT``, the GPU present. Its
  engines run only on the GPUs of its support matrix (:data:`RTX_RUNS_ON`: GeForce/RTX-class Turing to
  Blackwell); on any other GPU (an A100, an H100) running one is refused in one line naming the GPU;
- ``tensorrt`` (TensorRT >= 10) builds only for the GPU it runs on: the engine for data-centre GPUs.

The modules, by role:

- :mod:`.library`: which library is used here and its version, the build targets and the GPUs its engines run
  on, the errors, and the logger TensorRT calls back into;
- :mod:`.builder`: ONNX parsed into a strongly typed network, the network's precision checked, the builder
  configured (profile, target, TF32) and the engine built, once per key in the engine cache (:func:`build_cached`);
- :mod:`.backend` and its loader :mod:`.engine`: the ``tensorrt`` backend, which deserializes an engine and runs it
  on torch CUDA buffers from a CUDA graph;
- :mod:`.verified`: an engine of ``export-model``: built from a verified ONNX only, its network checked for the
  variant's extra math, compared with ONNX Runtime where a GPU runs it, its report written (:mod:`.schema`);
- :mod:`.options` and :mod:`.format`: ``--compute-capability`` and ``--format tensorrt``, whose engine step
  Triton's ``tensorrt_plan`` folder composes.

Every public name of :mod:`.library` and :mod:`.builder` is importable from here; the modules of this folder
import them from the module that defines them, never from here (so this face imports its modules and none of them
imports it back). A test that replaces a function patches it where it is defined and looked up
(``builder.build_cached``, ``builder.run_in_worker``, ``library.gpu_available`` and its imports in ``builder`` and
the engine loader).
"""

from __future__ import annotations

from attnzoo.runtime.targets import Target

from . import builder, library
from .backend import TENSORRT
from .builder import *  # noqa: F403 -- the builder's public names (its __all__) are the package's face
from .library import *  # noqa: F403 -- and the library's
from .options import COMPUTE_CAPABILITY
from .schema import EngineReport

__all__ = ["TARGET"]
__all__ += library.__all__
__all__ += builder.__all__

TARGET = Target(
    "tensorrt",
    "TensorRT",
    "engines built from the verified ONNX with TensorRT-RTX (ahead of time, no GPU needed) or TensorRT proper (on "
    "the GPU it runs on), run from a CUDA graph",
    requires=("tensorrt_rtx", "tensorrt"),
    install="pip install 'attnzoo[tensorrt]' (TensorRT-RTX), or 'attnzoo[tensorrt10]' on a data-centre GPU",
    backends=(TENSORRT,),
    formats={"tensorrt": "attnzoo.targets.tensorrt.format:FORMAT"},
    reports={"engine": EngineReport},
    options=(COMPUTE_CAPABILITY,),
    order=40,
)
