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
