"""Lesson 06 exercises: when compiling pays back, and feeding a fixed-shape graph."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..exercises import exercise


def _check_break_even(fn: Callable[[float, float, float], float]) -> None:
    assert fn(2.0, 3.0, 1.0) == 1000, "2 s of compile, 2 ms saved per call: 1000 calls (compile_s*1000 / saved_ms)"
    assert fn(1.0, 1.0, 1.5) == math.inf, "a compiled model that is slower per call never pays back: math.inf"
    assert fn(0.0, 2.0, 1.0) == 0, "no compile cost: pays back at once (0 calls)"
    assert fn(1.0, 4.0, 1.0) == 334, "round up: a fraction of a call is still a call (math.ceil)"


@exercise(
    "06.break-even",
    "break_even(compile_s, eager_ms, compiled_ms): calls until compile time is paid back (math.ceil), "
    "math.inf if the compiled model is not faster, 0 if compiling cost nothing.",
    _check_break_even,
)
def break_even(compile_s: float, eager_ms: float, compiled_ms: float) -> float:
    saved = eager_ms - compiled_ms
    if compile_s <= 0:
        return 0
    if saved <= 0:
        return math.inf
    return math.ceil(compile_s * 1000.0 / saved)


def _check_pad(fn: Callable[[torch.Tensor, int], tuple[torch.Tensor, int]]) -> None:
    x = torch.arange(6.0).reshape(3, 2)
    padded, n = fn(x, 8)
    assert padded.shape == (8, 2), f"pad the batch dimension to 8 rows, got {tuple(padded.shape)}"
    assert n == 3, "return how many rows are real (3), so the caller can slice the output"
    assert torch.equal(padded[:3], x), "the real rows must come first, unchanged"
    assert torch.count_nonzero(padded[3:]) == 0, "padding rows should be zeros"
    same, n2 = fn(torch.ones(8, 2), 8)
    assert same.shape == (8, 2) and n2 == 8, "a full batch needs no padding"
    try:
        fn(torch.ones(9, 2), 8)
    except ValueError:
        pass
    else:
        raise AssertionError("a batch larger than the captured size must raise ValueError (split it instead)")


@exercise(
    "06.pad-batch",
    "pad_batch(x, size): zero-pad x's batch dimension up to `size` (the batch a CUDA graph was captured for); "
    "return (padded, number of real rows); raise ValueError if x has more than `size` rows.",
    _check_pad,
)
def pad_batch(x: torch.Tensor, size: int) -> tuple[torch.Tensor, int]:
    n = x.shape[0]
    if n > size:
        raise ValueError(f"batch {n} > captured size {size}: split it into chunks of {size}")
    if n == size:
        return x, n
    pad = x.new_zeros((size - n, *x.shape[1:]))
    return torch.cat([x, pad]), n
