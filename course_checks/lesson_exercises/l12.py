"""Lesson 12 exercise: prune the digits CNN's last conv block by rebuilding it with fewer channels.

The check draws ``keep`` and the probe images at random per call (the seed is printed on failure). Beyond the
new layers' shapes and the outputs (equal to the original's with the dropped channels silenced), it runs the
rebuilt model under an operator log (:class:`~course_checks.lesson_exercises.observe.OpLog`) and looks at the
convolution and matrix-multiply operators that actually ran: a look-alike whose modules have the right shapes
but whose forward still runs the full 128-channel convolution (with a mask, or the original model kept inside)
is rejected by the weight shapes that ran and by the original model's weights being read.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

import torch
from torch import nn

from course_checks.exercises import exercise, observed, untimed
from course_checks.lesson_exercises.digits import digits_cnn, held_out_digits
from course_checks.lesson_exercises.observe import CONV_OPS, MATMUL_OPS, Cases, OpLog, cases

KEEP = 96  # of 128 channels: the lesson's example; the check draws its own


def silenced_reference(model: nn.Module, kept: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``model(x)`` with every conv3 channel outside ``kept`` set to zero after its ReLU."""
    mask = torch.zeros(model.features[7].out_channels)
    mask[kept] = 1
    hook = model.features[9].register_forward_hook(lambda mod, inp, out: out * mask[None, :, None, None])
    try:
        with torch.inference_mode():
            return model(x)
    finally:
        hook.remove()


def draw_rebuild(c: Cases, n_images: int) -> tuple[int, torch.Tensor]:
    """What a seed draws: ``keep`` (64-120 of the 128 channels) and the sorted rows of 96-256 probe images."""
    keep = c.randint(64, 120)
    rows = torch.tensor(sorted(c.rng.sample(range(n_images), c.randint(96, 256))))
    return keep, rows


def judge_layers(model: nn.Module, before: dict, new: object, keep: int) -> torch.Tensor:
    """The judgment of the layers of ``new = fn(model, keep)`` (``before``: ``model``'s state dict before the call).
    Raises AssertionError with the reason; returns the channels that must be kept (largest L1 norms, in order)."""
    assert isinstance(new, nn.Module), f"return the rebuilt model (an nn.Module), not {type(new).__name__}"
    now = model.state_dict()
    assert all(torch.equal(v, now[k]) for k, v in before.items()), (
        "the model you were given changed: build the new model from a copy"
    )
    conv3, bn3, fc1 = new.features[7], new.features[8], new.classifier[1]
    assert tuple(conv3.weight.shape) == (keep, 64, 3, 3), (
        f"keep={keep}: features[7] should be a new Conv2d(64, {keep}, 3): its weight has shape "
        f"{tuple(conv3.weight.shape)}"
        + (" (zeroing channels is not removing them)" if conv3.weight.shape[0] == 128 else "")
    )
    geometry = {a: getattr(model.features[7], a) for a in ("kernel_size", "stride", "padding", "dilation")}
    got = {a: getattr(conv3, a, None) for a in geometry}
    assert got == geometry, (
        "features[7] must be built like the original, only with fewer filters: "
        + ", ".join(f"{a}={got[a]} (the original has {geometry[a]})" for a in geometry if got[a] != geometry[a])
        + ": the feature map would change size, and classifier[1] would read other positions"
    )
    assert bn3.num_features == keep and bn3.running_mean.shape == (keep,), (
        f"features[8] (BatchNorm2d) must have {keep} features with the kept channels' statistics"
    )
    assert fc1.in_features == keep * 4, (
        f"classifier[1] must read {keep} channels x 4 positions = {keep * 4} inputs, not {fc1.in_features}"
    )
    norms = model.features[7].weight.detach().abs().flatten(1).sum(1)
    kept = norms.topk(keep).indices.sort().values
    w = conv3.weight.detach()
    if not torch.equal(w, model.features[7].weight.detach()[kept]):
        by_norm = model.features[7].weight.detach()[norms.topk(keep).indices]
        assert not torch.equal(w, by_norm), (
            "features[7] holds the filters with the largest L1 norms, but in the order of their norms (topk's "
            "order): keep them in their original order (sort the indices), as BatchNorm and classifier[1] expect"
        )
        raise AssertionError(
            "features[7] must hold the original filters with the largest L1 norms (per filter, the sum of |w| over "
            "its input channels and kernel), in their original order"
        )
    judge_modes(new)
    return kept


