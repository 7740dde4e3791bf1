"""Lesson 00 exercises."""

from __future__ import annotations

from collections.abc import Callable

from ..exercises import exercise


def _check_describe(fn: Callable[[dict], str]) -> None:
    assert fn({"cuda_available": True}) == "gpu", "a dict with cuda_available=True should give 'gpu'"
    assert fn({"cuda_available": False}) == "cpu", "a dict with cuda_available=False should give 'cpu'"


@exercise("00.describe", "Return 'gpu' when caps['cuda_available'] is true, else 'cpu'.", _check_describe)
def describe_machine(caps: dict) -> str:
    return "gpu" if caps.get("cuda_available") else "cpu"
