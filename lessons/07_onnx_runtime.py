# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 07 · ONNX Runtime
#
# **Goals.** Export a PyTorch model to ONNX with a dynamic batch dimension, check it, and prove parity
# with PyTorch. Run it with ONNX Runtime (ORT): see what each graph optimization level does to the graph
# (node counts before and after, from the saved optimized model) and to the speed; tune threads; choose
# execution providers (CPU here; CUDA, IOBinding and TensorRT on a GPU); quantize to INT8 with ORT's own
# dynamic quantization and measure the accuracy. Finally, feed the session bad inputs and get errors that
# say what it expected.
#
# **The bottleneck it attacks** (see the taxonomy in *01 · Measuring inference*): **framework overhead**
# (a C++ runtime with no Python per operator) and **memory traffic** (operator fusion: convolution +
# activation in one kernel, layouts that suit the CPU's vector units).

# %%
import time

import onnxruntime as ort
import pandas as pd
import torch

import course_utils as cu
from course_utils import backends as be

device = cu.lesson.start("07", "ONNX Runtime")
work = cu.results.results_dir() / "artifacts" / "07"  # .onnx files go here, never into the repository
work.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## Baseline: ResNet-18 in eager PyTorch
# ResNet-18 from torchvision (random weights unless ImageNet weights are in your local torch cache:
# speed does not depend on them). Batch 1 is a single request; the larger batch is throughput work.

# %%
model, note = cu.models.resnet("resnet18")
print(f"ResNet-18: {note}")
size = cu.pick(full=224, smoke=64)
big = cu.pick(full=16, smoke=4)
torch.manual_seed(0)
xs = {1: torch.randn(1, 3, size, size), big: torch.randn(big, 3, size, size)}
reps = {1: cu.pick(full=20, smoke=5), big: cu.pick(full=10, smoke=5)}  # large batches: fewer, longer calls
with torch.inference_mode():
    ref = {b: model(x) for b, x in xs.items()}
    eager = {b: cu.measure(lambda x=x: model(x), device="cpu", batch_size=b, label=f"eager b={b}", min_repeats=reps[b])
             for b, x in xs.items()}  # fmt: skip
for m in eager.values():
    print(m)
    cu.record("07", "eager", model="resnet18", device="cpu", dtype="fp32", measurement=m)

# %% [markdown]
# ## Export with a dynamic batch, check, parity
# `be.export_onnx` calls `torch.onnx.export(..., dynamo=True)` with `dynamic_shapes` marking dimension 0
# as `batch`, stores the weights inside the one file, and runs `onnx.checker`. Parity: ORT's output must
# match PyTorch's within the FP32 tolerance below, before any speed is compared.

# %%
t0 = time.perf_counter()
onnx_path = be.export_onnx(model, xs[1], work / "resnet18.onnx")
export_s = time.perf_counter() - t0
print(f"exported {onnx_path.name} in {export_s:.1f} s, {onnx_path.stat().st_size / 2**20:.1f} MiB, checker passed")
print("inputs:", be.describe_inputs(be.ort_session(onnx_path, level="disable")))
print("FP32 tolerance:", cu.compare.TOLERANCES["fp32"])
run_all = be.ort_runner(be.ort_session(onnx_path, level="all"))
for b, x in xs.items():
    cu.check_outputs(run_all(x), ref[b], "fp32", label=f"ORT (level all) vs PyTorch, batch {b}")

# %% [markdown]
# ## Graph optimization levels: what the optimizer does to the graph
# Each level is saved with `SessionOptions.optimized_model_filepath` and its nodes are counted.
# `basic` removes redundant nodes and folds constants, `extended` fuses (e.g. `Conv`+`Relu` into
# `FusedConv`), `layout` (and `all`) rewrites convolutions into the CPU-friendly blocked NCHWc layout
# (domain `com.microsoft.nchwc`). The file saved at `layout`/`all` is specific to this CPU.

# %%
levels = list(be.LEVELS)
counts, sessions = {}, {}
for level in levels:
    opt_file = work / f"resnet18.opt-{level}.onnx"
    sessions[level] = be.ort_session(onnx_path, level=level, optimized_path=opt_file)
    counts[level] = be.count_nodes(opt_file)
node_table = pd.DataFrame(counts).fillna(0).astype(int).T
node_table.insert(0, "total nodes", node_table.sum(axis=1))
node_table

