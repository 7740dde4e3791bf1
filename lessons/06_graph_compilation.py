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
# (legacy) vs `torch.compile` (with and without freezing) vs `torch.export` and its deployment path,
# AOTInductor. See where a graph breaks and why tracing silently gets it wrong. Measure the compile cost
# **cold** (caches off) and **warm** (from Inductor's on-disk cache) apart from the steady-state speed, and
# compute after how many calls compiling pays back. Watch recompiles when the batch size changes, the
# recompile limit, and the fix (`mark_dynamic`). On a GPU: a CUDA graph captured by hand, `reduce-overhead`
# and `max-autotune`.
#
# **The bottleneck it attacks** (see the taxonomy in *01 · Measuring inference*): **framework and launch
# overhead** (Python dispatch per operator, one kernel launch per operator) and **memory traffic** between
# operators that a compiler can fuse into one kernel. It does nothing for a model that is already bound by
# one big matrix multiply.

# %% tags=["contract"]
import math
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd
import torch
from IPython.display import display
from torch import nn
from torch._dynamo.testing import CompileCounter

import course_utils as cu


def first_call_s(fn, x, device) -> float:
    """Seconds taken by the first call of fn(x), synchronized: for a compiled model, the compile cost."""
    cu.device.synchronize(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        fn(x)
    cu.device.synchronize(device)
    return time.perf_counter() - t0


# %%
device = cu.lesson.start("06", "Graph compilation")
torch.backends.cuda.matmul.allow_tf32 = False  # on CUDA, FP32 means FP32: cuDNN convolutions default to TF32
torch.backends.cudnn.allow_tf32 = False
print(f"threads: torch uses {torch.get_num_threads()} CPU threads")

# %% [markdown]
# ## Baseline: the digits CNN in eager mode
# The small trained CNN from the course's zoo. Small models are where per-operator overhead is a large
# share of the time, so they show compilation best. Two batch sizes: a single request, and a batch.

# %%
model = cu.models.load_digits_model("cnn", device=device).eval()
digits = cu.data.load_digits_split()
batches = cu.pick(full=[1, 64], smoke=[16])
inputs = {b: digits.x_test[:b].to(device) for b in batches}
big = batches[-1]

eager = {}
with torch.inference_mode():
    reference = {b: model(x) for b, x in inputs.items()}
    for b, x in inputs.items():
        eager[b] = cu.measure(lambda x=x: model(x), device=device, batch_size=b, label=f"eager b={b}")
        print(eager[b])

# %% [markdown]
# ## The tracing trap, live
# The source tutorial's example: a Python `if` on a tensor's value. `torch.jit.trace` runs the function once
# and records the operators it saw, so the branch taken for the example is **frozen in**: for an input that
# should take the other branch, the traced module silently returns the wrong answer (PyTorch only warns at
# trace time).


# %%
class Gate(nn.Module):
    def forward(self, x):
        if x.mean() > 0:
            return x * 2
        return x / 2


gate = Gate()
positive, negative = torch.ones(3), -torch.ones(3)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    traced_gate = torch.jit.trace(gate, positive)
tracer_warnings = {str(w.message).split(".")[0] for w in caught if "Tracer" in w.category.__name__}
print("trace-time warning:", *tracer_warnings)
print(f"eager  on a negative input: {gate(negative).tolist()}")
print(f"traced on a negative input: {traced_gate(negative).tolist()}   <- the x*2 branch, frozen in: wrong")

# %% [markdown]
# `torch.compile` does not freeze the branch: TorchDynamo sees the data-dependent `if`, **breaks the graph**
# there, runs the `if` in Python and compiles the pieces on either side. `torch._dynamo.explain` reports the
# graphs and the breaks; `fullgraph=True` turns a break into an error, which is what you want when the
# whole model must be one graph (export, CUDA graphs). From a shell, `TORCH_LOGS="graph_breaks" python
# script.py` prints every break as it happens.

# %%
explained = torch._dynamo.explain(gate)(negative)
print(f"graphs: {explained.graph_count}, graph breaks: {explained.graph_break_count}")
for br in explained.break_reasons:
    print("  break:", str(br.reason).splitlines()[0])
print(f"compiled on a negative input: {torch.compile(gate, backend='eager')(negative).tolist()}   <- right")
try:
    torch.compile(gate, fullgraph=True, backend="eager")(negative)
except Exception as exc:  # torch._dynamo.exc.Unsupported
    print(f"fullgraph=True: {type(exc).__name__}: {str(exc).splitlines()[0]}")


# %% [markdown]
# The fix is to keep the decision in the graph: `torch.where` computes both branches and selects per
# element, so there is nothing for Python to decide (`torch.cond` does the same for bigger branches).


# %%
class GateInGraph(nn.Module):
    def forward(self, x):
        return torch.where(x.mean() > 0, x * 2, x / 2)


torch._dynamo.reset()
fixed = torch.compile(GateInGraph(), fullgraph=True, backend="eager")
print(
    f"fullgraph compile works: {fixed(negative).tolist()} and {fixed(positive).tolist()}; graph breaks: "
    f"{torch._dynamo.explain(GateInGraph())(negative).graph_break_count}"
)

# %% [markdown]
# ## TorchScript: the legacy way (what not to start new code with)
# Older tutorials and deployments use `torch.jit.trace`; recognize it, but write new code with
# `torch.compile` (in-process) or `torch.export` (a saved graph). PyTorch says so itself (warning printed).

# %%
x = inputs[big]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.no_grad():
        traced = torch.jit.trace(model, x)
for msg in sorted({str(w.message) for w in caught if "deprecated" in str(w.message).lower()}):
    print(f"warning: {msg[:200]}")
with torch.inference_mode():
    cu.check_outputs(traced(x), reference[big], "fp32", label="jit.trace vs eager")
    trace_cmp = cu.compare(  # eager and the trace take turns in rounds (lesson 01)
        {"eager": lambda: model(x), "jit.trace": lambda: traced(x)}, baseline="eager", device=device, batch_size=big
    )
m_trace, r_trace = trace_cmp.measurements["jit.trace"], trace_cmp.ratio("jit.trace")
print(m_trace)

# %% [markdown]
# ## `torch.compile`: a cold compile, measured with the caches off
# TorchDynamo captures the graph; TorchInductor generates fused kernels (C++/OpenMP on a CPU, Triton on a
# GPU). Compiling happens on the **first call**, which we time alone, then we time the steady state.
# `torch._dynamo.reset()` forgets compiled code in memory, but Inductor also keeps an **on-disk cache**
# (compiled kernels, FX graphs) that survives resets and restarts: a "cold" compile measured on a second run
# would really be warm. `torch.compiler.config.force_disable_caches = True` turns those caches off, so the
# numbers below are truly cold. The very first compile in a process also loads and builds Inductor's own
# pieces; a tiny function pays that first, and its time is printed.
#
# Two CPU variants: the default, and **freezing** (`torch._inductor.config.freezing = True`): weights become
# constants, so Inductor folds batch norm into the convolutions and pre-packs weights for oneDNN's fast
# kernels. Freezing is for inference only.

# %%
torch.compiler.config.force_disable_caches = True
torch._dynamo.reset()
print(f"first compile in this process (a one-line function): {first_call_s(torch.compile(torch.sin), x, device):.1f} s")

compiled_fns, costs = {}, []
for name, freeze in {"compile default": False, "compile + freezing": True}.items():
    for b, xb in inputs.items():
        torch._inductor.config.freezing = freeze
        torch._dynamo.reset()
        compiled = torch.compile(model)
        cold_s = first_call_s(compiled, xb, device)
        torch._inductor.config.freezing = False
        with torch.inference_mode():
            cu.check_outputs(compiled(xb), reference[b], "fp32", label=f"{name} b={b} vs eager")
            # steady state against eager, taking turns in rounds, before the next reset() drops this graph
            pair = cu.compare(
                {"eager": lambda xb=xb: model(xb), name: lambda c=compiled, xb=xb: c(xb)},
                baseline="eager",
                device=device,
                batch_size=b,
            )
        compiled_fns[(name, b)] = compiled
        m = pair.measurements[name]
        costs.append({"variant": name, "batch": b, "first_call_s": cold_s, "m": m, "r": pair.ratio(name),
                      "eager_ms": pair.measurements["eager"].median_ms})  # fmt: skip
        print(f"{m}  (cold first call {cold_s:.1f} s): {pair.ratio(name)} vs eager")

# %% [markdown]
# ### The warm cache: a deployment benefit
# With the caches on, the first compile writes Inductor's results to disk (`torch._inductor` cache dir);
# the next process, or the next compile after `torch._dynamo.reset()`, reads them back. A server that ships
# its cache directory (or restarts on the same machine) starts in a fraction of the cold time.

# %%
torch.compiler.config.force_disable_caches = False
xw = inputs[big]
warm_times = []
for attempt in ("with caches on, first (writes the cache)", "after reset (reads the cache)"):
    torch._dynamo.reset()
    warm_times.append(first_call_s(torch.compile(model), xw, device))
    print(f"compile default b={big}, {attempt}: {warm_times[-1]:.1f} s")
cold_big = next(c["first_call_s"] for c in costs if c["variant"] == "compile default" and c["batch"] == big)
# torch._inductor.runtime.cache_dir_utils.cache_dir() is private: cu.compilation falls back (and says why) if moved
inductor_dir, dir_note = cu.compilation.inductor_cache_dir()
print(
    f"cold (caches off) {cold_big:.1f} s -> warm {warm_times[-1]:.1f} s ({cold_big - warm_times[-1]:.1f} s less "
    f"start-up time, one compile each). Cache directory: {inductor_dir}" + (f" ({dir_note})" if dir_note else "")
)
torch._dynamo.reset()

# %% [markdown]
# ## `torch.export` and AOTInductor: compile once, deploy the artifact
# `torch.export.export` traces the model ahead of time into an `ExportedProgram`: one graph of ATen
# operators, no Python left, dynamic dimensions declared up front (here the batch). It never graph-breaks:
# what it cannot capture is an error. `ep.module()` runs that graph in Python (a portable artifact, not a
# speed-up). The deployment path is **AOTInductor**: `aoti_compile_and_package` compiles the exported graph
# into a `.pt2` package (a shared library plus weights); `aoti_load_package` loads it in a serving process,
# with no compile and no Python model code there (C++ can load it too).

# %%
batch_dim = torch.export.Dim("batch", min=1, max=1024)
t0 = time.perf_counter()
ep = torch.export.export(model, (inputs[big],), dynamic_shapes=({0: batch_dim},))
export_s = time.perf_counter() - t0
n_ops = sum(1 for n in ep.graph.nodes if n.op == "call_function")
print(
    f"torch.export: {export_s:.2f} s, {n_ops} ATen operator calls, input shape {ep.graph_signature.user_inputs} "
    f"with batch range {list(ep.range_constraints.values())}"
)
exported = ep.module()

package_dir = Path(tempfile.mkdtemp(prefix="aoti_"))
t0 = time.perf_counter()
package = torch._inductor.aoti_compile_and_package(ep, package_path=str(package_dir / "digits_cnn.pt2"))
aoti_compile_s = time.perf_counter() - t0
t0 = time.perf_counter()
aoti = torch._inductor.aoti_load_package(package)
aoti_load_s = time.perf_counter() - t0
print(
    f"AOTInductor: compile {aoti_compile_s:.1f} s (once, at build time; caches on), package "
    f"{Path(package).stat().st_size / 2**20:.2f} MiB, load {aoti_load_s * 1000:.0f} ms (in the server)"
)

export_cmp = {}
with torch.inference_mode():
    for b, xb in inputs.items():
        cu.check_outputs(exported(xb), reference[b], "fp32", label=f"ep.module() b={b} vs eager")
        cu.check_outputs(aoti(xb), reference[b], "fp32", label=f"AOTInductor b={b} vs eager")
        export_cmp[b] = cu.compare(  # eager, ep.module() and the package take turns in rounds
            {"eager": lambda xb=xb: model(xb), "ep.module()": lambda xb=xb: exported(xb),
             "AOTInductor": lambda xb=xb: aoti(xb)},
            baseline="eager", device=device, batch_size=b,
        )  # fmt: skip
        print(f"batch {b}:", export_cmp[b])

# %% [markdown]
# ## Results: steady state, compile cost, break-even
# Speed-up is eager's time / the variant's at the same batch (above 1: faster), each variant taking turns with
# eager in rounds, with its 95% interval. Break-even is the number of calls after which the first call's extra
# time has been paid back by faster calls.

# %%
rows = [{"variant": "eager", "batch": b, "m": eager[b], "first_call_s": None, "r": None} for b in batches]
rows.append({"variant": "jit.trace (legacy)", "batch": big, "m": m_trace, "first_call_s": None, "r": r_trace})
rows += [{k: c[k] for k in ("variant", "batch", "m", "first_call_s", "r")} for c in costs]
for name, key, first in (("torch.export ep.module()", "ep.module()", export_s),
                         ("AOTInductor package", "AOTInductor", aoti_load_s)):  # fmt: skip
    rows += [{"variant": name, "batch": b, "m": export_cmp[b].measurements[key], "first_call_s": first,
              "r": export_cmp[b].ratio(key)} for b in batches]  # fmt: skip
table = pd.DataFrame(rows)
table["steady_ms"] = [r.m.median_ms for r in table.itertuples()]
table["iqr_ms"] = [r.m.iqr_ms for r in table.itertuples()]
table["speedup"] = [r.r.estimate if r.r else 1.0 for r in table.itertuples()]
table["low"] = [r.r.low if r.r else 1.0 for r in table.itertuples()]
table["high"] = [r.r.high if r.r else 1.0 for r in table.itertuples()]
table["verdict"] = [r.r.verdict if r.r else "baseline" for r in table.itertuples()]
table["flags"] = [
    "; ".join(([f"high spread (IQR {r.m.spread:.0%})"] if r.m.spread > cu.timing.HIGH_SPREAD else []) + r.r.flags)
    if r.r
    else ""
    for r in table.itertuples()
]
table["break_even_calls"] = [  # eager's time per call from the speed-up: eager ms = variant ms x speed-up
    cu.compilation.break_even_calls(r.first_call_s, r.steady_ms * r.speedup, r.steady_ms)
    if pd.notna(r.first_call_s)
    else None
    for r in table.itertuples()
]
display(table.drop(columns=["m", "r"]).round(3))
print("AOTInductor's first_call_s is its load time in the server; its compile happened at build time.")

# %%
fig = cu.plots.speedup_bars(
    {f"{r.variant} b={r.batch}": r.r for r in table.itertuples() if r.variant != "eager"},
    title=f"Steady-state speed vs eager (digits CNN, {device})",
)
_ = cu.plots.save(fig, "06", "steady_state_vs_eager")

# %%
for r in table[table.variant.str.startswith("compile")].itertuples():
    verdict = (
        "never pays back (not faster per call)"
        if math.isinf(r.break_even_calls) or r.r.verdict == "slower"
        else f"pays back after about {r.break_even_calls:,.0f} calls"
        if r.r.verdict == "faster"
        else "not shown to pay back: not shown faster per call here"
    )
    print(
        f"{r.variant} b={r.batch}: cold first call {r.first_call_s:.1f} s, steady {r.steady_ms:.3f} ms: {r.r} vs "
        f"eager -> {verdict}"
    )
compiled_rows = table[table.variant.str.startswith("compile") | (table.variant == "AOTInductor package")]
best = compiled_rows.sort_values("low", ascending=False).iloc[0]  # the surest gain: the highest low end
print(
    f"\nBest compiled setting here: {best.variant} at batch {best.batch}: {best.r} vs eager; course target on "
    f"CPU, >= 1.2x: {best.r.judge(1.2)}."
)

# %% [markdown]
# ## Recompilation when shapes change
# TorchDynamo guards each compiled graph on the input shapes. A new batch size fails the guard and triggers
# a **recompile** (each costs about a cold compile above). A counting backend (`CompileCounter`) counts
# the graphs without running Inductor, so the counts are cheap. `dynamic=False` compiles one graph per
# size; the default (`dynamic=None`) recompiles once, then makes the dimension symbolic; `dynamic=True` or
# `torch._dynamo.mark_dynamic(x, 0)` on the input asks for a size-generic graph from the start. Sizes 0 and
# 1 are always specialized, so batch 1 would get a graph of its own; the sizes below start at 2. Even a
# size-generic graph carries **guards**: if one fails, the reason is printed below (on a CPU the convolution
# can guard on a batch range, so large batches get a second graph). `TORCH_LOGS="recompiles"` prints them live.

# %%
sizes = cu.pick(full=[2, 3, 5, 8, 13, 21, 34, 55], smoke=[2, 3, 5, 8])  # at most 8: the default recompile limit
shape_inputs = [digits.x_test[:s].to(device) for s in sizes]


def count_graphs(**compile_kwargs) -> int:
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, **compile_kwargs)
    with torch.inference_mode():
        for xs in shape_inputs:
            compiled(xs)
    return counter.frame_count


