"""attnzoo.serve: the Gradio demo (Classify, Segment and Compare tabs) over ONNX Runtime, PyTorch or TensorRT.

The demo is offline: importing this package switches off Gradio's analytics and any Hugging Face Hub access
before Gradio itself is imported. CLI: ``serve-demo`` (:func:`attnzoo.serve.demo.cli.main`).

>>> from attnzoo.serve import build_demo, load_models          # doctest: +SKIP
>>> demo = build_demo(load_models(models_dir="exported/"))      # doctest: +SKIP
"""

from __future__ import annotations

import os

# Must happen before anything imports gradio or huggingface_hub.
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ["DO_NOT_TRACK"] = "1"
os.environ.setdefault("GRADIO_SSR_MODE", "False")

from attnzoo.lazy import lazy_import
from attnzoo.serve.loading import load_models
from attnzoo.serve.predict import classify, segment
from attnzoo.serve.served import ServedModel

_demo_app = lazy_import("attnzoo.serve.demo.app")  # gradio: imported by the first build_demo


def build_demo(*args, **kwargs):
    """Build the ``gr.Blocks`` demo (see :func:`attnzoo.serve.demo.app.build_demo`); imports Gradio lazily."""
    return _demo_app.build_demo(*args, **kwargs)


__all__ = ["ServedModel", "load_models", "classify", "segment", "build_demo"]
