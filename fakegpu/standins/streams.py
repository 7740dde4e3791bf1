"""Streams and events of the rehearsal's stand-in GPU: queued work that runs when something waits for it.

Work issued to a stream (an operator on stand-in tensors, a copy, a graph replay, a TensorRT or ONNX Runtime run)
is ordered by the checks of :mod:`.order` (the rules of :mod:`fakegpu.ordering`), placed on the device timeline
of :mod:`.clock` and **queued**: its values are computed only when something waits for it, as a GPU computes them
after the launch returns:

* the host waits: ``torch.cuda.synchronize()``, ``Stream.synchronize()``, ``Event.synchronize()``, a blocking
  copy to or from the host, a host read (``.item()``, ``.cpu()``, printing), an operator whose output size
  depends on the data (``nonzero``);
* another stream's queued work that waited for it (``wait_stream``, ``wait_event``) runs, so it runs first.

So a timer that does not synchronize measures the launch only, a non-blocking copy to the host lands when the host
waits for its stream (before that the buffer holds poison: NaN), and memory a queued copy reads from the host is
read when the copy runs. ``elapsed_time`` is asked of completed events only (else "device not ready") and
reports the device time between them; for two events of one stream recorded in the wrong order (the end before
the start) CUDA returns a negative time, which the stand-in refuses with that reason. The fake TensorRT's
``execute_async_v3`` takes a stream handle (``Stream.cuda_stream``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fakegpu.ordering import join, next_tick
from fakegpu.standins.clock import DeviceClock
from fakegpu.standins.order import Ordering, Use
from fakegpu.standins.tensor import STATE, RehearsalError, check_index

__all__ = ["MODEL", "StandinEvent", "StandinStream", "StreamModel", "Use"]


@dataclass
class Work:
    tick: int
    deps: dict[int, int]
    run: Callable[[], None]
    inference: bool
    seq: int = 0  # issue order over all streams


class StandinStream:
    """``torch.cuda.Stream`` of the stand-in GPU (``cuda_stream`` is its handle for TensorRT/ORT)."""

    def __init__(self, device: Any = None, priority: int = 0, *, _name: str | None = None, **kwargs: Any) -> None:
        check_index(device, "torch.cuda.Stream")
        model = MODEL
        self.sid = len(model.streams)
        self.name = _name or f"stream{self.sid}"
        self.clock: dict[int, int] = {}
        self.priority = priority
        self.cuda_stream = 0 if self.sid == 0 else 0x5EED0000 + 16 * self.sid
        self.device = torch.device("cuda", 0)
        self.device_index, self.device_type = 0, 1
        self.queue: deque[Work] = deque()
        self.ready = model.clock.host  # device time at which this stream's issued work ends
        model.streams.append(self)
        STATE.count("streams created")

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream {self.name} (rehearsal stand-in) cuda_stream={self.cuda_stream:#x}>"

    def tick(self) -> dict[int, int]:
        self.clock = next_tick(self.clock, self.sid, MODEL.host)
        return dict(self.clock)

    def wait_stream(self, stream: StandinStream) -> None:
        STATE.count("stream waits")
        self.clock = join(self.clock, stream.clock)
        self.ready = max(self.ready, stream.ready)

    def wait_event(self, event: StandinEvent) -> None:
        STATE.count("stream waits")
        self.clock = join(self.clock, event.clock)
        self.ready = max(self.ready, event.t)

    def record_event(self, event: StandinEvent | None = None) -> StandinEvent:
        event = event or StandinEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        MODEL.host_sync(self.clock, "Stream.synchronize()", self.ready)

    def query(self) -> bool:
        return MODEL.query(self.clock, self.ready)

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
    """``torch.cuda.Event`` of the stand-in GPU: a point in a stream, with the device time its stream reached."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self.clock: dict[int, int] = {}
        self.stream: StandinStream | None = None
        self.t = 0.0
        self.seq = 0  # the order of records (a record of another event after this one has a higher number)

    def record(self, stream: StandinStream | None = None) -> None:
        self.stream = stream or MODEL.current
        self.clock = dict(self.stream.tick())
        self.t = max(self.stream.ready, MODEL.clock.now())
        self.seq = self.clock[self.stream.sid]

    def wait(self, stream: StandinStream | None = None) -> None:
        (stream or MODEL.current).wait_event(self)

    def synchronize(self) -> None:
        MODEL.host_sync(self.clock, "Event.synchronize()", self.t)

    def query(self) -> bool:
        return self.stream is None or MODEL.query(self.clock, self.t)

    def done(self) -> bool:
        return self.stream is not None and all(MODEL.host.get(k, 0) >= v for k, v in self.clock.items())

    def elapsed_time(self, end: StandinEvent) -> float:
        STATE.count("timing checks")
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.stream is None or end.stream is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        ms = (end.t - self.t) * 1000.0
        if self.stream is end.stream and self.seq > end.seq:  # before "not ready": the order is the root cause
            STATE.count("timing violations")
            raise RehearsalError(
                f"start.elapsed_time(end) = {ms:.4f} ms: the end event was recorded before the start "
                f"event on {self.stream.name}, so CUDA returns a negative time (or 'device not ready' while the start "
                "is still queued). The events are in the wrong order: record start, run the work, record end, then "
                "start.elapsed_time(end) (rehearsal stand-in)"
            )
        if not (end.done() and self.done()):
            raise RehearsalError(
                f"CUDA error: device not ready (elapsed_time() before the {'end' if not end.done() else 'start'} "
                "event completed: call end.synchronize() or torch.cuda.synchronize() first; rehearsal stand-in)"
            )
        return ms


