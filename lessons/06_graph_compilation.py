# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 06 · Graph compilation
#
# **Goals.** Hand the model to a compiler and measure what that buys: eager PyTorch vs TorchScript
# (legacy) vs `torch.compile` vs `torch.export`. Measure the compile cost and the steady-state speed
# **separately**, and compute after how many calls compiling pays back. See recompilation when input
# shapes change, count it, and fix it. On a GPU: `reduce-overhead` (CUDA graphs), `max-autotune`, and a
# CUDA graph captured by hand.
#
# **The bottleneck it attacks** (see the taxonomy in *01 · Measuring inference*): **framework and launch
# overhead** (Python dispatch per operator, one kernel launch per operator) and **memory traffic** between
# operators that a compiler can fuse into one kernel. It does nothing for a model that is already bound by
# one big matrix multiply.

# %%
import math
import time

import pandas as pd
import torch

import course_utils as cu
from course_utils import compilation as comp

device = cu.lesson.start("06", "Graph compilation")

# %% [markdown]
# ## Baseline: the digits CNN in eager mode
# The small CNN from lesson 00's zoo (trained weights, shipped). Small models are where per-operator
# overhead is a large share of the time, so they show compilation best. We time two batch sizes: a
# single request, and a batch.

# %%
model = cu.models.load_digits_model("cnn", device=device)
digits = cu.data.load_digits_split()
batches = cu.pick(full=[1, 64], smoke=[64])
inputs = {b: digits.x_test[:b].to(device) for b in batches}
print(f"threads: torch uses {torch.get_num_threads()} CPU threads")

eager = {}
with torch.inference_mode():
    for b, x in inputs.items():
        eager[b] = cu.measure(lambda x=x: model(x), device=device, batch_size=b, label=f"eager b={b}")
        print(eager[b])
        cu.record("06", "eager", model="digits-cnn", device=str(device), dtype="fp32", measurement=eager[b])
    reference = {b: model(x) for b, x in inputs.items()}

# %% [markdown]
# ## TorchScript: the legacy way (what not to start new code with)
# `torch.jit.trace` runs the model once and records the operators; `torch.jit.script` compiles a subset
# of Python. Both are **deprecated**: the warning PyTorch raises is printed below. Trace has a trap:
# Python `if`s are frozen into the branch taken during tracing. Older tutorials and deployments use
# them, so you should recognize them; new code uses `torch.compile` (in-process) or `torch.export` (a
# saved graph for other runtimes).

# %%
b = batches[-1]
x = inputs[b]
traced, warns_trace = comp.torchscript(model, x, "trace")
scripted, warns_script = comp.torchscript(model, x, "script")
for w in sorted(set(warns_trace + warns_script)):
    print("DeprecationWarning/FutureWarning:", w)
with torch.inference_mode():
    cu.check_outputs(traced(x), reference[b], "fp32", label="TorchScript trace vs eager")
    cu.check_outputs(scripted(x), reference[b], "fp32", label="TorchScript script vs eager")
    ts = {
        "trace": cu.measure(lambda: traced(x), device=device, batch_size=b, label=f"jit.trace b={b}"),
        "script": cu.measure(lambda: scripted(x), device=device, batch_size=b, label=f"jit.script b={b}"),
    }
for k, m in ts.items():
    print(m)
    cu.record("06", f"torchscript {k} (legacy)", model="digits-cnn", device=str(device), dtype="fp32",
              measurement=m, speedup_vs_baseline=eager[b].median_ms / m.median_ms)  # fmt: skip

# %% [markdown]
# ## `torch.compile`: compile time and steady state, measured apart
# `torch.compile` captures the graph with TorchDynamo and generates fused kernels with TorchInductor
# (C++/OpenMP on the CPU, Triton on the GPU). Compilation happens on the **first call**, which we time
# alone; then we time the steady state. `comp.reset()` (`torch._dynamo.reset()`) clears compiled code
# between variants so each one starts cold.
#
# Two CPU variants: the default, and the default with **freezing** (`torch._inductor.config.freezing`):
# weights become constants, so Inductor can fold batch norm and pre-pack weights for oneDNN's fast
# convolution kernels. Freezing is for inference only.

