"""Time a callable correctly on any device.

GPU work is asynchronous: a Python timer around a launch measures the launch, not the work.
:func:`measure` is the timer lesson 01 writes out in its own cells (``time_calls``): it warms up, synchronizes,
then times each call with CUDA events on a GPU (waiting for the end event) or ``time.perf_counter`` plus a
synchronize elsewhere, repeats until the sample is large enough for a stable median, and reports median and
percentiles. What it adds to the lesson's dozen lines: repeating until ``min_time_s`` has passed, and the
:class:`Measurement` summary.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from course_utils.supply.modes import pick

HIGH_SPREAD = 0.25  # IQR / median above this triggers a warning


class HighSpreadWarning(UserWarning):
    """The timings varied a lot: the machine was busy or the workload is too short to time alone."""


@dataclass
class Measurement:
    """Per-call timings of one workload and their summary (all times in milliseconds)."""

    times_ms: list[float] = field(repr=False)
    device: str = "cpu"
    batch_size: int | None = None
    label: str = ""

    @property
    def n(self) -> int:
        return len(self.times_ms)

    @property
    def median_ms(self) -> float:
        return float(np.median(self.times_ms))

    @property
    def mean_ms(self) -> float:
        return float(np.mean(self.times_ms))

    @property
    def p10_ms(self) -> float:
        return float(np.percentile(self.times_ms, 10))

    @property
    def p90_ms(self) -> float:
        return float(np.percentile(self.times_ms, 90))

    @property
    def p99_ms(self) -> float:
        return float(np.percentile(self.times_ms, 99))

    @property
    def iqr_ms(self) -> float:
        q75, q25 = np.percentile(self.times_ms, [75, 25])
        return float(q75 - q25)

    @property
    def spread(self) -> float:
        """Relative spread: IQR divided by the median."""
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else 0.0

    @property
    def throughput(self) -> float | None:
        """Items per second at the median time, when a batch size was given."""
        if self.batch_size is None or self.median_ms <= 0:
            return None
        return self.batch_size / (self.median_ms / 1000.0)

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {
            "label": self.label,
            "device": self.device,
            "batch_size": self.batch_size,
            "median_ms": self.median_ms,
            "mean_ms": self.mean_ms,
            "p10_ms": self.p10_ms,
            "p90_ms": self.p90_ms,
            "iqr_ms": self.iqr_ms,
            "n": self.n,
            "throughput": self.throughput,
        }

    def __str__(self) -> str:
        text = f"{self.label + ': ' if self.label else ''}median {self.median_ms:.3f} ms"
        text += f" (p10 {self.p10_ms:.3f}, p90 {self.p90_ms:.3f}, IQR {self.iqr_ms:.3f}, n={self.n})"
        if self.throughput is not None:
            text += f", {self.throughput:,.0f} items/s"
        return text


def _resolve_device(device: str | torch.device | None) -> torch.device:
    from course_utils.measuring.device import get_device

    return get_device(device)


def measure(
    fn: Callable[[], object],
    *,
    device: str | torch.device | None = None,
    batch_size: int | None = None,
    warmup: int | None = None,
    min_time_s: float | None = None,
    min_repeats: int | None = None,
    max_repeats: int = 10_000,
    label: str = "",
    warn_spread: bool = True,
) -> Measurement:
    """Time ``fn()`` with warm-up and synchronization; return a :class:`Measurement`.

    ``device`` says where ``fn`` runs (default: :func:`course_utils.measuring.device.pick_device`); on CUDA each
    call is bracketed by CUDA events and synchronized, on CPU by ``perf_counter``. Calls repeat until both
    ``min_repeats`` calls and ``min_time_s`` seconds are reached (smaller in smoke mode). Call it with
    the same ``torch.get_num_threads()`` you compare against: CPU timings depend on the thread count.
    """
    dev = _resolve_device(device)
    warmup = pick(full=5, smoke=2) if warmup is None else warmup
    min_time_s = pick(full=1.0, smoke=0.05) if min_time_s is None else min_time_s
    min_repeats = pick(full=20, smoke=5) if min_repeats is None else min_repeats

    for _ in range(warmup):
        fn()
    times: list[float] = []
    start_all = time.perf_counter()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        while len(times) < max_repeats:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            if len(times) >= min_repeats and time.perf_counter() - start_all >= min_time_s:
                break
    else:
        from course_utils.measuring.device import synchronize

        while len(times) < max_repeats:
            t0 = time.perf_counter()
            fn()
            synchronize(dev)
            times.append((time.perf_counter() - t0) * 1000.0)
            if len(times) >= min_repeats and time.perf_counter() - start_all >= min_time_s:
                break
    result = Measurement(times_ms=times, device=str(dev), batch_size=batch_size, label=label)
    if warn_spread and result.spread > HIGH_SPREAD:
        warnings.warn(
            f"{label or 'measurement'}: high spread (IQR is {result.spread:.0%} of the median); "
            "close other programs or raise min_time_s before trusting small differences.",
            HighSpreadWarning,
            stacklevel=2,
        )
    return result
