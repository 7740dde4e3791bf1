"""Lesson 11's graph-runner exercise: the checker accepts the reference and rejects wrong runners (CPU path)."""

from __future__ import annotations

import pytest
import torch

from course_utils.check import exercises

KEY = "11.graph-runner"


def verdict(fn) -> str:
    return exercises.verdict(KEY, fn)


def runner(*, static=True, check_shape=True, stale=False, alias=False, twice=False):
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
                if twice:
                    model(static_in[:1])  # the technique on a throwaway input first
                out = model(static_in if static else x)
                if alias:  # one output buffer, returned itself
                    static_out = out if static_out is None else static_out.copy_(out)
                    return static_out
            return out

        return run

    return make


def traced(model, example):
    """A 'graph runner' that is torch.jit.trace: every operator still dispatched on each call."""
    static_in = example.clone()
    with torch.inference_mode():
        tm = torch.jit.trace(model, static_in)

    def run(x):
        if x.shape != static_in.shape:
            raise ValueError("shape")
        static_in.copy_(x)
        return tm(static_in)

    return run


def bypass(model, example):
    """Calls the wrapped model's inner module: a fixed buffer, but the model it was given is skipped."""
    static_in = example.clone()
    inner = next(model.children())

    def run(x):
        if x.shape != static_in.shape:
            raise ValueError("shape")
        static_in.copy_(x)
        with torch.inference_mode():
            return inner(static_in)

    return run


def compiled(model, example):
    def run(x):
        return torch.compile(model, mode="reduce-overhead")(x)

    return run


def test_reference_and_equivalent_runner_are_accepted():
    assert verdict(exercises.get(KEY).solution) == "accepted"
    assert verdict(runner()) == "accepted"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (runner(static=False), "not on the caller's tensor"),
        (runner(check_shape=False), "ValueError"),
        (runner(stale=True), "differs"),
        (runner(alias=True), "overwritten"),
        (runner(twice=True), "2 times"),
        (traced, "torch.jit.trace/script is no CUDA graph"),
        (bypass, "call the model you were given"),
        (compiled, "write the capture yourself"),
        (lambda model, example: None, "return a function"),
    ],
    ids=[
        "no-buffer",
        "no-shape-check",
        "stale",
        "alias",
        "throwaway-first",
        "jit-trace",
        "bypass-wrapper",
        "torch-compile",
        "no-runner",
    ],
)
def test_wrong_runners_are_rejected(make, message):
    got = verdict(make)
    assert message in got, got


def test_the_seed_is_printed_on_failure():
    assert "random case seed" in verdict(runner(stale=True))
