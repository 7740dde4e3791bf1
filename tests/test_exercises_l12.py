"""Exercise 12.rebuild-conv3 rejects answers that zero instead of removing, keep the wrong channels or slice wrongly."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from course_utils import exercises

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
