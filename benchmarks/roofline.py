"""A roofline table on paper: the lower bound on latency of each model on data-centre GPUs, per precision.

For one forward pass (counted by :mod:`attnzoo.benchmarks.flops`):

    compute = max(matrix FLOPs / matrix peak, vector ops / vector peak)
    memory  = bytes moved / DRAM bandwidth
    bound   = max(compute, memory)

A measured latency can then be read as a fraction of the limit: ``bound / measured`` (1 = at the roof).

Precisions: ``fp32`` (CUDA cores, no TF32), ``tf32``, ``fp16``, ``bf16``, ``int8``, ``fp8`` (matrix ops on
tensor cores, dense: no 2:4 sparsity). Vector ops (the MAE variants' pairwise L1) run on CUDA cores: at the
FP32 rate for fp32/tf32, at the 16-bit rate otherwise (an int8 / fp8 engine computes them in fp16). Bytes:
every tensor, weights and activations, is stored at the precision's width (tf32 stores fp32). The traffic
model (each matrix op reads its operands and writes its result once; element-wise ops fused; SDPA one fused
kernel) is described in :mod:`attnzoo.benchmarks.flops`. Kernel-launch overhead is not part of the bound:
at batch 1 the small models here are far below a launch-bound latency.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from attnzoo.benchmarks.tables import markdown_table
from attnzoo.lazy import lazy_import
from attnzoo.runtime.backends import backend_names, get_backend

torch = lazy_import("torch")
bench_flops = lazy_import("attnzoo.benchmarks.flops")  # torch and timm: bench-latency --help loads without them

__all__ = [
    "GPU",
    "GPUS",
    "GPU_ALIASES",
    "PRECISIONS",
    "WIDTH",
    "resolve_gpus",
    "gpu_key",
    "bound",
    "roofline",
    "markdown",
    "against_results",
]

#: Storage width in bytes of every tensor at each precision.
WIDTH: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "int8": 1, "fp8": 1}
PRECISIONS = tuple(WIDTH)


@dataclass(frozen=True)
class GPU:
    """Published peaks of one GPU (dense; TFLOP/s = 1e12 FLOP/s, TOP/s for int8; GB/s = 1e9 B/s).

    Attributes:
        name: Product name.
        dram_gb_s: DRAM (HBM) bandwidth.
        fp32_tflops: FP32 on CUDA cores (non-tensor).
        fp16_vector_tflops: FP16 on CUDA cores (non-tensor, packed half2).
        tensor_tflops: Dense tensor-core peak per precision; ``None`` where the GPU has no such tensor cores.
        source: Where the numbers come from.
    """

    name: str
    dram_gb_s: float
    fp32_tflops: float
    fp16_vector_tflops: float
    tensor_tflops: Mapping[str, float | None]
    source: str


_H100_DATASHEET = (
    "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100); its tensor-core "
    "figures are with 2:4 sparsity, the dense ones stored here are half"
)
_HOPPER_WHITEPAPER = "non-tensor FP16: NVIDIA H100 Tensor Core GPU Architecture whitepaper, table 2"

#: The peak table, stored once. Dense tensor-core peaks (datasheet sparse figure / 2).
GPUS: dict[str, GPU] = {
    "h100-sxm": GPU(
        "NVIDIA H100 SXM5 80 GB (HBM3)",
        3350.0,
        67.0,
        133.8,
        {"tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "fp8": 1979.0, "int8": 1979.0},
        f"{_H100_DATASHEET}; {_HOPPER_WHITEPAPER}",
    ),
    "h100-pcie": GPU(
        "NVIDIA H100 PCIe 80 GB (HBM2e)",
        2000.0,
        51.0,
        102.4,
        {"tf32": 378.0, "fp16": 756.5, "bf16": 756.5, "fp8": 1513.0, "int8": 1513.0},
        f"{_H100_DATASHEET} (2022 edition, PCIe column); {_HOPPER_WHITEPAPER}",
    ),
    "h200": GPU(
        "NVIDIA H200 SXM 141 GB (HBM3e)",
        4800.0,
        67.0,
        133.8,
        {"tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "fp8": 1979.0, "int8": 1979.0},
        "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200), tensor-core figures "
        "with sparsity, dense = half; non-tensor FP16 as H100 SXM5 (the same GH100 configuration and "
        "clocks; the H200 datasheet does not list it)",
    ),
    "a100": GPU(
        "NVIDIA A100 SXM4 80 GB (HBM2e)",
        2039.0,
        19.5,
        78.0,
        {"tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "fp8": None, "int8": 624.0},
        "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf, dense "
        "figures); non-tensor FP16: NVIDIA A100 Tensor Core GPU Architecture whitepaper, table 1",
    ),
}
GPU_ALIASES = {"h100": "h100-sxm", "a100-sxm": "a100"}


def gpu_key(device_name: str) -> str | None:
    """The table key of a CUDA device name (``torch.cuda.get_device_name``), or ``None`` if not in the table."""
    n = device_name.lower()
    if "h200" in n:
        return "h200"
    if "h100" in n:
        return "h100-pcie" if "pcie" in n else "h100-sxm" if ("sxm" in n or "hbm3" in n) else None
    if "a100" in n and "80" in n and "pcie" not in n:
        return "a100"
    return None


def resolve_gpus(value: str) -> list[str]:
    """``all``, ``auto`` (the GPU present) or comma-separated keys/aliases -> table keys.

    Raises:
        ValueError: an unknown name (the valid ones listed), or ``auto`` without a known GPU.
    """
    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    if names == ["all"]:
        return list(GPUS)
    out = []
    for n in names:
        if n == "auto":
            name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
            key = gpu_key(name) if name else None
            if key is None:
                raise ValueError(
                    f"--roofline auto: {'no CUDA GPU here' if name is None else repr(name)} is not "
                    f"in the peak table; name one of: {', '.join([*GPUS, *GPU_ALIASES])}"
                )
            out.append(key)
        elif n in GPUS or n in GPU_ALIASES:
            out.append(GPU_ALIASES.get(n, n))
        else:
            raise ValueError(f"unknown GPU {n!r} for --roofline; valid: all, auto, {', '.join([*GPUS, *GPU_ALIASES])}")
    if not out:
        raise ValueError("--roofline needs a GPU name")
    return list(dict.fromkeys(out))


def _peaks(gpu: GPU, precision: str):
    """(matrix peak, vector peak) in FLOP/s; matrix ``None`` where the GPU lacks that precision."""
    vector = (gpu.fp32_tflops if precision in ("fp32", "tf32") else gpu.fp16_vector_tflops) * 1e12
    matrix = gpu.fp32_tflops if precision == "fp32" else gpu.tensor_tflops.get(precision)
    return (None if matrix is None else matrix * 1e12), vector


def bound(matrix_flops: float, vector_ops: float, bytes_moved: float, gpu: GPU, precision: str) -> dict[str, Any]:
    """The roofline of one forward pass on ``gpu`` at ``precision``.

    Returns:
        ``compute_s``, ``memory_s``, ``bound_s`` (max of the two), ``limited_by`` (``compute``/``memory``),
        ``intensity`` (FLOP per byte) and ``ridge`` (the matrix peak's FLOP per byte); ``bound_s`` is
        ``None`` where the GPU has no such precision.
    """
    matrix, vector = _peaks(gpu, precision)
    memory_s = bytes_moved / (gpu.dram_gb_s * 1e9)
    intensity = (matrix_flops + vector_ops) / bytes_moved if bytes_moved else float("inf")
    if matrix is None:
        return {
            "compute_s": None,
            "memory_s": memory_s,
            "bound_s": None,
            "limited_by": "unsupported",
            "intensity": intensity,
            "ridge": None,
        }
    compute_s = max(matrix_flops / matrix, vector_ops / vector)
    return {
        "compute_s": compute_s,
        "memory_s": memory_s,
        "bound_s": max(compute_s, memory_s),
        "limited_by": "compute" if compute_s >= memory_s else "memory",
        "intensity": intensity,
        "ridge": matrix / (gpu.dram_gb_s * 1e9),
    }


def roofline(
    variants: Sequence[str],
    task: str,
    arch: str,
    batch_sizes: Sequence[int],
    gpus: Sequence[str],
    precisions: Sequence[str] = PRECISIONS,
) -> dict[str, Any]:
    """Counts and bounds of every (variant, batch) on every GPU and precision (the ``--roofline`` result)."""
    models, rows = [], []
    for variant in variants:
        model = bench_flops.meta_model(variant, task, arch)
        for batch in batch_sizes:
            c = bench_flops.count_variant(variant, batch=batch, model=model)
            models.append({"variant": variant, "task": task, "arch": arch, "batch": batch, **c.to_dict()})
            for precision in precisions:
                nbytes = c.bytes(WIDTH[precision])
                for key in gpus:
                    rows.append(
                        {
                            "variant": variant,
                            "batch": batch,
                            "gpu": key,
                            "precision": precision,
                            "matrix_flops": c.matrix_flops,
                            "vector_ops": c.vector_ops,
                            "bytes": nbytes,
                            **bound(c.matrix_flops, c.vector_ops, nbytes, GPUS[key], precision),
                        }
                    )
    return {
        "task": task,
        "arch": arch,
        "gpus": {k: asdict(GPUS[k]) for k in gpus},
        "precisions": list(precisions),
        "widths": {p: WIDTH[p] for p in precisions},
        "models": models,
        "rows": rows,
    }


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.1f}"


def markdown(result: dict[str, Any], against: list[dict[str, Any]] | None = None) -> str:
    """The tables: counts per model, then per GPU the bound (µs) per precision, c/m = compute/memory bound."""
    parts = [
        f"# Roofline lower bounds: {result['arch']} {result['task']}",
        "",
        "bound = max(matrix FLOPs / matrix peak, vector ops / vector peak, bytes / DRAM bandwidth); "
        "dense peaks from the datasheets (attnzoo.benchmarks.roofline.GPUS). Bytes: weights + activations "
        "under the fused-kernel traffic model (attnzoo.benchmarks.flops), every tensor at the precision's "
        "width. Launch overhead is not included.",
        "",
        _counts_table(result),
        "",
    ]
    cell = {(r["variant"], r["batch"], r["gpu"], r["precision"]): r for r in result["rows"]}
    for key, gpu in result["gpus"].items():
        parts += _gpu_section(result, key, gpu, cell)
    if against:
        parts += ["## Measured against the bound", "", _against_table(against), ""]
    return "\n".join(parts)


def _counts_table(result: dict[str, Any]) -> str:
    """Each model's counts: matrix FLOPs, vector ops, and the bytes moved and arithmetic intensity per width."""
    precisions = result["precisions"]
    widths = sorted({result["widths"][p] for p in precisions}, reverse=True)
    label = {w: "/".join(p for p in precisions if result["widths"][p] == w) for w in widths}
    return markdown_table(
        [
            "variant",
            "batch",
            "matrix GFLOP",
            "vector Gop",
            *[f"MB moved, {label[w]}" for w in widths],
            *[f"FLOP/B, {label[w]}" for w in widths],
        ],
        [
            [
                m["variant"],
                str(m["batch"]),
                f"{m['matrix_flops'] / 1e9:.3f}",
                f"{m['vector_ops'] / 1e9:.3f}",
                *[f"{(m['activation_elements'] + m['weight_elements']) * w / 1e6:.1f}" for w in widths],
                *[
                    format(
                        (m["matrix_flops"] + m["vector_ops"]) / ((m["activation_elements"] + m["weight_elements"]) * w),
                        ".0f",
                    )
                    for w in widths
                ],
            ]
            for m in result["models"]
        ],
    )


def _gpu_section(
    result: dict[str, Any], key: str, gpu: dict[str, Any], cell: dict[tuple[Any, ...], dict[str, Any]]
) -> list[str]:
    """One GPU's peaks and its table of bounds (µs) per model and precision."""
    precisions = result["precisions"]
    peaks = ", ".join(
        f"{p} {gpu['fp32_tflops'] if p == 'fp32' else gpu['tensor_tflops'].get(p) or '-'}" for p in precisions
    )
    parts = [
        f"## {gpu['name']}: lower bound in µs (c = compute-bound, m = memory-bound)",
        "",
        f"Peaks (TFLOP/s, dense): {peaks}; DRAM {gpu['dram_gb_s']:,.0f} GB/s. Source: {gpu['source']}.",
        "",
    ]
    rows = []
    for m in result["models"]:
        line = [m["variant"], str(m["batch"])]
        for p in precisions:
            r = cell[(m["variant"], m["batch"], key, p)]
            line.append("n/a" if r["bound_s"] is None else f"{_us(r['bound_s'])} {r['limited_by'][0]}")
        rows.append(line)
    return [*parts, markdown_table(["variant", "batch", *precisions], rows), ""]


def _against_table(against: list[dict[str, Any]]) -> str:
    """Measured rows of a GPU run against their bound."""
    return markdown_table(
        [
            "variant",
            "backend",
            "dtype",
            "batch",
            "GPU",
            "bound precision",
            "bound µs",
            "measured µs",
            "fraction of the roof",
        ],
        [
            [
                a["variant"],
                a["backend"],
                a["dtype"],
                str(a["batch"]),
                a["gpu"],
                a["precision"],
                _us(a["bound_s"]),
                _us(a["measured_s"]),
                f"{a['fraction']:.1%}",
            ]
            for a in against
        ],
    )


#: Which bound a measured row is read against: its own precision (an fp32 row ran with TF32 off, on CUDA cores; a
#: tf32 row on TF32 tensor cores).
_BOUND_OF_DTYPE = {p: p for p in PRECISIONS}


def against_results(result: dict[str, Any], results_json: Path) -> list[dict[str, Any]]:
    """Measured GPU rows of a ``bench-latency`` results.json as fractions of this roofline's bounds.

    Rows are matched on variant, batch and (mapped) precision, for the GPU the results were measured on.

    Raises:
        ValueError: the file has no GPU, or its GPU is not one of this roofline's.
    """
    data = json.loads(Path(results_json).read_text())
    name = ((data.get("environment") or {}).get("gpu") or {}).get("name")
    key = gpu_key(name) if name else None
    if key is None or key not in result["gpus"]:
        raise ValueError(
            f"{results_json}: measured on {name or 'no GPU'}; --roofline covers {', '.join(result['gpus'])}"
        )
    settings = data.get("settings", {})
    if (settings.get("arch"), settings.get("task")) != (result["arch"], result["task"]):
        raise ValueError(
            f"{results_json}: {settings.get('arch')} {settings.get('task')} results, but the roofline "
            f"is for {result['arch']} {result['task']} (use the same --arch/--task)"
        )
    cell = {(r["variant"], r["batch"], r["precision"]): r for r in result["rows"] if r["gpu"] == key}
    out = []

    device = "cuda" if str(settings.get("device", "")).startswith("cuda") else "cpu"
    on_gpu = {n for n in backend_names() if get_backend(n).row_device(device) == "cuda"}
    for row in data.get("results", []):
        if row.get("status") != "ok" or row.get("backend") not in on_gpu:
            continue
        r = cell.get((row["variant"], row["batch"], _BOUND_OF_DTYPE.get(row["dtype"], "")))
        if r is None or r["bound_s"] is None:
            continue
        measured = row["median_ms"] / 1e3
        out.append(
            {
                "variant": row["variant"],
                "backend": row["backend"],
                "dtype": row["dtype"],
                "batch": row["batch"],
                "gpu": key,
                "precision": r["precision"],
                "bound_s": r["bound_s"],
                "measured_s": measured,
                "fraction": r["bound_s"] / measured,
            }
        )
    return out
