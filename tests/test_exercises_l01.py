"""Lesson 01's timer exercise rejects timers that skip synchronization or warm-up (and accepts a correct one)."""

import time

import pytest

from course_utils import exercises
from course_utils.lesson_exercises.l01 import FakeAsyncDevice

CHECK = exercises.get("01.timer").checker


def good(fn, synchronize, warmup=5, repeats=30):
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


def no_sync(fn, synchronize, warmup=5, repeats=30):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def no_warmup(fn, synchronize, warmup=5, repeats=30):
    synchronize()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def seconds(fn, synchronize, warmup=5, repeats=30):
    return [t / 1000 for t in good(fn, synchronize, warmup, repeats)]


def median_only(fn, synchronize, warmup=5, repeats=30):
    return sorted(good(fn, synchronize, warmup, repeats))[repeats // 2]


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
    return out


def test_correct_timer_passes():
    CHECK(good)


@pytest.mark.parametrize(
    "wrong, message",
    [
        (no_sync, "timed the launch"),
        (sync_once_at_end, "timed the launch"),
        (no_warmup, "cold"),
        (seconds, "milliseconds"),
        (median_only, "list of per-call times"),
    ],
)
def test_wrong_timers_are_rejected(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECK(wrong)


def test_fake_device_is_asynchronous():
    dev = FakeAsyncDevice(work_ms=20)
    t0 = time.perf_counter()
    dev.launch()
    launched = time.perf_counter() - t0
    dev.synchronize()
    done = time.perf_counter() - t0
    assert launched < 0.005 and done >= 0.019