recompiles = pd.DataFrame(
    [
        {"setting": "dynamic=False", "graphs": count_graphs(dynamic=False)},
        {"setting": "default (dynamic=None)", "graphs": count_graphs()},
        {"setting": "dynamic=True", "graphs": count_graphs(dynamic=True)},
    ]
)
recompiles["batch sizes seen"] = len(sizes)
display(recompiles)
cheapest = min(c["first_call_s"] for c in costs)
print(
    f"Static shapes: {recompiles.graphs[0]} graphs for {len(sizes)} sizes; at the cheapest cold compile above "
    f"({cheapest:.1f} s) that is about {recompiles.graphs[0] * cheapest:.0f} s of compiling before serving settles. "
    f"dynamic=True: {recompiles.graphs[2]} graph(s). (Marking one input's dimension dynamic instead is "
    "exercise 06.mark-dynamic.)"
)
# why the last run recompiled: torch._dynamo.utils.guard_failures (private; cu.compilation says so if it moved)
failed_guards, guards_note = cu.compilation.guard_failure_reasons()
for fn_name, reason in failed_guards or []:
    print(f"recompiled {fn_name}() because a guard failed: {reason}")
if guards_note:
    print(f"Guard failures not shown: {guards_note}")

# %% [markdown]
# ### The recompile limit: a silent fall back to eager
# Dynamo stops recompiling one function after `torch._dynamo.config.recompile_limit` graphs (the default is
# printed) and runs it **eagerly** from then on, with one warning in the log. The answers stay right, but
# the speed-up is gone, for every new shape. Lowered to 3 here to see it with few sizes.

