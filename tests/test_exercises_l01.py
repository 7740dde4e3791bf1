"""Lesson 01's exercises reject wrong timers and wrong roofline readings (and accept the reference solutions).

The timer's planted delays (120 ms slow calls, 250 ms cold calls and warm-up queue) are large against the noise
of a loaded 2-core machine, so each wrong timer gets the same reason every time.

Exercise 01.timer's checker pinned: each assertion that test_exercises_l01.py does not reach rejects a plausible
wrong timer for its own named reason, so deleting that assertion fails this file (see scripts/mutate.py)."""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import pytest

from course_checks import exercises
from course_checks.lesson_exercises.l01 import SLOW_MS, FakeAsyncDevice

verdict = exercises.verdict


def report(times, **override):
    """The timer's result dict from ``times`` (ms); ``override`` plants a wrong field."""
    p50, p90 = np.percentile(times, [50, 90])
    out = {"times_ms": list(times), "p50_ms": float(p50), "p90_ms": float(p90), "max_ms": max(times)}
    out.update(override)
    return out


def timed_calls(fn, synchronize, warmup, repeats):
    """The correct loop: warm up, synchronize, then time each call up to its synchronize (ms)."""
    for _ in range(warmup):
        fn()
    synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def good(fn, synchronize, warmup=5, repeats=30):
    return report(timed_calls(fn, synchronize, warmup, repeats))


def no_sync(fn, synchronize, warmup=5, repeats=30):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return report(out)


def sync_once_at_end(fn, synchronize, warmup=5, repeats=30):
    for _ in range(warmup):
        fn()
    synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    synchronize()
    return report(out)


def no_sync_before_loop(fn, synchronize, warmup=5, repeats=30):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize()
        out.append((time.perf_counter() - t0) * 1000)
    return report(out)


def no_warmup(fn, synchronize, warmup=5, repeats=30):
    synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize()
        out.append((time.perf_counter() - t0) * 1000)
    return report(out)


def throughput(fn, synchronize, warmup=5, repeats=30):  # many launches, one synchronize: total / repeats
    for _ in range(warmup):
        fn()
    synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize()
    return report([(time.perf_counter() - t0) * 1000 / repeats] * repeats)


def one_call_copied(fn, synchronize, warmup=5, repeats=30):
    for _ in range(warmup):
        fn()
    synchronize()
    t0 = time.perf_counter()
    fn()
    synchronize()
    one = (time.perf_counter() - t0) * 1000
    for _ in range(repeats - 1):  # the calls still run, only the first is timed
        fn()
    synchronize()
    return report([one] * repeats)


def sorted_times(fn, synchronize, warmup=5, repeats=30):
    r = good(fn, synchronize, warmup, repeats)
    return {**r, "times_ms": sorted(r["times_ms"])}


def seconds(fn, synchronize, warmup=5, repeats=30):
    return report([t / 1000 for t in good(fn, synchronize, warmup, repeats)["times_ms"]])


def cpu_time(fn, synchronize, warmup=5, repeats=30):  # process_time counts CPU time, not waiting
    for _ in range(warmup):
        fn()
    synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        synchronize()
        out.append((time.process_time() - t0) * 1000)
    return report(out)


def mean_for_median(fn, synchronize, warmup=5, repeats=30):
    r = good(fn, synchronize, warmup, repeats)
    return {**r, "p50_ms": float(np.mean(r["times_ms"]))}


def list_only(fn, synchronize, warmup=5, repeats=30):
    return good(fn, synchronize, warmup, repeats)["times_ms"]


def test_correct_timer_passes():
    assert verdict("01.timer", good) == "accepted"
    assert verdict("01.timer", exercises.get("01.timer").solution) == "accepted"


WRONG_TIMERS = [
    (no_sync, "timed the launch"),
    (sync_once_at_end, "timed the launch"),
    (no_sync_before_loop, "synchronize() after the warm-up, before the timed loop"),
    (no_warmup, "cold"),
    (throughput, "all 20 of your times are equal"),
    (one_call_copied, "all 20 of your times are equal"),
    (sorted_times, "do not follow the calls"),
    (seconds, "not seconds"),
    (cpu_time, "not CPU time"),
    (mean_for_median, "is not the 50th percentile"),
    (list_only, "return a dict"),
]


