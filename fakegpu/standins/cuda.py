"""The ``torch.cuda`` functions of the stand-in GPU (installed over ``torch.cuda`` while a section rehearses).

Device queries describe a fixed stand-in (one sm_90 named "rehearsal stand-in (CPU)" with ``STATE.total_memory``
bytes; an index beyond it raises CUDA's "invalid device ordinal"); memory queries count the live stand-in
tensors, and a peak read that can only repeat the previous variant's peak raises (:meth:`.tensor.State.read_peak`);
streams, events and graphs come from :mod:`.streams` and :mod:`.graphs`, the pinned cache and the allocation
history from :mod:`.memory`. ``make_graphed_callables`` has no stand-in and says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from fakegpu.standins import memory
from fakegpu.standins.graphs import StandinCUDAGraph, graph
from fakegpu.standins.streams import MODEL, StandinEvent, StandinStream
from fakegpu.standins.tensor import STATE, RehearsalError, check_index

NAME = "rehearsal stand-in (CPU)"


class NotRehearsable(RuntimeError):
    """This code needs what only a GPU machine has (a named GPU-only kernel, another process on the GPU): the
    section cannot be rehearsed. Raised only with such a name, never for an error of correct code."""


# GPU-only kernels the stand-in cannot run, by name: raised as NotRehearsable where the code reaches them.
GPU_ONLY = {
    "inductor": "torch.compile/Inductor generates CUDA kernels (Triton) for a CUDA model: a GPU-only kernel",
    "int4": "torchao's INT4 tile-packed format packs weights with a CUDA-only kernel (aten._convert_weight_to_int4pack "
    "for tinygemm): a GPU-only kernel",
    "sparse": "2:4 semi-structured sparse matrix products (cuSPARSELt, aten._cslt_*): a GPU-only kernel",
    "fp8": "FP8 scaled matrix products (aten._scaled_mm on CUDA): a GPU-only kernel",
}
_GPU_ONLY_OPS = {"_cslt_compress": "sparse", "_cslt_sparse_mm": "sparse", "_sparse_semi_structured_linear": "sparse",
                 "_convert_weight_to_int4pack": "int4", "_weight_int4pack_mm": "int4", "_scaled_mm": "fp8"}  # fmt: skip


def gpu_only_op(base: str) -> None:
    """A CUDA-only kernel reached on the stand-in: not rehearsable, by name."""
    kind = _GPU_ONLY_OPS.get(base)
    if kind is not None:
        raise NotRehearsable(f"{GPU_ONLY[kind]} (aten.{base})")


def _gap(what: str) -> Any:
    def raiser(*args: Any, **kwargs: Any) -> Any:
        raise RehearsalError(f"{what} has no stand-in in the rehearsal (a gap of the stand-in, not of your code)")

    return raiser


def get_device_properties(device: Any = None) -> SimpleNamespace:
    check_index(device, "torch.cuda.get_device_properties")
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
    check_index(device, "torch.cuda.synchronize")
    MODEL.sync_all()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    check_index(device, "torch.cuda.mem_get_info")
    return STATE.total_memory - STATE.reserved(), STATE.total_memory


def empty_cache() -> None:
    MODEL.sync_all("torch.cuda.empty_cache()")  # the caching allocator synchronizes before it frees blocks
    STATE.cached = 0


def reset_peak_memory_stats(device: Any = None) -> None:
    check_index(device, "torch.cuda.reset_peak_memory_stats")
    STATE.count("peak-memory resets")
    STATE.reset_peak()


class _Stats(dict):
    """``memory_stats()``: reading a peak entry is a peak read (see :meth:`.tensor.State.read_peak`)."""

    def __getitem__(self, key: str) -> Any:
        if key.endswith(".peak") and key.startswith("allocated_bytes"):
            return STATE.read_peak(f"torch.cuda.memory_stats()[{key!r}]")
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default


def memory_stats(device: Any = None) -> dict[str, int]:
    check_index(device, "torch.cuda.memory_stats")
    return _Stats({"allocated_bytes.all.current": STATE.allocated, "allocated_bytes.all.peak": STATE.peak,
                   "reserved_bytes.all.current": STATE.reserved(), "num_ooms": 0})  # fmt: skip


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    return (f"rehearsal stand-in allocator: {STATE.allocated / 2**20:.1f} MiB allocated, {STATE.peak / 2**20:.1f} MiB "
            f"peak, {STATE.reserved() / 2**20:.1f} MiB reserved (counted from live stand-in tensors)")  # fmt: skip


@contextlib.contextmanager
def device(index: Any) -> Iterator[None]:
    """``with torch.cuda.device(i):`` on the one stand-in GPU."""
    check_index(index, "torch.cuda.device")
    yield


def _one(name: str, value: Any) -> Any:
    def query(device: Any = None, *args: Any, **kwargs: Any) -> Any:
        check_index(device, f"torch.cuda.{name}")
        return value() if callable(value) else value

    return query


def functions() -> dict[str, Any]:
    """Name -> stand-in, for every ``torch.cuda`` attribute the rehearsal replaces."""
    return {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "set_device": lambda d: check_index(d, "torch.cuda.set_device"), "is_initialized": lambda: True,
        "init": lambda: None, "device": device, "get_device_name": _one("get_device_name", NAME),
        "get_device_properties": get_device_properties, "get_device_capability": _one("get_device_capability", (9, 0)),
        "get_arch_list": lambda: ["sm_90"], "is_bf16_supported": lambda including_emulation=True: True,
        "synchronize": synchronize, "Stream": StandinStream, "Event": StandinEvent, "stream": stream,
        "current_stream": _one("current_stream", lambda: MODEL.current),
        "default_stream": _one("default_stream", lambda: MODEL.default), "set_stream": set_stream,
        "memory_allocated": _one("memory_allocated", lambda: STATE.allocated),
        "memory_reserved": _one("memory_reserved", STATE.reserved),
        "max_memory_allocated": _one("max_memory_allocated",
                                     lambda: STATE.read_peak("torch.cuda.max_memory_allocated()")),
        "max_memory_reserved": _one("max_memory_reserved", STATE.reserved),
        "reset_peak_memory_stats": reset_peak_memory_stats, "reset_max_memory_allocated": reset_peak_memory_stats,
        "empty_cache": empty_cache, "mem_get_info": mem_get_info, "memory_stats": memory_stats,
        "memory_summary": memory_summary, "memory_snapshot": lambda *a, **k: memory.snapshot()["segments"],
        "CUDAGraph": StandinCUDAGraph, "graph": graph, "graph_pool_handle": lambda: (0, 0),
        "host_memory_stats": memory.host_memory_stats,
        "make_graphed_callables": _gap("torch.cuda.make_graphed_callables"),
        "get_rng_state": _gap("torch.cuda.get_rng_state"), "set_rng_state": _gap("torch.cuda.set_rng_state"),
        "manual_seed": lambda seed: None, "manual_seed_all": lambda seed: None, "seed": lambda: None,
        "ipc_collect": lambda: None,
    }  # fmt: skip
