"""``python -m attnzoo.report.index``: the index table's cells are the reports' ``report.json`` values, a missing
field reads as the legend says, the set is written one report at a time and resumes where it stopped, and an
unknown variant is refused in one line listing the valid ones."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from attnzoo.errors import CommandExit, UsageError
from attnzoo.machine import cpu_summary
from attnzoo.models import BUILTIN_VARIANTS, VARIANT_NAMES
from attnzoo.report import SCHEMA
from attnzoo.report import index as idx
from attnzoo.report.index import build_reports, default_variants, find_reports, main, write_index

ROOT = Path(__file__).resolve().parents[2]
XEON = {"model": "Intel Xeon", "key_flags": ["avx2", "avx512f", "amx_int8"]}
EPYC = {"model": "AMD EPYC", "key_flags": ["avx", "avx2", "fma", "f16c"]}


def _runtime(name: str, fused: int, inspected: bool = True) -> dict[str, Any]:
    return (
        {"runtime": name, "inspected": inspected, "cores": 4, "fused": fused}
        if inspected
        else {"runtime": name, "inspected": False, "reason": "needs a GPU"}
    )


def _report(variant: str, cpu: dict[str, Any] = XEON, quick: bool = True) -> dict[str, Any]:
    """The fields of ``report.json`` (docs/report-variant.md's schema) that the index reads, with made-up figures."""
    return {
        "schema": SCHEMA,
        "variant": variant,
        "quick": quick,
        "command": f"report-variant --variant {variant} --out reports/{variant}" + (" --quick" if quick else ""),
        "environment": {"cpu": cpu, "gpu": None, "load_average": [1.5, 1.0, 0.5]},
        "export": {
            variant: {
                "fp32": {"status": "ok", "passed": True, "max_abs_err": 3.21e-06},
                "fp16": {"status": "ok", "passed": False, "max_abs_err": 0.0234},
                "int8": {
                    "status": "ok",
                    "passed": True,
                    "cosine_min": 0.99834,
                    "top1_agreement": 0.96875,
                    "placement": "cpu",
                },
                "tensorrt": {
                    "status": "ok",
                    "state": "built, not run",
                    "ran_on_gpu": False,
                    "network_check": {"ok": True},
                },
                "openvino": {"status": "ok", "passed": True, "max_abs_err": 2.86e-06},
                "executorch": {"status": "skipped", "reason": "not written with this budget (--quick)"},
                "extra_math_kept": {"fp32": True, "fp16": True, "int8": True, "tensorrt": True, "openvino": True},
            }
        },
        "fusion": {
            variant: {
                "status": "ok",
                "audit": {
                    "runtimes": [
                        _runtime("openvino", 4),
                        _runtime("onnxruntime", 0),
                        _runtime("onnxruntime-transformers", 1),
                        _runtime("tensorrt", 0, inspected=False),
                    ]
                },
            }
        },
        "verdict": {
            "deploys": False,
            "problems": ["fp16"],
            "states": {
                "parity": "passed",
                "fp16": "failed",
                "extra_math_kept": "passed",
                "int8": "passed",
                "tensorrt": "built, not run",
                "openvino": "passed",
                "executorch": "not run",
            },
            "line": f"{variant}: does not deploy (fp16)",
            "overhead_first": {"ratio": 1.317, "backend": "openvino", "batch": 1, "tokens": 197},
            "overhead_most_tokens": {"ratio": 2.456, "backend": "ort-cpu", "batch": 1, "tokens": 1025},
        },
        "wall_time_s": 412.3,
        "cpu_time_s": 388.9,
    }


def _write(out: Path, report: dict[str, Any], md: bool = True) -> Path:
    folder = out / report["variant"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report))
    if md:
        (folder / "report.md").write_text(f"# {report['variant']}\n")
    return folder


