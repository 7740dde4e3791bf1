"""Unit tests for course_utils.pruning: magnitude pruning, channel pruning, distillation."""

from __future__ import annotations

import pytest
import torch

from course_utils import pruning as P
from course_utils.errors import CourseError
from course_utils.models import DigitsCNN


def cnn() -> DigitsCNN:
    torch.manual_seed(0)
    m = DigitsCNN(8, 16, 32, hidden=32)
    for mod in m.modules():  # non-trivial BatchNorm statistics so slicing errors show up
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    return m.eval()


def test_magnitude_prune_reaches_sparsity_and_keeps_original():
    m = cnn()
    pm = P.magnitude_prune(m, 0.6)
    report = P.sparsity_report(pm)
    assert abs(report["sparsity"].iloc[-1] - 0.6) < 0.01
    assert report["layer"].iloc[-1] == "total"
    assert P.sparsity_report(m)["sparsity"].iloc[-1] < 0.01
    assert not any(n.endswith("_orig") for n, _ in pm.named_parameters())  # masks folded in


def test_magnitude_prune_bad_amount():
    with pytest.raises(CourseError):
        P.magnitude_prune(cnn(), 1.5)


def test_channel_prune_full_keep_is_identical_and_half_is_smaller():
    m, x = cnn(), torch.rand(4, 1, 8, 8)
    same = P.channel_prune_cnn(m, 1.0)
    with torch.no_grad():
        assert torch.allclose(same(x), m(x), atol=1e-5)
    half = P.channel_prune_cnn(m, 0.5)
    assert half(x).shape == (4, 10)
    assert P.count_params(half) < P.count_params(m) / 2
    assert half.features[0].out_channels == 4 and half.classifier[1].in_features == 16 * 4


def test_channel_prune_keeps_largest_filters():
    m = cnn()
    with torch.no_grad():
        m.features[0].weight.mul_(0.01)
        m.features[0].weight[[1, 5]] *= 1000
    small = P.channel_prune_cnn(m, 0.25)
    assert torch.allclose(small.features[0].weight, m.features[0].weight[[1, 5]])


def test_channel_prune_rejects_other_models():
    with pytest.raises(CourseError):
        P.channel_prune_cnn(torch.nn.Linear(2, 2), 0.5)
    with pytest.raises(CourseError):
        P.channel_prune_cnn(cnn(), 0.0)


def test_distillation_loss_properties():
    t = torch.tensor([[3.0, 1.0, 0.0]])
    y = torch.tensor([0])
    same = P.distillation_loss(t, t, y, alpha=1.0)
    assert abs(float(same)) < 1e-6  # KL of a distribution with itself
    assert float(P.distillation_loss(torch.zeros(1, 3), t, y, alpha=1.0)) > 0
    with pytest.raises(CourseError):
        P.distillation_loss(t, t, y, temperature=0)


def test_train_and_distill_learn_a_tiny_task():
    torch.manual_seed(0)
    x = torch.rand(64, 1, 8, 8)
    y = (x.mean((1, 2, 3)) > 0.5).long()
    student = P.train(DigitsCNN(4, 4, 4, hidden=8), x, y, epochs=5, lr=1e-2, batch_size=32)
    assert not student.training
    teacher = cnn()
    s2 = P.distill(DigitsCNN(4, 4, 4, hidden=8), teacher, x, y, epochs=1, batch_size=32)
    assert s2(x).shape == (64, 10)
    assert P.train(DigitsCNN(4, 4, 4, hidden=8), x, y, epochs=0) is not None
