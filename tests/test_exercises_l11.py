"""Lesson 11's graph-runner exercise: the checker accepts the reference and rejects wrong runners, on the CPU path
and on the CUDA path (the rehearsal's stand-in GPU here): a runner with only the CPU fallback, tracing reached
through torch.jit._trace, and torch._dynamo's cudagraphs backend are rejected by name."""

from __future__ import annotations

import pytest
import torch

from course_checks import exercises

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


def graph_runner(*, clone_example=True, warm_up=True, batch_only=False, rebind=False, grad_on_cpu=False):
    """The reference's capture on CUDA and its eager fallback on the CPU, with one honest mistake."""

    def make(model, example):
        static_in = example.clone() if clone_example else example

        def wrong_shape(x):
            return x.shape[0] != static_in.shape[0] if batch_only else x.shape != static_in.shape

        if not example.is_cuda:

            def run_eager(x):
                if wrong_shape(x):
                    raise ValueError("shape")
                static_in.copy_(x)
                if grad_on_cpu:  # inference_mode forgotten
                    return model(static_in)
                with torch.inference_mode():
                    return model(static_in)

            return run_eager
        if warm_up:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.inference_mode():
                for _ in range(3):
                    model(static_in)
            torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph):
            static_out = model(static_in)

        def run(x):
            nonlocal static_in
            if wrong_shape(x):
                raise ValueError("shape")
            if rebind:  # a new tensor under the old name: the graph still reads the captured one
                static_in = x.clone()
            else:
                static_in.copy_(x)
            graph.replay()
            return static_out.clone()

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


def private_trace(model, example):
    """torch.jit.trace reached through its module (it got past the forbidden torch.jit.trace)."""
    static_in = example.clone()
    with torch.inference_mode():
        tm = torch.jit._trace.trace(model, static_in)

    def run(x):
        if x.shape != static_in.shape:
            raise ValueError("shape")
        static_in.copy_(x)
        return tm(static_in)

    return run


def dynamo_cudagraphs(model, example):
    """torch._dynamo.optimize('cudagraphs'): compiled graphs, not a capture written by hand."""
    opt = torch._dynamo.optimize("cudagraphs")(model)

    def run(x):
        if x.shape != example.shape:
            raise ValueError("shape")
        return opt(x)

    return run


def test_reference_is_accepted_on_the_cpu_and_the_gpu():
    for seed in range(200):
        assert exercises.verdict(KEY, exercises.get(KEY).solution, seed=seed) == "accepted", seed


def test_the_capture_helper_without_mistakes_is_accepted():
    for seed in range(50):  # the reference's own capture, written again: the helper the wrong runners change
        assert exercises.verdict(KEY, graph_runner(), seed=seed) == "accepted", seed


def test_a_cpu_fallback_alone_is_rejected_on_the_gpu():
    got = verdict(runner())  # right on the CPU, eager on CUDA: the CUDA path now runs on the stand-in GPU
    assert "dispatched" in got and "graph.replay()" in got, got


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
        (private_trace, "torch.jit.trace/script is no CUDA graph"),
        (dynamo_cudagraphs, "write the capture yourself"),
        (lambda model, example: None, "return a function"),
        (graph_runner(clone_example=False), "the example itself became your input buffer"),
        (graph_runner(warm_up=False), "never ran on a side stream before capture: warm up first"),
        (graph_runner(batch_only=True), "images of another size (the same batch size)"),
        (graph_runner(rebind=True), "static input(s) freed after capture"),
        (graph_runner(grad_on_cpu=True), "requires grad"),
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
        "jit-private-trace",
        "dynamo-cudagraphs",
        "no-runner",
        "example-as-buffer",
        "capture-without-warm-up",
        "shape-check-on-batch-only",
        "rebind-static-input",
        "no-inference-mode",
    ],
)
def test_wrong_runners_are_rejected(make, message):
    for seed in range(200):
        got = exercises.verdict(KEY, make, seed=seed)
        assert message in got, (seed, got)


def test_the_seed_is_printed_on_failure():
    assert "random case seed" in verdict(runner(stale=True))
