# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 08 · TensorRT
#
# **Goals.** Write a TensorRT engine builder and runner yourself, with the current (TensorRT 11) API:
# the ONNX parser, a workspace limit, an optimization profile for a dynamic batch, a timing cache and the
# builder optimization level; then run the engine with torch tensors as buffers on a non-default stream.
# Cache engines under a key of everything they depend on. Compare FP32 (true FP32 and TF32), FP16 and INT8
# (explicit quantization, calibrated on real digits) with PyTorch, see fusion in the engine inspector, an
# out-of-profile shape, latency at the profile's `opt` and `max`, and a ResNet-50 engine at large batch.
#
# **The bottleneck it attacks** (see *01 · Measuring inference*): **compute** (kernels chosen by timing on
# this exact GPU, reduced precision on tensor cores), **memory traffic** (layer fusion) and **framework
# overhead** (no Python between layers).
#
# **How far this code has been verified.** Every TensorRT cell below is *contract-tested*: the suite
# `tests/gpu_contract/test_l08_tensorrt.py` executes the builder, cache and runner cells of this lesson in CI
# against a fake `tensorrt` module generated from TensorRT 11.1's real Python bindings (every class, method,
# argument count and enum member checked; an ONNX Runtime simulation behind it). **None of it has been
# executed on a GPU yet** by the course: on your GPU run, you are the first to see the real numbers.
#
# **On a machine without a GPU** the lesson still runs: it exports the ONNX files, shows the build plan
# with its cache keys, prepares the INT8 calibration data and commands, and explains each step.
#
# **What changed in TensorRT 10 and 11** (most tutorials online use removed APIs): `build_engine`,
# `max_workspace_size`, the binding API (`get_binding_shape`, `set_binding_shape`, `num_bindings`) and
# `execute_async_v2` are gone since 10.0; INT8 calibrators and the `FP16`/`INT8` builder flags are gone
# since 11.0, because every network is strongly typed: precision comes from the ONNX graph.

# %%
import copy
import subprocess

import pandas as pd
import torch
from IPython.display import display

import course_utils as cu

device = cu.lesson.start("08", "TensorRT")
work = cu.results.results_dir() / "artifacts" / "08"  # .onnx and .engine files: never in the repository
work.mkdir(parents=True, exist_ok=True)
try:
    import tensorrt as trt
except ImportError:
    trt = None  # the GPU extras are not installed: the GPU sections below say so and skip
print(f"CUDA: {torch.cuda.is_available()}; TensorRT: {trt.__version__ if trt else 'not installed'}")

# %% tags=["contract", "export"]
import json  # noqa: E402 - this cell also runs alone: in the contract tests, and as the exported module
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from course_utils.techniques import (
    onnx_runtime,  # noqa: E402
    tensorrt_engines,  # noqa: E402
)

# %% [markdown]
# ## Step 1: ONNX files, where precision is decided
# TensorRT 11 builds what the ONNX graph says: an FP32 export gives an FP32 engine (TF32 allowed or not by a
# builder flag), an export of `model.half()` gives an FP16 engine, and Q/DQ nodes give INT8. So FP32 and FP16
# need nothing but `torch.onnx.export`; only INT8 needs a quantization tool (NVIDIA ModelOpt, below).
#
# Two models: the shipped **digits CNN** (trained weights, real test images: accuracy is meaningful) and
# **ResNet-18** (speed at realistic sizes; random weights unless ImageNet weights are in your torch cache).
# `onnx_runtime.export_onnx` is lesson 07's export (`dynamo=True`, a dynamic batch, one file, `onnx.checker`).

# %%
digits = cu.data.load_digits_split()
cnn = cu.models.load_digits_model("cnn")
size = cu.pick(full=224, smoke=64)
resnet, note = cu.models.resnet("resnet18")
print(f"ResNet-18: {note}; input {size}x{size}")
# `.half()` converts a module IN PLACE and returns the same object: export a deep copy, so `cnn` and `resnet`
# keep their FP32 weights for every FP32 comparison below (`model.half()` then `.float()` would leave
# FP16-rounded weights behind: a relative error of ~4e-4, over the FP32 tolerance).
onnx_files = {
    "digits fp32": onnx_runtime.export_onnx(cnn, digits.x_test[:2], work / "digits_cnn.onnx"),
    "digits fp16": onnx_runtime.export_onnx(
        copy.deepcopy(cnn).half(), digits.x_test[:2].half(), work / "digits_cnn.fp16.onnx"
    ),
    "resnet18 fp32": onnx_runtime.export_onnx(resnet, torch.randn(2, 3, size, size), work / f"resnet18_{size}.onnx"),
    "resnet18 fp16": onnx_runtime.export_onnx(
        copy.deepcopy(resnet).half(), torch.randn(2, 3, size, size).half(), work / f"resnet18_{size}.fp16.onnx"
    ),
}
nodes = pd.DataFrame(
    {
        k: {"MiB": p.stat().st_size / 2**20, "ONNX nodes": sum(onnx_runtime.count_nodes(p).values())}
        for k, p in onnx_files.items()
    }
).T
display(nodes)

# %% [markdown]
# ## Step 2: the builder, written out
# Read it line by line: this is the whole TensorRT 11 build. `create_network(0)`: no flags (strongly typed is
# the only mode). The parser fills the network from the ONNX file. The builder config holds the **workspace**
# limit (scratch memory tactics may use), the **TF32** switch (FP32 math on tensor cores: on by default, off
# for true FP32), the **optimization level** (0 to 5, default 3: higher tries more tactics and builds longer),
# the **timing cache** (tactic timings kept across builds: a rebuild skips re-timing), and the
# **compatibility** options. The **optimization profile** gives the smallest, typical (`opt`, tuned for) and
# largest input shape; `build_serialized_network` returns the engine as bytes (a "plan").
#
# *Verification: contract-tested by `tests/gpu_contract/test_l08_tensorrt.py`; never executed on a GPU.*


