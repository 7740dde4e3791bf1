"""Thin helpers for ONNX export, ONNX Runtime and TensorRT, each failing with a message that names the fix.

ONNX: :func:`export_onnx` (dynamo exporter, dynamic batch, one self-contained file, checked),
:func:`count_nodes` (operator histogram, to see fusion). ONNX Runtime: :func:`ort_session` (optimization
level, threads, providers, and a check that the providers asked for were really applied),
:func:`ort_runner` (validates name, dtype and rank before running), :func:`ort_iobinding_runner` (torch CUDA
tensors bound without copies), :func:`ort_quantize_dynamic`.

TensorRT (GPU extras only; imported lazily inside functions): :func:`engine_cache_key` and
:func:`engine_staleness` (pure functions, tested without a GPU), :func:`build_engine` (TensorRT 10/11 API),
:func:`load_or_build_engine` (cache that rebuilds a stale or foreign engine), :class:`TrtRunner` (torch
tensors as device buffers, ``execute_async_v3`` on a non-default stream), :func:`modelopt_int8_command`
(explicit INT8 quantization: Q/DQ nodes written into the ONNX file from calibration data).
"""

from __future__ import annotations

import collections
import hashlib
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .errors import CourseError, MissingBackendError

GPU_EXTRAS_FIX = "install the GPU extras on a CUDA machine: make setup"


class ProviderFallbackError(CourseError, RuntimeError):
    """ONNX Runtime silently used other execution providers than the ones asked for."""


class BadInputError(CourseError, ValueError):
    """An input does not match what the ONNX model or engine expects (name, dtype, rank or shape)."""


class EngineBuildError(CourseError, RuntimeError):
    """TensorRT could not parse the ONNX file or build an engine from it."""


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
    from .data import sha256

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


# ------------------------------------------------------------------------------------- TensorRT: the cache


@dataclass(frozen=True)
class Profile:
    """A TensorRT optimization profile for one input: min, opt and max shapes (the engine is tuned at opt)."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def __post_init__(self) -> None:
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ValueError(f"profile '{self.name}': min, opt and max must have the same rank")
        for a, b, c in zip(self.min, self.opt, self.max, strict=True):
            if not (0 < a <= b <= c):
                raise ValueError(f"profile '{self.name}': need 0 < min <= opt <= max per dim, got {a}, {b}, {c}")

    @classmethod
    def for_batch(cls, name: str, item_shape: tuple[int, ...], min_b: int, opt_b: int, max_b: int) -> Profile:
        """A profile with a dynamic batch dimension and a fixed item shape."""
        return cls(name, (min_b, *item_shape), (opt_b, *item_shape), (max_b, *item_shape))

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


PRECISIONS = ("fp32", "tf32", "fp16", "int8")

# The fields that make an engine specific: a different value means the engine must be rebuilt.
KEY_FIELDS = ("gpu_name", "compute_capability", "trt_version", "precision", "profile", "onnx_sha256", "build")

# Build settings that change the engine (its kernels, its math, where it runs), with TensorRT's defaults.
# A timing cache is not among them: it makes a build faster, not a different engine.
BUILD_DEFAULTS: dict[str, Any] = {
    "workspace_bytes": 1 << 30,
    "tf32": True,
    "opt_level": 3,
    "hardware_compat": "NONE",
    "version_compatible": False,
}


def build_settings(**settings: Any) -> dict[str, Any]:
    """The engine-defining build settings (:data:`BUILD_DEFAULTS` filled in), JSON-able for the cache key.

    Enum values (``trt.HardwareCompatibilityLevel.AMPERE_PLUS``) are stored by name; keys that do not change
    the engine (``timing_cache``) are left out.
    """
    out = dict(BUILD_DEFAULTS)
    for k, v in settings.items():
        if k in out:
            out[k] = "NONE" if v is None and k == "hardware_compat" else getattr(v, "name", v)
    return out


def engine_metadata(
    *,
    gpu_name: str,
    compute_capability: tuple[int, int] | str,
    trt_version: str,
    precision: str,
    profile: Profile | Mapping[str, Any],
    onnx_sha256: str,
    build: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The facts an engine depends on, in a canonical JSON-able form (stored beside the engine).

    ``build`` holds the build settings (workspace, TF32, optimization level, compatibility options; see
    :func:`build_settings`): the same ONNX file built with TF32 off or at another optimization level is
    another engine, so it gets another key.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision '{precision}': use one of {PRECISIONS}")
    cc = (
        compute_capability
        if isinstance(compute_capability, str)
        else f"{compute_capability[0]}.{compute_capability[1]}"
    )
    prof = profile.as_dict() if isinstance(profile, Profile) else dict(profile)
    return {
        "gpu_name": gpu_name,
        "compute_capability": cc,
        "trt_version": trt_version,
        "precision": precision,
        "profile": prof,
        "onnx_sha256": onnx_sha256,
        "build": build_settings(**dict(build or {})),
    }


def engine_cache_key(**fields: Any) -> str:
    """A short hex key of GPU, compute capability, TensorRT version, precision, profile, ONNX hash, build settings.

    Accepts the keyword arguments of :func:`engine_metadata`. Two engines share a key only if all of those
    match, so a key names exactly one engine that is valid on this machine.
    """
    meta = engine_metadata(**fields)
    blob = json.dumps(meta, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def engine_staleness(stored: Mapping[str, Any] | None, expected: Mapping[str, Any]) -> list[str]:
    """Why a cached engine cannot be used here: one reason per differing field (empty list: usable)."""
    if stored is None:
        return ["no metadata beside the engine (built elsewhere or by an older course version)"]
    reasons = []
    for f in KEY_FIELDS:
        if stored.get(f) != expected.get(f):
            reasons.append(f"{f}: engine has {stored.get(f)!r}, this machine needs {expected.get(f)!r}")
    return reasons


def engine_paths(cache_dir: str | Path, onnx_path: str | Path, precision: str, key: str) -> tuple[Path, Path]:
    """Where an engine and its metadata JSON live in the cache: ``<stem>-<precision>-<key>.engine/.json``."""
    stem = f"{Path(onnx_path).stem}-{precision}-{key}"
    d = Path(cache_dir)
    return d / f"{stem}.engine", d / f"{stem}.json"


def read_metadata(path: str | Path) -> dict[str, Any] | None:
    """The metadata JSON beside an engine, or None if missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


