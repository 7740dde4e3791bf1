"""Check stream-ordering code without a GPU: a recording stand-in for ``torch.get_device_module(device)``.

On a CPU, ``torch.cpu.Stream``/``Event`` exist but do nothing, so code written against the device module runs,
yet a missing ``wait_event`` cannot show. :class:`RecordingDevice` offers the same calls (``Stream``,
``Event``, ``stream``, ``current_stream``, ``synchronize``) and keeps, per stream, a vector clock of what it has
waited for. Inside :meth:`RecordingDevice.run`, every torch call is recorded with the stream it was issued on
(in-place ops and ``Tensor.to(device)`` count as writes, every tensor argument as a read); nothing is judged
while the code runs. Afterwards, :meth:`RecordingDevice.races` lists pairs of accesses to the same memory, at
least one a write, that no ``wait_event``/``wait_stream``/synchronize orders: exactly the bugs that would corrupt
data on a GPU. ``Tensor.record_stream`` calls are recorded (and skipped); :meth:`missing_record_stream` lists
memory made on one stream and used on another without it.

The rules (vector clocks, happens-before, what is a race, when the caching allocator may reuse memory) are those
of :mod:`fakegpu.ordering`, which the rehearsal's stand-ins (:mod:`fakegpu.standins.order`) apply as each use is
issued. Lessons 09 and 10 (their exercises and contract tests) use this recorder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from fakegpu.ordering import Clock, conflict, join, next_tick, ordered, unsafe_to_reuse


class FakeStream(torch.Stream):
    """A stream of :class:`RecordingDevice`: a queue whose order is tracked by a vector clock."""

    def __new__(cls, dev: RecordingDevice, name: str) -> FakeStream:
        self = super().__new__(cls, "cpu")
        self.dev, self.name, self.sid, self.clock = dev, name, len(dev.streams), {}
        dev.streams.append(self)
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<stream {self.name}>"

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def tick(self) -> Clock:
        """An operation is issued on this stream: it follows what the host has waited for."""
        self.clock = next_tick(self.clock, self.sid, self.dev.host)
        return dict(self.clock)

    def wait_stream(self, other: FakeStream) -> None:
        self.dev.log.append(("wait_stream", self.name, other.name))
        self.clock = join(self.clock, other.clock)

    def wait_event(self, event: FakeEvent) -> None:
        self.dev.log.append(("wait_event", self.name, event.name))
        self.clock = join(self.clock, event.clock)

    def record_event(self, event: FakeEvent | None = None) -> FakeEvent:
        event = event or self.dev.Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        self.dev.host = join(self.dev.host, self.clock)

    def query(self) -> bool:
        return True


class FakeEvent:
    """An event of :class:`RecordingDevice`: ``record`` snapshots a stream's clock, ``wait`` joins it."""

    def __init__(self, dev: RecordingDevice, **kwargs: Any) -> None:
        self.dev, self.clock, self.recorded = dev, {}, False
        self.name = f"event{len(dev.events)}"
        dev.events.append(self)

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream or self.dev.current
        self.dev.log.append(("record", stream.name, self.name))
        self.clock, self.recorded = dict(stream.clock), True

    def wait(self, stream: FakeStream | None = None) -> None:
        (stream or self.dev.current).wait_event(self)

    def synchronize(self) -> None:
        self.dev.host = join(self.dev.host, self.clock)

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: FakeEvent) -> float:
        return 0.0


@dataclass
class Access:
    op: str
    stream: FakeStream
    clock: Clock
    write: bool
    index: int


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


_METADATA = {
    "__get__", "__set__", "data_ptr", "untyped_storage", "dim", "size", "numel", "element_size", "is_contiguous",
    "stride", "storage_offset", "__len__", "__repr__", "__format__", "is_pinned", "__hash__", "get_device",
}  # fmt: skip


class _Recorder(TorchFunctionMode):
    def __init__(self, dev: RecordingDevice) -> None:
        super().__init__()
        self.dev = dev

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        dev = self.dev
        if name == "record_stream":
            dev.recorded_streams.setdefault(dev.key(args[0]), set()).add(args[1])
            dev.log.append(("record_stream", args[1].name, ""))
            return None
        if name in {"pin_memory", "is_pinned"}:
            return args[0] if name == "pin_memory" else True
        moves = name == "to" and any(isinstance(a, (str, torch.device)) for a in (*args[1:], kwargs.get("device")))
        out = args[0].clone() if moves else func(*args, **kwargs)  # a device copy makes new memory
        if name in _METADATA:
            return out
        stream = dev.current
        if name.startswith("empty"):  # allocation only, no kernel: the memory belongs to this stream
            for t in _tensors(out):
                dev.origin.setdefault(dev.key(t), stream)
            return out
        clock = stream.tick()
        idx = len(dev.log)
        dev.log.append((name, stream.name, ""))
        inputs = {dev.key(t) for t in _tensors((args, kwargs))}
        in_place = args and isinstance(args[0], torch.Tensor) and (name == "__setitem__" or (
            name.endswith("_") and not name.startswith("__")))  # fmt: skip
        written = {dev.key(args[0])} if in_place else set()
        for t in _tensors(out):
            k = dev.key(t)
            if k not in inputs:  # fresh memory (a view of an input is no new memory)
                written.add(k)
                dev.origin.setdefault(k, stream)
        for k in inputs | written:
            dev.access.setdefault(k, []).append(Access(name, stream, clock, k in written, idx))
        return out


