"""Lesson 07 exercises: reading fusion from node counts, and choosing a thread count."""

from __future__ import annotations

import collections
from collections.abc import Callable

from ..exercises import exercise


def _check_fusion(fn: Callable[[collections.Counter, collections.Counter], dict]) -> None:
    before = collections.Counter({"Conv": 4, "Relu": 4, "Add": 2, "Gemm": 1})
    after = collections.Counter({"FusedConv": 4, "Add": 2, "Gemm": 1})
    got = fn(before, after)
    assert got.get("removed") == 4, f"11 nodes before, 7 after: 4 removed, got {got.get('removed')}"
    assert got.get("gone") == ["Conv", "Relu"], "op types present before and absent after, sorted: ['Conv', 'Relu']"
    assert got.get("new") == ["FusedConv"], "op types absent before and present after: ['FusedConv']"
    same = fn(before, before)
    assert same == {"removed": 0, "gone": [], "new": []}, "identical graphs: nothing removed, gone or new"


@exercise(
    "07.fusion",
    "fusion_summary(before, after): from two op-type Counters return {'removed': node count difference, "
    "'gone': sorted op types only in before, 'new': sorted op types only in after}.",
    _check_fusion,
)
def fusion_summary(before: collections.Counter, after: collections.Counter) -> dict:
    return {
        "removed": sum(before.values()) - sum(after.values()),
        "gone": sorted(set(before) - set(after)),
        "new": sorted(set(after) - set(before)),
    }


def _check_threads(fn: Callable[[dict[int, float], float], int]) -> None:
    assert fn({1: 10.0, 2: 6.0, 4: 5.9}, 0.05) == 2, "4 threads are within 5% of 2 threads: take the fewer (2)"
    assert fn({1: 10.0, 2: 6.0, 4: 3.0}, 0.05) == 4, "4 threads are clearly fastest here"
    assert fn({1: 5.0, 2: 5.1}, 0.05) == 1, "1 thread is fastest: keep the other core free"
    assert fn({8: 2.0}, 0.0) == 8, "a single candidate wins"


@exercise(
    "07.threads",
    "pick_threads(medians, slack): medians maps thread count -> median ms; return the FEWEST threads whose "
    "median is within (1 + slack) x the best median (spare cores serve other requests).",
    _check_threads,
)
def pick_threads(medians: dict[int, float], slack: float = 0.05) -> int:
    best = min(medians.values())
    return min(t for t, ms in medians.items() if ms <= best * (1 + slack))
