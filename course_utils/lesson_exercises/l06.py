"""Lesson 06 exercises: one graph for many batch sizes, when compiling pays back, padding to a captured shape."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..compare import compare_outputs
from ..compilation import count_compiles
from ..exercises import exercise

SIZES = (2, 3, 5, 8, 13)


def _check_mark_dynamic(fn: Callable[[Callable[..., torch.Tensor], list[torch.Tensor]], list[torch.Tensor]]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    batches = [torch.randn(s, 6) for s in SIZES]
    with torch.no_grad():
        refs = [model(b) for b in batches]
    graphs, outs = count_compiles(lambda compiled, xs: fn(compiled, [x.clone() for x in xs]), model, batches,
                                  dynamic=False)  # fmt: skip
    assert outs is not None and len(outs) == len(batches), f"return one output per batch ({len(batches)})"
    for out, ref, s in zip(outs, refs, SIZES, strict=True):
        assert isinstance(out, torch.Tensor) and out.shape == ref.shape, (
            f"batch of {s}: expected an output of shape {tuple(ref.shape)}, got "
            f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}"
        )
        cmp = compare_outputs(out, ref, "fp32")
        assert cmp.within, f"batch of {s}: output differs from eager: {cmp}"
    assert graphs >= 1, "the compiled model never ran: call compiled(x), not the eager model"
    assert graphs == 1, (
        f"{graphs} graphs were compiled for {len(SIZES)} batch sizes: mark the batch dimension dynamic before "
        "the first call (torch._dynamo.mark_dynamic(x, 0)) so one size-generic graph serves them all"
    )


@exercise(
    "06.mark-dynamic",
    "serve(compiled, batches): return compiled(x) for every batch while only ONE graph is compiled: "
    "mark dimension 0 of each input dynamic (torch._dynamo.mark_dynamic(x, 0)) before calling.",
    _check_mark_dynamic,
)
def serve(compiled: Callable[..., torch.Tensor], batches: list[torch.Tensor]) -> list[torch.Tensor]:
    outs = []
    for x in batches:
        torch._dynamo.mark_dynamic(x, 0)
        outs.append(compiled(x))
    return outs


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
