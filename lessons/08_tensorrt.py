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
# **Goals.** Build TensorRT engines from an ONNX model with the current (TensorRT 10/11) API: the ONNX
# parser, a workspace limit, an optimization profile for a dynamic batch, FP32/TF32, FP16 (from a
# half-precision export) and INT8 by **explicit quantization** (Q/DQ nodes written into the ONNX file from
# calibration data). Cache engines under a key of GPU, compute capability, TensorRT version, precision,
# profile and ONNX file, so a stale or foreign engine is rebuilt instead of failing. Run them with torch
# CUDA tensors as buffers on a non-default stream; compare with PyTorch per precision; plot latency and
# throughput; try Torch-TensorRT, the one-line alternative.
#
# **The bottleneck it attacks** (see *01 · Measuring inference*): **compute** (kernels chosen by timing
# on this exact GPU, reduced precision on tensor cores), **memory traffic** (layer fusion) and
# **framework overhead** (no Python in the loop).
#
# **On a machine without a GPU** this lesson still runs: it exports the ONNX files, prints the build plan
# with its cache keys, explains each step, and shows GPU reference results if the course ships them.
# Every TensorRT cell is a GPU-only section. **None of the TensorRT code below has been run on a GPU by
# the course yet unless reference results are shown**: treat those paths as unverified.
#
# What changed in TensorRT 10 and 11 (most tutorials online use removed APIs): `build_engine`,
# `max_workspace_size`, the binding API (`get_binding_shape`, `set_binding_shape`) and
# `execute_async_v2` are gone (10.0); INT8 calibrators and the `FP16`/`INT8` builder flags are gone
# (11.0) because every network is strongly typed: precision comes from the ONNX graph.

# %%
import pandas as pd
import torch

import course_utils as cu
from course_utils import backends as be

device = cu.lesson.start("08", "TensorRT")
work = cu.results.results_dir() / "artifacts" / "08"  # .onnx and .engine files: never in the repository
work.mkdir(parents=True, exist_ok=True)
gpu_ready = torch.cuda.is_available() and not cu.modes.missing_modules(["tensorrt"])
print(f"TensorRT can run here: {gpu_ready}")

# %% [markdown]
# ## Step 1: the ONNX files, one per precision
# * **FP32** (and TF32, the same file built with the TF32 flag): the model as is.
# * **FP16**: export `model.half()` with a half input; the strongly typed engine then runs FP16.
# * **INT8**: NVIDIA ModelOpt reads the FP32 file and calibration samples, and writes a copy with
#   QuantizeLinear/DequantizeLinear pairs (explicit quantization). That needs the GPU extras
#   (`nvidia-modelopt`), so on a CPU-only machine the INT8 file is "made on the GPU machine".

# %%
model, note = cu.models.resnet("resnet18")
print(f"ResNet-18: {note}")
size = cu.pick(full=224, smoke=64)
example = torch.randn(1, 3, size, size)
onnx_fp32 = be.export_onnx(model, example, work / f"resnet18_{size}.onnx")
onnx_fp16 = be.export_onnx(model.half(), example.half(), work / f"resnet18_{size}.fp16.onnx")
model = model.float()
for p in (onnx_fp32, onnx_fp16):
    print(f"{p.name}: {p.stat().st_size / 2**20:.1f} MiB, ops {dict(be.count_nodes(p))}")

# %% [markdown]
# ### Calibration data for INT8, and the size knob
# Explicit quantization needs activation ranges, measured by running the model on representative inputs.
# More calibration samples give better ranges (up to a point) and a slower quantization step. Here the
# inputs are random (the weights are random too); with real weights, use real images.

# %%
calib_sizes = cu.pick(full=[16, 64, 256], smoke=[8])
calib_pool = torch.randn(max(calib_sizes), 3, size, size)
calib_files = {n: be.write_calibration(calib_pool, work / f"calib_{n}.npy", n) for n in calib_sizes}
onnx_int8 = {n: work / f"resnet18_{size}.int8-calib{n}.onnx" for n in calib_sizes}
print("The INT8 file is made with:")
print(" ".join(be.modelopt_int8_command(onnx_fp32, calib_files[calib_sizes[0]], onnx_int8[calib_sizes[0]])))

# %% [markdown]
# ## Step 2: the optimization profile
# TensorRT tunes kernels for concrete shapes. A dynamic batch needs a **profile**: the smallest and largest
# batch the engine accepts, and the one it is tuned for (`opt`). Shapes outside [min, max] are refused.

# %%
opt_b, max_b = cu.pick(full=(8, 64), smoke=(4, 8))
profile = be.Profile.for_batch("input", (3, size, size), 1, opt_b, max_b)
print(profile)

