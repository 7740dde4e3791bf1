"""Pruning and distillation for the digits CNN (lesson 12).

The lesson writes the techniques out in its cells (``prune.*``, the channel rebuild of one layer, the
distillation loss); this module keeps what it reuses afterwards:

* :func:`sparsity_report`: zeros per Conv/Linear layer;
* :func:`channel_prune_cnn`: the channel rebuild the lesson wrote for one layer, applied to every layer of
  the digits CNN (fewer FLOPs, a real speed-up; fine-tune it afterwards);
* :func:`train`: the short training loop for fine-tunes and students (labels, or a teacher and a loss).
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.supply.errors import CourseError
from course_utils.supply.models import DigitsCNN

PRUNABLE = (nn.Conv2d, nn.Linear)


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
        raise CourseError(
            "channel_prune_cnn rebuilds a course_utils.supply.models.DigitsCNN; got " + type(model).__name__
        )
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


def train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int = 5,
    lr: float = 2e-3,
    batch_size: int = 64,
    teacher: nn.Module | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    seed: int = 0,
) -> nn.Module:
    """Train ``model`` in place (Adam) and return it in eval mode: on labels, or from ``teacher`` with ``loss_fn``.

    Labels only: cross-entropy. With a ``teacher``, each batch's loss is ``loss_fn(student_logits,
    teacher_logits, labels)`` (lesson 12 writes its distillation loss and passes it here). Seeded, so the
    labels-only and distilled students see the same batches in the same order.
    """
    if epochs < 0:
        raise CourseError(f"epochs must be >= 0, got {epochs}")
    if teacher is not None and loss_fn is None:
        raise CourseError("distilling needs loss_fn(student_logits, teacher_logits, labels): pass the lesson's loss")
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
                loss = loss_fn(logits, t_logits, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()