def _table(text: str) -> list[dict[str, str]]:
    """The index's table as one dict per row, keyed by the header."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split(" | ")), strict=False)) for line in lines[1:]]


def _expected(r: dict[str, Any]) -> dict[str, str]:
    """What each cell must say: the report's own values, formatted as the index documents."""
    side = r["export"][r["variant"]]
    fused = {x["runtime"]: x for x in r["fusion"][r["variant"]]["audit"]["runtimes"]}
    v = r["verdict"]
    ort_t, first, most = fused["onnxruntime-transformers"], v["overhead_first"], v["overhead_most_tokens"]
    return {
        "variant": f"[{r['variant']}]({r['variant']}/report.md)",
        # the steps that did not run are named, never counted: the engine built without a GPU among them
        "deploys": "yes (not counted: TensorRT built, not run; ExecuTorch program not run)"
        if v["deploys"]
        else f"no ({', '.join(v['problems'])})",
        "fp32 parity (max err)": f"{'ok' if side['fp32']['passed'] else 'FAILED'} ({side['fp32']['max_abs_err']:.1e})",
        "fp16 parity (max err)": f"{'ok' if side['fp16']['passed'] else 'FAILED'} ({side['fp16']['max_abs_err']:.1e})",
        "int8 cosine, worst (placement)": f"{side['int8']['cosine_min']:.4f} ({side['int8']['placement']})",
        "int8 top-1 agreement": f"{100 * side['int8']['top1_agreement']:.1f}%",
        "TensorRT": f"{side['tensorrt']['state']} - no GPU, network check ok",
        "OpenVINO IR parity (max err)": f"ok ({side['openvino']['max_abs_err']:.1e})",
        "ExecuTorch program parity (max err)": "not run",
        "fused: OpenVINO": f"{fused['openvino']['fused']}/{fused['openvino']['cores']}",
        "fused: ONNX Runtime": f"{fused['onnxruntime']['fused']}/{fused['onnxruntime']['cores']}",
        "fused: ONNX Runtime transformer optimizer": f"{ort_t['fused']}/{ort_t['cores']}",
        "fused: TensorRT": "not inspected",
        f"x standard at {first['tokens']:,} tokens": f"x{first['ratio']:.2f} ({first['backend']})",
        f"x standard at {most['tokens']:,} tokens": f"x{most['ratio']:.2f} ({most['backend']})",
        "checks that did not pass": (
            f"export.{r['variant']}.fp16: its check did not pass" if not side["fp16"]["passed"] else "none"
        ),
    }


# ------------------------------------------------------------------------------------------------ the index
def test_the_index_cells_are_the_report_json_values(tmp_path):
    a, b = _report("belief2"), _report("wafe-mae")
    b["export"]["wafe-mae"]["fp32"]["max_abs_err"] = 7.5e-05
    b["export"]["wafe-mae"]["int8"].update(cosine_min=0.95, top1_agreement=0.5, placement="auto")
    b["fusion"]["wafe-mae"]["audit"]["runtimes"][0]["fused"] = 0
    b["export"]["wafe-mae"]["fp16"]["passed"] = True
    b["verdict"].update(deploys=True, problems=[])
    b["verdict"]["states"]["fp16"] = "passed"
    b["verdict"]["overhead_first"]["ratio"] = 0.987
    for r in (b, a):  # written in the other order: rows come in registry order
        _write(tmp_path, r)
    text = write_index(tmp_path).read_text()
    rows = _table(text)
    assert rows == [_expected(a), _expected(b)]
    assert f"Machine: {cpu_summary(XEON)}, no GPU." in text and "--quick" in text
    assert "python -m attnzoo.report.index --out " + str(tmp_path) + " --run --quick" in text
    assert f"`{a['command']}`: 412 s, 389 CPU s" in text  # each report's own command, from its JSON


