"""Lesson 01 exercises: per-call latency percentiles with a planted slow call; classify a workload on the roofline.

The timer's check runs the learner's code on hidden workloads whose true per-call times it knows:

* an ordinary synchronous workload (milliseconds, not seconds);
* a workload whose first calls are cold (a timer without warm-up reports them);
* a fake asynchronous device (``launch()`` returns at once, the work finishes only when the ``synchronize``
  callable is called, as on a GPU) with slow calls planted at random positions and a long queue left by the
  warm-up: a timer that skips the synchronize after the call reports launch times, one that skips it before the
  timed loop puts the warm-up's queue into its first call, a throughput timer (one synchronize for the loop,
  total / repeats) or one call timed and copied ``repeats`` times loses the planted slow calls;
* ``torch.utils.benchmark`` on a workload of known cost, for the median;
* on a CUDA machine, a real matmul against ``cu.measure``'s CUDA events.

The planted delays (120 and 250 ms) are large against a few milliseconds for ordinary calls and against the
wake-up delays of a loaded machine, so the verdict and its reason hold there too.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from course_checks.exercises import exercise
from course_checks.lesson_exercises.observe import Cases, cases

WORK_MS = 3.0  # an ordinary call of the hidden workloads
SLOW_MS = 120.0  # a planted slow call
COLD_MS = 250.0  # a cold call (first calls of the warm-up workload; each warm-up launch on the async device)
KEYS = ("times_ms", "p50_ms", "p90_ms", "max_ms")


class FakeAsyncDevice:
    """A device on the CPU that queues work like a GPU: ``launch()`` returns at once, ``synchronize()`` waits.

    Launch ``n`` (1-based) queues ``work_ms(n)`` of in-order work; ``synchronize`` sleeps until the queue is empty.
    ``works`` keeps what each launch queued, so a checker knows the true time of every call.
    """

    def __init__(self, work_ms: float | Callable[[int], float] = WORK_MS) -> None:
        self.work_ms = work_ms if callable(work_ms) else (lambda n, w=work_ms: w)
        self.busy_until = 0.0
        self.works: list[float] = []

    @property
    def launches(self) -> int:
        return len(self.works)

    def launch(self) -> None:
        ms = float(self.work_ms(len(self.works) + 1))
        self.works.append(ms)
        now = time.perf_counter()
        self.busy_until = max(now, self.busy_until) + ms / 1000

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


def _report(fn: Callable[..., Any], work: Callable[[], object], sync: Callable[[], None], warmup: int,
            repeats: int) -> dict[str, Any]:  # fmt: skip
    out = fn(work, sync, warmup=warmup, repeats=repeats)
    assert isinstance(out, dict), (
        f"return a dict with {', '.join(KEYS)} (got {type(out).__name__}): the per-call times and their percentiles"
    )
    missing = [k for k in KEYS if k not in out]
    assert not missing, f"your dict has no {missing}: return {', '.join(KEYS)}"
    times = out["times_ms"]
    assert isinstance(times, list | tuple | np.ndarray), (
        f"times_ms should be the list of per-call times (got {type(times).__name__})"
    )
    times = [float(t) for t in times]
    assert len(times) == repeats, f"asked for repeats={repeats}, got {len(times)} times: time each call once"
    srt = sorted(times)

    def between(q: float) -> tuple[float, float]:
        pos = q * (len(srt) - 1)
        return srt[math.floor(pos)], srt[math.ceil(pos)]

    for key, q in (("p50_ms", 0.5), ("p90_ms", 0.9)):
        lo, hi = between(q)
        v = float(out[key])
        pct = int(q * 100)
        if not lo - 1e-9 <= v <= hi + 1e-9:
            why = ""
            if abs(v - float(np.percentile(times, q))) <= 1e-9:
                why = f" It is np.percentile(times, {q}): np.percentile takes a percent, 0 to 100, not a fraction."
            elif len(times) > 1 and abs(v - statistics.quantiles(times, n=100)[pct - 1]) <= 1e-9:
                why = (
                    " It is statistics.quantiles' default 'exclusive' method, which reads past the sorted times; "
                    "the exercise asks np.percentile's (linear, 'inclusive')."
                )
            raise AssertionError(
                f"{key}={v:.6g} is not the {pct}th percentile of your own times_ms (between {lo:.6g} and "
                f"{hi:.6g}): np.percentile(times, {pct}), over all {len(times)} times you return.{why}"
            )
    assert abs(float(out["max_ms"]) - srt[-1]) <= 1e-9, f"max_ms={out['max_ms']} is not max(times_ms)={srt[-1]}"
    return {"times": times, **{k: float(out[k]) for k in KEYS[1:]}}


def _check_units(fn: Callable[..., Any]) -> None:
    def sleep_work() -> None:
        time.sleep(5 * WORK_MS / 3 / 1000)

    r = _report(fn, sleep_work, lambda: None, warmup=2, repeats=10)
    assert r["p50_ms"] < 1000, (  # a loaded machine wakes a 5 ms sleep late, not 200 times late
        f"median {r['p50_ms']:.4g} for a call that sleeps 5 ms: that is microseconds (or ns); return milliseconds, "
        "(t1 - t0) * 1000 with time.perf_counter() in seconds"
    )
    assert r["p50_ms"] > 0.5, (
        f"median {r['p50_ms']:.4g} for a call that sleeps 5 ms: return milliseconds ((t1 - t0) * 1000), not seconds "
        "(and time wall-clock time with time.perf_counter(), not CPU time)"
    )


def _check_cold(fn: Callable[..., Any]) -> None:
    cold = ColdStart(cold_calls=3)
    r = _report(fn, cold, lambda: None, warmup=3, repeats=12)
    first = r["times"][:3]
    assert min(first) < 0.9 * COLD_MS, (  # a loaded machine may delay one call that long, not three in a row
        f"your first timed calls took {[round(t) for t in first]} ms: the first calls of this workload are cold "
        f"({COLD_MS:.0f} ms). Call fn() `warmup` times before timing"
    )
    assert cold.calls >= 15, f"fn was called {cold.calls} times for warmup=3, repeats=12: warm up, then time"


def _check_async(fn: Callable[..., Any], c: Cases) -> None:
    warmup, repeats = 3, 20
    # positions in the timed loop, never the first, nor the last two together (a sorted list keeps those in place)
    slow_at = set(c.rng.sample(range(2, repeats), 2))
    while slow_at == {repeats - 2, repeats - 1}:
        slow_at = set(c.rng.sample(range(2, repeats), 2))
    dev = FakeAsyncDevice(lambda n: COLD_MS if n <= warmup else SLOW_MS if n - warmup - 1 in slow_at else WORK_MS)
    r = _report(fn, dev.launch, dev.synchronize, warmup=warmup, repeats=repeats)
    times, works = r["times"], dev.works[-repeats:]
    if len(set(times)) == 1:
        raise AssertionError(
            f"all {repeats} of your times are equal ({times[0]:.3f} ms), yet two calls took {SLOW_MS:.0f} ms and the "
            "rest "
            f"{WORK_MS:.0f} ms: one call timed and copied, or total / repeats (a throughput figure). Time each call "
            "on its own: perf_counter, fn(), synchronize(), perf_counter"
        )
    if r["max_ms"] < SLOW_MS / 2 and r["p50_ms"] < 0.7 * WORK_MS:
        raise AssertionError(
            f"on an asynchronous device your timer says {r['p50_ms']:.3f} ms per call (max {r['max_ms']:.3f}), but "
            f"each call queues {WORK_MS:.0f} ms of work or more: it timed the launch. Call synchronize() after fn() "
            "and before reading the clock: the synchronize you are given (this device is not CUDA, "
            "torch.cuda.synchronize() does not wait for it)"
        )
    assert times[0] < 2 * COLD_MS, (
        f"your first timed call took {times[0]:.0f} ms for {works[0]:.0f} ms of work: the warm-up's queued work "
        f"({warmup} x {COLD_MS:.0f} ms) landed in it. Call synchronize() after the warm-up, before the timed loop"
    )
    slow = [i for i, w in enumerate(works) if w == SLOW_MS]
    missed = [i for i in slow if times[i] < 0.8 * SLOW_MS]
    assert not missed, (
        f"calls {[i + 1 for i in slow]} of your timed loop took {SLOW_MS:.0f} ms; you report "
        f"{[round(times[i], 1) for i in slow]} ms. Your times do not follow the calls (averaged, sorted, or not "
        "synchronized after each call): time each call on its own and keep them in call order"
    )
    fast = [times[i] for i, w in enumerate(works) if w == WORK_MS]
    assert np.median(fast) < SLOW_MS / 3, (
        f"calls of {WORK_MS:.0f} ms measured {np.median(fast):.1f} ms (median): time only fn() and synchronize()"
    )
    assert r["max_ms"] >= 0.8 * SLOW_MS and r["p50_ms"] < SLOW_MS / 2, (
        "the planted slow calls must show in max_ms and not move the median"
    )


def _check_against_benchmark(fn: Callable[..., Any], c: Cases) -> None:
    from torch.utils import benchmark

    ms = c.choice([10.0, 12.0, 15.0])

    def known() -> None:
        time.sleep(ms / 1000)

    timer = benchmark.Timer(stmt="known()", globals={"known": known}, timer=time.perf_counter)  # this module's clock
    ref = timer.blocked_autorange(min_run_time=0.2).median * 1e3
    r = _report(fn, known, lambda: None, warmup=2, repeats=15)
    # a sleep never ends early; a loaded machine wakes it late, in this timer's blocks as in yours: wide bounds
    assert r["p50_ms"] >= 0.9 * ms and 0.5 <= r["p50_ms"] / ref <= 2.5, (
        f"a call that sleeps {ms:.0f} ms: your median {r['p50_ms']:.3f} ms, torch.utils.benchmark "
        f"{ref:.3f} ms: time only the call (the clock read right before fn() and right after synchronize())"
    )


def _check_timer(fn: Callable[..., Any]) -> None:
    with cases("01.timer") as c:
        _check_units(fn)
        _check_cold(fn)
        _check_async(fn, c)
        _check_against_benchmark(fn, c)
        import torch

        if torch.cuda.is_available():  # a real GPU matmul against cu.measure's CUDA events
            from course_utils.measuring.timing import measure

            x = torch.randn(2048, 2048, device="cuda")
            ref = measure(lambda: x @ x, device="cuda", min_repeats=20, min_time_s=0.0, warn_spread=False)
            r = _report(fn, lambda: x @ x, torch.cuda.synchronize, warmup=5, repeats=20)
            assert 0.7 <= r["p50_ms"] / ref.median_ms <= 1.5, (
                f"GPU matmul: your median {r['p50_ms']:.3f} ms vs CUDA events {ref.median_ms:.3f} ms: "
                "synchronize after fn()"
            )


@exercise(
    "01.timer",
    "latency_report(fn, synchronize, warmup, repeats) -> {'times_ms': per-call times in call order, 'p50_ms', "
    "'p90_ms', 'max_ms'}: warm up, synchronize, then per call: perf_counter, fn(), synchronize(), perf_counter.",
    _check_timer,
    time_limit=60,
)
def latency_report(fn: Callable[[], object], synchronize: Callable[[], None], warmup: int = 5,
                   repeats: int = 30) -> dict[str, Any]:  # fmt: skip
    for _ in range(warmup):
        fn()
    synchronize()  # the warm-up's queued work stays out of the first timed call
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        elapsed = time.perf_counter() - start
        times.append(1000 * elapsed)
    p50, p90 = np.percentile(times, [50, 90])
    return {"times_ms": times, "p50_ms": float(p50), "p90_ms": float(p90), "max_ms": max(times)}


def _expected_class(intensity: float, achieved: float, peak_flops: float, peak_bw: float) -> str:
    roof = min(peak_flops, intensity * peak_bw)
    if achieved < 0.1 * roof:
        return "overhead-bound"
    return "compute-bound" if intensity >= peak_flops / peak_bw else "memory-bound"


def _check_classify(fn: Callable[[float, float, float, float], str]) -> None:
    with cases("01.classify") as c:
        want_each = {"compute-bound": 0, "memory-bound": 0, "overhead-bound": 0}
        # Every call also gets cases near the 10% line on both sides (1-7% and 14-60% of the roof) and
        # memory-bound cases far left of the ridge, so that another threshold (1%, 50%) or a roof taken as
        # peak_flops fails on every call, not only when the random draws happen to land where they differ.
        # Also cases just above the line (14-20%: a 15% or 20% threshold fails) and cases whose intensity lies
        # between the ridge and its inverse peak_bw / peak_flops (a ridge taken upside down fails).
        near = {"below": 0, "above": 0, "far left": 0, "just above": 0, "between ridges": 0}
        tried = 0
        while (min(want_each.values()) < 3 or min(near.values()) < 2) and tried < 2000:  # drawn at random
            tried += 1
            peak_flops = 10 ** c.rng.uniform(10.5, 15)  # a 30 GFLOP/s laptop to a 1 PFLOP/s GPU
            peak_bw = 10 ** c.rng.uniform(10, 12.7)
            ridge = peak_flops / peak_bw
            intensity = ridge * 10 ** c.rng.uniform(-2.5, 2.5)
            if abs(math.log10(intensity / ridge)) < 0.1:
                continue  # too close to the ridge to tell: not a fair case
            roof = min(peak_flops, intensity * peak_bw)
            frac = 10 ** c.rng.uniform(-3.5, 0)
            if 0.07 < frac < 0.14:
                continue  # too close to the 10% line
            achieved = frac * roof
            near["below"] += 0.01 < frac < 0.07
            near["above"] += 0.14 < frac < 0.6
            want = _expected_class(intensity, achieved, peak_flops, peak_bw)
            want_each[want] += 1
            near["far left"] += want == "memory-bound" and intensity < ridge / 30
            near["just above"] += 0.14 < frac < 0.2
            near["between ridges"] += want != "overhead-bound" and (intensity >= ridge) != (intensity >= 1 / ridge)
            got = fn(intensity, achieved, peak_flops, peak_bw)
            where = (
                f"intensity {intensity:.3g} FLOP/byte, achieved {achieved:.3g} FLOP/s, peaks {peak_flops:.3g} FLOP/s "
                f"and {peak_bw:.3g} B/s (ridge at {ridge:.3g} FLOP/byte, roof here {roof:.3g} FLOP/s)"
            )
            assert got in want_each, f"return one of {sorted(want_each)}, got {got!r}"
            if want == "overhead-bound":
                assert got == want, (
                    f"{where}: expected 'overhead-bound', got '{got}'. The workload reaches {frac:.1%} of the roof "
                    "at its intensity, min(peak_flops, intensity * peak_bw): under 10% is overhead-bound"
                )
            assert got == want, (
                f"{where}: expected '{want}', got '{got}'. "
                + ("Above 10% of the roof, compare the intensity with the ridge point peak_flops / peak_bw: right "
                   "of it compute-bound, left of it memory-bound" if got != "overhead-bound" else
                   f"It reaches {frac:.1%} of the roof min(peak_flops, intensity * peak_bw) at its intensity: "
                   "that is not under 10%")
            )  # fmt: skip
        # exactly at the 10% line, on both sides of the ridge, in round numbers (so 0.1 * roof, roof / 10 and
        # achieved / roof all compute it exactly): "under 10%" excludes 10% itself
        for side in c.rng.sample(["compute-bound", "memory-bound"], 2):
            peak_bw = float(10 ** c.randint(10, 12))
            if side == "compute-bound":
                peak_flops = float(c.choice([1, 2, 4, 5, 8]) * 10 ** c.randint(12, 15))
                intensity, roof = peak_flops / peak_bw * c.choice([10, 100]), peak_flops
            else:
                intensity = float(c.choice([1, 2, 5]) * 10 ** c.randint(0, 2))
                roof = intensity * peak_bw
                peak_flops = roof * c.choice([10, 100])
            got = fn(intensity, roof / 10, peak_flops, peak_bw)
            assert got == side, (
                f"intensity {intensity:.3g} FLOP/byte, achieved {roof / 10:.3g} FLOP/s, peaks {peak_flops:.3g} "
                f"FLOP/s and {peak_bw:.3g} B/s: exactly 10% of the roof {roof:.3g} FLOP/s. Expected '{side}', got "
                f"'{got}': overhead-bound is under 10% (achieved < 0.1 * roof), and 10% is not under 10%"
            )


@exercise(
    "01.classify",
    "Roof = min(peak_flops, intensity * peak_bw); under 10% of it is overhead-bound; else compare with the ridge.",
    _check_classify,
    time_limit=30,
)
def classify(intensity: float, achieved: float, peak_flops: float, peak_bw: float) -> str:
    roof = min(peak_flops, intensity * peak_bw)
    if achieved < 0.1 * roof:
        return "overhead-bound"
    return "compute-bound" if intensity >= peak_flops / peak_bw else "memory-bound"