# ------------------------------------------------------------------------------ TensorRT: build and run


def require_tensorrt():
    """Import ``tensorrt`` or raise :class:`MissingBackendError` naming the fix."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise MissingBackendError(f"TensorRT is not installed ({exc}): {GPU_EXTRAS_FIX}") from exc
    return trt


def trt_major(trt) -> int:
    """TensorRT's major version (10, 11, ...)."""
    return int(str(trt.__version__).split(".")[0])


def current_platform() -> dict[str, Any]:
    """This machine's GPU name, compute capability and TensorRT version (needs CUDA and tensorrt)."""
    trt = require_tensorrt()
    if not torch.cuda.is_available():
        from .errors import DeviceUnavailableError

        raise DeviceUnavailableError("TensorRT engines need a CUDA GPU: run this on a CUDA machine")
    return {
        "gpu_name": torch.cuda.get_device_name(0),
        "compute_capability": torch.cuda.get_device_capability(0),
        "trt_version": str(trt.__version__),
    }


def build_engine(
    onnx_path: str | Path,
    *,
    profile: Profile,
    workspace_bytes: int = 1 << 30,
    tf32: bool = True,
    optimization_level: int | None = None,
    verbose: bool = False,
) -> bytes:
    """Build a serialized TensorRT engine from an ONNX file (TensorRT 10/11 API); return its bytes.

    The network is strongly typed: precision comes from the ONNX graph (an FP16 export gives an FP16
    engine; Q/DQ nodes give INT8), not from builder flags, which TensorRT 11 removed. ``tf32`` keeps the
    TF32 flag for FP32 math on tensor cores. The profile gives min/opt/max shapes of the dynamic input.
    """
    trt = require_tensorrt()
    logger = trt.Logger(trt.Logger.VERBOSE if verbose else trt.Logger.WARNING)
    builder = trt.Builder(logger)
    if trt_major(trt) >= 11:
        network = builder.create_network(0)  # every network is strongly typed in TensorRT 11
    else:
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineBuildError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_bytes))
    if tf32:
        config.set_flag(trt.BuilderFlag.TF32)
    else:
        config.clear_flag(trt.BuilderFlag.TF32)
    if optimization_level is not None:
        config.builder_optimization_level = int(optimization_level)
    opt_profile = builder.create_optimization_profile()
    opt_profile.set_shape(profile.name, profile.min, profile.opt, profile.max)
    config.add_optimization_profile(opt_profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineBuildError(
            f"TensorRT failed to build an engine from {onnx_path} (see the log above); "
            "a larger workspace_bytes or a profile closer to the real shapes often helps"
        )
    return bytes(serialized)


@dataclass
class EngineInfo:
    """What :func:`load_or_build_engine` did: the paths, the key, whether it built, and why."""

    engine_path: Path
    key: str
    built: bool
    build_s: float
    reason: str
    metadata: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["engine_path"] = str(self.engine_path)
        return d


def load_or_build_engine(
    onnx_path: str | Path,
    *,
    precision: str,
    profile: Profile,
    cache_dir: str | Path,
    workspace_bytes: int = 1 << 30,
    **build_kwargs: Any,
):
    """Deserialize a cached engine that matches this machine, or build (and cache) a new one.

    A cached engine is used only when its metadata matches this GPU, compute capability, TensorRT version,
    precision, profile and ONNX file. A stale or foreign engine (or one TensorRT refuses to deserialize)
    is rebuilt with a printed reason instead of failing. Returns ``(engine, EngineInfo)``.
    """
    import time

    trt = require_tensorrt()
    plat = current_platform()
    settings = {"workspace_bytes": workspace_bytes, **build_kwargs}
    if "optimization_level" in settings:
        settings["opt_level"] = settings["optimization_level"]
    meta = engine_metadata(**plat, precision=precision, profile=profile, onnx_sha256=file_sha256(onnx_path),
                           build=settings)  # fmt: skip
    key = engine_cache_key(**{k: meta[k] for k in KEY_FIELDS})
    engine_path, meta_path = engine_paths(cache_dir, onnx_path, precision, key)
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    reason = "no cached engine"
    if engine_path.exists():
        stale = engine_staleness(read_metadata(meta_path), meta)
        if not stale:
            engine = runtime.deserialize_cuda_engine(engine_path.read_bytes())
            if engine is not None:
                return engine, EngineInfo(engine_path, key, False, 0.0, "cache hit", meta)
            reason = "cached engine could not be deserialized by this TensorRT"
        else:
            reason = "stale engine: " + "; ".join(stale)
        print(f"Rebuilding {engine_path.name}: {reason}")
    t0 = time.perf_counter()
    blob = build_engine(onnx_path, profile=profile, workspace_bytes=workspace_bytes, **build_kwargs)
    build_s = time.perf_counter() - t0
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    engine_path.write_bytes(blob)
    meta_path.write_text(json.dumps(meta, indent=1, sort_keys=True))
    engine = runtime.deserialize_cuda_engine(blob)
    if engine is None:
        raise EngineBuildError(f"TensorRT built {engine_path} but cannot deserialize it: check the log above")
    return engine, EngineInfo(engine_path, key, True, build_s, reason, meta)


def _torch_dtype(trt, dt) -> torch.dtype:
    table = {
        trt.float32: torch.float32,
        trt.float16: torch.float16,
        trt.int8: torch.int8,
        trt.int32: torch.int32,
        trt.bool: torch.bool,
    }
    for name, tdt in (("bfloat16", torch.bfloat16), ("int64", torch.int64)):
        if hasattr(trt, name):
            table[getattr(trt, name)] = tdt
    return table[dt]


class TrtRunner:
    """Run a TensorRT engine with torch tensors as the input and output buffers (lesson 08 writes it out).

    Per call: ``set_input_shape`` for the dynamic batch, ``set_tensor_address`` with each tensor's
    ``data_ptr()``, ``execute_async_v3`` on a dedicated non-default stream that waits for the current
    stream (so the input is ready) and is waited on by it (so the output is ready for later torch work).
    A batch larger than the profile's maximum runs in chunks of that maximum, so a caller (an accuracy
    probe over a whole test set) never meets ``set_input_shape`` returning False. Output tensors are
    allocated once per shape and reused: copy a result you want to keep. ``stream``: a torch stream
    (default: a new ``torch.cuda.Stream()``).
    """

    def __init__(self, engine, stream=None) -> None:
        self.trt = require_tensorrt()
        self.engine = engine
        self.context = engine.create_execution_context()
        self.stream = torch.cuda.Stream() if stream is None else stream
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        mode = self.trt.TensorIOMode.INPUT
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == mode]
        self.outputs = [n for n in names if engine.get_tensor_mode(n) != mode]
        if len(self.inputs) != 1:
            raise CourseError(f"TrtRunner handles one input; this engine has {self.inputs}")
        self.input_dtype = _torch_dtype(self.trt, engine.get_tensor_dtype(self.inputs[0]))
        lo, _, hi = engine.get_tensor_profile_shape(self.inputs[0], 0)
        self.min_batch, self.max_batch = int(lo[0]), int(hi[0])
        self._out: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        name = self.inputs[0]
        if torch.cuda.is_available() and x.device.type != "cuda":
            raise BadInputError(f"TensorRT input '{name}' must be a CUDA tensor: call x.cuda()")
        if x.dtype != self.input_dtype:
            raise BadInputError(f"engine input '{name}' is {self.input_dtype}, got {x.dtype}: convert with .to()")
        if x.dim() > 0 and x.shape[0] > self.max_batch:
            parts = [self._run(c).clone() for c in x.split(self.max_batch)]
            return torch.cat(parts)
        return self._run(x)

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        name = self.inputs[0]
        x = x.contiguous()
        if not self.context.set_input_shape(name, tuple(x.shape)):
            raise BadInputError(
                f"shape {tuple(x.shape)} is outside the engine's optimization profile for '{name}' "
                f"(batch {self.min_batch} to {self.max_batch}): rebuild the engine with a profile that covers it"
            )
        self.context.set_tensor_address(name, x.data_ptr())
        results = []
        for out in self.outputs:
            shape = tuple(self.context.get_tensor_shape(out))
            key = (out, shape)
            if key not in self._out:
                dtype = _torch_dtype(self.trt, self.engine.get_tensor_dtype(out))
                self._out[key] = torch.empty(shape, dtype=dtype, device=x.device)
            self.context.set_tensor_address(out, self._out[key].data_ptr())
            results.append(self._out[key])
        dev = torch.get_device_module(x.device)
        self.stream.wait_stream(dev.current_stream())
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise CourseError("TensorRT execute_async_v3 failed: see the TensorRT log")
        dev.current_stream().wait_stream(self.stream)
        return results[0]


