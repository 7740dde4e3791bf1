"""Lesson 10 exercise: the event-ordered double-buffer loop, checked for parity and for stream ordering.

The check draws its case at random per call (number of chunks, their shape, the model's channels; the seed is
printed on failure) and runs the learner's function twice on the CPU: through the real
``torch.get_device_module("cpu")`` (stand-in streams: outputs must match the model's), and through
:class:`fakegpu.streamcheck.RecordingDevice`, which records on which stream every copy and kernel was
issued and which events and waits order them. The caller's stream has work queued before the call, as in a real
program. Then once more on "cuda" (the GPU, or the rehearsal's stand-in whose tensors enforce placement), the model
on the device and the chunks in pinned host memory: outputs must match there too. It rejects:

* a data race (a compute that may read a buffer before its copy finished, a copy that may overwrite a buffer
  still being read, results read before the compute stream is joined);
* buffers allocated on the caller's stream and written on the copy stream before it waited for the caller;
* outputs made on the compute stream and handed to the caller without ``record_stream``;
* copies and compute on one stream, anything but two reused buffers, a model call per chunk other than one on
  the buffer, outputs that are not those calls' results (the baseline computed aside);
* zero overlap: copy i+1 waiting for compute i, or compute i waiting for copy i+1;
* ``synchronize()`` (host waits) instead of events (compute i may wait for copy i's event or, issued right after
  copy i, for the copy stream: ``comp_s.wait_stream(copy_s)`` gives the same order and is accepted);
* buffers left in host memory (``torch.empty_like(chunks[0])`` without ``device=device``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from course_checks.exercises import exercise, observed
from course_checks.lesson_exercises.observe import cases, forbid
from course_utils.from_lessons.l10_streams import double_buffered_loop
from fakegpu.streamcheck import FakeEvent, FakeStream, RecordingDevice, describe

Loop = Callable[[torch.nn.Module, Sequence[torch.Tensor], str], list[torch.Tensor]]

_SYNC = (
    "synchronize() makes the host wait, so nothing is queued ahead and the streams take turns: order the streams "
    "with events instead (copied[k].record(copy_s), comp_s.wait_event(copied[k]); freed[k] the other way)"
)


def _check_parity(outs: object, ref: list[torch.Tensor], where: str) -> None:
    assert isinstance(outs, (list, tuple)) and len(outs) == len(ref), (
        f"{where}: return a list with one output per chunk ({len(ref)}), in order"
    )
    for i, (a, b) in enumerate(zip(outs, ref, strict=True)):
        assert isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, atol=1e-5), (
            f"{where}: output {i} differs from model(chunks[{i}])"
        )


def _check_double_buffer(fn: Loop) -> None:
    with cases("10.double-buffer") as c:
        cin, cout, n = c.randint(2, 4), c.randint(3, 6), c.randint(4, 7)
        side = c.randint(6, 10)
        model = torch.nn.Conv2d(cin, cout, 3).eval()
        with torch.no_grad():
            model.weight.copy_(c.randn(*model.weight.shape))
            model.bias.copy_(c.randn(cout))
        batch = c.randint(1, 3)
        chunks = [c.randn(batch, cin, side, side) for _ in range(n)]
        with torch.inference_mode():
            ref = [model(ch) for ch in chunks]
            _check_parity(fn(model, chunks, "cpu"), ref, "on torch.cpu's streams")
        dev = RecordingDevice()
        host = _HostWaits(dev)
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.inference_mode())
            stack.enter_context(dev.run("cpu"))
            for owner in (dev, FakeStream, FakeEvent):
                stack.enter_context(forbid(synchronize=(owner, _SYNC)))
            stack.enter_context(host.watching())
            torch.zeros(4).add_(1)  # the caller's stream has work queued before the call
            entry = dev.default.clock.get(dev.default.sid, 0)
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
        copies = sorted(
            (a for accesses in dev.access.values() for a in accesses if a.op == "copy_" and a.write),
            key=lambda a: a.index,
        )
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
        reads = sorted((a for k in buffers for a in dev.access[k] if a.op == "conv2d"), key=lambda a: a.index)
        convs = [name for name, _, _ in dev.log if name == "conv2d"]
        assert len(reads) == len(convs) == n, (
            f"the model ran {len(convs)} times, {len(reads)} of them on the buffers, for {n} chunks: call it once per "
            "chunk, on the buffer the chunk was copied into (not on the chunk itself or on a throwaway input)"
        )
        for i in range(min(len(copies) - 1, len(reads))):
            assert not dev.before(reads[i], copies[i + 1]), (
                f"the host waited for the GPU ({host.waits[0]}): {_HOST_SYNC}"
                if host.waits
                else f"copy {i + 1} waits until compute {i} is done, so they never overlap: copy i+1 goes into the "
                "OTHER buffer and needs to wait only for compute i-1 (the last user of that buffer)"
            )
            assert not dev.before(copies[i + 1], reads[i]), (
                f"compute {i} waits for copy {i + 1}, so they never overlap: wait for copy i's own event "
                "(comp_s.wait_event(copied[k])), not for everything on the copy stream issued later"
            )
        waits = [(s, e) for op, s, e in dev.log if op == "wait_event"]
        records = [(s, e) for op, s, e in dev.log if op == "record"]
        # compute i may wait for copy i's event, or for the copy stream itself (wait_stream) issued right after copy
        # i: everything issued there so far is copy i, the same order (waiting later, after copy i+1, is rejected
        # above as no overlap)
        joins = [(s, e) for op, s, e in dev.log if op == "wait_stream" and e in copy_streams]
        assert sum(s in compute_streams for s, _ in waits + joins) >= n, (
            "order the two streams on the device: after each copy record an event on the copy stream and make the "
            "compute stream wait_event for it (or comp_s.wait_stream(copy_s) right after issuing the copy), and "
            "the reverse for reusing a buffer"
        )
        early = [
            a
            for k, accesses in dev.access.items()
            if dev.origin.get(k) is dev.default
            for a in accesses
            if a.stream is not dev.default and a.clock.get(dev.default.sid, 0) < entry
        ]
        assert not early, (
            f"'{early[0].op}' on {early[0].stream.name} used memory allocated on the caller's stream before that "
            "stream waited for the caller: the allocator reuses a block in the caller's stream order, so the "
            "caller's earlier kernels may still use it. After allocating the buffers: copy_s.wait_stream(caller) "
            "(and comp_s too)"
        )
        missing = dev.missing_record_stream()
        if missing:
            use, made = missing[0]
            memory = next(k for k, accesses in dev.access.items() if any(a is use for a in accesses))
            outputs = {o.untyped_storage().data_ptr() for o in outs if isinstance(o, torch.Tensor)}
            assert memory in outputs, (
                f"memory made on {made.name} that is not an output (a buffer allocated inside `with dm.stream(...)`) "
                f"is used by '{use.op}' on {use.stream.name} without record_stream: when it is freed the allocator "
                f"could hand it out again on {made.name} while {use.stream.name} still reads it. Allocate the buffers "
                "on the caller's stream (before the `with` blocks) and make both streams wait_stream(caller), or "
                f"call buf.record_stream(...) for the other stream"
            )
            raise AssertionError(
                f"memory made on {made.name} is used on {use.stream.name} without record_stream: the outputs were "
                "allocated on the compute stream and are read on the caller's, so when they are freed the allocator "
                "could hand them out again while the caller still reads. Call out.record_stream(caller) (guarded by "
                "`not isinstance(caller, torch.cpu.Stream)`, not by the device string: this check passes "
                "device='cpu' to a recording device whose streams do need it; torch.cpu's stand-in streams have no "
                "allocator)"
            )
        where = _on_the_gpu(fn, model, chunks, ref)
    observed(
        f"{n} chunks on the recording device: {len(copies)} copies on {sorted(copy_streams)} into 2 reused "
        f"buffers, {len(reads)} model calls on them on {sorted(compute_streams)}, ordered by "
        f"{len(records)} recorded events, {len(waits)} event waits and {len(joins)} waits for the copy stream; "
        "no data race, copy i+1 not ordered "
        "after compute i (nor compute i after copy i+1); outputs equal to model(chunk) on torch.cpu's streams and "
        f"on {where} (pinned host chunks, the model on the device)"
    )


def _on_the_gpu(fn: Loop, model: torch.nn.Module, chunks: list[torch.Tensor], ref: list[torch.Tensor]) -> str:
    """The loop run where it is meant to run: the model on "cuda" (the rehearsal's stand-in without a GPU, whose
    tensors enforce placement), the chunks in pinned host memory; its outputs against ``ref``. Returns where."""
    import copy

    from course_checks.lesson_exercises.observe import gpu, on_standin
    from fakegpu.standins.rehearsal import RehearsalError

    with gpu() as device:
        where = "the rehearsal's stand-in GPU" if on_standin() else "the GPU"
        on_device = copy.deepcopy(model).to(device)
        pinned = [ch.pin_memory() for ch in chunks]
        try:
            with torch.inference_mode():
                outs = fn(on_device, pinned, device)
        except (RehearsalError, RuntimeError) as exc:
            placement = "device" in str(exc)
            raise AssertionError(
                f"on {where} (device={device!r}, the chunks in pinned host memory) your loop failed: {exc}"
                + (
                    ". The buffers must live on the device the model runs on: "
                    "torch.empty_like(chunks[0], device=device) (empty_like alone copies the chunk's place, the host)"
                    if placement
                    else ""
                )
            ) from None
        _check_parity([o.cpu() if isinstance(o, torch.Tensor) else o for o in outs] if isinstance(outs, (list, tuple))
                      else outs, ref, f"on {where}")  # fmt: skip
    return where


_HOST_SYNC = (
    "a host read of a GPU result (.item(), .tolist(), .cpu(), bool()/float() of a tensor, printing) or polling an "
    "event or stream (.query()) waits until that work is done, so copy i+1 is issued only after compute i: the "
    "streams take turns. Read nothing on the host inside the loop; order the streams with events"
)


class _HostWaits(TorchFunctionMode):
    """Host synchronizations the recording device does not model, modelled: a host read of a tensor (``.item()``,
    ``.tolist()``, ``.cpu()``, ``bool()``...) waits for the last write to its memory, ``query()`` of an event or stream
    for what it recorded; the host's clock joins theirs, so later work is ordered after them, as on a GPU."""

    READS = {
        "item",
        "tolist",
        "cpu",
        "numpy",
        "__bool__",
        "__float__",
        "__int__",
        "__index__",
        "__repr__",
        "__format__",
    }

    def __init__(self, dev: RecordingDevice) -> None:
        super().__init__()
        self.dev, self.waits = dev, []

    def _wait(self, clock: dict[int, int], what: str) -> None:
        self.dev.host = {k: max(self.dev.host.get(k, 0), clock.get(k, 0)) for k in self.dev.host.keys() | clock.keys()}
        self.waits.append(what)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = getattr(func, "__name__", "")
        if name in self.READS and args and isinstance(args[0], torch.Tensor):
            writes = [a for a in self.dev.access.get(args[0].untyped_storage().data_ptr(), []) if a.write]
            if writes:
                self._wait(writes[-1].clock, f".{name}() of a result of '{writes[-1].op}' on {writes[-1].stream.name}")
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        def query(obj: Any) -> bool:
            self._wait(dict(obj.clock), f"{type(obj).__name__.removeprefix('Fake').lower()}.query()")
            return True

        saved = (FakeEvent.query, FakeStream.query)
        FakeEvent.query = FakeStream.query = query  # type: ignore[method-assign]
        try:
            with self:
                yield
        finally:
            FakeEvent.query, FakeStream.query = saved  # type: ignore[method-assign]


# The reference is lesson 10's own loop (exported from its cell, one copy): the lesson shows it after the exercise.
double_buffered = exercise(
    "10.double-buffer",
    "Two streams (dm.Stream()), two buffers allocated once, then copy_s.wait_stream(caller) and "
    "comp_s.wait_stream(caller); per chunk i: on the copy stream wait for the event compute i-2 recorded, copy_ "
    "into buffer i % 2, record an event; on the compute stream wait for it (or comp_s.wait_stream(copy_s): the same "
    "order), run the model, record an event; "
    "out.record_stream(caller) unless isinstance(caller, torch.cpu.Stream); finally caller.wait_stream(comp_s).",
    _check_double_buffer,
    time_limit=60,
)(double_buffered_loop)
