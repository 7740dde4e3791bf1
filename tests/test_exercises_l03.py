"""Lesson 03's max_wait_ms exercise rejects wrong tuning rules (checked by the simulation)."""

import pytest

from course_utils import exercises
from course_utils.batching import simulate

CHECK = exercises.get("03.max-wait").checker


def p99(arrivals, service, b, w):
    return simulate(arrivals, service, max_batch_size=b, max_wait_ms=w).p99_ms


def always_zero(arrivals, service, b, target, candidates):
    return 0.0


def always_largest(arrivals, service, b, target, candidates):
    return max(candidates)


def smallest_that_meets(arrivals, service, b, target, candidates):
    ok = [w for w in candidates if p99(arrivals, service, b, w) <= target]
    return min(ok) if ok else None


def lowest_p99(arrivals, service, b, target, candidates):
    return min(candidates, key=lambda w: p99(arrivals, service, b, w))


def never_none(arrivals, service, b, target, candidates):
    ok = [w for w in candidates if p99(arrivals, service, b, w) <= target]
    return max(ok) if ok else min(candidates)


def returns_p99(arrivals, service, b, target, candidates):
    ok = [p99(arrivals, service, b, w) for w in candidates]
    return max(p for p in ok if p <= target)


@pytest.mark.parametrize(
    "wrong, message",
    [
        (always_zero, "larger wait"),
        (always_largest, "over the target"),
        (smallest_that_meets, "larger wait"),
        (lowest_p99, "larger wait"),
        (never_none, "return None"),
        (returns_p99, "one of the candidates"),
    ],
)
def test_wrong_rules_rejected(wrong, message):
    with pytest.raises(AssertionError, match=message):
        CHECK(wrong)


def test_reference_passes():
    CHECK(exercises.get("03.max-wait").solution)
