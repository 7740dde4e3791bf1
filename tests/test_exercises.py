"""The exercise machinery: every reference solution passes its own checker; check() prints exactly one verdict,
tells the placeholder from a NotImplementedError raised inside torch, stops a hung answer, cuts huge messages."""

import time

import pytest
import torch

from course_utils.check import exercises
from course_utils.check.lesson_exercises.observe import MATMUL_OPS, OpLog, cases, forbid

KEYS = sorted(exercises.registry())


def test_every_lesson_registers_exercises():
    lessons = {k.split(".")[0] for k in KEYS}
    assert {f"{n:02d}" for n in range(15)} <= lessons


@pytest.mark.parametrize("key", KEYS)
def test_reference_solution_passes(key):
    ex = exercises.get(key)
    ex.checker(ex.solution)


def _double_checker(fn):
    with cases("test.double") as c:
        n = c.randint(2, 50)
        assert fn(n) == 2 * n, f"double({n}) should be {2 * n}, got {fn(n)}"


@pytest.fixture
def double_exercise():
    @exercises.exercise("test.double", "Return twice n.", _double_checker, time_limit=2)
    def double(n):
        return 2 * n

    yield "test.double"
    exercises._REGISTRY.pop("test.double", None)


def _verdict_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line[:1] in {"✓", "✗", "✎"}]


def test_check_prints_exactly_one_verdict(double_exercise, capsys):
    def stub(n):
        raise NotImplementedError

    for answer, mark, words in [
        (stub, "✎", "not solved yet"),
        (lambda n: n, "✗", "not quite"),
        (lambda n: 2 * n, "✓", "correct"),
    ]:
        exercises.check(double_exercise, answer)
        lines = _verdict_lines(capsys.readouterr().out)
        assert len(lines) == 1 and lines[0].startswith(mark) and words in lines[0], lines
    exercises.show_solution(double_exercise)
    assert "def double" in capsys.readouterr().out
    with pytest.raises(KeyError, match="known"):
        exercises.get("nope")


def test_a_not_implemented_error_from_inside_torch_is_shown_not_hidden(double_exercise, capsys):
    class Net(torch.nn.Module):
        def foward(self, x):  # the typo: nn.Module's own forward placeholder raises NotImplementedError
            return 2 * x

    def deep(n):
        return Net()(torch.tensor(n))

    exercises.check(double_exercise, deep)
    (line,) = _verdict_lines(capsys.readouterr().out)
    assert line.startswith("✗") and "NotImplementedError" in line and "not the exercise's placeholder" in line


def test_other_errors_of_the_learner_are_one_line_with_the_place(double_exercise, capsys):
    def typo(n):
        return n.foward()

    exercises.check(double_exercise, typo)
    (line,) = _verdict_lines(capsys.readouterr().out)
    assert "AttributeError" in line and "test_exercises.py" in line and "typo()" in line


def test_a_hung_answer_is_stopped_by_the_time_limit(double_exercise, capsys):
    def forever(n):
        while True:
            time.sleep(0.01)

    t0 = time.perf_counter()
    exercises.check(double_exercise, forever)
    assert time.perf_counter() - t0 < 10
    (line,) = _verdict_lines(capsys.readouterr().out)
    assert line.startswith("✗") and "stopped after 2 s" in line
    assert "stopped after" in exercises.verdict(double_exercise, forever)


def test_a_huge_message_is_cut(double_exercise, capsys):
    big = "x" * 5_000_000
    exercises.check(double_exercise, lambda n: big)
    out = capsys.readouterr().out
    assert len(out) < exercises.MAX_MESSAGE + 500 and "more characters not shown" in out


def test_random_cases_change_per_call_and_print_their_seed(double_exercise, monkeypatch):
    seen = set()
    for _ in range(5):
        with cases("k") as c:
            seen.add(c.randint(0, 10**9))
    assert len(seen) > 1
    monkeypatch.setenv("COURSE_EXERCISE_SEED", "1234")
    with pytest.raises(AssertionError, match=r"seed 1234"):
        with cases("k"):
            raise AssertionError("wrong")
    table = {n: 2 * n for n in range(2, 10)}  # a table of answers for a few cases
    monkeypatch.delenv("COURSE_EXERCISE_SEED")
    reasons = {exercises.verdict(double_exercise, lambda n: table.get(n, 0)) for _ in range(5)}
    assert any("should be" in r for r in reasons)


def test_oplog_sees_dtypes_weights_and_not_other_threads():
    import threading

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    with OpLog(watch=model) as log, torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    mm = log.named(*MATMUL_OPS)
    assert len(mm) == 2 and all(op.out_dtypes == (torch.bfloat16,) for op in mm)
    assert log.watched_read() == {"0.weight", "0.bias", "2.weight", "2.bias"}
    with OpLog(watch=model) as log2:
        worker = threading.Thread(target=lambda: model(x))
        worker.start()
        worker.join()
    assert log2.ops == []


def test_forbid_restores_what_it_replaced():
    with forbid(item=(torch.Tensor, "no .item() in the timed loop")), pytest.raises(AssertionError, match="timed"):
        torch.ones(1).item()
    assert torch.ones(1).item() == 1.0
