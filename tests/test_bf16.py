"""bf16 where the CPU has bf16 units: the refusal elsewhere, OpenVINO with the extra math pinned to f32 and read
back from its runtime model, PyTorch autocast with the extra scopes in fp32, the accuracy gate and serving."""

from __future__ import annotations

import pytest

from attnzoo.machine import BF16_FLAGS, bf16_problem, cpu_info

#: This machine has bf16 units (the refusal tests then do not apply; the bf16 runs do).
HAS_BF16 = bf16_problem() is None


# ------------------------------------------------------------------------------------------ the CPU's bf16 units
def test_bf16_problem_names_the_missing_flags_and_accepts_each_bf16_unit():
    avx2 = {"model": "AVX2 CPU", "flags": ["sse2", "avx", "avx2", "fma", "f16c"]}
    line = bf16_problem(avx2)
    assert line is not None and "\n" not in line
    assert "AVX2 CPU" in line and "avx512_bf16" in line and "amx_bf16" in line
    arm = bf16_problem({"model": "Arm CPU", "flags": ["asimd", "sve"]})
    assert arm is not None and "no bf16" in arm and "avx512" not in arm
    for flag in BF16_FLAGS:
        assert bf16_problem({"model": "X", "flags": ["avx2", flag]}) is None
    assert bf16_problem({"model": "X", "key_flags": ["avx2", "amx_bf16"]}) is None  # a results file's cpu dict


def test_bf16_problem_reads_this_machine():
    has = bool(set(BF16_FLAGS) & set(cpu_info()["flags"]))
    assert (bf16_problem() is None) == has
