"""The few lines every notebook starts with: seeds, the device, the modes, and where results go."""

from __future__ import annotations

import random

import numpy as np
import torch

from course_utils.measuring.device import describe, pick_device
from course_utils.sections.gpu_sections import begin_lesson
from course_utils.show.results import results_dir
from course_utils.supply.modes import is_smoke, is_strict_gpu


def start(lesson: str, title: str, *, seed: int = 0) -> torch.device:
    """Seed every generator, print the machine and modes, and return the device the lesson uses."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    begin_lesson()  # COURSE_REHEARSE_SCOPE=lesson: the rehearsal's stand-ins from the first cell
    dev = pick_device()
    mode = "smoke sizes (COURSE_SMOKE=1)" if is_smoke() else "full sizes"
    strict = ", strict GPU mode" if is_strict_gpu() else ""
    print(f"Lesson {lesson}: {title}")
    print(f"Device: {dev} | {describe()} | torch {torch.__version__} | {mode}{strict}")
    print(f"Results are written to {results_dir()}")
    return dev
