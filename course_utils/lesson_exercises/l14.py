"""Lesson 14 exercises: choose a technique from measured rows, and when a set-up cost pays back."""

from __future__ import annotations

import math
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


def _check_break_even(fn: Callable[[float, float, float], float]) -> None:
    got = fn(10.0, 2.0, 1.0)
    assert got == 10_000, f"10 s of set-up saved at 1 ms per call pays back after 10000 calls; got {got}"
    got = fn(0.5, 3.0, 2.0)
    assert got == 500, f"0.5 s saved at 1 ms per call: 500 calls; got {got}"
    got = fn(1.0, 3.0, 0.7)
    assert got == math.ceil(1000 / 2.3), f"round up to whole calls: expected {math.ceil(1000 / 2.3)}, got {got}"
    assert fn(5.0, 1.0, 1.5) == math.inf, "a variant that is not faster never pays back: return math.inf"
    assert fn(0.0, 1.0, 0.5) == 0, "no set-up cost: it pays from the first call (0)"


@exercise(
    "14.break-even",
    "Given set-up seconds and the baseline's and the variant's ms per call, return how many calls it takes "
    "for the set-up to pay back (rounded up), or math.inf if the variant is not faster.",
    _check_break_even,
)
def break_even_calls(setup_s: float, baseline_ms: float, variant_ms: float) -> float:
    saved_ms = baseline_ms - variant_ms
    if saved_ms <= 0:
        return math.inf
    return math.ceil(setup_s * 1000.0 / saved_ms)
