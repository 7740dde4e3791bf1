"""A ratio with its 95% confidence interval, its verdict and what flags it (drift, stand-in timing).

:mod:`course_utils.measuring.comparing` measures the variants in interleaved rounds and keeps one ratio per
round; :func:`ratio_from_rounds` turns those per-round ratios into a :class:`Ratio`: the median of the rounds,
and the distribution-free 95% interval of that median (:func:`median_interval`). A ratio above 1
means the variant is better (faster, or more of a higher-is-better metric). The interval, not the estimate,
decides: "faster" only when its low end is above 1, "slower" only when its high end is below 1, and otherwise
"no difference beyond this machine's noise"; a target is "met" only when the low end clears it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

CONFIDENCE = 0.95
NO_DIFFERENCE = "no difference beyond this machine's noise"
VERDICTS = ("faster", "slower", NO_DIFFERENCE)
JUDGEMENTS = ("met", "not shown", "missed", "not judged (stand-in timing)", "not judged (drifted)")
RESOLUTION = 0.005  # half the last printed digit of a ratio: smaller differences are not claimed
STANDIN_FLAG = "stand-in timing (the rehearsal's CPU stand-in, not a GPU): judges nothing"


def fmt(x: float) -> str:
    """A ratio as printed: two decimals, one above 10, three significant digits below 0.1."""
    if not np.isfinite(x):
        return str(x)
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 0.1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def median_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(low, high, confidence): the distribution-free interval of the median of ``values``.

    It is the order-statistic interval (``scipy.stats.quantile_test``): the k-th smallest and k-th largest value,
    k from the binomial distribution, so it covers the true median at least ``confidence`` of the time for any
    distribution of independent rounds. A percentile bootstrap of the median, tried first, covered only 87-93%
    at 7 to 15 rounds in simulation (heavy-tailed rounds are what a loaded machine gives). Under 6 rounds no 95%
    interval exists: then it is the whole range, at the confidence that range has (94% at 5 rounds).
    """
    values = np.asarray(values, dtype=float)
    n = values.size
    if n == 0:
        return float("nan"), float("nan"), confidence
    med = float(np.median(values))
    if n == 1 or np.ptp(values) <= 1e-12 * abs(med):  # every round the same (a simulated clock)
        return med, med, confidence
    from scipy import stats

    ci = stats.quantile_test(values, q=med, p=0.5).confidence_interval(confidence)
    if np.isfinite(ci.low) and np.isfinite(ci.high):
        return float(ci.low), float(ci.high), confidence
    return float(values.min()), float(values.max()), 1.0 - 2.0 * 0.5**n