# %% [markdown]
# ## Step 3: the build plan and the cache key
# An engine is compiled for one GPU model and one TensorRT version. The cache key hashes everything the
# engine depends on; `be.load_or_build_engine` reuses a cached engine only if its stored metadata match
# this machine, else it rebuilds and says why. Without a GPU the plan is keyed for an example platform.

# %%
if gpu_ready:
    platform = be.current_platform()
else:
    platform = {"gpu_name": "example: NVIDIA H200", "compute_capability": (9, 0), "trt_version": "11.1.0"}
    print("No GPU/TensorRT here: keys below are for an example platform, to show what goes into them.")
sources = {"fp32": onnx_fp32, "tf32": onnx_fp32, "fp16": onnx_fp16}
sources.update({f"int8 (calib {n})": None for n in calib_sizes})
plan = be.build_plan(sources, profile, platform)
plan

# %% [markdown]
# Why a stale engine must be rebuilt: the same ONNX file, built on another machine with another
# TensorRT, is a different engine. The staleness check reads the metadata stored beside the engine.

# %%
here = be.engine_metadata(**platform, precision="fp16", profile=profile, onnx_sha256=be.file_sha256(onnx_fp16))
foreign = {**here, "gpu_name": "NVIDIA L4", "compute_capability": "8.9", "trt_version": "10.13.0"}
for reason in be.engine_staleness(foreign, here):
    print("rebuild:", reason)
print("same machine, same file -> reasons:", be.engine_staleness(here, here) or "none, the cached engine is used")

# %% [markdown]
# ## Step 4: build, cache and load (GPU)
# `be.build_engine`: `trt.Builder`, `create_network(0)` (TensorRT 11; on 10 the `STRONGLY_TYPED` flag),
# `OnnxParser.parse_from_file`, `config.set_memory_pool_limit(WORKSPACE, n)`, the profile,
# `build_serialized_network`. Build time is reported; a second run loads from the cache.

# %%
engines, infos = {}, {}
if cu.gpu_section("08.build", needs=("tensorrt", "modelopt")):
    import subprocess

    cache = work / "engines"
    for n in calib_sizes:
        if not onnx_int8[n].exists():
            cmd = be.modelopt_int8_command(onnx_fp32, calib_files[n], onnx_int8[n])
            subprocess.run(cmd, check=True, timeout=1800)
    build_list = {"fp32": (onnx_fp32, {"tf32": False}), "tf32": (onnx_fp32, {"tf32": True}),
                  "fp16": (onnx_fp16, {})}  # fmt: skip
    build_list.update({f"int8-calib{n}": (onnx_int8[n], {}) for n in calib_sizes})
    for name, (src, kw) in build_list.items():
        precision = name.split("-")[0]
        engines[name], infos[name] = be.load_or_build_engine(
            src, precision=precision, profile=profile, cache_dir=cache, workspace_bytes=2 << 30, **kw
        )
        i = infos[name]
        how = f"built in {i.build_s:.1f} s" if i.built else "loaded from cache"
        print(f"{name}: {how} ({i.reason}), "
              f"{i.engine_path.stat().st_size / 2**20:.1f} MiB")  # fmt: skip
    print(pd.DataFrame({k: {"built": v.built, "build_s": v.build_s, "key": v.key} for k, v in infos.items()}).T)
else:
    cu.results.show_reference("08", "build")

# %% [markdown]
# ## Step 5: inference with torch tensors as buffers, parity, speed (GPU)
# `be.TrtRunner`: `set_input_shape` for the batch, `set_tensor_address` with each torch tensor's
# `data_ptr()`, `execute_async_v3` on a non-default stream that waits for torch's stream (input ready)
# and is waited on by it (output ready). Parity per precision against PyTorch FP32, then latency and
# throughput per precision and batch.

# %%
if cu.gpu_section("08.run", needs=("tensorrt",)):
    model_g = model.cuda().eval()
    batches = [b for b in (1, opt_b, max_b)]
    tol = {"fp32": "fp32", "tf32": "tf32", "fp16": "fp16", "int8": "int8"}
    rows = []
    with torch.inference_mode():
        for b in batches:
            x = torch.randn(b, 3, size, size, device="cuda")
            m = cu.measure(lambda x=x: model_g(x), device="cuda", batch_size=b, label=f"torch eager b={b}")
            rows.append({"engine": "torch eager fp32", "batch": b, "median_ms": m.median_ms,
                         "throughput": m.throughput, "within_tolerance": True, "max_rel": 0.0})  # fmt: skip
    for name, engine in engines.items():
        runner = be.TrtRunner(engine)
        for b in batches:
            x = torch.randn(b, 3, size, size, device="cuda")
            with torch.inference_mode():
                ref = model_g(x)
            xin = x.half() if runner.input_dtype == torch.float16 else x
            precision = name.split("-")[0]
            cmp = cu.compare.compare_outputs(runner(xin).float(), ref, tol[precision])
            print(f"{name} b={b}: {cmp}")
            m = cu.measure(lambda r=runner, xin=xin: r(xin), device="cuda", batch_size=b, label=f"{name} b={b}")
            rows.append({"engine": name, "batch": b, "median_ms": m.median_ms, "throughput": m.throughput,
                         "within_tolerance": cmp.within, "max_rel": cmp.max_rel})  # fmt: skip
            cu.record("08", f"tensorrt {name}", model="resnet18", device="cuda", dtype=precision, measurement=m,
                      error_vs_baseline=cmp.max_rel, notes=f"build {infos[name].build_s:.1f} s")  # fmt: skip
    trt_table = pd.DataFrame(rows)
    cu.plots.batch_curve(trt_table.rename(columns={"engine": "variant", "batch": "batch_size"}),
                         title="TensorRT engines vs PyTorch (ResNet-18)")  # fmt: skip
    display(trt_table)  # noqa: F821 - IPython's display