def pycuda_available() -> bool:
    """True when pycuda imports with a primary context shared with PyTorch (``pycuda.autoprimaryctx``)."""
    try:
        import pycuda.autoprimaryctx  # noqa: F401
        import pycuda.driver  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or a driver error without a GPU
        return False
    return True


class PycudaTrtRunner:
    """The same inference with pycuda buffers (host numpy in, host numpy out): the classic sample style.

    Uses ``pycuda.autoprimaryctx`` (not ``autoinit``) so pycuda shares PyTorch's CUDA context. Each call
    copies host -> device, runs, copies device -> host on one pycuda stream.
    """

    def __init__(self, engine) -> None:
        import pycuda.autoprimaryctx  # noqa: F401
        import pycuda.driver as cuda

        self.cuda = cuda
        self.trt = require_tensorrt()
        self.engine = engine
        self.context = engine.create_execution_context()
        self.stream = cuda.Stream()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        mode = self.trt.TensorIOMode.INPUT
        self.input = next(n for n in names if engine.get_tensor_mode(n) == mode)
        self.output = next(n for n in names if engine.get_tensor_mode(n) != mode)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        cuda = self.cuda
        x = np.ascontiguousarray(x)
        self.context.set_input_shape(self.input, x.shape)
        out_shape = tuple(self.context.get_tensor_shape(self.output))
        out_dtype = self.trt.nptype(self.engine.get_tensor_dtype(self.output))
        host_out = cuda.pagelocked_empty(out_shape, out_dtype)
        d_in, d_out = cuda.mem_alloc(x.nbytes), cuda.mem_alloc(host_out.nbytes)
        try:
            cuda.memcpy_htod_async(d_in, x, self.stream)
            self.context.set_tensor_address(self.input, int(d_in))
            self.context.set_tensor_address(self.output, int(d_out))
            self.context.execute_async_v3(self.stream.handle)
            cuda.memcpy_dtoh_async(host_out, d_out, self.stream)
            self.stream.synchronize()
        finally:
            d_in.free()
            d_out.free()
        return np.array(host_out)


