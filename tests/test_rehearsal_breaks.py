"""A known GPU break re-planted into a lesson makes its rehearsal fail with CUDA's own message.

Issue 20's break in lesson 10: the CPU-resident ``tiny_cnn`` fed the stream code's tensors on ``device``. On a
CPU the lesson's ``device`` is "cpu" and nothing shows; in whole-lesson rehearsal (``COURSE_REHEARSE_SCOPE=lesson``:
``pick_device()`` gives the stand-in "cuda" from the first cell, as on a GPU machine) the stand-in's placement
check fails the cell. The lesson is cut after the planted cell to keep the test short. (The other breaks'
messages are in the issue's notes; lesson 08's runner with a ``wait_stream`` removed is in
``tests/gpu_contract/test_l08_tensorrt.py``.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scripts import run_cells

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = "tiny_dev = copy.deepcopy(tiny).to(device)"
PLANTED = "tiny_dev = tiny"


def _cut_after(text: str, needle: str) -> str:
    """The lesson up to and including the cell that contains ``needle``."""
    cells = run_cells.cells(text)
    last = next(i for i, (_, src) in enumerate(cells) if needle in src)
    return "".join(src for _, src in cells[: last + 1])


def _rehearse(source: str, tmp_path: Path) -> subprocess.CompletedProcess:
    lesson = tmp_path / "lessons" / "10_streams.py"
    lesson.parent.mkdir()
    lesson.write_text(source)
    env = dict(
        os.environ,
        COURSE_SMOKE="1",
        COURSE_REHEARSE="1",
        COURSE_REHEARSE_SCOPE="lesson",
        MPLBACKEND="agg",
        PYTHONPATH=str(ROOT),
        COURSE_RESULTS_DIR=str(tmp_path / "results"),
    )
    env.pop("COURSE_STRICT_GPU", None)
    return subprocess.run(
        [sys.executable, "-m", "scripts.run_cells", lesson.name],
        cwd=lesson.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the rehearsal stands in for a missing GPU")
def test_cpu_model_fed_cuda_tensors_fails_the_rehearsal(tmp_path):
    text = (ROOT / "lessons" / "10_streams.py").read_text()
    assert text.count(SHIPPED) == 1, f"lesson 10 changed: '{SHIPPED}' should occur once"
    proc = _rehearse(_cut_after(text, SHIPPED).replace(SHIPPED, PLANTED), tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-2000:]
    assert "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu" in out