# %%
limit_key, limit_note = cu.compilation.recompile_limit_key()  # "recompile_limit" (older torch: cache_size_limit)
if limit_note:
    print(limit_note)
if limit_key is not None:
    print(f"default {limit_key}: {getattr(torch._dynamo.config, limit_key)}")
    torch._dynamo.reset()
    counter = CompileCounter()
    with torch._dynamo.config.patch(**{limit_key: 3}), torch.inference_mode():
        limited = torch.compile(model, backend=counter, dynamic=False)
        for xs in shape_inputs:
            cu.check_outputs(limited(xs), model(xs), "fp32", label=f"batch {xs.shape[0]}")
    eager_sizes = len(sizes) - counter.frame_count
    print(
        f"{len(sizes)} sizes, a recompile limit of 3, graphs compiled: {counter.frame_count}; the other "
        f"{eager_sizes} size{'s' if eager_sizes != 1 else ''} ran in eager mode (correct, not compiled)."
    )
    torch._dynamo.reset()

# %% [markdown]
# ## GPU: a CUDA graph by hand, `reduce-overhead`, `max-autotune`
# At small batch on a GPU the time goes into launching kernels, not running them. A **CUDA graph** records
# the whole sequence of kernel launches once and replays it with one launch. Capturing by hand: warm up on a
# side stream (lazy initialization and cuDNN's algorithm search must not happen during capture), then record
# `model(static_input)` inside `torch.cuda.graph`. The input and output are **static buffers**: copy new
# data into the input, replay, read the output, which the **next replay overwrites** (clone it to keep it).
# `mode="reduce-overhead"` does the same inside `torch.compile`; `mode="max-autotune"` also benchmarks kernel
# configurations (long compile). FP32 here is true FP32 (TF32 off for matmuls and cuDNN); compiled variants
# are judged at the TF32 tolerance because their fused kernels sum in a different order.
#
# Verification: **contract-tested** (`tests/gpu_contract/test_l06_cuda_graphs.py` runs `capture_cuda_graph`
# and `replay` below against a CPU stand-in for `torch.cuda` that accepts only the real API's names and
# signatures and replays the recorded operators; the `torch.compile` modes are not run there). Not yet
# executed on a GPU by the course unless reference results are shown below.


