"""Thin helpers for ONNX export and ONNX Runtime, each failing with a message that names the fix.

ONNX: :func:`export_onnx` (dynamo exporter, dynamic batch, one self-contained file, checked),
:func:`count_nodes` (operator histogram, to see fusion). ONNX Runtime: :func:`ort_session` (optimization
level, threads, providers, and a check that the providers asked for were really applied),
:func:`ort_runner` (validates name, dtype and rank before running), :func:`ort_iobinding_runner` (torch CUDA
tensors bound without copies), :func:`ort_quantize_dynamic`.

Lesson 07 writes the plain calls in its cells (``torch.onnx.export``, ``ort.SessionOptions``,
``ort.InferenceSession``, ``session.run``, ``quantize_dynamic``); lessons 07, 13 and 14 then call these helpers,
which add what a cell would repeat: the exported file checked and made self-contained, the providers that were
really applied compared with those asked for (:class:`ProviderFallbackError`), an input's name, dtype and rank
checked with a message naming the fix, and the IOBinding plumbing. TensorRT's helpers are in
:mod:`course_utils.techniques.tensorrt_engines`.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from course_utils.supply.errors import CourseError, MissingBackendError

GPU_EXTRAS_FIX = "install the GPU extras on a CUDA machine: make setup"


class ProviderFallbackError(CourseError, RuntimeError):
    """ONNX Runtime silently used other execution providers than the ones asked for."""


class BadInputError(CourseError, ValueError):
    """An input does not match what the ONNX model or engine expects (name, dtype, rank or shape)."""


# --------------------------------------------------------------------------------------------- ONNX export


def export_onnx(model: nn.Module, example: torch.Tensor, path: str | Path, *, dynamic_batch: bool = True) -> Path:
    """Export ``model`` to ONE self-contained ONNX file with the dynamo exporter, then run ``onnx.checker``.

    Input is named ``input``, output ``logits``. With ``dynamic_batch`` the first dimension is the symbol
    ``batch`` (``dynamic_shapes``, the replacement of the deprecated ``dynamic_axes``). torch.export
    specializes dimensions of size 0 or 1, so a batch-1 example is widened to 2 for the export.
    Weights are stored inside the file (``external_data=False``), so the file can be moved alone.
    """
    import onnx

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = model.eval()
    ex = example
    if dynamic_batch and example.shape[0] < 2:
        ex = example.expand(2, *example.shape[1:]).contiguous()
    kwargs: dict[str, Any] = {
        "input_names": ["input"],
        "output_names": ["logits"],
        "dynamo": True,
        "verbose": False,
    }
    if dynamic_batch:
        kwargs["dynamic_shapes"] = ({0: "batch"},)
    import warnings

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, (ex,), **kwargs)
    if program is None:  # pragma: no cover - only the legacy exporter returns None
        raise CourseError("torch.onnx.export returned no program: pass dynamo=True (torch >= 2.9)")
    program.save(str(path), external_data=False)
    onnx.checker.check_model(onnx.load(str(path)))
    return path


def count_nodes(path: str | Path) -> collections.Counter:
    """Operator histogram of an ONNX file's main graph (``domain:op`` for non-standard domains).

    Counting before and after ONNX Runtime's optimizer shows fusion: e.g. ``Conv`` + ``Relu`` become one
    ``FusedConv``, and the layout level rewrites convolutions into ``com.microsoft.nchwc:Conv``.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return collections.Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}" for n in model.graph.node
    )


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file (an ONNX model's identity in the engine cache key)."""
    from course_utils.supply.data import sha256

    return sha256(path)


# ------------------------------------------------------------------------------------------- ONNX Runtime

LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}


def require_onnxruntime():
    """``import onnxruntime``, or :class:`MissingBackendError` naming the fix.

    Any failure at import counts, not only ImportError: a half-installed wheel (a missing shared library,
    two ORT wheels side by side) raises other exceptions from inside the package.
    """
    try:
        import onnxruntime
    except Exception as exc:  # noqa: BLE001 - every import failure gets the same fix
        raise MissingBackendError(
            f"onnxruntime cannot be imported ({type(exc).__name__}: {exc}): reinstall it with make setup "
            "(CPU: onnxruntime, GPU: onnxruntime-gpu; never both in one environment)"
        ) from exc
    return onnxruntime


