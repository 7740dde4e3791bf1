"""scripts/run_course.py on a tiny folder: one trivial notebook that runs, one that fails."""

from __future__ import annotations

import json

import nbformat
import pandas as pd

from course_utils.show.results import COLUMNS
from scripts import run_course

OK_CELL = """
import json, os, pathlib
res = pathlib.Path(os.environ["COURSE_RESULTS_DIR"])
with open(res / "sections.jsonl", "a") as fh:
    fh.write(json.dumps({"section": "98.gpu-thing", "ran": False, "reason": "no CUDA GPU", "kind": "gpu"}) + "\\n")
print("hello from", os.environ.get("COURSE_SMOKE", "full"))
"""


def _notebook(path, source: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# tiny"), nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_run_course_reports_ok_failed_skipped_and_leaderboard(tmp_path, monkeypatch, capsys):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "98_tiny.ipynb", OK_CELL)
    _notebook(nbs / "99_broken.ipynb", "raise ValueError('deliberately broken')")
    out = tmp_path / "out"
    results = tmp_path / "results"
    results.mkdir()
    row = {c: None for c in COLUMNS}
    row.update(
        lesson="14",
        technique="baseline",
        median_ms=1.5,
        machine="tiny_cpu",
        cpu="Tiny CPU",
        mode="full",
        time="2026-11-01T00:00:00",
    )
    pd.DataFrame([row], columns=COLUMNS).to_csv(results / "tiny_cpu.csv", index=False)
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(results))

    rc = run_course.main(["--notebooks", str(nbs), "--out", str(out), "--timeout", "120"])
    printed = capsys.readouterr().out

    assert rc == 1, "a failed notebook must make the exit code non-zero"
    assert (out / "98_tiny.ipynb").exists() and (out / "98_tiny.html").exists() and (out / "99_broken.html").exists()
    executed = nbformat.read(out / "98_tiny.ipynb", as_version=4)
    assert "hello from" in json.dumps(executed.cells[1].outputs)
    summary = {r["name"]: r for r in json.loads((out / "summary.json").read_text())}
    assert summary["98_tiny"]["status"] == "ok" and summary["99_broken"]["status"] == "failed"
    assert "deliberately broken" in summary["99_broken"]["error"]
    assert summary["98_tiny"]["sections"][0]["section"] == "98.gpu-thing"
    assert "skipped 98.gpu-thing (gpu): no CUDA GPU" in printed
    index = (out / "index.html").read_text()
    assert "Leaderboard" in index and "Tiny CPU" in index and "99_broken" in index and "failed" in index


def test_no_matching_notebooks(tmp_path):
    assert run_course.main(["--notebooks", str(tmp_path), "--out", str(tmp_path / "o")]) == 2


PLOT_CELL = """
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9])
plt.show()
"""


def test_executed_notebooks_keep_their_plots(tmp_path, monkeypatch):
    """Kernels keep Jupyter's inline backend: an executed notebook that plots holds an image output."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "97_plot.ipynb", PLOT_CELL)
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("MPLBACKEND", "agg")  # as a caller's environment might have it: must not reach kernels
    assert run_course.main(["--notebooks", str(nbs), "--out", str(tmp_path / "out"), "--timeout", "120"]) == 0
    executed = nbformat.read(tmp_path / "out" / "97_plot.ipynb", as_version=4)
    assert run_course.count_figures(executed) == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary[0]["figures"] == 1
