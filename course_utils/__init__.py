"""The lab bench of the GPU inference course: what several lessons share, in one folder per role.

* ``measuring``: ``device``, ``timing`` (``cu.measure``, the timer), ``memory``;
* ``show``: ``plots``, ``results`` (``cu.record``), ``leaderboard``;
* ``check``: ``compare`` (``cu.check_outputs``), ``exercises`` and ``lesson_exercises``, ``streamcheck``, and
  ``standins`` (the CPU stand-ins that rehearse GPU sections);
* ``supply``: ``models``, ``data``, ``llm``, ``paths``, ``modes`` (``cu.gpu_section``, ``cu.pick``), ``lesson``,
  ``errors``;
* ``serve``: ``server_process``, ``server_guard``, ``load_generator`` (lesson 13's server and load);
* ``techniques``: code a later lesson reuses after its own lesson wrote it out: ``onnx_runtime`` (07),
  ``tensorrt_engines`` (08), ``profiling`` (02), ``batching_sim`` (03), ``pipeline`` (09), ``precision`` (04),
  ``quantization`` (05), ``compilation`` (06), ``pruning`` (12), ``triton_server`` (13), ``optimize`` (14).

Lessons write ``import course_utils as cu`` and use ``cu.<module>`` (``cu.timing``, ``cu.onnx_runtime``): every
module is reachable by its own name and loads on first use (``cu.plots`` imports matplotlib only when a lesson
plots), so processes that need little, such as lesson 13's server workers, start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_ROOMS = {
    "measuring": ("device", "timing", "memory"),
    "show": ("plots", "results", "leaderboard"),
    "check": ("compare", "exercises", "lesson_exercises", "streamcheck", "standins"),
    "supply": ("models", "data", "llm", "paths", "modes", "lesson", "errors"),
    "serve": ("server_process", "server_guard", "load_generator"),
    "techniques": ("onnx_runtime", "tensorrt_engines", "profiling", "batching_sim", "pipeline", "precision",
                   "quantization", "compilation", "pruning", "triton_server", "optimize", "optimizing"),
}  # fmt: skip
#: cu.<name> -> the module's full name
_MODULES = {name: f"{__name__}.{room}.{name}" for room, names in _ROOMS.items() for name in names}
# Shortcuts for the most used functions: cu.measure, cu.record, ...
_SHORTCUTS = {
    "check_outputs": "compare", "compare_outputs": "compare", "pick_device": "device", "gpu_section": "modes",
    "is_smoke": "modes", "pick": "modes", "record": "results", "measure": "timing",
}  # fmt: skip

__all__ = sorted(set(_MODULES) | set(_SHORTCUTS) | set(_ROOMS))


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if name in _ROOMS:
        return importlib.import_module(f".{name}", __name__)
    if name in _SHORTCUTS:
        return getattr(importlib.import_module(_MODULES[_SHORTCUTS[name]]), name)
    raise AttributeError(f"module 'course_utils' has no attribute '{name}'")


def __dir__() -> list[str]:
    return __all__