_ort = require_onnxruntime


def ort_session(
    path: str | Path,
    *,
    providers: list[str] | None = None,
    level: str = "all",
    threads: int | None = None,
    optimized_path: str | Path | None = None,
    provider_options: list[dict[str, Any]] | None = None,
    strict: bool = True,
):
    """An ``onnxruntime.InferenceSession`` at graph optimization ``level``, checked for provider fallback.

    ``level``: one of ``disable, basic, extended, layout, all``. ``threads`` sets ``intra_op_num_threads``
    (None: ONNX Runtime's default, one per physical core). ``optimized_path`` saves the optimized graph so
    its nodes can be counted. ORT quietly falls back to the CPU when a provider cannot load (e.g. the CUDA
    provider on a machine without a GPU): the session's applied providers are compared with the ones asked
    for, and a missing one raises :class:`ProviderFallbackError` (``strict``) or prints a warning.
    """
    ort = _ort()
    if level not in LEVELS:
        raise ValueError(f"level='{level}': use one of {list(LEVELS)}")
    providers = providers or ["CPUExecutionProvider"]
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    so.log_severity_level = 3  # errors only: the optimizer's notes are not for learners
    if threads is not None:
        so.intra_op_num_threads = int(threads)
    # idle threads sleep instead of spinning (ORT's default), which would hold the cores of whatever runs next
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if optimized_path is not None:
        Path(optimized_path).parent.mkdir(parents=True, exist_ok=True)
        so.optimized_model_filepath = str(optimized_path)
    kwargs: dict[str, Any] = {"providers": providers}
    if provider_options is not None:
        kwargs["provider_options"] = provider_options
    session = ort.InferenceSession(str(path), so, **kwargs)
    applied = session.get_providers()
    missing = [p for p in providers if p not in applied]
    if missing:
        msg = (
            f"ONNX Runtime did not apply {missing} (it fell back silently; applied: {applied}). "
            "For CUDA: install onnxruntime-gpu on a CUDA machine (make setup) and import torch first or call "
            "onnxruntime.preload_dlls(); the TensorRT provider of onnxruntime-gpu 1.31 needs TensorRT 10."
        )
        if strict:
            raise ProviderFallbackError(msg)
        print("⚠ " + msg)
    return session


_ORT_TO_TORCH = {
    "tensor(float)": torch.float32,
    "tensor(float16)": torch.float16,
    "tensor(bfloat16)": torch.bfloat16,
    "tensor(double)": torch.float64,
    "tensor(int64)": torch.int64,
    "tensor(int32)": torch.int32,
    "tensor(int8)": torch.int8,
    "tensor(uint8)": torch.uint8,
    "tensor(bool)": torch.bool,
}


def describe_inputs(session) -> list[dict[str, Any]]:
    """Name, ONNX type, torch dtype and shape (symbols for dynamic dims) of each session input."""
    return [
        {"name": i.name, "type": i.type, "dtype": _ORT_TO_TORCH.get(i.type), "shape": list(i.shape)}
        for i in session.get_inputs()
    ]


def validate_input(session, name: str, x: torch.Tensor) -> None:
    """Raise :class:`BadInputError` naming the expected name, dtype, rank or fixed dimension."""
    specs = {s["name"]: s for s in describe_inputs(session)}
    if name not in specs:
        raise BadInputError(f"input name '{name}' is not an input of this model: expected one of {sorted(specs)}")
    spec = specs[name]
    if spec["dtype"] is not None and x.dtype != spec["dtype"]:
        raise BadInputError(
            f"input '{name}' must be {spec['dtype']} ({spec['type']}), got {x.dtype}: convert it, e.g. x.float()"
        )
    if x.dim() != len(spec["shape"]):
        raise BadInputError(
            f"input '{name}' must have rank {len(spec['shape'])} (shape {spec['shape']}), got shape "
            f"{tuple(x.shape)}: add or remove dimensions (a single image needs x.unsqueeze(0))"
        )
    for axis, (want, got) in enumerate(zip(spec["shape"], x.shape, strict=True)):
        if isinstance(want, int) and want != got:
            raise BadInputError(
                f"input '{name}' dimension {axis} must be {want} (shape {spec['shape']}), got {tuple(x.shape)}"
            )


