"""The ``torch.cuda`` functions of the stand-in GPU (installed over ``torch.cuda`` while a section rehearses).

Device queries describe a fixed stand-in (an sm_90 named "rehearsal stand-in (CPU)" with
``STATE.total_memory`` bytes); memory queries count the live stand-in tensors; streams, events and graphs come
from :mod:`.streams` and :mod:`.graphs`. What has no stand-in (the allocator's history and snapshots,
``make_graphed_callables``) raises :class:`NotRehearsable`.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

from course_utils.check.standins.graphs import StandinCUDAGraph, graph
from course_utils.check.standins.streams import MODEL, StandinEvent, StandinStream
from course_utils.check.standins.tensor import STATE

NAME = "rehearsal stand-in (CPU)"


class NotRehearsable(RuntimeError):
    """This code needs the real GPU (or a package that only runs there): the section cannot be rehearsed."""


def _not_rehearsable(what: str) -> Any:
    def raiser(*args: Any, **kwargs: Any) -> Any:
        raise NotRehearsable(what)

    return raiser


def get_device_properties(device: Any = None) -> SimpleNamespace:
    return SimpleNamespace(
        name=NAME, major=9, minor=0, total_memory=STATE.total_memory, multi_processor_count=132,
        L2_cache_size=50 * 2**20,
        warp_size=32, max_threads_per_multi_processor=2048, max_threads_per_block=1024, regs_per_multiprocessor=65536,
        shared_memory_per_block=49152, shared_memory_per_block_optin=232448, shared_memory_per_multiprocessor=233472,
        clock_rate=1980000, memory_clock_rate=2619000, memory_bus_width=5120, is_integrated=False,
        is_multi_gpu_board=False, uuid="00000000-0000-0000-0000-rehearsal000", pci_bus_id=0, pci_device_id=0,
        pci_domain_id=0, gcnArchName="",
    )  # fmt: skip


def stream(s: StandinStream | None) -> contextlib.AbstractContextManager:
    return s if s is not None else contextlib.nullcontext()


def set_stream(s: StandinStream) -> None:
    MODEL.current = s


def synchronize(device: Any = None) -> None:
    MODEL.sync_all()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    return STATE.total_memory - STATE.reserved(), STATE.total_memory


def empty_cache() -> None:
    STATE.cached = 0


def reset_peak_memory_stats(device: Any = None) -> None:
    STATE.peak = STATE.allocated


def memory_stats(device: Any = None) -> dict[str, int]:
    return {"allocated_bytes.all.current": STATE.allocated, "allocated_bytes.all.peak": STATE.peak,
            "reserved_bytes.all.current": STATE.reserved(), "num_ooms": 0}  # fmt: skip


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    return (f"rehearsal stand-in allocator: {STATE.allocated / 2**20:.1f} MiB allocated, {STATE.peak / 2**20:.1f} MiB "
            f"peak, {STATE.reserved() / 2**20:.1f} MiB reserved (counted from live stand-in tensors)")  # fmt: skip


def functions() -> dict[str, Any]:
    """Name -> stand-in, for every ``torch.cuda`` attribute the rehearsal replaces."""
    return {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "set_device": lambda d: None, "is_initialized": lambda: True, "init": lambda: None,
        "get_device_name": lambda device=None: NAME, "get_device_properties": get_device_properties,
        "get_device_capability": lambda device=None: (9, 0), "get_arch_list": lambda: ["sm_90"],
        "is_bf16_supported": lambda including_emulation=True: True,
        "synchronize": synchronize, "Stream": StandinStream, "Event": StandinEvent, "stream": stream,
        "current_stream": lambda device=None: MODEL.current, "default_stream": lambda device=None: MODEL.default,
        "set_stream": set_stream, "memory_allocated": lambda device=None: STATE.allocated,
        "memory_reserved": lambda device=None: STATE.reserved(), "max_memory_allocated": lambda device=None: STATE.peak,
        "max_memory_reserved": lambda device=None: STATE.reserved(), "reset_peak_memory_stats": reset_peak_memory_stats,
        "reset_max_memory_allocated": reset_peak_memory_stats, "empty_cache": empty_cache, "mem_get_info": mem_get_info,
        "memory_stats": memory_stats, "memory_summary": memory_summary, "CUDAGraph": StandinCUDAGraph, "graph": graph,
        "graph_pool_handle": lambda: (0, 0),
        "make_graphed_callables": _not_rehearsable("torch.cuda.make_graphed_callables needs real CUDA graphs"),
        "host_memory_stats": _not_rehearsable("torch.cuda.host_memory_stats reads the real pinned-memory allocator"),
    }  # fmt: skip


def memory_functions() -> dict[str, Any]:
    """Stand-ins for ``torch.cuda.memory``'s allocator-history tools (not rehearsable: allocator internals)."""
    why = "the CUDA caching allocator's history and snapshots exist only on a real GPU"
    return {"_record_memory_history": _not_rehearsable(why), "_dump_snapshot": _not_rehearsable(why),
            "memory_snapshot": _not_rehearsable(why)}  # fmt: skip
