"""Lesson 09 exercises: predict end-to-end throughput; normalize an image with plain tensor arithmetic."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..exercises import exercise
from ..pipeline import IMAGENET_MEAN, IMAGENET_STD


def _check_end_to_end(fn: Callable[[float, float, bool], float]) -> None:
    got = fn(100.0, 400.0, True)
    assert math.isclose(got, 100.0, rel_tol=1e-6), (
        f"overlapped, loader 100 and model 400 img/s: the slower side sets the pace (100), got {got}"
    )
    got = fn(300.0, 100.0, True)
    assert math.isclose(got, 100.0, rel_tol=1e-6), f"overlapped, loader 300 and model 100 img/s: 100, got {got}"
    got = fn(100.0, 100.0, False)
    assert math.isclose(got, 50.0, rel_tol=1e-6), (
        f"taking turns, 100 and 100 img/s: each image costs 1/100 + 1/100 s, so 50 img/s; got {got}"
    )


@exercise(
    "09.end-to-end",
    "Return min(loader, model) when overlapped, else 1 / (1/loader + 1/model).",
    _check_end_to_end,
)
def predict_end_to_end(loader_ips: float, model_ips: float, overlapped: bool) -> float:
    if overlapped:
        return min(loader_ips, model_ips)
    return 1.0 / (1.0 / loader_ips + 1.0 / model_ips)


def _check_normalize(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    import torchvision.transforms.v2.functional as F

    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8, generator=g)
    ref = F.normalize(F.to_dtype(img, torch.float32, scale=True), list(IMAGENET_MEAN), list(IMAGENET_STD))
    out = fn(img)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32, "return a float32 tensor"
    assert out.shape == ref.shape, f"shape should stay {tuple(ref.shape)}, got {tuple(out.shape)}"
    assert torch.allclose(out, ref, atol=1e-5), (
        "values differ: divide by 255 first, then (x - mean) / std with mean and std shaped (3, 1, 1)"
    )


@exercise(
    "09.normalize",
    "Scale uint8 to [0, 1] (divide by 255), then (x - mean) / std per channel (shape (3, 1, 1)).",
    _check_normalize,
)
def to_model_input(img: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN, device=img.device).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=img.device).view(3, 1, 1)
    return (img.float() / 255.0 - mean) / std
