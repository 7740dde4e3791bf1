"""The exercise machinery: check() prints exactly one verdict, tells the placeholder from a NotImplementedError
raised inside torch, stops a hung answer (one that swallows the stop too), cuts huge messages, validates
COURSE_EXERCISE_SEED, and its ✓ line lists what the checker observed. Each reference solution runs in its lesson's
tests (tests/test_exercises_lNN.py), not again here."""

import random
import re
import threading
import time
from pathlib import Path

import pytest
import torch

from course_checks import exercises
from course_checks.lesson_exercises.observe import MATMUL_OPS, OpLog, cases, forbid

KEYS = sorted(exercises.registry())


def test_every_lesson_registers_exercises():
    lessons = {k.split(".")[0] for k in KEYS}
    assert {f"{n:02d}" for n in range(15)} <= lessons


def test_every_exercise_has_its_lessons_tests():
    """The reference and wrong answers of each exercise are tested in its lesson's file (not re-run here)."""
    tests = Path(__file__).resolve().parent
    missing = []
    for key in KEYS:
        path = tests / f"test_exercises_l{key[:2]}.py"
        if not path.exists() or key not in path.read_text():
            missing.append(key)
    assert not missing, f"exercises without tests in tests/test_exercises_lNN.py: {missing}"


def _double_checker(fn):
    with cases("test.double") as c:
        n = c.randint(2, 50)
        got = fn(n)
        assert got == 2 * n, f"double({n}) should be {2 * n}, got {got}"
        exercises.observed(f"double({n}) returned {got}")


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
        (lambda n: 2 * n, "✓", "passed its self-check (random cases of seed"),
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
    """A wait that burns no CPU is stopped by the wall bound (the limit x WALL_FACTOR), named as a wait."""

    def forever(n):
        while True:
            time.sleep(0.01)

    assert exercises.WALL_FACTOR == 5.0
    t0 = time.perf_counter()
    exercises.check(double_exercise, forever)
    assert 10 <= time.perf_counter() - t0 < 30
    (line,) = _verdict_lines(capsys.readouterr().out)
    cpu = float(re.search(r"stopped after 10 s of wall time in which your code used only ([0-9.]+) s of CPU", line)[1])
    assert line.startswith("✗") and cpu < 1, line  # 1,000 wake-ups from sleep(0.01)
    assert "it was waiting" in line and "a queue nobody fills" in line and "endless loop" not in line, line
    assert "it was waiting" in exercises.verdict(double_exercise, forever)


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
    tensors = []
    for _ in range(3):
        with cases("k") as c:
            tensors.append(c.randn(4))
    assert not torch.equal(tensors[0], tensors[1]) and not torch.equal(tensors[1], tensors[2]), "tensors change too"
    with cases("k") as c:
        assert c.randint(5, 5) == 5
    monkeypatch.setenv("COURSE_EXERCISE_SEED", "1234")
    with cases("k") as c:
        again = (c.randint(0, 10**9), c.randn(4))
    with cases("k") as c:
        assert c.randint(0, 10**9) == again[0] and torch.equal(c.randn(4), again[1]), "a fixed seed repeats the case"
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


def test_the_tick_line_lists_what_was_observed_and_the_seed(double_exercise, capsys, monkeypatch):
    monkeypatch.setenv("COURSE_EXERCISE_SEED", "77")
    exercises.check(double_exercise, lambda n: 2 * n)
    (line,) = _verdict_lines(capsys.readouterr().out)
    n = random.Random(77).randint(2, 50)
    want = f"✓  Exercise test.double: passed its self-check (random cases of seed 77). Observed: double({n}) returned"
    assert line == f"{want} {2 * n}."
    assert "correct" not in line and "proof" not in line


def _spin(n):
    while True:
        pass


def test_an_endless_loop_is_stopped_by_its_cpu_time(double_exercise, capsys, monkeypatch):
    monkeypatch.setattr(exercises, "WALL_FACTOR", 60.0)  # only the CPU limit can stop it, however busy the machine
    exercises.check(double_exercise, _spin)
    (line,) = _verdict_lines(capsys.readouterr().out)
    used = float(re.search(r"your code used ([0-9.]+) s of CPU \(limit 2 s\)", line).group(1))
    assert 2.0 <= used < 3.0 and "Look for an endless loop" in line and "waiting" not in line, line


def _swallow_exception(n):  # the commonest retry loop: it catches everything an Exception is
    while True:
        try:
            time.sleep(0.01)
        except Exception:
            pass


def _swallow_bare(n):  # a bare except catches the BaseException too: the stop must come again
    while True:
        try:
            time.sleep(0.01)
        except:  # noqa: E722
            pass


def _swallow_base_then_retry(n):
    while True:
        try:
            time.sleep(0.01)
        except BaseException:
            continue


