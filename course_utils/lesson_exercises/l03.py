"""Lesson 03 exercises: the knee of a batch curve, a batcher's capacity, Poisson arrivals."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..exercises import exercise


def _check_knee(fn: Callable[..., int]) -> None:
    bs = [1, 2, 4, 8, 16, 32]
    tp = [100.0, 190.0, 350.0, 500.0, 600.0, 610.0]
    got = fn(bs, tp, 0.9)
    assert got == 16, f"throughput first reaches 90% of the best (549) at batch 16, you returned {got}"
    assert fn(bs, tp, 0.5) == 4, "with fraction=0.5 the answer is 4 (350 >= 305)"
    assert fn([1, 2], [10.0, 5.0], 0.9) == 1, "when batch 1 is already the best, the knee is 1"


@exercise(
    "03.knee",
    "Return the smallest batch size whose throughput reaches `fraction` of the best throughput.",
    _check_knee,
)
def knee_batch(batch_sizes: list[int], throughputs: list[float], fraction: float = 0.9) -> int:
    best = max(throughputs)
    return min(b for b, t in zip(batch_sizes, throughputs, strict=True) if t >= fraction * best)


def _check_capacity(fn: Callable[..., float]) -> None:
    service = {1: 10.0, 2: 11.0, 4: 13.0, 8: 17.0}
    assert abs(fn(service, 1) - 100.0) < 1e-6, "one request per 10 ms is 100 requests/s"
    assert abs(fn(service, 8) - 8 * 1000 / 17.0) < 1e-6, "8 requests every 17 ms: 8 * 1000 / 17 requests/s"


@exercise(
    "03.capacity",
    "Given {batch_size: service_ms}, return the most requests/s one instance serves with full batches of b.",
    _check_capacity,
)
def max_rate(service_ms: dict[int, float], max_batch_size: int) -> float:
    return max_batch_size * 1000.0 / service_ms[max_batch_size]


def _check_poisson(fn: Callable[..., np.ndarray]) -> None:
    arr = np.asarray(fn(50.0, 20_000, 0), dtype=float)
    assert arr.shape == (20_000,), f"expected 20000 arrival times, got shape {arr.shape}"
    gaps = np.diff(arr)
    assert np.all(gaps >= 0), "arrival times must be increasing (a cumulative sum of gaps)"
    assert abs(gaps.mean() - 20.0) < 1.0, "at 50 requests/s the mean gap is 1000 / 50 = 20 ms (times are in ms)"
    cv = gaps.std() / gaps.mean()
    assert 0.9 < cv < 1.1, (
        f"the gaps' spread/mean is {cv:.2f}; Poisson arrivals have exponential gaps (ratio 1), not a regular grid"
    )


@exercise(
    "03.poisson",
    "Return n arrival times in ms for a Poisson process at rate_per_s (exponential gaps, cumulative sum).",
    _check_poisson,
)
def arrivals(rate_per_s: float, n: int, seed: int = 0) -> np.ndarray:
    gaps = np.random.default_rng(seed).exponential(1000.0 / rate_per_s, size=n)
    return np.cumsum(gaps)
