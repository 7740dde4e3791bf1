"""Unit tests run in smoke mode, each with its own empty results folder."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("COURSE_SMOKE", "1")
# No MPLBACKEND here: nbmake's kernels inherit this environment and must keep Jupyter's inline backend (agg
# would drop every figure). Unit tests plot headless anyway (matplotlib picks agg without a display).


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path, monkeypatch):
    if os.environ.get("COURSE_AFTER_RUN"):
        return  # the after-run checks read the run's results folder
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.delenv("COURSE_STRICT_GPU", raising=False)


@pytest.fixture
def gpu():
    """The rehearsal's stand-in GPU for one test: ``torch.cuda`` while it is active, switched off afterwards."""
    import torch

    from fakegpu.standins import rehearsal

    rehearsal.activate()
    try:
        yield torch.cuda
    finally:
        rehearsal.deactivate()
