"""Lesson 05 exercise: quantize the digits MLP with torchao, checked by running it and looking inside it."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from ..exercises import exercise

MAX_DROP_POINTS = 1.0  # the accuracy budget, as in the lesson's THRESHOLD


def torchao_int8_weight(mod: nn.Linear) -> str | None:
    """Why ``mod``'s weight is not a torchao INT8 tensor, or None when it is one."""
    w = mod.weight
    kind = type(w)
    if not kind.__module__.startswith("torchao"):
        return f"weight is a plain {kind.__name__} ({kind.__module__})"
    if not hasattr(w, "__tensor_flatten__"):
        return f"weight is a {kind.__name__} without inner tensors"
    names, _ = w.__tensor_flatten__()
    if not any(getattr(w, n).dtype == torch.int8 for n in names):
        return f"{kind.__name__} stores no int8 data (inner tensors {names})"
    return None


def _check_torchao_mlp(fn: Callable[[nn.Module], nn.Module]) -> None:
    from ..data import load_digits_split
    from ..models import accuracy, load_digits_model

    digits = load_digits_split()
    mlp = load_digits_model("mlp")
    before = copy.deepcopy(mlp.state_dict())
    q = fn(mlp)
    assert isinstance(q, nn.Module), f"return the quantized model (an nn.Module), not {type(q).__name__}"
    after = mlp.state_dict()
    unchanged = all(type(after[k]) is type(v) and torch.equal(after[k], v) for k, v in before.items())
    assert unchanged, "the model you were given changed: quantize a copy (copy.deepcopy) and return it"
    linears = [(n, m) for n, m in q.named_modules() if isinstance(m, nn.Linear)]
    dyn = [n for n, m in q.named_modules() if type(m).__module__.startswith("torch.ao.nn.quantized")]
    assert not dyn, (
        f"{dyn[:2]} come from torch.ao's quantize_dynamic (deprecated): use torchao's quantize_ with an INT8 config"
    )
    assert linears, "the returned model has no Linear layers left"
    bad = {n: why for n, m in linears if (why := torchao_int8_weight(m))}
    assert not bad, (
        f"{len(bad)} of {len(linears)} Linear layers are not INT8 torchao tensors, e.g. {next(iter(bad.items()))}: "
        "quantize_(model, Int8...Config()) quantizes every Linear"
    )
    acc_fp32 = accuracy(mlp, digits.x_test, digits.y_test)
    try:
        acc_q = accuracy(q, digits.x_test, digits.y_test)
    except Exception as exc:  # noqa: BLE001 - any failure to run is the learner's to see
        raise AssertionError(f"running the quantized model failed: {type(exc).__name__}: {exc}") from None
    drop = (acc_fp32 - acc_q) * 100
    assert drop <= MAX_DROP_POINTS, (
        f"accuracy {acc_q:.2%} is {drop:.1f} points below FP32 {acc_fp32:.2%} (budget {MAX_DROP_POINTS})"
    )
    print(f"   {len(linears)} Linear layers hold torchao INT8 weights; accuracy {acc_q:.2%} vs FP32 {acc_fp32:.2%}")


@exercise(
    "05.torchao-mlp",
    "Return an INT8 copy of the MLP made with torchao's quantize_ and an INT8 config; keep accuracy within 1 point.",
    _check_torchao_mlp,
)
def quantize_mlp(model: nn.Module) -> nn.Module:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    q = copy.deepcopy(model)
    quantize_(q, Int8DynamicActivationInt8WeightConfig())
    return q
