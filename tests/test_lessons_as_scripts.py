"""Every lesson also runs as a plain Python script (its jupytext text copy), in smoke mode.

That catches what a notebook hides: names only IPython defines (``display``), cells that rely on being run
out of order, magics. Scripts use matplotlib's agg backend; kernels keep the inline one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))


def test_every_lesson_is_found():
    assert len(LESSONS) >= 15


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs_as_a_script(lesson, tmp_path):
    env = dict(os.environ, COURSE_SMOKE="1", MPLBACKEND="agg", PYTHONPATH=str(ROOT))
    env.setdefault("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    env.pop("COURSE_STRICT_GPU", None)
    proc = subprocess.run(
        [sys.executable, lesson.name], cwd=lesson.parent, env=env, capture_output=True, text=True, timeout=900
    )
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
    assert proc.returncode == 0, f"{lesson.name} failed as a script:\n{tail}"
