"""Exercises shared by all lessons: a self-check the learner calls, and reference solutions the tests run.

A lesson's exercise is a function the learner completes (it starts as ``raise NotImplementedError``).
``check("03.knee", my_knee)`` runs the exercise's checker against the learner's function and prints a
verdict; an unsolved exercise prints "not solved yet" instead of failing, so the shipped notebook runs
top to bottom. ``show_solution("03.knee")`` prints the reference solution. Each lesson registers its
exercises in ``course_utils/lesson_exercises/lNN.py``; ``tests/test_exercises.py`` runs every reference
solution through its checker.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Exercise:
    """One exercise: its key (``"NN.slug"``), a checker that raises AssertionError, a reference solution."""

    key: str
    prompt: str
    checker: Callable[[Callable[..., Any]], None]
    solution: Callable[..., Any]


_REGISTRY: dict[str, Exercise] = {}


def exercise(key: str, prompt: str, checker: Callable[[Callable[..., Any]], None]):
    """Decorator: register the decorated function as the reference solution of exercise ``key``."""

    def wrap(solution: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY[key] = Exercise(key, prompt, checker, solution)
        return solution

    return wrap


def _load_all() -> None:
    from . import lesson_exercises

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


def verdict(key: str, answer: Callable[..., Any], **kwargs: Any) -> str:
    """Exercise ``key``'s checker on ``answer``: "accepted", or the checker's reason for rejecting it.

    The tests use it to show that each checker rejects wrong submissions, and why.
    """
    try:
        get(key).checker(answer, **kwargs)
    except AssertionError as exc:
        return str(exc)
    return "accepted"


def check(key: str, answer: Callable[..., Any]) -> None:
    """Run exercise ``key``'s self-check on the learner's function and print the verdict.

    An answer that still raises ``NotImplementedError`` counts as not attempted: a hint is printed and the
    notebook goes on.
    """
    ex = get(key)
    try:
        ex.checker(answer)
    except NotImplementedError:
        print(f"✎  Exercise {key} not solved yet. {ex.prompt}\n   Stuck? course_utils.exercises.show_solution('{key}')")
        return
    except AssertionError as exc:
        print(f"✗  Exercise {key}: not quite. {exc}")
        return
    print(f"✓  Exercise {key}: correct.")


def show_solution(key: str) -> None:
    """Print the reference solution's source code."""
    print(inspect.getsource(get(key).solution))
