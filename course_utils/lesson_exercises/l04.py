"""Lesson 04 exercises: write a BF16 autocast variant, and a channels_last variant.

Each checker runs the learner's function on a small CNN, compares the output with FP32 at the tolerance of
the precision used, and looks inside the model (forward hooks, weight dtypes and memory layouts) for proof
that the technique was applied: an FP32 copy of the output does not pass.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from ..compare import compare_outputs
from ..exercises import exercise
from ..precision import is_channels_last, layer_dtypes


def _cnn() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(64, 10),
    ).eval()  # fmt: skip
    with torch.no_grad():  # non-trivial batch-norm statistics
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 1.5)
    return model, torch.randn(6, 3, 12, 12)


def _check_bf16_autocast(fn: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> None:
    model, x = _cnn()
    with torch.inference_mode():
        ref = model(x)
    before = copy.deepcopy(model.state_dict())
    got: list[torch.Tensor] = []
    with torch.inference_mode():
        inside = layer_dtypes(model, lambda: got.append(fn(model, x)))
    out = got[0]
    assert not torch.is_autocast_enabled("cpu"), "autocast is still on after your function: use it as a `with` block"
    assert isinstance(out, torch.Tensor), f"return the output tensor, got {type(out).__name__}"
    assert inside, "the model was never called: run model(x) inside your function"
    params = {p.dtype for p in model.parameters()}
    assert params == {torch.float32}, (
        f"the model's weights are now {params}: that is a cast (model.to(...)), not autocast; autocast leaves "
        "the weights in FP32"
    )
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "the model's weights changed"
    name, dt_in, dt_out = inside[0]
    assert dt_out == torch.bfloat16, (
        f"the first convolution ({name}) produced {dt_out}: BF16 autocast was not active around the model call "
        "(torch.autocast(device_type=x.device.type, dtype=torch.bfloat16))"
    )
    assert dt_in == torch.float32, f"the input reached {name} as {dt_in}: pass x unchanged and let autocast cast it"
    assert out.dtype == torch.float32, f"return FP32 outputs (call .float() on the result), got {out.dtype}"
    cmp = compare_outputs(out, ref, "bf16")
    assert cmp.within, f"output vs FP32 at the BF16 tolerance: {cmp}"


@exercise(
    "04.bf16-autocast",
    "bf16_autocast(model, x): run model(x) under torch.autocast on x's device with dtype=torch.bfloat16 and "
    "return the output as FP32 (.float()); leave the model's weights in FP32.",
    _check_bf16_autocast,
)
def bf16_autocast(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
        out = model(x)
    return out.float()


def _check_channels_last(fn: Callable[[nn.Module, torch.Tensor], tuple[nn.Module, torch.Tensor]]) -> None:
    model, x = _cnn()
    with torch.inference_mode():
        ref = model(x)
    result = fn(copy.deepcopy(model), x.clone())
    assert isinstance(result, tuple) and len(result) == 2, "return a pair: (model, x)"
    m_cl, x_cl = result
    assert isinstance(m_cl, nn.Module) and isinstance(x_cl, torch.Tensor), "return (model, input tensor)"
    convs = [m for m in m_cl.modules() if isinstance(m, nn.Conv2d)]
    assert convs, "the returned model has no Conv2d layers: return the model you were given, converted"
    flat = [m for m in convs if not is_channels_last(m.weight)]
    assert not flat, f"{len(flat)} of {len(convs)} conv weights are not channels_last: model.to(memory_format=...)"
    assert is_channels_last(x_cl), "the input is not channels_last: x.to(memory_format=torch.channels_last)"
    assert x_cl.dtype == torch.float32 and next(m_cl.parameters()).dtype == torch.float32, (
        "channels_last is a layout, not a precision: keep FP32"
    )
    with torch.inference_mode():
        seen = layer_dtypes(m_cl, lambda: m_cl(x_cl), types=(nn.Conv2d,))
        out = m_cl(x_cl)
    assert seen, "the returned model did not run its convolutions"
    cmp = compare_outputs(out, ref, "fp32")
    assert cmp.within, f"output vs the original model at the FP32 tolerance: {cmp}"


@exercise(
    "04.channels-last",
    "to_channels_last(model, x): return (model, x) both converted to memory_format=torch.channels_last, in FP32.",
    _check_channels_last,
)
def to_channels_last(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor]:
    return model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
