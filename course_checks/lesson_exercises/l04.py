"""Lesson 04 exercises: write a BF16 autocast variant, and a channels_last variant.

Both checkers build a small CNN and an input drawn at random per call. ``04.bf16-autocast`` watches every
operator of the learner's call with ``observe.OpLog``: each convolution and matmul that ran on the real input
(its batch size) must have run in BF16 and read the model's own weights, and the returned output must be that
BF16 forward's output (as FP32), not an FP32 answer computed beside it. ``04.channels-last`` checks the layout of
every convolution's weight and of the input each convolution receives, and parity with FP32.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from course_checks.exercises import exercise, observed
from course_checks.lesson_exercises.observe import CONV_OPS, MATMUL_OPS, Cases, OpLog, cases, gpu
from course_utils.measuring.outputs import compare_outputs
from course_utils.techniques.precision import is_channels_last


def _cnn(c: Cases) -> tuple[nn.Module, torch.Tensor]:
    """A small random CNN (2 or 3 convolutions, batch norm, a classifier) and an input of random batch and size."""
    torch.manual_seed(c.randint(0, 2**31 - 1))
    chans = [3] + [c.choice([4, 6, 8, 12]) for _ in range(c.randint(2, 3))]
    layers: list[nn.Module] = []
    for i, (cin, cout) in enumerate(zip(chans, chans[1:], strict=False)):
        layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]
        if i == 0:
            layers.insert(1, nn.BatchNorm2d(cout))
    classes = c.randint(5, 12)
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4 * chans[-1], classes)).eval()
    with torch.no_grad():  # non-trivial batch-norm statistics
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 1.5)
    b, hw = c.randint(3, 9), c.randint(4, 8)
    return model, c.randn(b, 3, hw, hw)


def _batch(op: object) -> int | None:
    """The batch size of the activation a convolution or matmul ran on (its input, or addmm's second operand)."""
    shapes = [s for s in op.in_shapes if len(s) >= 2]  # type: ignore[attr-defined]
    if not shapes:
        return None
    return shapes[0][0]


def _layer_weights(model: nn.Module) -> list[str]:
    return [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Conv2d | nn.Linear)]