# %% tags=["contract"]
def capture_cuda_graph(model, example, warmup=3):
    """Record model(example) into a CUDA graph; return (graph, static_input, static_output)."""
    static_input = example.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(warmup):
            model(static_input)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_output = model(static_input)
    return graph, static_input, static_output


def replay(graph, static_input, static_output, x):
    """Run the captured graph on new data x (same shape): copy in, replay, return the static output."""
    static_input.copy_(x)
    graph.replay()
    return static_output


# %%
if cu.gpu_section("06.cuda-graphs"):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    gmodel = cu.models.resnet("resnet18", device="cuda")[0].eval()
    xg = torch.randn(1, 3, 224, 224, device="cuda")
    with torch.inference_mode():
        ref_g = gmodel(xg)

    def eager_g():
        with torch.inference_mode():
            gmodel(xg)

    graph, static_in, static_out = capture_cuda_graph(gmodel, xg)
    cu.check_outputs(replay(graph, static_in, static_out, xg), ref_g, "fp32", label="CUDA graph vs eager")
    kept = static_out.clone()
    other = replay(graph, static_in, static_out, torch.randn_like(xg))
    print(
        f"same output buffer: {other.data_ptr() == static_out.data_ptr()}; previous result overwritten: "
        f"{not torch.equal(other, kept)}"
    )
    graph_cmp = cu.compare(  # eager and the replay take turns in rounds (lesson 01)
        {"eager": eager_g, "CUDA graph by hand": lambda: replay(graph, static_in, static_out, xg)},
        baseline="eager",
        device="cuda",
        batch_size=1,
    )
    m_eager_g, m_graph = graph_cmp.measurements["eager"], graph_cmp.measurements["CUDA graph by hand"]
    graph_gain = graph_cmp.ratio("CUDA graph by hand")
    gpu_rows = {"eager": (m_eager_g, None, None), "CUDA graph by hand": (m_graph, None, graph_gain)}
    for name, (m, _, r) in gpu_rows.items():
        print(m)
        cu.record(
            "06",
            f"gpu {name}",
            model="resnet18",
            device="cuda",
            dtype="fp32",
            measurement=m,
            speedup_vs_baseline=r if r is not None else 1.0,
        )
    print(f"CUDA graph by hand at batch 1: {graph_gain} vs eager; target >= 1.5x: {graph_gain.judge(1.5)}")
