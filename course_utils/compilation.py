"""Graph compilation, measured honestly: compile cost apart from steady-state speed, recompiles, CUDA graphs.

A compiler pays a one-off cost (tracing, code generation, autotuning) on the first call and then, maybe,
runs each call faster. :func:`compile_cost` measures the two separately and :func:`break_even_calls`
says after how many calls the compile time has paid for itself. :func:`count_compiles` counts how often
TorchDynamo compiles a model when input shapes change (each new batch size can trigger a recompile unless
the dimension is marked dynamic). :func:`reset` clears the compiler's caches between variants, so one
variant's compiled code is not silently reused by the next. :class:`CudaGraphRunner` captures a model
into a CUDA graph by hand with static input and output buffers (GPU only).
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .device import synchronize
from .errors import CourseError, DeviceUnavailableError


class StaticShapeError(CourseError, ValueError):
    """A captured CUDA graph was given an input whose shape or dtype differs from the captured one."""


def reset() -> None:
    """Forget every compiled graph and guard (``torch._dynamo.reset()``): start the next variant cold."""
    torch._dynamo.reset()


@contextlib.contextmanager
def inductor_freezing(enabled: bool = True) -> Iterator[None]:
    """Temporarily set ``torch._inductor.config.freezing``: weights become constants the compiler can fold.

    Freezing lets Inductor pre-pack convolution and matmul weights for the CPU's fast kernels (oneDNN),
    which matters most at small batch; it applies to inference only (the model must not be trained after).
    """
    import torch._inductor.config as cfg

    old = cfg.freezing
    cfg.freezing = enabled
    try:
        yield
    finally:
        cfg.freezing = old


def time_first_call(fn: Callable[[], Any], device: torch.device | str = "cpu") -> float:
    """Seconds taken by one call of ``fn`` (synchronized): for a compiled model, the compile cost."""
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def break_even_calls(first_call_s: float, eager_ms: float, compiled_ms: float) -> float:
    """Calls after which compiling has paid for itself: extra first-call time / time saved per call.

    ``first_call_s`` is the compiled variant's first call (compile + one run). Returns ``math.inf`` when
    the compiled variant is not faster per call (it never pays back) and 0 when compiling cost nothing.
    """
    saved_ms = eager_ms - compiled_ms
    extra_ms = first_call_s * 1000.0 - compiled_ms
    if extra_ms <= 0:
        return 0.0
    if saved_ms <= 0:
        return math.inf
    return math.ceil(extra_ms / saved_ms)


@dataclass
class CompileCost:
    """One compiled variant: its first-call (compile) time and its steady-state median per call."""

    label: str
    first_call_s: float
    steady_ms: float
    eager_ms: float

    @property
    def speedup(self) -> float:
        """Steady-state speed relative to eager (above 1: faster)."""
        return self.eager_ms / self.steady_ms if self.steady_ms > 0 else math.nan

    @property
    def break_even(self) -> float:
        """Calls needed before the compile time is paid back (``inf``: never)."""
        return break_even_calls(self.first_call_s, self.eager_ms, self.steady_ms)

    def as_dict(self) -> dict[str, Any]:
        return {
            "variant": self.label,
            "first_call_s": self.first_call_s,
            "steady_ms": self.steady_ms,
            "eager_ms": self.eager_ms,
            "speedup": self.speedup,
            "break_even_calls": self.break_even,
        }


def compile_cost(
    make: Callable[[], Callable[[torch.Tensor], Any]],
    x: torch.Tensor,
    *,
    eager_ms: float,
    label: str,
    device: torch.device | str = "cpu",
    reset_first: bool = True,
    **measure_kwargs: Any,
) -> tuple[Callable[[torch.Tensor], Any], CompileCost, Any]:
    """Build a variant with ``make()``, time its first call on ``x``, then its steady state.

    ``make`` returns the callable (e.g. ``lambda: torch.compile(model)``); compilation happens lazily on
    the first call, which is timed alone. The compiler state is reset first (``reset_first``) so the
    variant starts cold. Runs under ``torch.inference_mode()``. Returns (callable, cost, measurement).
    """
    from .timing import measure

    if reset_first:
        reset()
    fn = make()
    with torch.inference_mode():
        first = time_first_call(lambda: fn(x), device)
        m = measure(lambda: fn(x), device=device, batch_size=x.shape[0], label=label, **measure_kwargs)
    return fn, CompileCost(label, first, m.median_ms, eager_ms), m


def count_compiles(
    model: nn.Module,
    inputs: Iterable[torch.Tensor],
    *,
    dynamic: bool | None = None,
    mark_dynamic_dim: int | None = None,
    backend: str = "eager",
) -> int:
    """How many graphs TorchDynamo compiles while ``model`` is called on each of ``inputs`` in turn.

    ``backend="eager"`` runs only TorchDynamo's capture (fast): every count is one cold Inductor compile
    with the default backend. ``dynamic=True`` compiles shape-generic code; ``mark_dynamic_dim=0`` marks
    dimension 0 (batch) of every input dynamic with ``torch._dynamo.mark_dynamic`` instead. Resets the
    compiler state before and after so counts do not leak between calls.
    """
    from torch._dynamo.testing import CompileCounterWithBackend

    reset()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counter, dynamic=dynamic)
    with torch.inference_mode():
        for x in inputs:
            if mark_dynamic_dim is not None:
                x = x.clone()
                torch._dynamo.mark_dynamic(x, mark_dynamic_dim)
            compiled(x)
    n = int(counter.frame_count)
    reset()
    return n


def torchscript(
    model: nn.Module, example: torch.Tensor, how: str = "trace"
) -> tuple[torch.jit.ScriptModule, list[str]]:
    """LEGACY: ``torch.jit.trace`` or ``torch.jit.script`` the model; return it and the warnings raised.

    TorchScript is deprecated (the warnings say: switch to ``torch.compile`` or ``torch.export``); the
    course shows it because older tutorials and deployments use it. Trace records one run and silently
    bakes in Python control flow; script compiles a Python subset.
    """
    if how not in {"trace", "script"}:
        raise ValueError(f"how='{how}': use 'trace' or 'script'")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.inference_mode(False), torch.no_grad():
            mod = torch.jit.trace(model, example) if how == "trace" else torch.jit.script(model)
    messages = sorted({str(w.message) for w in caught if "deprecated" in str(w.message).lower()})
    return mod, messages


class CudaGraphRunner:
    """A model captured into one CUDA graph, replayed with static input and output buffers (GPU only).

    Launch overhead disappears: one ``graph.replay()`` launches every kernel the model ran at capture.
    The price: the input shape is fixed, the input must be copied into :attr:`static_input` and the
    result lives in :attr:`static_output`, which the NEXT replay overwrites. Clone it to keep it.
    """

    def __init__(self, model: Callable[[torch.Tensor], torch.Tensor], example: torch.Tensor, *, warmup: int = 3):
        if example.device.type != "cuda":
            raise DeviceUnavailableError("CUDA graphs need a CUDA tensor: move the model and example to 'cuda'.")
        self.static_input = example.detach().clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        # Warm-up on a side stream, as the CUDA graph docs require (lazy init, cuDNN autotuning).
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(warmup):
                model(self.static_input)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self.static_output = model(self.static_input)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Copy ``x`` into the static input, replay, and return the static output (overwritten next call)."""
        if x.shape != self.static_input.shape or x.dtype != self.static_input.dtype:
            raise StaticShapeError(
                f"this CUDA graph was captured for input {tuple(self.static_input.shape)} {self.static_input.dtype}, "
                f"got {tuple(x.shape)} {x.dtype}: capture one graph per shape (or pad the batch to the captured size)."
            )
        self.static_input.copy_(x)
        self.graph.replay()
        return self.static_output


def shapes_for(batch_sizes: Sequence[int], feature_shape: Sequence[int]) -> list[torch.Tensor]:
    """Random inputs with the given batch sizes and per-item shape (for recompile demonstrations)."""
    return [torch.randn(b, *feature_shape) for b in batch_sizes]
