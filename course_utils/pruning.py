"""Pruning and distillation for the digits CNN (lesson 12).

* Unstructured magnitude pruning (:func:`magnitude_prune`) zeroes the smallest weights with
  ``torch.nn.utils.prune``. The tensors keep their shape, so dense kernels do exactly the same work.
* Structured pruning (:func:`channel_prune_cnn`) removes whole convolution channels and rebuilds smaller
  layers: fewer FLOPs, a real speed-up, and a short fine-tune (:func:`train`) recovers accuracy.
* Distillation (:func:`distill`) trains a small student on the teacher's softened outputs plus the labels.
"""

from __future__ import annotations

import copy

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import prune

from .errors import CourseError
from .models import DigitsCNN

PRUNABLE = (nn.Conv2d, nn.Linear)


def magnitude_prune(model: nn.Module, amount: float, *, make_permanent: bool = True) -> nn.Module:
    """A copy of ``model`` with the fraction ``amount`` of its Conv/Linear weights (smallest |w|, global) zeroed.

    Uses ``prune.global_unstructured`` with L1 magnitude across all Conv2d/Linear weights. With
    ``make_permanent`` the masks are folded into the weights (``prune.remove``), leaving ordinary dense
    tensors that happen to contain zeros.
    """
    if not 0.0 <= amount < 1.0:
        raise CourseError(f"amount must be in [0, 1) (the fraction of weights to zero), got {amount}")
    m = copy.deepcopy(model)
    params = [(mod, "weight") for mod in m.modules() if isinstance(mod, PRUNABLE)]
    if not params:
        raise CourseError("the model has no Conv2d or Linear layers to prune")
    if amount > 0:
        prune.global_unstructured(params, pruning_method=prune.L1Unstructured, amount=amount)
        if make_permanent:
            for mod, name in params:
                prune.remove(mod, name)
    return m


def sparsity_report(model: nn.Module) -> pd.DataFrame:
    """Per Conv/Linear layer: weight count, zeros and sparsity, plus a ``total`` row."""
    rows = []
    for name, mod in model.named_modules():
        if isinstance(mod, PRUNABLE):
            w = mod.weight.detach()
            rows.append({"layer": name, "weights": w.numel(), "zeros": int((w == 0).sum())})
    df = pd.DataFrame(rows)
    df.loc[len(df)] = {"layer": "total", "weights": df["weights"].sum(), "zeros": df["zeros"].sum()}
    df["sparsity"] = df["zeros"] / df["weights"]
    return df


def _keep_idx(weight: torch.Tensor, keep: int) -> torch.Tensor:
    """Indices of the ``keep`` output channels with the largest L1 norm, in their original order."""
    norms = weight.detach().abs().flatten(1).sum(1)
    return norms.topk(keep).indices.sort().values


def channel_prune_cnn(model: DigitsCNN, keep_fraction: float) -> DigitsCNN:
    """A smaller :class:`DigitsCNN` keeping ``keep_fraction`` of each conv layer's channels (and hidden units).

    Channels are ranked by the L1 norm of their filters; the kept filters, their BatchNorm statistics, the
    matching input channels of the next conv and the matching columns of the first Linear layer are copied
    into freshly built, smaller layers. The result is an ordinary dense model with fewer FLOPs; fine-tune it.
    """
    if not isinstance(model, DigitsCNN):
        raise CourseError("channel_prune_cnn rebuilds a course_utils.models.DigitsCNN; got " + type(model).__name__)
    if not 0.0 < keep_fraction <= 1.0:
        raise CourseError(f"keep_fraction must be in (0, 1], got {keep_fraction}")
    f = model.features
    convs, bns = [f[0], f[3], f[7]], [f[1], f[4], f[8]]
    fc1, fc2 = model.classifier[1], model.classifier[3]
    widths = [max(1, round(c.out_channels * keep_fraction)) for c in convs]
    hidden = max(1, round(fc1.out_features * keep_fraction))
    small = DigitsCNN(*widths, hidden=hidden)
    sf = small.features
    new_convs, new_bns = [sf[0], sf[3], sf[7]], [sf[1], sf[4], sf[8]]
    prev = torch.arange(1)
    with torch.no_grad():
        for conv, bn, nconv, nbn, k in zip(convs, bns, new_convs, new_bns, widths, strict=True):
            idx = _keep_idx(conv.weight, k)
            nconv.weight.copy_(conv.weight[idx][:, prev])
            nconv.bias.copy_(conv.bias[idx])
            for attr in ("weight", "bias", "running_mean", "running_var"):
                getattr(nbn, attr).copy_(getattr(bn, attr)[idx])
            prev = idx
        spatial = fc1.in_features // convs[-1].out_channels  # 4 positions per channel after two 2x pools
        cols = (prev[:, None] * spatial + torch.arange(spatial)[None, :]).flatten()
        hid = _keep_idx(fc1.weight, hidden)
        small.classifier[1].weight.copy_(fc1.weight[hid][:, cols])
        small.classifier[1].bias.copy_(fc1.bias[hid])
        small.classifier[3].weight.copy_(fc2.weight[:, hid])
        small.classifier[3].bias.copy_(fc2.bias)
    return small.eval()


def count_params(model: nn.Module) -> int:
    """Number of parameters."""
    return sum(p.numel() for p in model.parameters())


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor, *, temperature: float = 4.0,
    alpha: float = 0.7,
) -> torch.Tensor:  # fmt: skip
    """Hinton-style loss: ``alpha * T^2 * KL(soft teacher || soft student) + (1 - alpha) * CE(labels)``.

    Softening both distributions with temperature ``T`` exposes the teacher's "dark knowledge" (how similar
    the wrong classes look); the ``T^2`` factor keeps the soft term's gradients on the scale of the hard one.
    """
    if temperature <= 0:
        raise CourseError(f"temperature must be positive, got {temperature}")
    soft = F.kl_div(
        F.log_softmax(student_logits / temperature, -1), F.softmax(teacher_logits / temperature, -1),
        reduction="batchmean",
    ) * temperature**2  # fmt: skip
    return alpha * soft + (1 - alpha) * F.cross_entropy(student_logits, labels)


def train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int = 5,
    lr: float = 2e-3,
    batch_size: int = 64,
    teacher: nn.Module | None = None,
    temperature: float = 4.0,
    alpha: float = 0.7,
    seed: int = 0,
) -> nn.Module:
    """Train ``model`` in place (Adam) on labels, or distil from ``teacher`` when one is given; return it in eval mode.

    Used for the short fine-tune after structured pruning and for the student runs. Seeded, so the
    labels-only and distilled students see the same batches in the same order.
    """
    if epochs < 0:
        raise CourseError(f"epochs must be >= 0, got {epochs}")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    if teacher is not None:
        teacher.eval()
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), batch_size):
            idx = perm[i : i + batch_size]
            logits = model(x[idx])
            if teacher is None:
                loss = F.cross_entropy(logits, y[idx])
            else:
                with torch.no_grad():
                    t_logits = teacher(x[idx])
                loss = distillation_loss(logits, t_logits, y[idx], temperature=temperature, alpha=alpha)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


def distill(student: nn.Module, teacher: nn.Module, x: torch.Tensor, y: torch.Tensor, **kw) -> nn.Module:
    """Train ``student`` from ``teacher``'s soft targets plus labels (see :func:`distillation_loss`)."""
    return train(student, x, y, teacher=teacher, **kw)
