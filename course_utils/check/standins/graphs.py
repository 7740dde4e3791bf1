"""CUDA graphs on the rehearsal's stand-in GPU: capture records operators, replay re-runs them in place.

Rules enforced (what CUDA and PyTorch's documentation require of a captured graph):

* capture happens on a side stream (``torch.cuda.graph`` picks one; ``capture_begin`` on the default stream
  raises, as CUDA does);
* no synchronization and no host read inside capture (``torch.cuda.synchronize``, ``.item()``, ``.cpu()``,
  printing a CUDA tensor, copying from CPU memory): "operation not permitted when stream is capturing";
* the captured work was warmed up on a side stream before capture (its compute operators ran there first);
* replay re-runs the captured operators on the *same* memory: it reads the static inputs as they are now and
  overwrites the static outputs (a result kept without ``.clone()`` changes at the next replay); the shapes are
  the captured ones.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from course_utils.check.standins.streams import MODEL, StandinStream
from course_utils.check.standins.tensor import STATE, RehearsalError, _key

_COMPUTE = {"convolution", "conv1d", "conv2d", "conv3d", "mm", "addmm", "bmm", "matmul", "linear",
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention", "cudnn_convolution", "_convolution"}  # fmt: skip


class Capture:
    def __init__(self) -> None:
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

    def forbid(self, what: str) -> None:
        STATE.count("graph capture violations")
        raise RehearsalError(
            f"operation not permitted when stream is capturing: {what} inside CUDA graph capture (rehearsal "
            "stand-in). Keep synchronization and host reads out of the captured region; read the static output "
            "after replay()."
        )

    def record(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        self.ops.append((func, args, kwargs, out))


class StandinCUDAGraph:
    """``torch.cuda.CUDAGraph`` of the stand-in GPU."""

    def __init__(self, keep_graph: bool = False) -> None:
        self.capture: Capture | None = None
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

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
        cold = sorted({f._schema.name.split("::")[-1] for f, *_ in self.ops} & _COMPUTE - MODEL.side_ops)
        if cold:
            STATE.count("graph capture violations")
            raise RehearsalError(
                f"CUDA graph captured {', '.join(cold)} that never ran on a side stream before capture: warm up "
                "first (s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream()); run the model a few "
                "times under `with torch.cuda.stream(s):`; torch.cuda.current_stream().wait_stream(s)), so lazy "
                "initialisation and autotuning do not happen inside the capture."
            )

    def replay(self) -> None:
        if not self.ops:
            raise RehearsalError("replay() of a CUDA graph that captured nothing")
        STATE.count("graph replays")
        stream = MODEL.current
        clock = stream.tick()
        with torch.inference_mode():  # a replay rewrites the graph's memory whatever the caller's grad mode
            for func, args, kwargs, out in self.ops:
                keys = {_key(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
                for k in keys:
                    if k in MODEL.uses:
                        MODEL.use(k, "graph replay", False, stream, clock)
                result = func(*args, **kwargs)
                for old, new in zip(tree_flatten(out)[0], tree_flatten(result)[0], strict=False):
                    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old is not new:
                        old.copy_(new)
        for *_, out in self.ops:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and _key(t) in MODEL.uses:
                    MODEL.use(_key(t), "graph replay", True, stream, clock)

    def reset(self) -> None:
        self.ops = []

    def pool(self) -> tuple[int, int]:
        return (0, id(self))

    def enable_debug_mode(self) -> None:
        pass

    def debug_dump(self, path: str) -> None:
        raise RehearsalError("debug_dump needs a real CUDA graph (not rehearsable)")


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