else:
    cu.results.show_reference("06")

# %% [markdown]
# `torch.compile`'s CUDA modes, beside the graph by hand. Inductor generates Triton kernels for the GPU: this
# section needs a real one (the rehearsal's stand-in cannot run them).

# %%
if cu.gpu_section("06.compile-cuda", requires={"the eager and graph rows of 06.cuda-graphs": "gpu_rows" in globals()}):
    # Smoke size: reduce-overhead only, on a 64x64 image. max-autotune benchmarks kernel configurations for minutes
    # (it would take a timed GPU run's whole budget), so it runs at full size only.
    cuda_modes = cu.pick(full=("reduce-overhead", "max-autotune"), smoke=("reduce-overhead",))
    xc = cu.pick(full=xg, smoke=xg[:, :, :64, :64].contiguous())
    with torch.inference_mode():
        ref_c = gmodel(xc)

    def eager_c():
        with torch.inference_mode():
            gmodel(xc)

    if cuda_modes != ("reduce-overhead", "max-autotune"):
        print(f"Smoke size: {', '.join(cuda_modes)} on a {tuple(xc.shape)} input; max-autotune runs at full size only.")
    for mode in cuda_modes:
        torch._dynamo.reset()
        compiled_g = torch.compile(gmodel, mode=mode)
        first_s = first_call_s(compiled_g, xc, "cuda")
        with torch.inference_mode():
            cu.check_outputs(compiled_g(xc).clone(), ref_c, "tf32", label=f"compile {mode} vs eager")
            mode_cmp = cu.compare(  # against eager, taking turns in rounds, before the next reset() drops it
                {"eager": eager_c, f"compile {mode}": lambda c=compiled_g: c(xc)},
                baseline="eager",
                device="cuda",
                batch_size=1,
            )
        m, r = mode_cmp.measurements[f"compile {mode}"], mode_cmp.ratio(f"compile {mode}")
        gpu_rows[f"compile {mode}"] = (m, first_s, r)
        print(m, f"(first call {first_s:.1f} s): {r} vs eager")
        cu.record(
            "06",
            f"gpu compile {mode}",
            model="resnet18",
            device="cuda",
            dtype="fp32",
            measurement=m,
            speedup_vs_baseline=r,
            notes=f"input {tuple(xc.shape)}",
        )
    torch._dynamo.reset()
    fig = cu.plots.speedup_bars(
        {k: r for k, (_, _, r) in gpu_rows.items() if r is not None},
        title="ResNet-18 batch 1 on GPU: speed vs eager"
        + ("" if xc is xg else f" (compile rows: {xc.shape[-1]}x{xc.shape[-1]} smoke input)"),
    )
    _ = cu.plots.save(fig, "06", "gpu_resnet18_vs_eager")
