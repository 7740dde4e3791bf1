"""Lesson 12's own code, from its cells tagged ``contract``: sparsity report, channel pruning, the training loop."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from course_utils.supply.errors import CourseError
from course_utils.supply.models import DigitsCNN
from tests.gpu_contract.lesson_code import lesson_namespace


@pytest.fixture(scope="module")
def l12():
    """The functions lesson 12 defines (count_params, sparsity_report, channel_prune_cnn, train, ...)."""
    return SimpleNamespace(**lesson_namespace("12"))


def cnn() -> DigitsCNN:
    torch.manual_seed(0)
    m = DigitsCNN(8, 16, 32, hidden=32)
    for mod in m.modules():  # non-trivial BatchNorm statistics so slicing errors show up
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    return m.eval()


def test_sparsity_report_counts_zeros(l12):
    m = cnn()
    with torch.no_grad():
        m.features[0].weight.zero_()
    report = l12.sparsity_report(m)
    assert report["layer"].iloc[-1] == "total"
    row = report[report.layer == "features.0"].iloc[0]
    assert row.zeros == row.weights and row.sparsity == 1.0
    assert 0 < report["sparsity"].iloc[-1] < 0.1


def test_channel_prune_full_keep_is_identical_and_half_is_smaller(l12):
    m, x = cnn(), torch.rand(4, 1, 8, 8)
    same = l12.channel_prune_cnn(m, 1.0)
    with torch.no_grad():
        assert torch.allclose(same(x), m(x), atol=1e-5)
    half = l12.channel_prune_cnn(m, 0.5)
    assert half(x).shape == (4, 10)
    assert l12.count_params(half) < l12.count_params(m) / 2
    assert half.features[0].out_channels == 4 and half.classifier[1].in_features == 16 * 4


def test_channel_prune_keeps_largest_filters(l12):
    m = cnn()
    with torch.no_grad():
        m.features[0].weight.mul_(0.01)
        m.features[0].weight[[1, 5]] *= 1000
    small = l12.channel_prune_cnn(m, 0.25)
    assert torch.allclose(small.features[0].weight, m.features[0].weight[[1, 5]])


def test_channel_prune_rejects_other_models(l12):
    with pytest.raises(CourseError):
        l12.channel_prune_cnn(torch.nn.Linear(2, 2), 0.5)
    with pytest.raises(CourseError):
        l12.channel_prune_cnn(cnn(), 0.0)


def test_train_and_distill_learn_a_tiny_task(l12):
    torch.manual_seed(0)
    x = torch.rand(64, 1, 8, 8)
    y = (x.mean((1, 2, 3)) > 0.5).long()
    student = l12.train(DigitsCNN(4, 4, 4, hidden=8), x, y, epochs=5, lr=1e-2, batch_size=32)
    assert not student.training
    teacher = cnn()
    seen = []

    def loss_fn(s_logits, t_logits, labels):
        seen.append(t_logits.shape)
        return torch.nn.functional.mse_loss(s_logits, t_logits)

    s2 = l12.train(DigitsCNN(4, 4, 4, hidden=8), x, y, epochs=1, batch_size=32, teacher=teacher, loss_fn=loss_fn)
    assert s2(x).shape == (64, 10) and seen == [(32, 10), (32, 10)]
    assert l12.train(DigitsCNN(4, 4, 4, hidden=8), x, y, epochs=0) is not None
    with pytest.raises(CourseError, match="loss_fn"):
        l12.train(DigitsCNN(4, 4, 4, hidden=8), x, y, teacher=teacher)


def test_sparsity_report_has_a_row_per_conv_and_linear_layer_and_a_weighted_total(l12):
    m = cnn()
    with torch.no_grad():
        m.features[0].weight.zero_()  # 8 filters of 1x3x3: 72 zeros
        m.classifier[3].weight[:2].zero_()  # 2 of 10 rows of 32: 64 zeros
    report = l12.sparsity_report(m)
    layers = ["features.0", "features.3", "features.7", "classifier.1", "classifier.3", "total"]
    assert list(report["layer"]) == layers
    weights = [8 * 9, 16 * 8 * 9, 32 * 16 * 9, 32 * (32 * 4), 10 * 32]
    assert list(report["weights"]) == [*weights, sum(weights)]
    assert list(report["zeros"]) == [72, 0, 0, 0, 64, 136]
    # the total is zeros over weights of the whole model, not the mean of the layers' shares
    assert report["sparsity"].iloc[-1] == pytest.approx(136 / sum(weights))
    assert report["sparsity"].iloc[4] == pytest.approx(0.2)


def test_channel_prune_refuses_keeping_more_than_every_channel(l12):
    with pytest.raises(CourseError, match="keep_fraction"):
        l12.channel_prune_cnn(cnn(), 1.5)
    with pytest.raises(CourseError, match="keep_fraction"):
        l12.channel_prune_cnn(cnn(), -0.5)


def test_train_draws_its_batches_from_its_own_seed_not_the_global_generator(l12):
    torch.manual_seed(0)
    x = torch.rand(24, 1, 8, 8)
    y = torch.arange(24) % 10
    torch.manual_seed(1)
    init = DigitsCNN(4, 4, 4, hidden=8).state_dict()
    runs = []
    for global_seed in (5, 6):
        m = DigitsCNN(4, 4, 4, hidden=8)
        m.load_state_dict(init)
        torch.manual_seed(global_seed)  # must not matter: train() shuffles with its own seeded generator
        runs.append(l12.train(m, x, y, epochs=1, batch_size=8, seed=3).state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    m = DigitsCNN(4, 4, 4, hidden=8)
    m.load_state_dict(init)
    other = l12.train(m, x, y, epochs=1, batch_size=8, seed=4).state_dict()
    assert not torch.equal(other["features.0.weight"], runs[0]["features.0.weight"]), "another seed, other batches"
