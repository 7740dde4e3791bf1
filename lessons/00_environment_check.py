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
# **Goals.** Know what this machine can do before you measure anything: ask PyTorch and ONNX Runtime yourself
# which device, cores, instruction sets, precisions and backends exist here; see which sections will run and
# which will be skipped (and why), the size mode in force, and where your results go.
#
# Every later lesson starts with the same two lines: import `course_utils` and call `cu.lesson.start`.

# %%
import os
import platform
import shutil
import subprocess

import pandas as pd
import psutil
import torch
from IPython.display import display

import course_utils as cu

device = cu.lesson.start("00", "Environment check")

# %% [markdown]
# ## Exercise first: ask the machine yourself
# **00.inventory.** Before you read the course's queries below, write your own. `inventory()` returns a dict:
# * `"cuda"`: is a CUDA GPU usable? `torch.cuda.is_available()`;
# * `"gpus"`: one dict per GPU index `i` in `range(torch.cuda.device_count())` (none without CUDA), from
#   `props = torch.cuda.get_device_properties(i)`: `"name"` (`props.name`), `"capability"` (the tuple
#   `(props.major, props.minor)`), `"memory_gib"` (`props.total_memory` in GiB: divide by `2**30`) and
#   `"multiprocessors"` (`props.multi_processor_count`);
# * `"cpu_capability"`: the vector instruction set PyTorch's CPU kernels use, `torch.backends.cpu.get_cpu_capability()`;
# * `"ort_providers"`: `onnxruntime.get_available_providers()`, as a list.
#
# The self-check runs your function on three made-up machines (no GPU, a few GPUs of kinds no table holds),
# then on this one: only code that really asks PyTorch and ONNX Runtime gets every machine right.
#
# What every exercise's check is: a **self-check for honest work**. It runs your function on cases drawn at
# random (their edges included), looks where the technique runs (the operators and dtypes, the graph, the
# engine's settings) and names the mistake it sees; its ✓ line lists only what it observed. It is not an exam:
# code that reads or patches the checker can fool it, and fools only you.


# %%
def inventory():
    raise NotImplementedError  # your code here


cu.exercises.check("00.inventory", inventory)

# %% [markdown]
# ## Ask the machine yourself
# These are the queries behind every capability table; the course's `cu.device.capabilities()` makes the
# same calls. Three things to notice:
# * **logical vs physical cores**: with simultaneous multithreading (Hyper-Threading) each physical core shows
#   up as two logical ones, which share its arithmetic units. PyTorch's default thread count is usually the
#   physical count, and compute-bound work rarely gains from the logical extras.
# * **the CPU capability**: the widest vector instruction set PyTorch's CPU kernels use here (`AVX512`,
#   `AVX2`, ...). Wider vectors mean more FLOP per cycle (lesson 01 turns this into the CPU's peak).
# * **ONNX Runtime's providers**: `get_available_providers()` lists what the installed *package* was built
#   with, not what this machine can run: a GPU build lists CUDA even where no GPU exists. Decide "GPU
#   present" with `torch.cuda.is_available()`.

# %%
raw = {
    "python": platform.python_version(),
    "torch": torch.__version__,
    "torch built for CUDA": torch.version.cuda,
    "torch.cuda.is_available()": torch.cuda.is_available(),
    "logical cores (os.cpu_count)": os.cpu_count(),
    "physical cores (psutil)": psutil.cpu_count(logical=False),
    "torch threads (intra-op)": torch.get_num_threads(),
    "CPU capability (torch.backends.cpu)": torch.backends.cpu.get_cpu_capability(),
    "CPU model": cu.device.cpu_model(),
    "RAM GiB": round(psutil.virtual_memory().total / 2**30, 1),
    "cuDNN": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
}
try:
    import onnxruntime as ort

    raw["onnxruntime"] = ort.__version__
    raw["ORT providers (built in)"] = ", ".join(ort.get_available_providers())
except ImportError as exc:
    raw["onnxruntime"] = f"missing ({exc})"
