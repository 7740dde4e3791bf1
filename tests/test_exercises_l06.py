"""Lesson 06's exercise checkers reject wrong submissions (and accept the reference solutions)."""

from __future__ import annotations

import pytest
import torch

from course_utils import exercises


def _rejects(key, fn):
    with pytest.raises(AssertionError) as err:
        exercises.get(key).checker(fn)
    return str(err.value)


def test_reference_passes():
    ex = exercises.get("06.mark-dynamic")
    ex.checker(ex.solution)


def test_mark_dynamic_rejects_a_plain_loop():
    msg = _rejects("06.mark-dynamic", lambda compiled, xs: [compiled(x) for x in xs])
    assert "5 graphs were compiled" in msg


def test_mark_dynamic_rejects_running_eager():
    msg = _rejects("06.mark-dynamic", lambda compiled, xs: [compiled._orig_mod(x) for x in xs])
    assert "never ran" in msg


def test_mark_dynamic_rejects_wrong_outputs():
    def reordered(compiled, xs):
        for x in xs:
            torch._dynamo.mark_dynamic(x, 0)
        return [compiled(x) for x in reversed(xs)]

    def missing(compiled, xs):
        for x in xs:
            torch._dynamo.mark_dynamic(x, 0)
        return [compiled(x) for x in xs[:-1]]

    assert "expected an output of shape" in _rejects("06.mark-dynamic", reordered)
    assert "one output per batch" in _rejects("06.mark-dynamic", missing)


def test_mark_dynamic_rejects_a_perturbed_answer():
    def sloppy(compiled, xs):
        out = []
        for x in xs:
            torch._dynamo.mark_dynamic(x, 0)
            out.append(compiled(x) + 1e-2)
        return out

    assert "differs from eager" in _rejects("06.mark-dynamic", sloppy)
