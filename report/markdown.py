"""``report.md``: one GitHub-renderable page of a report (:func:`markdown`): the verdict and its table of checks, the
variant's identity, its exports side by side with ``standard``'s, the fusion audit, the opset-23 export, the cost
(latency, scaling in tokens, the GPU plan's committed rows) and the plots."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attnzoo.benchmarks.tables import markdown_table
from attnzoo.machine import cpu_summary
from attnzoo.mdtext import code, fence, text
from attnzoo.runtime.fusion import FUSED, RUNTIMES, inspected_line, runtime_label
from attnzoo.runtime.fusion import markdown as fusion_markdown

from .formats import block_entries, entry_title, report_formats
from .verdict import FAILED, PASSED, _num, _state, _tokens, scaling_pairs

__all__ = ["markdown"]

#: A measured cost section's lines: of the report, the section and the plots.
_CostBody = Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Path]], list[str]]


def _identity_md(report: Mapping[str, Any]) -> list[str]:
    ident = report["identity"]
    if ident.get("status") != "ok":
        return [f"Not measured: {_state(ident)}"]
    lines = [
        markdown_table(
            ["", ""],
            [
                ["paper", text(ident["paper"] or "-")],
                ["package", text(f"{ident['package']} {ident['version']}".strip())],
                ["extra-math scopes", ", ".join(code(s) for s in ident["extra_scopes"]) or "none (plain attention)"],
                ["extra parameters", _num(ident["extra_params"])],
                [
                    "extra weights (beyond timm's Attention)",
                    ", ".join(code(w) for w in ident["extra_weights"]) or "none",
                ],
                ["scores", "pairwise distances (no matrix product)" if ident["pairwise_scores"] else "matrix products"],
                ["cost family", text(ident["cost_family"])],
            ],
        ),
        "",
    ]
    if ident["equations"]:
        lines += ["Equations:", "", *fence(ident["equations"]), ""]
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
                f"GFLOPs per image at {text(size)} px",
                f"{std / 1e9:.3f}",
                f"{flops / 1e9:.3f}",
                f"{ident['flops_ratio'][size]:.3f}",
            ]
        )
    lines += [
        f"ViT {code(ident['arch'])} classifier, counted by {text(ident['counter'])}:",
        "",
        markdown_table(["", "standard", text(report["variant"]), "ratio"], rows),
    ]
    return lines


def _md_parity(entry: Mapping[str, Any]) -> str:
    """An ONNX entry's parity with eager: passed or not, its error, tolerance and batch sizes."""
    if entry.get("status") != "ok":
        return _state(entry)
    tol = next(iter(entry["tolerance"].values()), None)
    return (
        f"{'passed' if entry['passed'] else 'FAILED'}: max abs err {entry['max_abs_err']:.2e} (tolerance {tol:g} x "
        f"max(1, max abs logit)), batch sizes {text(entry['batch_sizes'])}"
    )


def _md_int8(entry: Mapping[str, Any]) -> str:
    """A quantized entry's fidelity to fp32: cosine and top-1 agreement on held-out inputs."""
    if entry.get("status") != "ok":
        return _state(entry)
    top1 = entry.get("top1_agreement")
    return (
        f"cosine to fp32 min {_num(entry['cosine_min'], '{:.4f}')} / mean {_num(entry['cosine_mean'], '{:.4f}')}, "
        f"top-1 agreement {_num(100 * top1 if top1 is not None else None, '{:.1f}')}% on "
        f"{_num(entry.get('fidelity_inputs'))} held-out inputs"
    )


def _md_placement(entry: Mapping[str, Any]) -> str:
    """The int8 placement chosen: what stayed fp32 and how many ops of each kind were quantized."""
    if entry.get("status") != "ok":
        return "-"
    kept = entry.get("kept_fp32") or []
    q, t = entry.get("quantized_ops") or {}, entry.get("total_ops") or {}
    ops = ", ".join(f"{text(k)} {_num(q[k])}/{_num(t.get(k, '?'))}" for k in q)
    return f"{code(entry.get('placement'))}; kept fp32: {text(', '.join(map(str, kept)) or 'nothing')}; quantized {ops}"