@pytest.mark.parametrize("answer", [_swallow_exception, _swallow_bare, _swallow_base_then_retry])
def test_the_time_limit_survives_a_retry_loop_that_swallows_errors(double_exercise, capsys, answer, monkeypatch):
    monkeypatch.setattr(exercises, "WALL_FACTOR", 1.5)  # these sleep: the wall bound stops them, 3 s in
    t0 = time.perf_counter()
    exercises.check(double_exercise, answer)
    assert time.perf_counter() - t0 < 10
    (line,) = _verdict_lines(capsys.readouterr().out)
    assert line.startswith("✗") and "stopped after 3 s of wall time" in line, line
    if answer is not _swallow_exception:
        assert "caught the stop and went on" in line, line
    assert issubclass(exercises.ExerciseTimeout, BaseException)
    assert not issubclass(exercises.ExerciseTimeout, Exception)
    import sys

    assert sys.gettrace() is None or "again" not in getattr(sys.gettrace(), "__name__", ""), "the trace is removed"
    assert exercises.verdict(double_exercise, lambda n: 2 * n) == "accepted", "the timer is disarmed afterwards"


@pytest.mark.parametrize(
    "value, reason",
    [
        ("abc", "is not a whole number"),
        ("1e3", "is not a whole number"),
        ("3.5", "is not a whole number"),
        ("-5", "is negative"),
        ("99999999999999999999999", "is out of range"),
        (str(2**32), "is out of range"),
    ],
)
def test_a_bad_seed_is_named_not_blamed_on_the_learner(double_exercise, capsys, monkeypatch, value, reason):
    monkeypatch.setenv("COURSE_EXERCISE_SEED", value)
    exercises.check(double_exercise, lambda n: 2 * n)
    (line,) = _verdict_lines(capsys.readouterr().out)
    assert line.startswith("✗") and "not checked" in line and reason in line and "your code" not in line, line
    assert "a whole number from 0 to 4294967295" in line and "unset it" in line
    with pytest.raises(exercises.SeedError, match=re.escape(reason)):
        exercises.verdict(double_exercise, lambda n: 2 * n)


@pytest.mark.parametrize("value, seed", [(" 12 ", 12), ("0", 0), (str(2**32 - 1), 2**32 - 1), ("", None)])
def test_good_seeds_are_used(monkeypatch, value, seed):
    monkeypatch.setenv("COURSE_EXERCISE_SEED", value)
    assert exercises.fixed_seed() == seed
    with cases("k") as c:
        assert seed is None or c.seed == seed


def test_a_seed_given_to_verdict_wins(double_exercise, monkeypatch):
    monkeypatch.setenv("COURSE_EXERCISE_SEED", "5")
    seen = []
    exercises.verdict(double_exercise, lambda n: seen.append(n) or 2 * n, seed=9)
    n9 = random.Random(9).randint(2, 50)
    assert seen == [n9]


# ---- the limit counts the learner's code: a busy machine, the checker's own set-up, imports ---------------------
def _busy_clocks(stretch, queue_known=True):
    """A test double of the limit's clocks: a machine so busy that wall time runs ``stretch`` x real time (almost
    all of it waiting for a free CPU, when known), while the main thread's CPU time is the real one."""
    real = exercises._clocks
    t0 = time.monotonic()

    def clocks():
        cpu, wall, _ = real()
        fake_wall = t0 + (wall - t0) * stretch
        return cpu, fake_wall, (fake_wall - t0 - cpu if queue_known else None)

    return clocks


def _slow_double(n):
    time.sleep(0.3)  # 3 s of the busy machine's wall time, past the 1 s limit, no CPU
    return 2 * n


@pytest.fixture
def one_second_double():
    @exercises.exercise("test.double1", "Return twice n.", _double_checker, time_limit=1)
    def double(n):
        return 2 * n

    yield "test.double1"
    exercises._REGISTRY.pop("test.double1", None)


def test_a_correct_answer_on_a_busy_machine_is_accepted(one_second_double, monkeypatch):
    monkeypatch.setattr(exercises, "_clocks", _busy_clocks(10))
    assert exercises.verdict(one_second_double, _slow_double) == "accepted"


@pytest.mark.parametrize("queue_known", [True, False])
def test_a_machine_too_busy_to_finish_is_named_not_blamed_on_the_code(one_second_double, monkeypatch, queue_known):
    monkeypatch.setattr(exercises, "_clocks", _busy_clocks(40, queue_known))
    got = exercises.verdict(one_second_double, lambda n: time.sleep(2) or 2 * n)
    wall, cpu = (float(v) for v in re.search(r"([0-9.]+) s of wall time.* only ([0-9.]+) s of CPU", got).groups())
    assert 5 <= wall <= 80 and 0 <= cpu < 0.5, got  # past the 5 s bound (looks come at real seconds)
    if queue_known:
        assert got.startswith(f"this machine is busy: {wall:.0f} s of wall time, only {cpu:.1f} s of CPU"), got
        assert "waiting for a free CPU" in got and "run the cell again when the machine is quieter" in got, got
        assert "endless loop" not in got and "it was waiting" not in got, got
    else:  # no schedstat (macOS): a wait and a busy machine cannot be told apart, and the message says both
        assert "it was waiting" in got and "if this machine is busy (load average" in got, got


