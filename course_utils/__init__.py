"""Shared helpers of the GPU inference course, one module per room.

The lab bench: measure (device, timing, memory) · show (plots, results, leaderboard) · check
(compare, exercises) · supply (models, data, paths, modes and the section record, lesson: the setup cell) ·
run (server_process, server_guard, load: lesson 13's server and load generator). The techniques themselves
are written out in the lessons; the remaining topic modules hold only what a later lesson reuses after its
own lesson wrote it out (e.g. optimize() for lesson 14).

Modules load on first use (``cu.plots`` imports matplotlib only when a lesson plots), so processes that need
little, such as lesson 13's server workers, start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {
    "backends", "batching", "compare", "compilation", "data", "device", "engines", "errors", "exercises", "leaderboard",
    "lesson", "llm", "load", "memory", "models", "modes", "optimize", "paths", "pipeline", "plots", "precision",
    "profiling", "pruning", "quant", "results", "server_guard", "server_process", "streamcheck", "timing",
    "triton",
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