if torch.cuda.is_available():
    major, minor = torch.cuda.get_device_capability(0)
    raw["GPU"] = torch.cuda.get_device_name(0)
    raw["GPU compute capability"] = f"{major}.{minor}"
    raw["GPU memory GiB"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
display(pd.DataFrame({"query": list(raw), "answer": [str(v) for v in raw.values()]}))

# %% [markdown]
# PyTorch's own summary of its CPU threading (OpenMP, MKL, oneDNN and their thread counts):

# %%
print(torch.__config__.parallel_info())

# %% [markdown]
# The instruction-set flags that decide whether reduced precision pays on this CPU (Linux reports them in
# `/proc/cpuinfo`): VNNI for INT8 (lesson 05), AVX-512 BF16 or AMX for BF16 (lesson 04).

# %%
flags = cu.device.cpu_flags()
isa = {f: f in flags for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")}
print(", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in isa.items()))

# %% [markdown]
# ## The GPU in detail: driver, clocks, MIG
# On a GPU machine, two more sources: `torch.cuda.get_device_properties` (multiprocessors, memory, L2 cache,
# clock) and `nvidia-smi` (the driver version, the current and maximum clocks, and the MIG mode). **MIG**
# (Multi-Instance GPU, on A100/H100/H200 class GPUs) splits one GPU into isolated slices: inside a slice you
# get a fraction of the multiprocessors and memory, and every number in this course shrinks with it. A GPU
# whose current clock sits far below its maximum is idle or power-capped: time it under load (lesson 01).
# *Verification: contract-tested (`tests/gpu_contract/test_l00_env.py` checks the property names against
# torch's real `_CudaDeviceProperties` and parses `nvidia-smi` CSV output); not yet executed on a GPU.*

# %% tags=["contract"]
SMI_FIELDS = ["driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "power.limit", "mig.mode.current"]


def nvidia_smi(fields=SMI_FIELDS, run=subprocess.run):
    """nvidia-smi's answer for GPU 0 as {field: value}, or None when nvidia-smi is not here."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    cmd = [exe, "--id=0", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    out = run(cmd, capture_output=True, text=True, timeout=20)
    if out.returncode != 0 or not out.stdout.strip():
        return None
    return dict(zip(fields, (v.strip() for v in out.stdout.splitlines()[0].split(",")), strict=True))


def gpu_properties(index=0):
    """The properties PyTorch reports for one GPU, with units in the names."""
    p = torch.cuda.get_device_properties(index)
    return {
        "name": p.name,
        "capability": f"{p.major}.{p.minor}",
        "multiprocessors": p.multi_processor_count,
        "memory GiB": round(p.total_memory / 2**30, 1),
        "L2 cache MiB": round(p.L2_cache_size / 2**20, 1),
        "max SM clock MHz (props)": round(p.clock_rate / 1000),
        "uuid": str(p.uuid),
    }


# %%
if cu.gpu_section("00.gpu-visible"):
    x = torch.ones(1024, device="cuda")
    assert x.device.type == "cuda" and float(x.sum()) == 1024.0
    gpu = gpu_properties(0)
    smi = nvidia_smi() or {"nvidia-smi": "not found on PATH"}
    display(pd.Series({**gpu, **smi}, name="GPU 0").to_frame())
    mig = smi.get("mig.mode.current", "")
    print("MIG is on: you are measuring a slice of the GPU." if mig.lower() == "enabled" else f"MIG mode: {mig}")
else:
    cu.results.show_reference("00")

# %% [markdown]
# ## The capability table and what will run here
# `cu.device.capabilities()` gathers the same facts as one dict (lessons and result rows use it); a value of
# `None` means "not applicable here", and `missing (...)` shows the import error of an optional backend.
# The plan below is computed from it. GPU-only sections skip on a machine without CUDA and say why; with
# `COURSE_STRICT_GPU=1` they fail instead (that is how the GPU test run makes sure nothing was skipped).

# %%
caps = cu.device.capabilities()
gpu = bool(caps["cuda_available"])
has = {name: not str(caps[name]).startswith("missing") for name in ("onnxruntime", "tensorrt", "torch_tensorrt")}
plan = pd.DataFrame(
    [
        ("timing, profiling, batching, memory (all lessons' CPU parts)", True, "always"),
        ("CUDA events, streams, CUDA graphs, pinned memory", gpu, "needs a CUDA GPU"),
        (
            "BF16 autocast on CPU",
            True,
            "runs; pays only with BF16 instructions: "
            + ("this CPU has them" if caps["cpu_bf16"] else "this CPU has none"),
        ),
        ("TF32 / BF16 / FP8 on GPU", gpu, "needs a CUDA GPU of the right generation: the exercise below"),
        ("ONNX Runtime (CPU provider)", has["onnxruntime"], "needs onnxruntime"),
        ("ONNX Runtime CUDA provider", gpu and has["onnxruntime"], "needs a GPU and onnxruntime-gpu"),
        ("TensorRT engines", gpu and has["tensorrt"], "needs a GPU and the GPU extras (make setup on a GPU machine)"),
        ("Torch-TensorRT", gpu and has["torch_tensorrt"], "needs a GPU and torch-tensorrt"),
        (
            "INT8 on CPU (dynamic, PT2E, torchao)",
            True,
            "runs; VNNI instructions " + ("present" if caps["cpu_avx512_vnni"] else "absent: expect little gain"),
        ),
    ],
    columns=["section", "runs here", "condition"],
)
display(cu.device.capability_table(caps))
display(plan)

# %% [markdown]
# ## Modes and results
# * `COURSE_SMOKE=1` shrinks sizes and repeats (the tests use it); unset, lessons run at full size.
# * `COURSE_STRICT_GPU=1` makes every GPU-only section fail instead of skipping.
# * `COURSE_RESULTS_DIR` sets the results folder (default `results/` in the repository, ignored by git).
#   Each lesson appends one row per measured variant to `<machine>.csv` there.

# %%
cu.modes.mode_summary()

# %% [markdown]
# ## A quick sanity measurement
# One row into the results file, so that you can see where results go: a 512×512 matrix product on this
# machine's default device, timed with `cu.measure` (lesson 01 writes this timer out and explains it).

# %%
n = cu.pick(full=512, smoke=128)
a = torch.randn(n, n, device=device)
m = cu.measure(lambda: a @ a, device=device, label=f"matmul {n}x{n}")
print(m)
cu.record("00", "sanity matmul", model=f"matmul{n}", device=str(device), dtype="fp32", measurement=m)
print(f"That is {2 * n**3 / (m.median_ms / 1000) / 1e9:.1f} GFLOP/s on {raw['torch threads (intra-op)']} threads.")

# %% [markdown]
# ## What surprised us
# Printed from this run: how far apart the timings of one and the same matrix product were. One timing is a
# sample, not the answer, which is why every later lesson reports medians, spreads and intervals.

# %%
fastest, slowest = min(m.times_ms), max(m.times_ms)
print(
    f"The same {n}x{n} product, timed {m.n} times: fastest {fastest:.3f} ms, slowest {slowest:.3f} ms, median "
    f"{m.median_ms:.3f} ms, 10th to 90th percentile {m.p10_ms:.3f} to {m.p90_ms:.3f} ms. A single timing could "
    f"have been any of these."
)

# %% [markdown]
# ## Exercise
# **00.precisions.** NVIDIA GPUs are identified by their compute capability `(major, minor)`, which
# `torch.cuda.get_device_capability()` returns. Reduced-precision tensor-core formats arrived generation by
# generation: **TF32** and **BF16** with Ampere (capability 8.0: A100, RTX 30xx), **FP8** with Ada Lovelace
# (8.9: L4, L40S, RTX 40xx) and Hopper (9.0: H100, H200); Volta (7.0) and Turing (7.5, T4) have FP16 tensor
# cores only. Write `will_run(capability)` returning the set of `{"tf32", "bf16", "fp8"}` that run natively on a
# GPU of that capability (`None`: no GPU, an empty set). The self-check draws capabilities at random (most of
# them belong to no GPU sold today, so a table of real GPUs does not pass), then applies yours to this machine.


# %%
def will_run(capability):
    raise NotImplementedError  # your code here


cu.exercises.check("00.precisions", will_run)

# %% [markdown]
# ## Summary
# You asked this machine what it has and know which sections will run. Next: **01 · Measuring inference**,
# how to time GPU and CPU work without fooling yourself.
