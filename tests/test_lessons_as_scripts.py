"""Every lesson also runs as a plain Python script (its jupytext text copy), in smoke mode, in rehearsal mode.

That catches what a notebook hides: names only IPython defines (``display``), cells that rely on being run
out of order, magics. Scripts use matplotlib's agg backend; kernels keep the inline one.

The scripts run cell by cell (``scripts/run_cells.py``) with ``COURSE_REHEARSE=1``: on this CPU machine every
GPU-only section's body executes on the checked stand-ins of ``course_utils.check.standins.rehearsal`` (placement,
stream
order, CUDA-graph capture rules, TensorRT pointers, ORT provider options). A section that breaks a rule fails its
lesson; one that needs what no stand-in offers is recorded "not rehearsable" with the reason. The section rows
go to ``$COURSE_RESULTS_DIR/sections-rehearsal.jsonl`` of the run (``make test``), from which
``scripts/gpu_levels.py`` builds README's table (checked after the run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_utils.supply.paths import append_text

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))
RUN_RESULTS = os.environ.get("COURSE_RESULTS_DIR")  # read before conftest isolates each test's results folder


def test_every_lesson_is_found():
    assert len(LESSONS) >= 15


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs_as_a_script(lesson, tmp_path):
    env = dict(os.environ, COURSE_SMOKE="1", MPLBACKEND="agg", PYTHONPATH=str(ROOT), COURSE_REHEARSE="1")
    env["COURSE_RESULTS_DIR"] = str(tmp_path / "results")
    env.pop("COURSE_STRICT_GPU", None)
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.run_cells", lesson.name],
        cwd=lesson.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    record = tmp_path / "results" / "sections.jsonl"
    rows = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    if RUN_RESULTS:
        shared = Path(RUN_RESULTS).expanduser() / "sections-rehearsal.jsonl"
        append_text(shared, "".join(json.dumps(r) + "\n" for r in rows if r.get("mode") == "rehearsal"))
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
    assert proc.returncode == 0, f"{lesson.name} failed as a script (rehearsal mode):\n{tail}"
    entered = [r["section"] for r in rows if r.get("status") == "entered"]
    decided = {r["section"] for r in rows if r.get("status") in {"completed", "failed", "not-rehearsable"}}
    assert set(entered) <= decided, f"sections entered but never decided: {sorted(set(entered) - decided)}"
