"""The report folder: ``report.json`` (the measurements, schema in docs/report-variant.md), ``report.md`` (one
GitHub-renderable page with PNG plots) and the one-line verdict.

Plots reuse the benchmark's and the scaling study's own (:func:`attnzoo.benchmarks.report.plot_latency`,
:func:`~attnzoo.benchmarks.report.plot_overhead`, :func:`attnzoo.studies.scaling.plot`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnzoo.benchmarks.report import markdown_table, plot_latency, plot_overhead
from attnzoo.fileio import atomic_write_text
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_summary
from attnzoo.runtime.backends import ONNX_REFERENCE

# report-variant --help loads without torch and timm: imported at their first use
factory = lazy_import("attnzoo.models.factory")
scaling_study = lazy_import("attnzoo.studies.scaling")

__all__ = ["verdict", "markdown", "plots", "write_report", "RUNTIMES"]

#: The fusion audit's runtimes, as the verdict names them.
RUNTIMES = {
    "openvino": "OpenVINO",
    "onnxruntime": "ONNX Runtime",
    "onnxruntime-transformers": "ONNX Runtime transformer optimizer",
    "tensorrt": "TensorRT",
}


def _num(v: Any, fmt: str = "{:.3g}") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return fmt.format(v) if isinstance(v, (int, float)) else str(v)


def _state(entry: Mapping[str, Any] | None) -> str:
    """``ok``, or the status with its reason."""
    if not entry:
        return "-"
    if entry.get("status") == "ok":
        return "ok"
    return f"{entry.get('status')}: {entry.get('reason', '')}".rstrip(": ")


# ------------------------------------------------------------------------------------------------ verdict
def _fused(report: Mapping[str, Any], side: str) -> dict[str, str]:
    """Runtime -> ``fused of cores`` (or why it was not inspected) for one side's audit."""
    entry = (report.get("fusion") or {}).get(side) or {}
    if entry.get("status") != "ok":
        return {}
    out = {}
    for r in entry["audit"]["runtimes"]:
        out[r["runtime"]] = f"{r['fused']}/{r['cores']}" if r["inspected"] else "not inspected"
    return out


def _overhead_197(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The variant's latency ratio to standard at batch 1, fp32, on its fastest CPU runtime (else the first
    overhead measured)."""
    lat = (report.get("cost") or {}).get("latency") or {}
    if lat.get("status") != "ok" or not lat.get("overheads"):
        return None
    fast = next(
        (f["backend"] for f in lat.get("fastest_cpu", []) if f["variant"] == report["variant"] and f["batch"] == 1),
        None,
    )
    rows = [o for o in lat["overheads"] if o["dtype"] == "fp32" and o["batch"] == 1]
    pick = next((o for o in rows if o["backend"] == fast), rows[0] if rows else None)
    if pick is None:
        return None
    tokens = _tokens(report["identity"], lat["settings"]["arch"])
    return {"ratio": pick["ratio_median"], "backend": pick["backend"], "batch": 1, "tokens": tokens}


def _tokens(identity: Mapping[str, Any], arch: str) -> int | None:
    a = factory.ARCHS.get(arch)
    return None if a is None else (a["img_size"] // a["patch_size"]) ** 2 + 1


def scaling_pairs(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per (task, tokens, backend) of the scaling rows: standard's and the variant's latency and peak memory."""
    sc = (report.get("cost") or {}).get("scaling") or {}
    if sc.get("status") != "ok":
        return []
    variant = report["variant"]
    table: dict[tuple[str, int, str], dict[str, Any]] = {}
    for r in sc["rows"]:
        key = (r["task"], r["tokens"], r["backend"])
        side = "variant" if r["variant"] == variant else "standard"
        table.setdefault(key, {"task": r["task"], "tokens": r["tokens"], "backend": r["backend"]})[side] = r
    out = []
    for entry in table.values():
        v, s = entry.get("variant"), entry.get("standard")
        ok = v is not None and s is not None and v["status"] == s["status"] == "ok"
        entry["ratio"] = v["median_ms"] / s["median_ms"] if ok else None
        out.append(entry)
    return sorted(out, key=lambda e: (e["task"], e["tokens"], e["backend"]))


