"""Stream-order checks of the rehearsal's stand-in GPU: which stream touched which memory, and what orders them.

Every read and write of stand-in memory is checked as it is issued, with the stream it was issued on and that
stream's vector clock (what it has waited for: ``wait_stream``, ``wait_event``; the host joins clocks when it
waits), against the last uses of that memory. A use raises :class:`~.tensor.RehearsalError` at once when

* a stream reads or writes memory that another stream wrote (or reads) and nothing orders the two;
* memory made on one stream is handed out again (freed, then reused) while another stream's use of it is neither
  waited for nor declared with ``record_stream``.

The rules are those of :mod:`fakegpu.ordering`, which :mod:`fakegpu.streamcheck` applies after the fact to the
calls it recorded of a device module; this module keeps the last uses of stand-in memory and words the errors.
:class:`Ordering` is the base of :class:`~.streams.StreamModel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fakegpu.ordering import Clock, conflict, unsafe_to_reuse
from fakegpu.standins.tensor import STATE, RehearsalError


@dataclass
class Use:
    op: str
    stream: Any  # a StandinStream
    clock: Clock
    write: bool


class Ordering:
    """The last uses of every stand-in storage, and the checks on them."""

    host: Clock

    def reset_uses(self) -> None:
        self.uses: dict[int, list[Use]] = {}
        self.origin: dict[int, Any] = {}
        self.recorded: dict[int, set[int]] = {}
        self.side_ops: set[str] = set()

    def use(self, key: int, op: str, write: bool, stream: Any, clock: Clock, fix: str = "") -> None:
        STATE.count("stream-order checks")
        new = Use(op, stream, clock, write)
        history = self.uses.setdefault(key, [])
        for old in history:
            if conflict(old, new):
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
            if unsafe_to_reuse(u, made, recorded, self.host):
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
