"""memory.peak_vs_batch and grad_context pinned: the input's size is exact, the forward pass runs in the mode
asked for (inference_mode by default), and a measured peak is the extra memory, not the whole process."""

from __future__ import annotations

import sys

import pytest
import torch

from course_utils.measuring import memory

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc (Linux)")


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
