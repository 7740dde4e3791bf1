"""Exercise 12.rebuild-conv3 rejects answers that zero instead of removing, keep the wrong channels or slice wrongly.

Each wrong answer and the right ones run the full checker on a fresh seed, and the checker's own judges
(``judge_layers``, ``run_rebuilt``, ``judge_outputs``) on each of 200 seeds' draws (``draw_rebuild``)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from course_checks import exercises
from course_checks.lesson_exercises import l12
from course_checks.lesson_exercises.digits import digits_cnn, held_out_digits
from course_checks.lesson_exercises.observe import Cases

REF = exercises.get("12.rebuild-conv3").solution


def run_checker(fn):
    exercises.get("12.rebuild-conv3").checker(fn)


def _kept(model, keep, largest=True):
    norms = model.features[7].weight.detach().abs().flatten(1).sum(1)
    return norms.topk(keep, largest=largest).indices.sort().values


def zeroed(model, keep):
    new = copy.deepcopy(model)
    prune.ln_structured(new.features[7], "weight", amount=128 - keep, n=1, dim=0)
    prune.remove(new.features[7], "weight")
    return new


def smallest(model, keep):
    new = REF(model, keep)
    idx = _kept(model, keep, largest=False)
    with torch.no_grad():
        new.features[7].weight.copy_(model.features[7].weight[idx])
        new.features[7].bias.copy_(model.features[7].bias[idx])
    return new


def no_bn(model, keep):
    new = REF(model, keep)
    new.features[8] = copy.deepcopy(model.features[8])
    return new


def position_major(model, keep):  # columns laid out as position-major: not how Flatten orders them
    new = REF(model, keep)
    cols = (torch.arange(4)[:, None] * 128 + _kept(model, keep)[None, :]).flatten()
    with torch.no_grad():
        new.classifier[1].weight.copy_(model.classifier[1].weight[:, cols])
    return new


def in_place(model, keep):
    new = REF(model, keep)
    model.features[7] = new.features[7]
    return new


def fresh_bn(model, keep):
    new = REF(model, keep)
    new.features[8] = nn.BatchNorm2d(keep).eval()  # right shape, statistics not copied
    return new


def no_bias(model, keep):  # right shapes and BatchNorm, conv3's bias left at zero: outputs off by ~0.05
    new = REF(model, keep)
    with torch.no_grad():
        new.features[7].bias.zero_()
    return new


class _LookAlike(nn.Module):
    """Right-shaped pruned layers on display; the forward runs the full model with the dropped channels masked."""

    def __init__(self, model, keep, copy_full=True):
        super().__init__()
        shown = REF(model, keep)
        self.features, self.classifier = shown.features, shown.classifier
        self.full = copy.deepcopy(model) if copy_full else model
        mask = torch.zeros(128)
        mask[_kept(model, keep)] = 1
        self.register_buffer("mask", mask[None, :, None, None])

    def forward(self, x):
        h = self.full.features[:10](x) * self.mask
        return self.full.classifier(self.full.features[10](h))


class CallsOriginal(nn.Module):
    def __init__(self, model, keep):
        super().__init__()
        shown = REF(model, keep)
        self.features, self.classifier = shown.features, shown.classifier
        self.orig = [model]  # hidden from .modules(): not a copy

    def forward(self, x):
        f = self.features
        h = self.orig[0].features[:7](x)  # the first blocks of the original, not copies
        return self.classifier(f[10](f[9](f[8](f[7](h)))))


class PaddedLinear(nn.Module):
    def __init__(self, model, keep):
        super().__init__()
        shown = REF(model, keep)
        self.features, self.classifier = shown.features, shown.classifier
        self.register_buffer("idx", _kept(model, keep))
        self.fc_full = copy.deepcopy(model.classifier[1])  # the full 512-input Linear, fed zero-padded input

    def forward(self, x):
        h = self.features(x)
        full = h.new_zeros(h.shape[0], 128, 2, 2)
        full[:, self.idx] = h
        z = self.fc_full(full.flatten(1))
        return self.classifier[3](self.classifier[2](z))


def rebuilt(model, keep, idx, padding=None):
    """The reference's rebuild around the channels ``idx`` (in that order); ``padding`` for the new conv."""
    new = copy.deepcopy(model).eval()
    conv, bn, fc = model.features[7], model.features[8], model.classifier[1]
    cols = (idx[:, None] * 4 + torch.arange(4)[None, :]).flatten()
    nconv = nn.Conv2d(64, keep, 3, padding=conv.padding if padding is None else padding)
    nbn, nfc = nn.BatchNorm2d(keep).eval(), nn.Linear(keep * 4, 256)
    with torch.no_grad():
        nconv.weight.copy_(conv.weight[idx])
        nconv.bias.copy_(conv.bias[idx])
        for attr in ("weight", "bias", "running_mean", "running_var"):
            getattr(nbn, attr).copy_(getattr(bn, attr)[idx])
        nfc.weight.copy_(fc.weight[:, cols])
        nfc.bias.copy_(fc.bias)
    new.features[7], new.features[8], new.classifier[1] = nconv, nbn, nfc
    return new


