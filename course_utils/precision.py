"""Run one model in several numeric precisions, the same way on CPU and GPU (lesson 04).

Two ways to lower precision are compared: ``torch.autocast`` (weights stay FP32; matmuls and convolutions
run in the low dtype, precision-sensitive ops such as softmax or reductions stay FP32) and casting the whole
model with ``.half()`` / ``.to(torch.bfloat16)`` (every op and every stored weight in the low dtype, half
the weight memory). ``channels_last`` changes only the memory layout of 4-D tensors, which some convolution
kernels prefer. :func:`fp16_overflow_case` builds a layer whose activations exceed FP16's range, to show
the one failure mode of FP16 that BF16 does not have.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from .errors import CourseError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class PrecisionVariant:
    """A model prepared for one precision: ``run(x)`` takes an FP32 input and returns FP32 outputs."""

    name: str
    dtype: str  # the precision name for course_utils.compare tolerances (fp32, tf32, bf16, fp16)
    method: str  # "baseline", "autocast", "cast" or "layout"
    channels_last: bool
    model: nn.Module
    run: Callable[[torch.Tensor], torch.Tensor]

    @property
    def weight_bytes(self) -> int:
        """Bytes held by the model's parameters and buffers in this variant."""
        return param_bytes(self.model)


def param_bytes(model: nn.Module) -> int:
    """Bytes of all parameters and buffers (what the weights cost in memory)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return int(sum(t.numel() * t.element_size() for t in tensors))


def make_variant(
    model: nn.Module,
    dtype: str = "fp32",
    *,
    method: str = "autocast",
    channels_last: bool = False,
    device: str | torch.device = "cpu",
) -> PrecisionVariant:
    """Prepare a copy of ``model`` to run in ``dtype`` by ``method`` ("autocast" or "cast").

    * ``autocast``: weights stay FP32, ``torch.autocast(device_type, dtype)`` picks per-op precision.
    * ``cast``: ``model.to(dtype)``; inputs are cast to ``dtype`` too (the classic ``.half()``).
    ``dtype="fp32"`` gives the baseline (``method`` ignored). ``channels_last=True`` converts 4-D weights
    and inputs to the channels-last memory layout. Outputs are returned as FP32 so they compare directly.
    """
    if dtype not in DTYPES:
        raise CourseError(f"unknown dtype '{dtype}': use one of {sorted(DTYPES)}")
    if method not in ("autocast", "cast"):
        raise CourseError(f"unknown method '{method}': use 'autocast' or 'cast'")
    dev = torch.device(device)
    m = copy.deepcopy(model).eval().to(dev)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    if channels_last:
        m = m.to(memory_format=torch.channels_last)
    tdtype = DTYPES[dtype]
    if dtype == "fp32":
        method = "layout" if channels_last else "baseline"
    if method == "cast" and dtype != "fp32":
        m = m.to(tdtype)

    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.to(dev)
        if x.ndim == 4:
            x = x.contiguous(memory_format=fmt)
        ctx = torch.autocast(dev.type, dtype=tdtype) if method == "autocast" else nullcontext()
        with torch.inference_mode(), ctx:
            out = m(x.to(tdtype) if method == "cast" else x)
        return out.float()

    label = {"baseline": "fp32", "layout": "fp32"}.get(method, f"{dtype} {method}")
    name = label + (" + channels_last" if channels_last else "")
    return PrecisionVariant(name, dtype, method, channels_last, m, run)


def standard_variants(
    model: nn.Module, *, device: str | torch.device = "cpu", dtypes: tuple[str, ...] = ("bf16", "fp16")
) -> list[PrecisionVariant]:
    """FP32, FP32 channels_last, then autocast and cast for every dtype in ``dtypes`` (the lesson's grid)."""
    out = [make_variant(model, "fp32", device=device), make_variant(model, "fp32", channels_last=True, device=device)]
    for dt in dtypes:
        out.append(make_variant(model, dt, method="autocast", device=device))
        out.append(make_variant(model, dt, method="cast", device=device))
        out.append(make_variant(model, dt, method="autocast", channels_last=True, device=device))
    return out


def fp16_overflow_case(scale: float = 300.0, features: int = 64) -> tuple[nn.Module, torch.Tensor]:
    """A Linear layer and input whose exact outputs (about ``scale**2 * features``) exceed FP16's maximum.

    FP16's largest finite value is 65504; inputs and weights of magnitude ``scale`` each produce dot
    products near ``scale * scale * features`` (5.76 million by default), which FP16 turns into ``inf``.
    BF16 has FP32's exponent range, so it stays finite (with a small rounding error).
    """
    if scale <= 0 or features <= 0:
        raise CourseError("scale and features must be positive (try scale=300, features=64)")
    layer = nn.Linear(features, 4, bias=False)
    with torch.no_grad():
        layer.weight.fill_(scale)
    x = torch.full((2, features), scale)
    return layer, x


def overflow_table(layer: nn.Module, x: torch.Tensor, *, device: str | torch.device = "cpu") -> pd.DataFrame:
    """Max output, finiteness and relative error vs FP32 of ``layer(x)`` per precision and method."""
    ref = make_variant(layer, "fp32", device=device).run(x)
    rows = []
    for dt in ("fp32", "bf16", "fp16"):
        for method in ("autocast", "cast") if dt != "fp32" else ("baseline",):
            v = make_variant(layer, dt, method="cast" if method == "baseline" else method, device=device)
            out = v.run(x)
            finite = bool(torch.isfinite(out).all())
            rel = float(((out - ref).abs().max() / ref.abs().max()).item()) if finite else float("inf")
            rows.append({"variant": v.name, "max_abs_output": float(out.abs().max()), "finite": finite,
                         "max rel error": rel})  # fmt: skip
    return pd.DataFrame(rows)


def fp16_max() -> float:
    """FP16's largest finite value (65504), from ``torch.finfo``."""
    return float(torch.finfo(torch.float16).max)
