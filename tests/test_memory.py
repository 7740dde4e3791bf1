"""Unit tests for course_utils.memory (CPU parts; GPU helpers must refuse clearly without CUDA)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from course_utils import memory as mem
from course_utils.errors import DeviceUnavailableError

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")


def test_rss_and_peak_are_positive() -> None:
    assert mem.rss_mb() > 0
    assert mem.peak_rss_mb() >= mem.rss_mb() * 0.5


@linux
def test_cpu_peak_sees_a_large_tensor() -> None:
    n = 64 * 2**20 // 4  # 64 MiB of float32

    def work() -> float:
        t = torch.ones(n)
        return float(t[0])

    peak, out = mem.cpu_peak_mb(work)
    assert out == 1.0
    assert 48 <= peak <= 200, peak


def test_tracemalloc_sees_numpy_not_torch() -> None:
    n = 8 * 2**20 // 4
    np_peak, _ = mem.tracemalloc_peak_mb(lambda: np.ones(n, dtype=np.float32).sum())
    torch_peak, _ = mem.tracemalloc_peak_mb(lambda: torch.ones(n).sum())
    assert np_peak >= 7.5
    assert torch_peak < 1.0


def test_malloc_helpers_return_bool() -> None:
    assert isinstance(mem.malloc_trim(), bool)
    assert isinstance(mem.mmap_large_blocks(), bool)


def test_grad_context_modes() -> None:
    w = torch.ones(2, requires_grad=True)
    with mem.grad_context("grad"):
        assert (w * 2).requires_grad
    with mem.grad_context("no_grad"):
        assert not (w * 2).requires_grad
    with mem.grad_context("inference_mode"):
        assert torch.is_inference_mode_enabled()
    with pytest.raises(ValueError):
        mem.grad_context("eval")


@linux
def test_peak_vs_batch_grows_with_batch() -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(3)])
    df = mem.peak_vs_batch(model, lambda b: torch.randn(b, 512), [64, 4096], mode="grad")
    assert list(df.columns) == ["batch_size", "peak_mb", "input_mb"]
    assert df["peak_mb"].iloc[1] > df["peak_mb"].iloc[0]


def test_static_runner_reuses_buffers() -> None:
    model = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    runner = mem.StaticRunner(model, x)
    out = runner(x)
    ptr_in, ptr_out = runner.input.data_ptr(), out.data_ptr()
    with torch.no_grad():
        assert torch.allclose(out, model(x))
    y = torch.randn(2, 4)
    out2 = runner(y)
    assert out2.data_ptr() == ptr_out and runner.input.data_ptr() == ptr_in
    with torch.no_grad():
        assert torch.allclose(out, model(y))  # the earlier result was overwritten
    with pytest.raises(ValueError, match="StaticRunner"):
        runner(torch.randn(3, 4))


@no_cuda
def test_gpu_helpers_refuse_without_cuda() -> None:
    with pytest.raises(DeviceUnavailableError):
        mem.gpu_memory_mb()
    with pytest.raises(DeviceUnavailableError):
        mem.gpu_peak_mb(lambda: None)
