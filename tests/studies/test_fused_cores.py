"""python -m research.fused_cores: rows per group against standard, the previous and alternative cores, the
runtimes, each row's memory and bound, resume, bad flags."""

from __future__ import annotations

import json

import pytest

from attnzoo.errors import CommandExit
from research.fused_cores import main

# eager only (a compile per block is minutes on a loaded 2-core machine); tiny token counts, ViT-S width
FAST = ["--variants", "belief2,wafe-mae", "--compiled-variants", "none", "--batch-sizes", "1", "--rounds", "2"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--variants", "nope"], "unknown variant 'nope'"),
        (["--rounds", "1"], "--rounds must be >= 2"),
        (["--tokens", "1"], "--tokens must list integers >= 2"),
        (["--batch-sizes", "0"], "--batch-sizes must be comma-separated positive integers"),
        (["--threads", "0"], "--threads must list integers >= 1"),
        (["--modes", "eager,nope"], "--modes: unknown nope; valid: eager, compiled, aoti, ort, openvino"),
    ],
)
def test_bad_flags_are_one_line_before_any_work(tmp_path, capsys, args, words):
    with pytest.raises(CommandExit) as e:
        main([*args, "--out", str(tmp_path / "out")])
    assert e.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # ViT-S blocks built and timed three times: ~10 s on a quiet 2-core machine
def test_rows_ratios_previous_cores_and_resume(tmp_path, capsys):
    out = tmp_path / "out"
    main([*FAST, "--tokens", "5,7", "--out", str(out), "--no-progress"])
    result = json.loads((out / "fused-cores.json").read_text())
    assert result["complete"] and not (out / "fused-cores.partial.json").exists()
    rows = result["rows"]
    assert {(r["tokens"], r["variant"], r["core"]) for r in rows} == {
        (t, v, c)
        for t in (5, 7)
        for v, c in [
            ("standard", "current"),
            ("belief2", "current"),
            ("belief2", "before"),
            ("wafe-mae", "current"),
            ("wafe-mae", "cdist"),  # the eager MAE core before the fused op
        ]
    }
    for r in rows:
        assert r["parity_ok"] and r["median_ms"] > 0 and r["threads"] == 1 and r["mode"] == "eager"
        if r["variant"] == "standard":
            assert r["x_standard"]["ratio_median"] == 1.0 and r["bound"] == 1.0
        assert ("speedup" in r) == (r["core"] != "current")
        assert r["peak_mb"] is not None and r["peak_mb"] >= 0
    assert {r["impl"] for r in rows if r["variant"] == "wafe-mae"} == {"fused", "cdist"}
    readme = (out / "README.md").read_text()
    assert result["command"] in readme and "| 7 | 1 | 1 | `belief2` | before |" in readme
    assert "| 7 | 1 | 1 | `wafe-mae` | current (`fused`) |" in readme

    # a stopped run: the 5-token group done (marked), the 7-token group not; the rerun keeps the first
    kept = [dict(r, median_ms=-1.0) for r in rows if r["tokens"] == 5]
    partial = dict(result, rows=kept, complete=False)
    (out / "fused-cores.partial.json").write_text(json.dumps(partial))
    main([*FAST, "--tokens", "5,7", "--out", str(out), "--no-progress"])
    assert "resuming: 5 rows kept" in capsys.readouterr().err
    again = json.loads((out / "fused-cores.json").read_text())["rows"]
    assert [r["median_ms"] for r in again if r["tokens"] == 5] == [-1.0] * 5
    assert all(r["median_ms"] > 0 for r in again if r["tokens"] == 7)


def test_current_only_times_the_core_a_users_call_runs():
    from research.fused_cores import _settings, build_parser, cores

    assert set(cores(["belief2", "wafe-mae"], "eager", 5, 0, current_only=True)) == {
        ("standard", "current"),
        ("belief2", "current"),
        ("wafe-mae", "current"),
    }
    assert {"before", "cdist"} <= {core for _, core in cores(["belief2", "wafe-mae"], "eager", 5, 0)}
    # the resume key: a run with the flag never resumes one without it
    assert _settings(build_parser().parse_args(["--current-only"]))["current_only"] is True
    assert "current_only" not in _settings(build_parser().parse_args([]))


def test_current_core_labels_follow_auto_mae_impl():
    """The study labels each current MAE row with what mae_impl="auto" runs there; the rules live in
    attnzoo.models.wafe and attnzoo.targets.aoti.package, and these labels must not drift from them."""
    from attnzoo.models.wafe import ONNX_LOOP_TOKENS, auto_mae_impl
    from attnzoo.targets.aoti.package import MAE_IMPL
    from research.core_runners import current_impl

    assert current_impl(True, "eager", 197) == auto_mae_impl() == "fused"
    assert current_impl(True, "aoti", 197) == MAE_IMPL
    assert current_impl(True, "ort", ONNX_LOOP_TOKENS - 1) == "blocked"
    assert current_impl(True, "openvino", ONNX_LOOP_TOKENS) == "loop"
    assert current_impl(False, "eager", 197) is None


