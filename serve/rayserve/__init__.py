"""attnzoo.serve.rayserve: serving past one process.

- :func:`serve_models` (:mod:`.launch`: the models :mod:`.selection` chooses, on the Ray and HAProxy that
  :mod:`.environment` starts, ended by :mod:`.reaping` and :mod:`.watchdog`), and ``serve-models`` (:mod:`.cli`)
  around it: the verified ONNX models behind a Ray Serve deployment (:mod:`.app`) with ``@serve.batch`` dynamic
  batching, replicas, HTTP routes for classify / segment, health and stats;
- :mod:`.loadtest`: concurrent clients against it, with the offline benchmark on the same machine.

Triton model repositories are written by ``export-model --format triton`` (:mod:`attnzoo.targets.triton.config`).
"""

from attnzoo.serve.rayserve.config import ServeConfig
from attnzoo.serve.rayserve.launch import Served, serve_models

__all__ = ["ServeConfig", "Served", "serve_models"]
