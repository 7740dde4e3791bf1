"""Unit tests for course_utils.techniques.quantization on small models (MiniLM is exercised by lesson 05 itself)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from course_utils.supply.errors import CourseError
from course_utils.techniques import quantization


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 128)
        self.b = nn.Linear(128, 128)
        self.c = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return Tiny().eval()


def count_quantized(model):
    """How many modules quantize_dynamic replaced (its dynamic quantized Linear modules)."""
    return sum(quantization.is_dynamic_quantized_linear(m) for m in model.modules())


def dynamic(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)


def test_sizes_of_dynamic_int8_and_torchao(tiny):
    q = dynamic(tiny)
    assert count_quantized(q) == 3 and count_quantized(tiny) == 0
    ratio = quantization.linear_weight_bytes(tiny) / quantization.linear_weight_bytes(q)
    assert 3.5 < ratio <= 4.0
    assert quantization.state_dict_bytes(q) < quantization.state_dict_bytes(tiny)
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    ao = copy.deepcopy(tiny)
    quantize_(ao, Int8DynamicActivationInt8WeightConfig())
    assert (
        3.0 < quantization.linear_weight_bytes(tiny) / quantization.linear_weight_bytes(ao) < 4.0
    )  # per-row scales cost a little


def test_sensitivity_and_greedy(tiny):
    x = torch.rand(16, 64)
    with torch.no_grad():
        ref = tiny(x)
    q = dynamic(tiny)

    def score(m):
        with torch.no_grad():
            return quantization.mean_cosine(m(x), ref)

    sens = quantization.layer_sensitivity(tiny, q, score)
    assert list(sens.table.layer) == ["a", "b", "c"] and (sens.table.cosine > 0.9).all()
    assert count_quantized(tiny) == 0  # swapped back
    keep, path = quantization.greedy_keep_fp32(tiny, q, sens, score, target=1.01, max_keep=3)
    assert len(keep) == 3 and len(path) == 4 and path.cosine.iloc[-1] == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(CourseError):
        quantization.layer_sensitivity(tiny, q, score, layers=["nope"])


COST = {"a": 0.001, "b": 0.05, "c": 0.01}  # the cosine each layer loses in INT8: b the most sensitive, then c


def known_score(model):
    """A score with a known answer: 1 minus the cost of every layer that is INT8 now."""
    return 1.0 - sum(COST[n] for n, m in model.named_modules() if quantization.is_dynamic_quantized_linear(m))


def test_worst_layers_and_greedy_order_on_known_costs(tiny):
    q = dynamic(tiny)
    sens = quantization.layer_sensitivity(tiny, q, known_score)
    assert list(sens.table.cosine) == pytest.approx([0.999, 0.95, 0.99])
    assert list(sens.table["drop"]) == pytest.approx([0.001, 0.05, 0.01])
    assert sens.worst(1) == ["b"] and sens.worst(2) == ["b", "c"], "the layers that cost the most, most first"
    keep, path = quantization.greedy_keep_fp32(tiny, q, sens, known_score, target=0.998)
    assert keep == ["b", "c"], "the most sensitive layer is kept in FP32 first, and no more than the target needs"
    assert list(path["last kept"]) == ["-", "b", "c"]
    assert list(path.cosine) == pytest.approx([1 - 0.061, 1 - 0.011, 1 - 0.001])
    keep, _ = quantization.greedy_keep_fp32(tiny, q, sens, known_score, target=1.1, max_keep=1)
    assert keep == ["b"]


def test_tensor_bytes_quantized_and_plain():
    assert quantization.tensor_bytes(torch.zeros(10)) == 40
    qt = torch.quantize_per_tensor(torch.zeros(10), 0.1, 0, torch.qint8)
    assert quantization.tensor_bytes(qt) == 10 + 8
    qc = torch.quantize_per_channel(torch.zeros(4, 3), torch.ones(4, dtype=torch.float64),
                                    torch.zeros(4, dtype=torch.int64), 0, torch.qint8)  # fmt: skip
    assert quantization.tensor_bytes(qc) == 12 + 4 * 8 + 4 * 8, "int8 values, then a float64 scale and an int64 zero"


def _circle(degrees):
    rad = torch.tensor(degrees, dtype=torch.float64) * torch.pi / 180
    return torch.stack([rad.cos(), rad.sin()], dim=1)


def test_neighbour_agreement_on_known_neighbours():
    # reference nearest neighbours (self excluded): 1, 0, 1, 2, 3, 4; the other embedding's: 1, 2, 3, 4, 5, 4
    ref = _circle([0, 10, 30, 64, 100, 150])
    emb = _circle([0, 50, 90, 121, 140, 150])
    got = quantization.neighbour_agreement(emb, ref, k=2)
    assert got["top1"] == pytest.approx(2 / 6), "rows 0 and 5 keep their nearest neighbour"
    assert got["topk_overlap"] == pytest.approx(10 / 12), "the 2-nearest sets of rows 2 and 3 share one of two"


def test_neighbour_agreement():
    torch.manual_seed(0)
    e = torch.randn(10, 8)
    same = quantization.neighbour_agreement(e, e, k=3)
    assert same == {"top1": 1.0, "topk_overlap": 1.0}
    other = quantization.neighbour_agreement(torch.randn(10, 8), e, k=3)
    assert other["top1"] < 1.0 and other["topk_overlap"] < 1.0, "unrelated embeddings do not agree"
    with pytest.raises(CourseError):
        quantization.neighbour_agreement(e, e[:5], k=3)
    assert quantization.mean_cosine(e, e) == pytest.approx(1.0)


class FakeST(nn.Module):
    """Stands in for a SentenceTransformer: a tokenizer attribute and a forward returning a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 4)

        class Tok:
            def __call__(self, sents, padding=False, max_length=None, truncation=False, return_tensors=None):
                ids = [[1 + (hash(w) % 98) for w in s.split()] for s in sents]
                if padding == "max_length":
                    ids = [(i + [0] * max_length)[:max_length] for i in ids]
                    mask = [[int(t != 0) for t in i] for i in ids]
                    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}
                return {"input_ids": ids}

        self.tokenizer = Tok()

    def forward(self, f):
        e = (self.emb(f["input_ids"]) * f["attention_mask"][..., None]).sum(1)
        return {"sentence_embedding": e}