# %% tags=["contract", "export"]
def build_engine(
    trt,
    onnx_path,
    profile,
    *,
    workspace_bytes=1 << 30,
    tf32=True,
    opt_level=3,
    timing_cache=None,
    hardware_compat=None,
    version_compatible=False,
):
    """Build a serialized TensorRT engine (bytes) from an ONNX file with one optimization profile."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 11: every network is strongly typed
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # a str: the binding does not take a Path
        errors = [parser.get_error(i).desc() for i in range(parser.num_errors)]
        raise tensorrt_engines.EngineBuildError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if tf32:
        config.set_flag(trt.BuilderFlag.TF32)
    else:
        config.clear_flag(trt.BuilderFlag.TF32)  # true FP32 math
    config.builder_optimization_level = opt_level
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # layer names for the engine inspector
    if hardware_compat is not None:  # "AMPERE_PLUS": one plan for any GPU from Ampere on
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, hardware_compat)
    if version_compatible:  # runs on later TensorRT versions too (the plan then carries a lean runtime)
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    cache_bytes = timing_cache.read_bytes() if timing_cache is not None and timing_cache.exists() else b""
    config.set_timing_cache(config.create_timing_cache(cache_bytes), False)
    opt_profile = builder.create_optimization_profile()
    opt_profile.set_shape(profile.name, profile.min, profile.opt, profile.max)
    config.add_optimization_profile(opt_profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise tensorrt_engines.EngineBuildError(
            f"TensorRT could not build {onnx_path}: see the log above (workspace? profile?)"
        )
    if timing_cache is not None:
        timing_cache.write_bytes(bytes(config.get_timing_cache().serialize()))
    return bytes(plan)


# %% [markdown]
# ## Step 3: the engine cache, written out
# A plan runs only on the GPU model and TensorRT version it was built for, with the profile it was built
# with. The cache key therefore hashes the GPU name, compute capability, TensorRT version, precision,
# profile, the ONNX file's sha256 **and the build settings** (workspace, TF32, optimization level,
# compatibility options): the same file built with TF32 off is another engine. A cached plan is used only
# when the metadata stored beside it match; otherwise it is rebuilt, with the reason printed.
#
# *Verification: contract-tested by `tests/gpu_contract/test_l08_tensorrt.py`; never executed on a GPU.*


# %% tags=["contract", "export"]
def load_or_build(trt, runtime, onnx_path, profile, cache_dir, platform, precision, **settings):
    """A cached engine if its metadata match this machine and these settings, else a freshly built one."""
    meta = tensorrt_engines.engine_metadata(
        **platform,
        precision=precision,
        profile=profile,
        onnx_sha256=onnx_runtime.file_sha256(onnx_path),
        build=tensorrt_engines.build_settings(**settings),
    )
    key = tensorrt_engines.engine_cache_key(**meta)
    path = Path(cache_dir) / f"{Path(onnx_path).stem}-{precision}-{key}.engine"
    meta_path = path.with_suffix(".json")
    stale = (
        tensorrt_engines.engine_staleness(tensorrt_engines.read_metadata(meta_path), meta)
        if path.exists()
        else ["no cached engine"]
    )
    if not stale:
        engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if engine is not None:
            return engine, {"built": False, "build_s": 0.0, "why": "cache hit", "key": key}
        stale = ["this TensorRT cannot deserialize the cached plan"]
    t0 = time.perf_counter()
    plan = build_engine(trt, onnx_path, profile, **settings)
    build_s = time.perf_counter() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(plan)
    meta_path.write_text(json.dumps(meta, indent=1))
    return runtime.deserialize_cuda_engine(plan), {
        "built": True,
        "build_s": build_s,
        "why": "; ".join(stale),
        "key": key,
    }


# %% [markdown]
# ## Step 4: the runner, written out
# The engine lists its I/O tensors by name (`num_io_tensors`, `get_tensor_name`, `get_tensor_mode`). Per
# call: `set_input_shape` picks the batch (False when outside the profile), `set_tensor_address` gives
# TensorRT each torch tensor's device pointer (`data_ptr()`: no copies), and `execute_async_v3` enqueues the
# work on a **non-default stream**. Two `wait_stream` calls order it with PyTorch's stream: TensorRT starts
# after the input is written, and later torch work waits for the output.
#
# *Verification: contract-tested by `tests/gpu_contract/test_l08_tensorrt.py`; never executed on a GPU.*

# %% tags=["contract", "export"]
TORCH_DTYPES = {
    "FLOAT": torch.float32,
    "HALF": torch.float16,
    "BF16": torch.bfloat16,
    "INT8": torch.int8,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "BOOL": torch.bool,
}


class TrtRunner:
    """Run a one-input engine with torch tensors as its buffers, on ``stream`` (a torch.cuda.Stream())."""

    def __init__(self, trt, engine, stream):
        self.engine, self.stream = engine, stream
        self.context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dtypes = {n: TORCH_DTYPES[engine.get_tensor_dtype(n).name] for n in names}

    def __call__(self, x):
        name = self.inputs[0]
        if x.dtype != self.dtypes[name]:
            raise onnx_runtime.BadInputError(f"engine input '{name}' is {self.dtypes[name]}, got {x.dtype}: use x.to()")
        x = x.contiguous()
        if not self.context.set_input_shape(name, tuple(x.shape)):
            lo, _, hi = self.engine.get_tensor_profile_shape(name, 0)
            raise onnx_runtime.BadInputError(
                f"shape {tuple(x.shape)} is outside the engine's profile for '{name}' "
                f"({tuple(lo)} to {tuple(hi)}): rebuild with a profile that covers it"
            )
        self.context.set_tensor_address(name, x.data_ptr())
        outs = {}
        for n in self.outputs:
            outs[n] = torch.empty(tuple(self.context.get_tensor_shape(n)), dtype=self.dtypes[n], device=x.device)
            self.context.set_tensor_address(n, outs[n].data_ptr())
        dev = torch.get_device_module(x.device)  # torch.cuda on a GPU
        self.stream.wait_stream(dev.current_stream())  # the input is written before TensorRT reads it
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError("execute_async_v3 failed: see the TensorRT log")
        dev.current_stream().wait_stream(self.stream)  # later torch work waits for the outputs
        return outs[self.outputs[0]]


def engine_layers(trt, engine):
    """The engine's layers as TensorRT fused them (engine inspector, JSON format)."""
    info = engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
    return [layer if isinstance(layer, str) else layer.get("Name", "?") for layer in json.loads(info)["Layers"]]


