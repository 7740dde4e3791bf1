"""Every lesson's reference solution passes its own self-check; unsolved stubs are reported, not raised."""

import pytest

from course_utils import exercises

KEYS = sorted(exercises.registry())


def test_every_lesson_registers_exercises():
    lessons = {k.split(".")[0] for k in KEYS}
    assert {"00", "01"} <= lessons


@pytest.mark.parametrize("key", KEYS)
def test_reference_solution_passes(key):
    ex = exercises.get(key)
    ex.checker(ex.solution)


def test_check_prints_verdicts(capsys):
    def stub(*args):
        raise NotImplementedError

    exercises.check("01.intensity", stub)
    assert "not solved yet" in capsys.readouterr().out
    exercises.check("01.intensity", lambda n, b: 0.0)
    assert "not quite" in capsys.readouterr().out
    exercises.check("01.intensity", exercises.get("01.intensity").solution)
    assert "correct" in capsys.readouterr().out
    exercises.show_solution("01.intensity")
    assert "def matmul_intensity" in capsys.readouterr().out
    with pytest.raises(KeyError, match="known"):
        exercises.get("nope")


def test_verdict_names_the_reason_or_accepts():
    solution = exercises.get("01.intensity").solution
    assert exercises.verdict("01.intensity", solution) == "accepted"
    reason = exercises.verdict("01.intensity", lambda n, b: 0.0)
    assert reason != "accepted" and reason
