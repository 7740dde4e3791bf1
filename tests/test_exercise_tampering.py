"""An answer is code the check runs: it must not be able to change what later checks run, nor put numbers of its
own on the leaderboard. The registry keeps each exercise as registered (replacing its entry, its checker, or its
checker's code changes nothing the next check runs), and rows recorded while a check runs are marked and kept off
the board. It stays a self-check, not an exam: code that patches the check machinery itself can still fool it."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from course_checks import exercises
from course_utils.show import leaderboard, results

KEY = "tamper.double"


def _checker(fn):
    for n in (3, 7, 11):
        got = fn(n)
        assert got == 2 * n, f"double({n}) should be {2 * n}, got {got}"


@pytest.fixture
def double():
    @exercises.exercise(KEY, "Return twice n.", _checker, time_limit=10)
    def solution(n):
        return 2 * n

    yield KEY
    exercises._REGISTRY.pop(KEY, None)


def _pass_all(fn):
    return None


def _tamper_entry():
    exercises._REGISTRY[KEY] = dataclasses.replace(exercises._REGISTRY[KEY], checker=_pass_all)


def _tamper_object():
    exercises._REGISTRY[KEY].checker = _pass_all


def _tamper_code():
    _checker.__code__ = _pass_all.__code__


def _tamper_registration():
    exercises.exercise(KEY, "Return twice n.", _pass_all)(lambda n: 2 * n)


def _verdicts(out: str) -> list[str]:
    return [line for line in out.splitlines() if line[:1] in {"✓", "✗", "✎"}]


@pytest.mark.parametrize("tamper", [_tamper_entry, _tamper_object, _tamper_code, _tamper_registration])
def test_an_answer_that_replaces_the_checker_does_not_make_the_next_wrong_answer_pass(double, capsys, tamper):
    code = _checker.__code__

    def sneaky(n):
        try:
            tamper()
        except Exception:  # noqa: BLE001 - a refused tampering is fine; the answer goes on
            pass
        return n  # wrong

    try:
        exercises.check(double, sneaky)
        exercises.check(double, lambda n: n + 1)  # the next wrong answer
        exercises.check(double, lambda n: 2 * n)  # and a right one still passes
        lines = _verdicts(capsys.readouterr().out)
        assert [line[0] for line in lines] == ["✗", "✗", "✓"], lines
        assert exercises.verdict(double, lambda n: n) != "accepted"
    finally:
        _checker.__code__ = code


def _cheat(n):
    results.record("14", "my answer", model="m", median_ms=0.001, speedup_vs_baseline=9999.0)
    worker = threading.Thread(target=results.record, args=("14", "from a thread"), kwargs={"median_ms": 0.002})
    worker.start()
    worker.join()
    return 2 * n


def test_rows_recorded_inside_a_check_are_marked_and_kept_off_the_leaderboard(double, capsys):
    results.record("14", "measured", model="m", median_ms=2.0, speedup_vs_baseline=1.5)
    exercises.check(double, _cheat)
    assert _verdicts(capsys.readouterr().out)[0].startswith("✓")
    results.record("14", "measured later", model="m", median_ms=2.5)
    rows = results.load_results()
    marked = rows[rows["technique"].isin(["my answer", "from a thread"])]
    assert len(marked) == 6 and marked["mode"].str.contains(f"inside exercise check {KEY}", regex=False).all()
    with pytest.warns(UserWarning, match=r"kept 6 row\(s\) .* off the board: recorded inside an exercise check"):
        board = leaderboard.load(include_reference=False)
    assert sorted(board["technique"]) == ["measured", "measured later"]
    assert set(board["mode"]) == {"smoke"}
