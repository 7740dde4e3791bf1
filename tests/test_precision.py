"""Unit tests for course_utils.precision: variants, their outputs, and the FP16 overflow case."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_utils import precision as prec
from course_utils.errors import CourseError


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10)).eval()


def test_variants_return_fp32_close_to_baseline():
    model, x = small_cnn(), torch.rand(5, 1, 8, 8)
    variants = prec.standard_variants(model)
    names = [v.name for v in variants]
    assert names[:2] == ["fp32", "fp32 + channels_last"] and "bf16 cast" in names and "fp16 autocast" in names
    ref = variants[0].run(x)
    for v in variants:
        out = v.run(x)
        assert out.dtype == torch.float32 and out.shape == ref.shape
        assert torch.allclose(out, ref, rtol=0.05, atol=0.05), v.name


def test_cast_halves_weight_memory_autocast_does_not():
    model = small_cnn()
    fp32 = prec.make_variant(model, "fp32").weight_bytes
    assert prec.make_variant(model, "bf16", method="cast").weight_bytes * 2 == fp32
    assert prec.make_variant(model, "bf16", method="autocast").weight_bytes == fp32
    assert prec.param_bytes(model) == fp32


def test_original_model_untouched():
    model = small_cnn()
    prec.make_variant(model, "fp16", method="cast", channels_last=True)
    assert next(model.parameters()).dtype == torch.float32


def test_bad_arguments_raise():
    with pytest.raises(CourseError):
        prec.make_variant(small_cnn(), "int3")
    with pytest.raises(CourseError):
        prec.make_variant(small_cnn(), "bf16", method="magic")
    with pytest.raises(CourseError):
        prec.fp16_overflow_case(scale=-1)


def test_fp16_overflows_bf16_does_not():
    layer, x = prec.fp16_overflow_case()
    table = prec.overflow_table(layer, x).set_index("variant")
    assert table.loc["fp32", "finite"] and table.loc["bf16 cast", "finite"] and table.loc["bf16 autocast", "finite"]
    assert not table.loc["fp16 cast", "finite"] and not table.loc["fp16 autocast", "finite"]
    assert table.loc["fp32", "max_abs_output"] > prec.fp16_max() == 65504.0
    assert table.loc["bf16 cast", "max rel error"] < 0.01