def _md_accuracy(side: Mapping[str, Any]) -> str:
    """A side's test-split accuracy, fp32 and int8."""
    a = side["accuracy"]
    if a.get("status") != "ok":
        return _state(a)
    m = a.get("metrics") or {}
    return (
        f"{text(a.get('metric_name'))} fp32 {_num(m.get('fp32'), '{:.2f}')} / int8 "
        f"{_num(m.get('int8'), '{:.2f}')} on {_num(a.get('n_images'))} {text(a.get('data'))} "
        f"{text(a.get('split'))} images"
    )


def _md_tensorrt(side: Mapping[str, Any]) -> str:
    """A side's TensorRT engine: its state (without a GPU: the library and target) and its network check."""
    t = side.get("tensorrt") or {}
    if t.get("status") != "ok":
        return _state(t)
    nc = t.get("network_check") or {}
    state = text(t.get("state"))
    if not t.get("ran_on_gpu"):
        state = f"{state} - no GPU ({text(t.get('library'))}, {text(t.get('compute_capability'))})"
    return f"{state}; network check {'ok' if nc.get('ok') else 'FAILED'} ({_num(nc.get('layers'))} layers)"


def _md_kept(side: Mapping[str, Any]) -> str:
    """Whether each format of a side kept the extra math."""
    return ", ".join(f"{text(k)} {_num(v)}" for k, v in side["extra_math_kept"].items())


def _md_triton(side: Mapping[str, Any]) -> str:
    """A side's Triton config: written or not, its file and platform."""
    t = side["triton"]
    if t.get("status") != "ok":
        return _state(t)
    return f"{'written' if t.get('passed') else 'FAILED'}: {code(t.get('config'))} ({text(t.get('platform'))})"


def _md_source(side: Mapping[str, Any]) -> str:
    """Which model a side exported: the zoo's classifier, the author's checkpoint or a random init."""
    s = side["source"]
    return {
        "zoo": f"the zoo's classifier ({code(Path(str(s.get('checkpoint', ''))).name)})",
        "checkpoint": f"checkpoint {code(s.get('checkpoint'))}",
    }.get(s["kind"], f"random init ({text(s.get('arch'))})")


def _md_diverges(side: Mapping[str, Any]) -> str:
    """Where each entry with block outputs diverges."""
    said = [f"{entry_title(d)} {_where(side[d])}" for d in block_entries() if (side.get(d) or {}).get("blocks")]
    return "; ".join(said) or "-"


def _md_written(entry: Mapping[str, Any]) -> str:
    """A format's entry: its parity, the runtime it ran on and whether it kept the extra math."""
    if entry.get("status") != "ok":
        return _state(entry)
    extra = entry.get("extra_math") or {}
    count = ", ".join(f"{text(k)} {_num(v)}" for k, v in (extra.get("nodes_per_block") or {}).items())
    kept = "kept" if extra.get("ok") else "NOT kept"
    return f"{_md_parity(entry)}; on {text(entry.get('runtime'))}; extra math {kept}" + (
        f" (ops per block: {count})" if count else ""
    )


def _export_md(report: Mapping[str, Any]) -> list[str]:
    sides = report["export"]
    names = (
        ["standard", report["variant"]]
        if "standard" in sides and report["variant"] != "standard"
        else [report["variant"]]
    )

    def cells(fn) -> list[str]:
        return [fn(sides[n]) for n in names]

    rows = [
        ["model", *cells(_md_source)],
        ["fp32: parity with eager", *cells(lambda e: _md_parity(e["fp32"]))],
        ["where it diverges (block outputs)", *cells(_md_diverges)],
        ["fp16: parity with eager fp32", *cells(lambda e: _md_parity(e["fp16"]))],
        ["extra math kept (per format)", *cells(_md_kept)],
        ["int8: fidelity to fp32", *cells(lambda e: _md_int8(e["int8"]))],
        ["int8: placement chosen", *cells(lambda e: _md_placement(e["int8"]))],
        ["accuracy on the test split", *cells(_md_accuracy)],
        ["FP8 graph", *cells(lambda e: _md_int8(e["fp8"]))],
        ["TensorRT", *cells(_md_tensorrt)],
        ["Triton config", *cells(_md_triton)],
        *[
            [f"{entry_title(f)}: parity with eager fp32", *cells(lambda e, f=f: _md_written(e.get(f) or {}))]
            for f in report_formats()
        ],
    ]
    return [
        "Each row is `export_model()` run here; files under `exports/`.",
        "",
        markdown_table(["", *map(text, names)], rows),
    ]


