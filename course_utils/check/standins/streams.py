"""Stream order on the rehearsal's stand-in GPU: streams, events and the checks CUDA leaves to you.

Every operator on stand-in tensors is issued on the current stream and logged as reads and writes of storages.
Each stream carries a vector clock of what it has waited for (``wait_stream``, ``wait_event``; the host joins
clocks at ``synchronize``). The model raises :class:`~.tensor.RehearsalError` at once when

* a stream reads or writes memory that another stream wrote (or reads) and nothing orders the two;
* memory made on one stream is handed out again (freed, then reused) while another stream's use of it is
  neither waited for nor declared with ``record_stream``;
* ``elapsed_time`` is asked before the end event has completed, or of events made without
  ``enable_timing=True``.

The same clocks order the fake TensorRT's ``execute_async_v3`` (a stream handle is ``Stream.cuda_stream``).
It extends :mod:`course_utils.check.streamcheck` (which records a device module's calls after the fact) to
operators on stand-in memory, checked as they run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from course_utils.check.standins.tensor import STATE, RehearsalError, Rehearsed, _key
from course_utils.check.streamcheck import _join


@dataclass
class Use:
    op: str
    stream: StandinStream
    clock: dict[int, int]
    write: bool


class StandinStream:
    """``torch.cuda.Stream`` of the stand-in GPU (``cuda_stream`` is its handle for TensorRT/ORT)."""

    def __init__(self, device: Any = None, priority: int = 0, *, _name: str | None = None, **kwargs: Any) -> None:
        model = MODEL
        self.sid = len(model.streams)
        self.name = _name or f"stream{self.sid}"
        self.clock: dict[int, int] = {}
        self.priority = priority
        self.cuda_stream = 0 if self.sid == 0 else 0x5EED0000 + 16 * self.sid
        self.device = torch.device("cuda", 0)
        self.device_index, self.device_type = 0, 1
        model.streams.append(self)
        STATE.count("streams created")

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream {self.name} (rehearsal stand-in) cuda_stream={self.cuda_stream:#x}>"

    def tick(self) -> dict[int, int]:
        self.clock = _join(self.clock, MODEL.host)
        self.clock[self.sid] = self.clock.get(self.sid, 0) + 1
        return dict(self.clock)

    def wait_stream(self, stream: StandinStream) -> None:
        STATE.count("stream waits")
        self.clock = _join(self.clock, stream.clock)

    def wait_event(self, event: StandinEvent) -> None:
        STATE.count("stream waits")
        self.clock = _join(self.clock, event.clock)

    def record_event(self, event: StandinEvent | None = None) -> StandinEvent:
        event = event or StandinEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        MODEL.host_sync(self.clock, "Stream.synchronize()")

    def query(self) -> bool:
        return True

    def __enter__(self) -> StandinStream:
        self._prev = MODEL.current
        MODEL.current = self
        return self

    def __exit__(self, *exc: Any) -> None:
        MODEL.current = self._prev

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


class StandinEvent:
    """``torch.cuda.Event`` of the stand-in GPU: timing from the host clock at record (operators run at issue)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self.clock: dict[int, int] = {}
        self.stream: StandinStream | None = None
        self.t = 0.0

    def record(self, stream: StandinStream | None = None) -> None:
        self.stream = stream or MODEL.current
        self.clock = dict(self.stream.tick())
        self.t = time.perf_counter()

    def wait(self, stream: StandinStream | None = None) -> None:
        (stream or MODEL.current).wait_event(self)

    def synchronize(self) -> None:
        MODEL.host_sync(self.clock, "Event.synchronize()")

    def query(self) -> bool:
        return self.done()

    def done(self) -> bool:
        return self.stream is not None and all(MODEL.host.get(k, 0) >= v for k, v in self.clock.items())

    def elapsed_time(self, end: StandinEvent) -> float:
        STATE.count("timing checks")
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.stream is None or end.stream is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not end.done():
            raise RehearsalError(
                "CUDA error: device not ready (elapsed_time() before the end event completed: call "
                "end.synchronize() or torch.cuda.synchronize() first; rehearsal stand-in)"
            )
        return (end.t - self.t) * 1000.0


