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
MIN_ROUNDS_95 = 6  # the fewest rounds whose median has a distribution-free 95% interval
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
        """As printed: "1.45x (95% CI 1.31-1.62)" or "no difference beyond this machine's noise (0.90-1.30x)".

        Under 6 rounds no 95% interval exists: the text says so instead of printing a "75% CI" where the course
        promises 95% ("1.45x (3 rounds: their range 1.31-1.62 covers the median 75% of the time; 6 rounds give
        95%)")."""
        if self.confidence < CONFIDENCE - 1e-9:
            n = len(self.rounds)
            few = (
                f"{n} rounds: their range {fmt(self.low)}-{fmt(self.high)} covers the median {self.confidence:.0%} "
                f"of the time; {MIN_ROUNDS_95} rounds give {CONFIDENCE:.0%}"
                if n
                else f"{self.confidence:.0%} CI {fmt(self.low)}-{fmt(self.high)}: too few timings for {CONFIDENCE:.0%}"
            )
            if self.verdict == NO_DIFFERENCE:
                return f"{NO_DIFFERENCE} ({few})"
            return f"{fmt(self.estimate)}x ({few})"
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


# ---------------------------------------------------------------------------------------------------------------
# Sentences from numbers other than speed ratios. Each function returns a Finding: a verdict a lesson may branch
# on and the sentence to print, phrased from the interval (or the tolerance), never from the estimate alone.
# ---------------------------------------------------------------------------------------------------------------

NO_ACCURACY_DIFFERENCE = "no accuracy difference beyond the seed-to-seed spread"
SAME_MEMORY = "about the same memory"
SAME_TAIL = "no difference beyond this machine's noise"
TOO_FEW = "not told apart"  # a quantile's interval had no end: too few samples, which is not "the same"


@dataclass(frozen=True)
class Finding:
    """A verdict (what a lesson branches on) and the sentence that says it (what a lesson prints)."""

    verdict: str
    text: str

    def __str__(self) -> str:
        return self.text


def _points(x: float) -> str:
    return f"{x:+.2f}"


def accuracy_says(variant: str, baseline: str, diffs_points, confidence: float = CONFIDENCE) -> Finding:
    """Accuracy of ``variant`` minus ``baseline``, in points, one paired difference per seed (``diffs_points``).

    The mean difference with its Student-t interval over the seeds decides: "higher" when the interval's low
    end is above 0, "lower" when its high end is below 0, otherwise :data:`NO_ACCURACY_DIFFERENCE`. One seed has
    no seed-to-seed error: its verdict is "one seed" and the sentence says that nothing is judged.
    """
    d = np.asarray(diffs_points, dtype=float)
    d = d[np.isfinite(d)]
    if d.size == 0:
        raise ValueError(f"{variant} vs {baseline}: no accuracy difference given (pass one per seed, in points)")
    mean = float(d.mean())
    if d.size == 1:
        return Finding(
            "one seed",
            f"{variant} vs {baseline}: {_points(mean)} points from one seed: no seed-to-seed error to judge it by "
            "(run more seeds)",
        )
    from scipy import stats

    se = float(d.std(ddof=1) / np.sqrt(d.size))
    half = float(stats.t.ppf(0.5 + confidence / 2, d.size - 1)) * se
    low, high = mean - half, mean + half
    ci = f"{confidence:.0%} CI {_points(low)} to {_points(high)}, {d.size} seeds, standard error {se:.2f}"
    if low > 0:
        return Finding("higher", f"{variant} raised accuracy by {_points(mean)} points over {baseline} ({ci})")
    if high < 0:
        return Finding("lower", f"{variant} lowered accuracy by {abs(mean):.2f} points vs {baseline} ({ci})")
    return Finding(
        NO_ACCURACY_DIFFERENCE, f"{variant} vs {baseline}: {NO_ACCURACY_DIFFERENCE} ({_points(mean)} points, {ci})"
    )