def _where(entry: Mapping[str, Any]) -> str:
    """``first diverging block 1 (worst op `blocks.1.attn.proj/Add`)`` or ``worst block 3 (2.9e-07)``."""
    first, blocks = entry.get("first_diverging_block"), entry.get("blocks") or []
    if first is not None:
        op = entry.get("worst_op")
        return f"first diverging block {first}" + (f" (worst op {code(op)})" if op else "")
    worst = max(blocks, key=lambda b: b["rel_err"])
    return f"worst block {worst['block']} ({_num(worst['rel_err'], '{:.1e}')})"


def _fusion_md(report: Mapping[str, Any]) -> list[str]:
    fus = report.get("fusion") or {}
    variant = report["variant"]
    names = [n for n in ("standard", variant) if n in fus] if variant != "standard" else [variant]
    if not names:
        return ["Not audited: no fp32 export passed."]
    runtimes: dict[str, dict[str, str]] = {}
    labels: dict[str, str] = {}
    inspected = []
    for n in names:
        e = fus[n]
        if e.get("status") != "ok":
            for k in RUNTIMES:
                runtimes.setdefault(k, {})[n] = _state(e)
            continue
        inspected.append(f"{text(n)}: {text(inspected_line(e['audit']['runtimes']))}")
        for r in e["audit"]["runtimes"]:
            cell = f"{r['fused']} of {r['cores']}" if r["inspected"] else f"not inspected: {r['reason']}"
            runtimes.setdefault(r["runtime"], {})[n] = text(cell)
            labels.setdefault(r["runtime"], runtime_label(r))
    rows = [[text(labels.get(k, RUNTIMES.get(k, k))), *[v.get(n, "-") for n in names]] for k, v in runtimes.items()]
    lines = [
        f"Whether each runtime runs a block's attention core as one kernel ({text(FUSED)}; "
        "`attnzoo.runtime.fusion`), on the fp32 exports above. " + " ".join(inspected),
        "",
        markdown_table(["runtime", *[f"{text(n)}: fused cores" for n in names]], rows),
        "",
    ]
    e = fus.get(variant) or {}
    if e.get("status") == "ok":
        cores = e["audit"]["cores"]
        plain = [c for c in cores if not c["dot_product"]]
        if plain:
            lines += [
                f"{len(plain)} of {len(cores)} attention cores of {text(variant)} have scores that are no matrix "
                "product (the form every runtime's attention fusion matches), so no runtime can fuse them "
                "as attention.",
                "",
            ]
        lines += [f"{text(variant)}, kernel by kernel:", "", fusion_markdown(e["audit"])]
    return lines


def _ms(row: Mapping[str, Any] | None) -> str:
    """A timed row's median, else its status and reason."""
    if row is None:
        return "-"
    return f"{row['median_ms']:.2f}" if row["status"] == "ok" else text(f"{row['status']}: {row['reason']}")


def _cost_md(report: Mapping[str, Any], pngs: Mapping[str, Path], key: str, body: _CostBody) -> list[str]:
    """The cost section ``key`` (``latency``, ``scaling``): ``body`` of its measurement, or why it was not measured."""
    section = report["cost"][key]
    if section.get("status") != "ok":
        return [f"Not measured: {_state(section)}"]
    return body(report, section, pngs)


