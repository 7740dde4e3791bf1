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
# **Goals.** Export a PyTorch model to ONNX yourself (`torch.onnx.export` with `dynamo=True` and a dynamic
# batch), check the file, and prove parity with PyTorch. Build ONNX Runtime (ORT) sessions with
# `SessionOptions`: graph optimization level, threads, the optimized graph saved to disk (node counts before
# and after fusion). Compare ORT with eager PyTorch **at equal thread counts**, see where the time goes with
# ORT's own profiler, bind torch tensors with IOBinding, and quantize ResNet-18 to static INT8 (QDQ) with a
# calibration reader you write. Finally, feed the session a wrong input and compare ORT's message with the
# course's check.
#
# **The bottleneck it attacks** (see the taxonomy in *01 · Measuring inference*): **framework overhead**
# (a C++ runtime with no Python per operator) and **memory traffic** (operator fusion: convolution +
# activation in one kernel, layouts that suit the CPU's vector units). Static INT8 attacks **compute**.

# %%
import collections
import copy
import json
import os
import time
import warnings

import numpy as np
import onnx
import pandas as pd
import torch
from IPython.display import display

import course_utils as cu
from course_utils.techniques import onnx_runtime

ort = onnx_runtime.require_onnxruntime()  # `import onnxruntime`, or a course error naming the fix if it cannot load
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static  # noqa: E402
from onnxruntime.quantization.shape_inference import quant_pre_process  # noqa: E402

device = cu.lesson.start("07", "ONNX Runtime")
print(f"onnxruntime {ort.__version__}, onnx {onnx.__version__}")
work = cu.results.results_dir() / "artifacts" / "07"  # .onnx files go here, never into the repository
work.mkdir(parents=True, exist_ok=True)
threads = torch.get_num_threads()  # every engine below runs with this many threads: a fair comparison

# %% [markdown]
# ## Baseline: ResNet-18 in eager PyTorch
# ResNet-18 from torchvision (random weights unless ImageNet weights are in your local torch cache:
# speed does not depend on them). Batch 1 is a single request; the larger batch is throughput work.

# %%
model, note = cu.models.resnet("resnet18")
print(f"ResNet-18: {note}; PyTorch uses {threads} threads")
size = cu.pick(full=224, smoke=64)
big = cu.pick(full=16, smoke=4)
torch.manual_seed(0)
xs = {1: torch.randn(1, 3, size, size), big: torch.randn(big, 3, size, size)}
reps = {1: cu.pick(full=15, smoke=5), big: cu.pick(full=5, smoke=3)}  # large batches: fewer, longer calls
timing = {
    b: {"min_repeats": reps[b], "min_time_s": cu.pick(full=0.5, smoke=0.05), "warmup": 2 if b == 1 else 1} for b in xs
}
with torch.inference_mode():
    ref = {b: model(x) for b, x in xs.items()}
    eager = {
        b: cu.measure(lambda x=x: model(x), device="cpu", batch_size=b, label=f"eager b={b}", **timing[b])
        for b, x in xs.items()
    }
for m in eager.values():
    print(m)
    cu.record("07", "eager", model="resnet18", device="cpu", dtype="fp32", measurement=m, notes=f"{threads} threads")

# %% [markdown]
# ## Export with a dynamic batch, check, parity
# Today's export: the **dynamo** exporter (`dynamo=True`, the default since PyTorch 2.9) traces the model with
# `torch.export` and writes opset 20 by default. `dynamic_shapes` names dimension 0 of the argument `x` (the
# name in `ResNet.forward`) as the symbol `batch`. The example batch is 2: `torch.export` may specialize a
# dimension of size 1 to a constant. `external_data=False` keeps the weights inside the one file.
# Then `onnx.checker` validates the file, and ORT's output must match PyTorch's within the FP32 tolerance
# before any speed is compared.

# %%
onnx_path = work / f"resnet18_{size}.onnx"
x2 = torch.randn(2, 3, size, size)
t0 = time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the exporter's progress notes
    torch.onnx.export(
        model,
        (x2,),
        onnx_path,
        dynamo=True,
        dynamic_shapes={"x": {0: "batch"}},
        input_names=["input"],
        output_names=["logits"],
        external_data=False,
        verbose=False,
    )