@pytest.mark.parametrize("wrong, message", WRONG_TIMERS)
def test_wrong_timers_are_rejected(wrong, message):
    reason = verdict("01.timer", wrong)
    assert message in reason, reason


def test_fake_device_is_asynchronous():
    dev = FakeAsyncDevice(work_ms=20)
    t0 = time.perf_counter()
    dev.launch()
    launched = time.perf_counter() - t0
    dev.synchronize()
    done = time.perf_counter() - t0
    assert launched < 0.005 and done >= 0.019 and dev.works == [20.0]


# ---- 01.classify -------------------------------------------------------------------------------------------
def reference(i, a, pf, pb):
    return exercises.get("01.classify").solution(i, a, pf, pb)


def ridge_reversed(i, a, pf, pb):
    r = reference(i, a, pf, pb)
    return {"compute-bound": "memory-bound", "memory-bound": "compute-bound"}.get(r, r)


def roof_is_peak_flops(i, a, pf, pb):  # forgets the bandwidth roof
    if a < 0.1 * pf:
        return "overhead-bound"
    return "compute-bound" if i >= pf / pb else "memory-bound"


def half_roof_threshold(i, a, pf, pb):
    if a < 0.5 * min(pf, i * pb):
        return "overhead-bound"
    return "compute-bound" if i >= pf / pb else "memory-bound"


def never_overhead(i, a, pf, pb):
    return "compute-bound" if i >= pf / pb else "memory-bound"


OLD_CASES = {
    (100.0, 8e11): "compute-bound",
    (0.1, 8e9): "memory-bound",
    (0.1, 1e8): "overhead-bound",
    (100.0, 5e10): "overhead-bound",
    (5.0, 4e11): "memory-bound",
}


def old_cases_typed_in(i, a, pf, pb):
    return OLD_CASES.get((i, a), "compute-bound")


def inverse_ridge(i, a, pf, pb):  # the ridge taken upside down: peak_bw / peak_flops
    if a < 0.1 * min(pf, i * pb):
        return "overhead-bound"
    return "compute-bound" if i >= pb / pf else "memory-bound"


def max_roof(i, a, pf, pb):  # the higher roof, not the lower
    if a < 0.1 * max(pf, i * pb):
        return "overhead-bound"
    return "compute-bound" if i >= pf / pb else "memory-bound"


def bandwidth_roof_only(i, a, pf, pb):  # intensity * peak_bw as the roof right of the ridge too
    if a < 0.1 * i * pb:
        return "overhead-bound"
    return "compute-bound" if i >= pf / pb else "memory-bound"


def one_percent_threshold(i, a, pf, pb):
    if a < 0.01 * min(pf, i * pb):
        return "overhead-bound"
    return "compute-bound" if i >= pf / pb else "memory-bound"


def twenty_percent_threshold(i, a, pf, pb):
    if a < 0.2 * min(pf, i * pb):
        return "overhead-bound"
    return "compute-bound" if i >= pf / pb else "memory-bound"


def roof_by_side(i, a, pf, pb):  # right: each side of the ridge against its own roof
    if i >= pf / pb:
        return "overhead-bound" if a < 0.1 * pf else "compute-bound"
    return "overhead-bound" if a / i < 0.1 * pb else "memory-bound"  # achieved bytes/s against peak_bw


def ten_percent_inclusive(i, a, pf, pb):  # "under 10%" written as <=: exactly 10% called overhead-bound
    if a <= 0.1 * min(pf, i * pb):
        return "overhead-bound"
    return "compute-bound" if i >= pf / pb else "memory-bound"


def fraction_of_roof(
    i, a, pf, pb
):  # right: the fraction of the roof, and the ridge as intensity * peak_bw >= peak_flops
    if a / min(pf, i * pb) < 0.1:
        return "overhead-bound"
    return "compute-bound" if i * pb >= pf else "memory-bound"


def ten_times_achieved(i, a, pf, pb):  # right: 10 * achieved against the roof, in percent
    if 100 * (10 * a) / min(pf, i * pb) < 100:
        return "overhead-bound"
    return "compute-bound" if i >= pf / pb else "memory-bound"


