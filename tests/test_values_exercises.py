"""Exercise 01.timer's checker pinned: each assertion that test_exercises_l01.py does not reach rejects a plausible
wrong timer for its own named reason, so deleting that assertion fails this file (see scripts/mutate.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from course_utils.check import exercises
from course_utils.check.lesson_exercises.l01 import SLOW_MS

PAD_S = (SLOW_MS / 3 + 20) / 1000  # above the checker's bound for an ordinary call, below its cold-call bound


def _report(times, **override):
    out = {
        "times_ms": times,
        "p50_ms": float(np.percentile(times, 50)),
        "p90_ms": float(np.percentile(times, 90)),
        "max_ms": max(times),
    }
    out.update(override)
    return out


def _times(fn, synchronize, warmup, repeats):
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
    return _report(_times(fn, synchronize, warmup, repeats))


def one_short(fn, synchronize, warmup=5, repeats=30):
    return _report(_times(fn, synchronize, warmup, repeats)[1:])


def p90_is_p95(fn, synchronize, warmup=5, repeats=30):
    t = _times(fn, synchronize, warmup, repeats)
    return _report(t, p90_ms=float(np.percentile(t, 95)) + 1.0)


def max_of_the_warm_calls(fn, synchronize, warmup=5, repeats=30):
    t = _times(fn, synchronize, warmup, repeats)
    return _report(t, max_ms=sorted(t)[-2] - 1.0)


def time_once_and_repeat(fn, synchronize, warmup=5, repeats=30):
    return _report(_times(fn, synchronize, warmup, 1) * repeats)


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
    return _report(out)


@pytest.mark.parametrize(
    "wrong, reason",
    [
        (one_short, "asked for repeats=10, got 9 times"),
        (p90_is_p95, "is not the 90th percentile of your own times_ms"),
        (max_of_the_warm_calls, "is not max(times_ms)"),
        (time_once_and_repeat, "fn was called 4 times for warmup=3, repeats=12"),
        (padded, "time only fn() and synchronize()"),
    ],
)
def test_timer_checker_names_each_mistake(wrong, reason):
    got = exercises.verdict("01.timer", wrong)
    assert got != "accepted" and reason in got, got


def test_timer_checker_accepts_the_correct_timer():
    assert exercises.verdict("01.timer", good) == "accepted"