def _latency_md(report: Mapping[str, Any], lat: Mapping[str, Any], pngs: Mapping[str, Path]) -> list[str]:
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
        rows.append([text(b), text(d), text(n), _ms(s), _ms(v) if variant != "standard" else "-", ratio, mem])
    untimed: dict[tuple[str, str], str] = {}
    for r in lat["rows"]:
        if r["status"] not in ("ok", "failed") and r["variant"] == variant:
            untimed.setdefault((r["backend"], r["dtype"]), f"{r['status']}: {r['reason']}")
    bf16 = lat["bf16"]
    lines = [
        f"`bench-latency`'s run ({text(st['arch'])} classifier, {_num(_tokens(report['identity'], st['arch']))} "
        f"tokens, {_num(st['threads'])} thread, {st['min_time_s']:g} s per measurement, seeded random init: latency "
        "does not "
        "depend on the weights). Overhead: median [Q1, Q3] of per-pair ratios variant / standard from "
        "A B A B runs on the same backend, precision and batch.",
        "",
        markdown_table(
            [
                "backend",
                "dtype",
                "batch",
                "standard ms",
                f"{text(variant)} ms",
                "x standard",
                f"{text(variant)} peak MB",
            ],
            rows,
        ),
        "",
        "bf16 rows: " + ("this CPU has bf16 units" if bf16["rows"] else f"none - {text(bf16['reason'])}") + ".",
    ]
    if report["budget"]["compile_budget"] == 0:
        lines += [
            "",
            "`torch.compile` is not timed in this report: its compilation per shape and precision does not "
            "fit the report's time; `bench-latency --backends compile` times it.",
        ]
    if untimed:
        lines += ["", "Not timed here:", ""] + [f"- {text(f'{b} {d}: {why}')}" for (b, d), why in untimed.items()]
    if lat.get("interrupted"):
        lines += ["", f"Stopped early: {text(lat['interrupted']['note'])}"]
    for key in ("latency", "overhead"):
        if key in pngs:
            lines += ["", f"![{key}]({pngs[key].name})"]
    return lines


