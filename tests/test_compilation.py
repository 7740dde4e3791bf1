"""Unit tests for course_utils.techniques.compilation: break-even arithmetic and the compile counter."""

from __future__ import annotations

import math

import torch
from torch import nn

from course_utils.techniques import compilation as C


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()


def test_break_even():
    assert C.break_even_calls(1.0, eager_ms=2.0, compiled_ms=1.0) == 999
    assert C.break_even_calls(1.0, eager_ms=1.0, compiled_ms=2.0) == math.inf
    assert C.break_even_calls(0.0005, eager_ms=1.0, compiled_ms=0.5) == 0.0
    # 1000 - 0.7 = 999.3 ms extra, 1.3 ms saved per call: 768.7 calls, so the 769th call pays it back
    assert C.break_even_calls(1.0, eager_ms=2.0, compiled_ms=0.7) == 769


def test_break_even_when_compiling_costs_nothing_and_saves_nothing():
    # first call 2 ms = the compiled run itself: no extra time, so it has paid for itself at once
    assert C.break_even_calls(0.002, eager_ms=2.0, compiled_ms=2.0) == 0.0
    assert C.break_even_calls(0.002, eager_ms=1.0, compiled_ms=2.0) == 0.0
    assert C.break_even_calls(0.0021, eager_ms=2.0, compiled_ms=2.0) == math.inf  # 0.1 ms extra, nothing saved
    # extra = first call - compiled call (not - eager call): 100 - 1 = 99 ms over 2 ms saved per call
    assert C.break_even_calls(0.1, eager_ms=3.0, compiled_ms=1.0) == 50
