"""Issuing work on the current stand-in stream: its stream-order checks (:mod:`.order`) and its place on the
device timeline (:mod:`.clock`). Used for every operator, copy and replay the stand-ins queue."""

from __future__ import annotations

from fakegpu.standins.graphs import family
from fakegpu.standins.streams import MODEL


def order(name: str, base: str, reads: set[int], writes: set[int], new: set[int]) -> dict[int, int]:
    """Stream-order checks of one operator on the current stream; return its clock."""
    stream = MODEL.current
    if stream is not MODEL.default:
        MODEL.side_ops.add(family(base))
    clock = stream.tick()
    for k in reads - writes:
        MODEL.use(k, name, False, stream, clock)
    for k in writes:
        MODEL.use(k, name, True, stream, clock)
    for k in new:
        MODEL.made(k, stream)
        MODEL.use(k, name, True, stream, clock)
    return clock


def place(engine: str, duration: float, width: float = 1.0, name: str = "") -> None:
    """Put work of ``duration`` on the current stream's timeline (``name``: its device event's, for a profiler)."""
    stream = MODEL.current
    stream.ready = MODEL.clock.issue(engine, stream.sid, stream.ready, duration, width, name)
