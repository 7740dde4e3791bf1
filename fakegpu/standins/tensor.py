"""The rehearsal's "CUDA" tensor: a CPU tensor wrapped as ``cuda:0``, and the bookkeeping of the stand-in GPU.

:class:`Rehearsed` is a wrapper subclass (``torch.Tensor._make_wrapper_subclass``) whose ``device`` reads
``cuda:0``, so Python-level device branches (torchvision's CUDA resize, ``x.is_cuda``, autocast) behave as on a
GPU, while every operator runs on the wrapped CPU tensor, later, when something waits for it (:mod:`.dispatch`
checks and queues each operator; :mod:`.streams` runs the queues). :class:`State` keeps the live stand-in storages
(``torch.cuda.memory_allocated`` and friends; a total above the stand-in GPU's memory raises
``torch.OutOfMemoryError``), the counters of what was enforced, and which host tensors are pinned.

Stand-in device pointers (``data_ptr()``) are host addresses plus :data:`DEVICE_TAG`, so a host pointer passed
where a device pointer is needed (TensorRT, ONNX Runtime IOBinding, pycuda) is recognised and refused.

This file is the floor of the stand-in GPU: it imports none of the files above it. What a tensor needs from them
(the dispatcher, indexing copies, the memory history, a graph's replay) it calls through :data:`HOOKS`, which those
files fill in when they are imported; the package's ``__init__`` imports them, so every slot is set before a
stand-in tensor exists.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

DEVICE_TAG = 1 << 56  # stand-in device addresses: host address + tag (host addresses are below 2**47)
CUDA = torch.device("cuda", 0)
DEVICE_COUNT = 1


class RehearsalError(RuntimeError):
    """A rule CUDA enforces (or a GPU would silently break) was broken inside a rehearsed GPU section."""


class Hooks:
    """The slots the files above this one fill in when they are imported (see the module doc)."""

    dispatch: Callable[[Any, tuple, dict], Any] | None = None  # .dispatch.dispatch: every operator on a stand-in
    run_into: Callable[[Any, Any, Any, list], None] | None = None  # .dispatch.run_into: a graph replay's operator
    getitem: Callable[[Any, Any], torch.Tensor] | None = None  # .copies.getitem: ``t[index]``
    setitem: Callable[[Any, Any, Any], None] | None = None  # .copies.setitem: ``t[index] = value``
    on_memory_event: Callable[[str, int, int], None] | None = None  # .memory.on_event: the allocation history


HOOKS = Hooks()


class State:
    """Global bookkeeping of the rehearsal: live storages, counters, peak reads, an active capture."""

    def __init__(self, total_memory: int) -> None:
        self.total_memory = total_memory
        self.live: dict[int, list[int]] = {}  # storage ptr -> [refs, nbytes, generation]
        self.generation = 0
        self.allocated = 0
        self.peak = 0
        self.cached = 0  # freed bytes the "caching allocator" keeps until empty_cache()
        self.counts: dict[str, int] = {}
        self.streams: Any = None  # .streams.StreamModel, set by the rehearsal
        self.capture: Any = None  # .graphs.Capture while a CUDA graph is being captured
        self.deferred: list[str] = []  # violations found where raising is impossible (in a finalizer)
        self.notes: list[str] = []  # what the stand-ins report without failing (printed at the cell's end)
        self.allocs_since_read = 0  # allocations since the last peak read
        self.peak_raised = False  # the peak rose since the last read (or was reset)
        self.peak_read = False  # the peak was read since the last reset
        self.history: Any = None  # the allocation history while torch.cuda.memory._record_memory_history records
        self.peak_workspace: str | None = None  # what set the peak when a transient workspace did (cuDNN's search)
        self.deliberate: set[str] = set()  # mistakes the running section makes on purpose (rehearsal.DELIBERATE)

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    # memory -------------------------------------------------------------------------------------------
    def track(self, wrapper: Rehearsed) -> None:
        storage = wrapper.elem.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        entry = self.live.get(ptr)
        if entry is None:
            if self.allocated + nbytes > self.total_memory:
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {nbytes / 2**20:.2f} MiB (rehearsal stand-in GPU: "
                    f"{self.total_memory / 2**30:.2f} GiB total, {self.allocated / 2**20:.2f} MiB allocated)"
                )
            self.generation += 1
            entry = self.live[ptr] = [0, nbytes, self.generation]
            self.allocated += nbytes
            self.cached = max(0, self.cached - nbytes)
            self.allocs_since_read += 1
            if self.allocated > self.peak:
                self.peak, self.peak_raised, self.peak_workspace = self.allocated, True, None
            if self.history is not None:
                HOOKS.on_memory_event("alloc", ptr, nbytes)
        entry[0] += 1
        weakref.finalize(wrapper, self._release, ptr)

    def _release(self, ptr: int) -> None:
        entry = self.live.get(ptr)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] <= 0:
            del self.live[ptr]
            self.allocated -= entry[1]
            self.cached += entry[1]
            if self.history is not None:
                HOOKS.on_memory_event("free_completed", ptr, entry[1])
            if self.streams is not None:  # the caching allocator will hand this block out again: check it now
                self.streams.freed(ptr)

    def reserved(self) -> int:
        block = 2 * 2**20
        return -(-(self.allocated + self.cached) // block) * block

    def workspace(self, nbytes: int, what: str) -> None:
        """A workspace allocated and freed within one call (cuDNN's algorithm search): it raises the peak, never the
        current count; capped at the free memory (the search skips algorithms whose workspace does not fit)."""
        nbytes = max(0, min(nbytes, self.total_memory - self.allocated))
        self.allocs_since_read += 1
        if self.allocated + nbytes > self.peak:
            self.peak, self.peak_raised = self.allocated + nbytes, True
            self.peak_workspace = f"{nbytes / 2**20:.2f} MiB of {what}"

    def reset_peak(self) -> None:
        self.peak, self.peak_raised, self.peak_read, self.allocs_since_read = self.allocated, True, False, 0
        self.peak_workspace = None

    def read_peak(self, what: str) -> int:
        """``max_memory_allocated()`` and friends: a read whose value is a peak an earlier read already saw, after
        new work allocated memory and without ``reset_peak_memory_stats()``, reports the previous variant's peak."""
        self.count("peak-memory reads")
        if self.peak_read and self.allocs_since_read and not self.peak_raised:
            self.count("peak-memory violations")
            raise RehearsalError(
                f"{what} returned {self.peak / 2**20:.2f} MiB, the peak an earlier read already reported: the work "
                f"since then ({self.allocs_since_read} allocations) stayed below it, so this number is the previous "
                "variant's peak, not this one's. Fix: torch.cuda.reset_peak_memory_stats() (after a synchronize) "
                "before each variant (rehearsal stand-in)"
            )
        if self.peak_workspace is not None and "autotuning workspace in a peak" not in self.deliberate:
            self.count("peak-memory violations")
            found, self.peak_workspace = self.peak_workspace, None
            raise RehearsalError(
                f"{what} returned {self.peak / 2**20:.2f} MiB, a peak set by {found}: the search runs once per "
                "input shape, so this is the first call's peak, not the steady one (and a peak measured with "
                "benchmark off misses it). Fix: run one warm-up call with the flag as it will be used, then "
                "torch.cuda.reset_peak_memory_stats() before measuring (rehearsal stand-in)"
            )
        self.peak_read, self.peak_raised, self.allocs_since_read = True, False, 0
        return self.peak

    def host_address(self, ptr: int, nbytes: int) -> tuple[int, int] | None:
        """(host address, storage key) behind stand-in device pointer ``ptr`` when [ptr, ptr+nbytes) is live
        stand-in memory; None for a host pointer or freed memory."""
        host = int(ptr) - DEVICE_TAG
        for start, (_, size, _gen) in self.live.items():
            if start <= host and host + nbytes <= start + size:
                return host, start
        return None


STATE = State(total_memory=16 * 2**30)


def key_of(t: torch.Tensor) -> int:
    """The key of ``t``'s memory in the stand-in's bookkeeping: its storage's address."""
    return t.untyped_storage().data_ptr()


def wrap(elem: torch.Tensor) -> Rehearsed:
    return Rehearsed(elem)


def leaves(obj: Any) -> list:
    """The leaves of an operator's arguments or results (tuples, lists and dicts of them), in order: a fast
    ``tree_flatten`` for what the dispatcher passes."""
    if isinstance(obj, (tuple, list)):
        return [leaf for o in obj for leaf in leaves(o)]
    if isinstance(obj, dict):
        return [leaf for o in obj.values() for leaf in leaves(o)]
    return [obj]


def fmap(fn: Any, obj: Any) -> Any:
    """``fn`` applied to every leaf, the containers kept (a fast ``tree_map`` for the dispatcher's arguments)."""
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(fmap(fn, o) for o in obj)
    if isinstance(obj, list):
        return [fmap(fn, o) for o in obj]
    if isinstance(obj, dict):
        return {k: fmap(fn, v) for k, v in obj.items()}
    return fn(obj)


def unwrap(obj: Any) -> Any:
    return fmap(lambda t: t.elem if isinstance(t, Rehearsed) else t, obj)


def check_index(device: Any, what: str) -> None:
    """A CUDA device index beyond the stand-in's one GPU raises as CUDA does (``cuda:1``, ``set_device(3)``)."""
    if device is None:
        return
    try:
        dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    except (RuntimeError, TypeError):
        return
    if dev.type == "cuda" and dev.index is not None and not 0 <= dev.index < DEVICE_COUNT:
        raise RehearsalError(
            f"CUDA error: invalid device ordinal ({what} asked for cuda:{dev.index}; the rehearsal's stand-in has "
            f"{DEVICE_COUNT} GPU, cuda:0, as torch.cuda.device_count() says)"
        )


def mark_pinned(t: torch.Tensor) -> torch.Tensor:
    STATE.count("pinned host buffers")
    t._rehearsal_pinned = True
    return t


def is_pinned(t: torch.Tensor) -> bool:
    """Pinned on the stand-in: made by ``pin_memory()``, a pinned factory or loader, or a view of such a tensor."""
    return bool(getattr(t, "_rehearsal_pinned", False) or getattr(t._base, "_rehearsal_pinned", False))


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill host memory a copy has not reached yet: NaN, or the largest value for integers (True for bool)."""
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).max)
    return t


class Rehearsed(torch.Tensor):
    """A CPU tensor that reads as ``cuda:0`` (see the module doc). Never requires grad (the CUDA runtime would
    be called by autograd): training in a rehearsed section is not rehearsable."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> Rehearsed:
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            device=CUDA, requires_grad=False, layout=elem.layout,
        )  # fmt: skip

    def __init__(self, elem: torch.Tensor) -> None:
        self.elem = elem
        STATE.track(self)

    __torch_function__ = torch._C._disabled_torch_function_impl

    def _host_view(self, what: str) -> torch.Tensor:
        """The wrapped tensor as the host would see it after a blocking copy: the current stream has finished."""
        if STATE.capture is not None:
            STATE.capture.forbid(f"a host read ({what})")
        if STATE.streams is not None:
            STATE.streams.raise_deferred()
            STATE.streams.wait_current(f"a host read ({what})")
        return self.elem

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return repr(self._host_view("printing a CUDA tensor"))[:-1] + ", device='cuda:0')"

    def data_ptr(self) -> int:
        return self.elem.data_ptr() + DEVICE_TAG

    def untyped_storage(self) -> torch.UntypedStorage:
        return self.elem.untyped_storage()

    def requires_grad_(self, requires_grad: bool = True) -> Rehearsed:
        if requires_grad:
            STATE.count("parameters kept without grad")
        return self

    def record_stream(self, stream: Any) -> None:
        STATE.streams.record_stream(key_of(self.elem), stream)

    def pin_memory(self, *args: Any) -> Rehearsed:
        raise RuntimeError("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned")

    def is_pinned(self, *args: Any) -> bool:
        return False

    # Python bindings that set a CUDA device guard before dispatch (it would call the CUDA runtime): routed
    # through the dispatcher (torch.ops) or through the host copy instead.
    def copy_(self, src: torch.Tensor, non_blocking: bool = False) -> Rehearsed:
        return torch.ops.aten.copy_.default(self, src, non_blocking)

    def nonzero(self, *, as_tuple: bool = False) -> Any:
        out = torch.ops.aten.nonzero.default(self)
        return tuple(out.unbind(1)) if as_tuple else out

    def __getitem__(self, index: Any) -> torch.Tensor:
        return HOOKS.getitem(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        HOOKS.setitem(self, index, value)

    def item(self) -> Any:
        return self.cpu().item()

    def tolist(self) -> Any:
        return self.cpu().tolist()

    def __float__(self) -> float:
        return float(self.cpu())

    def __int__(self) -> int:
        return int(self.cpu())

    def __index__(self) -> int:
        return self.cpu().__index__()

    def __bool__(self) -> bool:
        return bool(self.cpu())

    def __format__(self, spec: str) -> str:
        return self.cpu().__format__(spec) if self.dim() == 0 else repr(self)

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "can't convert cuda:0 device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first."
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001
        return HOOKS.dispatch(func, args, kwargs or {})
