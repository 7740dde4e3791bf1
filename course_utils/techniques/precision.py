"""Small helpers for lesson 04 (mixed precision) that the lesson writes out first and the exercises reuse.

Lesson 04 writes the techniques in its own cells: ``torch.autocast`` (weights stay FP32; convolutions and
matmuls run in the low dtype), casting the model (``.to(torch.bfloat16)`` / ``.half()``), the
``channels_last`` layout and the two TF32 switches. What is left here is plumbing the exercise checkers
share: the bytes a model's weights take and the channels_last test.
"""

from __future__ import annotations

import torch
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def param_bytes(model: nn.Module) -> int:
    """Bytes of all parameters and buffers (what the weights cost in memory)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return int(sum(t.numel() * t.element_size() for t in tensors))


def is_channels_last(t: torch.Tensor) -> bool:
    """True when a 4-D tensor is stored in the channels_last (NHWC) layout (and is not trivially both)."""
    return t.ndim == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()
