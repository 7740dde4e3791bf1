"""Shared helpers of the GPU inference course, one module per room.

device (what this machine has) · timing (measure a callable correctly) · sweep (batch sizes, OOM) ·
plots · results (rows per machine) · compare (outputs vs baseline, tolerances) · models and data
(offline zoo, checksums) · modes (smoke, strict GPU, section record) · exercises · lesson (setup cell) ·
one module per lesson topic (profiling, batching, precision, quant, compilation, backends, pipeline, memory,
pruning, serving, triton, optimize, leaderboard).

Modules load on first use (``cu.plots`` imports matplotlib only when a lesson plots), so processes that need
little, such as lesson 13's server workers, start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "backends", "batching", "compare", "compilation", "data", "device", "errors", "exercises", "leaderboard",
    "lesson", "memory", "models", "modes", "optimize", "pipeline", "plots", "precision", "profiling",
    "pruning", "quant", "results", "serving", "sweep", "timing", "triton",
}  # fmt: skip
# Shortcuts for the most used functions: cu.measure, cu.record, ...
_SHORTCUTS = {
    "check_outputs": "compare", "compare_outputs": "compare", "pick_device": "device", "gpu_section": "modes",
    "is_smoke": "modes", "pick": "modes", "record": "results", "measure": "timing",
}  # fmt: skip

__all__ = sorted(_MODULES | set(_SHORTCUTS))


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _SHORTCUTS:
        return getattr(importlib.import_module(f".{_SHORTCUTS[name]}", __name__), name)
    raise AttributeError(f"module 'course_utils' has no attribute '{name}'")


def __dir__() -> list[str]:
    return __all__
