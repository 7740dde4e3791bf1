"""The rules of stream order, once: what orders two accesses on a GPU, what is a race, when memory may be reused.

Both models of the fake GPU apply these rules: :mod:`fakegpu.streamcheck` records a device module's calls and
judges them after the fact; :mod:`fakegpu.standins.order` judges every use of the rehearsal's stand-in memory as it
is issued.

* **Vector clocks.** Each stream ``sid`` counts the operations issued on it; its clock (``{sid: count}``) holds,
  for every stream, how many of that stream's operations it is ordered after. An operation issued on a stream
  follows what the host has waited for (:func:`next_tick`), and its access carries a snapshot of the stream's
  clock.
* **Waits join clocks** (:func:`join`, the element-wise maximum): ``wait_stream`` joins the other stream's clock
  into the waiting stream's, ``wait_event`` the clock the event recorded, and the host's clock takes in what
  ``synchronize`` (device, stream or event) waited for.
* **Happens-before** (:func:`ordered`): access ``a`` is ordered before ``b`` when ``b``'s clock has seen ``a``
  (:func:`seen`: its entry for ``a``'s stream reaches ``a``'s tick there): issue order on one stream, or a chain
  of waits.
* **A race** (:func:`conflict`): two accesses to the same memory, at least one a write, on different streams, and
  not ordered: on a GPU they may overlap (stale or torn data).
* **The caching allocator** (:func:`unsafe_to_reuse`): a block is handed out again in the order of the stream that
  allocated it. A use on another stream is safe only when that stream's ``record_stream`` was called for the
  block, or the allocating stream (or the host) has waited for the use (:func:`seen`); else the block's next
  owner may overwrite data the other stream still reads.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

Clock = dict[int, int]


class Access(Protocol):
    """What the rules read of one access of memory (each model keeps its own record with more fields)."""

    stream: Any  # the stream it was issued on: its ``sid`` is its entry in a clock
    clock: Clock  # that stream's clock when it was issued
    write: bool


def join(a: Clock, b: Clock) -> Clock:
    """The vector clock that has seen everything ``a`` and ``b`` have seen (their element-wise maximum)."""
    return {k: max(a.get(k, 0), b.get(k, 0)) for k in a.keys() | b.keys()}


def next_tick(clock: Clock, sid: int, host: Clock) -> Clock:
    """The clock of stream ``sid`` after it issues one more operation: it follows what the host has waited for."""
    clock = join(clock, host)
    clock[sid] = clock.get(sid, 0) + 1
    return clock


def seen(clock: Clock, use: Access) -> bool:
    """True when ``clock`` is ordered after ``use`` (it has waited for that tick of the use's stream)."""
    return clock.get(use.stream.sid, 0) >= use.clock[use.stream.sid]


def ordered(a: Access, b: Access) -> bool:
    """True when access ``a`` is ordered before ``b``: ``b``'s clock has seen ``a`` (same stream in issue order,
    or waited for)."""
    return seen(b.clock, a)


def conflict(a: Access, b: Access) -> bool:
    """True when ``a`` and then ``b``, accesses to the same memory, race: one writes, on different streams, and
    nothing orders ``a`` before ``b``."""
    return (a.write or b.write) and a.stream is not b.stream and not ordered(a, b)


def unsafe_to_reuse(use: Access, made: Any, recorded: Collection[int], *waited: Clock) -> bool:
    """True when memory allocated on stream ``made`` must not be handed out again because of ``use``: a use on
    another stream, whose sid is not in ``recorded`` (the streams ``record_stream`` named for the block), that
    neither ``made``'s clock nor any of ``waited`` (the host's) has seen."""
    if use.stream is made or use.stream.sid in recorded:
        return False
    return not any(seen(clock, use) for clock in (made.clock, *waited))
