"""Stream-order checks of the rehearsal's stand-in GPU: which stream touched which memory, and what orders them.

Every read and write of stand-in memory is logged with the stream it was issued on and that stream's vector clock
(what it has waited for: ``wait_stream``, ``wait_event``; the host joins clocks when it waits). A use raises
:class:`~.tensor.RehearsalError` at once when

* a stream reads or writes memory that another stream wrote (or reads) and nothing orders the two;
* memory made on one stream is handed out again (freed, then reused) while another stream's use of it is neither
  waited for nor declared with ``record_stream``.

It extends :mod:`course_utils.fakegpu.streamcheck` (which records a device module's calls after the fact) to
operators on stand-in memory, checked as they are issued. :class:`Ordering` is the base of
:class:`~.streams.StreamModel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from course_utils.fakegpu.standins.tensor import STATE, RehearsalError


@dataclass
class Use:
    op: str
    stream: Any  # a StandinStream
    clock: dict[int, int]
    write: bool


class Ordering:
    """The last uses of every stand-in storage, and the checks on them."""

    host: dict[int, int]

    def reset_uses(self) -> None:
        self.uses: dict[int, list[Use]] = {}
        self.origin: dict[int, Any] = {}
        self.recorded: dict[int, set[int]] = {}
        self.side_ops: set[str] = set()

    @staticmethod
    def ordered(a: Use, b: Use) -> bool:
        return a.clock[a.stream.sid] <= b.clock.get(a.stream.sid, 0)

    def use(self, key: int, op: str, write: bool, stream: Any, clock: dict[int, int], fix: str = "") -> None:
        STATE.count("stream-order checks")
        new = Use(op, stream, clock, write)
        history = self.uses.setdefault(key, [])
        for old in history:
            if (old.write or write) and old.stream is not stream and not self.ordered(old, new):
                STATE.count("stream-order violations")
                fix = fix or (f"{stream.name}.wait_stream({old.stream.name}) (or an Event recorded there) before the "
                              "use")  # fmt: skip
                raise RehearsalError(
                    f"stream order: '{op}' on {stream.name} {'writes' if write else 'reads'} memory that '{old.op}' "
                    f"on {old.stream.name} {'wrote' if old.write else 'reads'}, and no wait_stream, event or "
                    f"synchronize orders them (on a GPU the two may overlap: stale or torn data). Fix: {fix}."
                )
        if write:
            history[:] = [new]
        else:
            history[:] = [u for u in history if u.stream is not stream or u.write] + [new]

    def made(self, key: int, stream: Any) -> None:
        """New memory at ``key`` on ``stream``; memory there before was freed: check its last uses first."""
        if key in self.origin:
            self.reused(key)
        self.origin[key] = stream

    def record_stream(self, key: int, stream: Any) -> None:
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
