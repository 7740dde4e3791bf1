"""Quantization helpers for lesson 05: sizes, sentence-embedding accuracy, per-layer sensitivity, PT2E, QAT, torchao.

Four ways to run a model in INT8 on a CPU, each with its own accuracy check:

* PyTorch dynamic INT8 (``torch.ao.quantization.quantize_dynamic``, deprecated but present): Linear weights
  stored as INT8, activations quantized on the fly. :func:`dynamic_int8` wraps it and returns the warning
  text so the lesson can show it. :func:`layer_sensitivity` quantizes one Linear layer at a time to find the
  layers responsible for an accuracy drop; :func:`selective_int8` keeps the worst of them in FP32.
* torchao (``quantize_`` with ``Int8WeightOnlyConfig`` / ``Int8DynamicActivationInt8WeightConfig``):
  :func:`torchao_int8`; fast only under ``torch.compile`` (:func:`compile_inner`).
* Static PTQ with the PT2E flow and the x86 Inductor quantizer (:func:`ptq_pt2e`), calibrated on a
  number of batches you choose.
* Quantization-aware training (:func:`qat_pt2e`): fake-quantized fine-tuning, then the same conversion.
"""

from __future__ import annotations

import copy
import io
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from .errors import CourseError

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


def count_quantized(model: nn.Module) -> int:
    """How many modules ``quantize_dynamic`` replaced (its dynamic quantized Linear modules)."""
    return sum(is_dynamic_quantized_linear(m) for m in model.modules())


# ----------------------------------------------------------------------------- PyTorch dynamic INT8


def dynamic_int8(model: nn.Module, layers: Iterable[str] | None = None) -> tuple[nn.Module, list[str]]:
    """``quantize_dynamic`` on a copy of ``model`` (all Linear layers, or only the named ``layers``).

    Returns the quantized copy and the text of the warnings it raised (its deprecation notice), so the
    lesson can show the learner what PyTorch says about this API.
    """
    spec = {nn.Linear} if layers is None else set(layers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), spec, dtype=torch.qint8)
    msgs = sorted({str(w.message).strip().splitlines()[0] for w in caught})
    return q, msgs


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


def selective_int8(model: nn.Module, quantized: nn.Module, keep_fp32: Iterable[str]) -> nn.Module:
    """A copy of ``model`` with every Linear in INT8 (taken from ``quantized``) except ``keep_fp32``."""
    keep = set(keep_fp32)
    out = copy.deepcopy(model)
    q_mods = dict(quantized.named_modules())
    unknown = keep - set(linear_names(model))
    if unknown:
        raise CourseError(f"keep_fp32 names layers that are not Linear layers of the model: {sorted(unknown)[:3]}")
    swap_modules(out, {n: copy.deepcopy(q_mods[n]) for n in linear_names(model) if n not in keep})
    return out


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


# --------------------------------------------------------------------------------------------- torchao


def torchao_int8(model: nn.Module, kind: str = "dynamic") -> nn.Module:
    """A copy of ``model`` with its Linear layers quantized by torchao: ``"dynamic"`` (INT8 activations and
    weights, ``Int8DynamicActivationInt8WeightConfig``) or ``"weight_only"`` (``Int8WeightOnlyConfig``)."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    configs = {"dynamic": Int8DynamicActivationInt8WeightConfig, "weight_only": Int8WeightOnlyConfig}
    if kind not in configs:
        raise CourseError(f"unknown torchao kind '{kind}': use one of {sorted(configs)}")
    m = copy.deepcopy(model)
    quantize_(m, configs[kind]())
    return m


def compile_inner(st_model, **compile_kwargs) -> None:
    """Compile a SentenceTransformer's inner transformer in place (``st_model[0].auto_model.forward``).

    ``SentenceTransformer.encode`` and ``st_model(features)`` call the inner module directly, so
    ``torch.compile(st_model)`` would return a wrapper that ``encode`` never uses: nothing gets compiled.
    """
    inner = st_model[0].auto_model
    inner.forward = torch.compile(inner.forward, **compile_kwargs)


# ------------------------------------------------------------------------------------- PT2E static PTQ


def _x86_quantizer(is_qat: bool = False):
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    return X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_qat=is_qat))


def ptq_pt2e(model: nn.Module, calib: torch.Tensor, *, batch_size: int = 64, example: torch.Tensor | None = None):
    """Static INT8 PTQ of ``model`` with PT2E and the x86 Inductor quantizer, calibrated on ``calib``.

    ``torch.export`` captures the graph, ``prepare_pt2e`` inserts observers, the calibration images run
    through it (their count is the knob the lesson turns), ``convert_pt2e`` writes quantize/dequantize
    pairs with the observed scales. Run the result eagerly for accuracy; ``torch.compile`` it for speed
    (Inductor then fuses the pairs into INT8 kernels).
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if len(calib) == 0:
        raise CourseError("calibration set is empty: pass at least one input image")
    ex = torch.cat([calib[:1]] * 2) if example is None else example  # batch 2: batch 1 would specialize
    dyn = ({0: torch.export.Dim("batch", min=1, max=4096)},)
    gm = torch.export.export(copy.deepcopy(model).eval(), (ex,), dynamic_shapes=dyn).module()
    prepared = prepare_pt2e(gm, _x86_quantizer())
    with torch.no_grad():
        for i in range(0, len(calib), batch_size):
            prepared(calib[i : i + batch_size])
    return convert_pt2e(prepared)


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


def qat_pt2e(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int = 2, lr: float = 1e-4, batch_size: int = 64,
    seed: int = 0,
):  # fmt: skip
    """Quantization-aware training with PT2E: fake-quantize, fine-tune ``epochs`` on ``(x, y)``, convert to INT8.

    The forward pass sees INT8 rounding while the weights learn to live with it, so accuracy after
    conversion is usually at least as good as PTQ's. BatchNorm is folded into the convs first
    (:func:`fold_batchnorm`).
    """
    from torchao.quantization.pt2e import move_exported_model_to_eval, move_exported_model_to_train
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e

    dyn = ({0: torch.export.Dim("batch", min=1, max=4096)},)
    m = fold_batchnorm(model).train()
    gm = torch.export.export(m, (x[:2],), dynamic_shapes=dyn).module()
    prepared = prepare_qat_pt2e(gm, _x86_quantizer(is_qat=True))
    move_exported_model_to_train(prepared)
    opt = torch.optim.Adam(prepared.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x) - 1, batch_size):
            idx = perm[i : i + batch_size]
            if len(idx) < 2:
                continue
            loss = F.cross_entropy(prepared(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    move_exported_model_to_eval(prepared)
    return convert_pt2e(prepared)


def accuracy_flag(acc: float, baseline: float, threshold_points: float) -> str:
    """ "OK" or a warning string when ``acc`` is more than ``threshold_points`` percentage points below baseline."""
    drop = (baseline - acc) * 100
    return "OK" if drop <= threshold_points else f"FLAG: -{drop:.1f} points (> {threshold_points} allowed)"
