# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 00 · Environment check
#
# **Goals.** Know what this machine can do before you measure anything: which device the lessons will
# use, which precisions and backends exist here, which sections will run and which will be skipped (and
# why), the size mode in force, and where your results go.
#
# Every later lesson starts with the same two lines: import `course_utils` and call `cu.lesson.start`.

# %%
import course_utils as cu

device = cu.lesson.start("00", "Environment check")

# %% [markdown]
# ## The capability table
# `cu.device.capabilities()` gathers the facts; a value of `None` means "not applicable here" (no GPU),
# and `missing (...)` shows the import error of an optional backend.

# %%
caps = cu.device.capabilities()
cu.device.capability_table(caps)

# %% [markdown]
# ## What will run here
# The table below is computed from the capabilities above. GPU-only sections skip on a machine without
# CUDA and say why; with `COURSE_STRICT_GPU=1` they fail instead (that is how the GPU test run makes sure
# nothing was skipped).

# %%
import pandas as pd

gpu = bool(caps["cuda_available"])
has = {name: not str(caps[name]).startswith("missing") for name in ("onnxruntime", "tensorrt", "torch_tensorrt", "torchao")}
capability = tuple(int(v) for v in caps["gpu_capability"].split(".")) if gpu else (0, 0)
plan = pd.DataFrame(
    [
        ("timing, profiling, batching, memory (all lessons' CPU parts)", True, "always"),
        ("CUDA events, streams, CUDA graphs, pinned memory", gpu, "needs a CUDA GPU"),
        ("BF16 autocast on CPU", True, "runs; pays only if the CPU has BF16 instructions: "
         + ("this one has them" if caps["cpu_bf16"] else "this one does not")),
        ("FP16 / BF16 / TF32 on GPU", gpu, "needs a CUDA GPU"),
        ("ONNX Runtime (CPU provider)", has["onnxruntime"], "needs onnxruntime"),
        ("ONNX Runtime CUDA provider", gpu and has["onnxruntime"], "needs a GPU and onnxruntime-gpu"),
        ("TensorRT engines", gpu and has["tensorrt"], "needs a GPU and the GPU extras (make setup on a GPU machine)"),
        ("Torch-TensorRT", gpu and has["torch_tensorrt"], "needs a GPU and torch-tensorrt"),
        ("FP8 (torchao, TensorRT)", gpu and capability >= (8, 9), "needs compute capability 8.9 or newer"),
        ("INT8 on CPU (dynamic, PT2E, torchao)", True, "runs; VNNI instructions "
         + ("present" if caps["cpu_avx512_vnni"] else "absent: expect little gain")),
    ],
    columns=["section", "runs here", "condition"],
)
plan

# %% [markdown]
# ## Modes and results
# * `COURSE_SMOKE=1` shrinks sizes and repeats (the tests use it); unset, lessons run at full size.
# * `COURSE_STRICT_GPU=1` makes every GPU-only section fail instead of skipping.
# * `COURSE_RESULTS_DIR` sets the results folder (default `results/` in the repository, ignored by git).
#   Each lesson appends one row per measured variant to `<machine>.csv` there.

# %%
cu.modes.mode_summary()

# %% [markdown]
# A first GPU-only section. On a machine without CUDA it prints why it was skipped and records the skip;
# on a GPU it checks that a tensor really lands on the device.

# %%
import torch

if cu.gpu_section("00.gpu-visible"):
    x = torch.ones(1024, device="cuda")
    assert x.device.type == "cuda" and float(x.sum()) == 1024.0
    print(f"GPU memory: {torch.cuda.get_device_properties(0).total_memory / 2**30:.1f} GiB total")

# %% [markdown]
# ## A quick sanity measurement
# One row into the results file, so that you can see where results go: a 512×512 matrix product on this
# machine's default device, timed with `cu.measure` (lesson 01 explains how).

# %%
n = cu.pick(full=512, smoke=128)
a = torch.randn(n, n, device=device)
m = cu.measure(lambda: a @ a, device=device, label=f"matmul {n}x{n}")
print(m)
cu.record("00", "sanity matmul", model=f"matmul{n}", device=str(device), dtype="fp32", measurement=m)
print(f"That is {2 * n**3 / (m.median_ms / 1000) / 1e9:.1f} GFLOP/s.")

# %% [markdown]
# ## Exercise
# Write `describe_machine(caps)` that returns `"gpu"` when the capability dict says CUDA is available and
# `"cpu"` otherwise. The self-check calls it on a few made-up dicts.

# %%
def describe_machine(caps: dict) -> str:
    raise NotImplementedError  # your code here


cu.exercises.check("00.describe", describe_machine)

# %% [markdown]
# ## Summary
# You know what this machine has and which sections will run. Next: **01 · Measuring inference**, how to
# time GPU and CPU work without fooling yourself.
