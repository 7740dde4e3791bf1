"""Compare an optimized variant's outputs with the baseline, with one tolerance table for all lessons.

Correct before fast: every lesson calls :func:`check_outputs` before it prints a speed figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_utils.supply.errors import ToleranceError

# Maximum error relative to the largest baseline magnitude, minimum cosine similarity, minimum top-1 agreement.
TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {"max_rel": 1e-4, "cosine": 0.99999, "top1": 0.999},
    "tf32": {"max_rel": 1e-2, "cosine": 0.9999, "top1": 0.99},
    "bf16": {"max_rel": 5e-2, "cosine": 0.999, "top1": 0.97},
    "fp16": {"max_rel": 1e-2, "cosine": 0.9995, "top1": 0.98},
    "int8": {"max_rel": 1.5e-1, "cosine": 0.99, "top1": 0.95},
}


@dataclass
class OutputMatch:
    """How far ``out`` is from ``ref``: max absolute and scaled errors, cosine, top-1 agreement."""

    precision: str
    max_abs: float
    max_rel: float
    cosine: float
    top1: float | None
    within: bool
    reason: str = ""

    def __str__(self) -> str:
        top1 = "n/a" if self.top1 is None else f"{self.top1:.2%}"
        verdict = "OK" if self.within else f"OUTSIDE tolerance ({self.reason})"
        return (
            f"[{self.precision}] max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}, "
            f"cosine {self.cosine:.6f}, top-1 agreement {top1}: {verdict}"
        )


def compare_outputs(out: torch.Tensor, ref: torch.Tensor, precision: str = "fp32") -> OutputMatch:
    """Measure ``out`` against ``ref`` and judge it by ``TOLERANCES[precision]``.

    ``max_rel`` is the max absolute error divided by the largest magnitude in ``ref`` (robust to
    near-zero entries). Top-1 agreement is computed for 2-D outputs (rows of class scores).
    """
    if precision not in TOLERANCES:
        raise ValueError(f"unknown precision '{precision}': use one of {sorted(TOLERANCES)}")
    if out.shape != ref.shape:
        raise ToleranceError(f"shape mismatch: output {tuple(out.shape)} vs baseline {tuple(ref.shape)}")
    o = out.detach().float().cpu()
    r = ref.detach().float().cpu()
    if not torch.isfinite(o).all():
        return OutputMatch(precision, float("inf"), float("inf"), float("nan"), None, False, "non-finite values")
    diff = (o - r).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    scale = float(r.abs().max()) or 1.0
    max_rel = max_abs / scale
    # float64: in float32 the sums over millions of elements drift enough to fail identical tensors
    cosine = float(torch.nn.functional.cosine_similarity(o.double().flatten(), r.double().flatten(), dim=0))
    top1 = float((o.argmax(-1) == r.argmax(-1)).float().mean()) if o.ndim == 2 and o.shape[-1] > 1 else None
    tol = TOLERANCES[precision]
    reasons = []
    if max_rel > tol["max_rel"]:
        reasons.append(f"max rel {max_rel:.3g} > {tol['max_rel']}")
    if cosine < tol["cosine"]:
        reasons.append(f"cosine {cosine:.6f} < {tol['cosine']}")
    if top1 is not None and top1 < tol["top1"]:
        reasons.append(f"top-1 {top1:.2%} < {tol['top1']:.0%}")
    return OutputMatch(precision, max_abs, max_rel, cosine, top1, not reasons, "; ".join(reasons))


def check_outputs(out: torch.Tensor, ref: torch.Tensor, precision: str = "fp32", label: str = "") -> OutputMatch:
    """Like :func:`compare_outputs`, print the result, and raise :class:`ToleranceError` when outside."""
    result = compare_outputs(out, ref, precision)
    print(f"{label + ': ' if label else ''}{result}")
    if not result.within:
        raise ToleranceError(
            f"{label or 'output'} differs from the baseline beyond the {precision} tolerance: {result.reason}. "
            "Do not report a speed-up for a variant that computes something else."
        )
    return result


def tolerance_table():
    """The tolerance table as a pandas DataFrame, for display in lessons."""
    import pandas as pd

    return pd.DataFrame(TOLERANCES).T.rename_axis("precision")
