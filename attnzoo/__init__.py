"""attnzoo: attention variants from five recent papers, made deployable.

The layers, bottom to top (each a folder of the repository; a module imports only from its own layer or below,
``tests/core/test_layers.py`` enforces it; ``docs/architecture.md`` draws it):

- :mod:`attnzoo` (``attnzoo/``) -- core: errors and exit codes, limits, atomic files, preprocessing, the
  machine description, metrics; :mod:`attnzoo.data`: the data sets.
- :mod:`attnzoo.models` -- the attention variants (one file per paper), ViT classifiers and Segmenters,
  checkpoints.
- :mod:`attnzoo.zoo` -- the trained models shipped with the package.
- :mod:`attnzoo.runtime` -- the deployment layer: the model contract, one registry of backends (eager,
  compile, ONNX Runtime, OpenVINO, TensorRT), parity with one tolerance table.
- :mod:`attnzoo.export` -- ONNX export with the extra math as named ops, verification, int8/fp8, TensorRT,
  Triton; ``export-model``.
- Applications: :mod:`attnzoo.training` (``train-model``, the zoo build), :mod:`attnzoo.benchmarks`
  (``bench-latency``, the scaling benchmark), :mod:`attnzoo.report` (``report-variant``), :mod:`attnzoo.serve`
  (the Gradio demo ``serve-demo`` and the Ray Serve app ``serve-models``).

The research studies (MAE forms, quantized tables, int8, bf16) are not part of the package: they live in the
repository's ``research/`` folder and run from a checkout.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("attnzoo")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
