"""The one parity comparison (:mod:`attnzoo.runtime.parity`) at its boundary, for every precision of its table: an
error at the tolerance passes, the next float above it fails; half the tolerance passes, twice it fails; the
denominator is ``max(1, max |ref|)``; a shape mismatch or a non-finite output never passes."""

from __future__ import annotations

import numpy as np
import pytest

from attnzoo.runtime.parity import _BLOCK, TOLERANCES, check, compare, parity_error, tolerance_key

KEYS = sorted(TOLERANCES)


def _shifted(ref: np.ndarray, error: float) -> np.ndarray:
    """``ref`` with one logit moved so that ``max |out - ref| / max(1, max |ref|)`` is ``error``."""
    out = ref.astype(np.float64).copy()
    out.flat[0] += error * max(1.0, float(np.abs(ref).max()))
    return out


@pytest.mark.parametrize("key", KEYS)
def test_an_error_at_the_tolerance_passes_and_the_next_float_above_it_fails(key):
    tol = TOLERANCES[key]
    ref = np.zeros((2, 5))  # max |ref| 0: the error is the absolute difference, exactly
    for error, passes in ((tol, True), (np.nextafter(tol, np.inf), False), (np.nextafter(tol, 0.0), True)):
        out = ref.copy()
        out[1, 3] = error
        c = compare(out, ref, key)
        assert (c["passed"], c["error"], c["tolerance"], c["key"]) == (passes, error, tol, key)
        assert check(out, ref, key) == (passes, error)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("scale", [0.25, 1.0, 40.0])
def test_half_the_tolerance_passes_and_twice_it_fails_relative_to_max_one_and_the_largest_logit(key, scale):
    """Logits up to 1 are compared absolutely, larger ones relative to the largest: at max |ref| 0.25 an error of
    0.75 tol is within it (and would be 3 tol if divided by max |ref|), at 40 an error of 0.5 tol x 40 is too."""
    tol = TOLERANCES[key]
    ref = np.random.default_rng(0).uniform(-1.0, 1.0, (3, 7))
    ref *= scale / np.abs(ref).max()
    for factor, passes in ((0.5, True), (0.75, True), (2.0, False), (1.25, False)):
        out = _shifted(ref, factor * tol)
        c = compare(out, ref, key)
        assert c["passed"] is passes and c["error"] == pytest.approx(factor * tol, rel=1e-9), (factor, c)
        assert c["max_abs_ref"] == pytest.approx(scale) and c["finite"] and c["shape_ok"]
        ok, err = check(out, ref, key)
        assert ok is passes and err == pytest.approx(factor * tol, rel=1e-9)
        assert parity_error(out, ref) == pytest.approx(factor * tol, rel=1e-9)


def test_the_worst_block_decides_an_output_larger_than_one_block():
    """The error is accumulated block by block: one logit off in the last block of a large output is found there,
    and the mean counts every block."""
    n = _BLOCK + 10
    ref = np.zeros(n, np.float32)
    ref[0] = 0.5  # the largest |ref| in the first block, the error in the last
    out = ref.copy()
    out[-1] = 3 * TOLERANCES["fp32"]
    c = compare(out, ref, "fp32")
    assert not c["passed"] and c["error"] == pytest.approx(3 * TOLERANCES["fp32"]) and c["max_abs_ref"] == 0.5
    assert c["mean_abs_err"] == pytest.approx(3 * TOLERANCES["fp32"] / n)
    big = ref.copy()
    big[-1] = 4.0  # the largest |ref| in the last block: the same error is relative to it
    c = compare(big + (out - ref), big, "fp32")
    assert c["max_abs_ref"] == 4.0 and c["error"] == pytest.approx(3 * TOLERANCES["fp32"] / 4, rel=1e-3)


@pytest.mark.parametrize("key", KEYS)
def test_a_shape_mismatch_or_a_non_finite_output_never_passes(key):
    ref = np.zeros((2, 5))
    wrong = compare(np.zeros((2, 4)), ref, key)
    assert not wrong["passed"] and wrong["error"] == np.inf and not wrong["shape_ok"] and wrong["top1_agree"] is None
    assert check(np.zeros((2, 4)), ref, key) == (False, np.inf) and parity_error(np.zeros((5, 2)), ref) == np.inf
    for bad in (np.nan, np.inf, -np.inf):
        out = ref.copy()
        out[0, 0] = bad
        c = compare(out, ref, key)
        assert not c["passed"] and c["error"] == np.inf and not c["finite"] and np.isnan(c["max_abs_err"])
        assert check(out, ref, key) == (False, np.inf)
    assert compare(np.full((2, 4), np.nan), ref, key)["finite"] is False


def test_top1_agreement_is_the_share_of_matching_argmax_along_the_classes():
    ref = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    out = ref.copy()
    out[0] = [1.0, 0.0, 0.0]  # one of four rows changes class
    assert compare(out, ref, "int8-static")["top1_agree"] == 0.75
    assert compare(ref[:, 0], ref[:, 0], "fp32")["top1_agree"] is None  # no class axis


def test_tolerance_keys_are_the_precisions_and_an_unknown_one_names_the_valid_ones():
    assert [tolerance_key(k) for k in KEYS] == KEYS
    with pytest.raises(ValueError, match=r"^unknown dtype 'fp8'; valid: fp32, tf32, fp16, bf16, int8$"):
        tolerance_key("fp8")
