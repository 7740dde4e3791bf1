"""Lesson 12 exercise: prune the digits CNN's last conv block by rebuilding it with fewer channels."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from ..exercises import exercise

KEEP = 96  # of 128 channels
MAX_DROP_POINTS = 2.0  # accuracy budget without fine-tuning


def _silenced_reference(model: nn.Module, kept: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``model(x)`` with every conv3 channel outside ``kept`` set to zero after its ReLU."""
    mask = torch.zeros(model.features[7].out_channels)
    mask[kept] = 1
    hook = model.features[9].register_forward_hook(lambda mod, inp, out: out * mask[None, :, None, None])
    try:
        with torch.inference_mode():
            return model(x)
    finally:
        hook.remove()


def _check_rebuild(fn: Callable[[nn.Module, int], nn.Module]) -> None:
    from ..data import load_digits_split
    from ..models import accuracy, load_digits_model

    digits = load_digits_split()
    model = load_digits_model("cnn")
    before = copy.deepcopy(model.state_dict())
    new = fn(model, KEEP)
    assert isinstance(new, nn.Module), f"return the rebuilt model (an nn.Module), not {type(new).__name__}"
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()), (
        "the model you were given changed: build the new model from a copy"
    )
    conv3, bn3, fc1 = new.features[7], new.features[8], new.classifier[1]
    assert tuple(conv3.weight.shape) == (KEEP, 64, 3, 3), (
        f"features[7] should be a new Conv2d(64, {KEEP}, 3): its weight has shape {tuple(conv3.weight.shape)}"
        + (" (zeroing channels is not removing them)" if conv3.weight.shape[0] == 128 else "")
    )
    assert bn3.num_features == KEEP and bn3.running_mean.shape == (KEEP,), (
        f"features[8] (BatchNorm2d) must have {KEEP} features with the kept channels' statistics"
    )
    assert fc1.in_features == KEEP * 4, (
        f"classifier[1] must read {KEEP} channels x 4 positions = {KEEP * 4} inputs, not {fc1.in_features}"
    )
    norms = model.features[7].weight.detach().abs().flatten(1).sum(1)
    kept = norms.topk(KEEP).indices.sort().values
    assert torch.equal(conv3.weight.detach(), model.features[7].weight.detach()[kept]), (
        "features[7] must hold the original filters with the largest L1 norms, in their original order"
    )
    x = digits.x_test
    try:
        with torch.inference_mode():
            out = new.eval()(x)
    except RuntimeError as exc:
        raise AssertionError(f"running the rebuilt model failed ({exc}); check the slices of bn3 and fc1") from None
    ref = _silenced_reference(model, kept, x)
    err = float((out - ref).abs().max())
    assert err < 1e-3, (
        f"outputs differ from the original with the dropped channels silenced (max abs {err:.3g}): check the "
        "BatchNorm statistics and which columns of classifier[1] you kept (channel c owns columns 4c..4c+3)"
    )
    acc0, acc = accuracy(model, x, digits.y_test), accuracy(new, x, digits.y_test)
    drop = (acc0 - acc) * 100
    assert drop <= MAX_DROP_POINTS, f"accuracy {acc:.2%} is {drop:.1f} points below {acc0:.2%} (budget 2)"
    print(f"   conv3 {tuple(model.features[7].weight.shape)} -> {tuple(conv3.weight.shape)}, fc1 inputs "
          f"{model.classifier[1].in_features} -> {fc1.in_features}; accuracy {acc:.2%} (was {acc0:.2%})")  # fmt: skip


@exercise(
    "12.rebuild-conv3",
    "Rebuild features[7] with the `keep` largest-L1 filters, slice features[8] and classifier[1]'s columns to match.",
    _check_rebuild,
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
