"""What :func:`course_utils.capstone.optimize.optimize` returns, and how to read it: the table, the plot, the guide.

:class:`Step` is one row (a technique, whether it ran, why not, what it measured); :class:`OptimizeReport`
holds the rows with ``df``, ``plot()`` and ``record()``; :func:`decision_guide` turns a report into "on this
machine, try X first" from its own numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from course_utils.measuring.outputs import OutputMatch
from course_utils.measuring.timing import Measurement

COLUMNS = ["technique", "applied", "reason", "batch_size", "median_ms", "throughput", "speedup", "accuracy",
           "within_budget", "check", "setup_s"]  # fmt: skip


@dataclass
class Step:
    """One row of the report: a technique, whether it ran, why not, and what it measured."""

    technique: str
    applied: bool
    reason: str = ""
    batch_size: int | None = None
    median_ms: float | None = None
    throughput: float | None = None
    speedup: float | None = None
    accuracy: float | None = None
    within_budget: bool | None = None
    check: str = ""
    setup_s: float | None = None
    measurement: Measurement | None = field(default=None, repr=False)
    comparison: OutputMatch | None = field(default=None, repr=False)
    precision: str = "fp32"
    ratio: Any = field(default=None, repr=False)  # the cu.compare Ratio behind ``speedup`` (its interval)

    def row(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in COLUMNS}


@dataclass
class OptimizeReport:
    """What :func:`optimize` found: one :class:`Step` per technique, plus the settings it ran with."""

    steps: list[Step]
    device: str
    baseline_accuracy: float
    accuracy_budget: float
    example_batch: int
    threads: int
    model_name: str = "model"
    load_avg: float | None = None

    @property
    def busy(self) -> bool:
        """True when other work competed for the CPU during the run (1-minute load above the core count)."""
        import os

        return self.load_avg is not None and self.load_avg > (os.cpu_count() or 1)

    @property
    def df(self) -> pd.DataFrame:
        """The table: technique, applied, reason, batch size, median ms, throughput, speed-up, accuracy, ..."""
        df = pd.DataFrame([s.row() for s in self.steps], columns=COLUMNS)
        df["batch_size"] = df["batch_size"].astype("Int64")
        df["cumulative_speedup"] = cumulative_speedup(df)
        return df

    def step(self, technique: str) -> Step:
        """The first step whose technique name starts with ``technique`` (KeyError if none)."""
        for s in self.steps:
            if s.technique == technique or s.technique.startswith(technique + " "):
                return s
        raise KeyError(f"no step '{technique}'; steps: {[s.technique for s in self.steps]}")

    def paying(self, min_gain: float = 1.05) -> pd.DataFrame:
        """Rows that ran, stayed within budget and are at least ``min_gain`` times the baseline speed, best first;
        a speed-up with an interval counts only when the interval's low end reaches ``min_gain``."""
        df = self.df
        ok = df["applied"] & df["within_budget"].fillna(False).astype(bool) & (df["technique"] != "baseline")
        low = [s.ratio.low if s.ratio is not None else s.speedup for s in self.steps]
        df = df[ok & (pd.Series(low, index=df.index, dtype=float) >= min_gain)]
        return df.sort_values("speedup", ascending=False).reset_index(drop=True)

    def plot(self, *, title: str | None = None):
        """Two panels: speed-up per technique (with the best-so-far line) and accuracy against the budget."""
        import matplotlib.pyplot as plt

        df = self.df
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 0.45 * len(df) + 2.2), sharey=True)
        names = list(df["technique"])
        ypos = list(range(len(df)))
        speed = df["speedup"].astype(float).fillna(0.0)
        colors = []
        for _, r in df.iterrows():
            if not r["applied"] or pd.isna(r["speedup"]):
                colors.append("lightgray")
            elif not r["within_budget"]:
                colors.append("tab:orange")
            else:
                colors.append("tab:green" if r["speedup"] >= 1.0 else "tab:red")
        ax1.barh(ypos, speed, color=colors)
        ax1.plot(df["cumulative_speedup"].astype(float), ypos, color="black", marker="o", lw=1.2,
                 label="best so far (cumulative)")  # fmt: skip
        ax1.axvline(1.0, color="black", lw=0.8)
        for i, r in df.iterrows():
            if pd.notna(r["speedup"]):
                text = f" {r['speedup']:.2f}x"
            else:
                text = " skipped" if not r["applied"] else " not timed"
            ax1.text(speed.iloc[i], i, text, va="center", fontsize=8)
        ax1.set_yticks(ypos, names)
        ax1.invert_yaxis()
        ax1.set_xlabel("speed-up vs baseline (throughput, x)")
        ax1.legend(loc="lower right", fontsize=8)
        acc = df["accuracy"].astype(float)
        ax2.scatter(acc, ypos, color=colors, s=50, zorder=3)
        ax2.axvline(self.baseline_accuracy, color="black", lw=0.8, label="baseline")
        ax2.axvspan(self.baseline_accuracy - self.accuracy_budget, self.baseline_accuracy, color="tab:green",
                    alpha=0.12, label=f"budget ({self.accuracy_budget:g})")  # fmt: skip
        ax2.set_xlabel("accuracy (your accuracy_fn)")
        ax2.legend(loc="lower left", fontsize=8)
        fig.suptitle(title or f"{self.model_name} on {self.device}: what pays here (gray: skipped or not timed)")
        fig.tight_layout()
        return fig

    def record(self, lesson: str, *, model: str | None = None) -> int:
        """Write one results row per timed step, and one per failed step (notes ``failed: ...``, no timing), via
        :func:`course_utils.show.results.record`; return how many. A failed row is what an after-run check looks for.
        """
        from course_utils.show.results import record

        n = 0
        for s in self.steps:
            if s.measurement is None:
                if s.reason.startswith("failed"):
                    record(lesson, s.technique, model=model or self.model_name, device=self.device,
                           dtype=s.precision, notes=s.reason)  # fmt: skip
                    n += 1
                continue
            err = None if s.comparison is None else s.comparison.max_rel
            record(lesson, s.technique, model=model or self.model_name, device=self.device, dtype=s.precision,
                   measurement=s.measurement, speedup_vs_baseline=s.speedup, error_vs_baseline=err,
                   notes=f"accuracy {s.accuracy:.4f}; {s.reason}" if s.accuracy is not None else s.reason)  # fmt: skip
            n += 1
        return n


