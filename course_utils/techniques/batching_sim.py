"""Dynamic batching, simulated: Poisson request arrivals against a batcher and one model instance.

A server that runs one request at a time is capped at ``1 / service(1)`` requests per second; one that
groups waiting requests into a batch (up to ``max_batch_size``, waiting at most ``max_wait_ms`` for the
batch to fill) serves ``b / service(b)``, which grows with ``b`` while the device has spare parallelism.
The price is latency: a request may wait for others. This module simulates that trade-off with service
times measured in the lesson (a batch-size sweep), so the curves describe this machine:

* :func:`service_time_fn` turns a sweep DataFrame into ``service_ms(batch_size)`` (interpolated);
* :func:`poisson_arrivals` draws request arrival times at a given rate;
* :func:`simulate` runs the batcher and returns per-request latencies and a summary;
* :func:`plot_rate_sweep` draws p50/p99 latency and throughput against the arrival rate.

Lesson 03 measures the service times and chooses the policies; the simulator is lab equipment, no lesson's
subject, so no lesson writes it out.

Lesson 13 serves a real model with a real batching server; this simulation is the model of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

ServiceFn = Callable[[int], float]


def service_time_fn(sweep_df: pd.DataFrame, *, column: str = "median_ms") -> ServiceFn:
    """``service_ms(b)``: time (ms) to run a batch of ``b``, interpolated from a batch-size sweep.

    ``sweep_df`` needs ``batch_size`` and ``column`` (e.g. from :func:`course_utils.sweep.batch_sweep`).
    Between measured sizes the time is interpolated linearly; a batch larger than the largest measured one
    raises ValueError (measure it, or lower ``max_batch_size``).
    """
    if sweep_df.empty or not {"batch_size", column} <= set(sweep_df.columns):
        raise ValueError(f"service_time_fn() needs a non-empty sweep with columns 'batch_size' and '{column}'")
    df = sweep_df.sort_values("batch_size")
    bs = df["batch_size"].to_numpy(dtype=float)
    ms = df[column].to_numpy(dtype=float)

    def service_ms(b: int) -> float:
        if b < 1:
            raise ValueError(f"batch size must be >= 1, got {b}")
        if b > bs[-1]:
            raise ValueError(
                f"batch {b} is larger than the largest measured batch ({int(bs[-1])}): add it to the sweep "
                "or lower max_batch_size"
            )
        if b <= bs[0]:
            return float(ms[0]) * b / bs[0]
        return float(np.interp(b, bs, ms))

    service_ms.max_batch = int(bs[-1])  # type: ignore[attr-defined]
    return service_ms


def poisson_arrivals(rate_per_s: float, n: int, *, seed: int = 0) -> np.ndarray:
    """Arrival times (ms, increasing) of ``n`` requests from a Poisson process with ``rate_per_s`` requests/s.

    Gaps between arrivals are exponential with mean ``1000 / rate_per_s`` ms: requests come independently,
    so they bunch up at random, which is what lets a batcher find company for a request.
    """
    if rate_per_s <= 0 or n < 1:
        raise ValueError(f"poisson_arrivals() needs rate_per_s > 0 and n >= 1, got {rate_per_s}, {n}")
    gaps = np.random.default_rng(seed).exponential(1000.0 / rate_per_s, size=n)
    return np.cumsum(gaps)


@dataclass
class SimResult:
    """Per-request latencies (ms) and batch sizes of one simulated run, with the usual summaries."""

    latencies_ms: np.ndarray = field(repr=False)
    batch_sizes: np.ndarray = field(repr=False)
    span_ms: float

    @property
    def p50_ms(self) -> float:
        return float(np.percentile(self.latencies_ms, 50))

    @property
    def p99_ms(self) -> float:
        return float(np.percentile(self.latencies_ms, 99))

    @property
    def throughput(self) -> float:
        """Completed requests per second over the run (first arrival to last completion)."""
        return len(self.latencies_ms) / (self.span_ms / 1000.0) if self.span_ms > 0 else float("nan")

    @property
    def mean_batch(self) -> float:
        return float(np.mean(self.batch_sizes))

    def summary(self) -> dict[str, float]:
        return {"p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "throughput": self.throughput,
                "mean_batch": self.mean_batch}  # fmt: skip


def simulate(
    arrivals_ms: np.ndarray, service_ms: ServiceFn, *, max_batch_size: int = 1, max_wait_ms: float = 0.0
) -> SimResult:
    """Serve requests arriving at ``arrivals_ms`` with one model instance and a dynamic batcher.

    When the model is free and requests are waiting, the batcher dispatches as soon as either
    ``max_batch_size`` requests are queued or the oldest has waited ``max_wait_ms``; it then takes every
    queued request up to ``max_batch_size``. If the model is still busy when that moment comes, the batch
    goes as soon as it is free (with whatever has queued by then). ``max_batch_size=1`` is no batching.
    A request's latency is its completion time minus its arrival time (queueing + waiting + service).
    """
    if max_batch_size < 1 or max_wait_ms < 0:
        raise ValueError(f"need max_batch_size >= 1 and max_wait_ms >= 0, got {max_batch_size}, {max_wait_ms}")
    arr = np.asarray(arrivals_ms, dtype=float)
    if arr.ndim != 1 or arr.size == 0 or np.any(np.diff(arr) < 0):
        raise ValueError("arrivals_ms must be a non-empty, increasing 1-D array of times in ms")
    n = arr.size
    done = np.empty(n)
    batches: list[int] = []
    free_at = -np.inf
    i = 0
    while i < n:
        ready = arr[i] + max_wait_ms  # the oldest waiting request may not wait longer than this
        j_full = i + max_batch_size - 1
        if j_full < n:
            ready = min(ready, arr[j_full])  # ...and the batch goes early once it is full
        start = max(free_at, ready)
        j = int(np.searchsorted(arr, start, side="right"))  # every request that has arrived by `start`
        j = min(max(j, i + 1), i + max_batch_size)
        finish = start + service_ms(j - i)
        done[i:j] = finish
        batches.append(j - i)
        free_at = finish
        i = j
    return SimResult(latencies_ms=done - arr, batch_sizes=np.asarray(batches), span_ms=float(done[-1] - arr[0]))


def service_bounds(sweep_df: pd.DataFrame, max_batch_size: int, confidence: float = 0.95):
    """``(fast, slow, joint)``: service-time functions at the low and the high end of each needed batch size's
    median interval, and the confidence with which all those intervals hold at once.

    A simulation fed ``fast`` and ``slow`` bounds what the timings allow it to say. Each of the ``k`` batch sizes a
    batch of up to ``max_batch_size`` interpolates from gets an interval at ``1 - (1 - confidence) / k``
    (Bonferroni), so all hold together at ``confidence`` or more; with too few calls per size an interval is the
    calls' range at a lower confidence, and ``joint`` (``1 - sum of the misses``) says so. The per-call times come
    from ``sweep_df.attrs["times_ms"]`` (lesson 03's ``batch_sweep``).
    """
    from course_utils.measuring.intervals import median_interval

    times = sweep_df.attrs.get("times_ms") or {}
    sizes = sorted(int(b) for b in sweep_df["batch_size"])
    needed = [b for b in sizes if b <= max_batch_size]
    if max_batch_size not in needed:  # interpolated up to the next measured size
        needed += [b for b in sizes if b > max_batch_size][:1]
    missing = [b for b in needed if not times.get(b)]
    if missing:
        raise ValueError(f"service_bounds() needs the per-call times of batches {missing} in attrs['times_ms']")
    per = 1 - (1 - confidence) / len(needed)
    rows, misses = [], 0.0
    for b in needed:
        low, high, conf = median_interval(np.asarray(times[b]), per)
        rows.append({"batch_size": b, "low": low, "high": high})
        misses += 1 - conf
    df = pd.DataFrame(rows)
    return service_time_fn(df, column="low"), service_time_fn(df, column="high"), max(0.0, 1 - misses)


def capacity(service_ms: ServiceFn, max_batch_size: int) -> float:
    """The most requests/s one instance can serve with batches of ``max_batch_size``: ``b * 1000 / service(b)``."""
    return max_batch_size * 1000.0 / service_ms(max_batch_size)


def plot_rate_sweep(df: pd.DataFrame, *, title: str = "Dynamic batching, simulated with measured service times"):
    """Two panels against the arrival rate: p50 (solid) and p99 (dashed) latency, and achieved throughput."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for policy, g in df.groupby("policy", sort=False):
        g = g.sort_values("rate")
        (line,) = ax1.plot(g["rate"], g["p50_ms"], marker="o", label=f"{policy} p50")
        ax1.plot(g["rate"], g["p99_ms"], marker="x", ls="--", color=line.get_color(), label=f"{policy} p99")
        ax2.plot(g["rate"], g["throughput"], marker="o", color=line.get_color(), label=policy)
    lo, hi = df["rate"].min(), df["rate"].max()
    ax2.plot([lo, hi], [lo, hi], color="gray", ls=":", label="offered load")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor tick labels of a short log axis overlap
        ax.set_xlabel("arrival rate (requests/s)")
    ax1.set_yscale("log")
    ax1.set_ylabel("latency per request (ms)")
    ax2.set_ylabel("throughput (requests/s)")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
