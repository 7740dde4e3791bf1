"""CUDA graphs on the rehearsal's stand-in GPU: capture records operators, replay queues them on the same memory.

Rules enforced (what CUDA and PyTorch's documentation require of a captured graph):

* capture happens on a side stream (``torch.cuda.graph`` picks one; ``capture_begin`` on the default stream
  raises, as CUDA does);
* no synchronization and no host read inside capture (``torch.cuda.synchronize``, ``.item()``, ``.cpu()``,
  printing a CUDA tensor, copying from CPU memory, an operator whose output size depends on the data):
  "operation not permitted when stream is capturing";
* the captured kernels (matrix products, convolutions, attention) were warmed up on a side stream before
  capture, in any grad mode (lazy initialisation and autotuning must not happen inside the capture);
* captured work does not run at capture: the graph's outputs hold garbage (NaN) until the first replay;
* replay re-runs the captured operators on the *same* memory, queued on the current stream: it reads the static
  inputs as they are then and overwrites the static outputs, so a result kept without ``.clone()`` changes at
  the next replay; a static input freed after capture (the graph keeps no reference to it) is an error.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from fakegpu.standins.streams import MODEL, StandinStream
from fakegpu.standins.tensor import HOOKS, STATE, RehearsalError, key_of

_FAMILIES = {
    "matmul": {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "_scaled_mm", "einsum"},
    "convolution": {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution",
                    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"},
    "attention": {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                  "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                  "_scaled_dot_product_flash_attention_for_cpu"},
}  # fmt: skip
_COMPUTE = set(_FAMILIES)


def family(base: str) -> str:
    """The kernel family of an operator: grad mode decomposes ``linear`` into ``addmm``, inference mode keeps it."""
    return next((name for name, ops in _FAMILIES.items() if base in ops), base)


class Capture:
    def __init__(self) -> None:
        self.ops: list[tuple[Any, Any, Any, list, float, float]] = []
        self.touched: set[int] = set()
        self.made: set[int] = set()
        self.families: set[str] = set()

    def forbid(self, what: str) -> None:
        STATE.count("graph capture violations")
        raise RehearsalError(
            f"operation not permitted when stream is capturing: {what} inside CUDA graph capture (rehearsal "
            "stand-in). Keep synchronization and host reads out of the captured region; read the static output "
            "after replay()."
        )

    def record(self, func: Any, args: Any, kwargs: Any, fresh: list, keys: set[int], cost: tuple[float, float],
               base: str) -> None:  # fmt: skip
        self.ops.append((func, args, kwargs, fresh, *cost))
        self.touched |= keys
        self.made |= {key_of(t) for _, t in fresh}
        self.families.add(family(base))


def _replay_ops(ops: list) -> None:
    with torch.inference_mode():  # a replay rewrites the graph's memory whatever the caller's grad mode
        for func, args, kwargs, fresh, *_ in ops:
            HOOKS.run_into(func, args, kwargs, fresh)  # .dispatch.run_into (dispatch.py sits above this file)


class StandinCUDAGraph:
    """``torch.cuda.CUDAGraph`` of the stand-in GPU."""

    def __init__(self, keep_graph: bool = False) -> None:
        self.capture: Capture | None = None
        self.ops: list = []
        self.inputs: dict[int, int] = {}  # storage key -> generation of the live static input at capture
        self.outputs: set[int] = set()

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global", **kwargs: Any) -> None:
        if STATE.capture is not None:
            raise RehearsalError("a CUDA graph capture is already under way (rehearsal stand-in)")
        if MODEL.current is MODEL.default:
            STATE.count("graph capture violations")
            raise RehearsalError(
                "CUDA graphs must be captured on a non-default stream (use `with torch.cuda.graph(g):`, or capture "
                "under `with torch.cuda.stream(s):`)"
            )
        STATE.count("graph captures")
        self.capture = STATE.capture = Capture()

    def capture_end(self) -> None:
        capture, STATE.capture = self.capture, None
        if capture is None:
            raise RehearsalError("capture_end() without capture_begin()")
        self.ops = capture.ops
        cold = sorted(capture.families & _COMPUTE - MODEL.side_ops)
        if cold:
            STATE.count("graph capture violations")
            raise RehearsalError(
                f"CUDA graph captured {', '.join(cold)} kernels that never ran on a side stream before capture: warm "
                "up first (s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream()); run the model a few "
                "times under `with torch.cuda.stream(s):`; torch.cuda.current_stream().wait_stream(s)), so lazy "
                "initialisation and autotuning do not happen inside the capture."
            )
        external = capture.touched - capture.made
        self.inputs = {k: STATE.live[k][2] for k in external if k in STATE.live}
        self.outputs = capture.made | {k for k in capture.touched if k in self.inputs}

    def replay(self) -> None:
        if not self.ops:
            raise RehearsalError("replay() of a CUDA graph that captured nothing")
        STATE.count("graph replays")
        freed = [k for k, gen in self.inputs.items() if STATE.live.get(k, [0, 0, -1])[2] != gen]
        if freed:
            STATE.count("graph capture violations")
            raise RehearsalError(
                f"CUDA graph replay reads {len(freed)} static input(s) freed after capture: the graph keeps no "
                "reference to memory it did not allocate, so the caching allocator may have handed it to another "
                "tensor (garbage in, garbage out on a GPU). Keep every static input (and the model's weights) alive "
                "as long as the graph is replayed (rehearsal stand-in)"
            )
        stream = MODEL.current
        clock = stream.tick()
        for k in self.inputs:
            MODEL.use(k, "graph replay", False, stream, clock)
        for k in self.outputs:
            if k in MODEL.uses or k in STATE.live:
                MODEL.use(k, "graph replay", True, stream, clock)
        duration = sum(op[4] for op in self.ops)
        stream.ready = MODEL.clock.issue("compute", stream.sid, stream.ready, duration, max(op[5] for op in self.ops))
        ops = self.ops
        MODEL.enqueue(stream, clock, lambda: _replay_ops(ops))

    def reset(self) -> None:
        self.ops, self.inputs, self.outputs = [], {}, set()

    def pool(self) -> tuple[int, int]:
        return (0, id(self))

    def enable_debug_mode(self) -> None:
        pass

    def debug_dump(self, path: str) -> None:
        raise RehearsalError("debug_dump needs a real CUDA graph (the rehearsal's stand-in has no graph to dump)")


class graph(contextlib.AbstractContextManager):  # noqa: N801 - mirrors torch.cuda.graph
    """``torch.cuda.graph(g, pool=None, stream=None, capture_error_mode="global")`` of the stand-in GPU."""

    def __init__(self, cuda_graph: StandinCUDAGraph, pool: Any = None, stream: StandinStream | None = None,
                 capture_error_mode: str = "global", **kwargs: Any) -> None:  # fmt: skip
        self.g, self.pool = cuda_graph, pool
        self.stream = stream or StandinStream(_name="graph capture stream")

    def __enter__(self) -> None:
        MODEL.sync_all()
        self.prev = MODEL.current
        self.stream.wait_stream(self.prev)
        MODEL.current = self.stream
        self.g.capture_begin(self.pool)

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is None:
                self.g.capture_end()
            else:
                STATE.capture = None
        finally:
            MODEL.current = self.prev