class StreamModel:
    """Clocks of the host and every stream, and the last uses of every stand-in storage."""

    def __init__(self) -> None:
        self.streams: list[StandinStream] = []
        self.host: dict[int, int] = {}
        self.uses: dict[int, list[Use]] = {}
        self.origin: dict[int, StandinStream] = {}
        self.recorded: dict[int, set[int]] = {}
        self.side_ops: set[str] = set()

    def reset(self) -> None:
        self.__init__()
        self.default = StandinStream(_name="default")
        self.current = self.default

    def host_sync(self, clock: dict[int, int], what: str) -> None:
        if STATE.capture is not None:
            STATE.capture.forbid(what)
        STATE.count("synchronizations")
        self.host = _join(self.host, clock)

    def sync_all(self) -> None:
        for s in self.streams:
            self.host_sync(s.clock, "torch.cuda.synchronize()")

    @staticmethod
    def ordered(a: Use, b: Use) -> bool:
        return a.clock[a.stream.sid] <= b.clock.get(a.stream.sid, 0)

    def use(self, key: int, op: str, write: bool, stream: StandinStream, clock: dict[int, int]) -> None:
        STATE.count("stream-order checks")
        new = Use(op, stream, clock, write)
        history = self.uses.setdefault(key, [])
        for old in history:
            if (old.write or write) and old.stream is not stream and not self.ordered(old, new):
                STATE.count("stream-order violations")
                raise RehearsalError(
                    f"stream order: '{op}' on {stream.name} {'writes' if write else 'reads'} memory that '{old.op}' "
                    f"on {old.stream.name} {'wrote' if old.write else 'reads'}, and no wait_stream, event or "
                    f"synchronize orders them (on a GPU the two may overlap: stale or torn data). Fix: "
                    f"{stream.name}.wait_stream({old.stream.name}) (or an Event recorded there) before the use."
                )
        if write:
            history[:] = [new]
        else:
            history[:] = [u for u in history if u.stream is not stream or u.write] + [new]

    def made(self, key: int, stream: StandinStream) -> None:
        """New memory at ``key`` on ``stream``; memory there before was freed: check its last uses first."""
        if key in self.origin:
            self.reused(key)
        self.origin[key] = stream

    def access(self, func: Any, name: str, args: tuple, kwargs: dict, out: Any, to_host: bool) -> None:
        self.raise_deferred()
        stream = self.current
        if stream is not self.default:
            self.side_ops.add(name.split(".")[0])
        clock = stream.tick()
        written: set[int] = set()
        for i, arg in enumerate(func._schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, Rehearsed):
                written.add(_key(value.elem))
        inputs = {_key(t.elem) for t in tree_flatten((args, kwargs))[0] if isinstance(t, Rehearsed)}
        for k in inputs - written:
            self.use(k, name, False, stream, clock)
        for k in written:
            self.use(k, name, True, stream, clock)
        if not to_host:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and not isinstance(t, Rehearsed):
                    k = _key(t)
                    if k not in inputs and k not in written:
                        self.made(k, stream)
                        self.use(k, name, True, stream, clock)
        else:
            self.host_sync(stream.clock, f"a host read ({name})")

    def use_tensor(self, t: Rehearsed, op: str, write: bool) -> None:
        """A use of ``t`` outside the dispatcher (indexing done on the wrapped tensor)."""
        self.raise_deferred()
        if STATE.capture is not None and write:
            STATE.capture.forbid(f"an indexed write ({op}) that the stand-in cannot record")
        self.use(_key(t.elem), op, write, self.current, self.current.tick())

    def host_to_device(self, t: Rehearsed) -> None:
        self.raise_deferred()
        k = _key(t.elem)
        self.made(k, self.current)
        self.use(k, "copy host->device", True, self.current, self.current.tick())

    def record_stream(self, key: int, stream: StandinStream) -> None:
        STATE.count("record_stream calls")
        self.recorded.setdefault(key, set()).add(stream.sid)

    def freed(self, key: int) -> None:
        """The last stand-in tensor on the block at ``key`` is gone: the caching allocator returns it to the
        allocating stream's pool, so check its other-stream uses now (deterministic, whatever address the CPU
        allocator picks next). Called from a finalizer, where raising is impossible: the violation is raised by the
        next stand-in operation."""
        try:
            self.reused(key)
        except RehearsalError as exc:
            STATE.deferred.append(str(exc))

    def reused(self, key: int) -> None:
        """The block at ``key`` is handed out again: every stream that used it must be done with it, by a wait of
        the stream that allocated it (or the host) or by ``record_stream``, else the new owner may overwrite
        data another stream still reads (what the caching allocator risks when ``record_stream`` is missing)."""
        history, made = self.uses.pop(key, []), self.origin.pop(key, None)
        recorded = self.recorded.pop(key, set())
        if made is None:
            return
        for u in history:
            if u.stream is made or u.stream.sid in recorded:
                continue
            seen = max(made.clock.get(u.stream.sid, 0), self.host.get(u.stream.sid, 0))
            if seen < u.clock[u.stream.sid]:
                STATE.count("stream-order violations")
                raise RehearsalError(
                    f"stream order: memory allocated on {made.name} was used on {u.stream.name} ('{u.op}') and then "
                    f"freed, but {made.name} never waited for that use and no record_stream({u.stream.name}) was "
                    "called: the caching allocator handed the block to a new tensor while "
                    f"{u.stream.name} may still use it. Fix: tensor.record_stream({u.stream.name}) where the "
                    "other stream uses it, or make the allocating stream wait for it."
                )

    def raise_deferred(self) -> None:
        if STATE.deferred:
            message = STATE.deferred.pop(0)
            STATE.deferred.clear()
            STATE.count("stream-order violations")
            raise RehearsalError(message)

    def stream_for(self, handle: int) -> StandinStream:
        for s in self.streams:
            if s.cuda_stream == int(handle):
                return s
        raise RehearsalError(f"stream handle {int(handle):#x} is not a CUDA stream of this process (rehearsal)")


MODEL = StreamModel()
