"""attnzoo.benchmarks: ``bench-latency``, latency of every attention variant on every backend.

Timing follows trtexec (warm-up, a minimum time and iteration count, percentiles, CUDA events on the GPU);
every backend passes a parity gate against eager fp32 before it is timed; variant overheads and speed-ups are
measured from alternating A B A B runs. See :mod:`attnzoo.benchmarks.run` for the procedure; the backends are
the runtime's registry (:mod:`attnzoo.runtime.backends`).
"""

from attnzoo.benchmarks.stats import ratio_stats, summarize

__all__ = ["summarize", "ratio_stats"]
