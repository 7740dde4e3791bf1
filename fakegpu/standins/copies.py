"""Copies between host and stand-in device memory, and indexing that reads data, under CUDA's rules.

* A blocking copy (``.cuda()``, ``.cpu()``, ``copy_`` without ``non_blocking``) waits for the current stream and
  for the copy itself.
* ``non_blocking=True`` is asynchronous only with pinned host memory: the copy is queued and reads (host to
  device) or writes (device to host) the host memory when it runs. A copy to pinned memory lands when the host
  waits for its stream; until then the buffer holds poison (NaN), so a read before the wait fails the lesson's
  own parity check. PyTorch allocates the result of ``.to("cpu", non_blocking=True)`` in pinned memory.
* From pageable memory, ``non_blocking=True`` runs synchronously (CUDA waits for the stream, then stages the data
  through a pinned buffer while the CPU waits); it is reported, and on a side stream, where a copy can only be
  meant to overlap, it is an error.
* Indexing with tensors or lists reads data: ordered after the current stream's work.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from fakegpu.standins import clock as costs
from fakegpu.standins.issue import order, place
from fakegpu.standins.streams import MODEL
from fakegpu.standins.tensor import (
    HOOKS,
    STATE,
    RehearsalError,
    Rehearsed,
    is_pinned,
    key_of,
    mark_pinned,
    poison,
    unwrap,
    wrap,
)


def to_device(src: torch.Tensor, non_blocking: bool, dst: Rehearsed | None = None,
              dtype: torch.dtype | None = None) -> Rehearsed:  # fmt: skip
    """A host-to-device copy (``.cuda()``, ``.to("cuda")``, ``dst.copy_(host)``) under CUDA's rules."""
    pinned = is_pinned(src)
    host = src.detach()
    if STATE.capture is not None:
        STATE.capture.forbid("a host-to-device copy from CPU memory created outside the graph's static buffers")
    out = dst if dst is not None else wrap(torch.empty_like(host, dtype=dtype or host.dtype))
    stream = MODEL.current
    if non_blocking and not pinned:
        STATE.count("non_blocking copies from pageable memory (synchronous)")
        if stream is not MODEL.default:
            raise RehearsalError(
                f"a non_blocking=True host-to-device copy on {stream.name}, where a copy can only be meant to "
                "overlap, reads pageable host memory: CUDA first waits for the stream, then stages the data through "
                "a pinned buffer while the CPU waits, so the copy overlaps nothing (this stream code's timing shows "
                "no overlap, and a 'pinned' timing of it is a pageable one). Fix: pin the host tensor "
                "(.pin_memory(), DataLoader(pin_memory=True)) (rehearsal stand-in)"
            )
        STATE.note("a non_blocking=True copy from pageable host memory ran synchronously (CUDA stages it through "
                   "a pinned buffer while the CPU waits): pin the host tensor for an asynchronous copy")  # fmt: skip
    elif pinned:
        STATE.count("copies from pinned memory")
    key = {key_of(out.elem)}
    clock = order("copy host->device", "copy_", set(), key if dst is not None else set(), key if dst is None else set())
    place("h2d", costs.copy_cost(host.numel() * host.element_size(), pinned))
    if non_blocking and pinned:
        target = out.elem  # the queued copy holds the memory, not the tensor (which the program may drop)
        MODEL.enqueue(stream, clock, lambda: target.copy_(host))  # reads the host memory when it runs
        return out
    MODEL.host_sync(stream.clock, "a blocking host-to-device copy", stream.ready)
    out.elem.copy_(host)
    return out


def to_host(src: Rehearsed, non_blocking: bool, dst: torch.Tensor | None = None,
             convert: dict | None = None) -> torch.Tensor:  # fmt: skip
    """A device-to-host copy (``.cpu()``, ``.to("cpu")``, ``host.copy_(x)``) under CUDA's rules."""
    if STATE.capture is not None:
        STATE.capture.forbid("a host read (.cpu(), .to('cpu'), copying to host memory, printing)")
    convert = convert or {}
    if dst is None:
        dtype = convert.get("dtype") or src.dtype
        dst = torch.empty_like(src.elem, dtype=dtype, device="cpu", memory_format=torch.preserve_format)
        if non_blocking:  # PyTorch allocates the result of .to("cpu", non_blocking=True) in pinned memory
            mark_pinned(dst)
    stream = MODEL.current
    asynchronous = non_blocking and is_pinned(dst)
    if non_blocking and not asynchronous:
        STATE.count("non_blocking copies to pageable memory (synchronous)")
    clock = order("copy device->host", "copy_", {key_of(src.elem)}, set(), set())
    place("d2h", costs.copy_cost(src.numel() * src.element_size(), is_pinned(dst)))
    elem = src.elem
    if asynchronous:
        poison(dst)  # until the copy lands, the host sees what was there: modelled as NaN
        STATE.count("asynchronous copies to the host")
        MODEL.enqueue(stream, clock, lambda: dst.copy_(elem))
        return dst
    MODEL.host_sync(stream.clock, "a blocking device-to-host copy", stream.ready)
    dst.copy_(elem)
    return dst


def _advanced(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return not all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in parts)


def getitem(t: Rehearsed, index: Any) -> torch.Tensor:
    """``t[index]``: a view at once; indexing with tensors or lists reads data: ordered, after the stream's work."""
    plain = unwrap(index)
    if not _advanced(index):
        return wrap(t.elem[plain])
    reads = {key_of(t.elem)} | {key_of(i.elem) for i in tree_flatten(index)[0] if isinstance(i, Rehearsed)}
    order("__getitem__", "index", reads, set(), set())
    MODEL.flush_to(MODEL.current)
    result = t.elem[plain]
    MODEL.made(key_of(result), MODEL.current)
    place("compute", costs.LAUNCH_S + result.numel() * result.element_size() / costs.RATES["bandwidth"])
    return wrap(result)


def setitem(t: Rehearsed, index: Any, value: Any) -> None:
    """``t[index] = value``: through a view when the index is basic, else ordered after the stream's work."""
    if not _advanced(index):
        view = t[index]
        if isinstance(value, torch.Tensor):
            view.copy_(value)
        else:
            torch.ops.aten.fill_.Scalar(view, value)
        return
    if STATE.capture is not None:
        STATE.capture.forbid("an indexed write (__setitem__ with a tensor index) that the stand-in cannot record")
    reads = {key_of(i.elem) for i in tree_flatten((index, value))[0] if isinstance(i, Rehearsed)}
    order("__setitem__", "index_put_", reads, {key_of(t.elem)}, set())
    MODEL.flush_to(MODEL.current)
    t.elem[unwrap(index)] = value.elem if isinstance(value, Rehearsed) else value
    place("compute", costs.LAUNCH_S)


HOOKS.getitem, HOOKS.setitem = getitem, setitem  # what Rehearsed's indexing calls (tensor.py sits below this file)