def quantile_interval(samples, q: float, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(estimate, low, high) of the ``q`` quantile of ``samples``: the distribution-free order-statistic interval.

    ``high`` is ``inf`` when too few samples lie above the quantile to bound it (a p99 needs 367 samples for a
    95% upper bound: fewer, and the slowest sample may still be below the true p99).
    """
    x = np.sort(np.asarray(samples, dtype=float))
    x = x[np.isfinite(x)]
    n = x.size
    if n == 0:
        raise ValueError("quantile_interval() needs at least one finite sample")
    if not 0 < q < 1:
        raise ValueError(f"q={q}: pass a quantile between 0 and 1 (0.99 for p99)")
    from scipy import stats

    est = float(np.percentile(x, 100 * q))
    tail = (1 - confidence) / 2
    # low: the largest k-th order statistic (1-based) with P(Bin(n, q) < k) <= tail; high: the smallest j-th one
    # with P(Bin(n, q) >= j) <= tail
    k = int(stats.binom.ppf(tail, n, q))  # P(B <= k) >= tail
    while k > 0 and stats.binom.cdf(k - 1, n, q) > tail:
        k -= 1
    j = int(stats.binom.ppf(1 - tail, n, q)) + 1
    low = float(x[k - 1]) if k >= 1 else float("-inf")
    high = float(x[j - 1]) if j <= n else float("inf")
    return est, min(low, est), max(high, est)


def _num(x: float) -> str:
    if not np.isfinite(x):
        return "unbounded"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def tail_says(name: str, samples_ms, baseline: str, baseline_ms, q: float = 0.99, what: str = "", *,
              unit: str = "ms", samples: str = "requests") -> Finding:  # fmt: skip
    """The ``q`` quantile (p99) of two sets of latencies, each with its 95% interval: "higher" when ``name``'s
    interval lies wholly above ``baseline``'s, "lower" when wholly below, otherwise :data:`SAME_TAIL`. Too few
    samples to bound a quantile leave it without an end; when that keeps the two apart, the verdict is
    :data:`TOO_FEW` and the sentence says how many are needed.
    ``q=0.5`` compares medians (of rates too: ``unit="img/s"``, ``samples="passes"``)."""
    label = what or f"p{round(100 * q)}"
    a, b = quantile_interval(samples_ms, q), quantile_interval(baseline_ms, q)

    def ci(x: tuple[float, float, float], head: str) -> str:
        if np.isfinite(x[1]) and np.isfinite(x[2]):
            return f"{head}{_num(x[1])}-{_num(x[2])}"
        if np.isfinite(x[1]):
            return f"{head}above {_num(x[1])}"
        if np.isfinite(x[2]):
            return f"{head}below {_num(x[2])}"
        return "no 95% CI"

    text_a = f"{name} {label} {_num(a[0])} {unit} ({ci(a, '95% CI ')})"
    text_b = f"{baseline} {_num(b[0])} {unit} ({ci(b, '')})"
    if a[1] > b[2]:
        verdict = "higher"
    elif a[2] < b[1]:
        verdict = "lower"
    else:
        verdict = SAME_TAIL
    note = ""
    if not all(np.isfinite(v) for v in (a[1], a[2], b[1], b[2])):
        note = f"too few {samples} to bound a {label} (95% needs {_min_n(max(q, 1 - q))})"
        if verdict == SAME_TAIL:
            return Finding(TOO_FEW, f"{text_a} vs {text_b}: {TOO_FEW}, {note}")
        note = "; " + note
    if verdict == SAME_TAIL:
        return Finding(verdict, f"{text_a} vs {text_b}: {SAME_TAIL}{note}")
    return Finding(verdict, f"{text_a} is {verdict} than {text_b}{note}")


def _min_n(q: float, confidence: float = CONFIDENCE) -> int:
    """The fewest samples whose maximum bounds the ``q`` quantile from above at ``confidence`` (two-sided)."""
    return int(np.ceil(np.log((1 - confidence) / 2) / np.log(q)))


def memory_says(variant: str, variant_mib: float, baseline: str, baseline_mib: float, *, tolerance: float = 0.1,
                resolution_mib: float = 1.0) -> Finding:  # fmt: skip
    """Two memory peaks: "less" or "more" only when they differ by more than ``tolerance`` (10%: run-to-run
    variation of a peak) and more than ``resolution_mib`` (the measurement's granularity); otherwise
    :data:`SAME_MEMORY`. The ratio is printed as "2.50x less memory", never as a 1.0x saving."""
    if not (np.isfinite(variant_mib) and np.isfinite(baseline_mib)) or min(variant_mib, baseline_mib) < 0:
        raise ValueError(f"memory_says(): peaks must be finite and >= 0 MiB, got {variant_mib} and {baseline_mib}")
    pair = f"{variant_mib:.0f} vs {baseline_mib:.0f} MiB"
    diff = variant_mib - baseline_mib
    if abs(diff) <= resolution_mib or abs(diff) <= tolerance * max(variant_mib, baseline_mib):
        return Finding(
            SAME_MEMORY,
            f"{variant} vs {baseline}: {SAME_MEMORY} ({pair}; within {tolerance:.0%} or {resolution_mib:g} MiB, "
            "what a peak varies by)",
        )
    if diff < 0:
        ratio = baseline_mib / max(variant_mib, 1e-9)
        return Finding("less", f"{variant} needs {fmt(ratio)}x less memory than {baseline} ({pair})")
    ratio = variant_mib / max(baseline_mib, 1e-9)
    return Finding("more", f"{variant} needs {fmt(ratio)}x more memory than {baseline} ({pair})")


def prediction_says(
    what: str, predicted: float, measured: float, *, unit: str = "", tolerance: float = 0.25
) -> Finding:
    """A prediction against its measurement: "held" when the measured value is within ``tolerance`` (25%) of the
    prediction either way, else "too high" (measured below the prediction) or "too low", with the factor: a
    5x misprediction reads "the prediction was 5.00x too high", never "it fits"."""
    if not (np.isfinite(predicted) and np.isfinite(measured)) or predicted <= 0 or measured <= 0:
        return Finding("not judged", f"{what}: predicted {predicted:g}{unit}, measured {measured:g}{unit}: not judged "
                                     "(a prediction and a measurement must both be positive)")  # fmt: skip
    u = f" {unit}" if unit else ""
    pair = f"{what}: predicted {predicted:.4g}{u}, measured {measured:.4g}{u}"
    factor = max(predicted, measured) / min(predicted, measured)
    if factor <= 1 + tolerance:
        return Finding("held", f"{pair}: the prediction held (within {tolerance:.0%})")
    if predicted > measured:
        return Finding("too high", f"{pair}: the prediction was {fmt(factor)}x too high")
    return Finding("too low", f"{pair}: the prediction was {fmt(factor)}x too low")


def ratio_from_bounds(name: str, baseline: str, estimate: float, low: float, high: float,
                      confidence: float = CONFIDENCE) -> Ratio:  # fmt: skip
    """A :class:`Ratio` computed, not measured in rounds: a simulation fed the measured times at their
    estimate (``estimate``) and at the ends of their intervals (``low``, ``high``). Each timing's interval must
    be wide enough that all of them hold together at ``confidence`` (intervals at 1 - (1 - c)/k for k timings)."""
    if not all(np.isfinite(v) and v > 0 for v in (estimate, low, high)) or not low <= estimate <= high:
        raise ValueError(f"{name} vs {baseline}: need 0 < low <= estimate <= high, got {low}, {estimate}, {high}")
    return Ratio(name=name, baseline=baseline, estimate=estimate, low=low, high=high, rounds=[], confidence=confidence)


ROOF_SLACK = 0.05  # a datasheet's clock and bandwidth are rounded: up to 5% above a roof is not yet impossible
FAR_UNDER = 0.10  # under 10% of the roof at its intensity: overhead-bound (lesson 01's rule)


def percent(x: float) -> str:
    """A share as printed: "41%", "4.2%", "9.99%", "0.19%"; never "0%" for a share that is not zero."""
    if not np.isfinite(x):
        return str(x)
    if x == 0 or abs(x) >= 0.1:
        return f"{x:.0%}"
    return f"{100 * x:.3g}%"


def roof_says(what: str, fraction: float, roof: str = "spec-sheet") -> Finding:
    """A workload's achieved share of its roof (``min(peak FLOP/s, intensity x bandwidth)``).

    Verdicts: "above the roof" beyond :data:`ROOF_SLACK` (impossible: the roof is wrong for this machine, and
    nothing is concluded), "near the roof" from 50%, "under the roof" from :data:`FAR_UNDER`, otherwise
    "far under the roof" (overhead-bound, or a measurement the machine's load spoiled), and "not judged" for a
    share that is not a positive number.
    """
    if not np.isfinite(fraction) or fraction <= 0:
        return Finding("not judged", f"{what}: share of the {roof} roof {fraction}: not judged (not a positive number)")
    share = f"{what} reached {percent(fraction)} of the {roof} roof"
    if fraction > 1 + ROOF_SLACK:
        return Finding(
            "above the roof",
            f"{share}: above it, which is impossible, so the roof is wrong for this machine (a datasheet figure that "
            "is not this machine's, or a measured peak the machine's load held down) and nothing is concluded from it",
        )
    if fraction >= 0.5:
        return Finding("near the roof", share)
    if fraction >= FAR_UNDER:
        return Finding("under the roof", share)
    return Finding("far under the roof", share)