# %% [markdown]
# The cells tagged `export` above (the imports, `build_engine`, `load_or_build`, `TrtRunner`, `engine_layers`) are
# written by `make notebooks` into `course_utils/from_lessons/l08_tensorrt.py`: lesson 14's `optimize()` imports
# this very code from there (a test keeps the two the same), so there is no second copy to drift.
#
# ## Step 5: the plan and its cache keys (every machine)
# The profile for ResNet-18: batch 1 to `max`, tuned at `opt`. Below, the engines this lesson builds and
# their keys. Without a GPU the keys are computed for an example platform, to show what goes into them.

# %%
opt_b, max_b = cu.pick(full=(8, 64), smoke=(4, 8))
profile = tensorrt_engines.Profile.for_batch("input", (3, size, size), 1, opt_b, max_b)
digits_profile = tensorrt_engines.Profile.for_batch("input", (1, 8, 8), 1, 64, 512)
if torch.cuda.is_available() and trt is not None:
    platform = {
        "gpu_name": torch.cuda.get_device_name(0),
        "compute_capability": torch.cuda.get_device_capability(0),
        "trt_version": trt.__version__,
    }
else:
    platform = {"gpu_name": "example: NVIDIA H200", "compute_capability": (9, 0), "trt_version": "11.1.0"}
builds = {  # name: (ONNX file, precision, build settings)
    "fp32": (onnx_files["resnet18 fp32"], "fp32", {"tf32": False}),
    "tf32": (onnx_files["resnet18 fp32"], "tf32", {"tf32": True}),
    "fp16": (onnx_files["resnet18 fp16"], "fp16", {}),
    "fp16 level 1": (onnx_files["resnet18 fp16"], "fp16", {"opt_level": 1}),
    "fp16 ampere+": (onnx_files["resnet18 fp16"], "fp16", {"hardware_compat": "AMPERE_PLUS"}),
}
plan = tensorrt_engines.build_plan(
    {k: v[0] for k, v in builds.items()}, profile, platform, {k: v[2] for k, v in builds.items()}
)
display(plan)

# %%
here = tensorrt_engines.engine_metadata(
    **platform, precision="fp16", profile=profile, onnx_sha256=onnx_runtime.file_sha256(onnx_files["resnet18 fp16"])
)
foreign = {
    **here,
    "gpu_name": "NVIDIA L4",
    "compute_capability": "8.9",
    "trt_version": "10.13.0",
    "build": tensorrt_engines.build_settings(opt_level=5),
}
for reason in tensorrt_engines.engine_staleness(foreign, here):
    print("rebuild:", reason)
print(
    "same machine, file and settings:",
    tensorrt_engines.engine_staleness(here, here) or "no reason: the cached engine is used",
)

# %% [markdown]
# **An engine built elsewhere.** The course's answer is the key above: rebuild when anything differs.
# TensorRT's own answers, when you must ship one plan to many machines: `hardware_compatibility_level =
# AMPERE_PLUS` (one plan for every GPU from Ampere on, at some speed cost) and the `VERSION_COMPATIBLE` flag
# (the plan runs on later TensorRT versions; the runtime must then allow the plan's embedded lean runtime:
# `runtime.engine_host_code_allowed = True`). `build_engine` above takes both; the GPU section below measures
# what the hardware-compatible plan costs.
#
# ## Step 6: build with the timing cache and two optimization levels (GPU)
# Four engines from Step 5's plan, each through `load_or_build`; then the FP16 build again with the timing
# cache the first builds filled, to see what the cache saves.
#
# *Verification: contract-tested by `tests/gpu_contract/test_l08_tensorrt.py`; never executed on a GPU.*

# %%
engines, infos, runtime = {}, {}, None
if cu.gpu_section("08.build", needs=("tensorrt", "onnx")):
    import tensorrt as trt  # here too: when rehearsing (COURSE_REHEARSE=1) this is the stand-in

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    cache_dir, timing = work / "engines", work / "timing.cache"
    for name, (src, precision, settings) in builds.items():
        engines[name], infos[name] = load_or_build(
            trt, runtime, src, profile, cache_dir, platform, precision, timing_cache=timing, **settings
        )
        how = f"built in {infos[name]['build_s']:.1f} s" if infos[name]["built"] else "from cache"
        print(f"{name}: {how} ({infos[name]['why']}), plan {engines[name].num_layers} layers")
    # the timing cache: the same build again, from scratch (a new key would rebuild anyway; force it here)
    t0 = time.perf_counter()
    build_engine(trt, onnx_files["resnet18 fp16"], profile, timing_cache=timing)
    first = f"{infos['fp16']['build_s']:.1f} s" if infos["fp16"]["built"] else "loaded from the engine cache"
    print(f"fp16 rebuilt with a warm timing cache: {time.perf_counter() - t0:.1f} s (first build: {first})")
    display(pd.DataFrame(infos).T)
else:
    cu.results.show_reference("08", "build")

