"""Lesson 14 exercises: choose a technique from measured rows (break-even is exercise 06.break-even)."""

from __future__ import annotations

from collections.abc import Callable

from ..exercises import exercise


def _check_pick(fn: Callable[[list[dict], float], str]) -> None:
    rows = [
        {"technique": "compile", "speedup": 1.4, "accuracy_drop": 0.0},
        {"technique": "int8", "speedup": 2.5, "accuracy_drop": 0.03},
        {"technique": "onnxruntime", "speedup": 1.9, "accuracy_drop": 0.002},
        {"technique": "precision bf16", "speedup": 0.6, "accuracy_drop": 0.0},
    ]
    got = fn(rows, 0.01)
    assert got == "onnxruntime", f"budget 0.01: int8 drops 0.03 (too much), so onnxruntime (1.9x) wins; got {got!r}"
    got = fn(rows, 0.05)
    assert got == "int8", f"budget 0.05 allows int8's drop of 0.03 and it is fastest; got {got!r}"
    slow = [{"technique": "precision bf16", "speedup": 0.6, "accuracy_drop": 0.0}]
    got = fn(slow, 0.01)
    assert got == "baseline", f"nothing faster than the baseline (speed-up > 1): answer 'baseline', got {got!r}"
    assert fn([], 0.01) == "baseline", "no rows at all: answer 'baseline'"


@exercise(
    "14.pick",
    "Return the technique with the highest speed-up (> 1) whose accuracy_drop is within the budget, "
    "or 'baseline' when none qualifies.",
    _check_pick,
)
def pick_technique(rows: list[dict], budget: float) -> str:
    ok = [r for r in rows if r["speedup"] > 1.0 and r["accuracy_drop"] <= budget]
    return max(ok, key=lambda r: r["speedup"])["technique"] if ok else "baseline"
