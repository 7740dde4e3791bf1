"""Checks on a whole smoke run (make test runs these after nbmake and the script runs, on the run's results folder)."""

import os

import pytest

from course_utils.show import results
from course_utils.supply import modes
from scripts import gpu_levels

pytestmark = pytest.mark.skipif(not os.environ.get("COURSE_AFTER_RUN"), reason="runs after the notebooks (make test)")


def test_cpu_run_skipped_only_gpu_only_sections():
    rows = modes.read_sections()
    assert rows, "no section record: did the notebooks run with this COURSE_RESULTS_DIR?"
    wrong = [r for r in rows if not r["ran"] and r["kind"] not in {"gpu", "opt-in"}]
    assert not wrong, f"sections skipped that are not GPU-only or opt-in: {wrong}"
    import torch

    if not torch.cuda.is_available():
        claims = [r for r in rows if r["kind"] == "gpu" and r["ran"] and r.get("mode") != "rehearsal"]
        assert not claims, f"a GPU section claims to have run on this CPU machine: {claims}"


def test_every_notebook_wrote_result_rows():
    df = results.load_results()
    notebooks = sorted(p.stem[:2] for p in (results.REPO_ROOT / "notebooks").glob("*.ipynb"))
    missing = sorted(set(notebooks) - set(df["lesson"].astype(str)))
    assert not missing, f"lessons that wrote no result rows: {missing}"
    assert (df["mode"] == "smoke").all()


def _records():
    folder = results.results_dir()
    if not (folder / "sections-rehearsal.jsonl").exists():
        pytest.skip("no rehearsal records in this run (tests/test_lessons_as_scripts.py did not run)")
    return folder


def test_readme_levels_table_is_generated_from_this_run():
    folder = _records()
    readme = (gpu_levels.ROOT / "README.md").read_text()
    fresh = gpu_levels.render_readme(readme, gpu_levels.levels(records=folder))
    assert fresh == readme, (
        "README's GPU verification table differs from this run's records: run "
        f"`python -m scripts.gpu_levels --write --records {folder}` (after a full `make test`) and review the change"
    )


def test_every_gpu_section_has_a_level_with_a_reason():
    rows = gpu_levels.levels(records=_records())
    bare = [r.section for r in rows if r.detail == "no run record and no contract test names it"]
    assert not bare, f"GPU sections with no rehearsal record, no contract test and no reason: {bare}"
