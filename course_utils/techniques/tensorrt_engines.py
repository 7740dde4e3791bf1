"""TensorRT engines: the cache key, the INT8 command and the build plan, for lesson 08's engine cells.

Lesson 08 writes the builder, the engine cache and the runner out in its cells, and exports them (cells tagged
``export``) to ``course_utils/from_lessons/l08_tensorrt.py``, which lesson 14's ``optimize()`` imports. What
stays here is the plumbing those cells call: :class:`Profile`, :func:`engine_metadata`,
:func:`engine_cache_key` and :func:`engine_staleness` (pure functions, tested without a GPU),
:func:`modelopt_int8_command` (explicit INT8 quantization: Q/DQ nodes written into the ONNX file from
calibration data) and :func:`build_plan` (what would be built, on any machine).
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

from course_utils.supply.errors import CourseError
from course_utils.techniques.onnx_runtime import file_sha256


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


# ------------------------------------------------------------------------------ TensorRT: INT8 and the plan


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