def references(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP32 output and the BF16 autocast output (as FP32) of ``model`` on ``x``."""
    with torch.inference_mode():
        ref = model(x)
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
            return ref, model(x).float()


def _bf16_run(fn: Callable[[nn.Module, torch.Tensor], torch.Tensor], model: nn.Module, x: torch.Tensor,
              refs: tuple[torch.Tensor, torch.Tensor] | None = None) -> str:  # fmt: skip
    """One call of the answer on ``x`` (on its device), judged from the operators that ran; returns what was seen.
    ``refs``: :func:`references` of this model and input, when already computed."""
    b, device = x.shape[0], x.device.type
    ref, want = refs if refs is not None else references(model, x)
    before = copy.deepcopy(model.state_dict())
    with torch.inference_mode(), OpLog(watch=model) as log:
        out = fn(model, x)
        left_on = torch.is_autocast_enabled(device)  # read inside: leaving the mode resets it
    assert not left_on, "autocast is still on after your function: use it as a `with torch.autocast(...):` block"
    assert isinstance(out, torch.Tensor), f"return the output tensor, got {type(out).__name__}"
    params = {p.dtype for p in model.parameters()}
    assert params == {torch.float32}, (
        f"the model's weights are now {params}: that is a cast (model.to(...)), not autocast; autocast leaves "
        "the weights in FP32"
    )
    assert all(torch.equal(before[k].cpu(), v.cpu()) for k, v in model.state_dict().items()), (
        "the model's weights changed"
    )
    layers = _layer_weights(model)
    compute = log.named(*CONV_OPS, *MATMUL_OPS)
    on_x = [op for op in compute if _batch(op) == b]
    assert compute, "no convolution or matmul ran in your function: call model(x) inside it"
    if not on_x:
        raise AssertionError(
            f"the model never ran on the input you were given (batch {b}): it ran only on "
            f"{sorted({_batch(op) for op in compute})}: call model(x)"
        )
    n_layers = len(layers)
    low = [op for op in on_x if set(op.out_dtypes) == {torch.bfloat16}]
    fp32 = [op for op in on_x if op not in low]
    other = sorted({str(d) for op in fp32 for d in op.out_dtypes})
    throwaway = [op for op in compute if op not in on_x and torch.bfloat16 in op.out_dtypes]
    if torch.float16 in {d for op in compute for d in op.out_dtypes}:
        raise AssertionError("your convolutions ran in float16: autocast with dtype=torch.bfloat16")
    if not low and throwaway:
        raise AssertionError(
            f"BF16 ran only on another input (batch {_batch(throwaway[0])}); on the real input (batch {b}) "
            f"every convolution and matmul ran in {other}: autocast around a throwaway call, then the FP32 "
            "answer. Run model(x) itself inside the autocast block"
        )
    if not low and device != "cpu":
        raise AssertionError(
            f"with the input on {device} every convolution and matmul ran in {other}: autocast for another device "
            f"type (torch.autocast('cpu') does nothing to {device} tensors). Use "
            "torch.autocast(device_type=x.device.type, dtype=torch.bfloat16)"
        )
    assert low, (
        f"on the real input every convolution and matmul ran in {other}: BF16 autocast was not active around "
        f"the model call (torch.autocast(device_type=x.device.type, dtype=torch.bfloat16); x is on {device})"
    )
    if len(low) >= n_layers and len(fp32) >= n_layers:
        raise AssertionError(
            f"the model ran on x twice, once in BF16 and once in {other}: the BF16 run was thrown away and the "
            "FP32 answer returned. Return the output of the autocast call itself, .float()"
        )
    assert not fp32, (
        f"{len(low)} of {len(on_x)} convolutions/matmuls on the real input ran in BF16, {len(fp32)} in {other}: "
        "autocast covered only part of the model. Put the whole model(x) call inside the autocast block"
    )
    unread = [w for w in layers if not any(op in on_x for op in log.reads(w))]
    assert not unread, (
        f"the model's own weights {unread} were not read by the BF16 computation on the real input: call the "
        "model you were given (not a copy, not F.conv2d with other weights)"
    )
    norms = [op for op in log.named("batch_norm") if _batch(op) == b]
    cast = [op for op in norms if any(d != torch.float32 for d in op.in_dtypes[1:])]
    assert norms and not cast, (
        "BatchNorm ran with its weights and statistics in "
        f"{sorted({str(d) for op in cast for d in op.in_dtypes[1:]})}: the model (or a copy of it) was cast to BF16. "
        "Autocast keeps every weight in FP32 and casts per operation; BatchNorm reads FP32 statistics"
        if cast
        else "no BatchNorm ran on the real input: call the model you were given"
    )
    assert out.dtype == torch.float32, f"return FP32 outputs (call .float() on the result), got {out.dtype}"
    assert tuple(out.shape) == tuple(ref.shape), f"output shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    assert out.device.type == device, f"return the output on the input's device ({device}), got {out.device}"
    if torch.equal(out.cpu(), ref.cpu()) and not torch.equal(want.cpu(), ref.cpu()):
        raise AssertionError(
            "your output is bit-for-bit the FP32 model's output, not the BF16 forward's: the BF16 run was "
            "thrown away and an FP32 answer returned. Return the autocast call's output, .float()"
        )
    cmp = compare_outputs(out.flatten(), want.flatten(), "fp32")  # flattened: no top-1 on a few near-tied rows
    assert cmp.within, (
        f"your output differs from the BF16 autocast forward of the same model and input ({cmp}): return "
        "model(x) computed under autocast, as FP32. A model cast to BF16 (model.to(torch.bfloat16), on a copy "
        "too) is not autocast: it runs every layer, batch norm included, in BF16"
    )
    return (f"on {device}: {len(low)} convolutions/matmuls in bfloat16 reading the model's FP32 weights, BatchNorm "
            "with FP32 statistics, output float32")  # fmt: skip


def _check_bf16_autocast(fn: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> None:
    with cases("04.bf16-autocast") as c:
        model, x = _cnn(c)
        seen = [_bf16_run(fn, model, x)]
        with gpu() as device:  # where autocast matters most: a hard-coded device type shows here
            seen.append(_bf16_run(fn, copy.deepcopy(model).to(device), x.to(device)))
    observed("; ".join(seen))


@exercise(
    "04.bf16-autocast",
    "bf16_autocast(model, x): run model(x) under torch.autocast on x's device with dtype=torch.bfloat16 and "
    "return the output as FP32 (.float()); leave the model's weights in FP32.",
    _check_bf16_autocast,
    time_limit=30,
)
def bf16_autocast(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
        logits = model(x)
    return logits.float()


def _check_channels_last(fn: Callable[[nn.Module, torch.Tensor], tuple[nn.Module, torch.Tensor]]) -> None:
    with cases("04.channels-last") as c:
        model, x = _cnn(c)
        with torch.inference_mode():
            ref = model(x)
        result = fn(copy.deepcopy(model), x.clone())
        assert isinstance(result, tuple) and len(result) == 2, "return a pair: (model, x)"
        m_cl, x_cl = result
        assert isinstance(m_cl, nn.Module) and isinstance(x_cl, torch.Tensor), "return (model, input tensor)"
        convs = [m for m in m_cl.modules() if isinstance(m, nn.Conv2d)]
        want = sum(isinstance(m, nn.Conv2d) for m in model.modules())
        assert len(convs) == want, (
            f"the returned model has {len(convs)} Conv2d layers, the given one {want}: return the model you were "
            "given, converted"
        )
        assert x_cl.dtype == torch.float32 and next(m_cl.parameters()).dtype == torch.float32, (
            "channels_last is a layout, not a precision: keep FP32"
        )
        flat = [m for m in convs if not is_channels_last(m.weight)]
        assert not flat, (
            f"{len(flat)} of {len(convs)} conv weights are not channels_last: convert the whole model, "
            "model.to(memory_format=torch.channels_last)"
        )
        assert is_channels_last(x_cl), (
            "the input is not channels_last: x.to(memory_format=torch.channels_last) (.contiguous() undoes it)"
        )
        seen: list[bool] = []
        hooks = [m.register_forward_pre_hook(lambda mod, args: seen.append(is_channels_last(args[0]))) for m in convs]
        try:
            with torch.inference_mode():
                out = m_cl(x_cl)
        finally:
            for h in hooks:
                h.remove()
        assert seen, "the returned model did not run its convolutions"
        assert all(seen), (
            f"{seen.count(False)} of {len(seen)} convolutions received a tensor in the NCHW layout: the model "
            "turns the layout back somewhere (a .contiguous() or a reshape inside?)"
        )
        cmp = compare_outputs(out, ref, "fp32")
        assert cmp.within, f"output vs the original model at the FP32 tolerance: {cmp} (same weights, same input)"


@exercise(
    "04.channels-last",
    "to_channels_last(model, x): return (model, x) both converted to memory_format=torch.channels_last, in FP32.",
    _check_channels_last,
    time_limit=30,
)
def to_channels_last(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor]:
    return model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
