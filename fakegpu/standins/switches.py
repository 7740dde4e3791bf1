"""Process-wide switches a GPU section may change: read when it is entered, compared when its cell ends.

TF32 (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``,
``torch.set_float32_matmul_precision``), cuDNN's ``benchmark``/``deterministic``/``enabled``, reduced-precision
reductions, the SDPA backends, deterministic algorithms, the default dtype and grad mode hold for the rest of the
process: a section that turns one on and does not restore it changes every later measurement and comparison, in
this lesson and in the next one a kernel runs. The rehearsal fails such a section, naming the switch and the
values (restore it in a ``finally``, as lesson 03's ``cudnn_benchmark_effect`` does).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fakegpu.standins.tensor import STATE, RehearsalError

READERS: dict[str, Callable[[], object]] = {
    "torch.backends.cuda.matmul.allow_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
    "torch.backends.cudnn.allow_tf32": lambda: torch.backends.cudnn.allow_tf32,
    "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision,
    "torch.backends.cudnn.benchmark": lambda: torch.backends.cudnn.benchmark,
    "torch.backends.cudnn.deterministic": lambda: torch.backends.cudnn.deterministic,
    "torch.backends.cudnn.enabled": lambda: torch.backends.cudnn.enabled,
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": (
        lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
    ),
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": (
        lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    ),
    "torch.backends.cuda.flash_sdp_enabled()": torch.backends.cuda.flash_sdp_enabled,
    "torch.backends.cuda.mem_efficient_sdp_enabled()": torch.backends.cuda.mem_efficient_sdp_enabled,
    "torch.backends.cuda.math_sdp_enabled()": torch.backends.cuda.math_sdp_enabled,
    "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled,
    "torch.get_default_dtype()": torch.get_default_dtype,
    "torch.is_grad_enabled()": torch.is_grad_enabled,
}


def _read(read: Callable[[], object]) -> object:
    """A switch's value; a legacy TF32 switch read after torch's newer ``fp32_precision`` API was mixed in raises
    (torch refuses to answer): then that state is the value."""
    try:
        return read()
    except RuntimeError:
        return f"fp32_precision matmul={torch.backends.cuda.matmul.fp32_precision!r}, conv=" + repr(
            torch.backends.cudnn.conv.fp32_precision
        )


def snapshot() -> dict[str, object]:
    """The value of every switch now."""
    return {name: _read(read) for name, read in READERS.items()}


def changed(before: dict[str, object]) -> list[str]:
    """'name: before -> now' for every switch that differs from ``before``."""
    now = snapshot()
    return [f"{name} = {now[name]!r} (it was {value!r})" for name, value in before.items() if now.get(name) != value]


def check(section: str, before: dict[str, object]) -> None:
    """Raise when ``section`` left a switch changed (counted as a switch check either way)."""
    STATE.count("global switches compared")
    left = changed(before)
    if left:
        STATE.count("switches left changed")
        raise RehearsalError(
            f"GPU section '{section}' left {'; '.join(left)} when its cell ended: the switch holds for the rest of "
            "the process, so every later measurement and comparison runs with it. Restore it (save the old value, "
            "set it back in a `finally:`) (rehearsal stand-in)"
        )