def _untimed_checker(fn):
    with exercises.untimed():  # the checker's own set-up: 1.5 s of CPU and 1 s of waiting, past the 1 s limit
        t0 = time.thread_time()
        while time.thread_time() - t0 < 1.5:
            pass
        with exercises.untimed():  # nested
            time.sleep(1.0)
    worker = threading.Thread(target=_untimed_from_a_thread)
    worker.start()
    worker.join()
    assert fn(3) == 6


def _untimed_from_a_thread():
    with exercises.untimed():
        time.sleep(6)  # the main thread waits for it: past the 5 s wall bound, paused all along


@pytest.fixture
def untimed_exercise():
    @exercises.exercise("test.untimed", "Return twice n.", _untimed_checker, time_limit=1)
    def double(n):
        return 2 * n

    yield "test.untimed"
    exercises._REGISTRY.pop("test.untimed", None)


def test_the_checkers_own_set_up_is_not_counted(untimed_exercise, monkeypatch):
    monkeypatch.setattr(exercises, "WALL_FACTOR", 60.0)  # only the CPU limit stops the spin, however busy the machine
    assert exercises.verdict(untimed_exercise, _slow_double) == "accepted"  # looked at while it sleeps
    assert "used 1." in exercises.verdict(untimed_exercise, _spin), "the learner's code is still timed"
    with exercises.untimed():  # outside a check it does nothing
        pass


def test_untimed_work_is_still_bounded(untimed_exercise, monkeypatch):
    monkeypatch.setattr(exercises, "UNTIMED_MAX_S", 0.5)
    got = exercises.verdict(untimed_exercise, lambda n: 2 * n)
    assert "own set-up (imports, helper processes) ran" in got and "not counted against your code" in got, got


SLOW_MODULE = """
import time
_t0 = time.thread_time()
while time.thread_time() - _t0 < 1.5:  # a slow first import (sympy's on a busy machine), in CPU time
    pass
DONE = True
"""


def test_a_stop_never_lands_inside_an_import(one_second_double, tmp_path, monkeypatch):
    """The stop comes while a (slow) import runs: it waits for the import to end, then stops the code; the module
    is complete, and the next check in the same process gives its normal verdict."""
    import importlib
    import sys

    name = f"slow_pkg_{tmp_path.name.replace('-', '_')}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("from . import heavy\nPARENT_DONE = True\n")
    (tmp_path / name / "heavy.py").write_text(SLOW_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(exercises, "WALL_FACTOR", 60.0)

    def imports_then_spins(n):
        importlib.import_module(name)
        while True:
            pass

    try:
        got = exercises.verdict(one_second_double, imports_then_spins)
        used = float(re.search(r"your code used ([0-9.]+) s of CPU", got).group(1))
        assert used >= 1.5, got  # stopped only once the import's 1.5 s of CPU were done
        pkg = sys.modules[name]
        assert pkg.PARENT_DONE and pkg.heavy.DONE and sys.modules[f"{name}.heavy"] is pkg.heavy
        assert exercises.verdict(one_second_double, lambda n: importlib.import_module(name).heavy.DONE * 2 * n) == (
            "accepted"
        )
    finally:
        for mod in (name, f"{name}.heavy"):
            sys.modules.pop(mod, None)


def test_warm_imports_run_before_the_clock(monkeypatch, tmp_path):
    import sys

    name = f"slow_warm_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(SLOW_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))

    @exercises.exercise("test.warm", "Return twice n.", _double_checker, time_limit=1, imports=(name,))
    def double(n):
        return 2 * n

    try:
        assert exercises.verdict("test.warm", lambda n: sys.modules[name].DONE * 2 * n) == "accepted"
        assert exercises.get("test.warm").imports == (name,) and "torch._dynamo" in exercises.WARM_IMPORTS
    finally:
        exercises._REGISTRY.pop("test.warm", None)
        sys.modules.pop(name, None)


def test_a_queue_nobody_fills_is_stopped_as_a_wait(one_second_double, monkeypatch):
    import queue

    monkeypatch.setattr(exercises, "WALL_FACTOR", 2.0)
    t0 = time.perf_counter()
    got = exercises.verdict(one_second_double, lambda n: queue.Queue().get())
    assert 2 <= time.perf_counter() - t0 < 15, got
    cpu = float(re.match(r"stopped after 2 s of wall time in which your code used only ([0-9.]+) s of CPU", got)[1])
    assert cpu < 0.3, got
    assert "it was waiting" in got and "a queue nobody fills" in got, got