# ------------------------------------------------------------------ explicit INT8 (Q/DQ) with ModelOpt


def write_calibration(x: torch.Tensor, path: str | Path, n: int) -> Path:
    """Save the first ``n`` calibration samples of ``x`` as ``.npy`` (float32), ModelOpt's input format."""
    if n < 1 or n > len(x):
        raise ValueError(f"calibration size n={n}: choose 1..{len(x)} samples")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, x[:n].detach().cpu().float().numpy())
    return path


def modelopt_int8_command(
    onnx_path: str | Path,
    calib_npy: str | Path,
    out_path: str | Path,
    *,
    calibration_method: str = "max",
    calibration_eps: tuple[str, ...] = ("cuda:0", "cpu"),
    high_precision_dtype: str = "fp16",
) -> list[str]:
    """The command that writes a Q/DQ (explicitly quantized INT8) copy of an ONNX model with ModelOpt.

    Every flag is spelled out (ModelOpt's parser accepts abbreviations such as ``--calibration_data``; the
    course does not rely on them, and the contract suite parses this command with abbreviations off):

    * ``--calibration_data_path``: the ``.npy`` of real, preprocessed inputs the activation ranges come from;
    * ``--calibration_eps``: where calibration runs, in priority order. ModelOpt's default starts with
      ``cpu``; the course names ``cuda:0`` first (then ``cpu`` as the fallback);
    * ``--high_precision_dtype``: the type of the layers left unquantized. ModelOpt's default ``fp16``
      converts them from FP32 to FP16; ``fp32`` keeps them FP32.
    """
    return [
        sys.executable, "-m", "modelopt.onnx.quantization",
        "--onnx_path", str(onnx_path),
        "--quantize_mode", "int8",
        "--calibration_data_path", str(calib_npy),
        "--calibration_method", calibration_method,
        "--calibration_eps", *calibration_eps,
        "--high_precision_dtype", high_precision_dtype,
        "--output_path", str(out_path),
    ]  # fmt: skip