def cumulative_speedup(df: pd.DataFrame) -> pd.Series:
    """Best speed-up found so far, going down the table: only steps that ran within budget count."""
    best, out = 1.0, []
    for _, r in df.iterrows():
        if r["applied"] and bool(r["within_budget"]) and pd.notna(r["speedup"]):
            best = max(best, float(r["speedup"]))
        out.append(best)
    return pd.Series(out, index=df.index, dtype=float)


def decision_guide(report: OptimizeReport, *, min_gain: float = 1.05) -> str:
    """Advice from the report's own numbers: what to try first on this machine, what did not pay, what was skipped.

    ``min_gain`` is the smallest speed-up counted as a gain (timings on a busy machine vary by a few percent).
    """
    df = report.df
    base = df[df["technique"] == "baseline"].iloc[0]
    lines = [
        f"Model {report.model_name} on {report.device} ({report.threads} threads), baseline "
        f"{base['median_ms']:.3f} ms per batch of {report.example_batch}, accuracy {report.baseline_accuracy:.4f} "
        f"(budget: a drop of at most {report.accuracy_budget:g})."
    ]
    if report.busy:
        import os

        lines.append(
            f"Caution: the machine was busy during this run (load average {report.load_avg:.1f} on "
            f"{os.cpu_count()} cores): other processes competed for the CPU, so the timings below may be "
            "distorted (multi-threaded eager PyTorch suffers most). Re-run on a quiet machine before deciding."
        )
    paying = report.paying(min_gain)
    if paying.empty:
        lines.append(
            f"On this machine, no technique reached {min_gain:.2f}x the baseline's throughput within the budget: "
            "keep the baseline, and look at the bottleneck again (lesson 01-02) before optimizing."
        )
    else:
        top = paying.iloc[0]
        lines.append(
            f"On this machine, try {top['technique']} first: {_speed(report, top)} the baseline's throughput, "
            f"accuracy {top['accuracy']:.4f}."
        )
        for _, r in paying.iloc[1:].iterrows():
            lines.append(f"  then {r['technique']}: {_speed(report, r)}, accuracy {r['accuracy']:.4f}")
        if pd.notna(top["setup_s"]) and top["setup_s"] >= 1.0:
            lines.append(f"  ({top['technique']} costs {top['setup_s']:.1f} s of set-up before the first answer.)")
    ran = df[df["applied"] & (df["technique"] != "baseline")]
    slow = ran[ran["speedup"].notna() & ~ran["technique"].isin(set(paying["technique"]))]  # not shown to pay
    for _, r in slow.iterrows():
        step = next((s for s in report.steps if s.technique == r["technique"] and s.ratio is not None), None)
        said = step.ratio.verdict if step is not None else ("slower" if r["speedup"] < 1.0 else "")
        verdict = {  # "faster" and yet not paying: its interval's low end is under min_gain
            "slower": "is slower than the baseline",
            "faster": f"is faster than the baseline, but not shown {min_gain:.2f}x it",
        }.get(said, "is not shown faster than the baseline")
        lines.append(f"Does not pay here: {r['technique']} {verdict} ({_speed(report, r)}).")
    for _, r in ran[~ran["within_budget"].fillna(False).astype(bool)].iterrows():
        lines.append(f"Outside the budget: {r['technique']} ({r['reason'] or r['check']}).")
    for _, r in df[~df["applied"]].iterrows():
        lines.append(f"Skipped: {r['technique']}: {r['reason']}")
    return "\n".join(lines)


def _speed(report: OptimizeReport, row: Any) -> str:
    """A row's speed-up as printed: its cu.compare interval when it has one, else the number."""
    step = next((s for s in report.steps if s.technique == row["technique"] and s.ratio is not None), None)
    return str(step.ratio) if step is not None else f"{row['speedup']:.2f}x"
