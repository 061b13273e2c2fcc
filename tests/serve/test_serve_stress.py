"""The servers under the three loads of :mod:`attnzoo.serve.stress`, with their figures asserted, in one slow test
(it starts serve-models, an embedded Ray, and serve-demo once each): slow uploads trickling in must leave
``/health`` and a small classification answering within 2 s; large decodes must keep serve-models' resident memory
within its decode budget (the models are loaded before the start figure) and hand it back afterwards; a small
request in the demo must not wait behind 20 heavy ones.

Kept short: one round of two concurrent 6,300-px 16-bit PNGs and a 40 MP float TIFF (``heavy_rounds`` with these
settings, on the 2-core AMX Xeon at load 19: the replica kept 198 MB after the round before it called
``malloc_trim``, 6 MB since; at 2,500 px the two differed by too little to tell apart), and 2,500-px images for the
demo; the committed run (``results/serve-models/stress.json``) does more. It needs about 5 GB of free memory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

#: Side of the images decoded by serve-models here (39.7 MP: 1.6 GB of decode budget each).
SIDE = 6300
#: Side of the demo's heavy images here (6.25 MP, over the 4 MP that makes an image large).
DEMO_SIDE = 2500


@pytest.fixture(scope="module")
def two_models(tmp_path_factory) -> Path:
    from attnzoo.serve.stress import standard_models

    return standard_models(tmp_path_factory.mktemp("two-models"))


@pytest.mark.slow
def test_trickling_uploads_heavy_decodes_and_the_demos_queue(two_models):
    from attnzoo.serve import stress
    from attnzoo.serve.admission import DECODE_BYTES_PER_PIXEL
    from attnzoo.serve.network import free_port

    budget = int(2.2 * SIDE * SIDE * DECODE_BYTES_PER_PIXEL)
    port = free_port()
    with stress.serving(two_models, port, "--decode-memory-mb", str(budget / 2**20)) as proc:
        url = f"http://127.0.0.1:{port}"
        slow = stress.trickle(url, clients=66, seconds=4.0)
        assert not slow["failed"] and slow["health_max_s"] < 2.0 and slow["classify_max_s"] < 2.0, slow
        heavy = stress.heavy_rounds(url, proc.pid, rounds=1, side=SIDE, concurrent=2)
    assert heavy["statuses"] == {"200": 3}, heavy
    assert heavy["budget_bytes"] == budget and 0 < heavy["budget_peak_bytes"] <= budget, heavy
    assert heavy["rss_peak_over_start_bytes"] <= budget, heavy
    assert heavy["rss_kept_over_start_bytes"][0] <= budget // 50, heavy

    port = free_port()
    with stress.demo_serving(two_models, port):
        fair = stress.demo_fairness(f"http://127.0.0.1:{port}", heavy=20, side=DEMO_SIDE)
    assert fair["small_answered"] and fair["heavy_pending_when_small_answered"] >= 10, fair
    assert fair["small_s"] <= 2 * fair["heavy_alone_s"] + 2.0, fair