def _overhead_max(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The variant's latency ratio to standard at the classifier's most tokens measured (ONNX Runtime where it
    ran there, else eager)."""
    pairs = [p for p in scaling_pairs(report) if p["task"] == "cls" and p["ratio"] is not None]
    if not pairs:
        return None
    top = max(p["tokens"] for p in pairs)
    at = [p for p in pairs if p["tokens"] == top]
    pick = next((p for p in at if p["backend"] == ONNX_REFERENCE), at[0])
    return {"ratio": pick["ratio"], "backend": pick["backend"], "batch": 1, "tokens": top}


def verdict(report: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """The checks an author reads first, whether the variant deploys, and the one line that says it."""
    name = report["variant"]
    side = report["export"][name]
    fp32, fp16, int8, trt = side["fp32"], side["fp16"], side["int8"], side.get("tensorrt") or {}
    kept = [v for v in side["extra_math_kept"].values() if v is not None]
    checks = {
        "parity": fp32.get("status") == "ok" and bool(fp32.get("passed")),
        "fp16": fp16.get("status") == "ok" and bool(fp16.get("passed")),
        "extra_math_kept": bool(kept) and all(kept),
        "int8": int8.get("status") == "ok" and bool(int8.get("passed")),
        "tensorrt": trt.get("status") == "ok" and bool((trt.get("network_check") or {}).get("ok")),
    }
    problems = [
        k for k, ok in checks.items() if not ok and not (k == "tensorrt" and trt.get("status") == "unavailable")
    ]
    fused = _fused(report, name)
    o1, o2 = _overhead_197(report), _overhead_max(report)
    parts = [f"{name}: {'deploys' if not problems else 'does not deploy (' + ', '.join(problems) + ')'}"]
    parts.append(
        f"fp32 parity {'ok' if checks['parity'] else 'FAILED'}"
        + (f" (max err {fp32['max_abs_err']:.1e})" if fp32.get("max_abs_err") is not None else "")
    )
    parts.append(f"fp16 {'ok' if checks['fp16'] else _state(fp16) if fp16.get('status') != 'ok' else 'FAILED'}")
    parts.append("extra math kept" if checks["extra_math_kept"] else "extra math NOT kept")
    if int8.get("status") == "ok":
        parts.append(
            f"int8 cosine {_num(int8.get('cosine_min'), '{:.4f}')} top-1 "
            f"{_num(100 * int8['top1_agreement'] if int8.get('top1_agreement') is not None else None, '{:.0f}')}% "
            f"({int8.get('placement')})"
        )
    else:
        parts.append(f"int8 {_state(int8)}")
    if trt.get("status") == "ok":
        state = trt.get("state") or "built"
        parts.append(
            f"TensorRT {state}{' - no GPU' if not trt.get('ran_on_gpu') else ''}, network check "
            f"{'ok' if checks['tensorrt'] else 'FAILED'}"
        )
    else:
        parts.append(f"TensorRT {_state(trt)}")
    if fused:
        parts.append(
            "fused: " + ", ".join(f"{RUNTIMES.get(k, k)} {v}" for k, v in fused.items() if v != "not inspected")
        )
    fz = report.get("fusable") or {}
    if fz.get("status") == "ok":
        whole = all(f == c for f, c in fz["fused"].values())
        parts.append(f"opset 23 {'fused on every runtime' if whole else 'not fused everywhere'}")
    if o1 is None and o2 is None:
        parts.append("latency against standard: not measured")
    for o in (o1, o2):
        if o is not None:
            parts.append(f"x{o['ratio']:.2f} standard's latency at {o['tokens']} tokens ({o['backend']} b{o['batch']})")
    parts.append(f"report: {out / 'report.md'}")
    return {
        "deploys": not problems,
        "problems": problems,
        "checks": checks,
        "fused": fused,
        "overhead_first": o1,
        "overhead_most_tokens": o2,
        "line": " | ".join(parts),
    }


# ------------------------------------------------------------------------------------------------ plots
def plots(report: Mapping[str, Any], out: Path) -> dict[str, Path]:
    """The PNGs of the cost section (those it has data for)."""
    cost = report.get("cost") or {}
    written: dict[str, Path] = {}
    lat = cost.get("latency") or {}
    if lat.get("status") == "ok":
        rows = [r for r in lat["rows"] if r["status"] == "ok" and r.get("median_ms") is not None]
        if rows:
            written["latency"] = plot_latency(rows, out / "latency.png")
        if lat.get("overheads"):
            written["overhead"] = plot_overhead(lat["overheads"], out / "overhead.png")
    sc = cost.get("scaling") or {}
    if sc.get("status") == "ok" and any(r["status"] == "ok" for r in sc["rows"]):
        written["scaling"] = scaling_study.plot(dict(sc), out / "scaling.png")
    return written


# ------------------------------------------------------------------------------------------------ markdown
def _identity_md(report: Mapping[str, Any]) -> list[str]:
    ident = report["identity"]
    if ident.get("status") != "ok":
        return [f"Not measured: {_state(ident)}"]
    lines = [
        markdown_table(
            ["", ""],
            [
                ["paper", ident["paper"] or "-"],
                ["package", f"{ident['package']} {ident['version']}".strip()],
                ["extra-math scopes", ", ".join(f"`{s}`" for s in ident["extra_scopes"]) or "none (plain attention)"],
                ["extra parameters", ident["extra_params"]],
                [
                    "extra weights (beyond timm's Attention)",
                    ", ".join(f"`{w}`" for w in ident["extra_weights"]) or "none",
                ],
                ["scores", "pairwise distances (no matrix product)" if ident["pairwise_scores"] else "matrix products"],
                ["cost family", ident["cost_family"]],
            ],
        ),
        "",
    ]
    if ident["equations"]:
        lines += ["Equations:", "", "```", ident["equations"], "```", ""]
    rows = [
        [
            "parameters",
            f"{ident['standard_params']:,}",
            f"{ident['params']:,}",
            f"{ident['params'] / ident['standard_params']:.3f}",
        ]
    ]
    for size, flops in ident["flops_per_image"].items():
        std = ident["standard_flops_per_image"][size]
        rows.append(
            [
                f"GFLOPs per image at {size} px",
                f"{std / 1e9:.3f}",
                f"{flops / 1e9:.3f}",
                f"{ident['flops_ratio'][size]:.3f}",
            ]
        )
    lines += [
        f"ViT `{ident['arch']}` classifier, counted by {ident['counter']}:",
        "",
        markdown_table(["", "standard", report["variant"], "ratio"], rows),
    ]
    return lines


def _export_md(report: Mapping[str, Any]) -> list[str]:
    sides = report["export"]
    names = (
        ["standard", report["variant"]]
        if "standard" in sides and report["variant"] != "standard"
        else [report["variant"]]
    )

    def cells(fn) -> list[str]:
        return [fn(sides[n]) for n in names]

    def parity(e: Mapping[str, Any]) -> str:
        if e.get("status") != "ok":
            return _state(e)
        tol = next(iter(e["tolerance"].values()), None)
        return (
            f"{'passed' if e['passed'] else 'FAILED'}: max abs err {e['max_abs_err']:.2e} (tolerance {tol:g} x "
            f"max(1, max abs logit)), batch sizes {e['batch_sizes']}"
        )

    def int8(e: Mapping[str, Any]) -> str:
        if e.get("status") != "ok":
            return _state(e)
        top1 = e.get("top1_agreement")
        return (
            f"cosine to fp32 min {_num(e['cosine_min'], '{:.4f}')} / mean {_num(e['cosine_mean'], '{:.4f}')}, "
            f"top-1 agreement {_num(100 * top1 if top1 is not None else None, '{:.1f}')}% on "
            f"{e.get('fidelity_inputs')} held-out inputs"
        )

    def placement(e: Mapping[str, Any]) -> str:
        if e.get("status") != "ok":
            return "-"
        kept = e.get("kept_fp32") or []
        q, t = e.get("quantized_ops") or {}, e.get("total_ops") or {}
        ops = ", ".join(f"{k} {q[k]}/{t.get(k, '?')}" for k in q)
        return f"`{e.get('placement')}`; kept fp32: {', '.join(kept) or 'nothing'}; quantized {ops}"

    def accuracy(e: Mapping[str, Any]) -> str:
        a = e["accuracy"]
        if a.get("status") != "ok":
            return _state(a)
        m = a.get("metrics") or {}
        return (
            f"{a.get('metric_name')} fp32 {_num(m.get('fp32'), '{:.2f}')} / int8 {_num(m.get('int8'), '{:.2f}')} "
            f"on {a.get('n_images')} {a.get('data')} {a.get('split')} images"
        )

    def trt(e: Mapping[str, Any]) -> str:
        t = e.get("tensorrt") or {}
        if t.get("status") != "ok":
            return _state(t)
        nc = t.get("network_check") or {}
        state = t.get("state")
        if not t.get("ran_on_gpu"):
            state = f"{state} - no GPU ({t.get('library')}, {t.get('compute_capability')})"
        return f"{state}; network check {'ok' if nc.get('ok') else 'FAILED'} ({nc.get('layers')} layers)"

    def kept(e: Mapping[str, Any]) -> str:
        return ", ".join(f"{k} {_num(v)}" for k, v in e["extra_math_kept"].items())

    def triton(e: Mapping[str, Any]) -> str:
        t = e["triton"]
        if t.get("status") != "ok":
            return _state(t)
        return f"{'written' if t.get('passed') else 'FAILED'}: `{t.get('config')}` ({t.get('platform')})"

    def source(e: Mapping[str, Any]) -> str:
        s = e["source"]
        return {
            "zoo": f"the zoo's classifier (`{Path(s.get('checkpoint', '')).name}`)",
            "checkpoint": f"checkpoint `{s.get('checkpoint')}`",
        }.get(s["kind"], f"random init ({s.get('arch')})")

    rows = [
        ["model", *cells(source)],
        ["fp32: parity with eager", *cells(lambda e: parity(e["fp32"]))],
        ["fp16: parity with eager fp32", *cells(lambda e: parity(e["fp16"]))],
        ["extra math kept (per format)", *cells(kept)],
        ["int8: fidelity to fp32", *cells(lambda e: int8(e["int8"]))],
        ["int8: placement chosen", *cells(lambda e: placement(e["int8"]))],
        ["accuracy on the test split", *cells(accuracy)],
        ["FP8 graph", *cells(lambda e: int8(e["fp8"]))],
        ["TensorRT", *cells(trt)],
        ["Triton config", *cells(triton)],
    ]
    return [
        "Each row is `export_model()` run here; files under `exports/`.",
        "",
        markdown_table(["", *names], rows, escape=True),
    ]


def _fusion_md(report: Mapping[str, Any]) -> list[str]:
    fus = report.get("fusion") or {}
    variant = report["variant"]
    names = [n for n in ("standard", variant) if n in fus] if variant != "standard" else [variant]
    if not names:
        return ["Not audited: no fp32 export passed."]
    runtimes: dict[str, dict[str, str]] = {}
    for n in names:
        e = fus[n]
        if e.get("status") != "ok":
            for k in RUNTIMES:
                runtimes.setdefault(k, {})[n] = _state(e)
            continue
        for r in e["audit"]["runtimes"]:
            cell = f"{r['fused']} of {r['cores']}" if r["inspected"] else f"not inspected: {r['reason']}"
            runtimes.setdefault(r["runtime"], {})[n] = cell
    rows = [[RUNTIMES.get(k, k), *[v.get(n, "-") for n in names]] for k, v in runtimes.items()]
    lines = [
        "Whether each runtime runs a block's attention core (scores' matrix product, softmax, values' matrix "
        "product) as one kernel, read from the runtime's own executed or optimized graph "
        "(`attnzoo.runtime.fusion`), on the fp32 exports above.",
        "",
        markdown_table(["runtime", *[f"{n}: fused cores" for n in names]], rows, escape=True),
        "",
    ]
    e = fus.get(variant) or {}
    if e.get("status") == "ok":
        cores = e["audit"]["cores"]
        plain = [c for c in cores if not c["dot_product"]]
        if plain:
            lines += [
                f"{len(plain)} of {len(cores)} attention cores of {variant} have scores that are no matrix "
                "product (the form every runtime's attention fusion matches), so no runtime can fuse them "
                "as attention.",
                "",
            ]
        lines += [f"{variant}, kernel by kernel:", "", e["table"]]
    return lines


def _ms(row: Mapping[str, Any] | None) -> str:
    """A timed row's median, else its status and reason."""
    if row is None:
        return "-"
    return f"{row['median_ms']:.2f}" if row["status"] == "ok" else f"{row['status']}: {row['reason']}"


def _latency_md(report: Mapping[str, Any], pngs: Mapping[str, Path]) -> list[str]:
    lat = report["cost"]["latency"]
    if lat.get("status") != "ok":
        return [f"Not measured: {_state(lat)}"]
    st = lat["settings"]
    variant = report["variant"]
    over = {(o["backend"], o["dtype"], o["batch"]): o for o in lat["overheads"]}
    by = {(r["variant"], r["backend"], r["dtype"], r["batch"]): r for r in lat["rows"]}
    timed = [r for r in lat["rows"] if r["status"] in ("ok", "failed")]
    keys = list(dict.fromkeys((r["backend"], r["dtype"], r["batch"]) for r in timed))
    rows = []
    for b, d, n in keys:
        s, v, o = by.get(("standard", b, d, n)), by.get((variant, b, d, n)), over.get((b, d, n))
        ratio = f"{o['ratio_median']:.2f} [{o['ratio_q1']:.2f}, {o['ratio_q3']:.2f}]" if o else "-"
        mem = _num((v or {}).get("peak_mem_mb"), "{:.0f}")
        rows.append([b, d, str(n), _ms(s), _ms(v) if variant != "standard" else "-", ratio, mem])
    untimed: dict[tuple[str, str], str] = {}
    for r in lat["rows"]:
        if r["status"] not in ("ok", "failed") and r["variant"] == variant:
            untimed.setdefault((r["backend"], r["dtype"]), f"{r['status']}: {r['reason']}")
    bf16 = lat["bf16"]
    lines = [
        f"`bench-latency`'s run ({st['arch']} classifier, {_tokens(report['identity'], st['arch'])} tokens, "
        f"{st['threads']} thread, {st['min_time_s']:g} s per measurement, seeded random init: latency does not "
        "depend on the weights). Overhead: median [Q1, Q3] of per-pair ratios variant / standard from "
        "A B A B runs on the same backend, precision and batch.",
        "",
        markdown_table(
            ["backend", "dtype", "batch", "standard ms", f"{variant} ms", "x standard", f"{variant} peak MB"],
            rows,
            escape=True,
        ),
        "",
        "bf16 rows: " + ("this CPU has bf16 units" if bf16["rows"] else f"none - {bf16['reason']}") + ".",
    ]
    if report["budget"]["compile_budget"] == 0:
        lines += [
            "",
            "`torch.compile` is not timed in this report: its compilation per shape and precision does not "
            "fit the report's time; `bench-latency --backends compile` times it.",
        ]
    if untimed:
        lines += ["", "Not timed here:", ""] + [f"- {b} {d}: {why}" for (b, d), why in untimed.items()]
    if lat.get("interrupted"):
        lines += ["", f"Stopped early: {lat['interrupted']['note']}"]
    for key in ("latency", "overhead"):
        if key in pngs:
            lines += ["", f"![{key}]({pngs[key].name})"]
    return lines


def _scaling_md(report: Mapping[str, Any], pngs: Mapping[str, Path]) -> list[str]:
    sc = report["cost"]["scaling"]
    if sc.get("status") != "ok":
        return [f"Not measured: {_state(sc)}"]
    st = sc["settings"]
    variant = report["variant"]
    rows = []
    for p in scaling_pairs(report):

        def mb(r):
            return _num((r or {}).get("peak_mb"), "{:.0f}") if (r or {}).get("status") == "ok" else "-"

        rows.append(
            [
                {"cls": "classifier", "seg": "Segmenter"}[p["task"]],
                str(p["tokens"]),
                p["backend"],
                _ms(p.get("standard")),
                _ms(p.get("variant")) if variant != "standard" else "-",
                _num(p["ratio"], "{:.2f}"),
                mb(p.get("standard")),
                mb(p.get("variant")),
            ]
        )
    lines = [
        f"`python -m attnzoo.studies.scaling`'s run ({st['arch']} ViT, batch 1, {st['threads']} thread; peak "
        "memory: the process's peak resident set above the built model; a call predicted to take longer than "
        f"{st['max_call_s']:g} s is skipped with its reason).",
        "",
        markdown_table(
            [
                "model",
                "tokens",
                "backend",
                "standard ms",
                f"{variant} ms",
                "x standard",
                "standard peak MB",
                f"{variant} peak MB",
            ],
            rows,
            escape=True,
        ),
    ]
    if not st["seg_sizes"]:
        lines += [
            "",
            "The Segmenter encoder at 4,097 tokens is not in this run (its calls take seconds each on a CPU); "
            "`python -m attnzoo.studies.scaling` measures it.",
        ]
    if sc.get("contended"):
        lines += ["", "The machine was shared with other work during the run (load above the run's threads)."]
    if "scaling" in pngs:
        lines += ["", f"![scaling]({pngs['scaling'].name})"]
    return lines


def _fusable_md(report: Mapping[str, Any]) -> list[str]:
    fz = report.get("fusable") or {"status": "absent", "reason": "not run"}
    if fz["status"] != "ok":
        return [f"{_state(fz)}."]
    rows = [[RUNTIMES.get(k, k), f"{f} of {c}"] for k, (f, c) in fz["fused"].items()]
    speed = [
        [
            k,
            f"{s['opset20_ms']:.2f}",
            f"{s['opset23_ms']:.2f}",
            f"{s['speedup']:.2f} ({s['speedup_q1']:.2f}-{s['speedup_q3']:.2f})",
        ]
        for k, s in fz["speed"].items()
    ]
    return [
        f"The same model exported at opset 23 (`{fz['file']}`), where each dot-product core is one standard "
        f"`Attention` op ({fz['attention_ops']} here), verified against eager with the extra math "
        f"{'kept' if fz['extra_math_kept'] else 'NOT kept'} (`export-model --opset 23`).",
        "",
        markdown_table(["runtime", "fused cores at opset 23"], rows, escape=True),
        "",
        f"Its speed against the opset-20 file, batch 1, one thread, {fz['rounds']} rounds round-robin "
        "(speed-up: the per-round ratio of the opset-20 time to the opset-23 time, median and quartiles):",
        "",
        markdown_table(["runtime", "opset 20 ms", "opset 23 ms", "speed-up"], speed, escape=True),
    ]


def _gpu_md(report: Mapping[str, Any]) -> list[str]:
    g = report["cost"]["gpu"]
    if g["status"] != "ok":
        return [f"Absent: {g['reason']}."]
    rows = [
        [
            r["from"],
            r["gpu"] or "-",
            r["model"],
            r["variant"],
            r["backend"],
            r["dtype"],
            str(r["batch"]),
            _num(r["median_ms"], "{:.3f}") if r["status"] == "ok" else f"{r['status']}: {r['reason']}",
            _num(r["overhead"], "{:.2f}"),
        ]
        for r in g["rows"]
    ]
    return [
        f"{g['note']}.",
        "",
        markdown_table(
            ["from", "GPU", "model", "variant", "backend", "dtype", "batch", "median ms", "x standard"],
            rows,
            escape=True,
        ),
    ]


def markdown(report: Mapping[str, Any], pngs: Mapping[str, Path]) -> str:
    """``report.md``."""
    env = report["environment"]
    v = report["verdict"]
    gpu = (env.get("gpu") or {}).get("name") or "no GPU"
    lines = [
        f"# {report['variant']}: does it deploy, and what does it cost?",
        "",
        f"**Verdict:** {v['line']}",
        "",
        f"Measured by `{report['command'] or 'report_variant()'}` in {report['wall_time_s']:.0f} s "
        f"({report.get('cpu_time_s', 0):.0f} CPU s) on "
        f"{cpu_summary(env['cpu'])}, {gpu}; torch {env['versions'].get('torch')}, onnxruntime "
        f"{env['versions'].get('onnxruntime')}, openvino {env['versions'].get('openvino')}"
        f"{' (--quick: micro models, small sizes, short timing)' if report['quick'] else ''}. Every figure "
        "below comes from this run unless it says otherwise.",
        "",
        "| check | result |",
        "|---|---|",
    ]
    for k, ok in v["checks"].items():
        lines.append(f"| {k.replace('_', ' ')} | {'yes' if ok else 'no'} |")
    lines += [
        "",
        "## Identity",
        "",
        *_identity_md(report),
        "",
        "## Export",
        "",
        *_export_md(report),
        "",
        "## Fusion audit",
        "",
        *_fusion_md(report),
        "",
        "### A fusable export (opset 23)",
        "",
        *_fusable_md(report),
        "",
        "## Cost",
        "",
        "### Latency",
        "",
        *_latency_md(report, pngs),
        "",
        "### Scaling in tokens",
        "",
        *_scaling_md(report, pngs),
        "",
        "### GPU",
        "",
        *_gpu_md(report),
        "",
    ]
    return "\n".join(lines)


def write_report(report: dict[str, Any], out: Path) -> tuple[list[Path], str]:
    """Add the verdict to ``report``, write ``report.json``, the plots and ``report.md`` into ``out``; returns the
    files and the verdict line."""
    report["verdict"] = verdict(report, out)
    pngs = plots(report, out)
    report["plots"] = {k: p.name for k, p in pngs.items()}
    atomic_write_text(out / "report.json", json.dumps(report, indent=1, default=str) + "\n")
    atomic_write_text(out / "report.md", markdown(report, pngs))
    return [out / "report.md", out / "report.json", *pngs.values()], report["verdict"]["line"]
