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


def within_noise_of_previous(low, high) -> np.ndarray:
    """True for each point (after the first) whose interval ``[low, high]`` overlaps the previous point's: the
    step between them is within this run's noise."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    out = np.zeros(low.size, dtype=bool)
    out[1:] = (low[1:] <= high[:-1]) & (high[1:] >= low[:-1])
    return out


def batch_curve(df: pd.DataFrame, *, label: str = "", title: str = "Latency and throughput vs batch size"):
    """One row of panels per model (``variant`` column, else ``label``): median latency per batch with its 95%
    interval as whiskers and the p10-p90 band, and throughput with the same interval, on log axes (models
    milliseconds apart each keep their own scale). A hollow marker is a point within noise of the previous batch
    size (:func:`within_noise_of_previous`). The plotted numbers are kept in ``fig.course_data`` (and in the
    PNG :func:`save` writes)."""
    groups = list(df.groupby("variant", sort=False)) if "variant" in df.columns else [(label, df)]
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.2 * len(groups) + 0.6), squeeze=False)
    rows = []
    for (name, g), (ax1, ax2) in zip(groups, axes, strict=True):
        g = g.sort_values("batch_size")
        b = g["batch_size"].to_numpy(dtype=float)
        med = g["median_ms"].to_numpy(dtype=float)
        has_ci = {"median_low_ms", "median_high_ms"} <= set(g.columns)
        low = g["median_low_ms"].to_numpy(dtype=float) if has_ci else med
        high = g["median_high_ms"].to_numpy(dtype=float) if has_ci else med
        thr = g["throughput"].to_numpy(dtype=float) if "throughput" in g.columns else b * 1e3 / med
        thr_low, thr_high = b * 1e3 / high, b * 1e3 / low
        noise = within_noise_of_previous(thr_low, thr_high) if has_ci else np.zeros(b.size, dtype=bool)
        (line,) = ax1.plot(b, med, label=name or None)
        colour = line.get_color()
        if {"p10_ms", "p90_ms"} <= set(g.columns):
            ax1.fill_between(b, g["p10_ms"], g["p90_ms"], color=colour, alpha=0.15, label="p10-p90 of calls")
        for ax, y, lo, hi in ((ax1, med, low, high), (ax2, thr, thr_low, thr_high)):
            if has_ci:
                ax.errorbar(b, y, yerr=[np.maximum(y - lo, 0), np.maximum(hi - y, 0)], fmt="none", ecolor=colour,
                            capsize=3)  # fmt: skip
            ax.scatter(b[~noise], y[~noise], color=colour, zorder=3)
            ax.scatter(b[noise], y[noise], facecolors="white", edgecolors=colour, zorder=3,
                       label="within noise of the previous size" if noise.any() and ax is ax2 else None)  # fmt: skip
        ax2.plot(b, thr, color=colour)
        ax1.set_ylabel("ms per batch")
        ax2.set_ylabel("items/s")
        ax1.set_title(f"{name}: latency (median, 95% CI; band p10-p90)" if name else "latency", fontsize=9)
        ax2.set_title(f"{name}: throughput" if name else "throughput", fontsize=9)
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch size")
        if noise.any():
            ax2.legend(fontsize=8)
        for i in range(b.size):
            rows.append({"model": name, "batch_size": int(b[i]), "median_ms": med[i], "median_low_ms": low[i],
                         "median_high_ms": high[i], "throughput": thr[i], "throughput_low": thr_low[i],
                         "throughput_high": thr_high[i], "within_noise": bool(noise[i])})  # fmt: skip
    fig.suptitle(title)
    fig.tight_layout()
    fig.course_data = pd.DataFrame(rows)
    return fig


def save(fig, lesson: str, name: str):
    """Save ``fig`` as ``<results folder>/figures/<machine>/<lesson>_<name>.png`` and return the path.

    A workshop can show a lesson's pictures without running it again. The plotted numbers travel inside the PNG
    (text chunk ``course_data``, JSON records: ``fig.course_data`` when the plot kept it, else every line's
    points), so a reader, or a test, gets the data back with ``figure_data(path)``.
    """
    import json

    from course_utils.show.machine_label import machine_id
    from course_utils.supply.paths import results_dir

    if not str(name).replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"figure name {name!r}: use letters, digits, '_' and '-' only")
    folder = results_dir() / "figures" / machine_id()
    folder.mkdir(parents=True, exist_ok=True)
    data = getattr(fig, "course_data", None)
    if data is None:
        data = pd.DataFrame([
            {"axes": i, "line": ln.get_label(), "x": float(x), "y": float(y)}
            for i, ax in enumerate(fig.axes) for ln in ax.get_lines() for x, y in ln.get_xydata()
        ])  # fmt: skip
    path = folder / f"{lesson}_{name}.png"
    fig.savefig(path, dpi=100, metadata={"course_data": json.dumps(data.to_dict(orient="records"))})
    return path


def figure_data(path) -> pd.DataFrame:
    """The numbers a PNG written by :func:`save` shows."""
    import json

    from PIL import Image

    with Image.open(path) as im:
        text = im.text.get("course_data")
    if text is None:
        raise ValueError(f"{path} holds no course_data: it was not written by course_utils.show.plots.save")
    return pd.DataFrame(json.loads(text))


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
    fig.course_data = pd.DataFrame(
        [{"bar": n, "speedup": float(v), "low": None if r is None else r.low, "high": None if r is None else r.high,
          "within_noise": r is not None and r.low <= baseline <= r.high}
         for n, v, r in zip(names, values, ratios, strict=True)]
    )  # fmt: skip
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
    fig.course_data = df[[label, x, y]].assign(on_front=df.index.isin(front.index)).reset_index(drop=True)
    return fig
