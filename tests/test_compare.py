import pytest
import torch

from course_utils.check import compare
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