# %%
costs = []
compiled_fns = {}
variants = {"compile default": False, "compile + freezing": True}
for b, x in inputs.items():
    for name, freeze in variants.items():
        with comp.inductor_freezing(freeze):
            fn, cost, m = comp.compile_cost(
                lambda: torch.compile(model), x, eager_ms=eager[b].median_ms, label=f"{name} b={b}", device=device
            )
            with torch.inference_mode():
                cu.check_outputs(fn(x), reference[b], "fp32", label=f"{name} b={b} vs eager")
        compiled_fns[(name, b)] = fn
        costs.append({**cost.as_dict(), "batch": b, "variant": name})
        print(m)
        cu.record("06", name, model="digits-cnn", device=str(device), dtype="fp32", measurement=m,
                  speedup_vs_baseline=cost.speedup, notes=f"first call {cost.first_call_s:.2f} s")  # fmt: skip
comp.reset()

# %% [markdown]
# ## `torch.export`: a whole-graph, ahead-of-time capture
# `torch.export.export` traces the model into an `ExportedProgram`: one graph of ATen operators, no Python
# left, with dynamic dimensions declared up front. It is what ONNX export (lesson 07) and AOT compilation
# build on. Running `ep.module()` is not meant to be faster than eager: it is a portable artifact.

# %%
batch_dim = torch.export.Dim("batch", min=2, max=1024)
t0 = time.perf_counter()
ep = torch.export.export(model, (inputs[batches[-1]],), dynamic_shapes=({0: batch_dim},))
export_s = time.perf_counter() - t0
n_ops = sum(1 for n in ep.graph.nodes if n.op == "call_function")
print(f"torch.export took {export_s:.2f} s: {n_ops} ATen operator calls, batch dimension symbolic")
exported = ep.module()
with torch.inference_mode():
    x = inputs[batches[-1]]
    cu.check_outputs(exported(x), reference[batches[-1]], "fp32", label="torch.export module vs eager")
    m_export = cu.measure(lambda: exported(x), device=device, batch_size=x.shape[0], label="torch.export module")
print(m_export)
_ = cu.record("06", "torch.export module", model="digits-cnn", device=str(device), dtype="fp32",
          measurement=m_export, speedup_vs_baseline=eager[batches[-1]].median_ms / m_export.median_ms)  # fmt: skip

# %% [markdown]
# ## Results: steady state, compile cost, break-even
# Speed-up is eager median / variant median at the same batch size (above 1: faster). Break-even is the
# number of calls after which the first call's extra time has been paid back by faster calls.

# %%
rows = [{"variant": "eager", "batch": b, "steady_ms": eager[b].median_ms, "speedup": 1.0,
         "first_call_s": None, "break_even_calls": None} for b in batches]  # fmt: skip
b = batches[-1]
for k, m in ts.items():
    rows.append({"variant": f"jit.{k} (legacy)", "batch": b, "steady_ms": m.median_ms,
                 "speedup": eager[b].median_ms / m.median_ms})  # fmt: skip
rows.append({"variant": "torch.export module", "batch": b, "steady_ms": m_export.median_ms,
             "speedup": eager[b].median_ms / m_export.median_ms, "first_call_s": export_s})  # fmt: skip
rows += [{k: c[k] for k in ("variant", "batch", "steady_ms", "speedup", "first_call_s", "break_even_calls")}
         for c in costs]  # fmt: skip
table = pd.DataFrame(rows)
table

# %%
cu.plots.speedup_bars(
    {f"{r.variant} b={r.batch}": r.speedup for r in table.itertuples()},
    title="Steady-state speed vs eager (digits CNN, this machine)",
);

# %%
for c in costs:
    be = c["break_even_calls"]
    verdict = "never pays back: it is not faster per call" if math.isinf(be) else f"pays back after {be:,.0f} calls"
    print(f"{c['variant']} (batch {c['batch']}): first call {c['first_call_s']:.2f} s, steady "
          f"{c['steady_ms']:.3f} ms vs eager {c['eager_ms']:.3f} ms -> {verdict}")  # fmt: skip
