"""The rehearsal's torch function mode: "cuda" placement (``.to("cuda")``, ``.cuda()``, factories with
``device="cuda"``) makes stand-in tensors; pinning makes pinned host tensors (:mod:`.memory`);
``F.scaled_dot_product_attention`` on stand-in tensors takes the backend CUDA would (:mod:`.kernels`); the rest runs
unchanged. Installed by :func:`fakegpu.standins.rehearsal.activate`."""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from fakegpu.standins import kernels, memory
from fakegpu.standins.copies import to_device
from fakegpu.standins.issue import order, place
from fakegpu.standins.tensor import RehearsalError, Rehearsed, check_index, is_pinned, wrap

_FACTORIES = {"empty", "zeros", "ones", "full", "rand", "randn", "randint", "randperm", "arange", "linspace", "eye",
              "tensor", "as_tensor", "empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
              "randn_like", "randint_like", "empty_strided", "new_empty", "new_zeros", "new_ones", "new_full",
              "new_tensor", "logspace", "scalar_tensor"}  # fmt: skip


def _is_cuda(device: Any, what: str) -> bool:
    if device is None:
        return False
    check_index(device, what)
    if isinstance(device, int):
        return True
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


class CudaMode(TorchFunctionMode):
    """Maps "cuda" placement to the stand-in; everything else runs unchanged."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor):
            target = next((a for a in args[1:] if isinstance(a, torch.Tensor)), None)
            device, dtype, non_blocking, fmt = torch._C._nn._parse_to(
                *args[1:], **{k: v for k, v in kwargs.items() if k != "copy"}
            )
            if target is not None:
                device, dtype = target.device, target.dtype
            if _is_cuda(device, "Tensor.to"):
                src = args[0]
                if isinstance(src, Rehearsed):
                    out = src.to(dtype) if dtype is not None else (src.clone() if kwargs.get("copy") else src)
                else:
                    out = to_device(src, bool(non_blocking), dtype=dtype)
                return out.contiguous(memory_format=fmt) if fmt is not None else out
            return func(*args, **kwargs)
        if func is torch.Tensor.cuda and args:
            check_index(args[1] if len(args) > 1 else kwargs.get("device"), "Tensor.cuda")
            fmt = kwargs.get("memory_format")
            out = args[0] if isinstance(args[0], Rehearsed) else to_device(args[0], bool(kwargs.get("non_blocking")))
            return out.contiguous(memory_format=fmt) if fmt is not None else out
        if name == "scaled_dot_product_attention" and any(
            isinstance(t, Rehearsed) for t in tree_flatten((args, kwargs))[0]
        ):
            return kernels.sdpa(func, args, kwargs)  # CUDA's backend choice (or its "No available kernel")
        if func is torch.Tensor.pin_memory and args and not isinstance(args[0], Rehearsed):
            return memory.pin(args[0])
        if func is torch.Tensor.is_pinned and args and not isinstance(args[0], Rehearsed):
            return is_pinned(args[0])
        if name in {"backward", "grad"} and any(isinstance(t, Rehearsed) for t in tree_flatten((args, kwargs))[0]):
            raise RehearsalError("training (autograd) on the stand-in GPU is not modelled by the rehearsal")
        if name in _FACTORIES and _is_cuda(kwargs.get("device"), f"torch.{name}"):
            kwargs = dict(kwargs, device="cpu")
            kwargs.pop("pin_memory", None)
            args = tree_map(lambda t: t.elem if isinstance(t, Rehearsed) else t, args)
            return tree_map(lambda t: _fresh(t, name) if isinstance(t, torch.Tensor) else t, func(*args, **kwargs))
        if name in _FACTORIES and kwargs.get("pin_memory"):  # a pinned host tensor
            out = func(*args, **{k: v for k, v in kwargs.items() if k != "pin_memory"})
            return memory.pin(out)
        return func(*args, **kwargs)


def _fresh(t: torch.Tensor, op: str) -> Rehearsed:
    """A tensor a factory made on the stand-in: its values exist now (the kernel's cost is on the clock)."""
    out = wrap(t)
    order(f"torch.{op}(device='cuda')", op, set(), set(), {t.untyped_storage().data_ptr()})
    place("compute", 5e-6 + t.numel() * t.element_size() / 40e9)
    return out


def pin_batch(data: Any, device: Any = None) -> Any:
    """DataLoader's pin-memory thread on the stand-in: pinned copies (tensors, lists, tuples, dicts)."""
    if isinstance(data, torch.Tensor):
        return memory.pin(data)
    if isinstance(data, dict):
        return {k: pin_batch(v) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(pin_batch(v) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(pin_batch(v) for v in data)
    return data
