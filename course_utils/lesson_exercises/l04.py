"""Lesson 04 exercises: FP16 overflow and top-1 agreement."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..exercises import exercise


def _check_overflow(fn: Callable[[torch.Tensor], bool]) -> None:
    assert fn(torch.tensor([1.0, 70000.0])) is True, "70000 is above FP16's max (65504): expected True"
    assert fn(torch.tensor([-1e6])) is True, "-1e6 overflows to -inf in FP16: expected True"
    assert fn(torch.tensor([1.0, -60000.0, 3.5])) is False, "every value fits in FP16: expected False"
    assert fn(torch.zeros(3)) is False, "zeros fit in FP16: expected False"


@exercise("04.overflow", "Return True when t.half() would contain an infinity.", _check_overflow)
def overflows_fp16(t: torch.Tensor) -> bool:
    return bool((t.float().abs() > torch.finfo(torch.float16).max).any())


def _check_agreement(fn: Callable[[torch.Tensor, torch.Tensor], float]) -> None:
    ref = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [0.0, 3.0]])
    out = torch.tensor([[0.9, 0.1], [0.8, 0.2], [2.0, 1.0], [0.0, 3.0]])
    got = fn(out, ref)
    assert abs(float(got) - 0.75) < 1e-6, f"3 of 4 rows agree: expected 0.75, got {got}"
    assert abs(float(fn(ref, ref)) - 1.0) < 1e-6, "a tensor agrees with itself: expected 1.0"


@exercise("04.agreement", "Return the fraction of rows whose argmax matches between out and ref.", _check_agreement)
def top1_agreement(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.argmax(-1) == ref.argmax(-1)).float().mean())
