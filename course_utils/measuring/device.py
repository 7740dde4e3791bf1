"""What this machine has: CPU, GPU, precisions, backends and versions.

``capabilities()`` gathers the facts as a dict, ``capability_table()`` renders them for lesson 00,
and ``pick_device()`` chooses where lessons run (cuda > mps > cpu). ``get_device("cuda")`` on a machine
without CUDA raises one clear :class:`DeviceUnavailableError` instead of a deep traceback.
"""

from __future__ import annotations

import importlib
import os
import platform
from pathlib import Path
from typing import Any

import torch

from course_utils.supply.errors import DeviceUnavailableError


def has_cuda() -> bool:
    """True when PyTorch can use an NVIDIA GPU here."""
    return torch.cuda.is_available()


def _has_mps() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend and backend.is_available())


def pick_device() -> torch.device:
    """The best device here: ``cuda`` if present, then ``mps``, else ``cpu``."""
    if has_cuda():
        return torch.device("cuda")
    if _has_mps():
        return torch.device("mps")
    return torch.device("cpu")


def get_device(name: str | torch.device | None = None) -> torch.device:
    """Resolve ``name`` (None means :func:`pick_device`) and fail clearly if it is not available."""
    if name is None:
        return pick_device()
    dev = torch.device(name)
    if dev.type == "cuda" and not has_cuda():
        raise DeviceUnavailableError(
            "CUDA was asked for, but this machine has no usable NVIDIA GPU (torch.cuda.is_available() is False). "
            "Use device='cpu' or pick_device(), or run on a machine with a CUDA GPU and driver."
        )
    if dev.type == "mps" and not _has_mps():
        raise DeviceUnavailableError("MPS was asked for, but this machine has no Apple GPU. Use device='cpu'.")
    return dev


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait until queued work on ``device`` has finished (no-op on CPU)."""
    dev = torch.device(device) if device is not None else pick_device()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux, else platform.processor())."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """CPU instruction-set flags (Linux), used to tell whether INT8 (VNNI) or BF16 (AMX/avx512_bf16) may pay."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


CPU_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")  # Linux: one index<N>/ folder per cache level


def last_level_cache_bytes(device: torch.device | str | None = None) -> int | None:
    """The largest cache in front of ``device``'s memory, in bytes: a GPU's L2, or the CPU's last-level cache
    (Linux sysfs, else macOS ``sysctl``); None when the machine does not say."""
    dev = torch.device(device) if device is not None else pick_device()
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).L2_cache_size) or None
    sizes = []
    for index in CPU_CACHE_DIR.glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        if text.rstrip("KMG").isdigit():
            sizes.append(int(text.rstrip("KMG")) * unit)
    if not sizes and platform.system() == "Darwin":
        import subprocess

        for key in ("hw.l3cachesize", "hw.l2cachesize"):
            out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True).stdout.strip()
            if out.isdigit() and int(out) > 0:
                sizes.append(int(out))
                break
    return max(sizes) if sizes else None


def bandwidth_buffer_bytes(device: torch.device | str | None = None, *, multiple: int = 4) -> int:
    """Bytes per buffer for a memory-bandwidth probe on ``device``: ``multiple`` times its last-level cache, at
    least 64 MiB and at most 512 MiB (32 MiB is assumed for a cache the machine does not report).

    A copy whose buffers fit in the cache measures the cache: 88.7 GB/s with small buffers against 33.3 GB/s
    with 256 MiB ones on the same 2-core VM. The size is the same in smoke and full mode for that reason.
    """
    cache = last_level_cache_bytes(device) or 32 * 2**20
    return int(min(max(multiple * cache, 64 * 2**20), 512 * 2**20))


def module_status(name: str) -> tuple[bool, str]:
    """Try to import ``name``: (True, version) or (False, the import error in one line)."""
    try:
        mod = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the answer
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return True, str(getattr(mod, "__version__", "present"))


def capabilities() -> dict[str, Any]:
    """Facts about this machine, as a flat dict (keys are stable; used by lesson 00 and result rows)."""
    flags = cpu_flags()
    caps: dict[str, Any] = {
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_avx512_vnni": "avx512_vnni" in flags or "avx_vnni" in flags,
        "cpu_bf16": bool({"avx512_bf16", "amx_bf16"} & flags),
        "cpu_amx": "amx_tile" in flags,
        "torch": torch.__version__,
        "torch_cuda_build": torch.version.cuda,
        "device": str(pick_device()),
        "cuda_available": has_cuda(),
        "gpu": None,
        "gpu_capability": None,
        "gpu_memory_gib": None,
        "gpu_bf16": None,
        "gpu_tf32": None,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    }
    if has_cuda():
        props = torch.cuda.get_device_properties(0)
        major, minor = props.major, props.minor
        caps.update(
            gpu=props.name,
            gpu_capability=f"{major}.{minor}",
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            gpu_bf16=torch.cuda.is_bf16_supported(),
            gpu_tf32=major >= 8,
            gpu_fp8=(major, minor) >= (8, 9),
        )
    for mod, key in [
        ("onnxruntime", "onnxruntime"),
        ("tensorrt", "tensorrt"),
        ("torch_tensorrt", "torch_tensorrt"),
        ("pycuda", "pycuda"),
    ]:
        ok, info = module_status(mod)
        caps[key] = info if ok else f"missing ({info})"
    try:  # torchao: version from metadata (importing it costs seconds and logs warnings)
        from importlib.metadata import version

        caps["torchao"] = version("torchao")
    except Exception:  # noqa: BLE001
        caps["torchao"] = "missing (pip install torchao)"
    if caps["onnxruntime"].startswith("missing"):
        caps["ort_providers"] = None
    else:
        import onnxruntime as ort

        caps["ort_providers"] = ", ".join(ort.get_available_providers())
    return caps


def capability_table(caps: dict[str, Any] | None = None):
    """``capabilities()`` as a two-column pandas DataFrame (what, value) for display."""
    import pandas as pd

    caps = capabilities() if caps is None else caps
    return pd.DataFrame({"what": list(caps), "value": [str(v) for v in caps.values()]})


def describe() -> str:
    """One line naming the machine: GPU name if present, else the CPU model and thread count."""
    if has_cuda():
        return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"
    return f"{cpu_model()} ({torch.get_num_threads()} threads)"