@dataclass
class Ratio:
    """A variant against the baseline: estimate, 95% interval over rounds, verdict and flags.

    ``estimate`` is the median of the per-round ratios (``rounds``); ``low``/``high`` bound it at ``confidence``
    (95%; lower only when there were under 6 rounds).
    ``drifted`` (with ``drift_reason``) says the interval cannot be trusted: the work both variants share, or
    the baseline itself, changed during the comparison by more than the interval can absorb. ``standin`` says
    the timings came from the rehearsal's CPU stand-in of a GPU: printed, labelled, never judged.
    """

    name: str
    baseline: str
    estimate: float
    low: float
    high: float
    rounds: list[float] = field(repr=False)
    drifted: bool = False
    drift_reason: str = ""
    standin: bool = False
    confidence: float = CONFIDENCE

    @property
    def verdict(self) -> str:
        """From the interval: "faster" when its low end is above 1, "slower" when its high end is below 1, by more
        than the printed precision (:data:`RESOLUTION`: 1.00-1.00x is never a difference)."""
        if self.low > 1.0 + RESOLUTION:
            return "faster"
        if self.high < 1.0 - RESOLUTION:
            return "slower"
        return NO_DIFFERENCE

    @property
    def half_width(self) -> float:
        """Half the interval's width relative to the estimate (0.05: about ±5%)."""
        return (self.high - self.low) / 2 / self.estimate if self.estimate > 0 else float("inf")

    @property
    def flags(self) -> list[str]:
        """What a reader must know before trusting the number (empty when nothing)."""
        out = []
        if self.standin:
            out.append(STANDIN_FLAG)
        if self.drifted:
            out.append(f"drifted: {self.drift_reason}")
        return out

    @property
    def interval_text(self) -> str:
        """As printed: "1.45x (95% CI 1.31-1.62)" or "no difference beyond this machine's noise (0.90-1.30x)"."""
        if self.verdict == NO_DIFFERENCE:
            return f"{NO_DIFFERENCE} ({fmt(self.low)}-{fmt(self.high)}x)"
        return f"{fmt(self.estimate)}x ({self.confidence:.0%} CI {fmt(self.low)}-{fmt(self.high)})"

    def __str__(self) -> str:
        return self.interval_text + "".join(f" [{f}]" for f in self.flags)

    def judge(self, target: float) -> str:
        """Against a target ratio: "met" only when the interval's low end reaches it, "missed" when its high end
        is below it, "not shown" when the interval straddles it; stand-in or drifted numbers are not judged."""
        if self.standin:
            return "not judged (stand-in timing)"
        if self.drifted:
            return "not judged (drifted)"
        if self.low >= target:
            return "met"
        if self.high < target:
            return "missed"
        return "not shown"

    def judge_within(self, low: float, high: float) -> str:
        """Against a band ("within 10%": 0.9 to 1.1): "met" when the whole interval lies inside it, "missed" when
        none of it does, "not shown" otherwise; stand-in or drifted numbers are not judged."""
        if self.standin:
            return "not judged (stand-in timing)"
        if self.drifted:
            return "not judged (drifted)"
        if low <= self.low and self.high <= high:
            return "met"
        if self.high < low or self.low > high:
            return "missed"
        return "not shown"

    def against(self, target: float) -> str:
        """A target line: "1.45x (95% CI 1.31-1.62) vs target >= 1.5x: not shown"."""
        return f"{self} vs target >= {fmt(target)}x: {self.judge(target)}"

    def says(self, variant: str, baseline: str, better: str = "faster than") -> str:
        """A finding phrased from the interval: "INT8 is 1.45x (95% CI 1.31-1.62) faster than FP32", "INT8 is
        0.62x (95% CI ...) the speed of FP32 (slower)", or "INT8 vs FP32: no difference beyond this machine's
        noise (0.90-1.30x)". ``better`` names the direction for metrics ("the throughput of")."""
        flags = "".join(f" [{f}]" for f in self.flags)
        if self.verdict == NO_DIFFERENCE:
            return f"{variant} vs {baseline}: {self.interval_text}{flags}"
        if self.verdict == "faster":
            return f"{variant} is {self.interval_text} {better} {baseline}{flags}"
        return f"{variant} is {self.interval_text} vs {baseline}: {self.verdict}{flags}"

    def as_row(self, prefix: str = "speedup") -> dict[str, float | str]:
        """Columns for a table or a results row: ``speedup``, ``speedup_low``, ``speedup_high``, verdict, flags."""
        return {
            prefix: self.estimate,
            f"{prefix}_low": self.low,
            f"{prefix}_high": self.high,
            "verdict": self.verdict,
            "flags": "; ".join(self.flags),
        }


def ratio_from_rounds(
    name: str,
    baseline: str,
    per_round: np.ndarray,
    *,
    drifted: bool = False,
    drift_reason: str = "",
    standin: bool = False,
) -> Ratio:
    """The :class:`Ratio` of per-round ratios (variant better when > 1): their median and its interval."""
    per_round = np.asarray(per_round, dtype=float)
    per_round = per_round[np.isfinite(per_round)]
    if per_round.size == 0:
        raise ValueError(f"{name} vs {baseline}: no finite per-round ratio (every round timed 0 or failed)")
    low, high, confidence = median_interval(per_round)
    return Ratio(
        name=name,
        baseline=baseline,
        estimate=float(np.median(per_round)),
        low=low,
        high=high,
        rounds=[float(r) for r in per_round],
        drifted=drifted,
        drift_reason=drift_reason,
        standin=standin,
        confidence=confidence,
    )
