"""Lesson 14's stacking exercise rejects wrong answers: a technique left out, the wrong precision, NCHW inputs,
low-precision outputs, autograd left on, a changed model, or outputs that do not match."""

from __future__ import annotations

import copy

import pytest
import torch

from course_utils import exercises
from course_utils.lesson_exercises import l14


def _rejects(fn, match: str) -> None:
    with pytest.raises(AssertionError, match=match):
        exercises.get("14.stack").checker(fn)


def _variant(*, cl=True, amp=torch.bfloat16, out_float=True, inference=True, copy_model=True, scale=1.0):
    def stacked(model):
        m = copy.deepcopy(model) if copy_model else model
        m = m.to(memory_format=torch.channels_last) if cl else m

        def run(x):
            x = x.contiguous(memory_format=torch.channels_last) if cl else x
            ctx = torch.inference_mode() if inference else torch.enable_grad()
            with ctx, torch.autocast("cpu", dtype=amp, enabled=amp is not None):
                y = m(x) * scale
            return y.float() if out_float else y

        return run

    return stacked


def test_reference_passes():
    exercises.get("14.stack").checker(l14.stacked)


def test_no_autocast_is_rejected():
    _rejects(_variant(amp=None), "bfloat16")


def test_fp16_instead_of_bf16_is_rejected():
    _rejects(_variant(amp=torch.float16), "bfloat16")


def test_no_channels_last_is_rejected():
    _rejects(_variant(cl=False), "channels_last")


def test_bf16_outputs_are_rejected():
    _rejects(_variant(out_float=False), "float32")


def test_autograd_left_on_is_rejected():
    _rejects(_variant(inference=False), "inference_mode")


def test_wrong_outputs_are_rejected():
    _rejects(_variant(scale=1.5), "tolerance")


def test_half_model_instead_of_autocast_is_rejected():
    def halved(model):
        m = copy.deepcopy(model).to(torch.bfloat16)  # the whole model cast: converts every layer, not autocast

        def run(x):
            with torch.inference_mode():
                return m(x.to(torch.bfloat16)).float()

        return run

    _rejects(halved, "channels_last")


def test_changing_the_given_model_is_rejected():
    def in_place(model):
        model.to(torch.bfloat16)
        return _variant()(model)

    _rejects(in_place, "changed|bfloat16|tolerance|dtype")


def test_not_calling_the_model_is_rejected():
    _rejects(lambda model: lambda x: torch.zeros(len(x), 10), "no convolution")
