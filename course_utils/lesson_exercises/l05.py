"""Lesson 05 exercises: INT8 size ratio and choosing layers to keep in FP32."""

from __future__ import annotations

from collections.abc import Callable

from ..exercises import exercise


def _check_ratio(fn: Callable[[int, int], float]) -> None:
    got = float(fn(384, 1536))
    want = (384 * 1536 * 4) / (384 * 1536 + 8)
    assert abs(got - want) < 1e-6, (
        f"384x1536: FP32 bytes 4*n, INT8 bytes n + 8 (scale + zero point): want {want:.4f}, got {got}"
    )
    assert abs(float(fn(1, 1)) - 4 / 9) < 1e-6, "a 1x1 weight: 4 bytes vs 1 + 8 bytes, the ratio is below 1"


@exercise("05.size-ratio", "FP32 bytes / INT8 bytes of one per-tensor-quantized Linear weight.", _check_ratio)
def int8_size_ratio(in_features: int, out_features: int) -> float:
    n = in_features * out_features
    return (4 * n) / (n + 8)


def _check_keep(fn: Callable[[dict, float], list]) -> None:
    drops = {"a": 0.05, "b": 0.001, "c": 0.02, "d": 0.002}
    assert list(fn(drops, 0.01)) == ["a", "c"], "keep 'a' then 'c': the rest sum to 0.003 <= 0.01"
    assert list(fn(drops, 1.0)) == [], "the budget already covers everything: keep nothing"
    assert list(fn(drops, 0.0)) == ["a", "c", "d", "b"], "a zero budget keeps every layer, largest drop first"


@exercise(
    "05.keep-layers", "Keep the largest-drop layers in FP32 until the remaining drops fit the budget.", _check_keep
)
def layers_to_keep(drops: dict, budget: float) -> list:
    order = sorted(drops, key=drops.get, reverse=True)
    keep: list = []
    while sum(drops[k] for k in order if k not in keep) > budget:
        keep.append(order[len(keep)])
    return keep
