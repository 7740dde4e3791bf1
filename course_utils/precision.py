"""Small helpers for lesson 04 (mixed precision) that the lesson writes out first and the exercises reuse.

Lesson 04 writes the techniques in its own cells: ``torch.autocast`` (weights stay FP32; convolutions and
matmuls run in the low dtype), casting the model (``.to(torch.bfloat16)`` / ``.half()``), the
``channels_last`` layout and the two TF32 switches. What is left here is plumbing the exercise checkers
share: the bytes a model's weights take, and a record of the dtype each layer produced (forward hooks, as
the lesson shows them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .errors import CourseError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def param_bytes(model: nn.Module) -> int:
    """Bytes of all parameters and buffers (what the weights cost in memory)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return int(sum(t.numel() * t.element_size() for t in tensors))


def layer_dtypes(
    model: nn.Module, run: Callable[[], Any], *, types: tuple[type[nn.Module], ...] = (nn.Conv2d, nn.Linear)
) -> list[tuple[str, torch.dtype, torch.dtype]]:
    """Call ``run()`` with forward hooks on ``model``'s layers of ``types``; return (name, input, output dtype).

    ``run`` is whatever executes the model (the learner's autocast function, for example); the hooks see
    the dtypes inside, which the final output alone does not show. Hooks are removed even if ``run`` fails.
    """
    seen: list[tuple[str, torch.dtype, torch.dtype]] = []
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, types):
            hooks.append(
                module.register_forward_hook(
                    lambda mod, inputs, output, name=name: seen.append((name, inputs[0].dtype, output.dtype))
                )
            )
    if not hooks:
        raise CourseError("the model has no layer of the requested types to watch (expected Conv2d or Linear)")
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return seen


def is_channels_last(t: torch.Tensor) -> bool:
    """True when a 4-D tensor is stored in the channels_last (NHWC) layout (and is not trivially both)."""
    return t.ndim == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
