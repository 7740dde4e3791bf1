"""Lesson 03 exercises: tune a dynamic batcher's max_wait_ms for a p99 target; the knee of a batch curve."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..exercises import exercise

CANDIDATES = [0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0]


def _service(fixed_ms: float, per_item_ms: float) -> Callable[[int], float]:
    def service_ms(b: int) -> float:
        return fixed_ms + per_item_ms * b

    return service_ms


def _p99(arrivals: np.ndarray, service: Callable[[int], float], b: int, wait: float) -> float:
    from ..batching import simulate

    return simulate(arrivals, service, max_batch_size=b, max_wait_ms=wait).p99_ms


def _check_max_wait(fn: Callable[..., float | None]) -> None:
    from ..batching import poisson_arrivals

    cases = [  # service time (fixed, per item), rate (req/s), max batch, which candidate's p99 sets the target
        ((4.0, 0.4), 150.0, 16, 3),
        ((10.0, 0.2), 60.0, 32, 4),
        ((2.0, 1.0), 300.0, 8, 2),
    ]
    for (fixed, per_item), rate, b, k in cases:
        service = _service(fixed, per_item)
        arrivals = poisson_arrivals(rate, 3000, seed=7)
        p99 = {w: _p99(arrivals, service, b, w) for w in CANDIDATES}
        target = p99[CANDIDATES[k]] * 1.0001
        want = max(w for w in CANDIDATES if p99[w] <= target)
        got = fn(arrivals, service, b, target, list(CANDIDATES))
        where = f"service {fixed} + {per_item}*b ms, {rate:g} req/s, max batch {b}, p99 target {target:.2f} ms"
        assert got is not None, f"{where}: some candidates meet the target, you returned None"
        assert got in CANDIDATES, f"{where}: return one of the candidates (a max_wait_ms), got {got!r}"
        assert p99[got] <= target, (
            f"{where}: max_wait_ms={got} gives p99 {p99[got]:.2f} ms, over the target: simulate each candidate"
        )
        assert got == want, (
            f"{where}: {got} meets the target, but a larger wait, {want}, does too (p99 {p99[want]:.2f} ms): "
            "return the largest candidate that meets it (fuller batches)"
        )
    service = _service(50.0, 1.0)
    arrivals = poisson_arrivals(10.0, 500, seed=3)
    got = fn(arrivals, service, 8, 10.0, list(CANDIDATES))
    assert got is None, f"a 10 ms p99 target cannot be met when one batch takes 51 ms: return None, not {got!r}"


@exercise(
    "03.max-wait",
    "Simulate each candidate max_wait_ms (cu.batching.simulate) and return the largest whose p99 meets the target, "
    "or None.",
    _check_max_wait,
)
def choose_max_wait(
    arrivals_ms: np.ndarray,
    service_ms: Callable[[int], float],
    max_batch_size: int,
    p99_target_ms: float,
    candidates: list[float],
) -> float | None:
    from ..batching import simulate

    ok = [
        w
        for w in candidates
        if simulate(arrivals_ms, service_ms, max_batch_size=max_batch_size, max_wait_ms=w).p99_ms <= p99_target_ms
    ]
    return max(ok) if ok else None


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
