"""Unit tests run in smoke mode, each with its own empty results folder."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("COURSE_SMOKE", "1")
os.environ.setdefault("MPLBACKEND", "agg")


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path, monkeypatch):
    if os.environ.get("COURSE_AFTER_RUN"):
        return  # the after-run checks read the run's results folder
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.delenv("COURSE_STRICT_GPU", raising=False)
