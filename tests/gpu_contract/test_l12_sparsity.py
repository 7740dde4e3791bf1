"""Lesson 12's 2:4 section, on the CPU: the pruning it does before ``sparsify_``, its FFN filter, its timing device.

``sparsify_(model, SemiSparseWeightConfig())`` needs CUDA and does not prune: on dense weights its compressor
keeps fixed positions. The lesson prunes first with ``prune_2to4`` (``apply_fake_sparsity``), defined in a
cell tagged ``contract`` that these tests execute.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "12.gpu-2to4": "prune_2to4 leaves exactly 2 of every 4 weights zero, keeping the 2 largest magnitudes; "
    "is_ffn picks intermediate.dense and the block's output.dense, not attention.output.dense; "
    "SemiSparseWeightConfig imports and constructs; timing rows carry the input's device",
}


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("12")


def test_prune_2to4_keeps_the_two_largest_of_every_four(ns):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))
    dense = [m.weight.detach().clone() for m in (model[0], model[2])]
    ns["prune_2to4"](model, lambda mod, name: isinstance(mod, nn.Linear))
    for lin, w0 in zip((model[0], model[2]), dense, strict=True):
        groups, g0 = lin.weight.detach().reshape(-1, 4), w0.reshape(-1, 4)
        assert ((groups == 0).sum(1) == 2).all(), "every group of 4 must have exactly 2 zeros"
        top2 = g0.abs().topk(2, dim=1).indices
        kept = torch.zeros_like(g0, dtype=torch.bool).scatter_(1, top2, True)
        assert torch.equal(groups != 0, kept), "the 2 kept weights must be the 2 largest magnitudes"
        assert torch.equal(groups[kept], g0[kept]), "kept weights must keep their values"
    assert isinstance(model[0].weight, nn.Parameter) and not list(model[0].buffers()), "no mask left behind"


def test_prune_2to4_respects_the_filter(ns):
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    w1 = model[1].weight.detach().clone()
    ns["prune_2to4"](model, lambda mod, name: name == "0")
    assert (model[0].weight == 0).float().mean() == 0.5
    assert torch.equal(model[1].weight, w1)


class Block(nn.Module):
    """The names of one BERT/MiniLM encoder layer."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.query = nn.Linear(8, 8)
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(8, 8)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(8, 32)
        self.output = nn.Module()
        self.output.dense = nn.Linear(32, 8)
        self.output.LayerNorm = nn.LayerNorm(8)


def test_is_ffn_picks_only_feed_forward_layers(ns):
    model = nn.Module()
    model.encoder = nn.Module()
    model.encoder.layer = nn.ModuleList([Block(), Block()])
    picked = [n for n, m in model.named_modules() if ns["is_ffn"](m, n)]
    assert picked == [f"encoder.layer.{i}.{k}" for i in (0, 1) for k in ("intermediate.dense", "output.dense")]


def test_sparsify_config_imports():
    from torchao.sparsity import sparsify_  # noqa: F401
    from torchao.sparsity.sparse_api import SemiSparseWeightConfig

    SemiSparseWeightConfig()


def test_timing_carries_the_input_device_on_a_gpu_machine(ns, monkeypatch):
    import course_utils as cu
    from course_utils.measuring import device as D

    monkeypatch.setattr(D, "pick_device", lambda: torch.device("cuda"))  # what a GPU machine's default is
    m = ns["time_model"](nn.Linear(4, 2), torch.rand(3, 4), "cpu model", warmup=1, min_repeats=2, min_time_s=0.0)
    assert m.device == "cpu" and m.batch_size == 3
    assert cu.record("12", "t", model="m", dtype="fp32", measurement=m)["device"] == "cpu"
