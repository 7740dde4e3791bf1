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

# %% tags=["contract"]
import json  # noqa: E402 - the cells tagged "contract" are executed alone by tests/gpu_contract
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from course_utils import backends as be  # noqa: E402
from course_utils import engines as eng  # noqa: E402

# %% [markdown]
# ## Step 1: ONNX files, where precision is decided
# TensorRT 11 builds what the ONNX graph says: an FP32 export gives an FP32 engine (TF32 allowed or not by a
# builder flag), an export of `model.half()` gives an FP16 engine, and Q/DQ nodes give INT8. So FP32 and FP16
# need nothing but `torch.onnx.export`; only INT8 needs a quantization tool (NVIDIA ModelOpt, below).
#
# Two models: the shipped **digits CNN** (trained weights, real test images: accuracy is meaningful) and
# **ResNet-18** (speed at realistic sizes; random weights unless ImageNet weights are in your torch cache).
# `be.export_onnx` is lesson 07's export (`dynamo=True`, a dynamic batch, one file, `onnx.checker`).

# %%
digits = cu.data.load_digits_split()
cnn = cu.models.load_digits_model("cnn")
size = cu.pick(full=224, smoke=64)
resnet, note = cu.models.resnet("resnet18")
print(f"ResNet-18: {note}; input {size}x{size}")
onnx_files = {
    "digits fp32": be.export_onnx(cnn, digits.x_test[:2], work / "digits_cnn.onnx"),
    "digits fp16": be.export_onnx(cnn.half(), digits.x_test[:2].half(), work / "digits_cnn.fp16.onnx"),
    "resnet18 fp32": be.export_onnx(resnet, torch.randn(2, 3, size, size), work / f"resnet18_{size}.onnx"),
    "resnet18 fp16": be.export_onnx(
        resnet.half(), torch.randn(2, 3, size, size).half(), work / f"resnet18_{size}.fp16.onnx"
    ),
}
cnn, resnet = cnn.float(), resnet.float()
nodes = pd.DataFrame(
    {k: {"MiB": p.stat().st_size / 2**20, "ONNX nodes": sum(be.count_nodes(p).values())} for k, p in onnx_files.items()}
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


# %% tags=["contract"]
def build_engine(trt, onnx_path, profile, *, workspace_bytes=1 << 30, tf32=True, opt_level=3,
                 timing_cache=None, hardware_compat=None, version_compatible=False):  # fmt: skip
    """Build a serialized TensorRT engine (bytes) from an ONNX file with one optimization profile."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 11: every network is strongly typed
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # a str: the binding does not take a Path
        errors = [parser.get_error(i).desc() for i in range(parser.num_errors)]
        raise eng.EngineBuildError(f"TensorRT could not parse {onnx_path}: {errors}")
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
        raise eng.EngineBuildError(f"TensorRT could not build {onnx_path}: see the log above (workspace? profile?)")
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


# %% tags=["contract"]
def load_or_build(trt, runtime, onnx_path, profile, cache_dir, platform, precision, **settings):
    """A cached engine if its metadata match this machine and these settings, else a freshly built one."""
    meta = eng.engine_metadata(**platform, precision=precision, profile=profile,
                              onnx_sha256=be.file_sha256(onnx_path), build=eng.build_settings(**settings))  # fmt: skip
    key = eng.engine_cache_key(**meta)
    path = Path(cache_dir) / f"{Path(onnx_path).stem}-{precision}-{key}.engine"
    meta_path = path.with_suffix(".json")
    stale = eng.engine_staleness(eng.read_metadata(meta_path), meta) if path.exists() else ["no cached engine"]
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
    return runtime.deserialize_cuda_engine(plan), {"built": True, "build_s": build_s, "why": "; ".join(stale),
                                                   "key": key}  # fmt: skip


# %% [markdown]
# ## Step 4: the runner, written out
# The engine lists its I/O tensors by name (`num_io_tensors`, `get_tensor_name`, `get_tensor_mode`). Per
# call: `set_input_shape` picks the batch (False when outside the profile), `set_tensor_address` gives
# TensorRT each torch tensor's device pointer (`data_ptr()`: no copies), and `execute_async_v3` enqueues the
# work on a **non-default stream**. Two `wait_stream` calls order it with PyTorch's stream: TensorRT starts
# after the input is written, and later torch work waits for the output.
#
# *Verification: contract-tested by `tests/gpu_contract/test_l08_tensorrt.py`; never executed on a GPU.*

# %% tags=["contract"]
TORCH_DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT8": torch.int8,
                "INT32": torch.int32, "INT64": torch.int64, "BOOL": torch.bool}  # fmt: skip


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
            raise be.BadInputError(f"engine input '{name}' is {self.dtypes[name]}, got {x.dtype}: use x.to()")
        x = x.contiguous()
        if not self.context.set_input_shape(name, tuple(x.shape)):
            lo, _, hi = self.engine.get_tensor_profile_shape(name, 0)
            raise be.BadInputError(f"shape {tuple(x.shape)} is outside the engine's profile for '{name}' "
                                   f"({tuple(lo)} to {tuple(hi)}): rebuild with a profile that covers it")  # fmt: skip
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
# `course_utils.engines.TrtRunner` is this runner again, for lesson 14's `optimize()`; it also splits a
# batch larger than the profile's maximum into chunks.
#
# ## Step 5: the plan and its cache keys (every machine)
# The profile for ResNet-18: batch 1 to `max`, tuned at `opt`. Below, the engines this lesson builds and
# their keys. Without a GPU the keys are computed for an example platform, to show what goes into them.

# %%
opt_b, max_b = cu.pick(full=(8, 64), smoke=(4, 8))
profile = eng.Profile.for_batch("input", (3, size, size), 1, opt_b, max_b)
digits_profile = eng.Profile.for_batch("input", (1, 8, 8), 1, 64, 512)
if torch.cuda.is_available() and trt is not None:
    platform = {"gpu_name": torch.cuda.get_device_name(0), "compute_capability": torch.cuda.get_device_capability(0),
                "trt_version": trt.__version__}  # fmt: skip
else:
    platform = {"gpu_name": "example: NVIDIA H200", "compute_capability": (9, 0), "trt_version": "11.1.0"}
builds = {  # name: (ONNX file, precision, build settings)
    "fp32": (onnx_files["resnet18 fp32"], "fp32", {"tf32": False}),
    "tf32": (onnx_files["resnet18 fp32"], "tf32", {"tf32": True}),
    "fp16": (onnx_files["resnet18 fp16"], "fp16", {}),
    "fp16 level 1": (onnx_files["resnet18 fp16"], "fp16", {"opt_level": 1}),
    "fp16 ampere+": (onnx_files["resnet18 fp16"], "fp16", {"hardware_compat": "AMPERE_PLUS"}),
}
plan = eng.build_plan({k: v[0] for k, v in builds.items()}, profile, platform, {k: v[2] for k, v in builds.items()})
display(plan)

# %%
here = eng.engine_metadata(**platform, precision="fp16", profile=profile,
                          onnx_sha256=be.file_sha256(onnx_files["resnet18 fp16"]))  # fmt: skip
foreign = {**here, "gpu_name": "NVIDIA L4", "compute_capability": "8.9", "trt_version": "10.13.0",
           "build": eng.build_settings(opt_level=5)}  # fmt: skip
for reason in eng.engine_staleness(foreign, here):
    print("rebuild:", reason)
print("same machine, file and settings:", eng.engine_staleness(here, here) or "no reason: the cached engine is used")

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
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    cache_dir, timing = work / "engines", work / "timing.cache"
    for name, (src, precision, settings) in builds.items():
        engines[name], infos[name] = load_or_build(trt, runtime, src, profile, cache_dir, platform, precision,
                                                   timing_cache=timing, **settings)  # fmt: skip
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
if cu.gpu_section("08.fusion", needs=("tensorrt",)) and "fp16" in engines:
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
# *Verification: contract-tested by `tests/gpu_contract/test_l08_tensorrt.py`; never executed on a GPU.*

# %%
rows = []
if cu.gpu_section("08.run", needs=("tensorrt",)) and engines:
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model_g = resnet.cuda().eval()
    stream = torch.cuda.Stream()  # not the default stream: TensorRT would synchronize the device on it
    tol = {name: precision for name, (_, precision, _) in builds.items()}  # compare's tolerance names
    for b in (1, opt_b, max_b):
        x = torch.randn(b, 3, size, size, device="cuda")
        with torch.inference_mode():
            ref = model_g(x)
            m = cu.measure(lambda x=x: model_g(x), device="cuda", batch_size=b, label=f"eager b={b}")
        rows.append({"engine": "torch eager fp32", "batch": b, "median_ms": m.median_ms, "throughput": m.throughput})
        for name, engine in engines.items():
            runner = TrtRunner(trt, engine, stream)
            xin = x.to(runner.dtypes[runner.inputs[0]])
            cmp = cu.check_outputs(runner(xin).float(), ref, tol[name], label=f"{name} b={b}")
            m = cu.measure(lambda r=runner, xin=xin: r(xin), device="cuda", batch_size=b, label=f"{name} b={b}")
            rows.append({"engine": name, "batch": b, "median_ms": m.median_ms, "throughput": m.throughput,
                         "max_rel": cmp.max_rel})  # fmt: skip
            cu.record("08", f"tensorrt {name}", model="resnet18", device="cuda", dtype=name.split()[0],
                      measurement=m, error_vs_baseline=cmp.max_rel)  # fmt: skip
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = True
    trt_table = pd.DataFrame(rows)
    display(trt_table.pivot(index="batch", columns="engine", values="median_ms"))
    cu.plots.batch_curve(trt_table.rename(columns={"engine": "variant", "batch": "batch_size"}),
                         title="TensorRT engines vs PyTorch (ResNet-18)")  # fmt: skip
    per_img = trt_table[trt_table.engine == "fp16"].set_index("batch")["median_ms"]
    print(f"fp16 engine: {per_img[opt_b] / opt_b:.4f} ms per image at opt={opt_b}, "
          f"{per_img[max_b] / max_b:.4f} ms per image at max={max_b}")  # fmt: skip
else:
    cu.results.show_reference("08", "tensorrt")

# %% [markdown]
# **Outside the profile.** A batch above `max` is refused by `set_input_shape`; the runner turns that into a
# course error naming the fix (a profile that covers it), instead of a wrong result.
#
# *Verification: contract-tested by `tests/gpu_contract/test_l08_tensorrt.py`; never executed on a GPU.*

# %%
if cu.gpu_section("08.profile-error", needs=("tensorrt",)) and "fp16" in engines:
    try:
        TrtRunner(trt, engines["fp16"], torch.cuda.Stream())(torch.randn(max_b + 1, 3, size, size).cuda().half())
    except be.BadInputError as exc:
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
calib = eng.write_calibration(digits.x_train, work / f"digits_calib_{calib_n}.npy", calib_n)
onnx_int8 = work / f"digits_cnn.int8-calib{calib_n}.onnx"
int8_cmd = eng.modelopt_int8_command(onnx_files["digits fp32"], calib, onnx_int8)
print(f"calibration: {calib_n} real training digits -> {calib.name}")
print(" ".join(Path(a).name if a.startswith("/") else a for a in int8_cmd))

# %%
if cu.gpu_section("08.int8", needs=("tensorrt", "modelopt")):
    if not onnx_int8.exists():
        subprocess.run(int8_cmd, check=True, timeout=1800)
    print("Q/DQ nodes:", {k: v for k, v in be.count_nodes(onnx_int8).items() if "Linear" in k})
    runtime = runtime or trt.Runtime(trt.Logger(trt.Logger.WARNING))
    stream = torch.cuda.Stream()
    acc, cnn_g = {}, cnn.cuda().eval()
    xt, yt = digits.x_test.cuda(), digits.y_test.cuda()
    acc["torch fp32"] = cu.models.accuracy(cnn_g, xt, yt)
    for name, src in {"fp16": onnx_files["digits fp16"], "int8": onnx_int8}.items():
        eng, _ = load_or_build(trt, runtime, src, digits_profile, work / "engines", platform, name)
        runner = TrtRunner(trt, eng, stream)
        acc[f"tensorrt {name}"] = cu.models.accuracy(lambda x, r=runner: r(x.to(r.dtypes["input"])), xt, yt,
                                                     batch_size=512)  # fmt: skip
    print({k: f"{v:.2%}" for k, v in acc.items()})
    cu.record("08", "tensorrt int8 digits", model="digits_cnn", device="cuda", dtype="int8",
              notes=f"accuracy {acc['tensorrt int8']:.4f} vs torch fp32 {acc['torch fp32']:.4f}")  # fmt: skip
else:
    cu.results.show_reference("08", "int8")

# %% [markdown]
# ## Step 10: ResNet-50 at large batch (GPU)
# The course's GPU targets (COURSE.md) are about ResNet-50: throughput at large batch and batch-1 latency.
# An FP16 engine with a profile from 1 to a large batch; throughput in images per second from this run.
#
# *Verification: contract-tested by `tests/gpu_contract/test_l08_tensorrt.py`; never executed on a GPU.*

# %%
if cu.gpu_section("08.resnet50", needs=("tensorrt",)):
    r50, r50_note = cu.models.resnet("resnet50")
    big = cu.pick(full=256, smoke=8)
    r50_onnx = be.export_onnx(r50.half(), torch.randn(2, 3, 224, 224).half(), work / "resnet50.fp16.onnx")
    r50_profile = eng.Profile.for_batch("input", (3, 224, 224), 1, big, big)
    runtime = runtime or trt.Runtime(trt.Logger(trt.Logger.WARNING))
    r50_engine, r50_info = load_or_build(trt, runtime, r50_onnx, r50_profile, work / "engines", platform, "fp16",
                                         workspace_bytes=4 << 30)  # fmt: skip
    runner = TrtRunner(trt, r50_engine, torch.cuda.Stream())
    for b in (1, big):
        x = torch.randn(b, 3, 224, 224, device="cuda", dtype=torch.half)
        m = cu.measure(lambda x=x: runner(x), device="cuda", batch_size=b, label=f"resnet50 fp16 b={b}")
        print(f"ResNet-50 FP16 engine, batch {b}: {m.median_ms:.3f} ms, {m.throughput * 1000:.0f} images/s")
        cu.record("08", "tensorrt resnet50 fp16", model="resnet50", device="cuda", dtype="fp16", measurement=m)
else:
    cu.results.show_reference("08", "resnet50")

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
print(f"polygraphy run {fp16_file} --trt --onnxrt --trt-min-shapes input:[{','.join(map(str, profile.min))}] "
      f"--trt-opt-shapes input:[{','.join(map(str, profile.opt))}] "
      f"--trt-max-shapes input:[{','.join(map(str, profile.max))}] --atol 1e-2 --rtol 1e-2")  # fmt: skip

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
    cu.record("08", "torch-tensorrt fp16", model="resnet18", device="cuda", dtype="fp16", measurement=m,
              notes=f"compile {compile_s:.1f} s")  # fmt: skip
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
    t = pd.DataFrame(rows).pivot(index="batch", columns="engine", values="median_ms")
    for b in t.index:
        print(f"batch {b}: fastest {t.loc[b].idxmin()} ({t.loc[b].min():.3f} ms); FP16 engine "
              f"{t.loc[b, 'fp32'] / t.loc[b, 'fp16']:.2f}x the true-FP32 engine's speed")  # fmt: skip
_ = cu.record("08", "onnx export (build plan)", model="resnet18", device="cpu", dtype="fp32",
              notes=f"profile {profile.min}->{profile.max}; TensorRT ran here: {bool(engines)}")  # fmt: skip

# %% [markdown]
# ## Exercises
# 1. **Write a runner's I/O loop for any engine.** `run_engine(trt, engine, context, feeds, stream)` gets a
#    dict of input tensors by name and must: set each input's shape, give every input and output its
#    address, allocate each output with the shape and dtype the context reports, execute on `stream`, and
#    return `{output name: tensor}`. The self-check runs your function against the contract suite's fake
#    TensorRT 11.1 (an engine with two inputs and two outputs of different dtypes): a method or argument
#    that does not exist in TensorRT 11.1 fails, and so does a wrong answer.


# %%
def run_engine(trt, engine, context, feeds, stream):
    raise NotImplementedError  # your code here


cu.exercises.check("08.runner", run_engine)

# %% [markdown]
# 2. Choose a profile from observed traffic: (min, opt, max) batch, opt the most frequent batch.


# %%
def profile_from_traffic(batches: list[int]) -> tuple[int, int, int]:
    raise NotImplementedError  # your code here


cu.exercises.check("08.profile", profile_from_traffic)

# %% [markdown]
# 3. Which fields make a cached engine stale? Compare stored and current metadata (the build settings too).


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
