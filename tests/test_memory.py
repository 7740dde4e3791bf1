"""Unit tests for course_utils.measuring.memory (CPU memory measurement for lesson 11).

memory.peak_vs_batch and grad_context pinned: the input's size is exact, the forward pass runs in the mode
asked for (inference_mode by default), and a measured peak is the extra memory, not the whole process."""

from __future__ import annotations

import sys

import pytest
import torch

from course_utils.measuring import memory

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")


def test_rss_and_peak_are_positive() -> None:
    assert memory.rss_mb() > 0
    assert memory.peak_rss_mb() >= memory.rss_mb() * 0.5


@linux
def test_cpu_peak_sees_a_large_tensor() -> None:
    n = 64 * 2**20 // 4  # 64 MiB of float32

    def work() -> float:
        t = torch.ones(n)
        return float(t[0])

    peak, out = memory.cpu_peak_mb(work)
    assert out == 1.0
    assert 48 <= peak <= 200, peak


def test_malloc_trim_returns_bool() -> None:
    assert isinstance(memory.malloc_trim(), bool)


@linux
def test_rss_follows_tensors_inside_the_block() -> None:
    n = 8 * 2**20 // 4  # 8 MiB blocks, below glibc's adaptive ceiling: kept on the heap unless the block is active
    with memory.rss_follows_tensors() as ok:
        assert ok is True
        peak, _ = memory.cpu_peak_mb(lambda: torch.ones(n).sum())
        assert peak >= 6


def test_grad_context_modes() -> None:
    w = torch.ones(2, requires_grad=True)
    with memory.grad_context("grad"):
        assert (w * 2).requires_grad
    with memory.grad_context("no_grad"):
        assert not (w * 2).requires_grad
    with memory.grad_context("inference_mode"):
        assert torch.is_inference_mode_enabled()
    with pytest.raises(ValueError):
        memory.grad_context("eval")


@linux
def test_peak_vs_batch_grows_with_batch() -> None:
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(3)])
    df = memory.peak_vs_batch(model, lambda b: torch.randn(b, 512), [64, 4096], mode="grad")
    assert list(df.columns) == ["batch_size", "peak_mb", "input_mb"]
    assert df["peak_mb"].iloc[1] > df["peak_mb"].iloc[0]


class Spy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(512, 512)
        self.seen: list[tuple[bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        return self.lin(x)


@linux
@pytest.mark.parametrize(
    "mode, want",
    [(None, (True, False)), ("inference_mode", (True, False)), ("no_grad", (False, False)), ("grad", (False, True))],
)
def test_peak_vs_batch_runs_in_the_mode_asked_for(mode, want):
    model = Spy()
    kwargs = {} if mode is None else {"mode": mode}
    df = memory.peak_vs_batch(model, lambda b: torch.zeros(b, 512), [64, 128], **kwargs)
    assert model.seen == [want, want]
    assert list(df["batch_size"]) == [64, 128]
    assert list(df["input_mb"]) == [0.125, 0.25], "64 x 512 float32 is exactly 0.125 MiB"
    assert (df["peak_mb"] >= 0).all()


@linux
def test_cpu_peak_is_the_extra_memory_of_the_call():
    peak, out = memory.cpu_peak_mb(lambda: 7)
    assert out == 7 and peak < 16, f"{peak:.1f} MiB for a call that allocates nothing: subtract the RSS before it"


def test_l11_batch_peak_includes_the_input_batch() -> None:
    """Lesson 11's 11.max-batch measures a batch's peak with its input: made inside the measured call (a GPU
    stand-in counts MiB). The input made before the call would leave its 40 MiB out of the budget check."""
    from tests.gpu_contract.test_l11_memory import FakeCuda, namespace

    cuda = FakeCuda()
    cuda.alloc(100)  # the model's weights, there before
    ns = namespace(cuda)
    seen = []

    def make_input(b):
        cuda.alloc(10 * b)  # 10 MiB per image
        return b

    def model(x):
        seen.append(torch.is_inference_mode_enabled())
        cuda.alloc(30)  # activations
        cuda.free(30)

    assert ns["batch_peak_mb"](model, make_input, 4) == pytest.approx(70.0)
    assert seen == [True], "the forward runs under inference_mode"
    # the planted mistake: the batch made before the measured call; its 40 MiB drop out of the peak
    planted = namespace(
        FakeCuda(), ("    def run():\n        x = make_input(b)\n", "    x = make_input(b)\n\n    def run():\n")
    )
    cuda.allocated, cuda.peak = 100 * 2**20, 100 * 2**20
    planted["torch"].cuda = cuda
    assert planted["batch_peak_mb"](model, make_input, 4) == pytest.approx(30.0)
