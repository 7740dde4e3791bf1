"""Quantization plumbing for lesson 05: sizes, sentence-embedding accuracy, per-layer sensitivity.

The techniques themselves (``quantize_dynamic``, torchao ``quantize_``, the PT2E steps, QAT) are written out
in the lesson's cells. What stays here is what the lesson measures with and what is no lesson's subject:

* sizes: :func:`state_dict_bytes`, :func:`linear_weight_bytes` (FP32, ``quantize_dynamic`` and torchao alike);
* sentence embeddings (MiniLM): :func:`fixed_length_features`, :func:`embed`, :func:`mean_cosine`,
  :func:`neighbour_agreement`;
* the optional per-layer sensitivity search: :func:`layer_sensitivity`, :func:`greedy_keep_fp32`;
* :func:`fold_batchnorm` before QAT, and :func:`accuracy_flag`.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.supply.errors import CourseError

# --------------------------------------------------------------------------------------------- sizes


def state_dict_bytes(model: nn.Module) -> int:
    """Size in bytes of ``torch.save(model.state_dict())``: the model's size on disk."""
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getbuffer().nbytes


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor stores, looking inside quantized tensors and tensor subclasses (torchao)."""
    if hasattr(t, "__tensor_flatten__") and type(t) not in (torch.Tensor, nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    if t.is_quantized:
        scales = 8 if t.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric) else (
            t.q_per_channel_scales().numel() * 8 + t.q_per_channel_zero_points().numel() * 8)  # fmt: skip
        return t.int_repr().numel() * t.element_size() + scales
    return t.numel() * t.element_size()


def is_dynamic_quantized_linear(mod: nn.Module) -> bool:
    """True for the Linear replacement that ``quantize_dynamic`` inserts."""
    return type(mod).__module__.startswith("torch.ao.nn.quantized") and type(mod).__name__ == "Linear"


def linear_weight_bytes(model: nn.Module) -> int:
    """Bytes of all Linear layers' weights (including quantization scales), FP32, INT8 or torchao alike."""
    total = 0
    for mod in model.modules():
        if is_dynamic_quantized_linear(mod):
            w, _ = mod._packed_params._weight_bias()
            total += tensor_bytes(w)
        elif isinstance(mod, nn.Linear):
            total += tensor_bytes(mod.weight)
    return total


def linear_names(model: nn.Module) -> list[str]:
    """Qualified names of every ``nn.Linear`` in ``model``."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


# ------------------------------------------------------------------ per-layer sensitivity (optional)


def _get_parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, attr = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), attr


def swap_modules(model: nn.Module, replacements: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """Replace submodules of ``model`` in place by name; return the originals (swap them back to undo)."""
    old = {}
    for name, new in replacements.items():
        parent, attr = _get_parent(model, name)
        old[name] = getattr(parent, attr)
        setattr(parent, attr, new)
    return old


@dataclass
class Sensitivity:
    """Per-layer result of :func:`layer_sensitivity`: cosine to FP32 with only that layer in INT8."""

    table: pd.DataFrame
    baseline_cosine: float = 1.0
    notes: list[str] = field(default_factory=list)

    def worst(self, n: int) -> list[str]:
        """The ``n`` layers whose quantization costs the most cosine."""
        return list(self.table.sort_values("cosine").head(n)["layer"])


def layer_sensitivity(
    model: nn.Module, quantized: nn.Module, score: Callable[[nn.Module], float], layers: Sequence[str] | None = None
) -> Sensitivity:
    """Quantize one Linear layer at a time and score the model (e.g. mean embedding cosine vs FP32).

    ``quantized`` is ``model`` with every Linear already quantized (from :func:`dynamic_int8`); each layer's
    INT8 module is swapped into ``model`` in place, scored, and swapped back, so no copy of the model is made
    per layer. Returns a table sorted by layer name with the cosine and the drop ``1 - cosine``.
    """
    names = list(layers) if layers is not None else linear_names(model)
    if not names:
        raise CourseError("no Linear layers to measure: pass a model with nn.Linear modules")
    q_mods = dict(quantized.named_modules())
    rows = []
    for name in names:
        if name not in q_mods:
            raise CourseError(f"layer '{name}' is not in the quantized model: quantize the same model first")
        old = swap_modules(model, {name: q_mods[name]})
        try:
            s = score(model)
        finally:
            swap_modules(model, old)
        rows.append({"layer": name, "kind": layer_kind(name), "cosine": s, "drop": 1.0 - s})
    return Sensitivity(pd.DataFrame(rows))


def layer_kind(name: str) -> str:
    """The part of a layer name after its last numeric index: ``encoder.layer.3.output.dense`` -> ``output.dense``.

    Groups the same layer of every transformer block (``attention.output.dense`` stays distinct from the
    feed-forward ``output.dense``).
    """
    parts = name.split(".")
    idx = [i for i, p in enumerate(parts) if p.isdigit()]
    return ".".join(parts[idx[-1] + 1 :]) if idx and idx[-1] < len(parts) - 1 else name


def greedy_keep_fp32(
    model: nn.Module,
    quantized: nn.Module,
    sensitivity: Sensitivity,
    score: Callable[[nn.Module], float],
    target: float = 0.99,
    max_keep: int | None = None,
) -> tuple[list[str], pd.DataFrame]:
    """Keep the most sensitive layers in FP32, one at a time, until ``score`` reaches ``target``.

    Works on one copy of ``quantized``, swapping the FP32 originals back in one by one (cheap even for a
    large model). Returns the kept layer names and the path taken (layers kept so far vs score), so the
    lesson can show how many layers had to stay in FP32 to recover the accuracy.
    """
    order = list(sensitivity.table.sort_values("cosine")["layer"])
    max_keep = len(order) if max_keep is None else max_keep
    fp32 = dict(model.named_modules())
    work = copy.deepcopy(quantized)
    keep: list[str] = []
    path = []
    while True:
        s = score(work)
        path.append({"kept in fp32": len(keep), "last kept": keep[-1] if keep else "-", "cosine": s})
        if s >= target or len(keep) >= min(max_keep, len(order)):
            break
        name = order[len(keep)]
        swap_modules(work, {name: copy.deepcopy(fp32[name])})
        keep.append(name)
    return keep, pd.DataFrame(path)


# ------------------------------------------------------------------------- sentence embeddings (MiniLM)


def fixed_length_features(st_model, sentences: Sequence[str], length: int | None = None) -> dict[str, torch.Tensor]:
    """Tokenize ``sentences`` for a SentenceTransformer, padded to one fixed ``length`` (default: the longest).

    A fixed shape means ``torch.compile`` compiles once; mean pooling uses the attention mask, so padding
    does not change the embeddings.
    """
    if not sentences:
        raise CourseError("no sentences to tokenize: pass a non-empty list")
    tok = st_model.tokenizer
    if length is None:
        length = max(len(ids) for ids in tok(list(sentences))["input_ids"])
    enc = tok(list(sentences), padding="max_length", max_length=length, truncation=True, return_tensors="pt")
    return dict(enc)


def embed(st_model, features: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sentence embeddings (normalized rows) from pre-tokenized ``features``, under ``inference_mode``."""
    with torch.inference_mode():
        out = st_model(dict(features))["sentence_embedding"]
    return F.normalize(out.float(), dim=-1)


