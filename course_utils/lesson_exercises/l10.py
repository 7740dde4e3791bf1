"""Lesson 10 exercise: the event-ordered double-buffer loop, checked for parity and for stream ordering.

The check runs the learner's function twice on the CPU: through the real ``torch.get_device_module("cpu")``
(stand-in streams: outputs must match the model's), and through :class:`course_utils.streamcheck.
RecordingDevice`, which records on which stream every copy and kernel was issued and which events and waits
order them. It rejects a loop with a data race (a compute that may read a buffer before its copy finished,
a copy that may overwrite a buffer still being read, results read before the compute stream is joined),
copies and compute on one stream, anything but two reused buffers, and a loop whose copies wait for the
previous compute (correct, but nothing overlaps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..exercises import exercise
from ..streamcheck import RecordingDevice, describe

Loop = Callable[[torch.nn.Module, Sequence[torch.Tensor], str], list[torch.Tensor]]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()


def _check_parity(outs: object, ref: list[torch.Tensor], where: str) -> None:
    assert isinstance(outs, (list, tuple)) and len(outs) == len(ref), (
        f"{where}: return a list with one output per chunk ({len(ref)}), in order"
    )
    for i, (a, b) in enumerate(zip(outs, ref, strict=True)):
        assert isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, atol=1e-6), (
            f"{where}: output {i} differs from model(chunks[{i}])"
        )


def _check_double_buffer(fn: Loop) -> None:
    model = _model()
    g = torch.Generator().manual_seed(1)
    chunks = [torch.randn(2, 3, 8, 8, generator=g) for _ in range(5)]
    with torch.inference_mode():
        ref = [model(c) for c in chunks]
        _check_parity(fn(model, chunks, "cpu"), ref, "on torch.cpu's streams")
    dev = RecordingDevice()
    with torch.inference_mode(), dev.run("cpu"):
        outs = fn(model, chunks, "cpu")
        if isinstance(outs, (list, tuple)) and outs:
            torch.cat(list(outs))  # the caller reads the results on its own stream
    _check_parity(outs, ref, "with the recording device")
    races = dev.races()
    assert not races, (
        f"data race: {describe(races[0])}. Compute i must wait for copy i's event (wait_event), copy i+2 for the "
        "event compute i recorded after using the buffer, and the caller's stream for the compute stream "
        "(wait_stream) before the results are read"
    )
    copies = [a for accesses in dev.access.values() for a in accesses if a.op == "copy_" and a.write]
    assert copies, "copy each chunk into a preallocated buffer with buf.copy_(chunk, non_blocking=True)"
    copy_streams = {a.stream.name for a in copies}
    compute_streams = dev.streams_used("conv2d")
    assert copy_streams.isdisjoint(compute_streams), (
        f"copies ran on {sorted(copy_streams)} and compute on {sorted(compute_streams)}: issue copies on one "
        "stream and compute on another (with dm.stream(s): ...), or nothing can overlap"
    )
    buffers = {k for k, accesses in dev.access.items() for a in accesses if a.op == "copy_" and a.write}
    assert len(buffers) == 2, (
        f"the copies wrote into {len(buffers)} different buffers: allocate two once "
        "(torch.empty_like(chunks[0], device=device)) and alternate between them (i % 2)"
    )
    copies.sort(key=lambda a: a.index)
    reads = sorted((a for k in buffers for a in dev.access[k] if a.op == "conv2d"), key=lambda a: a.index)
    for i in range(min(len(copies) - 1, len(reads))):
        assert not dev.before(reads[i], copies[i + 1]), (
            f"copy {i + 1} waits until compute {i} is done, so they never overlap: copy i+1 goes into the OTHER "
            "buffer and needs to wait only for compute i-1 (the last user of that buffer)"
        )


@exercise(
    "10.double-buffer",
    "Two streams (dm.Stream()), two buffers; per chunk i: on the copy stream wait for the event compute i-2 "
    "recorded, copy_ into buffer i % 2, record an event; on the compute stream wait for it, run the model, record "
    "an event; finally the caller's stream waits for the compute stream.",
    _check_double_buffer,
)
def double_buffered(model: torch.nn.Module, chunks: Sequence[torch.Tensor], device: str) -> list[torch.Tensor]:
    dm = torch.get_device_module(device)
    copy_s, comp_s, caller = dm.Stream(), dm.Stream(), dm.current_stream()
    bufs = [torch.empty_like(chunks[0], device=device) for _ in range(2)]
    copied = [dm.Event() for _ in range(2)]
    freed = [dm.Event() for _ in range(2)]
    outs = []
    for i, chunk in enumerate(chunks):
        k = i % 2
        with dm.stream(copy_s):
            if i >= 2:
                copy_s.wait_event(freed[k])
            bufs[k].copy_(chunk, non_blocking=True)
            copied[k].record(copy_s)
        with dm.stream(comp_s):
            comp_s.wait_event(copied[k])
            outs.append(model(bufs[k]))
            freed[k].record(comp_s)
    caller.wait_stream(comp_s)
    return outs