best = max(costs, key=lambda c: c["speedup"])
word = "faster" if best["speedup"] > 1 else "slower"
print(f"\nBest torch.compile setting here: {best['variant']} at batch {best['batch']}, "
      f"{best['speedup']:.2f}x eager speed ({word}). Course target on CPU: >= 1.2x.")  # fmt: skip

# %% [markdown]
# ## Recompilation when shapes change
# TorchDynamo guards every compiled graph on the input shapes. A new batch size fails the guard and
# triggers a **recompile** (on the CPU, each one costs about as much as the first compile above). By
# default (`dynamic=None`) PyTorch recompiles once, notices the dimension changed, and then compiles a
# shape-generic graph; `dynamic=False` recompiles for every new size; `dynamic=True` or
# `torch._dynamo.mark_dynamic(x, 0)` ask for a generic graph from the start. We count compiled graphs
# with a counting backend that skips Inductor's code generation, so the counts are cheap to get.
# Sizes 0 and 1 are always specialized (a dimension of size 1 broadcasts), so a batch of 1 gets a graph
# of its own even when the batch is marked dynamic.

# %%
sizes = cu.pick(full=[1, 2, 3, 5, 8, 13, 21, 32], smoke=[2, 3, 5, 8])
shape_inputs = [digits.x_test[:s].to(device) for s in sizes]
settings = {
    "dynamic=False (static)": {"dynamic": False},
    "dynamic=None (default)": {},
    "dynamic=True": {"dynamic": True},
    "mark_dynamic(x, 0)": {"mark_dynamic_dim": 0},
}
recompiles = pd.DataFrame(
    [{"setting": k, "graphs compiled": comp.count_compiles(model, shape_inputs, **kw)} for k, kw in settings.items()]
)
recompiles["batch sizes seen"] = len(sizes)
recompiles

# %%
worst = recompiles["graphs compiled"].max()
first_compile = min(c["first_call_s"] for c in costs)
print(f"{len(sizes)} batch sizes: static shapes compiled {worst} graphs; at the cheapest first call measured above "
      f"({first_compile:.2f} s) that is about {worst * first_compile:.1f} s of compiling before serving settles. "
      f"Marking the batch dimension dynamic compiled {recompiles['graphs compiled'].iloc[-1]}.")  # fmt: skip

# %% [markdown]
# ## GPU: `reduce-overhead`, `max-autotune`, and a CUDA graph by hand
# On a GPU, at small batch, the time goes into launching kernels, not running them. A **CUDA graph**
# records the whole sequence of kernel launches once and replays it with one launch.
# `mode="reduce-overhead"` does that inside `torch.compile`; `mode="max-autotune"` also benchmarks
# several kernel configurations per operator (long compile). `comp.CudaGraphRunner` captures by hand,
# with a **static** input buffer (copy new data into it) and a **static** output buffer that the next
# replay **overwrites**. This section has not yet been run on a GPU by the course unless reference
# results are shown below.

# %%
if cu.gpu_section("06.cuda-graphs"):
    gmodel = cu.models.resnet("resnet18", device="cuda")[0]
    xg = torch.randn(1, 3, 224, 224, device="cuda")
    with torch.inference_mode():
        ref_g = gmodel(xg)
        m_eager_g = cu.measure(lambda: gmodel(xg), device="cuda", batch_size=1, label="GPU eager b=1")
    runner = comp.CudaGraphRunner(gmodel, xg)
    cu.check_outputs(runner(xg), ref_g, "fp32", label="manual CUDA graph vs eager")
    # Outputs are overwritten on replay: keep a clone if you need the old result.
    out_a = runner(xg)
    kept = out_a.clone()
    out_b = runner(torch.randn_like(xg))
    print(f"same buffer: {out_a.data_ptr() == out_b.data_ptr()}; first result overwritten: "
          f"{not torch.equal(out_a, kept)}")  # fmt: skip
    m_graph = cu.measure(lambda: runner(xg), device="cuda", batch_size=1, label="manual CUDA graph b=1")
    gpu_rows = {"eager": m_eager_g, "manual CUDA graph": m_graph}
    for mode in ("reduce-overhead", "max-autotune"):
        fn, cost, m = comp.compile_cost(
            lambda mode=mode: torch.compile(gmodel, mode=mode), xg,
            eager_ms=m_eager_g.median_ms, label=f"compile {mode} b=1", device="cuda",
        )  # fmt: skip
        with torch.inference_mode():
            cu.check_outputs(fn(xg).clone(), ref_g, "tf32", label=f"compile {mode} vs eager")
        print(f"{mode}: first call {cost.first_call_s:.1f} s, break-even after {cost.break_even} calls")
        gpu_rows[f"compile {mode}"] = m
    comp.reset()
    for name, m in gpu_rows.items():
        print(m)
        cu.record("06", f"gpu {name}", model="resnet18", device="cuda", dtype="fp32", measurement=m,
                  speedup_vs_baseline=m_eager_g.median_ms / m.median_ms)  # fmt: skip
    cu.plots.speedup_bars({k: m_eager_g.median_ms / m.median_ms for k, m in gpu_rows.items()},
                          title="ResNet-18 batch 1 on GPU: speed vs eager")  # fmt: skip
    ratio = m_eager_g.median_ms / m_graph.median_ms
    print(f"CUDA graph by hand: {ratio:.2f}x eager at batch 1 (course target >= 1.5x)")
