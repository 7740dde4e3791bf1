"""The rehearsal's "CUDA" tensor: a CPU tensor wrapped as ``cuda:0`` that enforces CUDA's placement rule.

:class:`Rehearsed` is a wrapper subclass (``torch.Tensor._make_wrapper_subclass``) whose ``device`` reads
``cuda:0``, so Python-level device branches (torchvision's CUDA resize, ``x.is_cuda``, autocast) behave as on a
GPU, while every operator runs on the wrapped CPU tensor. Each operator is checked before it runs:

* **placement**: a CPU tensor (not a 0-dim scalar) meeting a stand-in CUDA tensor raises CUDA's own
  "Expected all tensors to be on the same device" error (copies and CPU index tensors are allowed, as on CUDA);
* **stream order**: every read and write is logged with the stream it was issued on (:mod:`.streams`);
* **graph capture**: inside a capture, host reads (``.item()``, ``.cpu()``) raise and operators are recorded
  for replay (:mod:`.graphs`);
* **memory**: live stand-in storages are counted for ``torch.cuda.memory_allocated`` and friends; a total
  above the stand-in GPU's memory raises ``torch.OutOfMemoryError``.

Stand-in device pointers (``data_ptr()``) are host addresses plus :data:`DEVICE_TAG`, so a host pointer
passed where a device pointer is needed (TensorRT, ONNX Runtime IOBinding) is recognised and refused.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

DEVICE_TAG = 1 << 56  # stand-in device addresses: host address + tag (host addresses are below 2**47)
CUDA = torch.device("cuda", 0)
# operators that may legally mix a CPU tensor with a CUDA one (copies; CPU index tensors)
_MIXED_OK = {
    "copy_",
    "_to_copy",
    "_copy_from",
    "_copy_from_and_resize",
    "index.Tensor",
    "index_put_",
    "index_put",
    "lift_fresh",
    "set_.source_Storage_storage_offset",
    "_index_put_impl_",
    "_has_compatible_shallow_copy_type",
    "is_same_size",
}  # fmt: skip (metadata checks of Module.to)


class RehearsalError(RuntimeError):
    """A rule CUDA enforces (or a GPU would silently break) was broken inside a rehearsed GPU section."""


class State:
    """Global bookkeeping of the rehearsal: live storages, counters, the stream model, an active capture."""

    def __init__(self, total_memory: int) -> None:
        self.total_memory = total_memory
        self.live: dict[int, list[int]] = {}  # storage ptr -> [refs, nbytes]
        self.allocated = 0
        self.peak = 0
        self.cached = 0  # freed bytes the "caching allocator" keeps until empty_cache()
        self.counts: dict[str, int] = {}
        self.streams: Any = None  # .streams.StreamModel, set by the rehearsal
        self.capture: Any = None  # .graphs.Capture while a CUDA graph is being captured
        self.deferred: list[str] = []  # violations found where raising is impossible (in a finalizer)

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

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
            entry = self.live[ptr] = [0, nbytes]
            self.allocated += nbytes
            self.cached = max(0, self.cached - nbytes)
            self.peak = max(self.peak, self.allocated)
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
            if self.streams is not None:  # the caching allocator will hand this block out again: check it now
                self.streams.freed(ptr)

    def reserved(self) -> int:
        block = 2 * 2**20
        return -(-(self.allocated + self.cached) // block) * block

    def host_address(self, ptr: int, nbytes: int) -> tuple[int, int] | None:
        """(host address, storage key) behind stand-in device pointer ``ptr`` when [ptr, ptr+nbytes) is live
        stand-in memory; None for a host pointer or freed memory."""
        host = int(ptr) - DEVICE_TAG
        for start, (_, size) in self.live.items():
            if start <= host and host + nbytes <= start + size:
                return host, start
        return None


STATE = State(total_memory=16 * 2**30)


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def wrap(elem: torch.Tensor) -> Rehearsed:
    return Rehearsed(elem)


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

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return repr(self.elem)[:-1] + ", device='cuda:0')"

    def data_ptr(self) -> int:
        return self.elem.data_ptr() + DEVICE_TAG

    def untyped_storage(self) -> torch.UntypedStorage:
        return self.elem.untyped_storage()

    def requires_grad_(self, requires_grad: bool = True) -> Rehearsed:
        if requires_grad:
            STATE.count("parameters kept without grad")
        return self

    def record_stream(self, stream: Any) -> None:
        STATE.streams.record_stream(_key(self.elem), stream)

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
        plain = tree_map(lambda t: t.elem if isinstance(t, Rehearsed) else t, index)
        if STATE.streams is not None:
            STATE.streams.use_tensor(self, "__getitem__", False)
        out = self.elem[plain]
        return out if isinstance(out, Rehearsed) else wrap(out)

    def __setitem__(self, index: Any, value: Any) -> None:
        basic = all(i is None or i is Ellipsis or isinstance(i, (int, slice))
                    for i in (index if isinstance(index, tuple) else (index,)))  # fmt: skip
        if basic:
            view = self[index]
            if isinstance(value, torch.Tensor):
                view.copy_(value)
            else:
                torch.ops.aten.fill_.Scalar(view, value)
            return
        plain = tree_map(lambda t: t.elem if isinstance(t, Rehearsed) else t, index)
        if STATE.streams is not None:
            STATE.streams.use_tensor(self, "__setitem__", True)
        self.elem[plain] = value.elem if isinstance(value, Rehearsed) else value

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
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1] + (f".{func._overloadname}" if func._overloadname != "default" else "")
        base = name.split(".")[0]
        flat, _ = tree_flatten((args, kwargs))
        cuda_in = [t for t in flat if isinstance(t, Rehearsed)]
        cpu_in = [t for t in flat if isinstance(t, torch.Tensor) and not isinstance(t, Rehearsed) and t.dim() > 0]
        if cpu_in and cuda_in and base not in _MIXED_OK and name not in _MIXED_OK:
            STATE.count("placement violations")
            raise RehearsalError(
                "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
                f"(when checking argument for {base}; rehearsal stand-in: move the CPU tensor or the module to "
                "'cuda', or the CUDA one to 'cpu')"
            )
        STATE.count("placement checks")
        to_host = base in {"_local_scalar_dense", "equal", "is_nonzero"}
        if base in {"_to_copy", "to"}:
            target = kwargs.get("device") or next((a for a in args[1:] if isinstance(a, (torch.device, str))), None)
            to_host = target is not None and torch.device(target).type == "cpu"
        if base == "copy_" and not isinstance(args[0], Rehearsed):
            to_host = True
        capture = STATE.capture
        if capture is not None and to_host:
            capture.forbid(f"a host read ({base}: .item(), .cpu(), .tolist(), printing)")
        streams = STATE.streams
        unwrapped_args = tree_map(lambda t: t.elem if isinstance(t, Rehearsed) else t, args)
        unwrapped_kwargs = tree_map(lambda t: t.elem if isinstance(t, Rehearsed) else t, kwargs)
        if base in {"_to_copy", "to"} and to_host:
            unwrapped_kwargs = {k: v for k, v in unwrapped_kwargs.items() if k != "non_blocking"}
        if base == "cudnn_batch_norm":  # CUDA picks cuDNN's kernel for a "cuda" tensor; its CPU twin has 3 outputs
            func = torch.ops.aten.native_batch_norm.default
            out = (*func(*unwrapped_args, **unwrapped_kwargs), torch.empty(0, dtype=torch.uint8))
        else:
            out = func(*unwrapped_args, **unwrapped_kwargs)
        if streams is not None and capture is None:  # captured work runs at replay, not now
            streams.access(func, name, args, kwargs, out, to_host)
        elif streams is not None:  # memory of the graph's private pool, allocated on the capture stream
            inputs = {_key(t.elem) for t in tree_flatten((args, kwargs))[0] if isinstance(t, Rehearsed)}
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and _key(t) not in inputs:
                    streams.made(_key(t), streams.current)
        if capture is not None:
            capture.record(func, unwrapped_args, unwrapped_kwargs, out)
        if to_host:
            return out
        return tree_map(lambda t: wrap(t) if isinstance(t, torch.Tensor) and not isinstance(t, Rehearsed) else t, out)


def to_standin(t: torch.Tensor, dtype: torch.dtype | None = None, copy: bool = False) -> torch.Tensor:
    """A CPU tensor copied to the stand-in device (``.cuda()``, ``.to('cuda')``); a stand-in stays as it is."""
    if isinstance(t, Rehearsed):
        return t.to(dtype) if dtype is not None else (t.clone() if copy else t)
    host = t.detach() if isinstance(t, torch.nn.Parameter) or t.requires_grad else t
    elem = host.to(dtype=dtype or host.dtype, copy=True)
    out = wrap(elem)
    if STATE.streams is not None:
        STATE.streams.host_to_device(out)
    if STATE.capture is not None:
        STATE.capture.forbid("a host-to-device copy from CPU memory created outside the graph's static buffers")
    return out
