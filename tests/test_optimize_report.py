"""optimize()'s report read on a hand-built case with known answers: which techniques pay (by their interval's low
end, within the accuracy budget, best first), the best-so-far line, and the guide's first advice."""

from __future__ import annotations

from course_utils.capstone.optimizing.report import OptimizeReport, Step, cumulative_speedup, decision_guide
from course_utils.measuring.intervals import Ratio


def _timed(name: str, speedup: float, interval: tuple[float, float] | None, *, within: bool = True) -> Step:
    """A step that ran: its speed-up, with a cu.compare interval (low, high) or none."""
    ratio = None if interval is None else Ratio(name, "baseline", estimate=speedup, low=interval[0],
                                                high=interval[1], rounds=[])  # fmt: skip
    return Step(name, True, median_ms=10.0 / speedup, speedup=speedup, accuracy=0.95 if within else 0.80,
                within_budget=within, ratio=ratio)  # fmt: skip


def _report() -> OptimizeReport:
    steps = [
        _timed("baseline", 1.0, None),
        _timed("compile", 2.0, (1.8, 2.2)),
        _timed("noisy", 1.5, (1.01, 2.0)),  # its interval reaches down to 1.01: faster, not shown to pay 1.05x
        _timed("maybe", 1.1, (0.9, 1.3)),  # its interval holds 1: not shown faster at all
        _timed("int8", 3.0, (2.8, 3.2), within=False),  # the fastest, but outside the accuracy budget
        _timed("channels_last", 1.2, None),  # a plain number, no interval
        Step("tensorrt", False, reason="no CUDA here"),
    ]
    return OptimizeReport(steps, "cpu", baseline_accuracy=0.95, accuracy_budget=0.01, example_batch=8, threads=2)


def test_paying_counts_the_low_end_within_the_budget_best_first():
    report = _report()
    assert list(report.paying()["technique"]) == ["compile", "channels_last"]
    assert list(report.paying(min_gain=1.0)["technique"]) == ["compile", "noisy", "channels_last"]
    assert list(report.paying(min_gain=0.9)["technique"]) == ["compile", "noisy", "channels_last", "maybe"]


def test_best_so_far_skips_what_is_outside_the_budget():
    assert list(cumulative_speedup(_report().df)) == [1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]


def test_the_guide_names_the_best_paying_technique_first():
    lines = decision_guide(_report()).splitlines()
    assert lines[1].startswith("On this machine, try compile first: 2.00x (95% CI 1.80-2.20)")
    assert lines[2].startswith("  then channels_last: 1.20x")
    assert "Does not pay here: noisy is faster than the baseline, but not shown 1.05x it (1.50x" in lines[3]
    assert "Does not pay here: maybe is not shown faster than the baseline (no difference" in lines[4]
    assert any(line.startswith("Outside the budget: int8") for line in lines)
    assert lines[-1] == "Skipped: tensorrt: no CUDA here"