@pytest.mark.parametrize("right", [roof_by_side, fraction_of_roof, ten_times_achieved])
def test_classify_accepts_right_alternatives(right):
    for seed in range(200):
        assert exercises.verdict("01.classify", right, seed=seed) == "accepted", seed


def test_classify_reference_passes():
    for seed in range(200):
        assert exercises.verdict("01.classify", exercises.get("01.classify").solution, seed=seed) == "accepted"


@pytest.mark.parametrize(
    "wrong, message",
    [
        (ridge_reversed, "right of it compute-bound"),
        (roof_is_peak_flops, "of the roof min(peak_flops, intensity * peak_bw)"),
        (half_roof_threshold, "that is not under 10%"),
        (never_overhead, "expected 'overhead-bound'"),
        (old_cases_typed_in, "random case seed"),
        (inverse_ridge, "right of it compute-bound"),
        (max_roof, "of the roof min(peak_flops, intensity * peak_bw)"),
        (bandwidth_roof_only, "that is not under 10%"),
        (one_percent_threshold, "expected 'overhead-bound'"),
        (twenty_percent_threshold, "that is not under 10%"),
        (ten_percent_inclusive, "exactly 10% of the roof"),
    ],
)
def test_classify_rejects(wrong, message):
    for seed in range(200):
        reason = exercises.verdict("01.classify", wrong, seed=seed)
        assert message in reason, (seed, reason)
    reason = verdict("01.classify", wrong)
    assert message in reason, reason


PAD_S = (SLOW_MS / 3 + 20) / 1000  # above the checker's bound for an ordinary call, below its cold-call bound


def one_short(fn, synchronize, warmup=5, repeats=30):
    return report(timed_calls(fn, synchronize, warmup, repeats)[1:])


def p90_is_p95(fn, synchronize, warmup=5, repeats=30):
    t = timed_calls(fn, synchronize, warmup, repeats)
    return report(t, p90_ms=float(np.percentile(t, 95)) + 1.0)


def max_of_the_warm_calls(fn, synchronize, warmup=5, repeats=30):
    t = timed_calls(fn, synchronize, warmup, repeats)
    return report(t, max_ms=sorted(t)[-2] - 1.0)


def time_once_and_repeat(fn, synchronize, warmup=5, repeats=30):
    return report(timed_calls(fn, synchronize, warmup, 1) * repeats)


def padded(fn, synchronize, warmup=5, repeats=30):
    """Waits PAD_S inside the timed region after each call ('to let the device settle')."""
    for _ in range(warmup):
        fn()
    synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize()
        time.sleep(PAD_S)
        out.append((time.perf_counter() - t0) * 1000)
    return report(out)


NAMED_MISTAKES = [
    (one_short, "asked for repeats=10, got 9 times"),
    (p90_is_p95, "is not the 90th percentile of your own times_ms"),
    (max_of_the_warm_calls, "is not max(times_ms)"),
    (time_once_and_repeat, "fn was called 4 times for warmup=3, repeats=12"),
    (padded, "time only fn() and synchronize()"),
]


@pytest.mark.parametrize("wrong, reason", NAMED_MISTAKES)
def test_timer_checker_names_each_mistake(wrong, reason):
    got = exercises.verdict("01.timer", wrong)
    assert got != "accepted" and reason in got, got


def test_timer_checker_accepts_the_correct_timer():
    assert exercises.verdict("01.timer", good) == "accepted"


REAL_TIME = time


class SkippedSleeps:
    """The ``time`` module with its sleeps skipped: ``sleep(s)`` returns at once and moves ``perf_counter`` on by
    ``s``, so every call still reads the real clock (the microseconds a launch or a Python loop takes) plus
    exactly the sleeps so far. CPU time (``process_time``) is the real one: a skipped sleep costs no CPU either."""

    def __init__(self) -> None:
        self.slept = 0.0

    def perf_counter(self) -> float:
        return REAL_TIME.perf_counter() + self.slept

    def sleep(self, seconds: float) -> None:
        self.slept += max(0.0, seconds)

    def __getattr__(self, name: str):
        return getattr(REAL_TIME, name)


@pytest.fixture
def skipped_sleeps(monkeypatch):
    """The checker's workloads (its fake device, cold start, sleeping calls, torch.utils.benchmark's timer), the
    reference and this file's timers all on one :class:`SkippedSleeps` clock."""
    from course_checks.lesson_exercises import l01

    clock = SkippedSleeps()
    monkeypatch.setattr(l01, "time", clock)
    monkeypatch.setattr(sys.modules[__name__], "time", clock)
    return clock


