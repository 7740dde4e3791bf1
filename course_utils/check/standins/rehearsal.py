"""Rehearsal mode (``COURSE_REHEARSE=1``): GPU-only sections executed on a CPU machine, on checked stand-ins.

On a machine without CUDA, :func:`course_utils.supply.modes.gpu_section` then returns True and calls
:func:`activate`: until the cell ends (:func:`deactivate`, called by the cell runner or the IPython hook),
"cuda" means the stand-in GPU of :mod:`course_utils.check.standins`:

* ``torch.cuda.*`` answers for an sm_90 stand-in (streams, events, graphs, memory counters);
* ``.cuda()``, ``.to("cuda")``, ``Module.to("cuda")`` and factories with ``device="cuda"`` make
  :class:`~course_utils.check.standins.tensor.Rehearsed` tensors (placement, stream order and capture rules checked);
* ``onnxruntime.InferenceSession`` with the CUDA provider, ``tensorrt`` (the fake from TensorRT 11.1's
  bindings, device pointers and stream order checked) and torchcodec's ``decode_jpeg(device="cuda")`` have
  stand-ins; ``torch.onnx.export`` of a stand-in model exports its CPU weights;
* what cannot run there (``torch.compile`` on CUDA, autograd, the allocator's history) raises
  :class:`NotRehearsable`: the section is recorded "not rehearsable: <reason>", not failed.

:func:`checks` reports what the stand-ins enforced (counts), which the section record keeps.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

from course_utils.check.standins import cuda as scuda
from course_utils.check.standins import packages
from course_utils.check.standins.cuda import NotRehearsable
from course_utils.check.standins.streams import MODEL
from course_utils.check.standins.tensor import STATE, RehearsalError, Rehearsed, to_standin, wrap

__all__ = ["NotRehearsable", "RehearsalError", "activate", "active", "checks", "deactivate", "no_real_gpu"]

_ACTIVE: dict[str, Any] = {}
# Sections whose point is what only the hardware or other processes can show; the body is not run on the stand-in.
NOT_REHEARSABLE = {
    "10.concurrent-kernels": "it measures whether the GPU runs kernels of two streams side by side; the stand-in "
    "runs each kernel when it is issued",
    "11.expandable-segments": "it starts fresh Python processes that allocate CUDA memory themselves; the stand-in "
    "lives in this process only",
    "13.serve-gpu": "the LitServe server's worker processes would need the GPU; the stand-in lives in this "
    "process only",
    "15.gpu-int4": "torchao's INT4 tile-packed format packs weights with a CUDA-only kernel "
    "(aten._convert_weight_to_int4pack for tinygemm); the stand-in has no CPU equivalent",
}
MEMORY_MIB = 1024  # the stand-in GPU's memory (small, so that OOM sweeps stop early on a CPU)
_PROVIDED = {"tensorrt"}  # packages the rehearsal provides stand-ins for (checked by gpu_section's needs=)
_FACTORIES = {"empty", "zeros", "ones", "full", "rand", "randn", "randint", "randperm", "arange", "linspace", "eye",
              "tensor", "as_tensor", "empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
              "randn_like", "randint_like", "empty_strided", "new_empty", "new_zeros", "new_ones", "new_full",
              "new_tensor", "logspace", "scalar_tensor"}  # fmt: skip


def no_real_gpu() -> bool:
    """True when this machine has no real CUDA GPU (asked of torch's own function, even while the stand-ins
    answer ``torch.cuda.is_available()``). COURSE_REHEARSE is read by :func:`course_utils.supply.modes.rehearsing`."""
    return not _REAL["is_available"]()


def active() -> bool:
    return bool(_ACTIVE)


def provided(module: str) -> bool:
    return module in _PROVIDED


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, int):
        return True
    try:
        return torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def _has_standin(obj: Any) -> bool:
    return any(isinstance(t, Rehearsed) for t in tree_flatten(obj)[0])


class _CudaMode(TorchFunctionMode):
    """Maps "cuda" placement to the stand-in; everything else runs unchanged."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor):
            target = next((a for a in args[1:] if isinstance(a, torch.Tensor)), None)
            device, dtype, _, fmt = torch._C._nn._parse_to(
                *args[1:], **{k: v for k, v in kwargs.items() if k != "copy"}
            )
            if target is not None:
                device, dtype = target.device, target.dtype
            if _is_cuda(device):
                out = to_standin(args[0], dtype, copy=bool(kwargs.get("copy")))
                return out.contiguous(memory_format=fmt) if fmt is not None else out
            return func(*args, **kwargs)
        if func is torch.Tensor.cuda and args:
            fmt = kwargs.get("memory_format")
            out = to_standin(args[0])
            return out.contiguous(memory_format=fmt) if fmt is not None else out
        if func is torch.Tensor.pin_memory and args and not isinstance(args[0], Rehearsed):
            STATE.count("pinned host buffers")
            out = args[0].clone()
            out._rehearsal_pinned = True
            return out
        if func is torch.Tensor.is_pinned and args and not isinstance(args[0], Rehearsed):
            return bool(getattr(args[0], "_rehearsal_pinned", False))
        if name in {"backward", "grad"} and _has_standin((args, kwargs)):
            raise NotRehearsable("autograd on the stand-in GPU would call the CUDA runtime (training is not rehearsed)")
        if name in _FACTORIES and _is_cuda(kwargs.get("device")):
            kwargs = dict(kwargs, device="cpu")
            kwargs.pop("pin_memory", None)
            args = tree_map(lambda t: t.elem if isinstance(t, Rehearsed) else t, args)
            out = func(*args, **kwargs)
            return tree_map(lambda t: _fresh(t, name) if isinstance(t, torch.Tensor) else t, out)
        return func(*args, **kwargs)


