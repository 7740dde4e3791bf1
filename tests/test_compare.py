import pytest
import torch

from course_utils import compare
from course_utils.errors import ToleranceError


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
    assert str(compare.compare_outputs(torch.ones(2, 2), torch.ones(2, 2)))
