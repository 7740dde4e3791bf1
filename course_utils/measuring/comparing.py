"""Compare variants the way a number can be trusted: interleaved rounds, per-round ratios, a 95% interval.

Timing A, then B, one after the other, measures the machine's load as much as the code: a browser tab or a
second job that starts halfway through makes B look slower. :func:`compare` instead runs every variant in
each of several rounds, in a fresh random order each round (warm-up first), and times a short block of calls
per variant per round exactly as :func:`course_utils.measuring.timing.measure` times calls (``perf_counter`` and
a synchronize on CPU, CUDA events on a GPU). Each round gives one ratio per variant (baseline's mean time per
call / variant's, so above 1 means faster), and the ratio is reported as the median of the rounds with the
distribution-free 95% interval of that median (:class:`course_utils.measuring.intervals.Ratio`). Load that
changes between rounds hits both variants of a round alike and cancels in their ratio.

Why a round keeps the block's *mean* per-call time, not its median: on an oversubscribed CPU the operating
system takes the core away for whole time slices, so a call either runs undisturbed or waits a slice. A 2 ms call
is far more often caught by a switch than a 1 ms one, and the median call of the 2 ms workload measured 26.7x
(not 2x) that of the 1 ms one beside six CPU burners on 2 cores (``scripts/calibrate_compare.py``). The mean
of a block is its wall time over its calls: the share of the core each variant got, which is fair.

:func:`compare_runs` does the same for whole runs that return a metric (requests/s of a served load, tokens/s
of a scheduler run); a run may also return the seconds spent on work every variant does identically
(``{"value": v, "shared_s": s}``, lesson 16's prefills), and a comparison whose shared work drifted by more than
its interval's half-width is flagged, not judged.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from course_utils.measuring.intervals import STANDIN_FLAG, Ratio, ratio_from_rounds
from course_utils.measuring.timing import HIGH_SPREAD, Measurement, measure
from course_utils.supply.modes import pick, rehearsing, switch

BASELINE_DRIFT = 1.0  # the baseline's later rounds twice as slow (or fast) as its earlier ones: the load changed


@dataclass
class Comparison:
    """The result of :func:`compare` or :func:`compare_runs`: per-round values, pooled measurements, ratios."""

    baseline: str
    label: str
    kind: str  # "time" (per-call milliseconds, lower is better) or "metric" (whole-run values)
    per_round: dict[str, list[float]]  # per variant: the round's mean ms per call (per item), or the run's metric
    measurements: dict[str, Measurement]  # pooled per-call times (for "metric": the per-round values)
    ratios: dict[str, Ratio]
    metric: str = "ms per call"
    higher_is_better: bool = False
    shared_s: dict[str, list[float]] = field(default_factory=dict)

    def ratio(self, name: str, vs: str | None = None) -> Ratio:
        """The ``name`` variant against the baseline, or against variant ``vs`` (above 1: ``name`` is better),
        from the same rounds: INT8 compiled against FP32 compiled, both timed beside eager FP32."""
        if name not in self.per_round:
            raise KeyError(f"no variant {name!r} in this comparison; it has {self.names}")
        if vs is None or vs == self.baseline:
            if name == self.baseline:
                raise KeyError(f"{name!r} is the baseline of this comparison; ask for one of {sorted(self.ratios)}")
            return self.ratios[name]
        if vs not in self.per_round or vs == name:
            raise KeyError(f"vs={vs!r}: name another variant of this comparison, one of {self.names}")
        mine, theirs = np.asarray(self.per_round[name]), np.asarray(self.per_round[vs])
        lower_better = self.kind == "time" or not self.higher_is_better
        per = theirs / np.maximum(mine, 1e-12) if lower_better else mine / np.maximum(theirs, 1e-12)
        drift = _baseline_drift(self.per_round[vs])
        standin = any(r.standin for r in self.ratios.values())
        return ratio_from_rounds(name, vs, per, drifted=bool(drift), drift_reason=drift, standin=standin)

    @property
    def names(self) -> list[str]:
        return list(self.per_round)

    def table(self) -> Any:
        """One row per variant: median (per call, or metric), spread, ratio with low/high, verdict, flags."""
        import pandas as pd

        rows = []
        for name in self.names:
            m = self.measurements[name]
            flags = []
            if m.spread > HIGH_SPREAD:
                flags.append(f"high spread (IQR {m.spread:.0%} of the median)")
            r = self.ratios.get(name)
            if r is not None:
                flags += r.flags
            elif any(x.standin for x in self.ratios.values()):
                flags.append(STANDIN_FLAG)
            rows.append({
                "variant": name,
                "median": m.median_ms,
                "unit": self.metric,
                "spread": m.spread,
                "ratio": r.estimate if r else 1.0,
                "low": r.low if r else 1.0,
                "high": r.high if r else 1.0,
                "verdict": r.verdict if r else "baseline",
                "flags": "; ".join(flags),
            })  # fmt: skip
        return pd.DataFrame(rows)

    def __str__(self) -> str:
        head = f"{self.label + ': ' if self.label else ''}{len(next(iter(self.per_round.values())))} rounds"
        return head + "".join(f"\n  {n} vs {self.baseline}: {r}" for n, r in self.ratios.items())


def _check_variants(variants: Mapping[str, Callable[[], object]], baseline: str) -> None:
    if baseline not in variants:
        raise ValueError(f"baseline {baseline!r} is not one of the variants {sorted(variants)}; name one of them")
    if len(variants) < 2:
        raise ValueError(
            f"compare needs the baseline and at least one other variant, got only {sorted(variants)}: when the "
            "measurements left nothing else worth timing (batch 1 won the whole sweep), skip the comparison and say so"
        )


def _baseline_drift(values: list[float]) -> str:
    """Why the baseline's per-round values cannot be trusted ('' when they can): its later rounds moved from its
    earlier ones by more than :data:`BASELINE_DRIFT` (the machine's load changed during the comparison)."""
    if len(values) < 4:
        return ""
    half = len(values) // 2
    early, late = float(np.median(values[:half])), float(np.median(values[half:]))
    if min(early, late) <= 0 or max(early, late) / min(early, late) <= 1 + BASELINE_DRIFT:
        return ""
    return f"the baseline's rounds moved from {early:.4g} to {late:.4g} during the comparison (the load changed)"


def _standin(device: str | torch.device | None) -> bool:
    """True when the timings come from the rehearsal's CPU stand-in of a GPU (``COURSE_REHEARSE=1``, "cuda")."""
    if not switch("COURSE_REHEARSE") or not rehearsing():  # the switch first: no rehearsal import otherwise
        return False
    from course_utils.measuring.device import pick_device

    return (pick_device() if device is None else torch.device(device)).type == "cuda"


def compare(
    variants: Mapping[str, Callable[[], object]],
    *,
    baseline: str,
    device: str | torch.device | None = None,
    rounds: int | None = None,
    warmup: int | None = None,
    min_round_s: float | None = None,
    label: str = "",
    batch_size: int | None = None,
    min_calls: int | None = None,
    seed: int | None = None,
    statistic: str = "mean",
    items: Mapping[str, int] | None = None,
) -> Comparison:
    """Time every variant in interleaved rounds and return their ratios to ``baseline`` with 95% intervals.

    Each variant first runs ``warmup`` calls (in random order); then each of ``rounds`` rounds times every
    variant, in a fresh random order, for at least ``min_calls`` calls and ``min_round_s`` seconds, and keeps the
    block's mean per-call time (``statistic="median"`` keeps its median: see the module's note on why not).
    Defaults: 15 rounds of at least 2 calls and 0.05 s (smoke: 7 rounds of 1 call and 0.005 s). ``items``
    (items per call of each variant, such as batch sizes) makes the ratios per item: the throughput ratio of a
    batch of 32 against batch 1.
    ``Comparison.measurements[name]`` pools a variant's per-call times over all rounds.
    """
    _check_variants(variants, baseline)
    rounds = pick(full=15, smoke=7) if rounds is None else rounds
    warmup = pick(full=5, smoke=2) if warmup is None else warmup
    min_round_s = pick(full=0.05, smoke=0.005) if min_round_s is None else min_round_s
    min_calls = pick(full=2, smoke=1) if min_calls is None else min_calls
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: compare needs at least 1 round (3 or more for a useful interval)")
    rng = random.Random(seed)
    names = list(variants)
    for name in rng.sample(names, len(names)):
        for _ in range(warmup):
            variants[name]()
    blocks: dict[str, list[Measurement]] = {n: [] for n in names}
    for _ in range(rounds):
        for name in rng.sample(names, len(names)):
            blocks[name].append(
                measure(variants[name], device=device, warmup=0, min_time_s=min_round_s, min_repeats=min_calls,
                        label=name, warn_spread=False)
            )  # fmt: skip
    if statistic not in ("mean", "median"):
        raise ValueError(f"statistic={statistic!r}: use 'mean' (the default) or 'median'")
    per_item = {n: (items or {}).get(n, 1) for n in names}
    per_round = {
        n: [(b.mean_ms if statistic == "mean" else b.median_ms) / per_item[n] for b in blocks[n]] for n in names
    }
    dev = blocks[baseline][0].device
    measurements = {
        n: Measurement(
            times_ms=[t for b in blocks[n] for t in b.times_ms],
            device=dev,
            label=n,
            batch_size=(items or {}).get(n, batch_size),
        )
        for n in names
    }
    standin = _standin(device)
    drift = _baseline_drift(per_round[baseline])
    base = np.asarray(per_round[baseline])
    ratios = {
        n: ratio_from_rounds(n, baseline, base / np.maximum(np.asarray(per_round[n]), 1e-12), drifted=bool(drift),
                             drift_reason=drift, standin=standin)
        for n in names if n != baseline
    }  # fmt: skip
    return Comparison(baseline=baseline, label=label, kind="time", per_round=per_round, measurements=measurements,
                      ratios=ratios)  # fmt: skip


def _run_value(name: str, out: object) -> tuple[float, float | None]:
    if isinstance(out, Mapping):
        if "value" not in out:
            raise ValueError(
                f"variant {name!r} returned a mapping without 'value': return {{'value': v, 'shared_s': s}}"
            )
        shared = out.get("shared_s")
        return float(out["value"]), None if shared is None else float(shared)
    if isinstance(out, (int, float, np.floating, np.integer)):
        return float(out), None
    raise TypeError(f"variant {name!r} returned {type(out).__name__}: return a number or {{'value': v, 'shared_s': s}}")


def _shared_drift(shared: dict[str, list[float]], baseline: str, name: str, half_width: float) -> str:
    """Why the shared work makes ``name``'s interval untrustworthy ('' when it does not)."""
    if not shared.get(baseline) or not shared.get(name):
        return ""
    b, v = np.asarray(shared[baseline]), np.asarray(shared[name])
    drift = float(np.median(v / np.maximum(b, 1e-12))) - 1.0
    if abs(drift) <= half_width:
        return ""
    return (
        f"the work both variants share took {np.median(b):.3g} s under {baseline} and {np.median(v):.3g} s under "
        f"{name} ({drift:+.0%}, more than the interval's ±{half_width:.0%})"
    )


def compare_runs(
    variants: Mapping[str, Callable[[], float | Mapping[str, float]]],
    *,
    baseline: str,
    rounds: int,
    higher_is_better: bool,
    label: str = "",
    metric: str = "",
    device: str | torch.device | None = "cpu",
    seed: int | None = None,
) -> Comparison:
    """Run every variant once per round (fresh random order each round) and compare the metrics they return.

    A variant returns its metric (requests/s, tokens/s) or ``{"value": v, "shared_s": s}`` where ``s`` is the
    seconds it spent on work every variant does identically; a ratio whose shared work drifted by more than the
    interval's half-width is flagged ``drifted``. The ratio is variant/baseline when ``higher_is_better``
    (baseline/variant otherwise), so above 1 always means the variant did better. ``device`` says where the runs
    ran, so that a rehearsal's stand-in "cuda" is labelled.
    """
    _check_variants(variants, baseline)
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: compare_runs needs at least 1 round (3 or more for a useful interval)")
    rng = random.Random(seed)
    names = list(variants)
    values: dict[str, list[float]] = {n: [] for n in names}
    shared: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(rounds):
        for name in rng.sample(names, len(names)):
            value, shared_s = _run_value(name, variants[name]())
            values[name].append(value)
            if shared_s is not None:
                shared[name].append(shared_s)
    standin = _standin(device)
    base = np.asarray(values[baseline])
    base_drift = _baseline_drift(values[baseline])
    ratios = {}
    for n in names:
        if n == baseline:
            continue
        v = np.asarray(values[n])
        per = v / np.maximum(base, 1e-12) if higher_is_better else base / np.maximum(v, 1e-12)
        r = ratio_from_rounds(n, baseline, per, standin=standin)
        reason = _shared_drift(shared, baseline, n, r.half_width) or base_drift
        r.drifted, r.drift_reason = bool(reason), reason
        ratios[n] = r
    measurements = {n: Measurement(times_ms=values[n], device=str(device), label=n) for n in names}
    return Comparison(baseline=baseline, label=label, kind="metric", per_round=values, measurements=measurements,
                      ratios=ratios, metric=metric or "value", higher_is_better=higher_is_better,
                      shared_s={n: s for n, s in shared.items() if s})  # fmt: skip
