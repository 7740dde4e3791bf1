"""Lesson 11 exercises: the largest batch under a memory budget; filling a static buffer in place."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..exercises import exercise


def _check_max_batch(fn: Callable[[float, float, float], int]) -> None:
    cases = [((10.0, 100.0, 1000.0), 90), ((10.0, 100.0, 105.0), 0), ((2.5, 0.0, 10.0), 4), ((3.0, 1.0, 10.0), 3)]
    for args, want in cases:
        got = fn(*args)
        assert got == want, (
            f"per_image={args[0]}, fixed={args[1]}, budget={args[2]}: expected {want}, got {got}. "
            "Hint: floor((budget - fixed) / per_image), never below 0"
        )
        assert isinstance(got, int), "return an int (a batch size)"


@exercise("11.max-batch", "Return max(0, floor((budget - fixed) / per_image)) as an int.", _check_max_batch)
def max_batch(per_image_mb: float, fixed_mb: float, budget_mb: float) -> int:
    return max(0, int((budget_mb - fixed_mb) // per_image_mb))


def _check_fill(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    buf = torch.zeros(2, 3)
    ptr = buf.data_ptr()
    batch = torch.arange(6.0).reshape(2, 3)
    out = fn(buf, batch)
    assert out is buf or out.data_ptr() == ptr, "return the buffer itself, not a new tensor"
    assert buf.data_ptr() == ptr, "the buffer's storage changed: write into it with buffer.copy_(batch)"
    assert torch.equal(buf, batch), "the buffer does not hold the batch after the call"
    try:
        fn(buf, torch.zeros(3, 3))
    except ValueError:
        pass
    else:
        raise AssertionError("a batch of the wrong shape must raise ValueError (check batch.shape == buffer.shape)")


@exercise("11.fill-static", "Check the shape (ValueError), then buffer.copy_(batch) and return buffer.", _check_fill)
def fill_static(buffer: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    if batch.shape != buffer.shape:
        raise ValueError(f"batch shape {tuple(batch.shape)} != buffer shape {tuple(buffer.shape)}: pad or re-allocate")
    return buffer.copy_(batch)