def test_a_missing_field_or_a_step_not_run_reads_as_the_legend_says(tmp_path):
    r = _report("belief2")
    side = r["export"]["belief2"]
    del side["fp16"]  # absent from the JSON
    side["int8"] = {"status": "failed", "reason": "RuntimeError: boom"}
    side["tensorrt"] = {"status": "unavailable", "reason": "no TensorRT here"}
    r["fusion"]["belief2"]["audit"]["runtimes"].pop(0)  # OpenVINO not audited
    del r["verdict"]["overhead_most_tokens"]
    r["verdict"]["overhead_first"] = None  # latency ran, no ratio
    r["cost"] = {"latency": {"status": "ok"}}
    wafe = _report("wafe-mae")
    wafe["verdict"]["overhead_first"] = wafe["verdict"]["overhead_most_tokens"] = None
    wafe["cost"] = {"latency": {"status": "skipped"}, "scaling": {"status": "failed", "reason": "ValueError: no"}}
    std = _report("standard")
    std["export"]["standard"]["fp16"] = {"status": "skipped", "reason": "not built with this budget"}
    std["verdict"]["overhead_first"] = std["verdict"]["overhead_most_tokens"] = None
    _write(tmp_path, r), _write(tmp_path, std), _write(tmp_path, wafe)
    text = write_index(tmp_path).read_text()
    s, b, w = _table(text)
    assert b["fp16 parity (max err)"] == "—" and s["fp16 parity (max err)"] == "not run"
    assert b["int8 cosine, worst (placement)"] == b["int8 top-1 agreement"] == "failed"
    assert b["TensorRT"] == "unavailable"
    assert b["fused: OpenVINO"] == "—" and s["fused: OpenVINO"] == "4/4"
    # no report has a ratio, so no tokens in the headers
    assert b["x standard, latency rows"] == "not measured" and s["x standard, latency rows"] == "baseline"
    assert b["x standard, most tokens"] == "—" and s["x standard, most tokens"] == "baseline"
    # without a ratio, the status of the section that measures it
    assert (w["x standard, latency rows"], w["x standard, most tokens"]) == ("not run", "failed")
    for cell in ("—", "not run", "unavailable", "failed", "not measured", "baseline", "not inspected"):
        assert f"\n- {cell}: " in text, cell  # each in the legend


def test_the_deploys_cell_names_what_did_not_run_and_an_engine_run_on_a_gpu_shows_its_parity(tmp_path):
    """``deploys`` counts only steps that ran: an engine that ran on a GPU and passed is not named as uncounted and
    its cell shows its parity; one that ran and failed says so; a report whose verdict predates ``states`` has them
    read from its export section (its engine built without a GPU named as not counted)."""
    ran = _report("belief2")
    side = ran["export"]["belief2"]
    side["fp16"]["passed"] = True
    side["executorch"] = {"status": "ok", "passed": True, "max_abs_err": 1e-6}
    side["tensorrt"].update(state="built and run", ran_on_gpu=True, parity={"passed": True})
    ran["verdict"].update(deploys=True, problems=[], states=dict.fromkeys(ran["verdict"]["states"], "passed"))
    bad = _report("wafe-mae")
    bad["export"]["wafe-mae"]["tensorrt"].update(state="built and run", ran_on_gpu=True, parity={"passed": False})
    bad["verdict"].update(problems=["fp16", "tensorrt"])
    old = _report("standard")
    old["export"]["standard"]["fp16"]["passed"] = True
    old["verdict"].update(deploys=True, problems=[])
    del old["verdict"]["states"]
    for r in (ran, bad, old):
        _write(tmp_path, r)
    s, b, w = _table(write_index(tmp_path).read_text())
    assert b["deploys"] == "yes" and b["TensorRT"] == "built and run, network check ok, parity ok"
    assert w["deploys"] == "no (fp16, tensorrt)" and w["TensorRT"] == "built and run, network check ok, parity FAILED"
    assert s["deploys"] == "yes (not counted: TensorRT built, not run; ExecuTorch program not run)"
    assert s["TensorRT"] == "built, not run - no GPU, network check ok"