# %%
lo, hi = node_table.loc["disable", "total nodes"], node_table.loc["all", "total nodes"]
assert hi < lo, "the optimizer should remove nodes between the lowest and the highest level"
print(f"Nodes fall from {lo} (optimizations disabled) to {hi} (all): {lo - hi} nodes fused or removed.")

# %% [markdown]
# ## Speed per level, batch 1 and a larger batch, same inputs as eager

# %%
rows = []
for level, sess in sessions.items():
    run = be.ort_runner(sess)
    for b, x in xs.items():
        m = cu.measure(lambda run=run, x=x: run(x), device="cpu", batch_size=b, label=f"ORT {level} b={b}",
                       min_repeats=reps[b])  # fmt: skip
        rows.append({"engine": f"ORT {level}", "batch": b, "median_ms": m.median_ms,
                     "speedup_vs_eager": eager[b].median_ms / m.median_ms})  # fmt: skip
        cu.record("07", f"ort level {level}", model="resnet18", device="cpu", dtype="fp32", measurement=m,
                  speedup_vs_baseline=eager[b].median_ms / m.median_ms)  # fmt: skip
for b in xs:
    rows.append({"engine": "PyTorch eager", "batch": b, "median_ms": eager[b].median_ms, "speedup_vs_eager": 1.0})
speed = pd.DataFrame(rows)
speed.pivot(index="engine", columns="batch", values="median_ms").round(3)

# %%
cu.plots.speedup_bars(
    {f"{r.engine} b={r.batch}": r.speedup_vs_eager for r in speed.itertuples() if r.engine != "PyTorch eager"},
    title="ONNX Runtime vs PyTorch eager (ResNet-18, CPU)",
);
b1 = speed[(speed.batch == 1) & (speed.engine != "PyTorch eager")].sort_values("median_ms").iloc[0]
word = "faster" if b1.speedup_vs_eager > 1 else "slower"
print(f"Best ORT level at batch 1: {b1.engine}, {b1.speedup_vs_eager:.2f}x eager ({word}); course target on CPU >= 1.5x"
      f" (image size {size}).")  # fmt: skip

# %% [markdown]
# ## Threads
# ORT sizes its thread pool to the physical cores by default; `intra_op_num_threads` sets it. PyTorch's
# eager baseline used `torch.get_num_threads()` threads. Below, both run with the same thread count
# (`torch.set_num_threads`), so the ratio compares runtimes, not thread pools. On a shared machine fewer
# threads can be as fast and leave cores for other requests.

# %%
import os

