"""The rehearsal's stand-ins for packages and torch entry points: ORT's CUDA provider, TensorRT, pycuda, torchcodec's
GPU JPEG decoding, the profiler's CUDA activity and ``torch.onnx.export`` of a stand-in model.

Installed by :func:`fakegpu.standins.rehearsal.activate` through its ``patch`` function, so that
:func:`~fakegpu.standins.rehearsal.deactivate` undoes every one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map

from fakegpu.standins.streams import MODEL
from fakegpu.standins.tensor import STATE, Rehearsed


def profiler_init(real: Any) -> Any:
    """torch.profiler.profile on the stand-in: the CPU activity is torch's own; ``ProfilerActivity.CUDA`` (CUPTI's
    kernel trace needs a GPU) becomes the stand-in's device events (:func:`.kernels.profiler_patches`)."""

    def init(self: Any, *args: Any, activities: Any = None, **kwargs: Any) -> None:
        wanted = list(activities or [])
        cpu_only = [a for a in wanted if a.name != "CUDA"]
        real(self, *args, activities=cpu_only or None, **kwargs)
        if len(cpu_only) != len(wanted):
            STATE.count("profiler CUDA activity (stand-in device events)")
            self._rehearsal_cuda = True

    return init


def onnx_export(real: Any, suspended: Callable[[], contextlib.AbstractContextManager]) -> Any:
    """torch.onnx.export of a stand-in model: its CPU weights are exported, with the stand-ins suspended."""

    def export(model: Any, args: Any = (), *rest: Any, **kwargs: Any) -> Any:
        swapped = []
        for mod in model.modules() if isinstance(model, torch.nn.Module) else []:
            for store in (mod._parameters, mod._buffers):
                for key, value in list(store.items()):
                    if isinstance(value, Rehearsed):
                        swapped.append((store, key, value))
                        inner = value.elem
                        store[key] = (
                            torch.nn.Parameter(inner, requires_grad=False) if store is mod._parameters else inner
                        )
        STATE.count("exports of stand-in models (CPU weights)")
        MODEL.drain()  # the exporter reads the weights: what is queued on them runs first
        try:
            with suspended():  # the exporter traces on the CPU with torch's own modes: the stand-ins step aside
                return real(model, tree_map(lambda t: t.elem if isinstance(t, Rehearsed) else t, args), *rest, **kwargs)
        finally:
            for store, key, value in swapped:
                store[key] = value

    return export


def install(patch: Callable[[Any, str, Any], None]) -> list[str]:
    """Install the package stand-ins with ``patch(owner, name, value)``; return the module names put in
    ``sys.modules`` (the fake ``tensorrt`` and ``pycuda`` where the real ones are missing; the caller removes them)."""
    try:
        import onnxruntime as ort

        from fakegpu.standins.ort import StandinSession

        real_cls = ort.InferenceSession

        def session(path_or_bytes: Any, sess_options: Any = None, providers: Any = None, **kwargs: Any) -> Any:
            names = [p if isinstance(p, str) else p[0] for p in providers or []]
            if "CUDAExecutionProvider" in names:
                return StandinSession(real_cls, path_or_bytes, sess_options, providers, **kwargs)
            return real_cls(path_or_bytes, sess_options, providers=providers, **kwargs)

        patch(ort, "InferenceSession", session)
        patch(ort, "preload_dlls", lambda *a, **k: None)
        real_providers = ort.get_available_providers
        patch(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", *real_providers()])
    except ImportError:
        pass
    added = []
    if "tensorrt" not in sys.modules and importlib.util.find_spec("tensorrt") is None:
        from fakegpu.standins.tensorrt import fake_from_snapshot

        sys.modules["tensorrt"] = fake_from_snapshot(device_pointers=True)
        added.append("tensorrt")
    if "pycuda" not in sys.modules and importlib.util.find_spec("pycuda") is None:
        from fakegpu.standins.pycuda import AutoinitRefused, FakePycuda

        modules = FakePycuda(device=True).rehearsal_modules()
        sys.modules.update(modules)
        added += list(modules)
        sys.meta_path.insert(0, AutoinitRefused())  # the rehearsal removes it when it ends
    try:
        import torchcodec.decoders._image_decoders as tci

        def cuda_batch(tensors: list, mode: Any, device: Any) -> list:  # nvJPEG's batch -> CPU decode, wrapped
            STATE.count("GPU JPEG decodes (CPU decode, stand-in output)")
            cpu = [tci._decode_to_mode(tci._decode_jpeg, t, mode, tci._JPEG_NATIVE_OUTPUT_MODES) for t in tensors]
            from fakegpu.standins.copies import to_device

            return [to_device(t, non_blocking=False) for t in cpu]

        patch(tci, "_decode_jpegs_cuda_with_mode", cuda_batch)
    except (ImportError, AttributeError):
        pass
    return added
