"""The machine a benchmark ran on: CPU model and flags, cores, load, GPU, library versions."""

from __future__ import annotations

import importlib
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

from attnzoo.lazy import lazy_import

torch = lazy_import("torch")
ort = lazy_import("onnxruntime")

__all__ = [
    "environment",
    "cpu_info",
    "cpu_summary",
    "gpu_info",
    "load_average",
    "load_1min",
    "others_load",
    "load_slowdown",
    "rss_bytes",
    "usable_cores",
    "BF16_FLAGS",
    "bf16_problem",
]

#: CPU flags that decide which fast paths exist: x86 (AVX2/FMA, F16C, AVX-512, VNNI, bf16, AMX) and Arm (SVE,
#: dot product, i8mm, bf16).
KEY_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimd",
    "asimddp",
    "i8mm",
    "sve",
    "bf16",
)


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_info() -> dict[str, Any]:
    """Model name, all flags, the key flags present, logical cores and the cores this process may use."""
    model, flags = platform.processor() or platform.machine(), list[str]()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = value.split()
    except OSError:
        pass
    usable = usable_cores()
    return {
        "model": model,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "key_flags": [f for f in KEY_FLAGS if f in flags],
        "flags": flags,
    }


#: Fast-path flags whose absence a reader needs to know (x86: a CPU without them has no AVX-512 / VNNI / AMX).
_NOTABLE_ABSENT = ("avx512f", "avx512_vnni", "avx_vnni", "amx_int8")


def cpu_summary(cpu: dict[str, Any]) -> str:
    """One line naming the CPU and its fast-path flags, present and (on x86) absent, e.g.
    ``AMD EPYC (avx, avx2, fma, f16c; no avx512f, avx512_vnni, avx_vnni, amx_int8)``."""
    have = list(cpu.get("key_flags") or [])
    absent = [f for f in _NOTABLE_ABSENT if f not in have] if "avx2" in have else []
    flags = ", ".join(have) or "no SIMD flags reported"
    return f"{cpu.get('model') or 'unknown CPU'} ({flags}{'; no ' + ', '.join(absent) if absent else ''})"


#: CPU flags of bf16 units: x86's AVX-512 BF16 (Cooper Lake, Sapphire Rapids and later Xeons, AMD Zen 4 and later)
#: and AMX BF16 (Sapphire Rapids and later), Arm's BF16 extension (``bf16`` in ``/proc/cpuinfo``'s Features).
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def bf16_problem(cpu: dict[str, Any] | None = None) -> str | None:
    """Why bf16 is no fast path on this CPU (one line naming the flags it lacks), or ``None`` when it has bf16
    units (any of :data:`BF16_FLAGS`). ``cpu``: a :func:`cpu_info` dict (default: this machine's)."""
    cpu = cpu_info() if cpu is None else cpu
    flags = set(cpu.get("flags") or cpu.get("key_flags") or ())
    if flags & set(BF16_FLAGS):
        return None
    missing = "neither avx512_bf16 nor amx_bf16" if flags & {"sse2", "avx", "avx2"} else "no bf16"
    return (
        f"this CPU ({cpu.get('model') or 'unknown CPU'}) has no bf16 units ({missing}): bf16 would run "
        "converted to fp32, slower than fp32; use fp32 here, or int8 (export-model --dtype int8)"
    )


def gpu_info() -> dict[str, Any] | None:
    """Name, memory, compute capability, driver and CUDA versions of GPU 0, or ``None`` without CUDA."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    info: dict[str, Any] = {
        "name": props.name,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "capability": f"{props.major}.{props.minor}",
        "cuda_runtime": torch.version.cuda,
        "count": torch.cuda.device_count(),
        "driver": None,
    }
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout
            info["driver"] = out.strip().splitlines()[0] if out.strip() else None
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def _version(module: str) -> str | None:
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:  # not installed, or broken install: report it as absent
        return None


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (empty where the OS has none)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def load_1min() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    load = load_average()
    return load[0] if load else None


def others_load(load_1min: float, own_cpu_s: float, threads: int) -> float:
    """The part of a 1-minute load average that is other work than this process: its own share taken out, at most
    ``threads`` runnable threads and at most the CPU seconds it has used spread over the minute (a process under a
    minute old, as a command is when it starts, adds about ``own_cpu_s / 60`` to the average)."""
    return max(0.0, load_1min - min(own_cpu_s / 60.0, float(threads)))


def load_slowdown(others: float, cores: int, threads: int) -> float:
    """How many times longer work on ``threads`` threads takes beside ``others`` runnable threads of other work
    (:func:`others_load`) on ``cores`` cores than on an idle machine, each runnable thread getting an equal share
    of the cores: ``(others + threads) / max(cores, threads)``, at least 1."""
    return max(1.0, (others + threads) / max(cores, threads, 1))


def rss_bytes() -> int:
    """Resident set size of this process now (Linux ``/proc/self/statm``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def environment() -> dict[str, Any]:
    """Everything needed to compare two result files: hardware, load, versions, thread settings."""
    try:
        providers = ort.get_available_providers()
    except ImportError:  # ONNX Runtime is not installed
        providers = []
    return {
        "cpu": cpu_info(),
        "gpu": gpu_info(),
        "load_average": load_average(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {
            name: _version(name)
            for name in (
                "torch",
                "onnxruntime",
                "openvino",
                "onnx",
                "tensorrt",
                "tensorrt_rtx",
                "timm",
                "numpy",
                "triton",
            )
        },
        "ort_providers": providers,
        "torch_threads": torch.get_num_threads(),
    }