def topk_order(model, keep):  # the right filters, in topk's order (largest norm first), not sorted back
    norms = model.features[7].weight.detach().abs().flatten(1).sum(1)
    return rebuilt(model, keep, norms.topk(keep).indices)


def no_padding(model, keep):  # Conv2d(64, keep, 3) without the original's padding=1: a 2x2 map becomes 1x1
    return rebuilt(model, keep, _kept(model, keep), padding=0)


def l2_norm(model, keep):  # the largest L2 norms, not L1
    norms = model.features[7].weight.detach().pow(2).flatten(1).sum(1)
    return rebuilt(model, keep, norms.topk(keep).indices.sort().values)


def no_fc_bias(model, keep):  # a new Linear whose weight is sliced and whose bias is left at its random init
    new = REF(model, keep)
    with torch.no_grad():
        new.classifier[1].bias.copy_(nn.Linear(keep * 4, 256).bias)
    return new


def bn_affine_only(model, keep):  # the BatchNorm's weight and bias sliced, its running statistics left fresh
    new = REF(model, keep)
    bn = nn.BatchNorm2d(keep).eval()
    idx = _kept(model, keep)
    with torch.no_grad():
        bn.weight.copy_(model.features[8].weight[idx])
        bn.bias.copy_(model.features[8].bias[idx])
    new.features[8] = bn
    return new


def bn_in_training_mode(model, keep):  # the statistics copied into a new BatchNorm2d left in training mode
    new = REF(model, keep)
    new.features[8].train()
    return new


def whole_model_trains(model, keep):  # the rebuilt copy put back in training mode (BatchNorms and Dropout)
    return REF(model, keep).train()


def rebuilt_then_eval(model, keep):  # right too: new layers made in training mode, the whole model put in eval
    new = copy.deepcopy(model)
    nconv = nn.Conv2d(64, keep, 3, padding=1)
    nbn, nfc = nn.BatchNorm2d(keep), nn.Linear(keep * 4, 256)
    idx = _kept(model, keep)
    cols = (idx[:, None] * 4 + torch.arange(4)[None, :]).flatten()
    with torch.no_grad():
        nconv.weight.copy_(model.features[7].weight[idx])
        nconv.bias.copy_(model.features[7].bias[idx])
        for attr in ("weight", "bias", "running_mean", "running_var"):
            getattr(nbn, attr).copy_(getattr(model.features[8], attr)[idx])
        nfc.weight.copy_(model.classifier[1].weight[:, cols])
        nfc.bias.copy_(model.classifier[1].bias)
    new.features[7], new.features[8], new.classifier[1] = nconv, nbn, nfc
    return new.eval()


def sliced_parameters(model, keep):  # right too: the copy's own layers, their parameters replaced by slices
    new = copy.deepcopy(model).eval()
    conv, bn, fc = new.features[7], new.features[8], new.classifier[1]
    idx = _kept(model, keep)
    conv.weight = nn.Parameter(conv.weight.detach()[idx].clone())
    conv.bias = nn.Parameter(conv.bias.detach()[idx].clone())
    conv.out_channels = keep
    bn.weight, bn.bias = nn.Parameter(bn.weight.detach()[idx].clone()), nn.Parameter(bn.bias.detach()[idx].clone())
    bn.running_mean, bn.running_var = bn.running_mean[idx].clone(), bn.running_var[idx].clone()
    bn.num_features = keep
    cols = (idx[:, None] * 4 + torch.arange(4)[None, :]).flatten()
    fc.weight = nn.Parameter(fc.weight.detach()[:, cols].clone())
    fc.in_features = keep * 4
    return new


WRONG = {
    "zeroed": (zeroed, "zeroing channels is not removing them"),
    "smallest": (smallest, "largest L1 norms"),
    "no-bn": (no_bn, "BatchNorm2d"),
    "position-major": (position_major, "columns"),
    "in-place": (in_place, "changed"),
    "fresh-bn": (fresh_bn, "features[8]'s running_mean is not the kept channels'"),
    "no-bias": (no_bias, "features[7]'s bias is not the kept filters'"),
    "no-fc-bias": (no_fc_bias, "classifier[1]'s bias is not the original's"),
    "bn-affine-only": (bn_affine_only, "features[8]'s running_mean is not the kept channels'"),
    "masked-look-alike": (_LookAlike, "full 128-channel one with a mask"),
    "calls-original": (CallsOriginal, "read the original model's tensors"),
    "padded-linear": (PaddedLinear, "512 inputs"),
    "topk-order": (topk_order, "in the order of their norms"),
    "no-padding": (no_padding, "padding=(0, 0) (the original has (1, 1))"),
    "l2-norm": (l2_norm, "largest L1 norms"),
    "bn-training-mode": (bn_in_training_mode, "features[8] (BatchNorm2d) is in training mode, the model you were"),
    "whole-model-trains": (whole_model_trains, "features[1] (BatchNorm2d) is in training mode"),
}


_SILENCED = {}