def test_reports_from_two_machines_or_budgets_are_named_per_row(tmp_path):
    _write(tmp_path, _report("belief2", cpu=XEON, quick=True))
    _write(tmp_path, _report("standard", cpu=EPYC, quick=False))
    text = write_index(tmp_path).read_text()
    s, b = _table(text)
    assert (s["machine"], b["machine"]) == (f"{cpu_summary(EPYC)}, no GPU", f"{cpu_summary(XEON)}, no GPU")
    assert (s["budget"], b["budget"]) == ("default", "--quick")
    assert "Machine:" not in text and "different machines" in text


def test_only_complete_reports_are_rows_and_a_stopped_one_is_named(tmp_path):
    _write(tmp_path, _report("belief2"))
    _write(tmp_path, _report("standard"), md=False)  # stopped between report.json and report.md
    old = _report("wafe-mae")
    old["schema"] = "attnzoo.report-variant/0"
    _write(tmp_path, old)  # another schema
    (tmp_path / "wafe-mse" / "exports").mkdir(parents=True)  # stopped before report.json
    (tmp_path / "not-a-report").mkdir()
    found, incomplete = find_reports(tmp_path)
    assert [r["variant"] for _, r in found] == ["belief2"]
    assert [p.name for p in incomplete] == ["standard", "wafe-mae", "wafe-mse"]
    text = write_index(tmp_path).read_text()
    assert len(_table(text)) == 1 and "`standard`, `wafe-mae`, `wafe-mse`" in text


def test_an_empty_folder_has_an_index_with_the_command(tmp_path):
    text = write_index(tmp_path).read_text()
    assert "No complete report here yet." in text and "| variant |" not in text
    assert f"python -m attnzoo.report.index --out {tmp_path} --run\n" in text


# ------------------------------------------------------------------------------------------------ running
def test_the_set_is_written_one_report_at_a_time_and_resumes(tmp_path, monkeypatch):
    calls = []

    def fake(variant, out, quick, command):
        calls.append((variant, Path(out), quick, command))
        if variant == "wafe-mae" and len(calls) == 2:
            (Path(out) / "exports").mkdir(parents=True)
            raise KeyboardInterrupt  # stopped while measuring: no report.json written
        _write(Path(out).parent, _report(variant, quick=quick))
        return type("R", (), {"verdict": f"{variant}: deploys"})()

    monkeypatch.setattr(idx, "report_variant", fake)
    _write(tmp_path, _report("standard", quick=True))  # finished earlier: kept
    with pytest.raises(KeyboardInterrupt):
        build_reports(tmp_path, ["standard", "belief2", "wafe-mae", "wafe-mse"], quick=True, progress=False)
    assert [c[0] for c in calls] == ["belief2", "wafe-mae"]
    assert calls[0] == (
        "belief2",
        tmp_path / "belief2",
        True,
        f"report-variant --variant belief2 --out {tmp_path / 'belief2'} --quick",
    )
    assert not (tmp_path / "wafe-mae" / "report.json").exists()
    assert [r["variant"] for _, r in find_reports(tmp_path)[0]] == ["standard", "belief2"]  # the index so far
    done = build_reports(tmp_path, ["standard", "belief2", "wafe-mae", "wafe-mse"], quick=True, progress=False)
    assert [(d["variant"], d["state"]) for d in done] == [
        ("standard", "kept"),
        ("belief2", "kept"),
        ("wafe-mae", "written"),
        ("wafe-mse", "written"),
    ]
    assert [c[0] for c in calls] == ["belief2", "wafe-mae", "wafe-mae", "wafe-mse"]
    # a report of the other budget is measured again with the one asked for
    done = build_reports(tmp_path, ["standard"], quick=False, progress=False)
    assert done[0]["state"] == "written" and calls[-1][:3] == ("standard", tmp_path / "standard", False)