def test_peak_resident_sees_a_short_allocation():
    """The kernel's high-water mark catches an allocation freed before the block ends (no sampling to miss it)."""
    import numpy as np

    from research.core_runners import PeakResident

    with PeakResident() as mem:
        a = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
        del a
    if mem.mb is None:  # no /proc/self/clear_refs: not Linux
        pytest.skip("peak resident memory needs Linux's /proc")
    assert 60 <= mem.mb < 200


def test_a_rows_peak_is_the_median_of_fresh_tries():
    """A one-time allocation (the first try's, as a code load is) does not decide the row; one made by every try
    does. Each try loads afresh, and the runner keeps the last try's session."""
    import numpy as np

    from research import core_runners

    loads: list[int] = []

    def load(first_only: bool):
        def fn():
            loads.append(1)
            if len(loads) == 1 or not first_only:
                a = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
                del a
            return len(loads)

        return fn

    once = core_runners._measured(load(True), lambda session: session, None)
    if once.peak_mb is None:  # no /proc/self/clear_refs: not Linux
        pytest.skip("peak resident memory needs Linux's /proc")
    assert len(loads) == core_runners.MEASURES == 3 and once.peak_mb < 30 and once.call() == 3
    loads.clear()
    every = core_runners._measured(load(False), None, None)
    assert 60 <= every.peak_mb < 200


@pytest.mark.slow  # three tiny ONNX exports and their sessions: about a minute on a loaded 2-core machine
def test_runtimes_rows_the_onnx_forms_memory_and_bound(tmp_path):
    """The ONNX runtimes: each MAE block in its current ONNX form and the other one (blocked, Loop), checked
    against eager, with its peak memory, its ratio to standard's and the arithmetic bound."""
    from attnzoo.runtime.backends import get_backend

    modes = "ort,openvino" if get_backend("openvino").unavailable_reason() is None else "ort"
    out = tmp_path / "out"
    args = ["--variants", "anti-wafe-mae", "--modes", modes, "--tokens", "9", "--batch-sizes", "2", "--rounds", "2"]
    main([*args, "--threads", "1", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--no-progress"])
    rows = json.loads((out / "fused-cores.json").read_text())["rows"]
    for mode in modes.split(","):
        got = {(r["variant"], r["core"], r["impl"]) for r in rows if r["mode"] == mode}
        assert got == {
            ("standard", "current", None),
            ("anti-wafe-mae", "current", "blocked"),
            ("anti-wafe-mae", "loop", "loop"),
        }
    for r in rows:
        assert r["parity_ok"] and r["peak_mb"] > 0 and r["mem_x_standard"] > 0
        assert r["bound"] == (1.0 if r["variant"] == "standard" else pytest.approx(1.0, abs=0.01))
    assert len(list((tmp_path / "cache" / "onnx").glob("*.onnx"))) == 3  # one export per form, both runtimes


@pytest.mark.slow
@pytest.mark.matrix  # four compiles and four AOTInductor packages of a ViT-S block: minutes on 2 cores
def test_compiling_modes_rows_and_package_cache(tmp_path):
    """torch.compile and AOTInductor rows of an MAE block: the current core (the fused op compiled, the tiled core
    in AOTInductor), its alternatives beside it, all matching eager; the packages are cached, so a second run
    compiles none."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = ["--variants", "none", "--compiled-variants", "wafe-mae", "--modes", "compiled,aoti", "--tokens", "9"]
    args += ["--batch-sizes", "1", "--rounds", "2", "--cache-dir", str(cache), "--no-progress"]
    main([*args, "--out", str(out)])
    rows = json.loads((out / "fused-cores.json").read_text())["rows"]
    assert {(r["mode"], r["variant"], r["impl"]) for r in rows if r["variant"] == "wafe-mae"} == {
        ("compiled", "wafe-mae", "tiled"),
        ("compiled", "wafe-mae", "broadcast"),
        ("compiled", "wafe-mae", "fused"),
        ("aoti", "wafe-mae", "tiled"),
        ("aoti", "wafe-mae", "cdist"),
        ("aoti", "wafe-mae", "fused"),
    }
    current = {r["mode"]: r["impl"] for r in rows if r["variant"] == "wafe-mae" and r["core"] == "current"}
    assert current == {"compiled": "fused", "aoti": "tiled"}
    assert all(r["parity_ok"] and r["peak_mb"] is not None for r in rows)
    packages = sorted((cache / "aoti").glob("*.pt2"))
    assert len(packages) == 4  # standard and the three MAE cores
    main([*args, "--out", str(tmp_path / "again")])
    assert sorted((cache / "aoti").glob("*.pt2")) == packages
    again = json.loads((tmp_path / "again" / "fused-cores.json").read_text())["rows"]
    assert all(r["build_s"] == 0.0 for r in again if r["mode"] == "aoti")
