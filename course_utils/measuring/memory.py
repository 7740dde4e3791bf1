"""CPU memory measurement for lesson 11 (the CUDA memory calls are written in the lesson itself).

A CPU has no ``torch.cuda.memory_allocated``: the nearest measure is the process's resident set (RSS) and its
high-water mark (``VmHWM``, reset by writing ``5`` to ``/proc/self/clear_refs``), so :func:`cpu_peak_mb` gives
the peak extra memory of one call. glibc's ``malloc`` keeps freed blocks for reuse, as the CUDA caching
allocator does, which hides peaks: inside :func:`rss_follows_tensors` every large block is mapped and unmapped
on its own, so RSS follows live tensors. :func:`peak_vs_batch` measures one forward pass per batch size.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Callable, Iterable, Iterator
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


_M_MMAP_THRESHOLD = -3
_GLIBC_MAX_THRESHOLD = 32 * 2**20  # the ceiling of glibc's own adaptive threshold on 64-bit Linux


@contextlib.contextmanager
def rss_follows_tensors(threshold_bytes: int = 128 * 1024) -> Iterator[bool]:
    """Within the block, glibc maps every block above ``threshold_bytes`` separately and unmaps it on free.

    By default glibc raises this threshold as a program frees large blocks, then keeps later ones on its heap
    for reuse, so RSS stops following live tensors and peaks hide. Mapping every block costs page faults on each
    allocation, so keep timings outside the block. glibc offers no call that re-enables its adaptive threshold:
    on exit the threshold is set to 32 MiB, the ceiling that adaptation reaches. Yields False where glibc is
    not the allocator (nothing changes then).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)))
    except (OSError, AttributeError):
        libc, ok = None, False
    try:
        yield ok
    finally:
        if ok and libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, _GLIBC_MAX_THRESHOLD)


def cpu_peak_mb(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(Peak extra resident MiB while ``fn()`` ran, its result), from the reset high-water mark.

    Memory that malloc kept from earlier work can be reused without raising RSS, so call
    :func:`malloc_trim` first for a fair number. Raises RuntimeError where the peak cannot be reset.
    """
    gc.collect()
    malloc_trim()
    if not reset_peak_rss():
        raise RuntimeError(
            "cannot reset the RSS peak here (needs Linux /proc/self/clear_refs): compare rss_mb() before and after"
        )
    before = rss_mb()
    out = fn()
    return max(0.0, peak_rss_mb() - before), out


def grad_context(mode: str):
    """Context for ``"grad"`` (autograd on), ``"no_grad"`` or ``"inference_mode"``."""
    if mode == "grad":
        return torch.enable_grad()
    if mode == "no_grad":
        return torch.no_grad()
    if mode == "inference_mode":
        return torch.inference_mode()
    raise ValueError(f"mode must be 'grad', 'no_grad' or 'inference_mode', got {mode!r}")


def peak_vs_batch(
    model: torch.nn.Module,
    make_input: Callable[[int], torch.Tensor],
    batch_sizes: Iterable[int],
    *,
    mode: str = "inference_mode",
) -> pd.DataFrame:
    """Peak extra resident memory (MiB) of one CPU forward pass per batch size, under ``mode``.

    The input is created before the measurement, so the peak is activations (and workspace), not the input.
    Call it inside :func:`rss_follows_tensors`.
    """
    rows = []
    for b in batch_sizes:
        x = make_input(b)

        def run(x: torch.Tensor = x) -> None:
            with grad_context(mode):
                out = model(x)
            del out

        peak, _ = cpu_peak_mb(run)
        rows.append({"batch_size": b, "peak_mb": peak, "input_mb": x.nelement() * x.element_size() / 2**20})
    return pd.DataFrame(rows)
