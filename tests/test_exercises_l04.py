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

from course_checks import exercises


def reason(key, fn):
    return exercises.verdict(key, fn)


SWEEP = range(200)


def amp_autocast(model, x):  # right too: torch.amp.autocast, positional arguments
    with torch.amp.autocast(x.device.type, torch.bfloat16):
        return model(x).float()


def to_float_after(model, x):  # right too: the output cast with .to(torch.float32)
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
        out = model(x)
    return out.to(torch.float32)


def test_references_pass():
    for key in ("04.bf16-autocast", "04.channels-last"):
        for seed in (1, 22):  # seed 22: near-tied logits once failed the reference on a top-1 criterion
            assert exercises.verdict(key, exercises.get(key).solution, seed=seed) == "accepted", key
    for fn in (amp_autocast, to_float_after):
        assert exercises.verdict("04.bf16-autocast", fn, seed=3) == "accepted", fn.__name__


def cpu_only(model, x):  # autocast hard-coded for the CPU: on a CUDA input it does nothing
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(x).float()


def _cases(seeds=SWEEP):
    """Per seed: the checker's model, input and reference outputs, drawn once for every answer judged on it."""
    from course_checks.lesson_exercises import l04
    from course_checks.lesson_exercises.observe import Cases

    for seed in seeds:
        model, x = l04._cnn(Cases(seed))
        yield seed, model, x, l04.references(model, x)


def _judge(fn, model, x, refs):
    """The judging core on the CPU (a fresh copy of the model per answer): None when accepted, else the reason."""
    from course_checks.lesson_exercises import l04

    try:
        l04._bf16_run(fn, copy.deepcopy(model), x.clone(), refs)
    except AssertionError as exc:
        return str(exc)
    return None


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


BF16_WRONG = [
    (plain_fp32, "BF16 autocast was not active"),
    (throwaway_then_fp32, "autocast around a throwaway call"),
    (first_layer_only, "autocast covered only part of the model"),
    (both_then_fp32, "the BF16 run was thrown away"),
    (cast_model, "that is a cast"),
    (cast_copy, "was cast to BF16"),
    (fp16, "float16"),
    (wrong_device, "BF16 autocast was not active"),
    (bf16_out, "return FP32"),
    (scaled, "differs from the BF16 autocast forward"),
    (decoy_conv, "autocast covered only part of the model"),
]


@pytest.mark.parametrize("wrong, message", BF16_WRONG)
def test_bf16_autocast_rejects(wrong, message):
    got = reason("04.bf16-autocast", wrong)
    assert message in got and "random case seed" in got, got


def test_bf16_every_answer_over_200_seeds():
    """The judging core (the full check adds the GPU run, tested below) over 200 seeds' models and inputs: the
    reference and the right alternatives accepted, each wrong answer rejected with its reason (seed 22 once failed
    the reference on a top-1 criterion over near-tied logits)."""
    ref = exercises.get("04.bf16-autocast").solution
    for seed, model, x, refs in _cases():
        for fn in (ref, amp_autocast, to_float_after):
            assert _judge(fn, model, x, refs) is None, (seed, fn.__name__)
        for fn, message in BF16_WRONG:
            got = _judge(fn, model, x, refs)
            assert got is not None and message in got, (seed, fn.__name__, got)


def test_a_hard_coded_cpu_autocast_is_seen_on_the_gpu_on_200_seeds():
    """The full check, whose GPU run (on the stand-in GPU here) catches autocast hard-coded to the CPU."""
    for seed in SWEEP:
        got = exercises.verdict("04.bf16-autocast", cpu_only, seed=seed)
        assert "torch.autocast('cpu') does nothing to cuda tensors" in got and f"seed {seed}" in got, (seed, got)


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
    for seed in SWEEP:
        got = exercises.verdict("04.channels-last", wrong, seed=seed)
        assert message in got, (seed, got)
    got = reason("04.channels-last", wrong)
    assert message in got and "random case seed" in got, got


def test_channels_last_reference_passes_on_200_seeds():
    ref = exercises.get("04.channels-last").solution
    bad = {s: v for s in SWEEP if (v := exercises.verdict("04.channels-last", ref, seed=s)) != "accepted"}
    assert not bad, bad