export_s = time.perf_counter() - t0
proto = onnx.load(str(onnx_path))
onnx.checker.check_model(proto)
dims = [d.dim_param or d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
print(
    f"exported {onnx_path.name} in {export_s:.1f} s: {onnx_path.stat().st_size / 2**20:.1f} MiB, opset {opset}, "
    f"input dims {dims}, {len(proto.graph.node)} nodes; onnx.checker passed"
)

session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
print("inputs:", [(i.name, i.type, i.shape) for i in session.get_inputs()])
print("FP32 tolerance:", cu.tolerance_table().loc["fp32"].dropna().to_dict())
for b, x in xs.items():
    (logits,) = session.run(["logits"], {"input": x.numpy()})
    cu.check_outputs(torch.from_numpy(logits), ref[b], "fp32", label=f"ORT vs PyTorch, batch {b}")

# %% [markdown]
# ### What changed since the source tutorial's export
# The tutorial exported with the legacy TorchScript exporter: `opset_version=11` or `14`, `dynamic_axes={...}`
# and a batch-1 example. Today `dynamic_axes` is deprecated in favour of `dynamic_shapes`, the default opset is
# 20, and the legacy path (`dynamo=False`) warns. The cell below exports the small digits CNN three ways and
# runs each file at batch 3, so you see what each choice does (the printout is this run's).

# %%
cnn = cu.models.load_digits_model("cnn")
d1, d3 = torch.randn(1, 1, 8, 8), torch.randn(3, 1, 8, 8)
ways = {
    "seed: legacy exporter, dynamic_axes, opset 14": dict(
        dynamo=False, opset_version=14, dynamic_axes={"input": {0: "batch"}}
    ),
    "dynamo, no dynamic_shapes (batch fixed)": dict(dynamo=True),
    "dynamo, dynamic_shapes, batch-1 example": dict(dynamo=True, dynamic_shapes={"x": {0: "batch"}}),
}
export_rows = []
for name, kw in ways.items():
    path = work / f"digits_{len(export_rows)}.onnx"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.onnx.export(
            cnn, (d1,), path, input_names=["input"], output_names=["logits"], verbose=False, external_data=False, **kw
        )
    p = onnx.load(str(path))
    try:
        ort.InferenceSession(str(path)).run(None, {"input": d3.numpy()})
        batch3 = "runs"
    except Exception as exc:  # noqa: BLE001 - ORT's own error is the point here
        batch3 = str(exc).splitlines()[0][:90]
    deprecations = sorted({w.category.__name__ for w in caught if issubclass(w.category, DeprecationWarning)})
    export_rows.append(
        {
            "export": name,
            "opset": next(o.version for o in p.opset_import if o.domain in ("", "ai.onnx")),
            "input dims": [d.dim_param or d.dim_value for d in p.graph.input[0].type.tensor_type.shape.dim],
            "batch 3": batch3,
            "warnings": ", ".join(deprecations) or "none",
        }
    )
display(pd.DataFrame(export_rows).set_index("export"))

# %% [markdown]
# ## SessionOptions: optimization levels, threads, the optimized graph
# A session is built from `SessionOptions`: `graph_optimization_level` (`ORT_DISABLE_ALL`, `BASIC`: constant
# folding and redundant nodes, `EXTENDED`: fusions such as `Conv`+`Relu` into `FusedConv`, `LAYOUT` and `ALL`:
# the CPU's blocked NCHWc layout), `intra_op_num_threads` (here: PyTorch's thread count, so the comparison
# is runtime against runtime, not thread pool against thread pool), and `optimized_model_filepath`, which
# saves the graph ORT actually runs so that we can count its nodes. Creating the session is timed too:
# optimizing the graph happens there, once.
#
# One more entry matters whenever ORT is timed beside anything else in the same process: by default ORT's idle
# intra-op threads **spin** after each run, waiting for the next one (the session config entry
# `"session.intra_op.allow_spinning"`, default `"1"`: onnxruntime.ai, "Thread management"). When ORT and PyTorch
# take turns, the spinning threads hold the cores PyTorch's next call needs, and ORT's speed-up reads too high.
# Every session here sets it to `"0"`; a section below measures what the default does to the comparison.

# %%
levels = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "layout": ort.GraphOptimizationLevel.ORT_ENABLE_LAYOUT,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
sessions, counts, create_s = {}, {}, {}
for name, level in levels.items():
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # see above
    so.optimized_model_filepath = str(work / f"resnet18_{size}.opt-{name}.onnx")
    so.log_severity_level = 3  # errors only
    t0 = time.perf_counter()
    sessions[name] = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    create_s[name] = time.perf_counter() - t0
    saved = onnx.load(so.optimized_model_filepath)
    counts[name] = collections.Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}" for n in saved.graph.node
    )
node_table = pd.DataFrame(counts).fillna(0).astype(int).T
node_table.insert(0, "total nodes", node_table.sum(axis=1))
node_table.insert(1, "session creation s", pd.Series(create_s).round(2))
display(node_table)

# %%
lo, hi = node_table.loc["disable", "total nodes"], node_table.loc["all", "total nodes"]
assert hi < lo, "the optimizer should remove nodes between the lowest and the highest level"
print(
    f"Nodes fall from {lo} (optimizations disabled) to {hi} (all): {lo - hi} nodes fused or removed. "
    f"Session creation took {create_s['disable']:.2f} s (disable) to {max(create_s.values()):.2f} s; "
    f"the export took {export_s:.1f} s."
)

# %% [markdown]
# ## Speed: ORT against eager PyTorch at equal thread counts
# Batch 1 at every level; the larger batch at the lowest and highest level. Every session above runs with
# `threads` intra-op threads, the same number PyTorch used for the eager baseline.


# %%
def eager_call(x):
    def fn():
        with torch.inference_mode():
            model(x)

    return fn


rows, level_cmp = [], {}
for b, x in xs.items():
    feed = {"input": x.numpy()}
    levels = {n: s for n, s in sessions.items() if b == 1 or n in ("disable", "all")}
    level_cmp[b] = cu.compare(  # eager and every level take turns in rounds (lesson 01)
        {"PyTorch eager": eager_call(x)}
        | {f"ORT {n}": (lambda sess=sess, feed=feed: sess.run(None, feed)) for n, sess in levels.items()},
        baseline="PyTorch eager",
        device="cpu",
        batch_size=b,
        warmup=timing[b]["warmup"],
    )
    for row in level_cmp[b].table().itertuples():
        r = level_cmp[b].ratios.get(row.variant)
        rows.append({"engine": row.variant, "batch": b, "median_ms": row.median, "speedup_vs_eager": row.ratio,
                     "low": row.low, "high": row.high, "verdict": row.verdict, "flags": row.flags, "r": r})  # fmt: skip
        if r is not None:
            cu.record(
                "07",
                f"ort level {row.variant.removeprefix('ORT ')}",
                model="resnet18",
                device="cpu",
                dtype="fp32",
                measurement=level_cmp[b].measurements[row.variant],
                speedup_vs_baseline=r,
                notes=f"{threads} threads, as eager",
            )
