"""Checks on a whole smoke run of the notebooks (make test runs these after nbmake, on the run's results folder)."""

import os

import pytest

from course_utils import modes, results

pytestmark = pytest.mark.skipif(not os.environ.get("COURSE_AFTER_RUN"), reason="runs after the notebooks (make test)")


def test_cpu_run_skipped_only_gpu_only_sections():
    rows = modes.read_sections()
    assert rows, "no section record: did the notebooks run with this COURSE_RESULTS_DIR?"
    wrong = [r for r in rows if not r["ran"] and r["kind"] not in {"gpu", "opt-in"}]
    assert not wrong, f"sections skipped that are not GPU-only or opt-in: {wrong}"
    import torch

    if not torch.cuda.is_available():
        assert all(not r["ran"] for r in rows if r["kind"] == "gpu"), "a GPU section claims to have run on CPU"


def test_every_notebook_wrote_result_rows():
    df = results.load_results()
    notebooks = sorted(p.stem[:2] for p in (results.REPO_ROOT / "notebooks").glob("*.ipynb"))
    missing = sorted(set(notebooks) - set(df["lesson"].astype(str)))
    assert not missing, f"lessons that wrote no result rows: {missing}"
    assert (df["mode"] == "smoke").all()