def test_a_failed_report_is_named_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    def fake(variant, out, quick, command):
        if variant == "belief2":
            raise RuntimeError("export crashed\nsecond line")
        _write(Path(out).parent, _report(variant, quick=quick))
        return type("R", (), {"verdict": f"{variant}: deploys"})()

    monkeypatch.setattr(idx, "report_variant", fake)
    with pytest.raises(CommandExit) as exc:
        main(["--out", str(tmp_path), "--run", "--quick", "--variants", "belief2,standard", "--no-progress"])
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: 1 report(s) not written: belief2: RuntimeError: export crashed"]
    assert [r["variant"] for _, r in find_reports(tmp_path)[0]] == ["standard"]


def test_the_default_set_is_the_builtins_then_the_example_plugin(monkeypatch, registry_restored):
    if idx.EXAMPLE_PLUGIN in VARIANT_NAMES:
        pytest.skip("the example plugin is installed in this environment")
    with pytest.raises(UsageError, match=r"pip install \./examples/attnzoo-cosine"):
        default_variants()
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "attnzoo-cosine"))
    import attnzoo_cosine

    attnzoo_cosine.register()
    assert default_variants() == [*BUILTIN_VARIANTS, "cosine"] and len(BUILTIN_VARIANTS) == 15


# ------------------------------------------------------------------------------------------------ bad input
def test_an_unknown_variant_is_refused_listing_the_valid_ones(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(idx, "report_variant", lambda *a, **k: pytest.fail("nothing may run"))
    with pytest.raises(CommandExit) as exc:
        main(["--out", str(tmp_path / "r"), "--run", "--variants", "belief2,nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: unknown variant 'nope'; valid: {', '.join(VARIANT_NAMES)}"]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--variants", "belief2"], "--variants and --quick choose what --run writes"),
        (["--quick"], "--variants and --quick choose what --run writes"),
        ([], "no such folder"),
    ],
)
def test_bad_flags_are_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(CommandExit) as exc:
        main(["--out", str(tmp_path / "none"), *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


# ------------------------------------------------------------------------------------------------ real reports
def _run_index(out: Path, variants: str) -> dict[str, int]:
    """``python -m attnzoo.report.index --out OUT --run --quick --variants VARIANTS``; each report's mtime after."""
    assert main(["--out", str(out), "--run", "--quick", "--variants", variants, "--no-progress"]) == 0
    return {n: (out / n / "report.json").stat().st_mtime_ns for n in variants.split(",")}


def _assert_rows_are_the_reports(out: Path, names: list[str]) -> dict[str, dict[str, str]]:
    """The index's row of each report in ``out`` says what its report.json says; returns the rows by variant cell."""
    reports = {r["variant"]: r for _, r in find_reports(out)[0]}
    assert list(reports) == names
    rows = {row["variant"]: row for row in _table((out / "README.md").read_text())}
    for name, r in reports.items():
        row = rows[f"[{name}]({name}/report.md)"]
        side = r["export"][name]
        assert (
            row["fp32 parity (max err)"]
            == idx.parity_cell(side["fp32"])
            == f"{'ok' if side['fp32']['passed'] else 'FAILED'} ({side['fp32']['max_abs_err']:.1e})"
        )
        # int8 runs wherever its quantizer is installed: a failed int8 step fails here
        if importlib.util.find_spec("modelopt"):
            assert side["int8"]["status"] == "ok" and side["int8"]["passed"], side["int8"]
            assert row["int8 cosine, worst (placement)"] == f"{side['int8']['cosine_min']:.4f} (cpu)"
            assert row["int8 top-1 agreement"] == f"{100 * side['int8']['top1_agreement']:.1f}%"
        else:
            assert side["int8"]["status"] == "unavailable" and row["int8 cosine, worst (placement)"] == "unavailable"
        fused = {x["runtime"]: x for x in r["fusion"][name]["audit"]["runtimes"]}
        assert row["fused: OpenVINO"] == f"{fused['openvino']['fused']}/{fused['openvino']['cores']}"
        o = r["verdict"]["overhead_first"]
        assert o is not None and row[f"x standard at {o['tokens']:,} tokens"] == f"x{o['ratio']:.2f} ({o['backend']})"
        assert r["command"] == f"report-variant --variant {name} --out {out / name} --quick"
    return rows


@pytest.mark.slow
def test_a_quick_report_is_kept_by_the_command_and_indexed_with_its_own_values(belief2_quick):
    """belief2's real ``--quick`` report (written by report-variant, tests/report/conftest.py): the command keeps
    it as it is, twice, and its index row reads every cell from it."""
    out = belief2_quick[0].parent
    kept = (out / "belief2" / "report.json").stat().st_mtime_ns
    assert _run_index(out, "belief2") == {"belief2": kept}
    _assert_rows_are_the_reports(out, ["belief2"])
    assert _run_index(out, "belief2") == {"belief2": kept}


@pytest.mark.slow
@pytest.mark.matrix  # a second whole quick report (about 3 minutes on 2 cores): the matrix run
def test_the_command_writes_a_missing_report_and_indexes_it_beside_the_kept_one(belief2_quick):
    """With belief2's report kept, the command writes wafe-mae's (pairwise L1: no core for OpenVINO to fuse)
    and indexes both; a second run keeps both as they are."""
    out = belief2_quick[0].parent
    kept = (out / "belief2" / "report.json").stat().st_mtime_ns
    first = _run_index(out, "belief2,wafe-mae")
    assert first["belief2"] == kept
    rows = _assert_rows_are_the_reports(out, ["belief2", "wafe-mae"])
    assert rows["[wafe-mae](wafe-mae/report.md)"]["fused: OpenVINO"] == "0/4"
    assert _run_index(out, "belief2,wafe-mae") == first


def test_help_loads_without_torch():
    """The command's --help (and its module) start without importing PyTorch, ONNX or timm."""
    code = (
        "import sys\nfrom attnzoo.report.index import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n"
        "    pass\nprint(sorted(m for m in ('torch', 'onnx', 'timm', 'onnxruntime') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--run" in proc.stdout and proc.stdout.strip().splitlines()[-1] == "[]"


def test_render_rewrites_each_reports_verdict_and_page_from_its_json_measuring_nothing(tmp_path, capsys):
    """--render: a committed report copied here gets its verdict and report.md written again from its report.json
    (the one definition of fused, TensorRT shown as not inspected, every check that did not pass); its
    measurements and plots are kept byte for byte."""
    import shutil

    from attnzoo import mdtext

    src = ROOT / "results" / "variant-reports" / "horizontal"
    folder = tmp_path / "horizontal"
    folder.mkdir()
    for name in ("report.json", "report.md", *sorted(p.name for p in src.glob("*.png"))):  # every plot it has
        shutil.copy(src / name, folder / name)
    before = json.loads((folder / "report.json").read_text())
    pngs = {p.name: p.read_bytes() for p in folder.glob("*.png")}
    assert main(["--out", str(tmp_path), "--render"]) == 0
    after = json.loads((folder / "report.json").read_text())
    assert {k: v for k, v in after.items() if k != "verdict"} == {k: v for k, v in before.items() if k != "verdict"}
    assert {p.name: p.read_bytes() for p in folder.glob("*.png")} == pngs
    line = after["verdict"]["line"]
    assert "TensorRT not inspected" in line and "transformer optimizer 4/4 as exported (opt_level 0)" in line
    assert after["verdict"]["failed"] == [] and mdtext.text(line) in (folder / "report.md").read_text()
    assert (tmp_path / "README.md").is_file()
    with pytest.raises(CommandExit):
        main(["--out", str(tmp_path), "--render", "--run"])