# %% [markdown]
# ## Step 7: fusion, seen in the engine (GPU)
# The inspector lists the engine's layers: convolution, batch norm, ReLU and the residual add become one
# layer each time TensorRT can fuse them. Compare with the ONNX node count from Step 1.
#
# *Verification: contract-tested by `tests/gpu_contract/test_l08_tensorrt.py`; never executed on a GPU.*

# %%
if cu.gpu_section("08.fusion", needs=("tensorrt",), requires={"08.build's fp16 engine": "fp16" in engines}):
    layers = engine_layers(trt, engines["fp16"])
    print(f"ResNet-18 FP16: {int(nodes.loc['resnet18 fp16', 'ONNX nodes'])} ONNX nodes -> {len(layers)} engine layers")
    for layer in layers[:8]:
        print("  ", layer)
else:
    print(f"ONNX nodes (Step 1): {nodes['ONNX nodes'].astype(int).to_dict()}; the engine's layers need a GPU.")

# %% [markdown]
# ## Step 8: parity and speed per precision (GPU)
# The **true FP32** reference: cuDNN convolutions and matmuls run TF32 by default on Ampere and newer, so
# the reference turns both off (one API family, the legacy setters). The FP32 engine (TF32 cleared) is held
# to the FP32 tolerance, the TF32 engine to TF32's, FP16 to FP16's. Then latency per batch: at 1, at the
# profile's `opt` (the shape its kernels were tuned for) and at `max`, beside PyTorch eager.
#
# `true_fp32()` turns both TF32 switches off for the reference and puts back **what they were** when it
# leaves (setting them to `True` afterwards would leave TF32 on for every later matmul: PyTorch's default
# for matmuls is off). The GPU model is a deep copy: `.cuda()` moves a module in place, like `.half()`.
#
# *Verification: contract-tested by `tests/gpu_contract/test_l08_tensorrt.py`; never executed on a GPU.*


# %% tags=["contract"]
import contextlib  # noqa: E402