else:
    cu.results.show_reference("08", "tensorrt")

# %% [markdown]
# ### The pycuda variant (only when pycuda imports)
# The classic samples manage device memory with pycuda. Import `pycuda.autoprimaryctx` (not
# `pycuda.autoinit`, which creates a second CUDA context beside PyTorch's). Host numpy in, numpy out.

# %%
if cu.gpu_section("08.pycuda", needs=("tensorrt",)):
    if be.pycuda_available() and "fp32" in engines:
        prunner = be.PycudaTrtRunner(engines["fp32"])
        xn = torch.randn(1, 3, size, size)
        out = torch.from_numpy(prunner(xn.numpy()))
        with torch.inference_mode():
            cu.check_outputs(out, model.cpu()(xn), "tf32", label="TensorRT via pycuda vs PyTorch")
    else:
        print("pycuda is optional and not importable here (it builds from source): the torch-buffer runner "
              "above does the same without it.")  # fmt: skip
else:
    cu.results.show_reference("08", "pycuda")

# %% [markdown]
# ## Torch-TensorRT: the one-line alternative (GPU)
# `torch_tensorrt.compile` partitions the graph, builds TensorRT engines for the supported parts and
# falls back to PyTorch for the rest. In torch-tensorrt 2.14 precision is typed by the model: call
# `.half()` rather than passing `enabled_precisions`. Its pins (TensorRT 11.1.x, torch 2.14.x) are the
# GPU extras' versions.

# %%
if cu.gpu_section("08.torch-tensorrt", needs=("tensorrt", "torch_tensorrt")):
    import time

    import torch_tensorrt

    model_h = cu.models.resnet("resnet18")[0].cuda().half()
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
# On a GPU run the lines below compare precisions from this run; on a CPU-only run they say what was
# prepared.

# %%
print(f"Prepared here: {onnx_fp32.name} ({onnx_fp32.stat().st_size / 2**20:.1f} MiB) and {onnx_fp16.name} "
      f"({onnx_fp16.stat().st_size / 2**20:.1f} MiB): the FP16 file is "
      f"{onnx_fp32.stat().st_size / onnx_fp16.stat().st_size:.2f}x smaller.")  # fmt: skip
if engines and "trt_table" in globals():
    t = trt_table.pivot(index="batch", columns="engine", values="median_ms")
    for b in t.index:
        best = t.loc[b].idxmin()
        print(f"batch {b}: fastest {best} ({t.loc[b, best]:.3f} ms); fp16 is "
              f"{t.loc[b, 'fp32'] / t.loc[b, 'fp16']:.2f}x the fp32 engine's speed.")  # fmt: skip
_ = cu.record("08", "onnx export (build plan)", model="resnet18", device="cpu", dtype="fp32",
          notes=f"profile {profile.min}->{profile.max}; TensorRT ran here: {bool(engines)}")  # fmt: skip

# %% [markdown]
# ## Exercises
# 1. Choose a profile from observed traffic: (min, opt, max) batch, opt the most frequent batch.

# %%
def profile_from_traffic(batches: list[int]) -> tuple[int, int, int]:
    raise NotImplementedError  # your code here


cu.exercises.check("08.profile", profile_from_traffic)

# %% [markdown]
# 2. Which fields make a cached engine stale? Compare stored and current metadata.

# %%
def stale_fields(stored: dict | None, here: dict) -> list[str]:
    raise NotImplementedError  # your code here


cu.exercises.check("08.stale", stale_fields)

# %% [markdown]
# ## Summary
# A TensorRT engine is a compiled, GPU- and version-specific artifact: build it from ONNX with a profile,
# choose precision in the ONNX graph (half export, Q/DQ from calibration), cache it under a key of what
# it depends on, and feed it torch tensors directly. Next: **09 · Data pipeline**.