def _fresh(t: torch.Tensor, op: str) -> Rehearsed:
    out = wrap(t)
    k = t.untyped_storage().data_ptr()
    MODEL.made(k, MODEL.current)
    MODEL.use(k, f"torch.{op}(device='cuda')", True, MODEL.current, MODEL.current.tick())
    return out


def _pin_batch(data: Any, device: Any = None) -> Any:
    """DataLoader's pin-memory thread on the stand-in: a copy marked pinned (tensors, lists, tuples, dicts)."""
    if isinstance(data, torch.Tensor):
        STATE.count("pinned host buffers")
        out = data.clone()
        out._rehearsal_pinned = True
        return out
    if isinstance(data, dict):
        return {k: _pin_batch(v) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_pin_batch(v) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_pin_batch(v) for v in data)
    return data


def _compile(*args: Any, **kwargs: Any) -> Any:
    raise NotRehearsable("torch.compile/Inductor generates CUDA kernels (Triton): the CPU stand-in cannot run them")


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Within the block the stand-ins are off (real ``torch.cuda``, no mode); they come back after it."""
    patches, mode = _ACTIVE.get("patches", []), _ACTIVE.get("mode")
    if mode is not None:
        mode.__exit__(None, None, None)
    saved = [(owner, name, getattr(owner, name, None)) for owner, name, _, _ in patches]
    for owner, name, value, existed in reversed(patches):
        if existed:
            setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        if mode is not None:
            mode.__enter__()


def _real_cuda() -> bool:
    """Does this machine have a real CUDA GPU? (asked of torch's C layer: torch.cuda.is_available may be patched)"""
    count = getattr(torch._C, "_cuda_getDeviceCount", None)
    return bool(count and count() > 0)


_REAL: dict[str, Any] = {"is_available": _real_cuda}


def _patch(owner: Any, name: str, value: Any) -> None:
    _ACTIVE.setdefault("patches", []).append((owner, name, getattr(owner, name, None), hasattr(owner, name)))
    setattr(owner, name, value)


def activate(total_memory: int | None = None) -> None:
    """Install the stand-ins (idempotent). :func:`deactivate` removes them; counters restart at each activation."""
    if _ACTIVE:
        return
    _ACTIVE["on"] = True
    STATE.counts.clear()
    STATE.deferred.clear()
    STATE.total_memory = total_memory or MEMORY_MIB * 2**20
    MODEL.reset()
    STATE.streams = MODEL
    for name, fn in scuda.functions().items():
        _patch(torch.cuda, name, fn)
    for name, fn in scuda.memory_functions().items():
        _patch(torch.cuda.memory, name, fn)
    _patch(torch, "compile", _compile)
    accelerator = {"is_available": lambda *a, **k: True, "device_count": lambda: 1,
                   "current_accelerator": lambda *a, **k: torch.device("cuda"), "current_device_index": lambda: 0,
                   "set_device_index": lambda *a: None, "synchronize": lambda *a: MODEL.sync_all(),
                   "current_stream": lambda *a: MODEL.current}  # fmt: skip
    for name, fn in accelerator.items():
        if hasattr(torch, "accelerator") and hasattr(torch.accelerator, name):
            _patch(torch.accelerator, name, fn)
    from torch.profiler import profile as profiler_class

    _patch(profiler_class, "__init__", packages.profiler_init(profiler_class.__init__))
    import torch.utils.data._utils.pin_memory as pinning

    _patch(pinning, "pin_memory", _pin_batch)  # DataLoader(pin_memory=True) pins in a thread: no mode there
    # Module.to("cuda") must make new Parameters (of the stand-in type), not set .data of the CPU ones
    _ACTIVE["overwrite"] = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    _patch(torch.onnx, "export", packages.onnx_export(torch.onnx.export, suspended))
    _ACTIVE["tensorrt"] = packages.install(_patch)
    mode = _CudaMode()
    mode.__enter__()
    _ACTIVE["mode"] = mode


def checks() -> dict[str, int]:
    """What the stand-ins enforced since :func:`activate` (counts by kind)."""
    return dict(STATE.counts)


def pending_violation() -> str | None:
    """A stream-order violation found when memory was freed and not yet raised (checked at the cell's end)."""
    return STATE.deferred[0] if STATE.deferred else None


def cell_done() -> dict[str, int]:
    """At the end of a cell: the check counts since the last call; the stand-ins stay only in whole-lesson scope."""
    if _ACTIVE.get("pinned"):
        counts = checks()
        STATE.counts.clear()
        return counts
    return deactivate()


def whole_lesson() -> bool:
    """``COURSE_REHEARSE_SCOPE=lesson``: the whole lesson runs as on a GPU machine (``pick_device()`` gives
    "cuda" from the first cell), so device-parametrized cells outside GPU sections are rehearsed too."""
    import os

    return os.environ.get("COURSE_REHEARSE_SCOPE", "section").strip().lower() == "lesson"


def pin() -> None:
    """Activate for the rest of the process (whole-lesson scope)."""
    activate()
    _ACTIVE["pinned"] = True


def deactivate() -> dict[str, int]:
    """Remove the stand-ins; return the check counts. Stand-in tensors kept in variables stay usable."""
    if not _ACTIVE:
        return {}
    counts = checks()
    mode = _ACTIVE.get("mode")
    if mode is not None:
        mode.__exit__(None, None, None)
    for owner, name, value, existed in reversed(_ACTIVE.get("patches", [])):
        if existed:
            setattr(owner, name, value)
        else:
            delattr(owner, name)
    torch.__future__.set_overwrite_module_params_on_conversion(_ACTIVE.get("overwrite", False))
    if _ACTIVE.get("tensorrt"):
        sys.modules.pop("tensorrt", None)
    STATE.capture = None
    _ACTIVE.clear()
    return counts
