"""The techniques :func:`course_utils.capstone.optimize.optimize` tries, each the calls a lesson wrote out,
wrapped for reuse.

Each builder returns a list of :class:`Variant` (a runnable version of the model with its precision, set-up
time and a note) or raises :class:`Skip` with the reason it does not apply here. A package that fails to
import, with any exception, is a skip naming the fix, never an abort.
"""

from __future__ import annotations

import copy
import importlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from course_utils.supply.errors import MissingBackendError

LINEAR_HEAVY_SHARE = 0.5
"""Dynamic INT8 quantizes Linear layers only: tried when at least this share of the parameters is in them."""


class Skip(Exception):
    """Raised by a technique builder: the technique does not apply here (the message says why)."""


@dataclass
class Variant:
    """A runnable version of the model: ``run(x)`` takes an input on the device and returns fp32 outputs."""

    name: str
    run: Callable[[torch.Tensor], torch.Tensor]
    precision: str = "fp32"
    setup_s: float = 0.0
    note: str = ""


def linear_share(model: nn.Module) -> float:
    """Share of the model's parameters held by ``nn.Linear`` layers (0.0 for a model without any)."""
    total = sum(p.numel() for p in model.parameters())
    lin = sum(p.numel() for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters(recurse=False))
    return lin / total if total else 0.0


def import_or_skip(name: str, fix: str):
    """Import ``name`` for a technique; any failure (not only ImportError) skips the technique with the fix."""
    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - a broken install raises anything at import
        raise Skip(f"{name} cannot be imported ({type(exc).__name__}: {str(exc)[:160]}): {fix}") from exc


# --- the techniques: each is the lesson's calls, wrapped for reuse ------------------------------------------


def batching(eager, batched: bool, b: int, big: int) -> list[Variant]:
    if not batched:
        raise Skip("not applicable: the example has no batch dimension (pass has_batch_dim=True if dim 0 is one)")
    if b >= big:
        raise Skip(f"the example already has batch {b} >= the batching step's batch {big} (set batch_size=)")
    return [Variant("batching", eager, "fp32", 0.0, f"same model, batch {big} instead of {b}")]


def precision(model: nn.Module, dev: torch.device) -> list[Variant]:
    """Lesson 04: ``torch.autocast`` at FP16/BF16 on CUDA, BF16 on CPU."""
    from course_utils.measuring.device import cpu_flags

    if dev.type == "cuda":
        dtypes = [("fp16", torch.float16)] + ([("bf16", torch.bfloat16)] if torch.cuda.is_bf16_supported() else [])
    elif dev.type == "cpu":
        dtypes = [("bf16", torch.bfloat16)]
    else:
        raise Skip(f"autocast is not tried on {dev.type}")
    emulated = dev.type == "cpu" and not ({"avx512_bf16", "amx_bf16"} & cpu_flags())
    out = []
    for label, dt in dtypes:

        def run(x: torch.Tensor, dt: torch.dtype = dt) -> torch.Tensor:
            with torch.inference_mode(), torch.autocast(dev.type, dtype=dt):
                return model(x).float()

        note = f"torch.autocast('{dev.type}', dtype={dt})" + ("; no BF16 instructions here (emulated)" * emulated)
        out.append(Variant(f"precision {label}", run, label, 0.0, note))
    return out


def compile_model(model: nn.Module) -> list[Variant]:
    """Lesson 06: ``torch.compile`` (Inductor, default mode); the first call pays the compile."""
    compiled = torch.compile(copy.deepcopy(model))
    return [Variant("compile", lambda x: compiled(x).float(), "fp32", 0.0, "torch.compile; setup = first call")]


def onnxruntime(model: nn.Module, example: torch.Tensor, ref: torch.Tensor, dev: torch.device) -> list[Variant]:
    """Lesson 07: export with a dynamic batch, a session at level all; on CUDA, IOBinding (no host copies)."""
    for name in ("onnx", "onnxscript", "onnxruntime"):
        import_or_skip(name, "reinstall it with make setup (CPU: onnxruntime, GPU: onnxruntime-gpu)")
    from course_utils.techniques import onnx_runtime as backends

    t0 = time.perf_counter()
    cuda = dev.type == "cuda"
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if cuda else ["CPUExecutionProvider"]
    with tempfile.TemporaryDirectory(prefix="optimize_onnx_") as tmp:  # the session keeps the graph in memory
        path = backends.export_onnx(copy.deepcopy(model).cpu(), example.cpu(), Path(tmp) / "m.onnx")
        try:
            session = backends.ort_session(path, providers=providers, threads=torch.get_num_threads())
        except MissingBackendError as exc:
            raise Skip(str(exc)) from exc
        except backends.ProviderFallbackError as exc:
            raise Skip(f"the CUDA provider did not load, so ORT would run on the CPU: {exc}") from exc
    if cuda and ref.dtype == torch.float32:
        run = backends.ort_iobinding_runner(session, lambda s: (s[0], *ref.shape[1:]))
        how = "IOBinding with torch CUDA tensors"
    else:
        runner = backends.ort_runner(session)

        def run(x: torch.Tensor) -> torch.Tensor:
            return runner(x).float().to(dev)

        how = "run() with host tensors"
    note = f"ONNX Runtime {session.get_providers()[0]}, level all, {how}; setup = export + session"
    return [Variant("onnxruntime", run, "fp32", time.perf_counter() - t0, note)]


