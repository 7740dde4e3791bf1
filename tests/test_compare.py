"""compare.compare_outputs and check_outputs: identical outputs pass, each precision is judged by its own tolerance,
and shape mismatches, unknown precisions and non-finite values fail with a reason.

compare.compare_outputs pinned: the tolerance values themselves, a case just inside and just outside each
bound, and relative error taken on magnitudes (abs) of both the difference and the baseline."""

from __future__ import annotations

import pytest
import torch

from course_utils.measuring import outputs as compare
from course_utils.supply.errors import ToleranceError


def test_identical_outputs_pass():
    x = torch.randn(16, 10)
    r = compare.compare_outputs(x, x.clone(), "fp32")
    assert r.within and r.max_abs == 0 and r.top1 == 1.0 and r.cosine == pytest.approx(1.0)


def test_half_precision_error_judged_by_its_tolerance():
    torch.manual_seed(0)
    x = torch.randn(64, 10)
    half = x.half().float()
    assert compare.compare_outputs(half, x, "fp16").within
    assert not compare.compare_outputs(x + 0.5, x, "fp32").within


def test_check_outputs_raises_with_reason():
    x = torch.randn(8, 10)
    with pytest.raises(ToleranceError, match="fp32 tolerance"):
        compare.check_outputs(-x, x, "fp32", label="flipped")


def test_shape_mismatch_and_unknown_precision():
    with pytest.raises(ToleranceError, match="shape mismatch"):
        compare.compare_outputs(torch.zeros(2, 3), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="unknown precision"):
        compare.compare_outputs(torch.zeros(2), torch.zeros(2), "int3")


def test_non_finite_fails():
    x = torch.ones(4, 3)
    y = x.clone()
    y[0, 0] = float("inf")
    r = compare.compare_outputs(y, x, "fp16")
    assert not r.within and "non-finite" in r.reason


def test_tolerance_table_has_every_precision():
    t = compare.tolerance_table()
    assert set(t.index) == {"fp32", "tf32", "bf16", "fp16", "int8"}
    assert t.loc["fp32", "max_rel"] == 1e-4 and t.loc["int8", "cosine"] == 0.99
    text = str(compare.compare_outputs(torch.ones(2, 2), torch.ones(2, 2)))
    assert text == "[fp32] max abs 0, max rel 0, cosine 1.000000, top-1 agreement 100.00%: OK", text
    bad = str(compare.compare_outputs(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])))
    assert bad.endswith("OUTSIDE tolerance (max rel 1 > 0.0001; cosine 0.000000 < 0.99999; top-1 0.00% < 100%)"), bad


def test_tolerance_values_are_the_documented_ones():
    assert compare.TOLERANCES == {
        "fp32": {"max_rel": 1e-4, "cosine": 0.99999, "top1": 0.999},
        "tf32": {"max_rel": 1e-2, "cosine": 0.9999, "top1": 0.99},
        "bf16": {"max_rel": 5e-2, "cosine": 0.999, "top1": 0.97},
        "fp16": {"max_rel": 1e-2, "cosine": 0.9995, "top1": 0.98},
        "int8": {"max_rel": 1.5e-1, "cosine": 0.99, "top1": 0.95},
    }


def _ref() -> torch.Tensor:
    torch.manual_seed(0)
    r = torch.randn(64, 10)
    r[0, 0] = 10.0  # the largest magnitude: the scale of the relative error
    return r


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16", "int8"])
def test_max_rel_just_inside_and_just_outside(precision):
    ref = _ref()
    tol = compare.TOLERANCES[precision]["max_rel"]
    inside, outside = ref.clone(), ref.clone()
    inside[5, 3] += 0.9 * tol * 10.0  # one element off by 0.9 x the tolerance (relative to the scale 10)
    outside[5, 3] += 1.1 * tol * 10.0
    r_in = compare.compare_outputs(inside, ref, precision)
    r_out = compare.compare_outputs(outside, ref, precision)
    assert r_in.max_rel == pytest.approx(0.9 * tol, rel=1e-3) and r_out.max_rel == pytest.approx(1.1 * tol, rel=1e-3)
    assert r_in.max_abs == pytest.approx(0.9 * tol * 10.0, rel=1e-3)
    assert r_in.within, f"{precision}: max rel {r_in.max_rel:.3g} is inside {tol}: {r_in.reason}"
    assert not r_out.within and r_out.reason.startswith(f"max rel {r_out.max_rel:.3g} > {tol}"), r_out.reason


def test_relative_error_uses_magnitudes():
    ref = torch.tensor([[-10.0, 1.0, 0.5, 0.25]])  # largest magnitude is negative
    out = ref.clone()
    out[0, 1] += 5e-4  # abs error 5e-4 on scale 10: 5e-5, inside fp32's 1e-4
    r = compare.compare_outputs(out, ref, "fp32")
    assert r.max_rel == pytest.approx(5e-5, rel=1e-3) and r.within, r
    low = ref.clone()
    low[0, 1] -= 2e-3  # an output BELOW the baseline is as wrong as one above it
    r = compare.compare_outputs(low, ref, "fp32")
    assert r.max_abs == pytest.approx(2e-3, rel=1e-3) and r.max_rel == pytest.approx(2e-4, rel=1e-3)
    assert not r.within


def test_cosine_bound_just_inside_and_outside():
    torch.manual_seed(1)
    ref = torch.randn(4096)
    noise = torch.randn(4096)
    noise = noise - (noise @ ref) / (ref @ ref) * ref  # orthogonal to ref
    noise = noise / noise.norm() * ref.norm()

    def at(cos: float) -> torch.Tensor:
        s = (1 / cos**2 - 1) ** 0.5  # out = ref + s * noise has cosine 1/sqrt(1 + s^2) with ref
        return ref + s * noise

    bound = compare.TOLERANCES["int8"]["cosine"]
    r_in, r_out = compare.compare_outputs(at(0.995), ref, "int8"), compare.compare_outputs(at(0.985), ref, "int8")
    assert r_in.cosine == pytest.approx(0.995, abs=1e-6) and r_out.cosine == pytest.approx(0.985, abs=1e-6)
    assert "cosine" not in r_in.reason
    assert f"cosine {r_out.cosine:.6f} < {bound}" in r_out.reason


def test_top1_agreement_counts_rows():
    ref = torch.eye(10) * 5.0  # row i's top class is i
    out = ref.clone()
    out[3] = torch.zeros(10)
    out[3, 4] = 5.0  # one row of ten predicts another class
    r = compare.compare_outputs(out, ref, "int8")
    assert r.top1 == pytest.approx(0.9)
    assert not r.within and "top-1 90.00% < 95%" in r.reason, r.reason
    ok = ref + 0.01 * torch.randn(10, 10, generator=torch.Generator().manual_seed(0))
    assert compare.compare_outputs(ok, ref, "int8").top1 == 1.0
    assert compare.compare_outputs(ref.flatten(), ref.flatten()).top1 is None, "top-1 only for 2-D class scores"


def test_check_outputs_raises_only_outside(capsys):
    ref = _ref()
    ok = ref.clone()
    ok[1, 1] += 5e-4  # 5e-5 relative
    assert compare.check_outputs(ok, ref, "fp32", label="v").within
    assert capsys.readouterr().out.startswith("v: [fp32] max abs")
    bad = ref.clone()
    bad[1, 1] += 2e-3  # 2e-4 relative
    with pytest.raises(ToleranceError, match="beyond the fp32 tolerance: max rel"):
        compare.check_outputs(bad, ref, "fp32", label="v")
