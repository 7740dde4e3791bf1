"""Plots every lesson shares: batch-size curves, speed-up bars, latency distributions, Pareto fronts.

Each function draws on a new (or given) matplotlib Axes, labels units, and returns the Figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

STYLE = {"figure.figsize": (7, 4), "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
         "axes.spines.right": False}  # fmt: skip
matplotlib.rcParams.update(STYLE)


def batch_curve(df: pd.DataFrame, *, label: str = "", title: str = "Latency and throughput vs batch size"):
    """Two panels: median latency (with p10-p90 band) and throughput, against batch size (log2 x-axis)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    groups = df.groupby("variant") if "variant" in df.columns else [(label, df)]
    for name, g in groups:
        g = g.sort_values("batch_size")
        ax1.plot(g["batch_size"], g["median_ms"], marker="o", label=name or None)
        if {"p10_ms", "p90_ms"} <= set(g.columns):
            ax1.fill_between(g["batch_size"], g["p10_ms"], g["p90_ms"], alpha=0.2)
        ax2.plot(g["batch_size"], g["throughput"], marker="o", label=name or None)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
    ax1.set_ylabel("latency per batch (ms, median; band p10-p90)")
    ax2.set_ylabel("throughput (items/s)")
    if "variant" in df.columns or label:
        ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def speedup_bars(
    speedups: Mapping[str, Any] | pd.Series, *, title: str = "Speed-up vs baseline", ax=None, baseline: float = 1.0
):
    """Horizontal bars of speed-up factors, with the baseline (1.0x) drawn as a line.

    A value may be a :class:`course_utils.measuring.intervals.Ratio` (``cu.compare(...).ratio(name)``): its bar
    gets the 95% interval as a whisker and is grey when the interval contains 1 (no difference beyond the
    machine's noise); plain numbers are green above the baseline and red below.
    """
    names = list(speedups.index) if isinstance(speedups, pd.Series) else list(speedups)
    items = [speedups[k] for k in names]
    ratios = [v if hasattr(v, "low") and hasattr(v, "estimate") else None for v in items]
    values = np.array([r.estimate if r is not None else float(v) for r, v in zip(ratios, items, strict=True)])
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 0.5 * len(values) + 1.5))
    else:
        fig = ax.figure

    def colour(v: float, r: Any) -> str:
        if r is not None and r.low <= baseline <= r.high:
            return "tab:gray"
        return "tab:green" if v >= baseline else "tab:red"

    ax.barh(names, values, color=[colour(v, r) for v, r in zip(values, ratios, strict=True)])
    ax.axvline(baseline, color="black", lw=1)
    for i, (v, r) in enumerate(zip(values, ratios, strict=True)):
        if r is None:
            ax.text(v, i, f" {v:.2f}x", va="center")
            continue
        ax.errorbar(v, i, xerr=[[v - r.low], [r.high - v]], color="black", capsize=3)
        ax.text(r.high, i, f" {v:.2f}x ({r.low:.2f}-{r.high:.2f})", va="center")
    ax.set_xlabel("speed-up (x, higher is faster)" + ("; whiskers: 95% interval" if any(ratios) else ""))
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def latency_distribution(samples: Mapping[str, Sequence[float]], *, title: str = "Latency distribution", ax=None):
    """Histogram of per-call latencies (ms) for each named variant, medians marked."""
    if ax is None:
        fig, ax = plt.subplots()
    else:
        fig = ax.figure
    all_vals = np.concatenate([np.asarray(v, dtype=float) for v in samples.values()])
    bins = np.linspace(all_vals.min(), np.percentile(all_vals, 99.5), 50) if all_vals.size else 10
    for name, vals in samples.items():
        vals = np.asarray(vals, dtype=float)
        line = ax.hist(vals, bins=bins, alpha=0.5, label=f"{name} (median {np.median(vals):.3g} ms)")
        ax.axvline(np.median(vals), color=line[2][0].get_facecolor(), ls="--")
    ax.set_xlabel("latency per call (ms)")
    ax.set_ylabel("calls")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def pareto(df: pd.DataFrame, *, x: str = "median_ms", y: str = "accuracy", label: str = "variant", ax=None,
           title: str = "Accuracy vs latency"):  # fmt: skip
    """Scatter of accuracy vs latency with each point labelled; the Pareto front is drawn as a step line."""
    if ax is None:
        fig, ax = plt.subplots()
    else:
        fig = ax.figure
    ax.scatter(df[x], df[y], s=50)
    for _, row in df.iterrows():
        ax.annotate(str(row[label]), (row[x], row[y]), textcoords="offset points", xytext=(5, 3))
    front = df.sort_values(x)
    front = front[front[y] >= front[y].cummax()]
    ax.step(front[x], front[y], where="post", color="tab:green", alpha=0.6, label="Pareto front")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig
