"""Lesson 11's graph-runner exercise: the checker accepts the reference and rejects wrong runners (CPU path)."""

from __future__ import annotations

import torch

from course_utils import exercises

KEY = "11.graph-runner"


def verdict(fn) -> str:
    return exercises.verdict(KEY, fn)


def runner(*, static=True, check_shape=True, stale=False, alias=False):
    def make(model, example):
        static_in = example.clone()
        static_out = None

        def run(x):
            nonlocal static_out
            if check_shape and x.shape != static_in.shape:
                raise ValueError("shape")
            if not stale:
                static_in.copy_(x)
            with torch.inference_mode():
                out = model(static_in if static else x)
                if alias:  # one output buffer, returned itself
                    static_out = out if static_out is None else static_out.copy_(out)
                    return static_out
            return out

        return run

    return make


def test_reference_and_equivalent_runner_are_accepted():
    assert verdict(exercises.get(KEY).solution) == "accepted"
    assert verdict(runner()) == "accepted"


def test_wrong_runners_are_rejected():
    assert "preallocated input buffer" in verdict(runner(static=False))
    assert "ValueError" in verdict(runner(check_shape=False))
    assert "differs" in verdict(runner(stale=True))
    assert "overwritten" in verdict(runner(alias=True))


def test_no_runner_is_rejected():
    assert "return a function" in verdict(lambda model, example: None)
