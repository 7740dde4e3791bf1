"""The virtual clock of the rehearsal's stand-in GPU: kernels and copies take modelled time, streams run side by side.

Every operator issued on a stand-in stream is placed on a device timeline when it is issued (its values are
computed later, when something waits for it: :mod:`.streams`). Its duration comes from a cost model of a small,
slow GPU (:data:`RATES`): a kernel takes ``LAUNCH_S`` plus the longer of its arithmetic (FLOPs at the dtype's
rate) and its memory traffic (bytes at ``bandwidth``); host-device copies run on a copy engine per direction at
the pinned or the pageable rate. Kernels of different streams overlap when together they fit on the device: a
kernel fills the fraction ``width`` of it (its output elements over :data:`SATURATION`, the threads the stand-in's
132 multiprocessors hold), so small kernels of two streams run side by side and large ones queue. Work on one
stream never overlaps itself.

Device time runs with the wall clock: work issued to an idle stream starts at once, on a busy one when the stream's
earlier work (and what it waits for) ends, so device-bound work takes its modelled time whatever the CPU's load,
and events around host-side work measure that host time, as on a GPU. A host wait (``synchronize``, an event wait,
a blocking copy) lasts until the device time it waits for: the host sleeps until the wall clock reaches it, so a
wall-clock timer that synchronizes reads at least the modelled time and one that does not reads only the launch.
CUDA events report device time (``elapsed_time``). While a profiler asked for CUDA activity records, every piece of
work placed here is also kept as a device event (its name, start, end and stream: :attr:`DeviceClock.recorders`).
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from time import perf_counter as _wall  # the real clock (the rehearsal checks reads of time.perf_counter)
from typing import Any

import torch

# The stand-in GPU's rates: slow enough that a kernel's modelled time is well above the CPU cost of launching it.
RATES: dict[str, float] = {
    "fp32": 25e9, "tf32": 100e9, "fp16": 100e9, "bf16": 100e9, "int8": 200e9, "fp64": 6e9,  # FLOP/s
    "bandwidth": 20e9, "pinned": 6e9, "pageable": 2e9,  # bytes/s: device memory, host<->device copies
}  # fmt: skip
LAUNCH_S = 5e-6  # every kernel costs at least this long on the device
COPY_LATENCY_S = 10e-6
SATURATION = 132 * 2048  # threads the stand-in's multiprocessors hold: a kernel with this many outputs fills it
_HALF = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}
_MATMUL_LIKE = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "conv1d", "conv2d", "conv3d", "convolution",
                "_convolution", "cudnn_convolution", "scaled_dot_product_attention"}  # fmt: skip


_EVENT_NAMES = {"h2d": "Memcpy HtoD (stand-in)", "d2h": "Memcpy DtoH (stand-in)", "compute": "kernel"}


@dataclass
class Span:
    start: float
    end: float
    width: float


@dataclass
class Engine:
    """One resource of the device (the multiprocessors, or a copy engine): capacity 1, shared by the streams."""

    name: str
    spans: dict[int, list[Span]] = field(default_factory=dict)  # per stream, in time order (a stream is FIFO)

    def place(self, sid: int, earliest: float, duration: float, width: float) -> float:
        """The start of the first slot at or after ``earliest`` where ``width`` fits beside the other streams."""
        others = []
        for other, spans in self.spans.items():
            if other != sid and spans:
                ends = [s.end for s in spans]
                others += spans[bisect.bisect_right(ends, earliest) :]
        others.sort(key=lambda s: s.start)
        for start in [earliest] + sorted({s.end for s in others if s.end > earliest}):
            busy = sum(s.width for s in others if s.start < start + duration and s.end > start)
            if busy + width <= 1.0 + 1e-9:
                break
        mine = self.spans.setdefault(sid, [])
        mine.append(Span(start, start + duration, width))
        return start

    def forget_before(self, t: float) -> None:
        """Spans that ended by ``t`` can no longer delay new work (nothing starts before the host's time)."""
        for spans in self.spans.values():
            keep = bisect.bisect_right([s.end for s in spans], t)
            if keep:
                del spans[:keep]


class DeviceClock:
    """The timeline: engines, and device time, which is wall time since the stand-ins started (an idle device
    starts work when it is issued; a busy one when its stream is free)."""

    def __init__(self) -> None:
        self.engines = {name: Engine(name) for name in ("compute", "h2d", "d2h")}
        self.start = _wall()
        self.host = 0.0  # device time up to which the host has waited
        self.busy_s = 0.0  # device time of all work issued (for the record)
        self.recorders: list[list[tuple[str, float, float, int]]] = []  # profilers' device events being recorded
        self.labels: list[str] = []  # the name device events take inside :meth:`naming` (a library's kernel)

    def now(self) -> float:
        """The device time of this moment (work issued now can start no earlier)."""
        return _wall() - self.start

    def issue(self, engine: str, sid: int, ready: float, duration: float, width: float = 1.0, name: str = "") -> float:
        """Place work of ``duration`` on ``engine`` for stream ``sid`` ready at ``ready``; return its end."""
        start = self.engines[engine].place(sid, max(ready, self.now()), duration, min(max(width, 1 / 132), 1.0))
        self.busy_s += duration
        if self.recorders:
            label = self.labels[-1] if self.labels else (name or _EVENT_NAMES.get(engine, "kernel"))
            for recorder in self.recorders:
                recorder.append((f"{label} (stand-in kernel)" if engine == "compute" else label, start,
                                 start + duration, sid))  # fmt: skip
        return start + duration

    @contextlib.contextmanager
    def naming(self, label: str) -> Iterator[None]:
        """Device events of the work issued in the block are named ``label`` (one library call's kernels)."""
        self.labels.append(label)
        try:
            yield
        finally:
            self.labels.pop()

    def wait(self, until: float) -> None:
        """The host waits for device time ``until``: it sleeps until the wall clock has reached it."""
        left = until - self.now()
        if left > 0:
            time.sleep(left)
        self.host = max(self.host, until)
        for engine in self.engines.values():
            engine.forget_before(min(self.host, self.now()))


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _rate(dtype: torch.dtype, base: str) -> float:
    if dtype in _HALF:
        return RATES[_HALF[dtype]]
    if dtype in (torch.int8, torch.uint8):
        return RATES["int8"]
    if dtype == torch.float32 and base in _MATMUL_LIKE and tf32_in_force(base):
        return RATES["tf32"]
    return RATES["fp32"]


def _new_api(owner: Any) -> str:
    """The TF32 setting of torch's newer ``fp32_precision`` API ('tf32' or 'ieee'; 'none' inherits)."""
    value = getattr(owner, "fp32_precision", "none")
    return getattr(torch.backends, "fp32_precision", "none") if value == "none" else value


def tf32_state() -> tuple[bool, bool]:
    """(matrix products in TF32, cuDNN convolutions in TF32) now. The legacy switches (``allow_tf32``,
    ``float32_matmul_precision``) raise once the newer ``fp32_precision`` API was mixed in; then the new one answers."""
    try:
        matmul = bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"
    except RuntimeError:
        matmul = _new_api(torch.backends.cuda.matmul) == "tf32"
    try:
        conv = bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        conv = _new_api(torch.backends.cudnn.conv) == "tf32"
    return matmul, conv


def tf32_in_force(base: str) -> bool:
    """Whether an FP32 call of operator ``base`` runs in TF32 now: cuDNN's switch for convolutions, the matmul
    switch or ``float32_matmul_precision`` other than 'highest' for matrix products (read at the call)."""
    matmul, conv = tf32_state()
    return conv if base.startswith(("conv", "_conv", "cudnn_conv")) else matmul


def flops(func: Any, base: str, args: tuple, kwargs: dict, out: Any) -> float:
    """FLOPs of one operator from meta tensors: torch's flop formulas, plus the composite ops seen unexpanded."""
    from torch.utils.flop_counter import flop_registry

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    try:
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            return float(formula(*args, **kwargs, out_val=out))
        if base == "linear" and len(tensors) >= 2:
            x, w = tensors[0], tensors[1]
            return 2.0 * x.numel() * w.shape[0]
        if base in {"conv1d", "conv2d", "conv3d"} and len(tensors) >= 2 and isinstance(out, torch.Tensor):
            w = tensors[1]
            return 2.0 * out.numel() * w[0].numel()
        if base == "matmul" and len(tensors) == 2 and isinstance(out, torch.Tensor):
            return 2.0 * out.numel() * tensors[0].shape[-1]
        if base == "scaled_dot_product_attention" and len(tensors) >= 3:
            q, k = tensors[0], tensors[1]
            return 4.0 * q.numel() * k.shape[-2]
    except (RuntimeError, TypeError, ValueError, IndexError, AttributeError):
        pass
    return 0.0


def kernel_cost(func: Any, base: str, args: tuple, kwargs: dict, out: Any) -> tuple[float, float]:
    """(duration in seconds, width) of one operator on the stand-in GPU, from its meta inputs and outputs."""
    from torch.utils._pytree import tree_flatten

    ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    moved = sum(_nbytes(t) for t in ins + outs)
    work = flops(func, base, args, kwargs, out)
    dtype = next((t.dtype for t in ins if t.is_floating_point()), torch.float32)
    elements = max((t.numel() for t in outs), default=1)
    width = min(1.0, max(elements, 1) / SATURATION)
    return LAUNCH_S + max(work / _rate(dtype, base), moved / RATES["bandwidth"]), width


def copy_cost(nbytes: int, pinned: bool) -> float:
    """Seconds of a host<->device copy of ``nbytes`` (on a copy engine)."""
    return COPY_LATENCY_S + nbytes / RATES["pinned" if pinned else "pageable"]
