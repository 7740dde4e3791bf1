"""Lesson 12 exercises: measuring sparsity and softening targets."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..exercises import exercise


def _check_sparsity(fn: Callable[[nn.Module], float]) -> None:
    m = nn.Sequential(nn.Conv2d(1, 2, 1, bias=False), nn.Flatten(), nn.Linear(2, 2, bias=False), nn.ReLU())
    with torch.no_grad():
        m[0].weight.copy_(torch.tensor([0.0, 1.0]).reshape(2, 1, 1, 1))
        m[2].weight.copy_(torch.tensor([[0.0, 0.0], [0.0, 3.0]]))
    got = float(fn(m))
    assert abs(got - 4 / 6) < 1e-6, f"4 of the 6 weights are zero: expected {4 / 6:.4f}, got {got}"
    with torch.no_grad():
        m[0].weight.fill_(1.0)
        m[2].weight.fill_(1.0)
    assert abs(float(fn(m))) < 1e-6, "no zeros: expected 0.0"


@exercise("12.sparsity", "Fraction of zeros among all Conv2d and Linear weights.", _check_sparsity)
def sparsity(model: nn.Module) -> float:
    ws = [m.weight for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    return float(sum(int((w == 0).sum()) for w in ws) / sum(w.numel() for w in ws))


def _check_soft(fn: Callable[[torch.Tensor, float], torch.Tensor]) -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    out = fn(logits, 2.0)
    assert torch.allclose(out, torch.softmax(logits / 2.0, -1), atol=1e-6), "expected softmax(logits / T) per row"
    assert torch.allclose(out.sum(-1), torch.ones(2)), "each row must sum to 1"
    assert fn(logits, 10.0)[0].max() < fn(logits, 1.0)[0].max(), "a larger T should give a flatter distribution"


@exercise("12.soft-targets", "Return softmax(logits / T) along the last dimension.", _check_soft)
def soft_targets(logits: torch.Tensor, T: float) -> torch.Tensor:
    return torch.softmax(logits / T, dim=-1)
