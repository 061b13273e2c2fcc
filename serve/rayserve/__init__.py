"""attnzoo.serve.rayserve: serving past one process.

- ``serve-models`` (:mod:`.cli`): the verified ONNX models behind a Ray Serve deployment (:mod:`.app`) with
  ``@serve.batch`` dynamic batching, replicas, HTTP routes for classify / segment, health and stats;
- :mod:`.loadtest`: concurrent clients against it, with the offline benchmark on the same machine.

Triton model repositories are written by ``export-model --format triton`` (:mod:`attnzoo.export.triton`).
"""