class StreamModel(Ordering):
    """The streams, the host's clock, the queues of issued work and the device timeline."""

    def __init__(self) -> None:
        self.streams: list[StandinStream] = []
        self.host: dict[int, int] = {}
        self.clock = DeviceClock()
        self.issued = 0  # work queued so far (all streams)
        self.reset_uses()

    def reset(self) -> None:
        self.drain()
        self.__init__()
        self.default = StandinStream(_name="default")
        self.current = self.default

    # queued work ---------------------------------------------------------------------------------------
    def enqueue(self, stream: StandinStream, clock: dict[int, int], run: Callable[[], None]) -> None:
        """Queue ``run`` (the work's values) on ``stream`` at its tick in ``clock``; it runs when waited for."""
        self.issued += 1
        stream.queue.append(Work(clock[stream.sid], dict(clock), run, torch.is_inference_mode_enabled(), self.issued))

    def flush(self, stream: StandinStream, upto: float = float("inf")) -> None:
        """Run the work queued on ``stream`` up to tick ``upto``, and first the work of other streams it waited for."""
        with torch._C.DisableTorchFunction():
            while stream.queue and stream.queue[0].tick <= upto:
                work = stream.queue[0]
                for sid, n in work.deps.items():
                    if sid != stream.sid:
                        self.flush(self.streams[sid], n)
                if not stream.queue or stream.queue[0] is not work:
                    continue
                stream.queue.popleft()
                with torch.inference_mode(work.inference):
                    work.run()

    def flush_to(self, stream: StandinStream) -> None:
        """Run everything ``stream`` has been ordered after so far: its own queue and what it waited for."""
        for sid, n in stream.clock.items():
            self.flush(self.streams[sid], n)

    def external_run(self, stream: StandinStream, duration: float = 20e-6) -> None:
        """A library's kernels issued on ``stream`` (TensorRT, ONNX Runtime) that read and write device memory at
        once: the work the stream is ordered after runs first, and they take device time there."""
        self.flush_to(stream)
        stream.ready = self.clock.issue("compute", stream.sid, stream.ready, duration)

    def pending(self, since: int = 0) -> int:
        """How much work issued after the ``since``-th is still queued (not run, not waited for)."""
        return sum(1 for s in getattr(self, "streams", []) for w in s.queue if w.seq > since)

    def drain(self) -> None:
        """Run everything queued (the stand-ins are leaving: no work may be lost)."""
        for s in getattr(self, "streams", []):
            self.flush(s)

    def host_sync(self, clock: dict[int, int], what: str, until: float | None = None) -> None:
        """The host waits for the points ``clock`` names: their work runs, and the host waits their device time."""
        if STATE.capture is not None:
            STATE.capture.forbid(what)
        STATE.count("synchronizations")
        for sid, n in clock.items():
            self.flush(self.streams[sid], n)
        self.host = join(self.host, clock)
        if until is not None:
            self.clock.wait(until)

    def sync_all(self, what: str = "torch.cuda.synchronize()") -> None:
        if STATE.capture is not None:
            STATE.capture.forbid(what)
        STATE.count("synchronizations")
        self.drain()
        for s in self.streams:
            self.host = join(self.host, s.clock)
        self.clock.wait(max((s.ready for s in self.streams), default=0.0))

    def wait_current(self, what: str) -> None:
        """A blocking copy or host read on the current stream: the host waits for that stream."""
        s = self.current
        self.host_sync(s.clock, what, s.ready)

    def query(self, clock: dict[int, int], t: float) -> bool:
        """A poll: done once the wall clock has passed the point's device time (then its work has run)."""
        if self.clock.now() < t and not all(self.host.get(k, 0) >= v for k, v in clock.items()):  # still running
            return False
        for sid, n in clock.items():
            self.flush(self.streams[sid], n)
        self.host = join(self.host, clock)
        self.clock.wait(t)
        return True

    def stream_for(self, handle: int) -> StandinStream:
        for s in self.streams:
            if s.cuda_stream == int(handle):
                return s
        raise RehearsalError(f"stream handle {int(handle):#x} is not a CUDA stream of this process (rehearsal)")


MODEL = StreamModel()
