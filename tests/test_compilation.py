"""Unit tests for course_utils.compilation: break-even arithmetic and the compile counter."""

from __future__ import annotations

import math

import torch
from torch import nn

from course_utils import compilation as C


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()


def test_break_even():
    assert C.break_even_calls(1.0, eager_ms=2.0, compiled_ms=1.0) == 999
    assert C.break_even_calls(1.0, eager_ms=1.0, compiled_ms=2.0) == math.inf
    assert C.break_even_calls(0.0005, eager_ms=1.0, compiled_ms=0.5) == 0.0


def test_count_compiles_static_vs_dynamic():
    model = _mlp()
    inputs = [torch.randn(b, 4) for b in (2, 3, 5, 7)]

    def loop(compiled, xs):
        return [compiled(x) for x in xs]

    def marked(compiled, xs):
        out = []
        for x in xs:
            x = x.clone()
            torch._dynamo.mark_dynamic(x, 0)
            out.append(compiled(x))
        return out

    static, outs = C.count_compiles(loop, model, inputs, dynamic=False)
    assert static == 4 and len(outs) == 4
    torch.testing.assert_close(outs[1], model(inputs[1]))
    assert C.count_compiles(loop, model, inputs, dynamic=True)[0] == 1
    assert C.count_compiles(marked, model, inputs, dynamic=False)[0] == 1
    assert C.count_compiles(loop, model, inputs)[0] == 2  # default: one recompile, then a dynamic graph
