"""Lesson 04's exercise checkers reject wrong submissions (and accept the reference solutions)."""

from __future__ import annotations

import copy

import pytest
import torch

from course_utils import exercises


def _rejects(key, fn):
    with pytest.raises(AssertionError) as err:
        exercises.get(key).checker(fn)
    return str(err.value)


def test_references_pass():
    for key in ("04.bf16-autocast", "04.channels-last"):
        ex = exercises.get(key)
        ex.checker(ex.solution)


def test_autocast_rejects_plain_fp32():
    msg = _rejects("04.bf16-autocast", lambda model, x: model(x))
    assert "produced torch.float32" in msg


def test_autocast_rejects_a_cast_model():
    def cast(model, x):
        return model.to(torch.bfloat16)(x.to(torch.bfloat16)).float()

    assert "cast" in _rejects("04.bf16-autocast", cast)


def test_autocast_rejects_a_cast_copy_of_the_model():
    def cast_copy(model, x):  # weights untouched, but the copy runs a bf16 input: not autocast
        return copy.deepcopy(model).to(torch.bfloat16)(x.to(torch.bfloat16)).float()

    assert "let autocast cast it" in _rejects("04.bf16-autocast", cast_copy)


def test_autocast_rejects_fp16_and_wrong_device_type():
    def fp16(model, x):
        with torch.autocast("cpu", dtype=torch.float16):
            return model(x).float()

    def wrong_device(model, x):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):
            return model(x).float()

    assert "torch.float16" in _rejects("04.bf16-autocast", fp16)
    assert "produced torch.float32" in _rejects("04.bf16-autocast", wrong_device)


def test_autocast_rejects_bf16_output_and_bad_parity():
    def bf16_out(model, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x)

    def wrong(model, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x).float() * 1.5

    assert "return FP32" in _rejects("04.bf16-autocast", bf16_out)
    assert "tolerance" in _rejects("04.bf16-autocast", wrong)


def test_channels_last_rejects_missing_steps():
    assert "input is not channels_last" in _rejects(
        "04.channels-last", lambda m, x: (m.to(memory_format=torch.channels_last), x)
    )
    assert "conv weights" in _rejects("04.channels-last", lambda m, x: (m, x.to(memory_format=torch.channels_last)))
    assert "layout, not a precision" in _rejects(
        "04.channels-last",
        lambda m, x: (m.to(memory_format=torch.channels_last).half(), x.half().to(memory_format=torch.channels_last)),
    )