def build_plan(
    sources: Mapping[str, str | Path | None],
    profile: Profile,
    platform: Mapping[str, Any],
    settings: Mapping[str, Mapping[str, Any]] | None = None,
):
    """A table of the engines a lesson would build: precision, ONNX file, profile, build settings, cache key.

    ``settings`` maps a row name to its build settings (:func:`build_settings`; default TensorRT's). A row
    name's first word (before a space or dash) is its precision: ``"tf32"``, ``"int8 (calib 64)"``.

    ``sources`` maps each precision to its ONNX file, or to None when that file can only be made on the
    GPU machine (the INT8 Q/DQ file needs ModelOpt): its key is then shown as pending.
    """
    import re

    import pandas as pd

    rows = []
    for name, src in sources.items():
        precision = re.split(r"[ \-]", name)[0]
        build = build_settings(**dict((settings or {}).get(name, {})))
        key = "(after the ONNX file exists)"
        if src is not None:
            key = engine_cache_key(
                gpu_name=platform["gpu_name"], compute_capability=platform["compute_capability"],
                trt_version=platform["trt_version"], precision=precision, profile=profile,
                onnx_sha256=file_sha256(src), build=build,
            )  # fmt: skip
        rows.append({"engine": name, "onnx file": Path(src).name if src else "made on the GPU machine",
                     "profile min": profile.min, "profile opt": profile.opt, "profile max": profile.max,
                     "TF32": build["tf32"], "opt level": build["opt_level"], "hw compat": build["hardware_compat"],
                     "workspace MiB": build["workspace_bytes"] >> 20, "cache key": key})  # fmt: skip
    return pd.DataFrame(rows)
