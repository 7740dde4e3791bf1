"""Lesson 01 exercises: write the correct timer; classify a workload on the roofline.

The timer's check runs the learner's code on hidden workloads and compares it with :func:`course_utils.measure`:
an ordinary (synchronous) workload, a fake asynchronous device whose work only completes when the
``synchronize`` callable passed to the timer is called (so a timer that skips synchronization reports launch
times, on a CPU as on a GPU), and a workload whose first calls are cold (so a timer without warm-up reports
them). On a CUDA machine it also times a real GPU matmul against ``cu.measure``'s CUDA events.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..exercises import exercise

WORK_MS = 3.0  # the hidden workloads' true time per call
COLD_MS = 150.0  # a cold first call of the warm-up workload


class FakeAsyncDevice:
    """A device on the CPU that queues work like a GPU: ``launch()`` returns at once, ``synchronize()`` waits.

    Each launch adds ``work_ms`` of work to an in-order queue; ``synchronize`` sleeps until the queue is empty.
    """

    def __init__(self, work_ms: float = WORK_MS) -> None:
        self.work_s = work_ms / 1000
        self.busy_until = 0.0
        self.launches = 0

    def launch(self) -> None:
        now = time.perf_counter()
        self.busy_until = max(now, self.busy_until) + self.work_s
        self.launches += 1

    def synchronize(self) -> None:
        delay = self.busy_until - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


class ColdStart:
    """A workload whose first ``cold_calls`` calls are slow (like a new shape, a first compile), then steady."""

    def __init__(self, cold_calls: int, cold_ms: float = COLD_MS, work_ms: float = WORK_MS) -> None:
        self.cold_calls, self.cold_s, self.work_s = cold_calls, cold_ms / 1000, work_ms / 1000
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        time.sleep(self.cold_s if self.calls <= self.cold_calls else self.work_s)


def _times(fn: Callable[..., object], work: Callable[[], object], sync: Callable[[], None], warmup: int,
           repeats: int) -> list[float]:  # fmt: skip
    out = fn(work, sync, warmup=warmup, repeats=repeats)
    assert isinstance(out, list | tuple | np.ndarray), (
        f"return the list of per-call times (got {type(out).__name__}); the median comes from that list"
    )
    out = [float(t) for t in out]
    assert len(out) == repeats, f"asked for repeats={repeats}, got {len(out)} times: time each call once"
    return out


def _check_timer(fn: Callable[..., list[float]]) -> None:
    from ..timing import measure

    def sleep_work() -> None:
        time.sleep(WORK_MS / 1000)

    def no_sync() -> None:
        return None

    # 1. an ordinary workload: the same median as cu.measure, in milliseconds
    ref = measure(sleep_work, device="cpu", warmup=2, min_repeats=20, min_time_s=0.0, warn_spread=False)
    times = _times(fn, sleep_work, no_sync, warmup=2, repeats=20)
    med = float(np.median(times))
    assert med > 0.1, f"median {med:.4g}: return milliseconds ((t1 - t0) * 1000), not seconds"
    assert 0.75 <= med / ref.median_ms <= 1.33, (
        f"your median {med:.3f} ms vs cu.measure {ref.median_ms:.3f} ms on the same workload: time only the call"
    )

    # 2. an asynchronous device: calls return at once; only synchronize() waits for the work
    dev = FakeAsyncDevice()
    times = _times(fn, dev.launch, dev.synchronize, warmup=3, repeats=20)
    med = float(np.median(times))
    assert med >= 0.7 * WORK_MS, (
        f"on an asynchronous device your timer says {med:.3f} ms per call, but each call queues {WORK_MS} ms of "
        "work: it timed the launch. Call synchronize() after fn() and before reading the clock"
    )
    assert med <= 2.5 * WORK_MS, (
        f"on an asynchronous device your timer says {med:.3f} ms per call for {WORK_MS} ms of work: "
        "synchronize before the timed loop, so work queued earlier (the warm-up) is not counted"
    )

    # 3. a cold start: the first `warmup` calls are slow and must not be in the numbers
    cold = ColdStart(cold_calls=3)
    times = _times(fn, cold, no_sync, warmup=3, repeats=12)
    assert max(times) < COLD_MS / 2, (
        f"your times include a {max(times):.0f} ms call: the first calls of this workload are cold "
        f"({COLD_MS:.0f} ms). Call fn() `warmup` times before timing"
    )
    assert cold.calls >= 15, f"fn was called {cold.calls} times for warmup=3, repeats=12: warm up, then time"

    # 4. on a GPU: a real matmul against cu.measure's CUDA events
    import torch

    if torch.cuda.is_available():
        x = torch.randn(2048, 2048, device="cuda")
        ref = measure(lambda: x @ x, device="cuda", min_repeats=20, min_time_s=0.0, warn_spread=False)
        med = float(np.median(_times(fn, lambda: x @ x, torch.cuda.synchronize, warmup=5, repeats=20)))
        assert 0.7 <= med / ref.median_ms <= 1.5, (
            f"GPU matmul: your median {med:.3f} ms vs CUDA events {ref.median_ms:.3f} ms: synchronize after fn()"
        )


@exercise(
    "01.timer",
    "my_timer(fn, synchronize, warmup, repeats) -> list of `repeats` per-call times in ms: warm up, synchronize, "
    "then per call: perf_counter, fn(), synchronize(), perf_counter.",
    _check_timer,
)
def my_timer(fn: Callable[[], object], synchronize: Callable[[], None], warmup: int = 5,
             repeats: int = 30) -> list[float]:  # fmt: skip
    for _ in range(warmup):
        fn()
    synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def _check_intensity(fn: Callable[[int, int], float]) -> None:
    for n, b in [(1024, 4), (64, 2), (4096, 1)]:
        expected = 2 * n**3 / (3 * n * n * b)
        got = fn(n, b)
        assert abs(got - expected) <= 1e-6 * expected, (
            f"for n={n}, {b} bytes per element expected {expected:.4g} FLOP/byte, got {got}: "
            "count the multiply-adds of the product, and the bytes of the two inputs read and the output written."
        )


@exercise("01.intensity", "The FLOP per byte of an n x n by n x n matrix product (inputs read, output written once).",
          _check_intensity)  # fmt: skip
def matmul_intensity(n: int, bytes_per_element: int) -> float:
    return 2 * n**3 / (3 * n * n * bytes_per_element)


def _check_classify(fn: Callable[[float, float, float, float], str]) -> None:
    peak_flops, peak_bw = 1e12, 1e11  # ridge at 10 FLOP/byte
    cases = [
        (100.0, 8e11, "compute-bound"),
        (0.1, 8e9, "memory-bound"),
        (0.1, 1e8, "overhead-bound"),
        (100.0, 5e10, "overhead-bound"),
        (5.0, 4e11, "memory-bound"),
    ]
    for intensity, achieved, want in cases:
        got = fn(intensity, achieved, peak_flops, peak_bw)
        assert got == want, f"intensity {intensity}, achieved {achieved:.0e} FLOP/s: expected '{want}', got '{got}'"


@exercise(
    "01.classify",
    "Roof = min(peak_flops, intensity * peak_bw); under 10% of it is overhead-bound; else compare with the ridge.",
    _check_classify,
)
def classify(intensity: float, achieved: float, peak_flops: float, peak_bw: float) -> str:
    roof = min(peak_flops, intensity * peak_bw)
    if achieved < 0.1 * roof:
        return "overhead-bound"
    return "compute-bound" if intensity >= peak_flops / peak_bw else "memory-bound"
