"""TensorRT engines: the cache key, build, cache, runner and INT8 command that lesson 08 writes out first.

Lesson 08 builds and runs engines in its own cells; lesson 14's ``optimize()`` reuses these versions.
TensorRT is a GPU extra, imported lazily inside functions: :func:`engine_cache_key` and
:func:`engine_staleness` (pure functions, tested without a GPU), :func:`build_engine` (TensorRT 10/11 API),
:class:`TrtRunner` (torch tensors as device buffers, ``execute_async_v3`` on a non-default stream),
:func:`modelopt_int8_command` (explicit INT8 quantization: Q/DQ nodes written into the ONNX file from
calibration data), :func:`build_plan` (what would be built, on any machine). The GPU contract suite runs them
against a fake built from TensorRT 11.1's real bindings.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from course_utils.supply.errors import CourseError, MissingBackendError
from course_utils.techniques.onnx_runtime import GPU_EXTRAS_FIX, BadInputError, file_sha256


class EngineBuildError(CourseError, RuntimeError):
    """TensorRT could not parse the ONNX file or build an engine from it."""


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
