"""Unit tests for course_utils.techniques.precision: weight bytes, the per-layer dtype recorder, the layout test."""

from __future__ import annotations

import torch
from torch import nn

from course_utils.techniques import precision as prec


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10)).eval()


def test_param_bytes_halves_on_cast():
    model = small_cnn()
    fp32 = prec.param_bytes(model)
    assert fp32 == sum(p.numel() * 4 for p in model.parameters())
    assert prec.param_bytes(model.to(torch.bfloat16)) * 2 == fp32


def test_param_bytes_counts_buffers():
    bn = nn.BatchNorm2d(4)  # weight and bias (parameters), running mean and var and the int64 batch counter (buffers)
    assert prec.param_bytes(bn) == 4 * 4 * 4 + 8


def test_is_channels_last():
    x = torch.rand(2, 3, 4, 4)
    assert not prec.is_channels_last(x)
    assert prec.is_channels_last(x.to(memory_format=torch.channels_last))
    assert not prec.is_channels_last(torch.rand(3, 4))


def test_a_tensor_contiguous_in_both_layouts_is_not_called_channels_last():
    one_channel = torch.rand(2, 1, 4, 4)  # NCHW and NHWC strides coincide
    pixel = torch.rand(2, 3, 1, 1)
    assert one_channel.is_contiguous(memory_format=torch.channels_last) and one_channel.is_contiguous()
    assert not prec.is_channels_last(one_channel)
    assert not prec.is_channels_last(pixel)
    assert prec.is_channels_last(torch.rand(2, 2, 4, 4).to(memory_format=torch.channels_last))