def test_fixed_length_features_and_embed_batched():
    st = FakeST()
    sents = ["a b c", "d e", "f g h i", "j"]
    f = quantization.fixed_length_features(st, sents)
    assert f["input_ids"].shape == (4, 4)
    full = quantization.embed(st, f)
    assert torch.allclose(full.norm(dim=-1), torch.ones(4))
    assert torch.allclose(quantization.embed_batched(st, f, 3), full, atol=1e-6)
    with pytest.raises(CourseError):
        quantization.fixed_length_features(st, [])


def small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 10)
    ).eval()


def test_fold_batchnorm_same_outputs():
    m, x = small_cnn(), torch.rand(3, 1, 8, 8)
    with torch.no_grad():
        m[1].running_mean.uniform_(-1, 1)
        f = quantization.fold_batchnorm(m)
        assert isinstance(f[1], nn.Identity)
        assert torch.allclose(f(x), m(x), atol=1e-5)


def test_accuracy_flag():
    assert quantization.accuracy_flag(0.99, 0.99, 1.0) == "OK"
    assert quantization.accuracy_flag(0.97, 0.99, 1.0).startswith("FLAG")


def test_layer_kind():
    assert quantization.layer_kind("0.model.encoder.layer.3.output.dense") == "output.dense"
    assert quantization.layer_kind("0.model.encoder.layer.3.attention.output.dense") == "attention.output.dense"
    assert quantization.layer_kind("0.model.pooler.dense") == "model.pooler.dense"
    assert quantization.layer_kind("fc") == "fc"
