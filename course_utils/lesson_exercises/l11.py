"""Lesson 11 exercise: a CUDA-graph runner with a CPU fallback, both on fixed buffers.

The check wraps the model so it sees every call: the runner's results must match ``model(x)`` batch after batch
(and a result kept from an earlier call must not change), a batch of another shape must raise ``ValueError``,
and the technique must show: on the CPU fallback every model call reads the same preallocated input buffer; on
CUDA (checked where a GPU exists) the model's Python code does not run at all after capture, because replaying
a graph launches the recorded kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..exercises import exercise

Runner = Callable[[torch.Tensor], torch.Tensor]


class _Watched(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.calls, self.ptrs = inner, 0, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.ptrs.append(x.data_ptr())
        return self.inner(x)


def _check_on(make: Callable[[torch.nn.Module, torch.Tensor], Runner], device: str) -> None:
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten()).eval().to(device)
    model = _Watched(inner)
    xs = [torch.randn(2, 3, 8, 8, device=device) for _ in range(3)]
    run = make(model, xs[0])
    assert callable(run), "return a function run(x)"
    calls_after_setup = model.calls
    outs = [run(x) for x in xs]
    with torch.inference_mode():
        refs = [inner(x) for x in xs]
    for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        assert isinstance(out, torch.Tensor) and out.shape == ref.shape, f"run(batch {i}) should return {ref.shape}"
        assert torch.allclose(out, ref, atol=1e-5), f"batch {i}: the result differs from model(x)" + (
            " (kept from an earlier call, it was overwritten: return a clone of the static output)" if i < 2 else ""
        )
    try:
        run(torch.randn(3, 3, 8, 8, device=device))
    except ValueError:
        pass
    except Exception as exc:  # noqa: BLE001 - any other error is the wrong answer
        raise AssertionError(
            f"a batch of another shape raised {type(exc).__name__}: check x.shape first and raise ValueError"
        ) from None
    else:
        raise AssertionError("a batch of another shape must raise ValueError: the buffers (and a graph) are fixed")
    if device == "cuda":
        assert model.calls == calls_after_setup, (
            "the model's forward ran during run(): capture a torch.cuda.CUDAGraph once and call graph.replay()"
        )
    else:
        used = model.ptrs[calls_after_setup:]
        assert used and len(set(used)) == 1, (
            "on the CPU fallback, copy each batch into one preallocated input buffer (static_in.copy_(x)) and run "
            "the model on that buffer"
        )
        assert used[0] not in {x.data_ptr() for x in xs}, "run the model on your buffer, not on the caller's tensor"


def _check_runner(make: Callable[[torch.nn.Module, torch.Tensor], Runner]) -> None:
    _check_on(make, "cpu")
    if torch.cuda.is_available():
        _check_on(make, "cuda")


@exercise(
    "11.graph-runner",
    "static_in = example.clone(); on CUDA warm up on a side stream, capture out = model(static_in) in "
    "torch.cuda.graph(g); run(x): check the shape (ValueError), static_in.copy_(x), g.replay(), return a clone; "
    "on CPU run(x): check, copy_, return model(static_in) under inference_mode.",
    _check_runner,
)
def make_graph_runner(model: torch.nn.Module, example: torch.Tensor) -> Runner:
    static_in = example.clone()

    def check(x: torch.Tensor) -> None:
        if x.shape != static_in.shape:
            raise ValueError(f"this runner was built for {tuple(static_in.shape)}, got {tuple(x.shape)}")

    if example.is_cuda:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(3):
                model(static_in)  # warm-up (cuDNN, allocator) outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph):
            static_out = model(static_in)

        def run(x: torch.Tensor) -> torch.Tensor:
            check(x)
            static_in.copy_(x)
            graph.replay()
            return static_out.clone()

        return run

    def run_eager(x: torch.Tensor) -> torch.Tensor:
        check(x)
        static_in.copy_(x)
        with torch.inference_mode():
            return model(static_in)

    return run_eager
