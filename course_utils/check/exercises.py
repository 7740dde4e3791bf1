"""Exercises shared by all lessons: a self-check the learner calls, and reference solutions the tests run.

A lesson's exercise is a function the learner completes (it starts as ``raise NotImplementedError``).
``check("03.knee", my_knee)`` runs the exercise's checker against the learner's function and prints a
verdict; an unsolved exercise prints "not solved yet" instead of failing, so the shipped notebook runs
top to bottom. ``show_solution("03.knee")`` prints the reference solution. Each lesson registers its
exercises in ``course_utils/check/lesson_exercises/lNN.py``; ``tests/test_exercises.py`` runs every reference
solution through its checker.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import pkgutil
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Seconds a checker may run before it is stopped (a learner's infinite loop or deadlocked DataLoader).
DEFAULT_TIME_LIMIT = 180.0
#: Longest verdict message printed: a checker that quotes a huge answer is cut, not dumped.
MAX_MESSAGE = 1500
_PACKAGE = Path(__file__).resolve().parents[1]  # course_utils/: frames in it are the course's


@dataclass
class Exercise:
    """One exercise: its key (``"NN.slug"``), a checker that raises AssertionError, a reference solution."""

    key: str
    prompt: str
    checker: Callable[[Callable[..., Any]], None]
    solution: Callable[..., Any]
    time_limit: float = DEFAULT_TIME_LIMIT


_REGISTRY: dict[str, Exercise] = {}


def exercise(
    key: str, prompt: str, checker: Callable[[Callable[..., Any]], None], *, time_limit: float = DEFAULT_TIME_LIMIT
):
    """Decorator: register the decorated function as the reference solution of exercise ``key``.

    ``time_limit`` (seconds) bounds one run of the checker on a learner's answer.
    """

    def wrap(solution: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY[key] = Exercise(key, prompt, checker, solution, time_limit)
        return solution

    return wrap


def _load_all() -> None:
    from course_utils.check import lesson_exercises

    for mod in pkgutil.iter_modules(lesson_exercises.__path__):
        importlib.import_module(f"{lesson_exercises.__name__}.{mod.name}")


def registry() -> dict[str, Exercise]:
    """Every registered exercise, by key (loads all lessons' exercise modules)."""
    _load_all()
    return dict(_REGISTRY)


def get(key: str) -> Exercise:
    """The exercise ``key``; a KeyError lists the known keys."""
    reg = registry()
    if key not in reg:
        raise KeyError(f"no exercise '{key}'; known: {sorted(reg)}")
    return reg[key]


class ExerciseTimeout(Exception):
    """A checker ran past its exercise's time limit (raised inside the learner's code by a timer signal)."""


@contextlib.contextmanager
def time_limit(seconds: float, key: str) -> Iterator[None]:
    """Stop the code inside after ``seconds`` with :class:`ExerciseTimeout` (main thread only, as in a kernel).

    Uses a real-time interval timer: an endless Python loop or a blocked queue wait is interrupted; a single C
    call that never returns (rare) is interrupted when it comes back to Python.
    """
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def expire(_signum: int, _frame: Any) -> None:
        raise ExerciseTimeout(
            f"stopped after {seconds:.0f} s: the checker of {key} normally finishes in seconds. Look for an endless "
            "loop, a wait that never ends (a DataLoader worker that is stuck, a queue nobody fills) or work far larger "
            "than asked, then run the cell again."
        )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _short(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    return text if len(text) <= limit else f"{text[:limit]} ... [{len(text) - limit} more characters not shown]"


def _is_placeholder(exc: NotImplementedError) -> bool:
    """True when ``exc`` is the exercise's own placeholder: a ``raise NotImplementedError`` line in the learner's
    code, not one raised deep inside torch or the course for arguments it does not support."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return True
    last = frames[-1]
    library = "site-packages" in last.filename or Path(last.filename).resolve().is_relative_to(_PACKAGE)
    return not library and (last.line or "").lstrip().startswith("raise NotImplementedError")


def _where(exc: BaseException) -> str:
    """``file:line in function`` of the innermost frame of ``exc`` (where the learner should look)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    last = frames[-1]
    return f"{Path(last.filename).name}:{last.lineno} in {last.name}()"


def verdict(key: str, answer: Callable[..., Any], **kwargs: Any) -> str:
    """Exercise ``key``'s checker on ``answer``: "accepted", or the checker's reason for rejecting it.

    The tests use it to show that each checker rejects wrong submissions, and why. A run past the exercise's time
    limit is a rejection too; other errors propagate.
    """
    ex = get(key)
    try:
        with time_limit(ex.time_limit, key):
            ex.checker(answer, **kwargs)
    except (AssertionError, ExerciseTimeout) as exc:
        return _short(str(exc))
    return "accepted"


def check(key: str, answer: Callable[..., Any]) -> None:
    """Run exercise ``key``'s self-check on the learner's function and print one verdict.

    * the exercise's own placeholder (``raise NotImplementedError`` in the learner's code) counts as not attempted:
      a hint is printed and the notebook goes on;
    * a rejection prints the checker's reason (cut to :data:`MAX_MESSAGE` characters);
    * any other error of the learner's code, a NotImplementedError raised deep inside a library included, is
      printed with where it happened, and the notebook goes on;
    * a checker still running after the exercise's time limit is stopped, with a message saying so.
    """
    ex = get(key)
    try:
        with time_limit(ex.time_limit, key):
            ex.checker(answer)
    except NotImplementedError as exc:
        if _is_placeholder(exc):
            hint = f"Stuck? course_utils.check.exercises.show_solution('{key}')"
            print(f"✎  Exercise {key} not solved yet. {ex.prompt}\n   {hint}")
        else:
            print(
                f"✗  Exercise {key}: your code raised NotImplementedError at {_where(exc)}: "
                f"{_short(str(exc)) or '(no message)'}. This is not the exercise's placeholder: a call your code "
                "made is not implemented for those arguments (a misspelled method, a dtype or device it does not "
                "support)."
            )
    except AssertionError as exc:
        print(f"✗  Exercise {key}: not quite. {_short(str(exc))}")
    except ExerciseTimeout as exc:
        print(f"✗  Exercise {key}: {exc}")
    except Exception as exc:  # the learner's own bug: show it in one line, keep the notebook going
        print(f"✗  Exercise {key}: your code raised {type(exc).__name__} at {_where(exc)}: {_short(str(exc))}")
    else:
        print(f"✓  Exercise {key}: correct.")


def show_solution(key: str) -> None:
    """Print the reference solution's source code."""
    print(inspect.getsource(get(key).solution))
