"""The GPU check's exit status through ``main()`` itself: 1 when a lesson never ran for want of time, 0 only when
every lesson ran to its end (or skipped for a missing package).

The lessons' runs are replaced by a stand-in (``run_lesson``: no lesson process starts); the budget decides which
lessons start. The script's own parts (its order, tables, scheduling) are tested in ``test_gpu_check.py``.
"""

from __future__ import annotations

import csv
import time

import pytest

from scripts import gpu_check

LESSONS = "01,04"  # two priority lessons, run in this order


def _main(tmp_path, monkeypatch, budget: float, outcome=("ok", 0.0, ""), pause_s: float = 0.0):
    """``main()`` on lessons 01 and 04 in rehearsal mode, each lesson's run replaced by ``outcome`` (after
    ``pause_s`` of real time): its exit status and lessons.csv's (lesson, status) rows."""
    ran = []

    def run_lesson(path, env, timeout_s, log):
        ran.append(path.name[:2])
        time.sleep(pause_s)
        return outcome

    monkeypatch.setattr(gpu_check, "run_lesson", run_lesson)
    out = tmp_path / "out"
    args = ["--allow-cpu", "--no-save", "--lessons", LESSONS, "--budget", str(budget), "--out", str(out)]
    code = gpu_check.main(args)
    with open(out / "lessons.csv", newline="") as fh:
        rows = [(r["lesson"], r["status"]) for r in csv.DictReader(fh)]
    return code, rows, ran


def test_no_lesson_run_for_want_of_time_exits_1(tmp_path, monkeypatch):
    code, rows, ran = _main(tmp_path, monkeypatch, budget=0)
    assert ran == [] and rows == [("01", "not run (budget)"), ("04", "not run (budget)")]
    assert code == 1


def test_a_lesson_left_without_time_after_another_ran_exits_1(tmp_path, monkeypatch):
    """20.5 s of budget: lesson 01 starts (20 s or more left), takes 0.6 s, and 04 then has under 20 s."""
    code, rows, ran = _main(tmp_path, monkeypatch, budget=20.5, pause_s=0.6)
    assert ran == ["01"] and rows == [("01", "ok"), ("04", "not run (budget)")]
    assert code == 1


@pytest.mark.parametrize(
    ("outcome", "want"),
    [
        (("ok", 0.0, ""), 0),
        (("skipped: missing tensorrt", 0.0, ""), 0),
        (("failed", 0.0, "x"), 1),
        (("timeout", 0.0, "x"), 1),
    ],  # fmt: skip
    ids=["ok", "skipped", "failed", "timeout"],
)
def test_every_lesson_run_exits_0_only_when_each_ended_or_skipped(tmp_path, monkeypatch, outcome, want):
    code, rows, ran = _main(tmp_path, monkeypatch, budget=600, outcome=outcome)
    assert ran == ["01", "04"] and [s for _, s in rows] == [outcome[0]] * 2
    assert code == want