max_threads = os.cpu_count() or 1
thread_counts = sorted({1, max(1, max_threads // 2), max_threads})
x1 = xs[1]
torch_threads = torch.get_num_threads()
thread_rows = []
try:
    for t in thread_counts:
        run = be.ort_runner(be.ort_session(onnx_path, level="all", threads=t))
        m_ort = cu.measure(lambda run=run: run(x1), device="cpu", batch_size=1, label=f"ORT all, {t} threads")
        torch.set_num_threads(t)  # the same thread count for PyTorch: a fair comparison
        with torch.inference_mode():
            m_eag = cu.measure(lambda: model(x1), device="cpu", batch_size=1, label=f"eager, {t} threads")
        thread_rows.append({"threads": t, "ORT all ms": m_ort.median_ms, "eager ms": m_eag.median_ms,
                            "ORT speed-up": m_eag.median_ms / m_ort.median_ms})  # fmt: skip
        cu.record("07", f"ort level all, {t} threads", model="resnet18", device="cpu", dtype="fp32",
                  measurement=m_ort, speedup_vs_baseline=m_eag.median_ms / m_ort.median_ms,
                  notes=f"baseline: eager with {t} threads")  # fmt: skip
finally:
    torch.set_num_threads(torch_threads)
threads_table = pd.DataFrame(thread_rows).set_index("threads")
thread_ms = threads_table["ORT all ms"].to_dict()
print(f"torch eager used {torch_threads} threads above; batch 1, both engines at each thread count:")
threads_table

# %% [markdown]
# ## Execution providers
# `get_available_providers()` lists what the installed wheel was **built** with, not what can run here.
# ORT falls back to the CPU silently when a provider cannot load: `be.ort_session` compares
# `session.get_providers()` with the request and raises instead.

# %%
print("available (built in):", ort.get_available_providers())
try:
    be.ort_session(onnx_path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    print("CUDA execution provider applied.")
except be.ProviderFallbackError as exc:
    print("As expected without a GPU:", exc)

# %% [markdown]
# ### GPU: CUDA provider, IOBinding with torch tensors, TensorRT provider
# With the CUDA provider, `session.run` copies numpy inputs to the GPU and outputs back on every call.
# **IOBinding** binds torch CUDA tensors by pointer, so data stays on the GPU. The TensorRT provider of
# onnxruntime-gpu 1.31 links TensorRT 10 and does not load beside the course's TensorRT 11: the cell
# tries it and prints the reason. Not yet run on a GPU by the course unless reference results appear.

# %%
if cu.gpu_section("07.cuda-provider"):
    ort.preload_dlls()  # CUDA/cuDNN libraries from the pip wheels, after importing torch
    gsess = be.ort_session(onnx_path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    model_g = model.to("cuda")
    gpu_rows = {}
    for b, x in xs.items():
        xg = x.to("cuda")
        with torch.inference_mode():
            ref_g = model_g(xg)
            gpu_rows[f"torch eager b={b}"] = cu.measure(lambda xg=xg: model_g(xg), device="cuda", batch_size=b)
        run_copy = be.ort_runner(gsess)
        run_bound = be.ort_iobinding_runner(gsess, lambda s: (s[0], 1000))
        cu.check_outputs(run_copy(xg), ref_g, "tf32", label=f"ORT CUDA (numpy copies) b={b}")
        cu.check_outputs(run_bound(xg), ref_g, "tf32", label=f"ORT CUDA (IOBinding) b={b}")
        for name, fn in {"copies": run_copy, "IOBinding": run_bound}.items():
            gpu_rows[f"ORT CUDA {name} b={b}"] = cu.measure(lambda fn=fn, xg=xg: fn(xg), device="cuda", batch_size=b)
    for name, m in gpu_rows.items():
        print(name, m)
        cu.record("07", f"gpu {name}", model="resnet18", device="cuda", dtype="fp32", measurement=m)
    try:
        be.ort_session(onnx_path, providers=["TensorrtExecutionProvider", "CUDAExecutionProvider"])
        print("TensorRT execution provider loaded.")
    except Exception as exc:  # noqa: BLE001 - any load failure is reported, not fatal
        print(f"TensorRT execution provider not used: {type(exc).__name__}: {exc}")
    model = model.cpu()
else:
    cu.results.show_reference("07")

# %% [markdown]
# ## ORT dynamic INT8 quantization on the digits MLP
# `onnxruntime.quantization.quantize_dynamic` stores MatMul/Gemm weights as INT8 and quantizes activations
# per call (`MatMulInteger`). It suits Linear-heavy models, so we use the digits MLP (trained weights,
# real accuracy). A CNN would gain little: its time is in convolutions, which dynamic mode leaves alone.

# %%
mlp = cu.models.load_digits_model("mlp")
digits = cu.data.load_digits_split()
mlp_onnx = be.export_onnx(mlp, digits.x_test[:2], work / "digits_mlp.onnx")
mlp_int8 = be.ort_quantize_dynamic(mlp_onnx, work / "digits_mlp.int8.onnx")
run_fp32 = be.ort_runner(be.ort_session(mlp_onnx))
run_int8 = be.ort_runner(be.ort_session(mlp_int8))
x_test = digits.x_test
with torch.inference_mode():
    ref_mlp = mlp(x_test)
cu.check_outputs(run_fp32(x_test), ref_mlp, "fp32", label="ORT FP32 MLP vs PyTorch")
cu.check_outputs(run_int8(x_test), ref_mlp, "int8", label="ORT INT8 MLP vs PyTorch")
acc = {
    "PyTorch FP32": cu.models.accuracy(mlp, x_test, digits.y_test),
    "ORT FP32": float((run_fp32(x_test).argmax(-1) == digits.y_test).float().mean()),
    "ORT INT8 (dynamic)": float((run_int8(x_test).argmax(-1) == digits.y_test).float().mean()),
}
qb = cu.pick(full=256, smoke=64)
xq = x_test[:qb]
m_q = {
    "ORT FP32": cu.measure(lambda: run_fp32(xq), device="cpu", batch_size=qb, label="ORT FP32 MLP"),
    "ORT INT8 (dynamic)": cu.measure(lambda: run_int8(xq), device="cpu", batch_size=qb, label="ORT INT8 MLP"),
}
quant = pd.DataFrame({
    "accuracy": acc,
    "size_MiB": {"ORT FP32": mlp_onnx.stat().st_size / 2**20, "ORT INT8 (dynamic)": mlp_int8.stat().st_size / 2**20},
    f"median_ms_b{qb}": {k: m.median_ms for k, m in m_q.items()},
})  # fmt: skip
print("INT8 graph ops:", dict(be.count_nodes(mlp_int8)))
for k, m in m_q.items():
    cu.record("07", f"mlp {k}", model="digits-mlp", device="cpu", dtype="int8" if "INT8" in k else "fp32",
              measurement=m, speedup_vs_baseline=m_q["ORT FP32"].median_ms / m.median_ms,
              error_vs_baseline=acc["ORT FP32"] - acc[k], notes=f"accuracy {acc[k]:.4f}")  # fmt: skip
quant

# %%
s = m_q["ORT FP32"].median_ms / m_q["ORT INT8 (dynamic)"].median_ms
print(f"ORT dynamic INT8 runs at {s:.2f}x the FP32 speed here ({'faster' if s > 1 else 'slower'}), "
      f"{mlp_onnx.stat().st_size / mlp_int8.stat().st_size:.1f}x smaller on disk, accuracy "
      f"{acc['ORT INT8 (dynamic)']:.2%} vs {acc['ORT FP32']:.2%}. VNNI on this CPU: "
      f"{bool({'avx512_vnni', 'avx_vnni'} & cu.device.cpu_flags())}.")  # fmt: skip

# %% [markdown]
# ## Bad input: clear errors that name what was expected
# ORT's own messages for a wrong input are long and sometimes come from deep inside a kernel.
# `be.ort_runner` checks the name, dtype and rank first.

# %%
bad_inputs = {
    "wrong name": {"image": x1},
    "wrong dtype": x1.double(),
    "wrong rank": x1[0],
}
for what, bad in bad_inputs.items():
    try:
        run_all(bad)
    except be.BadInputError as exc:
        print(f"{what}: {exc}")

# %% [markdown]
# ## What surprised us

# %%
for b in xs:
    r = speed[(speed.batch == b) & (speed.engine != "PyTorch eager")].set_index("engine")["speedup_vs_eager"]
    print(f"batch {b}: ORT from {r.min():.2f}x to {r.max():.2f}x eager across levels (best: {r.idxmax()}).")
noisy = [m.label for m in [*eager.values(), *m_q.values()] if m.spread > cu.timing.HIGH_SPREAD]
if noisy:
    print(f"Careful: high spread in {', '.join(noisy)}: the machine was busy; rerun before trusting small gaps.")
t_best = min(thread_ms, key=thread_ms.get)
print(f"Fastest ORT thread count at batch 1: {t_best} of {max_threads} logical CPUs "
      f"({thread_ms[t_best]:.2f} ms vs {thread_ms[max(thread_counts)]:.2f} ms with all).")  # fmt: skip
eq = threads_table["ORT speed-up"]
print(f"At equal thread counts ORT is {eq.min():.2f}x to {eq.max():.2f}x eager at batch 1: the thread count, not only "
      "the runtime, decides the ratio. On a busy machine, more threads than free cores makes both slower.")  # fmt: skip
fewer = node_table["total nodes"]
print(f"Levels 'layout' and 'all' have {fewer['all']} nodes vs {fewer['extended']} at 'extended': "
      "the NCHWc rewrite replaces fused Conv nodes and adds layout reorders.")

# %% [markdown]
# ## Exercises
# 1. From two operator Counters (before/after optimization) summarize the fusion.

# %%
import collections


def fusion_summary(before: collections.Counter, after: collections.Counter) -> dict:
    raise NotImplementedError  # your code here


cu.exercises.check("07.fusion", fusion_summary)

# %% [markdown]
# 2. Pick the fewest threads whose median is within a slack of the best (leave cores for other work).

# %%
def pick_threads(medians: dict[int, float], slack: float = 0.05) -> int:
    raise NotImplementedError  # your code here


cu.exercises.check("07.threads", pick_threads)

# %% [markdown]
# ## Summary
# ONNX export with a dynamic batch, checked and compared; the optimizer's levels seen as node counts and
# as speed; threads and providers chosen by measurement, with fallbacks made loud; INT8 in one call where
# the model is Linear-heavy. Next: **08 · TensorRT**, which builds a GPU-specific engine from the same
# ONNX file.