def judged_on_200_seeds(fn):
    """The checker's judgment of ``fn`` on each of seeds 0-199, by its own judges.

    A full call costs ~90 ms, most of it forward passes over the 96-256 drawn images. So the answer is built once
    per ``keep`` the seeds draw; its layers are judged, and its forward under the operator log on all 450 test
    images (one batch shape: oneDNN's kernels are set up once, not per drawn size), the original's silenced
    outputs computed once per keep; each seed's outputs are then its own rows of those (eval mode: each image is
    computed alone).
    """
    x_all, _ = held_out_digits()
    draws = {seed: l12.draw_rebuild(Cases(seed), len(x_all)) for seed in range(200)}
    by_keep = {}
    for keep in sorted({keep for keep, _ in draws.values()}):
        model = digits_cnn()
        before = copy.deepcopy(model.state_dict())
        new = fn(model, keep)
        try:
            kept = l12.judge_layers(model, before, new, keep)
            out = l12.run_rebuilt(model, new, keep, x_all)
        except AssertionError as exc:
            by_keep[keep] = str(exc)
            continue
        if keep not in _SILENCED:
            _SILENCED[keep] = l12.silenced_reference(digits_cnn(), kept, x_all)
        by_keep[keep] = (out, _SILENCED[keep], l12.diagnose(model, new, kept))
    reasons = {}
    for seed, (keep, rows) in draws.items():
        if isinstance(by_keep[keep], str):
            reasons[seed] = by_keep[keep]
            continue
        out, ref, hint = by_keep[keep]
        try:
            l12.judge_outputs(out[rows], ref[rows], hint)
            reasons[seed] = "accepted"
        except AssertionError as exc:
            reasons[seed] = str(exc)
    return reasons


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_rebuilds_are_rejected_on_200_seeds(name):
    fn, message = WRONG[name]
    bad = {seed: reason for seed, reason in judged_on_200_seeds(fn).items() if message not in reason}
    assert not bad, bad


def test_right_rebuilds_are_accepted_on_200_seeds():
    for fn in (REF, sliced_parameters, rebuilt_then_eval):
        bad = {seed: reason for seed, reason in judged_on_200_seeds(fn).items() if reason != "accepted"}
        assert not bad, (fn.__name__, bad)
        for seed in range(3):
            assert exercises.verdict("12.rebuild-conv3", fn, seed=seed) == "accepted", (fn.__name__, seed)


def test_reference_passes():
    run_checker(REF)


def test_rejects_zeroing_without_rebuild():
    with pytest.raises(AssertionError, match="zeroing channels is not removing them"):
        run_checker(zeroed)


def test_rejects_smallest_channels():
    with pytest.raises(AssertionError, match="largest L1 norms"):
        run_checker(smallest)


def test_rejects_forgotten_batchnorm():
    with pytest.raises(AssertionError, match="BatchNorm2d"):
        run_checker(no_bn)


def test_rejects_wrong_linear_columns():
    with pytest.raises(AssertionError, match="columns"):
        run_checker(position_major)


def test_rejects_in_place_edit():
    with pytest.raises(AssertionError, match="changed"):
        run_checker(in_place)


def test_rejects_stale_bn_statistics():
    with pytest.raises(AssertionError, match="outputs differ"):
        run_checker(fresh_bn)


def test_rejects_a_forgotten_conv_bias(monkeypatch):
    monkeypatch.setenv("COURSE_EXERCISE_SEED", "1")  # rows whose outputs move by 0.05 (above 1e-3, below 1e-1)
    with pytest.raises(AssertionError, match=r"outputs differ .*max abs 0\.05"):
        run_checker(no_bias)


def test_rejects_a_look_alike_that_runs_the_full_conv_with_a_mask():
    with pytest.raises(AssertionError, match="full 128-channel one with a mask"):
        run_checker(lambda model, keep: _LookAlike(model, keep))


def test_rejects_a_look_alike_that_calls_the_original_model():
    with pytest.raises(AssertionError, match="read the original model's tensors"):
        run_checker(CallsOriginal)


def test_rejects_a_zero_padded_linear():
    with pytest.raises(AssertionError, match="512 inputs"):
        run_checker(PaddedLinear)


def test_the_seed_is_printed_on_failure():
    with pytest.raises(AssertionError, match="random case seed"):
        run_checker(lambda model, keep: _LookAlike(model, keep))


def test_the_checkers_own_set_up_is_not_counted(monkeypatch):
    """Loading the digits and the model is the checker's set-up: made to take 2.5 s of CPU under a 1.5 s limit, the
    reference is still accepted."""
    import dataclasses
    import time

    sealed, code = exercises._SEALED["12.rebuild-conv3"]
    monkeypatch.setitem(exercises._SEALED, "12.rebuild-conv3", (dataclasses.replace(sealed, time_limit=1.5), code))
    real = l12.digits_cnn

    def slow_cnn():
        t0 = time.thread_time()
        while time.thread_time() - t0 < 2.5:
            pass
        return real()

    monkeypatch.setattr(l12, "digits_cnn", slow_cnn)
    assert exercises.verdict("12.rebuild-conv3", REF, seed=0) == "accepted"
