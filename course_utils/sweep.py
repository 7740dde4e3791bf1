"""Sweep batch sizes (or any parameter), with a progress bar, stopping cleanly at out-of-memory.

:func:`batch_sweep` returns a DataFrame with one row per batch size that fit; the batch size that ran
out of memory (if any) is kept in ``df.attrs["oom_at"]`` and the largest that fit in
``df.attrs["max_fit"]``, so a notebook reports the limit instead of dying. Out of memory means a CUDA
``torch.OutOfMemoryError`` and also a CPU allocation failure (``MemoryError``, "can't allocate memory" from
PyTorch's ``DefaultCPUAllocator``). Any other error, or Ctrl-C, still keeps what was measured: the rows so far
ride on the exception as ``exc.partial_rows`` and stay in :data:`last_partial`.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from .errors import BadArgumentError
from .timing import measure

last_partial: pd.DataFrame | None = None
"""The rows measured by the last sweep that ended in an error or Ctrl-C (None when the last sweep finished)."""

_CPU_OOM = ("out of memory", "can't allocate memory", "defaultcpuallocator")


def _is_oom(exc: BaseException) -> bool:
    """True for out-of-memory on any device: CUDA's OutOfMemoryError, MemoryError, CPU allocator failures."""
    if isinstance(exc, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc).lower() for s in _CPU_OOM)


def _frame(rows: list[dict[str, Any]], name: str, columns: list[str] | None) -> pd.DataFrame:
    """Rows as a DataFrame that has the expected columns even when no row was measured."""
    if columns is None:
        return pd.DataFrame(rows) if rows else pd.DataFrame(columns=[name])
    return pd.DataFrame(rows, columns=[name, *[c for c in columns if c != name]])


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def sweep(
    run: Callable[[Any], dict[str, Any]],
    values: Iterable[Any],
    *,
    name: str = "value",
    device: str | torch.device | None = None,
    progress: bool = True,
    columns: list[str] | None = None,
) -> pd.DataFrame:
    """Call ``run(value)`` for each value (each returns a dict of columns) and collect a DataFrame.

    Stops at the first out-of-memory error (CUDA or CPU): the cache is freed, ``df.attrs["oom_at"]`` names the
    value that failed, and the rows measured so far are returned. ``columns`` (the keys ``run`` returns) gives
    the frame its columns even when the very first value runs out of memory. Any other error and Ctrl-C
    propagate, carrying the rows measured so far as ``exc.partial_rows`` (also kept in :data:`last_partial`).
    """
    global last_partial
    from .device import get_device

    dev = get_device(device)
    rows: list[dict[str, Any]] = []
    oom_at = None
    values = list(values)
    for value in tqdm(values, desc=f"sweep {name}", disable=not progress, leave=False):
        try:
            row = run(value)
        except BaseException as exc:
            if not (isinstance(exc, Exception) and _is_oom(exc)):
                last_partial = _frame(rows, name, columns)
                exc.partial_rows = last_partial  # type: ignore[attr-defined]
                what = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"stopped by {type(exc).__name__}"
                exc.add_note(
                    f"The sweep was {what} at {name}={value}; the {len(rows)} row(s) measured before it are kept "
                    "in `cu.sweep.last_partial` (and on this exception as `.partial_rows`)."
                )
                raise
            oom_at = value
        if oom_at is not None:  # freed outside the except block, once the traceback (holding tensors) is gone
            _free_memory(dev)
            print(f"Out of memory at {name}={value}: stopped the sweep, freed the cache, kept {len(rows)} rows.")
            break
        rows.append({name: value, **row})
    last_partial = None
    df = _frame(rows, name, columns)
    df.attrs["oom_at"] = oom_at
    df.attrs["max_fit"] = rows[-1][name] if rows else None
    return df


_TIMING = ("median_ms", "p10_ms", "p90_ms", "iqr_ms", "n", "throughput")
SWEEP_COLUMNS = ["batch_size", *_TIMING, "ms_per_item"]


def batch_sweep(
    model: Callable[[torch.Tensor], Any],
    make_input: Callable[[int], torch.Tensor],
    batch_sizes: Iterable[int],
    *,
    device: str | torch.device | None = None,
    memory_limit_mb: float | None = None,
    progress: bool = True,
    **measure_kwargs: Any,
) -> pd.DataFrame:
    """Latency and throughput of ``model(make_input(b))`` for each batch size ``b``.

    Columns: ``batch_size, median_ms, p10_ms, p90_ms, iqr_ms, n, throughput, ms_per_item`` (present even
    when the first batch runs out of memory and no row is measured).
    ``memory_limit_mb`` simulates a smaller device: a batch whose input tensor alone exceeds it raises
    ``torch.OutOfMemoryError`` and takes the same path as a real CUDA out-of-memory error.
    Runs under ``torch.inference_mode()``. Errors other than out-of-memory propagate with the rows measured
    so far attached (see :func:`sweep`).
    """
    from .device import get_device

    dev = get_device(device)

    def run(b: int) -> dict[str, Any]:
        x = make_input(b)
        if memory_limit_mb is not None:
            need = x.element_size() * x.nelement() / 2**20
            if need > memory_limit_mb:
                raise torch.OutOfMemoryError(
                    f"simulated: batch {b} input needs {need:.1f} MiB > memory_limit_mb={memory_limit_mb}"
                )
        with torch.inference_mode():
            m = measure(lambda: model(x), device=dev, batch_size=b, **measure_kwargs)
        d = m.as_dict()
        return {k: d[k] for k in _TIMING} | {"ms_per_item": m.median_ms / b}

    return sweep(run, batch_sizes, name="batch_size", device=dev, progress=progress, columns=SWEEP_COLUMNS)


def knee(df: pd.DataFrame, *, x: str = "batch_size", y: str = "throughput", fraction: float = 0.9) -> Any:
    """The smallest ``x`` whose ``y`` reaches ``fraction`` of the best ``y``: where throughput saturates."""
    if df.empty:
        raise BadArgumentError(
            "knee() needs at least one measured row, and this sweep has none (did the first batch size run out "
            "of memory? see df.attrs['oom_at']): start the sweep at a smaller batch size"
        )
    best = df[y].max()
    return df.loc[df[y] >= fraction * best, x].min()


def best_under_budget(df: pd.DataFrame, budget_ms: float, *, latency: str = "p90_ms") -> pd.Series | None:
    """The row with the highest throughput whose ``latency`` column stays within ``budget_ms`` (None if none)."""
    ok = df[df[latency] <= budget_ms]
    if ok.empty:
        return None
    return ok.loc[ok["throughput"].idxmax()]