else:
    cu.results.show_reference("06")

# %% [markdown]
# ## What surprised us
# Printed from this run's numbers, so the sentences below match what happened on your machine.

# %%
for b in batches:
    by_b = [c for c in costs if c["batch"] == b]
    for c in by_b:
        word = "faster" if c["speedup"] > 1 else "slower"
        worth = c["first_call_s"] * 1000 / eager[b].median_ms
        print(f"batch {b}: {c['variant']} runs {c['speedup']:.2f}x eager ({word}) after a first call of "
              f"{c['first_call_s']:.2f} s, i.e. {worth:,.0f} eager calls' worth.")  # fmt: skip
freeze = {c["batch"]: c["speedup"] for c in costs if c["variant"] == "compile + freezing"}
plain = {c["batch"]: c["speedup"] for c in costs if c["variant"] == "compile default"}
for b in batches:
    diff = "helped" if freeze[b] > plain[b] else "did not help"
    print(f"batch {b}: freezing {diff} ({freeze[b]:.2f}x vs {plain[b]:.2f}x without).")
noisy = [m.label for m in [*eager.values(), *ts.values(), m_export] if m.spread > cu.timing.HIGH_SPREAD]
if noisy:
    print(f"Careful: {len(noisy)} measurements had a high spread (IQR > {cu.timing.HIGH_SPREAD:.0%} of the median), "
          f"e.g. {noisy[0]}: the machine was busy; rerun before trusting small differences.")  # fmt: skip
tr = eager[batches[-1]].median_ms / ts["trace"].median_ms
print(f"TorchScript trace: {tr:.2f}x eager — " + ("it still gives something, " if tr > 1.05 else "no gain, ")
      + "but it is deprecated: prefer torch.compile.")  # fmt: skip

# %% [markdown]
# ## Exercises
# 1. Write `break_even(compile_s, eager_ms, compiled_ms)`: how many calls until compiling pays back.

# %%
def break_even(compile_s: float, eager_ms: float, compiled_ms: float) -> float:
    raise NotImplementedError  # your code here


cu.exercises.check("06.break-even", break_even)

# %% [markdown]
# 2. A CUDA graph is captured for one batch size. Write `pad_batch(x, size)` that zero-pads a smaller
#    batch to the captured size and returns `(padded, n_real_rows)`, so the caller can slice the output.

# %%
def pad_batch(x: torch.Tensor, size: int) -> tuple[torch.Tensor, int]:
    raise NotImplementedError  # your code here


cu.exercises.check("06.pad-batch", pad_batch)

# %% [markdown]
# 3. (Open) Re-run the compile cell with `torch.set_num_threads(1)`: does the compiled model gain more or
#    less over eager with fewer threads? Why might per-operator overhead matter more then?
#
# ## Summary
# Compilers remove per-operator overhead and fuse memory traffic, at a one-off cost you now know how to
# weigh (break-even calls) and a recompile cost when shapes vary (mark them dynamic). TorchScript is
# legacy; `torch.export` makes a portable graph. Next: **07 · ONNX Runtime**, a separate runtime for
# such a graph.