speed = pd.DataFrame(rows)
display(speed.pivot(index="engine", columns="batch", values="median_ms").round(3))
display(speed.drop(columns="r").round(3))

# %%
fig = cu.plots.speedup_bars(
    {f"{r.engine} b={r.batch}": r.r for r in speed.itertuples() if r.engine != "PyTorch eager"},
    title=f"ONNX Runtime vs PyTorch eager (ResNet-18, CPU, {threads} threads each)",
)
_ = cu.plots.save(fig, "07", "ort_vs_eager")
b1 = speed[(speed.batch == 1) & (speed.engine != "PyTorch eager")].sort_values("low", ascending=False).iloc[0]
print(
    f"Headline, equal threads ({threads}): best ORT level at batch 1 is {b1.engine}: {b1.r} vs eager; course "
    f"target on CPU, >= 1.5x (image size {size}): {b1.r.judge(1.5)}."
)

# %% [markdown]
# ## Threads
# ORT sizes its pool to the physical cores by default. Below, ORT and PyTorch run at the same thread count
# each time (`intra_op_num_threads` and `torch.set_num_threads`). On a shared machine fewer threads can be as
# fast, and leave cores for other requests.

# %%
max_threads = os.cpu_count() or 1
thread_counts = sorted({1, max(1, max_threads // 2), max_threads})
x1 = xs[1].numpy()
thread_rows, thread_sessions = [], {}
try:
    for t in thread_counts:
        so = ort.SessionOptions()
        so.intra_op_num_threads = t
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess_t = thread_sessions[t] = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        torch.set_num_threads(t)  # eager at the same thread count, taking turns with ORT in rounds
        t_cmp = cu.compare(
            {"eager": eager_call(xs[1]), "ORT all": lambda s=sess_t: s.run(None, {"input": x1})},
            baseline="eager",
            device="cpu",
            batch_size=1,
        )
        m_ort, m_eag, r_t = t_cmp.measurements["ORT all"], t_cmp.measurements["eager"], t_cmp.ratio("ORT all")
        thread_rows.append(
            {
                "threads": t,
                "ORT all ms": m_ort.median_ms,
                "eager ms": m_eag.median_ms,
                "ORT speed-up": r_t.estimate,
                "low": r_t.low,
                "high": r_t.high,
                "r": r_t,
            }
        )
        cu.record(
            "07",
            f"ort level all, {t} threads",
            model="resnet18",
            device="cpu",
            dtype="fp32",
            measurement=m_ort,
            speedup_vs_baseline=r_t,
            notes=f"baseline: eager with {t} threads",
        )
finally:
    torch.set_num_threads(threads)
threads_table = pd.DataFrame(thread_rows).set_index("threads")
display(threads_table.drop(columns="r"))


# Which thread count is fastest is a comparison too: each engine's thread counts take turns in rounds, against
# all threads. (The medians above come from separate comparisons, minutes apart: not comparable.)
def eager_at(t):
    def run():
        torch.set_num_threads(t)
        with torch.inference_mode():
            return model(xs[1])

    return run


def n_threads(t):
    return f"{t} thread" + ("s" if t > 1 else "")


all_t = max(thread_counts)
try:
    by_threads = {
        "ORT": cu.compare(
            {n_threads(t): (lambda s=thread_sessions[t]: s.run(None, {"input": x1})) for t in thread_counts},
            baseline=n_threads(all_t),
            device="cpu",
        ),
        "eager": cu.compare({n_threads(t): eager_at(t) for t in thread_counts}, baseline=n_threads(all_t),
                            device="cpu"),
    }  # fmt: skip
finally:
    torch.set_num_threads(threads)


def fastest_threads(cmp):
    """The thread count surely faster than all threads (the highest interval low end), else None."""
    faster = {k: r for k, r in cmp.ratios.items() if r.verdict == "faster"}
    return max(faster, key=lambda k: faster[k].low) if faster else None


# %% [markdown]
# ### Threads that spin: what ORT's default does to a comparison
# The batch-1 comparison at level `all` with `threads` threads, twice: once with ORT's default (idle threads spin
# after each run) and once with spinning off, as every session above. Both take turns with eager PyTorch in one
# process, as a benchmark in a notebook does.


# %%
def spin_session(spin):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", spin)  # "1": ORT's default
    return ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])


spin_ratio = {}
for label, spin in (("spinning (ORT's default)", "1"), ("no spinning", "0")):
    spin_sess = spin_session(spin)
    spin_ratio[label] = cu.compare(
        {"eager": eager_call(xs[1]), "ORT all": lambda s=spin_sess: s.run(None, {"input": x1})},
        baseline="eager", device="cpu", batch_size=1,
    ).ratio("ORT all")  # fmt: skip
    del spin_sess  # its threads go with it
r_spin, r_still = spin_ratio.values()
print(f"ORT all vs eager, batch 1, {n_threads(threads)} each, taking turns: spinning {r_spin}; no spinning {r_still}.")
print(
    "With the default, ORT read higher than without, beyond both intervals: its idle threads held the cores eager "
    "PyTorch needed next, and the default overstated ORT's speed-up."
    if r_spin.low > r_still.high
    else "The two readings overlap: spinning did not move this comparison beyond the noise here"
    + (" (one thread: ORT has no idle worker thread to spin)." if threads == 1 else ".")
)
print(
    f"Width of the interval: {r_spin.high - r_spin.low:.2f} with spinning, {r_still.high - r_still.low:.2f} without: "
    "with ORT's default, the rounds disagreed more than twice as much."
    if r_spin.high - r_spin.low > 2 * (r_still.high - r_still.low)
    else f"Width of the interval: {r_spin.high - r_spin.low:.2f} with spinning, {r_still.high - r_still.low:.2f} "
    "without."
)

# %% [markdown]
# ## Where ORT spends the time: its own profiler
# `SessionOptions.enable_profiling = True` makes the session write a Chrome-trace JSON (open it in Perfetto);
# `end_profiling()` closes it and returns its path. Each `Node` event is one kernel of the optimized graph.

# %%
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.add_session_config_entry("session.intra_op.allow_spinning", "0")
so.enable_profiling = True
so.profile_file_prefix = str(work / "ort_profile")
prof_sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
for _ in range(cu.pick(full=10, smoke=3)):
    prof_sess.run(None, {"input": x1})
trace_path = prof_sess.end_profiling()
events = pd.DataFrame(json.load(open(trace_path)))
nodes = events[events["cat"] == "Node"].copy()
nodes["op"] = nodes["args"].map(lambda a: a.get("op_name", "?"))
per_op = (nodes.groupby("op")["dur"].sum() / 1000.0).sort_values(ascending=False).rename("total ms").to_frame()
per_op["share"] = (per_op["total ms"] / per_op["total ms"].sum()).round(3)
print(f"trace: {trace_path} ({len(events)} events)")
display(per_op.head(8))

# %%
top_op = per_op.index[0]
print(
    f"{top_op} takes {per_op['share'].iloc[0]:.0%} of the kernel time: convolutions dominate, so fusing their "
    "activations (levels above) and cheaper arithmetic in them (INT8, below) are what can pay."
)

# %% [markdown]
# ## IOBinding: torch tensors in and out, no copies
# `session.run` takes numpy arrays and returns new ones. With `io_binding()` you hand ORT the addresses of
# tensors you own: `bind_input`/`bind_output` take the device type (`"cpu"` or `"cuda"`), the device index,
# the element type, the shape and `data_ptr()`. On a GPU this keeps data on the device (no host round trip
# per call); on a CPU it writes into your preallocated output. The same function serves both: the stream
# sync goes through `torch.get_device_module(device)`. (The GPU contract suite runs this cell on CPU.)


# %% tags=["contract"]
def bind_and_run(session, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Run ``session`` with ``x`` and ``out`` bound by address (float32, contiguous, same device)."""
    if x.dtype != torch.float32 or out.dtype != torch.float32 or not (x.is_contiguous() and out.is_contiguous()):
        raise onnx_runtime.BadInputError("bind_and_run needs contiguous float32 tensors: call .float().contiguous()")
    io = session.io_binding()
    kind, index = x.device.type, x.device.index or 0
    io.bind_input(session.get_inputs()[0].name, kind, index, np.float32, tuple(x.shape), x.data_ptr())
    io.bind_output(session.get_outputs()[0].name, kind, index, np.float32, tuple(out.shape), out.data_ptr())
    torch.get_device_module(x.device).synchronize()  # x must be written before ORT reads it
    session.run_with_iobinding(io)
    io.synchronize_outputs()
    return out


# %%
out_buf = torch.empty(1, 1000)
before = out_buf.data_ptr()
y = bind_and_run(sessions["all"], xs[1], out_buf)
cu.check_outputs(y, ref[1], "fp32", label="IOBinding (CPU, torch buffers) vs PyTorch")
print(f"output written in place: {y.data_ptr() == before}")
bind_cmp = cu.compare(
    {"run()": lambda: sessions["all"].run(None, {"input": x1}),
     "IOBinding": lambda: bind_and_run(sessions["all"], xs[1], out_buf)},
    baseline="run()",
    device="cpu",
)  # fmt: skip
bound = bind_cmp.ratio("IOBinding")
print(
    f"CPU, taking turns: {bound.says('IOBinding', 'run()')}: "
    + {
        "faster": "more than a CPU should gain (there is no host-device copy to save): the output buffer it reuses "
        "is the only saving; on a GPU the copies are what it removes.",
        "slower": "slower, where a CPU should see about the same: binding costs a Python call per input and output "
        "and a synchronize per run, which a small model notices; on a GPU the copies it removes outweigh that.",
    }.get(
        bound.verdict,
        "about the same, as expected on a CPU (no host-device copy to save); on a GPU the copies are what it removes.",
    )  # fmt: skip
)

# %% [markdown]
# ## Execution providers
# `get_available_providers()` lists what the installed wheel was **built** with, not what can run here.
# ORT falls back to the CPU silently when a provider cannot load: always compare `session.get_providers()`
# with what you asked for (`onnx_runtime.ort_session` does, and raises).

# %%
print("available (built in):", ort.get_available_providers())
try:
    onnx_runtime.ort_session(onnx_path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    print("CUDA execution provider applied.")
except onnx_runtime.ProviderFallbackError as exc:
    print("As expected without a GPU:", exc)

# %% [markdown]
# ### GPU: the CUDA provider's options, IOBinding, FP16
# The CUDA provider takes options per provider: `use_tf32` (on by default: FP32 convolutions and matmuls run
# as TF32, so compare against FP32 with the TF32 tolerance, or turn it off for a true FP32 run),
# `cudnn_conv_algo_search` (`EXHAUSTIVE` benchmarks every cuDNN algorithm at session start, `HEURISTIC` is
# quicker to start), and `enable_cuda_graph` (captures the whole run as one CUDA graph: needs IOBinding with
# fixed addresses and every node on the GPU). FP16 lives in the ONNX graph: export `model.half()`.
# **Verification:** contract-tested (`tests/gpu_contract/test_l07_ort.py` runs `bind_and_run` on CPU with
# torch buffers and builds `cuda_session` against the real ORT API, where the CUDA provider's fallback must
# be reported); not yet executed on a GPU.


# %% tags=["contract"]
def cuda_session(path, *, tf32: bool = True, cuda_graph: bool = False, algo_search: str = "EXHAUSTIVE"):
    """An ORT session on the CUDA provider with explicit options; raises if ORT fell back to the CPU."""
    options = {
        "device_id": 0,
        "use_tf32": int(tf32),
        "cudnn_conv_algo_search": algo_search,
        "enable_cuda_graph": int(cuda_graph),
    }
    return onnx_runtime.ort_session(
        path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"], provider_options=[options, {}]
    )


# %%
if cu.gpu_section("07.cuda-provider", providers=("CUDAExecutionProvider",)):
    ort.preload_dlls()  # CUDA/cuDNN libraries from the pip wheels, after importing torch
    # .to()/.half()/.float() convert a module IN PLACE: every GPU variant is made from a deep copy, so
    # `model_g` keeps FP32 weights for the FP32 reference and `model` stays on the CPU for what follows.
    model_g = copy.deepcopy(model).to("cuda")
    onnx_fp16 = work / f"resnet18_{size}.fp16.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            copy.deepcopy(model).cuda().half(),
            (x2.half().cuda(),),
            onnx_fp16,
            dynamo=True,
            dynamic_shapes={"x": {0: "batch"}},
            input_names=["input"],
            output_names=["logits"],
            external_data=False,
            verbose=False,
        )
    gpu = {"fp32 (TF32 off)": cuda_session(onnx_path, tf32=False), "fp32 (TF32 on)": cuda_session(onnx_path)}
    gpu_rows = {}
    torch.backends.cudnn.allow_tf32 = False  # a true FP32 reference (see lesson 04)
    torch.backends.cuda.matmul.allow_tf32 = False
    for b, x in xs.items():
        xg = x.cuda()
        with torch.inference_mode():
            ref_g = model_g(xg)
            gpu_rows[f"torch eager fp32 b={b}"] = cu.measure(lambda xg=xg: model_g(xg), device="cuda", batch_size=b)
        # A CUDA-graph session replays the graph it captured on its first run, without looking at new shapes
        # or addresses: one session per batch size (or `gpu_graph_id` run options), never one for all.
        graph_session = cuda_session(onnx_path, cuda_graph=True)
        for name, sess in {**gpu, "fp32, CUDA graph": graph_session}.items():
            out_g = torch.empty(b, 1000, device="cuda")
            cu.check_outputs(
                bind_and_run(sess, xg, out_g),
                ref_g,
                "fp32" if "off" in name else "tf32",
                label=f"ORT CUDA {name} b={b}",
            )
            gpu_rows[f"ORT CUDA {name} b={b}"] = cu.measure(
                lambda s=sess, xg=xg, o=out_g: bind_and_run(s, xg, o), device="cuda", batch_size=b
            )
        xn, s_copy = x.numpy(), gpu["fp32 (TF32 on)"]  # numpy in, numpy out: two host-device copies per call
        gpu_rows[f"ORT CUDA run() with host copies b={b}"] = cu.measure(
            lambda s=s_copy, xn=xn: s.run(None, {"input": xn}), device="cuda", batch_size=b
        )
        half = cuda_session(onnx_fp16)
        xh, out_h = xg.half(), torch.empty(b, 1000, device="cuda", dtype=torch.float16)
        io = half.io_binding()
        io.bind_input("input", "cuda", 0, np.float16, tuple(xh.shape), xh.data_ptr())
        io.bind_output("logits", "cuda", 0, np.float16, tuple(out_h.shape), out_h.data_ptr())
        torch.cuda.synchronize()
        half.run_with_iobinding(io)
        cu.check_outputs(out_h.float(), ref_g, "fp16", label=f"ORT CUDA fp16 b={b}")
        gpu_rows[f"ORT CUDA fp16 b={b}"] = cu.measure(
            lambda s=half, io=io: s.run_with_iobinding(io), device="cuda", batch_size=b
        )
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, m in gpu_rows.items():
        print(name, m)
        cu.record(
            "07",
            f"gpu {name}",
            model="resnet18",
            device="cuda",
            dtype="fp16" if "fp16" in name else "fp32",
            measurement=m,
        )
else:
    cu.results.show_reference("07")

# %% [markdown]
# ## Static INT8 (QDQ) on ResNet-18: calibrate, quantize, compare
# For a CNN, **static** quantization is the ORT path where CPU INT8 can pay: weights and activations are INT8,
# with scales fixed ahead of time from calibration data. Three steps:
# 1. `quant_pre_process` runs shape inference and ORT's graph cleanup so the quantizer sees a clean graph.
# 2. A `CalibrationDataReader` hands the quantizer one feed dict per `get_next()` call, then `None`.
# 3. `quantize_static(..., quant_format=QuantFormat.QDQ)` inserts QuantizeLinear/DequantizeLinear pairs;
#    ORT's optimizer then fuses them into INT8 kernels (`QLinearConv`) at session creation.
#
# The calibration batches are different inputs from the ones we evaluate on. Random weights, random inputs:
# the accuracy figure is agreement with the FP32 model, judged by the cosine of the logits and the largest
# relative error. Not by top-1 agreement: a random-weight ResNet maps almost every input to the same class,
# so "same top-1 class" would hold even for a badly broken INT8 model.


# %% tags=["contract"]
import collections  # noqa: E402 - the cells tagged "contract" are executed alone by tests/gpu_contract

import onnx  # noqa: E402


def qdq_counts(path) -> dict[str, int]:
    """QuantizeLinear and DequantizeLinear nodes in an ONNX file, by exact op type (both kinds, zeros too)."""
    ops = collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)
    return {op: ops.get(op, 0) for op in ("QuantizeLinear", "DequantizeLinear")}


# %%
class ImageReader(CalibrationDataReader):
    """Feeds the quantizer calibration batches, one ``{"input": array}`` per call, then None."""

    def __init__(self, batches: list[torch.Tensor]) -> None:
        self.batches = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        x = next(self.batches, None)
        return None if x is None else {"input": x.numpy()}


gen = torch.Generator().manual_seed(1)
calib = [torch.randn(cu.pick(full=8, smoke=2), 3, size, size, generator=gen) for _ in range(cu.pick(full=4, smoke=2))]
pre_path, int8_path = work / f"resnet18_{size}.pre.onnx", work / f"resnet18_{size}.int8.onnx"
t0 = time.perf_counter()
quant_pre_process(str(onnx_path), str(pre_path))
quantize_static(
    str(pre_path),
    str(int8_path),
    ImageReader(calib),
    quant_format=QuantFormat.QDQ,
    per_channel=True,
    activation_type=QuantType.QUInt8,
    weight_type=QuantType.QInt8,
)
quant_s = time.perf_counter() - t0
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.add_session_config_entry("session.intra_op.allow_spinning", "0")
so.optimized_model_filepath = str(work / f"resnet18_{size}.int8.opt.onnx")
sess_int8 = ort.InferenceSession(str(int8_path), so, providers=["CPUExecutionProvider"])
qdq_ops = qdq_counts(int8_path)
fused_ops = {
    k: v for k, v in onnx_runtime.count_nodes(so.optimized_model_filepath).items() if "QLinear" in k or "Integer" in k
}
print(
    f"calibrated on {sum(len(c) for c in calib)} images and quantized in {quant_s:.1f} s; "
    f"Q/DQ nodes in the file: {qdq_ops}; INT8 kernels after ORT's fusion: {fused_ops}"
)
for b, x in xs.items():
    (q,) = sess_int8.run(["logits"], {"input": x.numpy()})
    cu.check_outputs(torch.from_numpy(q), ref[b], "int8", label=f"ORT static INT8 vs PyTorch FP32, batch {b}")

# %%
int8_rows = []
for b, x in xs.items():
    feed = {"input": x.numpy()}
    q_cmp = cu.compare(  # FP32 and INT8 sessions taking turns in rounds
        {"ORT FP32": lambda f=feed: sessions["all"].run(None, f), "ORT INT8": lambda f=feed: sess_int8.run(None, f)},
        baseline="ORT FP32",
        device="cpu",
        batch_size=b,
    )
    m32, m8, r8 = q_cmp.measurements["ORT FP32"], q_cmp.measurements["ORT INT8"], q_cmp.ratio("ORT INT8")
    cmp = cu.compare_outputs(torch.from_numpy(sess_int8.run(None, feed)[0]), ref[b], "int8")
    int8_rows.append(
        {
            "batch": b,
            "FP32 ms": m32.median_ms,
            "INT8 ms": m8.median_ms,
            "INT8 speed-up": str(r8),
            "cosine": cmp.cosine,
            "max rel": cmp.max_rel,
            "r": r8,
        }
    )
    cu.record(
        "07",
        "ort static int8 (qdq)",
        model="resnet18",
        device="cpu",
        dtype="int8",
        measurement=m8,
        speedup_vs_baseline=r8,
        error_vs_baseline=cmp.max_rel,
        notes=f"vs ORT fp32 level all, {threads} threads; cosine {cmp.cosine:.4f}",
    )
int8_table = pd.DataFrame(int8_rows).set_index("batch")
sizes_mib = {"FP32": onnx_path.stat().st_size / 2**20, "INT8": int8_path.stat().st_size / 2**20}
vnni = bool({"avx512_vnni", "avx_vnni", "amx_int8"} & cu.device.cpu_flags())
print(
    f"File size: FP32 {sizes_mib['FP32']:.1f} MiB, INT8 {sizes_mib['INT8']:.1f} MiB. INT8 dot-product "
    f"instructions (VNNI/AMX) on this CPU: {vnni}."
)
display(int8_table.drop(columns="r"))

# %% [markdown]
# ## ORT dynamic INT8 on the digits MLP
# `quantize_dynamic` stores MatMul/Gemm weights as INT8 and quantizes activations per call (`MatMulInteger`):
# no calibration, suited to Linear-heavy models. The digits MLP has trained weights, so its accuracy is real.
# (The dynamo exporter records weight shapes in `value_info`; the quantizer transposes Gemm weights and then
# disagrees with them, so `onnx_runtime.ort_quantize_dynamic` clears them first.)

# %%
mlp = cu.models.load_digits_model("mlp")
digits = cu.data.load_digits_split()
mlp_onnx = onnx_runtime.export_onnx(mlp, digits.x_test[:2], work / "digits_mlp.onnx")
mlp_int8 = onnx_runtime.ort_quantize_dynamic(mlp_onnx, work / "digits_mlp.int8.onnx")
run_fp32 = onnx_runtime.ort_runner(onnx_runtime.ort_session(mlp_onnx, threads=threads))
run_int8 = onnx_runtime.ort_runner(onnx_runtime.ort_session(mlp_int8, threads=threads))
x_test = digits.x_test
with torch.inference_mode():
    ref_mlp = mlp(x_test)
cu.check_outputs(run_fp32(x_test), ref_mlp, "fp32", label="ORT FP32 MLP vs PyTorch")
cu.check_outputs(run_int8(x_test), ref_mlp, "int8", label="ORT INT8 MLP vs PyTorch")
acc = {
    "ORT FP32": float((run_fp32(x_test).argmax(-1) == digits.y_test).float().mean()),
    "ORT INT8 (dynamic)": float((run_int8(x_test).argmax(-1) == digits.y_test).float().mean()),
}
qb = cu.pick(full=256, smoke=64)
mlp_cmp = cu.compare(
    {"ORT FP32": lambda: run_fp32(x_test[:qb]), "ORT INT8 (dynamic)": lambda: run_int8(x_test[:qb])},
    baseline="ORT FP32",
    device="cpu",
    batch_size=qb,
)
m_q = mlp_cmp.measurements
print(f"digits MLP, batch {qb}: {mlp_cmp.ratio('ORT INT8 (dynamic)').says('ORT INT8 (dynamic)', 'ORT FP32')}")
for k, m in m_q.items():
    cu.record(
        "07",
        f"mlp {k}",
        model="digits-mlp",
        device="cpu",
        dtype="int8" if "INT8" in k else "fp32",
        measurement=m,
        speedup_vs_baseline=mlp_cmp.ratio(k) if k != "ORT FP32" else 1.0,
        error_vs_baseline=acc["ORT FP32"] - acc[k],
        notes=f"accuracy {acc[k]:.4f}",
    )
display(
    pd.DataFrame(
        {
            "accuracy": acc,
            "size_MiB": {
                "ORT FP32": mlp_onnx.stat().st_size / 2**20,
                "ORT INT8 (dynamic)": mlp_int8.stat().st_size / 2**20,
            },
            f"median_ms_b{qb}": {k: m.median_ms for k, m in m_q.items()},
        }
    )
)

# %% [markdown]
# ## Bad input: ORT's own message, and the course's check
# ORT validates inputs too, and its messages are precise, but they speak numpy and ONNX types, not torch,
# and do not say how to fix the call. `onnx_runtime.ort_runner` checks name, dtype, rank and fixed dimensions first
# and names the fix (`x.float()`, `x.unsqueeze(0)`). Both, side by side, from this run:

# %%
run_all = onnx_runtime.ort_runner(sessions["all"])
bad_inputs = {
    "wrong name": {"image": xs[1]},
    "wrong dtype": xs[1].double(),
    "wrong rank (one image, no batch)": xs[1][0],
}
errors = []
for what, bad in bad_inputs.items():
    feed = {k: v.numpy() for k, v in bad.items()} if isinstance(bad, dict) else {"input": bad.numpy()}
    try:
        sessions["all"].run(None, feed)
        ort_msg = "(no error)"
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        ort_msg = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    try:
        run_all(bad)
        course_msg = "(no error)"
    except onnx_runtime.BadInputError as exc:
        course_msg = str(exc)
    errors.append({"mistake": what, "ONNX Runtime says": ort_msg, "the course's check says": course_msg})
with pd.option_context("display.max_colwidth", 200):
    display(pd.DataFrame(errors).set_index("mistake"))

# %% [markdown]
# ## What surprised us

# %%
for b in xs:
    r = speed[(speed.batch == b) & (speed.engine != "PyTorch eager")].set_index("engine")["r"]
    sure = [k for k in r.index if r[k].verdict == "faster"]  # the levels shown faster than eager
    print(
        f"batch {b}, {threads} threads each: "
        + "; ".join(f"{k} {v}" for k, v in r.items())
        + (
            f" vs eager (surest gain: {max(sure, key=lambda k: r[k].low)})."
            if sure
            else " vs eager (no level shown faster)."
        )
    )
for engine, cmp in by_threads.items():
    best_t = fastest_threads(cmp)
    print(
        f"{engine} at batch 1, thread counts taking turns: "
        + "; ".join(f"{k} {r}" for k, r in cmp.ratios.items())
        + f" vs {n_threads(all_t)}: "
        + (
            f"{best_t} is surely faster than all {n_threads(all_t)}."
            if best_t
            else f"no thread count was shown faster than all {n_threads(all_t)}."
        )
    )
print(
    "At equal thread counts, ORT vs eager at batch 1: "
    + "; ".join(f"{t} thread(s) {r}" for t, r in threads_table["r"].items())
    + "."
)
eager_best = fastest_threads(by_threads["eager"])
if eager_best:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"Eager PyTorch was surely faster at {eager_best} than at all {n_threads(all_t)} "
        f"({by_threads['eager'].ratio(eager_best)}): the cores were busy (1-minute load {load:.1f} on {max_threads} "
        "CPUs), and oversubscribed threads wait on each other. Trust the 1-thread ratio here "
        f"({threads_table.loc[1, 'r']}) more than the all-threads headline."
    )
s8 = int8_table["r"]
verdicts = {r.verdict for r in s8}
pays = (
    "pays"
    if verdicts == {"faster"}
    else "does not pay"
    if "faster" not in verdicts
    else "pays only at some batch sizes"
)
isa = "with" if vnni else "without"
print(
    "Static INT8 vs ORT FP32: "
    + "; ".join(f"batch {b} {r}" for b, r in s8.items())
    + f" (cosine >= {int8_table['cosine'].min():.4f}): "
    f"it {pays} here, on a CPU {isa} INT8 dot-product instructions (VNNI/AMX). Without them ORT emulates "
    "the INT8 products with wider AVX2 instructions; 4x smaller weights and activations still cut memory "
    "traffic."
)
print(
    f"Session creation ({max(create_s.values()):.2f} s at most) is paid once; the export ({export_s:.1f} s) once "
    "per model version."
)
noisy = [m.label for m in [*eager.values(), *m_q.values()] if m.spread > cu.timing.HIGH_SPREAD]
if noisy:
    print(f"Careful: high spread in {', '.join(noisy)}: the machine was busy; the intervals above are wide for it.")

# %% [markdown]
# ## Exercises
# Each self-check builds a random CNN as ONNX per call (the seed is printed when a check fails) and looks
# where ORT decides: the options a session is **created** with, the optimized graph ORT writes, the Q/DQ
# nodes and scales of a quantized file, and ORT's profile of the kernels that ran.
#
# **07.session.** Write the session builder yourself: an `InferenceSession` on the CPU provider for
# `onnx_path` at the optimization level named by `level` (`"disable"`, `"basic"`, `"extended"` or `"all"`),
# with `threads` intra-op threads, and with thread spinning turned off (session config entry
# `"session.intra_op.allow_spinning"` set to `"0"`: idle threads then sleep instead of burning a core, the
# polite setting on a shared machine). ORT copies the options when the session is created: the check records
# them at that moment, so options changed afterwards (on your object or on `session.get_session_options()`)
# count for nothing, as they do for ORT.


# %%
def build_session(onnx_path: str, level: str, threads: int):
    raise NotImplementedError  # your code here


cu.exercises.check("07.session", build_session)

# %% [markdown]
# **07.fusion.** `fused_ops(onnx_path, level)`: the op types (a `collections.Counter`) of the graph ORT
# really runs at `level` (`"basic"` or `"extended"`), read from the file it writes when
# `SessionOptions.optimized_model_filepath` is set. The check compares with ORT's own optimized graph of a
# random model: the input file's counts, another level or a remembered answer do not match.


# %%
def fused_ops(onnx_path: str, level: str) -> collections.Counter:
    raise NotImplementedError  # your code here


cu.exercises.check("07.fusion", fused_ops)

# %% [markdown]
# **07.static-int8.** Static INT8 with your own calibration reader, one convolution kept FP32:
# `quantize_file(onnx_in, onnx_out, calib, keep_fp32)` hands the quantizer every array in `calib` (one
# `{"input": array}` per `get_next()`, then `None`) and writes a QDQ model in which the convolution named
# `keep_fp32` **runs** in FP32. Excluding it (`nodes_to_exclude`) is not enough: with a Q/DQ pair still on its
# input, ORT fuses DequantizeLinear -> Conv -> QuantizeLinear into an INT8 `QLinearConv`; exclude the node that
# produces its input too. The check reads the file (Q/DQ pairs, which convolutions carry INT8 weights, every
# activation's scale against the one the given batches give: each batch holds an extreme no other holds) and
# ORT's profile of a run (`QLinearConv` for the others, a float convolution for the kept one), then compares with
# FP32.


# %%
def quantize_file(onnx_in: str, onnx_out: str, calib: list, keep_fp32: str) -> None:
    raise NotImplementedError  # your code here


cu.exercises.check("07.static-int8", quantize_file)

# %% [markdown]
# ## Summary
# You exported with today's exporter and a dynamic batch, checked the file, proved parity, and built sessions
# with `SessionOptions` (level, threads, saved graph), compared at equal threads; you read ORT's profiler,
# bound torch tensors with IOBinding, and calibrated a static INT8 model with your own reader. Next:
# **08 · TensorRT**, which builds a GPU-specific engine from the same ONNX file.
