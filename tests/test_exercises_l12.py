"""Exercise 12.rebuild-conv3 rejects answers that zero instead of removing, keep the wrong channels or slice wrongly."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from course_utils.check import exercises

REF = exercises.get("12.rebuild-conv3").solution


def run_checker(fn):
    exercises.get("12.rebuild-conv3").checker(fn)


def test_reference_passes():
    run_checker(REF)


def test_rejects_zeroing_without_rebuild():
    def zeroed(model, keep):
        new = copy.deepcopy(model)
        prune.ln_structured(new.features[7], "weight", amount=128 - keep, n=1, dim=0)
        prune.remove(new.features[7], "weight")
        return new

    with pytest.raises(AssertionError, match="zeroing channels is not removing them"):
        run_checker(zeroed)


def test_rejects_smallest_channels():
    def smallest(model, keep):
        new = REF(model, keep)
        idx = model.features[7].weight.detach().abs().flatten(1).sum(1).topk(keep, largest=False).indices.sort().values
        with torch.no_grad():
            new.features[7].weight.copy_(model.features[7].weight[idx])
            new.features[7].bias.copy_(model.features[7].bias[idx])
        return new

    with pytest.raises(AssertionError, match="largest L1 norms"):
        run_checker(smallest)


def test_rejects_forgotten_batchnorm():
    def no_bn(model, keep):
        new = REF(model, keep)
        new.features[8] = copy.deepcopy(model.features[8])
        return new

    with pytest.raises(AssertionError, match="BatchNorm2d"):
        run_checker(no_bn)


def test_rejects_wrong_linear_columns():
    def position_major(model, keep):  # columns laid out as position-major: not how Flatten orders them
        new = REF(model, keep)
        idx = model.features[7].weight.detach().abs().flatten(1).sum(1).topk(keep).indices.sort().values
        cols = (torch.arange(4)[:, None] * 128 + idx[None, :]).flatten()
        with torch.no_grad():
            new.classifier[1].weight.copy_(model.classifier[1].weight[:, cols])
        return new

    with pytest.raises(AssertionError, match="columns"):
        run_checker(position_major)


def test_rejects_in_place_edit():
    def in_place(model, keep):
        new = REF(model, keep)
        model.features[7] = new.features[7]
        return new

    with pytest.raises(AssertionError, match="changed"):
        run_checker(in_place)


def test_rejects_stale_bn_statistics():
    def fresh_bn(model, keep):
        new = REF(model, keep)
        new.features[8] = nn.BatchNorm2d(keep).eval()  # right shape, statistics not copied
        return new

    with pytest.raises(AssertionError, match="outputs differ"):
        run_checker(fresh_bn)


def test_rejects_a_forgotten_conv_bias(monkeypatch):
    def no_bias(model, keep):  # right shapes and BatchNorm, conv3's bias left at zero: outputs off by ~0.05
        new = REF(model, keep)
        with torch.no_grad():
            new.features[7].bias.zero_()
        return new

    monkeypatch.setenv("COURSE_EXERCISE_SEED", "1")  # rows whose outputs move by 0.05 (above 1e-3, below 1e-1)
    with pytest.raises(AssertionError, match=r"outputs differ .*max abs 0\.05"):
        run_checker(no_bias)


class _LookAlike(nn.Module):
    """Right-shaped pruned layers on display; the forward runs the full model with the dropped channels masked."""

    def __init__(self, model, keep, copy_full=True):
        super().__init__()
        shown = REF(model, keep)
        self.features, self.classifier = shown.features, shown.classifier
        self.full = copy.deepcopy(model) if copy_full else model
        norms = model.features[7].weight.detach().abs().flatten(1).sum(1)
        mask = torch.zeros(128)
        mask[norms.topk(keep).indices] = 1
        self.register_buffer("mask", mask[None, :, None, None])

    def forward(self, x):
        h = self.full.features[:10](x) * self.mask
        return self.full.classifier(self.full.features[10](h))


def test_rejects_a_look_alike_that_runs_the_full_conv_with_a_mask():
    with pytest.raises(AssertionError, match="full 128-channel one with a mask"):
        run_checker(lambda model, keep: _LookAlike(model, keep))


def test_rejects_a_look_alike_that_calls_the_original_model():
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

    with pytest.raises(AssertionError, match="read the original model's tensors"):
        run_checker(CallsOriginal)


def test_rejects_a_zero_padded_linear():
    class PaddedLinear(nn.Module):
        def __init__(self, model, keep):
            super().__init__()
            shown = REF(model, keep)
            self.features, self.classifier = shown.features, shown.classifier
            norms = model.features[7].weight.detach().abs().flatten(1).sum(1)
            idx = norms.topk(keep).indices.sort().values
            self.register_buffer("idx", idx)
            self.fc_full = copy.deepcopy(model.classifier[1])  # the full 512-input Linear, fed zero-padded input

        def forward(self, x):
            h = self.features(x)
            full = h.new_zeros(h.shape[0], 128, 2, 2)
            full[:, self.idx] = h
            z = self.fc_full(full.flatten(1))
            return self.classifier[3](self.classifier[2](z))

    with pytest.raises(AssertionError, match="512 inputs"):
        run_checker(PaddedLinear)


def test_the_seed_is_printed_on_failure():
    with pytest.raises(AssertionError, match="random case seed"):
        run_checker(lambda model, keep: _LookAlike(model, keep))