def embed_batched(st_model, features: dict[str, torch.Tensor], batch_size: int) -> torch.Tensor:
    """:func:`embed` in chunks of ``batch_size`` rows; the last chunk is padded by repetition to a full batch."""
    n = len(features["input_ids"])
    outs = []
    for i in range(0, n, batch_size):
        idx = torch.arange(i, i + batch_size) % n
        chunk = {k: v[idx] for k, v in features.items()}
        outs.append(embed(st_model, chunk)[: min(batch_size, n - i)])
    return torch.cat(outs)


def mean_cosine(emb: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean row-wise cosine similarity between two embedding matrices."""
    return float(F.cosine_similarity(emb.float(), ref.float(), dim=-1).mean())


def neighbour_agreement(emb: torch.Tensor, ref: torch.Tensor, k: int = 3) -> dict[str, float]:
    """How well ``emb`` preserves ``ref``'s nearest-neighbour rankings (self excluded).

    ``top1``: fraction of sentences whose nearest neighbour is the same; ``topk_overlap``: mean overlap of
    the k-nearest sets (1.0 = identical sets).
    """
    if emb.shape != ref.shape or emb.shape[0] <= k:
        raise CourseError(f"need two embedding matrices of the same shape with more than k={k} rows")

    def knn(e: torch.Tensor) -> torch.Tensor:
        e = F.normalize(e.float(), dim=-1)
        sim = e @ e.T
        sim.fill_diagonal_(-float("inf"))
        return sim.topk(k, dim=-1).indices

    a, b = knn(emb), knn(ref)
    top1 = float((a[:, 0] == b[:, 0]).float().mean())
    overlap = sum(len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a, b, strict=True)) / (k * len(a))
    return {"top1": top1, "topk_overlap": overlap}


# ------------------------------------------------------------------------------ PT2E and accuracy


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every ``Conv2d`` directly followed by ``BatchNorm2d`` (in a Sequential) fused.

    Inference folds BatchNorm into the conv anyway. Doing it before QAT also saves minutes: torchao's QAT
    convert otherwise exports dozens of conv-BN pattern graphs to find and fold them.
    """
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    m = copy.deepcopy(model).eval()
    for seq in [mod for mod in m.modules() if isinstance(mod, nn.Sequential)]:
        for i in range(len(seq) - 1):
            if isinstance(seq[i], nn.Conv2d) and isinstance(seq[i + 1], nn.BatchNorm2d):
                seq[i] = fuse_conv_bn_eval(seq[i], seq[i + 1])
                seq[i + 1] = nn.Identity()
    return m


def accuracy_flag(acc: float, baseline: float, threshold_points: float) -> str:
    """ "OK" or a warning string when ``acc`` is more than ``threshold_points`` percentage points below baseline."""
    drop = (baseline - acc) * 100
    return "OK" if drop <= threshold_points else f"FLAG: -{drop:.1f} points (> {threshold_points} allowed)"