def tensorrt(model: nn.Module, example: torch.Tensor, dev: torch.device, max_batch: int) -> list[Variant]:
    """Lesson 08: an FP16 engine from an FP16 ONNX export (strongly typed), run with torch buffers.

    The profile's maximum covers the batching step; a larger batch (an accuracy probe over a whole test set)
    runs in chunks of that maximum, so every batch optimize() is asked to run stays inside the profile.
    """
    from course_utils.sections.gpu_sections import gpu_section

    if not gpu_section("14.optimize-tensorrt", needs=("tensorrt", "onnx", "onnxscript")):
        raise Skip("GPU-only: needs a CUDA GPU and the tensorrt package (see the printed reason)")
    trt = import_or_skip("tensorrt", "install the GPU extras on a CUDA machine: make setup")
    from course_utils.from_lessons import l08_tensorrt  # lesson 08's builder and runner, exported from its cells
    from course_utils.techniques import onnx_runtime, tensorrt_engines

    t0 = time.perf_counter()
    # TensorRT runs on the GPU, whatever device the rest of optimize() uses (a CPU run beside a GPU, or the
    # rehearsal's stand-in); without CUDA at all (the contract tests' fake TensorRT) it stays on `dev`.
    cuda = dev if dev.type == "cuda" or not torch.cuda.is_available() else torch.device("cuda")
    b = int(example.shape[0])
    top = max(max_batch, b)
    profile = tensorrt_engines.Profile.for_batch("input", tuple(example.shape[1:]), 1, b, top)
    with tempfile.TemporaryDirectory(prefix="optimize_trt_") as tmp:
        half = copy.deepcopy(model).half().to(cuda)
        onnx_path = onnx_runtime.export_onnx(half, example.half().to(cuda), Path(tmp) / "m_fp16.onnx")
        blob = l08_tensorrt.build_engine(trt, onnx_path, profile)
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(blob)
    runner = l08_tensorrt.TrtRunner(trt, engine, torch.cuda.Stream())
    input_dtype = runner.dtypes[runner.inputs[0]]

    def run(x: torch.Tensor) -> torch.Tensor:
        xc = x.to(cuda, input_dtype)
        out = torch.cat([runner(chunk).float() for chunk in xc.split(top)])
        return out.to(x.device)  # back where the caller's tensors live (the CPU when optimize() runs there)

    note = f"TensorRT {trt.__version__} FP16 engine, profile batch 1..{top} (larger batches in chunks)"
    return [Variant("tensorrt fp16", run, "fp16", time.perf_counter() - t0, note)]


def int8(model: nn.Module, *, compiled: bool) -> list[Variant]:
    """Lesson 05: torchao dynamic INT8 on the Linear layers (``quantize_``), under torch.compile when requested."""
    share = linear_share(model)
    if share < LINEAR_HEAVY_SHARE:
        raise Skip(
            f"not applicable: only {share:.0%} of the parameters are in nn.Linear layers, and dynamic INT8 "
            "quantizes only Linear layers (for convolutions use static PTQ with calibration, lessons 05 and 07)"
        )
    tq = import_or_skip("torchao.quantization", "pip install torchao (make setup)")
    t0 = time.perf_counter()
    q = copy.deepcopy(model)
    tq.quantize_(q, tq.Int8DynamicActivationInt8WeightConfig())
    note = f"torchao dynamic INT8 on Linear layers ({share:.0%} of parameters)"
    if compiled:
        q, note = torch.compile(q), note + ", under torch.compile (setup = quantize + first call)"
    else:
        note += ", eager (torchao INT8 pays mostly under torch.compile, which was not requested)"
    return [Variant("int8 dynamic", lambda x: q(x).float(), "int8", time.perf_counter() - t0, note)]
