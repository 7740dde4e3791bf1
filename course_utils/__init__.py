"""Shared helpers of the GPU inference course, one module per room.

device (what this machine has) · timing (measure a callable correctly) · sweep (batch sizes, OOM) ·
plots · results (rows per machine) · compare (outputs vs baseline, tolerances) · models and data
(offline zoo, checksums) · modes (smoke, strict GPU, section record) · exercises · lesson (setup cell).
"""

from . import (
    compare,
    data,
    device,
    exercises,
    leaderboard,
    lesson,
    models,
    modes,
    optimize,
    plots,
    results,
    sweep,
    timing,
)
from .compare import check_outputs, compare_outputs
from .device import pick_device
from .modes import gpu_section, is_smoke, pick
from .results import record
from .timing import measure

__all__ = [
    "compare", "data", "device", "exercises", "lesson", "models", "modes", "plots", "results", "sweep", "timing",
    "check_outputs", "compare_outputs", "pick_device", "gpu_section", "is_smoke", "pick", "record", "measure",
]  # fmt: skip
