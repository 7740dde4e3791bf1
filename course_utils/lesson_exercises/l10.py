"""Lesson 10 exercises: the best case of a two-stage pipeline, and how much of the possible gain was reached."""

from __future__ import annotations

import math
from collections.abc import Callable

from ..exercises import exercise


def _check_bound(fn: Callable[[float, float, int], float]) -> None:
    cases = [((1.0, 1.0, 1), 2.0), ((1.0, 3.0, 4), 1.0 + 3 * 3.0 + 3.0), ((2.0, 1.0, 10), 2.0 + 9 * 2.0 + 1.0)]
    for (p, c, n), want in cases:
        got = fn(p, c, n)
        assert math.isclose(got, want, rel_tol=1e-9), (
            f"prep={p}, compute={c}, n={n}: expected {want}, got {got}. "
            "Hint: prep + (n - 1) * max(prep, compute) + compute"
        )


@exercise("10.bound", "Return prep + (n - 1) * max(prep, compute) + compute.", _check_bound)
def pipeline_bound(prep_s: float, compute_s: float, n: int) -> float:
    return prep_s + (n - 1) * max(prep_s, compute_s) + compute_s


def _check_share(fn: Callable[[float, float, float], float]) -> None:
    assert math.isclose(fn(10.0, 6.0, 6.0), 1.0), "overlapped == bound means all of the possible gain: 1.0"
    assert math.isclose(fn(10.0, 10.0, 6.0), 0.0), "overlapped == sequential means none of it: 0.0"
    assert math.isclose(fn(10.0, 8.0, 6.0), 0.5), "sequential 10, overlapped 8, bound 6: saved 2 of 4 possible"


@exercise("10.share", "Return (sequential - overlapped) / (sequential - bound).", _check_share)
def share_of_possible_gain(sequential_s: float, overlapped_s: float, bound_s: float) -> float:
    return (sequential_s - overlapped_s) / (sequential_s - bound_s)