class RecordingDevice:
    """A device module for ``torch.get_device_module`` that records stream ordering (see the module doc)."""

    def __init__(self) -> None:
        self.streams: list[FakeStream] = []
        self.events: list[FakeEvent] = []
        self.host: Clock = {}
        self.log: list[tuple[str, str, str]] = []
        self.access: dict[int, list[Access]] = {}
        self.origin: dict[int, FakeStream] = {}
        self.recorded_streams: dict[int, set] = {}
        self._alive: list[torch.Tensor] = []  # keep every tensor alive: no address reuse during a run
        self.default = FakeStream(self, "default")
        self.current = self.default

    # the device-module API ---------------------------------------------------------------------------
    def Stream(self, *args: Any, **kwargs: Any) -> FakeStream:  # noqa: N802 - mirrors torch.cuda.Stream
        return FakeStream(self, f"stream{len(self.streams)}")

    def Event(self, *args: Any, **kwargs: Any) -> FakeEvent:  # noqa: N802 - mirrors torch.cuda.Event
        return FakeEvent(self, **kwargs)

    def current_stream(self, device: Any = None) -> FakeStream:
        return self.current

    def default_stream(self, device: Any = None) -> FakeStream:
        return self.default

    @contextlib.contextmanager
    def stream(self, s: FakeStream | None) -> Iterator[None]:
        prev, self.current = self.current, s or self.current
        try:
            yield
        finally:
            self.current = prev

    def synchronize(self, device: Any = None) -> None:
        for s in self.streams:
            self.host = join(self.host, s.clock)

    def is_available(self) -> bool:
        return True

    # recording -----------------------------------------------------------------------------------------
    def key(self, t: torch.Tensor) -> int:
        self.keep(t)
        return t.untyped_storage().data_ptr()

    def keep(self, obj: Any) -> None:
        self._alive.extend(_tensors(obj))

    @contextlib.contextmanager
    def run(self, device: str = "cpu") -> Iterator[RecordingDevice]:
        """Within the block, ``torch.get_device_module(device)`` returns this recorder and torch calls are logged."""
        original: Callable[..., Any] = torch.get_device_module

        def patched(d: Any = None) -> Any:
            return self if d is None or torch.device(d).type == torch.device(device).type else original(d)

        torch.get_device_module = patched
        try:
            with _Recorder(self):
                yield self
        finally:
            torch.get_device_module = original

    before = staticmethod(ordered)  # access ``a`` is ordered before ``b`` (see fakegpu.ordering)

    def races(self) -> list[tuple[Access, Access]]:
        """Pairs of accesses to the same memory, one a write, on different streams, that nothing orders."""
        out = []
        for accesses in self.access.values():
            for i, a in enumerate(accesses):
                out.extend((a, b) for b in accesses[i + 1 :] if conflict(a, b))
        return out

    def missing_record_stream(self) -> list[tuple[Access, FakeStream]]:
        """Memory made on one stream, used on another, whose maker never waited for that use and that has no
        ``record_stream`` for it: the caching allocator could hand it out again while the other stream reads."""
        out = []
        for k, accesses in self.access.items():
            made = self.origin.get(k)
            if made is None:
                continue
            recorded = {s.sid for s in self.recorded_streams.get(k, set())}
            out.extend((a, made) for a in accesses if unsafe_to_reuse(a, made, recorded))
        return out

    def streams_used(self, op: str) -> set[str]:
        """Names of the streams on which torch calls named ``op`` were issued."""
        return {s for name, s, _ in self.log if name == op}


def describe(race: tuple[Access, Access]) -> str:
    a, b = race
    kind = lambda x: "writes" if x.write else "reads"  # noqa: E731
    return (f"'{a.op}' on {a.stream.name} {kind(a)} memory that '{b.op}' on {b.stream.name} {kind(b)}, and no "
            "event or wait_stream orders them")  # fmt: skip
