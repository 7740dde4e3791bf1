"""Lesson 02 exercises: remove per-item operator calls found by the profiler."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from ..exercises import exercise


def _op_calls(fn: Callable[[], object]) -> int:
    """Operator calls made by one call of ``fn`` (CPU activity only, no trace written)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages())


def _images(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 17, size=(8, 8), dtype=np.uint8) for _ in range(n)]


def _check_vectorize(fn: Callable[[list[np.ndarray]], torch.Tensor]) -> None:
    imgs = _images(16, 0)
    out = fn(imgs)
    assert isinstance(out, torch.Tensor), "return a torch.Tensor"
    assert tuple(out.shape) == (16, 1, 8, 8), f"expected shape (16, 1, 8, 8), got {tuple(out.shape)}"
    assert out.dtype == torch.float32, f"expected float32, got {out.dtype}"
    expected = torch.from_numpy(np.stack(imgs).astype(np.float32) / 16.0).unsqueeze(1)
    assert torch.allclose(out, expected, atol=1e-6), "values differ: divide the 0-16 pixel values by 16"
    small, large = _op_calls(lambda: fn(_images(8, 1))), _op_calls(lambda: fn(_images(64, 2)))
    assert large <= small, (
        f"{small} operator calls for 8 images but {large} for 64: something still runs once per image "
        "(stack the images with numpy first, then convert once)"
    )


@exercise(
    "02.vectorize",
    "Turn a list of uint8 8x8 images into a (N, 1, 8, 8) float tensor in [0, 1] with a fixed number of ops.",
    _check_vectorize,
)
def preprocess_vectorized(images: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(images)).float().div_(16.0).unsqueeze(1)


def _reference_post(logits: torch.Tensor) -> list[tuple[int, float]]:
    probs = torch.softmax(logits, dim=1)
    return [(int(p.argmax()), float(p.max())) for p in probs]


def _check_one_sync(fn: Callable[[torch.Tensor], list]) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 10, generator=gen) * 3
    out = fn(logits)
    assert isinstance(out, list) and len(out) == 32, "return a list with one (label, confidence) per row"
    for (lab, conf), (rlab, rconf) in zip(out, _reference_post(logits), strict=True):
        assert int(lab) == rlab, "labels differ: the label is the argmax of the softmax (or of the logits)"
        assert abs(float(conf) - rconf) < 1e-5, "confidences differ: use the softmax probability of the label"
    small = _op_calls(lambda: fn(torch.randn(8, 10, generator=gen)))
    large = _op_calls(lambda: fn(torch.randn(128, 10, generator=gen)))
    assert large <= small, (
        f"{small} operator calls for 8 rows but {large} for 128: a per-row op (.item(), indexing) is left; "
        "compute softmax and max over dim=1 for the whole batch and copy back once with .tolist()"
    )


@exercise(
    "02.one-sync",
    "Return [(label, confidence), ...] for a batch of logits with one copy back, no per-row .item().",
    _check_one_sync,
)
def postprocess_batched(logits: torch.Tensor) -> list[tuple[int, float]]:
    conf, label = torch.softmax(logits, dim=1).max(dim=1)
    return list(zip(label.cpu().tolist(), conf.cpu().tolist(), strict=True))


def _workloads() -> list[tuple[Callable[[], None], str]]:
    """Hidden workloads and the operator with the most self CPU time in each (inputs made outside the profile)."""
    a, small = torch.full((384, 384), 0.5), torch.ones(8)
    x, m, out = torch.ones(50_000), torch.full((16, 16), 0.5), torch.empty(50_000)
    b = torch.full((128, 128), 0.5)

    def mm_heavy() -> None:
        for _ in range(20):
            small.add(1.0)
        for _ in range(6):
            a @ a

    def add_heavy() -> None:
        m @ m
        for _ in range(400):
            torch.add(x, x, out=out)

    def python_heavy() -> None:
        with torch.profiler.record_function("python loop"):
            sum(i * i for i in range(300_000))  # pure Python: time in the range, in no operator
            b @ b

    return [(mm_heavy, "aten::mm"), (add_heavy, "aten::add"), (python_heavy, "aten::mm")]


def _check_top_op(fn: Callable[[Callable[[], object]], str]) -> None:
    for work, want in _workloads():
        got = fn(work)
        assert isinstance(got, str), f"return the operator's name as a string (got {type(got).__name__})"
        if got == "python loop":
            raise AssertionError(
                "'python loop' is a record_function range, not an operator: its self time is Python time between "
                "operators. Skip ranges (event.is_user_annotation) and ProfilerStep rows"
            )
        if got in ("aten::matmul", "aten::linear") and want == "aten::mm":
            raise AssertionError(f"'{got}' has the most *total* CPU time (its child aten::mm does the work): "
                                 "sort by self_cpu_time_total")  # fmt: skip
        assert got == want, (
            f"{work.__name__}: the operator with the most self CPU time is '{want}', you returned "
            f"'{got}'. Profile fn() and take the max of self_cpu_time_total over prof.key_averages()"
        )


@exercise(
    "02.top-op",
    "Profile one call of fn() and return the name of the operator (not a record_function range) with the most "
    "self CPU time.",
    _check_top_op,
)
def top_self_cpu_op(fn: Callable[[], object]) -> str:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = [e for e in prof.key_averages() if not e.is_user_annotation and not e.key.startswith("ProfilerStep")]
    return max(ops, key=lambda e: e.self_cpu_time_total).key