def ort_runner(session) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function ``run(x) -> torch.Tensor`` around ``session`` that validates its input first.

    ``x`` is a tensor (fed to the first input) or a ``{name: tensor}`` mapping. Name, dtype and rank are
    checked against the session, so a mistake raises :class:`BadInputError` naming the expected input
    instead of ONNX Runtime's long error. The first output is returned as a CPU torch tensor.
    """
    first = session.get_inputs()[0].name
    out_name = session.get_outputs()[0].name

    def run(x: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
        feeds = dict(x) if isinstance(x, Mapping) else {first: x}
        arrays = {}
        for name, t in feeds.items():
            if not isinstance(t, torch.Tensor):
                raise BadInputError(f"input '{name}' must be a torch.Tensor, got {type(t).__name__}")
            validate_input(session, name, t)
            arrays[name] = t.detach().cpu().contiguous().numpy()
        return torch.from_numpy(session.run([out_name], arrays)[0])

    return run


def ort_iobinding_runner(session, out_shape: Callable[[tuple[int, ...]], tuple[int, ...]]):
    """Run ``session`` on torch tensors bound in place with IOBinding (on CUDA: no host copies).

    Lesson 07's ``bind_and_run``, kept for reuse. ``out_shape(in_shape)`` gives the output shape (e.g.
    ``lambda s: (s[0], 1000)``); the output tensor is allocated by torch on the input's device and reused
    per shape (copy a result you keep). Float32 input and output; works with CPU and CUDA tensors.
    """
    iname, oname = session.get_inputs()[0].name, session.get_outputs()[0].name
    outs: dict[tuple[int, ...], torch.Tensor] = {}

    def run(x: torch.Tensor) -> torch.Tensor:
        validate_input(session, iname, x)
        x = x.contiguous()
        shape = tuple(out_shape(tuple(x.shape)))
        if shape not in outs:
            outs[shape] = torch.empty(shape, dtype=torch.float32, device=x.device)
        y = outs[shape]
        io = session.io_binding()
        dev = x.device.index or 0
        io.bind_input(iname, x.device.type, dev, np.float32, tuple(x.shape), x.data_ptr())
        io.bind_output(oname, y.device.type, dev, np.float32, shape, y.data_ptr())
        torch.get_device_module(x.device).synchronize()  # the input must be written before ORT reads it
        session.run_with_iobinding(io)
        io.synchronize_outputs()
        return y

    return run


def ort_quantize_dynamic(src: str | Path, dst: str | Path) -> Path:
    """ONNX Runtime's dynamic INT8 quantization: weights INT8 offline, activations quantized per call.

    Pays on MatMul/Gemm-heavy models (MLPs, transformers) on CPUs with INT8 instructions (VNNI).
    """
    _ort()
    import logging
    import tempfile

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    dst = Path(dst)
    model = onnx.load(str(src))
    # The dynamo exporter records shapes (value_info) for weights too; the quantizer transposes Gemm
    # weights and then disagrees with them, so drop the recorded shapes and let it infer them again.
    del model.graph.value_info[:]
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain.onnx"
        onnx.save(model, str(plain))
        root = logging.getLogger()
        old = root.level
        root.setLevel(logging.ERROR)  # silence its advice to run pre-processing (not needed here)
        try:
            quantize_dynamic(str(plain), str(dst), weight_type=QuantType.QInt8)
        finally:
            root.setLevel(old)
    return dst