@contextlib.contextmanager
def true_fp32():
    """No TF32 anywhere inside (cuDNN convolutions and matmuls); the previous settings come back after."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


# %%
rows = []
if cu.gpu_section("08.run", needs=("tensorrt",), requires={"the engines 08.build makes": bool(engines)}):
    model_g = copy.deepcopy(resnet).cuda().eval()
    stream = torch.cuda.Stream()  # not the default stream: TensorRT would synchronize the device on it
    tol = {name: precision for name, (_, precision, _) in builds.items()}  # compare's tolerance names
    engine_cmp = {}  # per batch: eager and every engine taking turns in rounds (lesson 01)
    for b in (1, opt_b, max_b):
        x = torch.randn(b, 3, size, size, device="cuda")
        with torch.inference_mode(), true_fp32():
            ref = model_g(x)
        calls, errs = {"torch eager fp32": lambda x=x: model_g(x)}, {}
        for name, engine in engines.items():
            runner = TrtRunner(trt, engine, stream)
            xin = x.to(runner.dtypes[runner.inputs[0]])
            errs[name] = cu.check_outputs(runner(xin).float(), ref, tol[name], label=f"{name} b={b}").max_rel
            calls[name] = lambda r=runner, xin=xin: r(xin)
        with torch.inference_mode(), true_fp32():
            engine_cmp[b] = cu.compare(calls, baseline="torch eager fp32", device="cuda", batch_size=b)
        for name, m in engine_cmp[b].measurements.items():
            rows.append(
                {
                    "engine": name,
                    "batch": b,
                    "median_ms": m.median_ms,
                    "throughput": m.throughput,
                    "max_rel": errs.get(name),
                }
            )
            if name not in errs:
                continue
            cmp_err = errs[name]
            cu.record(
                "08",
                f"tensorrt {name}",
                model="resnet18",
                device="cuda",
                dtype=name.split()[0],
                measurement=m,
                speedup_vs_baseline=engine_cmp[b].ratio(name),
                error_vs_baseline=cmp_err,
            )
    trt_table = pd.DataFrame(rows)
    display(trt_table.pivot(index="batch", columns="engine", values="median_ms"))
    fig = cu.plots.batch_curve(
        trt_table.rename(columns={"engine": "variant", "batch": "batch_size"}),
        title="TensorRT engines vs PyTorch (ResNet-18)",
    )
    _ = cu.plots.save(fig, "08", "engines_vs_pytorch")
    per_img = trt_table[trt_table.engine == "fp16"].set_index("batch")["median_ms"]
    print(
        f"fp16 engine: {per_img[opt_b] / opt_b:.4f} ms per image at opt={opt_b}, "
        f"{per_img[max_b] / max_b:.4f} ms per image at max={max_b}"
    )
else:
    cu.results.show_reference("08", "tensorrt")

# %% [markdown]
# ### The seeds' way: pycuda buffers and a pycuda stream
# Many TensorRT samples and blog posts (and NVIDIA's older samples) run an engine with **pycuda**: device
# buffers from `cuda.mem_alloc`, **page-locked** host buffers from `cuda.pagelocked_empty` (an asynchronous
# copy needs pinned memory; from ordinary pageable memory the driver stages it and the call is no longer
# asynchronous), `memcpy_htod_async` in, `execute_async_v3` on the pycuda stream's handle,
# `memcpy_dtoh_async` out, then `stream.synchronize()` before the host reads the result (the copy is only
# queued until then). `PycudaRunner` below is that runner, beside Step 4's.
#
# * **Why the torch-buffer runner needs no copies:** its input and output already live on the GPU as torch
#   tensors; `data_ptr()` is the device address TensorRT reads and writes. The pycuda runner takes and
#   returns host arrays, so every call pays two PCIe copies (and a host copy into the pinned buffer).
# * **The mixing trap: two contexts.** `import pycuda.autoinit` creates a **new** CUDA context and makes it
#   current; PyTorch works in the device's **primary** context. Two contexts on one GPU each hold their own
#   memory (hundreds of MiB) and their own allocations and streams: an engine, pointer or stream made in one
#   is not valid in the other (TensorRT reports an invalid argument, or a kernel faults). Import
#   `pycuda.autoprimaryctx` instead: it retains the primary context, the one PyTorch uses, so pycuda and torch
#   buffers and streams can be mixed.
#
# *Verification: `tests/gpu_contract/test_l08_pycuda.py` runs `PycudaRunner` against the fake TensorRT and a
# fake pycuda built from pycuda 2026.1's own source (names and argument names of its C++ wrapper): only
# names that exist pass, host buffers must be page-locked, device buffers must come from `mem_alloc`, the
# copies and the engine must share one stream, and the output is only there after `synchronize()`. Never
# executed on a GPU.*

# %% tags=["contract"]
import numpy as np  # noqa: E402

NP_DTYPES = {
    "FLOAT": np.float32,
    "HALF": np.float16,
    "INT8": np.int8,
    "INT32": np.int32,
    "INT64": np.int64,
    "BOOL": np.bool_,
}


class PycudaRunner:
    """Run a one-input engine at a fixed batch with pycuda: pinned host buffers, device buffers, one stream."""

    def __init__(self, trt, engine, cuda, batch: int):
        self.cuda, self.stream = cuda, cuda.Stream()  # `cuda` is pycuda.driver, after pycuda.autoprimaryctx
        self.context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.input = next(t for t in names if engine.get_tensor_mode(t) == trt.TensorIOMode.INPUT)
        self.outputs = [t for t in names if t != self.input]
        item = tuple(engine.get_tensor_shape(self.input))[1:]
        if not self.context.set_input_shape(self.input, (batch, *item)):
            raise onnx_runtime.BadInputError(
                f"batch {batch} is outside the engine's profile: rebuild with one that covers it"
            )
        self.host, self.device = {}, {}
        for t in names:
            shape = tuple(self.context.get_tensor_shape(t))
            self.host[t] = cuda.pagelocked_empty(shape, NP_DTYPES[engine.get_tensor_dtype(t).name])  # pinned
            self.device[t] = cuda.mem_alloc(self.host[t].nbytes)
            self.context.set_tensor_address(t, int(self.device[t]))  # a device pointer, never a host one

    def __call__(self, x: np.ndarray) -> np.ndarray:
        np.copyto(self.host[self.input], x)  # into the pinned buffer (raises on a wrong shape)
        self.cuda.memcpy_htod_async(self.device[self.input], self.host[self.input], self.stream)
        if not self.context.execute_async_v3(self.stream.handle):
            raise RuntimeError("execute_async_v3 failed: see the TensorRT log")
        for t in self.outputs:
            self.cuda.memcpy_dtoh_async(self.host[t], self.device[t], self.stream)
        self.stream.synchronize()  # the copies are queued until here: read the host buffers only after it
        return self.host[self.outputs[0]].copy()


# %%
if cu.gpu_section("08.pycuda", needs=("tensorrt", "pycuda"), requires={"08.build's fp32 engine": "fp32" in engines}):
    import pycuda.autoprimaryctx  # noqa: F401 - shares PyTorch's primary context
    import pycuda.driver as cuda

    x_host = torch.randn(opt_b, 3, size, size)
    x_dev = x_host.cuda()
    pc_runner = PycudaRunner(trt, engines["fp32"], cuda, opt_b)
    torch_runner = TrtRunner(trt, engines["fp32"], torch.cuda.Stream())
    out_pc = torch.from_numpy(pc_runner(x_host.numpy()))
    cu.check_outputs(out_pc, torch_runner(x_dev).cpu(), "fp32", label="pycuda runner vs torch-buffer runner")
    pc_rows = {
        "pycuda runner (host in, host out)": cu.measure(
            lambda: pc_runner(x_host.numpy()), device="cuda", batch_size=opt_b
        ),
        "torch-buffer runner (device in, device out)": cu.measure(
            lambda: torch_runner(x_dev), device="cuda", batch_size=opt_b
        ),
        "torch-buffer runner + the same two copies": cu.measure(
            lambda: torch_runner(x_host.cuda()).cpu(), device="cuda", batch_size=opt_b
        ),
    }
    for name, m in pc_rows.items():
        print(f"{name}: {m.median_ms:.3f} ms (spread {m.spread:.0%})")
        cu.record("08", f"tensorrt fp32 {name}", model="resnet18", device="cuda", dtype="fp32", measurement=m)
else:
    cu.results.show_reference("08", "runner (")

# %% [markdown]
# **Outside the profile.** A batch above `max` is refused by `set_input_shape`; the runner turns that into a
# course error naming the fix (a profile that covers it), instead of a wrong result.
#
# *Verification: contract-tested by `tests/gpu_contract/test_l08_tensorrt.py`; never executed on a GPU.*

# %%
if cu.gpu_section("08.profile-error", needs=("tensorrt",), requires={"08.build's fp16 engine": "fp16" in engines}):
    try:
        TrtRunner(trt, engines["fp16"], torch.cuda.Stream())(torch.randn(max_b + 1, 3, size, size).cuda().half())
    except onnx_runtime.BadInputError as exc:
        print("refused:", exc)

# %% [markdown]
# ## Step 9: INT8 by explicit quantization, calibrated on real digits
# TensorRT 11 has no calibrator: ModelOpt runs the FP32 ONNX model on **calibration data**, picks a scale per
# tensor and writes QuantizeLinear/DequantizeLinear pairs into a new ONNX file; TensorRT then builds INT8
# kernels where the pairs say so. The calibration data are real, preprocessed digits from the training split
# (the accuracy below is measured on the test split). The command names every option it relies on:
# * `--calibration_data_path`: the `.npy` of inputs (ModelOpt also accepts the abbreviation
#   `--calibration_data`, by argparse's prefix matching; spell it out);
# * `--calibration_eps cuda:0 cpu`: where calibration runs, in order; ModelOpt's default starts with `cpu`;
# * `--high_precision_dtype fp16`: the layers left unquantized become FP16 (ModelOpt's default); `fp32`
#   keeps them FP32.
# The contract suite parses this very command with ModelOpt's own parser (abbreviations off).
#
# *Verification: the command is contract-tested by `tests/gpu_contract/test_l08_modelopt.py` (ModelOpt 0.47's
# parser), the build and runner by `tests/gpu_contract/test_l08_tensorrt.py`; ModelOpt's calibration itself
# has never been executed by the course (it needs the GPU extras).*

# %%
calib_n = cu.pick(full=512, smoke=64)
calib = tensorrt_engines.write_calibration(digits.x_train, work / f"digits_calib_{calib_n}.npy", calib_n)
onnx_int8 = work / f"digits_cnn.int8-calib{calib_n}.onnx"
int8_cmd = tensorrt_engines.modelopt_int8_command(onnx_files["digits fp32"], calib, onnx_int8)
print(f"calibration: {calib_n} real training digits -> {calib.name}")
print(" ".join(Path(a).name if a.startswith("/") else a for a in int8_cmd))

# %%
if cu.gpu_section("08.int8", needs=("tensorrt", "modelopt")):
    import tensorrt as trt  # here too: when rehearsing (COURSE_REHEARSE=1) this is the stand-in

    if not onnx_int8.exists():
        subprocess.run(int8_cmd, check=True, timeout=1800)
    print("Q/DQ nodes:", {k: v for k, v in onnx_runtime.count_nodes(onnx_int8).items() if "Linear" in k})
    runtime = runtime or trt.Runtime(trt.Logger(trt.Logger.WARNING))
    stream = torch.cuda.Stream()
    acc, cnn_g = {}, copy.deepcopy(cnn).cuda().eval()
    xt, yt = digits.x_test.cuda(), digits.y_test.cuda()
    acc["torch fp32"] = cu.models.accuracy(cnn_g, xt, yt)
    for name, src in {"fp16": onnx_files["digits fp16"], "int8": onnx_int8}.items():
        digits_engine, _ = load_or_build(trt, runtime, src, digits_profile, work / "engines", platform, name)
        runner = TrtRunner(trt, digits_engine, stream)
        acc[f"tensorrt {name}"] = cu.models.accuracy(
            lambda x, r=runner: r(x.to(r.dtypes["input"])), xt, yt, batch_size=512
        )
    print({k: f"{v:.2%}" for k, v in acc.items()})
    cu.record(
        "08",
        "tensorrt int8 digits",
        model="digits_cnn",
        device="cuda",
        dtype="int8",
        notes=f"accuracy {acc['tensorrt int8']:.4f} vs torch fp32 {acc['torch fp32']:.4f}",
    )
else:
    cu.results.show_reference("08", "int8")

# %% [markdown]
# ## Step 10: ResNet-50: batch-1 latency and large-batch throughput (GPU)
# The course sets two GPU targets for ResNet-50: batch-1 latency (best engine ≤ 0.35 ms) and
# INT8 throughput at large batch (on an H200: ≥ 70% of MLPerf v4.1's 94.6k images/s per GPU). One profile
# cannot serve both: an engine's kernels are tuned for the profile's `opt` shape, so batch 1 on an engine
# tuned for batch 256 runs batch-256 tactics on one image. Two profiles, two engines: **latency**
# (min = opt = max = 1) and **throughput** (1 to `big`, tuned at `big`). `r50_profiles` and
# `target_verdict` are checked by `tests/gpu_contract/test_l08_tensorrt.py`.


# %% tags=["contract"]
import course_utils as cu  # noqa: E402, F811 - also here: the contract tests run this cell alone

R50_INT8_TARGET = {"gpu": "H200", "reference_img_s": 94_600.0, "fraction": 0.70}  # the course's target (MLPerf v4.1)


def r50_profiles(big: int) -> dict:
    """One engine per job: batch 1 tuned for batch 1 (latency), and 1..big tuned for big (throughput)."""
    return {
        "latency": tensorrt_engines.Profile.for_batch("input", (3, 224, 224), 1, 1, 1),
        "throughput": tensorrt_engines.Profile.for_batch("input", (3, 224, 224), 1, big, big),
    }


def target_verdict(images_per_s, gpu_name: str, target: dict = R50_INT8_TARGET, standin: bool = False) -> str:
    """The measured throughput against the course's target, which is set for one GPU model (matched by token).

    `images_per_s`: the throughput of each timed call. The target is "met" only when the interval of their
    median clears it, "missed" when all of the interval falls short (`Ratio.judge`), else "not shown"."""
    rates = np.asarray(images_per_s, dtype=float)
    need = target["fraction"] * target["reference_img_s"]
    line = f"measured {np.median(rates):,.0f} images/s vs target {need:,.0f} ({target['fraction']:.0%} of MLPerf's "
    line += f"{target['reference_img_s']:,.0f} on an {target['gpu']})"
    if target["gpu"].upper() not in gpu_name.upper().replace("-", " ").split():
        return line + f": the target is set for an {target['gpu']}, this is '{gpu_name}' (not comparable)"
    vs_target = cu.intervals.ratio_from_rounds("measured", "target", rates / need, standin=standin)
    return line + f" ({vs_target.interval_text}): " + vs_target.judge(1.0)


# %%
r50_engines, r50_onnx = {}, {}
if cu.gpu_section("08.resnet50", needs=("tensorrt",)):
    import tensorrt as trt  # here too: when rehearsing (COURSE_REHEARSE=1) this is the stand-in

    r50, r50_note = cu.models.resnet("resnet50")
    print(f"ResNet-50: {r50_note}")
    big = cu.pick(full=256, smoke=8)
    r50_onnx["fp16"] = onnx_runtime.export_onnx(
        copy.deepcopy(r50).half(), torch.randn(2, 3, 224, 224).half(), work / "resnet50.fp16.onnx"
    )
    runtime = runtime or trt.Runtime(trt.Logger(trt.Logger.WARNING))
    stream = torch.cuda.Stream()
    for job, prof in r50_profiles(big).items():
        r50_engines[("fp16", job)], _ = load_or_build(
            trt, runtime, r50_onnx["fp16"], prof, work / "engines", platform, "fp16", workspace_bytes=4 << 30
        )
    for job, b in (("latency", 1), ("throughput", big)):
        runner = TrtRunner(trt, r50_engines[("fp16", job)], stream)
        x = torch.randn(b, 3, 224, 224, device="cuda", dtype=torch.half)
        m = cu.measure(lambda x=x, r=runner: r(x), device="cuda", batch_size=b, label=f"resnet50 fp16 b={b}")
        print(f"ResNet-50 FP16 {job} engine, batch {b}: {m.median_ms:.3f} ms, {m.throughput:,.0f} images/s")
        cu.record("08", f"tensorrt resnet50 fp16 {job}", model="resnet50", device="cuda", dtype="fp16", measurement=m)
else:
    cu.results.show_reference("08", "resnet50")

# %% [markdown]
# **INT8 throughput, against the target.** The same ModelOpt command as Step 9 writes a Q/DQ copy of the
# ResNet-50 FP32 export (calibrated here on random images: the weights are random too unless ImageNet weights
# are in your torch cache, so the accuracy of this engine means nothing; its speed does), then a throughput
# engine and a latency engine are built from it. The verdict line compares with the course's target only on
# the GPU the target names.

# %%
if cu.gpu_section(
    "08.resnet50-int8", needs=("tensorrt", "modelopt"), requires={"08.resnet50's engines": bool(r50_engines)}
):
    r50_onnx["fp32"] = onnx_runtime.export_onnx(r50, torch.randn(2, 3, 224, 224), work / "resnet50.onnx")
    r50_calib = tensorrt_engines.write_calibration(torch.randn(64, 3, 224, 224), work / "resnet50_calib_random.npy", 64)
    r50_onnx["int8"] = work / "resnet50.int8.onnx"
    if not r50_onnx["int8"].exists():
        subprocess.run(
            tensorrt_engines.modelopt_int8_command(r50_onnx["fp32"], r50_calib, r50_onnx["int8"]),
            check=True,
            timeout=1800,
        )
    best = {}
    for job, prof in r50_profiles(big).items():
        r50_engines[("int8", job)], _ = load_or_build(
            trt, runtime, r50_onnx["int8"], prof, work / "engines", platform, "int8", workspace_bytes=4 << 30
        )
    for (prec, job), engine in r50_engines.items():
        b = 1 if job == "latency" else big
        runner = TrtRunner(trt, engine, stream)
        x = torch.randn(b, 3, 224, 224, device="cuda").to(runner.dtypes[runner.inputs[0]])
        m = cu.measure(lambda x=x, r=runner: r(x), device="cuda", batch_size=b, label=f"resnet50 {prec} b={b}")
        best[(prec, job)] = m
        cu.record("08", f"tensorrt resnet50 {prec} {job}", model="resnet50", device="cuda", dtype=prec, measurement=m)
    lat = min((m.median_ms, k[0]) for k, m in best.items() if k[1] == "latency")
    # the target against the median's interval over the timed calls: "met" only when all of it is under 0.35 ms
    lat_vs_target = cu.intervals.ratio_from_rounds(
        lat[1], "0.35 ms", 0.35 / np.asarray(best[(lat[1], "latency")].times_ms), standin=cu.modes.rehearsing()
    )
    print(
        f"ResNet-50 batch-1 latency, best engine ({lat[1]}): {lat[0]:.3f} ms vs target 0.35 ms: "
        + lat_vs_target.judge(1.0)
    )
    print(
        "ResNet-50 INT8 throughput at batch",
        big,
        "->",
        target_verdict(
            big * 1000 / np.asarray(best[("int8", "throughput")].times_ms),  # images/s of each timed call
            torch.cuda.get_device_name(0),
            standin=cu.modes.rehearsing(),
        ),
    )
else:
    cu.results.show_reference("08", "resnet50-int8")

# %% [markdown]
# ## The command-line route: trtexec and Polygraphy
# The same build without Python: `trtexec` (in NVIDIA's TensorRT container or the tar package; the pip wheel
# has none) builds and times an engine; Polygraphy (`pip install polygraphy`) compares it with ONNX Runtime.
# The commands for this lesson's files and profile:

# %%
shape = lambda s: "x".join(map(str, s))  # noqa: E731
fp16_file = onnx_files["resnet18 fp16"].name
print(
    f"trtexec --onnx={fp16_file} --saveEngine=resnet18.fp16.engine --memPoolSize=workspace:1024M "
    f"--minShapes=input:{shape(profile.min)} --optShapes=input:{shape(profile.opt)} "
    f"--maxShapes=input:{shape(profile.max)} --builderOptimizationLevel=3 --timingCacheFile=timing.cache"
)
print(
    f"polygraphy run {fp16_file} --trt --onnxrt --trt-min-shapes input:[{','.join(map(str, profile.min))}] "
    f"--trt-opt-shapes input:[{','.join(map(str, profile.opt))}] "
    f"--trt-max-shapes input:[{','.join(map(str, profile.max))}] --atol 1e-2 --rtol 1e-2"
)

# %% [markdown]
# ## Torch-TensorRT: the one-line alternative (GPU)
# `torch_tensorrt.compile` builds TensorRT engines for the parts of the graph it supports and falls back to
# PyTorch for the rest. In torch-tensorrt 2.14 precision is typed by the model: call `.half()`.
#
# *Verification: unverified. `torch_tensorrt.compile` has no CPU path and its package cannot be imported
# without TensorRT's libraries, so the contract suite cannot run it; it is listed as not testable there.*

# %%
if cu.gpu_section("08.torch-tensorrt", needs=("tensorrt", "torch_tensorrt")):
    import torch_tensorrt

    model_h = cu.models.resnet("resnet18")[0].cuda().half().eval()
    inp = torch_tensorrt.Input(min_shape=profile.min, opt_shape=profile.opt, max_shape=profile.max, dtype=torch.half)
    t0 = time.perf_counter()
    trt_mod = torch_tensorrt.compile(model_h, ir="dynamo", inputs=[inp])
    compile_s = time.perf_counter() - t0
    x = torch.randn(opt_b, 3, size, size, device="cuda", dtype=torch.half)
    with torch.inference_mode():
        cu.check_outputs(trt_mod(x).float(), model_h(x).float(), "fp16", label="Torch-TensorRT vs PyTorch FP16")
        m = cu.measure(lambda: trt_mod(x), device="cuda", batch_size=opt_b, label="Torch-TensorRT fp16")
    print(m, f"| compile {compile_s:.1f} s")
    cu.record(
        "08",
        "torch-tensorrt fp16",
        model="resnet18",
        device="cuda",
        dtype="fp16",
        measurement=m,
        notes=f"compile {compile_s:.1f} s",
    )
else:
    cu.results.show_reference("08", "torch-tensorrt")

# %% [markdown]
# ## What surprised us
# From this run's numbers: the FP16 file is half the size of the FP32 one (the weights dominate); on a GPU
# run, which engine won at each batch.

# %%
fp32_mib, fp16_mib = nodes.loc["resnet18 fp32", "MiB"], nodes.loc["resnet18 fp16", "MiB"]
print(f"ResNet-18 ONNX: {fp32_mib:.1f} MiB in FP32, {fp16_mib:.1f} MiB in FP16 ({fp32_mib / fp16_mib:.2f}x smaller).")
if rows:
    for b, c in engine_cmp.items():
        fastest = max(c.ratios, key=lambda k: c.ratios[k].low)  # the highest low end: the best case shown
        line = f"batch {b}: best against eager: {fastest} ({c.ratio(fastest)})"
        if {"fp16", "fp32"} <= set(c.per_round):
            line += f"; FP16 engine vs the true-FP32 engine: {c.ratio('fp16', vs='fp32')}"
        print(line + cu.modes.standin_label())
_ = cu.record(
    "08",
    "onnx export (build plan)",
    model="resnet18",
    device="cpu",
    dtype="fp32",
    notes=f"profile {profile.min}->{profile.max}; TensorRT ran here: {bool(engines)}",
)

# %% [markdown]
# ## Exercises
# The self-checks run your code against the fake TensorRT 11.1 (every class, method, argument and enum member
# of the real bindings; ONNX Runtime behind the engine), on a model and shapes drawn at random per call.
#
# 1. **`08.builder`: write the build for a two-input model.** `build(trt, onnx_path, shapes, workspace_bytes,
#    true_fp32)`: parse the file, give **every** input its `(min, opt, max)` shape from `shapes` in one
#    optimization profile, set the workspace limit, clear TF32 when `true_fp32` (TensorRT 11 allows TF32
#    unless told otherwise), and return the serialized plan as bytes. The check reads the plan (which file it
#    was built from, the profile of each input, the workspace) and the config the engine was built with, at the
#    moment of the build: TF32 cleared on another config or after the build does not count. Then it runs the
#    engine.


# %%
def build(trt, onnx_path: str, shapes: dict, workspace_bytes: int, true_fp32: bool) -> bytes:
    raise NotImplementedError  # your code here


cu.exercises.check("08.builder", build)

# %% [markdown]
# 2. **`08.runner`: write a runner's I/O loop for any engine.** `run_engine(trt, engine, context, feeds,
#    stream, producer)` gets a dict of input tensors by name and must: set each input's shape, give every
#    input and output its address, allocate each output with the shape and dtype the context reports, order
#    TensorRT's `stream` after the `producer` stream that wrote the inputs, execute on `stream`, order the
#    `producer` after it (later work reads the outputs), and return `{output name: tensor}`. The check looks
#    at the engine's own record: the buffers it read and wrote must be the ones you returned, and the stream
#    waits must come before and after the execution; then it runs your loop once more with the inputs on the GPU
#    (the rehearsal's stand-in on a CPU), where TensorRT takes device pointers only.


# %%
def run_engine(trt, engine, context, feeds, stream, producer):
    raise NotImplementedError  # your code here


cu.exercises.check("08.runner", run_engine)

# %% [markdown]
# 3. Choose a profile from observed traffic: (min, opt, max) batch, opt the most frequent batch, the smaller one
#    on a tie (`Counter.most_common` and `statistics.mode` keep the first seen). The check draws random traffic,
#    ties included.


# %%
def profile_from_traffic(batches: list[int]) -> tuple[int, int, int]:
    raise NotImplementedError  # your code here


cu.exercises.check("08.profile", profile_from_traffic)

# %% [markdown]
# 4. Which fields make a cached engine stale? Compare stored and current metadata (the build settings too), by
#    value: the stored record is read back from a file. The check draws random metadata with each field changed.


# %%
def stale_fields(stored: dict | None, here: dict) -> list[str]:
    raise NotImplementedError  # your code here


cu.exercises.check("08.stale", stale_fields)

# %% [markdown]
# ## Summary
# A TensorRT engine is a compiled, GPU- and version-specific plan: parse ONNX, configure the builder
# (workspace, TF32, optimization level, timing cache, profile), build, cache under a key of everything it
# depends on, and run it with torch tensors as buffers on a non-default stream. Precision lives in the ONNX
# graph: a half export for FP16, ModelOpt's Q/DQ nodes (calibrated on real data) for INT8. Next:
# **09 · Data pipeline**.