else:
    cu.results.show_reference("06", "compile")

# %% [markdown]
# ## What surprised us
# Printed from this run's numbers, so the sentences match what happened on your machine.

# %%
for b in batches:
    for c in (c for c in costs if c["batch"] == b):
        print(
            f"batch {b}: {c['r'].says(c['variant'], 'eager')}, after a cold first call of {c['first_call_s']:.1f} s "
            f"(an eager call takes {c['eager_ms']:.3f} ms)."
        )
    fr, pl = (next(c["r"] for c in costs if c["batch"] == b and c["variant"] == v)
              for v in ("compile + freezing", "compile default"))  # fmt: skip
    # each was timed against eager in its own rounds: freezing vs not is their quotient, bounded by the ends of
    # both medians' 97.5% intervals (together they hold at least 95% of the time)
    (f_lo, f_hi, f_conf), (p_lo, p_hi, p_conf) = (cu.intervals.median_interval(r.rounds, 0.975) for r in (fr, pl))
    frozen = cu.intervals.ratio_from_bounds("compile + freezing", "compile default", fr.estimate / pl.estimate,
                                            f_lo / p_hi, f_hi / p_lo, f_conf * p_conf)  # fmt: skip
    print(
        f"batch {b}: {frozen.says('freezing', 'no freezing')} (vs eager: {fr.interval_text} with, "
        f"{pl.interval_text} without)."
    )