def _scaling_md(report: Mapping[str, Any], sc: Mapping[str, Any], pngs: Mapping[str, Path]) -> list[str]:
    st = sc["settings"]
    variant = report["variant"]
    rows = []
    for p in scaling_pairs(report):

        def mb(r):
            return _num((r or {}).get("peak_mb"), "{:.0f}") if (r or {}).get("status") == "ok" else "-"

        rows.append(
            [
                {"cls": "classifier", "seg": "Segmenter"}.get(p["task"], text(p["task"])),
                text(p["tokens"]),
                text(p["backend"]),
                _ms(p.get("standard")),
                _ms(p.get("variant")) if variant != "standard" else "-",
                _num(p["ratio"], "{:.2f}"),
                mb(p.get("standard")),
                mb(p.get("variant")),
            ]
        )
    lines = [
        f"`python -m attnzoo.benchmarks.scaling`'s run ({text(st['arch'])} ViT, batch 1, {_num(st['threads'])} thread; "
        "peak memory: the process's peak resident set above the built model; a call predicted to take longer than "
        f"{st['max_call_s']:g} s is skipped with its reason).",
        "",
        markdown_table(
            [
                "model",
                "tokens",
                "backend",
                "standard ms",
                f"{text(variant)} ms",
                "x standard",
                "standard peak MB",
                f"{text(variant)} peak MB",
            ],
            rows,
        ),
    ]
    if not st["seg_sizes"]:
        lines += [
            "",
            "The Segmenter encoder at 4,097 tokens is not in this run (its calls take seconds each on a CPU); "
            "`python -m attnzoo.benchmarks.scaling` measures it.",
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
    rows = []
    for k, e in fz["fused"].items():
        if not isinstance(e, Mapping):  # an earlier report's [fused, cores]
            e = {"runtime": k, "inspected": True, "fused": e[0], "cores": e[1]}
        cell = f"{e['fused']} of {e['cores']}" if e.get("inspected") else f"not inspected: {e.get('reason')}"
        rows.append([text(runtime_label({"runtime": k, **e})), text(cell)])
    speed = [
        [
            text(k),
            f"{s['opset20_ms']:.2f}",
            f"{s['opset23_ms']:.2f}",
            f"{s['speedup']:.2f} ({s['speedup_q1']:.2f}-{s['speedup_q3']:.2f})",
        ]
        for k, s in fz["speed"].items()
    ]
    return [
        f"The same model (the same weights) exported at opset 23 ({code(fz['file'])}), where each dot-product core "
        f"is one standard `Attention` op ({_num(fz['attention_ops'])} here), verified against eager with the extra "
        f"math {'kept' if fz['extra_math_kept'] else 'NOT kept'} (`export-model --opset 23`). {text(FUSED)}.",
        "",
        markdown_table(["runtime", "fused cores at opset 23"], rows),
        "",
        f"Its speed against the opset-20 file, batch 1, one thread, {_num(fz['rounds'])} rounds round-robin, each "
        "runtime's outputs of both files checked first against the opset-20 file's ONNX Runtime output "
        "(speed-up: the per-round ratio of the opset-20 time to the opset-23 time, median and quartiles):",
        "",
        markdown_table(["runtime", "opset 20 ms", "opset 23 ms", "speed-up"], speed),
    ]


def _gpu_md(report: Mapping[str, Any]) -> list[str]:
    g = report["cost"]["gpu"]
    if g["status"] != "ok":
        return [f"Absent: {text(g['reason'])}."]
    rows = [
        [
            text(r["from"]),
            text(r["gpu"] or "-"),
            text(r["model"]),
            text(r["variant"]),
            text(r["backend"]),
            text(r["dtype"]),
            text(r["batch"]),
            _num(r["median_ms"], "{:.3f}") if r["status"] == "ok" else text(f"{r['status']}: {r['reason']}"),
            _num(r["overhead"], "{:.2f}"),
        ]
        for r in g["rows"]
    ]
    return [
        f"{text(g['note'])}.",
        "",
        markdown_table(
            ["from", "GPU", "model", "variant", "backend", "dtype", "batch", "median ms", "x standard"], rows
        ),
    ]


def markdown(report: Mapping[str, Any], pngs: Mapping[str, Path]) -> str:
    """``report.md``."""
    lines = [
        *_checks_md(report),
        "",
        "## Identity",
        "",
        *_identity_md(report),
        "",
        "## Export",
        "",
        *_export_md(report),
        *([] if "blocks" not in pngs else ["", f"![error at each block's output]({pngs['blocks'].name})"]),
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
        *_cost_md(report, pngs, "latency", _latency_md),
        "",
        "### Scaling in tokens",
        "",
        *_cost_md(report, pngs, "scaling", _scaling_md),
        "",
        "### GPU",
        "",
        *_gpu_md(report),
        "",
    ]
    return "\n".join(lines)


def _checks_md(report: Mapping[str, Any]) -> list[str]:
    """The title, the verdict, where and how the run was measured, and the table of checks."""
    env = report["environment"]
    v = report["verdict"]
    gpu = (env.get("gpu") or {}).get("name") or "no GPU"
    versions = env["versions"]
    lines = [
        f"# {text(report['variant'])}: does it deploy, and what does it cost?",
        "",
        f"**Verdict:** {text(v['line'])}",
        "",
        f"Measured by {code(report['command'] or 'report_variant()')} in {report['wall_time_s']:.0f} s "
        f"({report.get('cpu_time_s', 0):.0f} CPU s) on "
        f"{text(cpu_summary(env['cpu']))}, {text(gpu)}; torch {text(versions.get('torch'))}, onnxruntime "
        f"{text(versions.get('onnxruntime'))}, openvino {text(versions.get('openvino'))}"
        f"{' (--quick: micro models, small sizes, short timing)' if report['quick'] else ''}. Every figure "
        "below comes from this run unless it says otherwise.",
        "",
        "| check | result |",
        "|---|---|",
    ]
    for k, state in v["states"].items():
        cell = {PASSED: "yes", FAILED: "no"}.get(state) or (
            f"{state}: required" if k in v["problems"] else f"{state}: not counted toward deploys"
        )
        lines.append(f"| {text(k.replace('_', ' '))} | {text(cell)} |")
    for f in v.get("failed") or []:
        lines.append(f"| {text(f['check'])} | no: {text(f['reason'])} |")
    return lines
