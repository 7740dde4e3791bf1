"""Unit tests for course_utils.precision: weight bytes, the per-layer dtype recorder, the layout test."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_utils import precision as prec
from course_utils.errors import CourseError


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10)).eval()


def test_param_bytes_halves_on_cast():
    model = small_cnn()
    fp32 = prec.param_bytes(model)
    assert fp32 == sum(p.numel() * 4 for p in model.parameters())
    assert prec.param_bytes(model.to(torch.bfloat16)) * 2 == fp32


def test_layer_dtypes_sees_autocast_inside_and_removes_hooks():
    model, x = small_cnn(), torch.rand(2, 3, 8, 8)

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x)

    seen = prec.layer_dtypes(model, run)
    assert [s[0] for s in seen] == ["0", "3"]
    assert seen[0][1:] == (torch.float32, torch.bfloat16) and seen[1][2] == torch.bfloat16
    assert all(not m._forward_hooks for m in model.modules())
    assert prec.layer_dtypes(model, lambda: model(x))[0][2] == torch.float32
    with pytest.raises(CourseError):
        prec.layer_dtypes(nn.ReLU(), lambda: None)


def test_hooks_removed_when_run_fails():
    model = small_cnn()
    with pytest.raises(RuntimeError):
        prec.layer_dtypes(model, lambda: model(torch.rand(2, 5, 8, 8)))
    assert all(not m._forward_hooks for m in model.modules())


def test_is_channels_last():
    x = torch.rand(2, 3, 4, 4)
    assert not prec.is_channels_last(x)
    assert prec.is_channels_last(x.to(memory_format=torch.channels_last))
    assert not prec.is_channels_last(torch.rand(3, 4))
