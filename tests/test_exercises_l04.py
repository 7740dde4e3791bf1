"""Lesson 04's exercise checkers reject wrong submissions (and accept the reference solutions).

04.bf16-autocast is judged on the operators that ran (observe.OpLog): the dtype of every convolution and matmul
on the real input and the weights they read, so autocast on a throwaway input or on part of the model fails.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.check import exercises


def reason(key, fn):
    return exercises.verdict(key, fn)


def test_references_pass():
    for key in ("04.bf16-autocast", "04.channels-last"):
        assert reason(key, exercises.get(key).solution) == "accepted", key


# ---- 04.bf16-autocast: plausible wrong submissions ---------------------------------------------------------
def plain_fp32(model, x):
    return model(x)


def throwaway_then_fp32(model, x):  # autocast around model(x[:1]), then the FP32 answer
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
        model(x[:1])
    return model(x)


def first_layer_only(model, x):
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
        h = model[0](x)
    for layer in list(model)[1:]:
        h = layer(h.float())
    return h


def both_then_fp32(model, x):  # the BF16 run on the real input, but the FP32 output returned
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
        model(x)
    return model(x)


def cast_model(model, x):
    return model.to(torch.bfloat16)(x.to(torch.bfloat16)).float()


def cast_copy(model, x):  # weights untouched, but a BF16 copy runs: not autocast, and not the model's weights
    return copy.deepcopy(model).to(torch.bfloat16)(x.to(torch.bfloat16)).float()


def fp16(model, x):
    with torch.autocast("cpu", dtype=torch.float16):
        return model(x).float()


def wrong_device(model, x):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):
        return model(x).float()


def bf16_out(model, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(x)


def scaled(model, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(x).float() * 1.5


def decoy_conv(model, x):  # F.conv2d with a decoy weight under autocast, then the FP32 model
    with torch.autocast("cpu", dtype=torch.bfloat16):
        conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
        F.conv2d(x, conv.weight.detach().clone(), padding=1)
    return model(x)


def left_on(model, x):
    torch.autocast("cpu", dtype=torch.bfloat16).__enter__()
    return model(x).float()


@pytest.mark.parametrize(
    "wrong, message",
    [
        (plain_fp32, "BF16 autocast was not active"),
        (throwaway_then_fp32, "autocast around a throwaway call"),
        (first_layer_only, "autocast covered only part of the model"),
        (both_then_fp32, "the BF16 run was thrown away"),
        (cast_model, "that is a cast"),
        (cast_copy, "is not autocast"),
        (fp16, "float16"),
        (wrong_device, "BF16 autocast was not active"),
        (bf16_out, "return FP32"),
        (scaled, "differs from the BF16 autocast forward"),
        (decoy_conv, "autocast covered only part of the model"),
    ],
)
def test_bf16_autocast_rejects(wrong, message):
    got = reason("04.bf16-autocast", wrong)
    assert message in got and "random case seed" in got, got


def test_autocast_left_on_is_rejected():
    try:
        assert "still on" in reason("04.bf16-autocast", left_on)
    finally:
        while torch.is_autocast_enabled("cpu"):
            torch.autocast("cpu", dtype=torch.bfloat16).__exit__(None, None, None)
        torch.set_autocast_enabled("cpu", False)


# ---- 04.channels-last -------------------------------------------------------------------------------------
def input_only(m, x):
    return m, x.to(memory_format=torch.channels_last)


def model_only(m, x):
    return m.to(memory_format=torch.channels_last), x


def half_too(m, x):
    return m.to(memory_format=torch.channels_last).half(), x.half().to(memory_format=torch.channels_last)


def first_conv_only(m, x):
    m[0].to(memory_format=torch.channels_last)
    return m, x.to(memory_format=torch.channels_last)


def fresh_model(m, x):  # a new model of the same shape: other weights
    new = copy.deepcopy(m)
    for p in new.parameters():
        torch.nn.init.normal_(p)
    return new.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)


class BackToNCHW(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        h = x
        for layer in self.inner:
            h = layer(h.contiguous())
        return h


def undone_inside(m, x):
    return BackToNCHW(m.to(memory_format=torch.channels_last)), x.to(memory_format=torch.channels_last)


def contiguous_after(m, x):
    return m.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last).contiguous()


@pytest.mark.parametrize(
    "wrong, message",
    [
        (input_only, "conv weights are not channels_last"),
        (model_only, "input is not channels_last"),
        (half_too, "layout, not a precision"),
        (first_conv_only, "conv weights are not channels_last"),
        (fresh_model, "same weights, same input"),
        (undone_inside, "received a tensor in the NCHW layout"),
        (contiguous_after, "input is not channels_last"),
    ],
)
def test_channels_last_rejects(wrong, message):
    got = reason("04.channels-last", wrong)
    assert message in got and "random case seed" in got, got
