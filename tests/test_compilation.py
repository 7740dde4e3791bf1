"""Unit tests for course_utils.compilation (CPU only; the CUDA graph runner is checked for its CPU error)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from course_utils import compilation as C
from course_utils.errors import DeviceUnavailableError


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()


def test_break_even():
    assert C.break_even_calls(1.0, eager_ms=2.0, compiled_ms=1.0) == 999
    assert C.break_even_calls(1.0, eager_ms=1.0, compiled_ms=2.0) == math.inf
    assert C.break_even_calls(0.0005, eager_ms=1.0, compiled_ms=0.5) == 0.0
    cost = C.CompileCost("x", 1.0, steady_ms=1.0, eager_ms=2.0)
    assert cost.speedup == 2.0 and cost.break_even == 999 and cost.as_dict()["break_even_calls"] == 999


def test_count_compiles_static_vs_dynamic():
    model = _mlp()
    inputs = C.shapes_for([2, 3, 5, 7], (4,))
    static = C.count_compiles(model, inputs, dynamic=False)
    dynamic = C.count_compiles(model, inputs, dynamic=True)
    marked = C.count_compiles(model, inputs, mark_dynamic_dim=0)
    assert static == 4 and dynamic == 1 and marked == 1


def test_compile_cost_with_cheap_backend():
    model = _mlp()
    x = torch.randn(3, 4)
    fn, cost, m = C.compile_cost(
        lambda: torch.compile(model, backend="eager"), x, eager_ms=1.0, label="eager-backend",
        warmup=1, min_time_s=0.01, min_repeats=3,
    )  # fmt: skip
    assert cost.first_call_s > 0 and cost.steady_ms > 0 and m.n >= 3
    torch.testing.assert_close(fn(x), model(x))


def test_torchscript_warns_deprecated():
    model = _mlp()
    mod, msgs = C.torchscript(model, torch.randn(2, 4), "trace")
    torch.testing.assert_close(mod(torch.ones(2, 4)), model(torch.ones(2, 4)))
    assert any("deprecated" in m for m in msgs)
    with pytest.raises(ValueError):
        C.torchscript(model, torch.randn(2, 4), "freeze")


def test_freezing_context_restores():
    import torch._inductor.config as cfg

    before = cfg.freezing
    with C.inductor_freezing(True):
        assert cfg.freezing is True
    assert cfg.freezing == before


def test_cuda_graph_runner_needs_cuda():
    if torch.cuda.is_available():
        model = _mlp().cuda()
        runner = C.CudaGraphRunner(model, torch.randn(3, 4, device="cuda"))
        a = runner(torch.ones(3, 4, device="cuda"))
        keep = a.clone()
        b = runner(torch.zeros(3, 4, device="cuda"))
        assert a.data_ptr() == b.data_ptr() and not torch.equal(keep, b)
        with pytest.raises(C.StaticShapeError):
            runner(torch.ones(2, 4, device="cuda"))
    else:
        with pytest.raises(DeviceUnavailableError):
            C.CudaGraphRunner(_mlp(), torch.randn(3, 4))
