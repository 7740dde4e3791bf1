"""Memory of the rehearsal's stand-in GPU beyond the live counters: the pinned-memory cache and the allocation history.

* **Pinned host memory** (``Tensor.pin_memory()``, ``pin_memory=True`` factories and loaders): a copy of the host
  tensor marked pinned (:func:`.tensor.is_pinned`), drawn from a cache of page-locked blocks rounded up to a power
  of two, as PyTorch's host allocator does: a block freed goes back to the cache, and a later request of that size
  reuses it. ``torch.cuda.host_memory_stats()`` reports that cache with the real function's keys.
* **Allocation history** (``torch.cuda.memory._record_memory_history``, ``memory_snapshot``, ``_dump_snapshot``):
  while recording, every stand-in allocation and free is kept with its stream and the Python frames that made it;
  the snapshot has the format https://pytorch.org/memory_viz reads (``segments``, ``device_traces``).
"""

from __future__ import annotations

import pickle
import time
import traceback
import weakref
from typing import Any

import torch

from fakegpu.standins.tensor import HOOKS, STATE, mark_pinned

_POOL: dict[str, Any] = {"free": {}, "stats": {}, "history": None}


def reset() -> None:
    _POOL.update(free={}, stats={}, history=None)


def _stat(name: str, delta: int) -> None:
    stats = _POOL["stats"]
    for kind in ("current", "peak", "allocated", "freed"):
        stats.setdefault(f"{name}.{kind}", 0)
    stats[f"{name}.current"] += delta
    stats[f"{name}.peak"] = max(stats[f"{name}.peak"], stats[f"{name}.current"])
    stats[f"{name}.{'allocated' if delta > 0 else 'freed'}"] += abs(delta)


def pin(t: torch.Tensor) -> torch.Tensor:
    """A pinned copy of host tensor ``t`` (a cached page-locked block when one of its size is free)."""
    nbytes = max(t.numel() * t.element_size(), 1)
    size = 1 << (nbytes - 1).bit_length()
    free = _POOL["free"]
    if free.get(size):
        free[size] -= 1
    else:
        _stat("allocations", 1)
        _stat("allocated_bytes", size)
        _POOL["stats"]["num_host_alloc"] = _POOL["stats"].get("num_host_alloc", 0) + 1
    _stat("active_requests", 1)
    _stat("active_bytes", size)
    out = mark_pinned(t.detach().clone())
    weakref.finalize(out, _unpin, size)
    return out


def _unpin(size: int) -> None:
    _POOL["free"][size] = _POOL["free"].get(size, 0) + 1
    _stat("active_requests", -1)
    _stat("active_bytes", -size)


def host_memory_stats() -> dict[str, Any]:
    """``torch.cuda.host_memory_stats()`` of the stand-in: the pinned cache (counts from this process's pins)."""
    STATE.count("pinned-cache reads")
    return {"num_host_free": 0, "num_host_alloc": 0, **dict(sorted(_POOL["stats"].items()))}


# allocation history ----------------------------------------------------------------------------------
def record_history(enabled: Any = "all", context: Any = "all", stacks: str = "all", max_entries: int = 0,
                   **kwargs: Any) -> None:  # fmt: skip
    """``torch.cuda.memory._record_memory_history``: start (or, with ``enabled=None``, stop) recording."""
    _POOL["history"] = None if enabled is None else {"max": max_entries or 1 << 30, "trace": []}
    STATE.history = _POOL["history"]


def on_event(action: str, addr: int, size: int) -> None:
    """Called by the stand-in's memory tracking while recording: one trace entry with the Python frames."""
    history = _POOL["history"]
    if history is None or len(history["trace"]) >= history["max"]:
        return
    frames = [{"filename": f.filename, "line": f.lineno, "name": f.name} for f in traceback.extract_stack()[-8:-2]]
    stream = STATE.streams.current.cuda_stream if STATE.streams is not None else 0
    history["trace"].append({"action": action, "addr": addr, "size": size, "stream": stream, "frames": frames,
                             "time_us": int(time.time() * 1e6)})  # fmt: skip


def snapshot() -> dict[str, Any]:
    """``torch.cuda.memory_snapshot()`` / ``memory._snapshot()``: live stand-in blocks as segments, and the trace."""
    segments = []
    for addr, (_, size, _gen) in sorted(STATE.live.items()):
        block = {"address": addr, "size": size, "requested_size": size, "state": "active_allocated", "frames": []}
        segments.append({"device": 0, "address": addr, "total_size": size, "allocated_size": size,
                         "active_size": size, "requested_size": size, "stream": 0, "segment_type": "large",
                         "blocks": [block]})  # fmt: skip
    trace = list(_POOL["history"]["trace"]) if _POOL["history"] else []
    return {"segments": segments, "device_traces": [trace]}


def dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """``torch.cuda.memory._dump_snapshot``: the snapshot pickled where memory_viz can open it."""
    STATE.count("allocation histories written")
    with open(filename, "wb") as fh:
        pickle.dump(snapshot(), fh)


def memory_functions() -> dict[str, Any]:
    """Stand-ins for ``torch.cuda.memory``'s allocator-history tools."""
    return {"_record_memory_history": record_history, "_dump_snapshot": dump_snapshot, "_snapshot": snapshot,
            "memory_snapshot": lambda *a, **k: snapshot()["segments"]}  # fmt: skip


HOOKS.on_memory_event = on_event  # what State.track and State._release call (tensor.py sits below this file)
