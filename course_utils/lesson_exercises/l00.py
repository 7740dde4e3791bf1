"""Lesson 00 exercise: from a GPU's compute capability, decide which reduced precisions run natively."""

from __future__ import annotations

from collections.abc import Callable

from ..exercises import exercise

# Real GPUs, their compute capability and the tensor-core formats they run natively (NVIDIA's datasheets).
GPUS = [
    ("GTX 1080 (Pascal)", (6, 1), set()),
    ("V100 (Volta)", (7, 0), set()),
    ("T4 (Turing)", (7, 5), set()),
    ("A100 (Ampere)", (8, 0), {"tf32", "bf16"}),
    ("A10 / RTX 3090 (Ampere)", (8, 6), {"tf32", "bf16"}),
    ("Jetson AGX Orin (Ampere)", (8, 7), {"tf32", "bf16"}),
    ("L4 / L40S / RTX 4090 (Ada)", (8, 9), {"tf32", "bf16", "fp8"}),
    ("H100 / H200 (Hopper)", (9, 0), {"tf32", "bf16", "fp8"}),
    ("B200 (Blackwell)", (10, 0), {"tf32", "bf16", "fp8"}),
    ("RTX 5090 (Blackwell)", (12, 0), {"tf32", "bf16", "fp8"}),
    ("no GPU", None, set()),
]


def _check_precisions(fn: Callable[[tuple[int, int] | None], set[str]]) -> None:
    import torch

    try:
        none = fn(None)
    except (TypeError, AttributeError) as exc:
        raise AssertionError(f"will_run(None) failed ({exc}): None means no GPU; return an empty set") from exc
    assert not none, f"will_run(None) returned {none!r}: without a GPU nothing runs, return an empty set"
    for name, cap, want in GPUS:
        got = fn(cap)
        assert isinstance(got, set | frozenset), f"return a set of names, e.g. {{'tf32', 'bf16'}} (got {got!r})"
        got = {str(g).lower() for g in got}
        assert got == want, (
            f"{name}, capability {cap}: expected {sorted(want) or 'nothing'}, got {sorted(got) or 'nothing'}. "
            "Compare the capability as a (major, minor) tuple: (8, 6) is newer than (8, 0), older than (8, 9)"
        )
    here = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None
    print(f"On this machine (capability {here}): {sorted(fn(here)) or 'no TF32/BF16/FP8 on a GPU'}.")


@exercise(
    "00.precisions",
    "will_run(capability) -> set of 'tf32', 'bf16', 'fp8' that run natively: TF32 and BF16 from (8, 0), "
    "FP8 from (8, 9); None (no GPU) gives an empty set.",
    _check_precisions,
)
def will_run(capability: tuple[int, int] | None) -> set[str]:
    if capability is None:
        return set()
    out = set()
    if tuple(capability) >= (8, 0):
        out |= {"tf32", "bf16"}
    if tuple(capability) >= (8, 9):
        out.add("fp8")
    return out
