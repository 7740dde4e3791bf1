"""Memory measurements for lesson 11, on the CPU and on CUDA.

CPU (Linux): the process's resident set (RSS) and its high-water mark (``VmHWM``, which can be reset by
writing ``5`` to ``/proc/self/clear_refs``), so :func:`cpu_peak_mb` gives the peak extra memory of one call.
glibc's ``malloc`` keeps freed small blocks for reuse, as PyTorch's CUDA caching allocator does;
:func:`malloc_trim` hands them back like ``torch.cuda.empty_cache()``. :func:`tracemalloc_peak_mb` shows
what Python's tracemalloc sees (Python and NumPy allocations, not torch tensors).

CUDA: :func:`gpu_memory_mb` (allocated vs reserved), :func:`gpu_peak_mb` (peak of one call with
``reset_peak_memory_stats`` / ``max_memory_allocated``). Both devices: :class:`StaticRunner`, preallocated
input/output buffers filled with ``copy_`` (the pattern CUDA graphs need), and :func:`peak_vs_batch`.
"""

from __future__ import annotations

import ctypes
import gc
import tracemalloc
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

_STATUS = Path("/proc/self/status")


def _status_kb(key: str) -> float | None:
    if not _STATUS.exists():
        return None
    for line in _STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return float(line.split()[1])
    return None


def rss_mb() -> float:
    """Resident memory of this process now (MiB); falls back to psutil off Linux."""
    kb = _status_kb("VmRSS")
    if kb is not None:
        return kb / 1024
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    """High-water mark of resident memory (MiB) since start or since :func:`reset_peak_rss`."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb / 1024
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def reset_peak_rss() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux ``clear_refs``); False where impossible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def malloc_trim() -> bool:
    """Return glibc's cached free heap memory to the OS (the CPU analogue of ``torch.cuda.empty_cache``).

    False where glibc is not the allocator (macOS, Windows, musl).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def mmap_large_blocks(threshold_bytes: int = 128 * 1024) -> bool:
    """Make glibc serve every block above ``threshold_bytes`` with its own mapping, returned to the OS on free.

    By default glibc raises this threshold as the program frees large blocks, then keeps later ones on its
    heap for reuse, so RSS stops following live tensors. A fixed threshold makes RSS-based peaks
    (:func:`cpu_peak_mb`) track tensor memory closely. Process-wide; False where glibc is not the allocator.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, int(threshold_bytes)))  # -3 is M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def cpu_peak_mb(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(Peak extra resident MiB while ``fn()`` ran, its result), from the reset high-water mark.

    Memory that malloc kept from earlier work can be reused without raising RSS, so call
    :func:`malloc_trim` first for a fair number. Raises RuntimeError where the peak cannot be reset.
    """
    gc.collect()
    malloc_trim()
    if not reset_peak_rss():
        raise RuntimeError(
            "cannot reset the RSS peak here (needs Linux /proc/self/clear_refs): use tracemalloc_peak_mb"
        )
    before = rss_mb()
    out = fn()
    return max(0.0, peak_rss_mb() - before), out


def tracemalloc_peak_mb(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(Peak MiB that Python's tracemalloc saw during ``fn()``, its result).

    tracemalloc tracks Python objects and NumPy arrays; torch tensors use their own C++ allocator and are
    invisible to it, which lesson 11 shows by measuring both.
    """
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    try:
        out = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not was:
            tracemalloc.stop()
    return max(0, peak - base) / 2**20, out


def grad_context(mode: str):
    """Context for ``"grad"`` (autograd on), ``"no_grad"`` or ``"inference_mode"``."""
    if mode == "grad":
        return torch.enable_grad()
    if mode == "no_grad":
        return torch.no_grad()
    if mode == "inference_mode":
        return torch.inference_mode()
    raise ValueError(f"mode must be 'grad', 'no_grad' or 'inference_mode', got {mode!r}")


# ----------------------------------------------------------------------------------------------------
# CUDA


def gpu_memory_mb(device: str | torch.device = "cuda") -> dict[str, float]:
    """Caching-allocator state in MiB: allocated (live tensors), reserved (held from the driver), peaks."""
    if not torch.cuda.is_available():
        from .errors import DeviceUnavailableError

        raise DeviceUnavailableError("gpu_memory_mb needs a CUDA GPU: on CPU use rss_mb() / cpu_peak_mb()")
    return {
        "allocated": torch.cuda.memory_allocated(device) / 2**20,
        "reserved": torch.cuda.memory_reserved(device) / 2**20,
        "peak_allocated": torch.cuda.max_memory_allocated(device) / 2**20,
        "peak_reserved": torch.cuda.max_memory_reserved(device) / 2**20,
    }


def gpu_peak_mb(fn: Callable[[], Any], device: str | torch.device = "cuda") -> tuple[float, Any]:
    """(Peak extra MiB allocated on ``device`` while ``fn()`` ran, its result): ``reset_peak_memory_stats`` +
    ``max_memory_allocated`` minus what was allocated before."""
    if not torch.cuda.is_available():
        from .errors import DeviceUnavailableError

        raise DeviceUnavailableError("gpu_peak_mb needs a CUDA GPU: on CPU use cpu_peak_mb()")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20, out


def peak_mb(fn: Callable[[], Any], device: str | torch.device = "cpu") -> tuple[float, Any]:
    """Peak extra memory of ``fn()`` on ``device``: :func:`gpu_peak_mb` on CUDA, else :func:`cpu_peak_mb`."""
    return gpu_peak_mb(fn, device) if torch.device(device).type == "cuda" else cpu_peak_mb(fn)


def peak_vs_batch(
    model: torch.nn.Module,
    make_input: Callable[[int], torch.Tensor],
    batch_sizes: Iterable[int],
    *,
    device: str | torch.device = "cpu",
    mode: str = "inference_mode",
) -> pd.DataFrame:
    """Peak extra memory (MiB) of one forward pass per batch size, under ``mode`` (see :func:`grad_context`).

    The input is created before the measurement, so the peak is activations (and workspace), not the input.
    """
    rows = []
    for b in batch_sizes:
        x = make_input(b)

        def run(x: torch.Tensor = x) -> None:
            with grad_context(mode):
                out = model(x)
            del out

        peak, _ = peak_mb(run, device)
        rows.append({"batch_size": b, "peak_mb": peak, "input_mb": x.nelement() * x.element_size() / 2**20})
    return pd.DataFrame(rows)


class StaticRunner:
    """Run ``model`` on preallocated input and output buffers: each call ``copy_``s the new batch in.

    Shapes and addresses never change between calls, which is what CUDA graph replay needs (a captured
    graph reads from and writes to fixed addresses) and avoids allocating inputs and outputs per call.
    The returned tensor IS the output buffer: the next call overwrites it, so ``clone()`` what you keep.
    """

    def __init__(self, model: Callable[[torch.Tensor], torch.Tensor], example: torch.Tensor) -> None:
        self.model = model
        self.input = torch.empty_like(example)
        with torch.inference_mode():
            out = model(example)
        self.output = torch.empty_like(out)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape != self.input.shape:
            raise ValueError(
                f"StaticRunner was built for input shape {tuple(self.input.shape)}, got {tuple(x.shape)}: "
                "pad the batch to that shape or build one StaticRunner per shape"
            )
        self.input.copy_(x, non_blocking=True)
        with torch.inference_mode():
            self.output.copy_(self.model(self.input))
        return self.output