ao = {b: export_cmp[b].ratio("AOTInductor") for b in batches}
print(
    f"AOTInductor package vs eager: {', '.join(f'{ao[b]} at batch {b}' for b in batches)}, loaded in "
    f"{aoti_load_s * 1000:.0f} ms instead of a {aoti_compile_s:.0f} s compile in the serving process."
)
print(f"jit.trace at batch {big}: {r_trace} vs eager, and it froze a branch above: it is legacy for a reason.")
noisy = [r.m.label for r in table.itertuples() if r.m.spread > cu.timing.HIGH_SPREAD]
if noisy:
    print(
        f"Careful: {len(noisy)} timings had a high spread (IQR > {cu.timing.HIGH_SPREAD:.0%} of the median), e.g. "
        f"{noisy[:3]}: the machine was busy; the intervals above are wide for that reason."
    )

# %% [markdown]
# ## Exercises
# Each self-check draws its cases at random (model widths, batch sizes) and watches the compiler itself: a
# counting backend sees every graph compiled and every call that runs through a compiled graph.
#
# 1. **`06.mark-dynamic`**: `serve(compiled, batches)` receives a model compiled with `dynamic=False` (one
#    graph per batch size) and a list of batches of different sizes. Return the outputs for every batch, each
#    batch run **once, at its own size, through the compiled model**, while the compiler builds **one** graph
#    in all. Limiting recompiles (later sizes then run eagerly), concatenating the batches, padding them to
#    the largest, or answering with the eager model are all seen and refused.


