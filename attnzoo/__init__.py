"""attnzoo: attention variants from five recent papers, made deployable.

Sub-packages (each a top-level folder of the repository):

- :mod:`attnzoo.models` -- the attention layers, ViT classifiers and Segmenter models.
- :mod:`attnzoo.export` -- ONNX export with the projection kept as explicit ops; TensorRT engines.
- :mod:`attnzoo.training` -- the bundled data sets, training and evaluation.
- :mod:`attnzoo.benchmarks` -- latency benchmarks (eager, compile, ONNX Runtime, TensorRT).
- :mod:`attnzoo.serve` -- the Gradio demo.
- :mod:`attnzoo.zoo` -- the trained model zoo shipped with the package.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("attnzoo")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