_MODAL = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd)  # what computes otherwise in training


def judge_modes(new: nn.Module) -> None:
    """The rebuilt model's BatchNorm and Dropout layers must be in eval mode, as the model given was: a new
    ``nn.BatchNorm2d`` starts in training mode, and there it normalizes each batch by the batch's own statistics
    (outputs that change with the batch, running statistics overwritten), whatever statistics were copied in."""
    wrong = [(re.sub(r"\.(\d+)", r"[\1]", name), type(m).__name__)
             for name, m in new.named_modules() if isinstance(m, _MODAL) and m.training]  # fmt: skip
    assert not wrong, (
        f"{wrong[0][0] or 'the model'} ({wrong[0][1]}) is in training mode, the model you were given is in eval "
        "mode: a BatchNorm in training mode normalizes each batch by its own mean and variance, not the running "
        "statistics you copied (outputs change with the batch, and each call overwrites those statistics). Call "
        ".eval() on the new layer, or on the rebuilt model"
        + (f" ({len(wrong)} such layers: {', '.join(n for n, _ in wrong[:4])})" if len(wrong) > 1 else "")
    )


def run_rebuilt(model: nn.Module, new: nn.Module, keep: int, x: torch.Tensor) -> torch.Tensor:
    """``new(x)`` under an operator log, judged by the operators that ran (the kept-size convolution and Linear,
    none of the original model's tensors read). Raises AssertionError with the reason; returns the outputs."""
    try:
        with OpLog(watch=model) as log, torch.inference_mode():
            out = new(x)  # as returned: its layers' modes were judged (judge_modes)
    except RuntimeError as exc:
        raise AssertionError(f"running the rebuilt model failed ({exc}); check the slices of bn3 and fc1") from None
    ran = [op.in_shapes[1] for op in log.named(*CONV_OPS) if len(op.in_shapes) > 1]
    want = [tuple(model.features[0].weight.shape), tuple(model.features[3].weight.shape), (keep, 64, 3, 3)]
    assert ran == want, (
        f"the convolutions that ran had weights {ran}, expected {want}: the rebuilt model's forward must run "
        f"the {keep}-channel convolution itself, not the full 128-channel one with a mask or a copy of the "
        "original model kept inside"
    )
    mm_shapes = {s for op in log.named(*MATMUL_OPS) for s in op.in_shapes if len(s) == 2}
    assert not any(512 in s for s in mm_shapes), (
        f"a matrix multiply with 512 inputs ran (shapes {sorted(mm_shapes)}): classifier[1] must be the sliced "
        f"Linear({keep * 4}, 256), and the forward must use it"
    )
    read = log.watched_read()
    assert not read, (
        f"the rebuilt model's forward read the original model's tensors ({sorted(read)[:3]} ...): copy the kept "
        "weights into new layers (copy.deepcopy first), do not call the original model or its layers"
    )
    return out