def microseconds(fn, synchronize, warmup=5, repeats=30):  # * 1e6: microseconds
    return report([t * 1000 for t in timed_calls(fn, synchronize, warmup, repeats)])


def cuda_synchronize_hard_coded(fn, synchronize, warmup=5, repeats=30):  # ignores the synchronize it is given
    import torch

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    return report(timed_calls(fn, sync, warmup, repeats))


def percent_as_fraction(fn, synchronize, warmup=5, repeats=30):  # np.percentile(times, 0.5): a fraction
    t = timed_calls(fn, synchronize, warmup, repeats)
    return report(t, p50_ms=float(np.percentile(t, 0.5)), p90_ms=float(np.percentile(t, 0.9)))


def statistics_quantiles(fn, synchronize, warmup=5, repeats=30):  # the 'exclusive' method reads past the ends
    t = timed_calls(fn, synchronize, warmup, repeats)
    return report(t, p50_ms=statistics.median(t), p90_ms=statistics.quantiles(t, n=10)[-1])


def slowest_dropped_from_percentiles(fn, synchronize, warmup=5, repeats=30):  # "an outlier", left out
    t = timed_calls(fn, synchronize, warmup, repeats)
    p50, p90 = np.percentile(sorted(t)[:-1], [50, 90])
    return report(t, p50_ms=float(p50), p90_ms=float(p90))


def warmup_one_short(fn, synchronize, warmup=5, repeats=30):
    return report(timed_calls(fn, synchronize, warmup - 1, repeats))


def nearest_rank(fn, synchronize, warmup=5, repeats=30):  # right: a sorted list's nearest-rank percentiles
    t = timed_calls(fn, synchronize, warmup, repeats)
    s = sorted(t)
    return report(t, p50_ms=s[len(s) // 2], p90_ms=s[int(0.9 * len(s))])


def numpy_float32(fn, synchronize, warmup=5, repeats=30):  # right: numpy array and numpy scalars
    t = np.array(timed_calls(fn, synchronize, warmup, repeats), dtype=np.float32)
    return {"times_ms": t, "p50_ms": np.percentile(t, 50), "p90_ms": np.percentile(t, 90), "max_ms": t.max()}


MORE_MISTAKES = [
    (microseconds, "that is microseconds"),
    (cuda_synchronize_hard_coded, "the synchronize you are given"),
    (percent_as_fraction, "np.percentile takes a percent, 0 to 100"),
    (statistics_quantiles, "statistics.quantiles' default 'exclusive' method"),
    (slowest_dropped_from_percentiles, "is not the 90th percentile of your own times_ms"),
    (warmup_one_short, "fn was called 14 times for warmup=3, repeats=12"),
]


@pytest.mark.parametrize("wrong, message", WRONG_TIMERS + NAMED_MISTAKES + MORE_MISTAKES)
def test_timer_rejections_over_200_seeds(skipped_sleeps, wrong, message):
    """Every wrong timer of this file, on seeds 0-199, with the checker's planted delays (slow calls at drawn
    positions, cold calls, the warm-up's queue, the benchmark's sleep) exact instead of slept: the judgment reads
    the durations only against the planted 3/120/250 ms, never against the wall clock, so each seed's case is
    judged as in the full check, minus a loaded machine's late wake-ups (the tests above run the real sleeps)."""
    for seed in range(200):
        reason = verdict("01.timer", wrong, seed=seed)
        assert reason != "accepted" and message in reason, (seed, reason)
    assert skipped_sleeps.slept > 0


def test_timer_accepts_the_reference_and_the_correct_loop_over_200_seeds(skipped_sleeps):
    for seed in range(200):
        assert verdict("01.timer", good, seed=seed) == "accepted", seed
        assert verdict("01.timer", exercises.get("01.timer").solution, seed=seed) == "accepted", seed


@pytest.mark.parametrize("right", [nearest_rank, numpy_float32])
def test_timer_accepts_right_alternatives_over_200_seeds(skipped_sleeps, right):
    for seed in range(200):
        assert verdict("01.timer", right, seed=seed) == "accepted", seed