# %%
def serve(compiled, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    raise NotImplementedError  # your code here


cu.exercises.check("06.mark-dynamic", serve)


# %% [markdown]
# 2. **`06.pad-batch`**: a CUDA graph (or a model compiled for static shapes) runs at **one** batch size.
#    `serve_padded(compiled, x, size)` gets a model that has compiled its one graph for batch `size`: split
#    `x` into chunks of `size`, zero-pad the last chunk up to `size`, run every chunk through `compiled`, and
#    return only the real rows' outputs. A new graph, an eager call or padded rows in the answer are refused.


# %%
def serve_padded(compiled, x: torch.Tensor, size: int) -> torch.Tensor:
    raise NotImplementedError  # your code here


cu.exercises.check("06.pad-batch", serve_padded)


# %% [markdown]
# 3. **`06.export`**: export a model with **two** inputs, `x` (N, F) and per-row weights `mask` (N, 1), for
#    AOTInductor. `export_two_inputs(model, example, max_batch)` returns the `ExportedProgram` with dimension
#    0 of both inputs dynamic, covering batches 1 to `max_batch`, as **one** shared dimension (two separate
#    ones would make the graph guard that they are equal). The check reads the graph's symbols and ranges,
#    then runs `ep.module()` at random batch sizes against eager. (The package step,
#    `aoti_compile_and_package`, is the one shown above; it is not repeated in the check because its C++
#    compile takes minutes on a small CPU.)


# %%
def export_two_inputs(model, example: tuple[torch.Tensor, torch.Tensor], max_batch: int):
    raise NotImplementedError  # your code here


cu.exercises.check("06.export", export_two_inputs)

# %% [markdown]
# 4. (Open) Re-run the compile cell with `torch.set_num_threads(1)`: does the compiled model gain more or
#    less over eager with fewer threads? Why might per-operator overhead matter more then?
#
# ## Summary
# Compilers remove per-operator overhead and fuse memory traffic, at a one-off cost you now measure cold and
# warm and weigh in calls (break-even), plus a recompile per new shape unless you mark it dynamic. Tracing
# freezes Python decisions; graph breaks show where the compiler gave up. `torch.export` + AOTInductor moves
# the compile to build time. Next: **07 · ONNX Runtime**, another runtime for an exported graph.

# %%
for r in table.itertuples():
    cu.record(
        "06",
        r.variant,
        model="digits-cnn",
        device=str(device),
        dtype="fp32",
        measurement=r.m,
        speedup_vs_baseline=r.r if r.r else 1.0,
        notes="" if pd.isna(r.first_call_s) else f"first call {r.first_call_s:.2f} s",
    )
print(f"{len(table)} rows recorded.")