def diagnose(model: nn.Module, new: nn.Module, kept: torch.Tensor) -> str:
    """Which of the rebuilt layers' other tensors is not the original's kept slice ("" when all are): named when
    the outputs differ, so the message says which copy was forgotten."""
    conv, bn, fc = model.features[7], model.features[8], model.classifier[1]
    cols = (kept[:, None] * 4 + torch.arange(4)[None, :]).flatten()
    want = [
        ("features[7]'s bias is not the kept filters'", new.features[7].bias, conv.bias[kept]),
        *(
            (f"features[8]'s {a} is not the kept channels'", getattr(new.features[8], a), getattr(bn, a)[kept])
            for a in ("running_mean", "running_var", "weight", "bias")
        ),
        ("classifier[1]'s columns are not the kept channels' (channel c owns columns 4c..4c+3)", fc.weight[:, cols],
         None),
        ("classifier[1]'s bias is not the original's", new.classifier[1].bias, fc.bias),
    ]  # fmt: skip
    for what, got, ref in want:
        if ref is None:
            got, ref = new.classifier[1].weight, got
        if got is None or ref is None or got.shape != ref.shape or not torch.allclose(got.detach(), ref.detach()):
            return what
    return ""


def judge_outputs(out: torch.Tensor, ref: torch.Tensor, hint: str = "") -> None:
    """The rebuilt model's outputs against the original's with the dropped channels silenced (``ref``); ``hint``:
    what :func:`diagnose` found."""
    with torch.inference_mode():  # outputs only: nothing to record
        err = float((out - ref).abs().max())
        assert err < 1e-3, (
            f"outputs differ from the original with the dropped channels silenced (max abs {err:.3g}): "
            + (
                f"{hint}: copy it from the original (sliced to the kept channels)"
                if hint
                else "check the BatchNorm statistics and which columns of classifier[1] you kept (channel c owns "
                "columns 4c..4c+3)"
            )
        )


def _check_rebuild(fn: Callable[[nn.Module, int], nn.Module]) -> None:
    with untimed():  # the checker's own first imports and data: not the learner's time
        from course_utils.supply.models import accuracy

        x_test, y_test = held_out_digits()
        model = digits_cnn()
    with cases("12.rebuild-conv3") as c:
        keep, rows = draw_rebuild(c, len(x_test))
        x, y = x_test[rows], y_test[rows]
        before = copy.deepcopy(model.state_dict())
        new = fn(model, keep)
        kept = judge_layers(model, before, new, keep)
        out = run_rebuilt(model, new, keep, x)
        judge_outputs(out, silenced_reference(model, kept, x), diagnose(model, new, kept))
        conv3, fc1 = new.features[7], new.classifier[1]
        acc0, acc = accuracy(model, x, y), accuracy(new, x, y)
        observed(f"keep={keep}: conv3 {tuple(model.features[7].weight.shape)} -> {tuple(conv3.weight.shape)}, fc1 "
                 f"inputs {model.classifier[1].in_features} -> {fc1.in_features}; accuracy on {len(rows)} test "
                 f"digits {acc:.2%} (was {acc0:.2%}), without fine-tuning")  # fmt: skip


@exercise(
    "12.rebuild-conv3",
    "Rebuild features[7] with the `keep` largest-L1 filters, slice features[8] and classifier[1]'s columns to match.",
    _check_rebuild,
    time_limit=60,
)
def rebuild_conv3(model: nn.Module, keep: int) -> nn.Module:
    new = copy.deepcopy(model).eval()
    conv, bn, fc = model.features[7], model.features[8], model.classifier[1]
    idx = conv.weight.detach().abs().flatten(1).sum(1).topk(keep).indices.sort().values
    cols = (idx[:, None] * 4 + torch.arange(4)[None, :]).flatten()  # channel c owns columns 4c..4c+3
    nconv = nn.Conv2d(conv.in_channels, keep, conv.kernel_size, padding=conv.padding)
    nbn = nn.BatchNorm2d(keep).eval()
    nfc = nn.Linear(keep * 4, fc.out_features)
    with torch.no_grad():
        nconv.weight.copy_(conv.weight[idx])
        nconv.bias.copy_(conv.bias[idx])
        for attr in ("weight", "bias", "running_mean", "running_var"):
            getattr(nbn, attr).copy_(getattr(bn, attr)[idx])
        nfc.weight.copy_(fc.weight[:, cols])
        nfc.bias.copy_(fc.bias)
    new.features[7], new.features[8], new.classifier[1] = nconv, nbn, nfc
    return new
