# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 14 · Capstone: one model, profiled, then optimized step by step
#
# **Goals.**
# 1. **Profile first**: find where this model's time goes on this machine before touching it.
# 2. **Stack techniques yourself**, in your own cells, each on top of the best so far: channels_last,
#    reduced precision (autocast), `torch.compile`, INT8 (`quantize_`); and the runtime path: ONNX Runtime,
#    then static INT8 in ONNX Runtime. Each step is checked against the baseline's outputs and an accuracy
#    budget before it is timed, and kept only if it pays.
# 3. Read the **cumulative table** built from those cells: what each step added, what it cost.
# 4. Cross-check with `optimize()`, the course's automated pipeline, and put the run on the **leaderboard**.
#
# **The bottleneck.** All of them, one after the other: see the taxonomy in **01 · Measuring inference**.
# Which one dominates depends on the model and the machine; the profile below says which.

# %%
import copy
import tempfile
import time
import warnings
from pathlib import Path

import pandas as pd
import torch
from IPython.display import display
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import course_utils as cu
from course_utils.capstone.optimize import TECHNIQUES, decision_guide, optimize
from course_utils.show import leaderboard
from course_utils.techniques import onnx_runtime

device = cu.lesson.start("14", "Capstone")
ort = onnx_runtime.require_onnxruntime()  # `import onnxruntime`, or a course error naming the fix if it cannot load
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static  # noqa: E402
from onnxruntime.quantization.shape_inference import quant_pre_process  # noqa: E402

work = cu.results.results_dir() / "artifacts" / "14"
work.mkdir(parents=True, exist_ok=True)
threads = torch.get_num_threads()

# %% [markdown]
# ## The model and what "accurate" means
# On a CPU the capstone uses the course's trained **digits CNN**, with its real top-1 accuracy on the held-out
# digits, at a batch of 32 requests. On a GPU it uses **ResNet-18** at batch 8 (224×224) on random inputs, with
# random weights unless torchvision's ImageNet weights are already in the local torch cache. A random-weight
# ResNet maps almost every input to the same class, so "top-1 agreement with the baseline" would be 100% for
# nearly any variant, even a broken one: there, "accuracy" is the **cosine similarity of the outputs** with the
# FP32 baseline's, after taking away the baseline's mean output (a random network's outputs share a large part
# that no input changes, and it would hide errors): 1.0 = the same outputs. `accuracy_fn(run)` takes anything
# that behaves like the model.
#
# The tolerance of an FP32 step: on a GPU, cuDNN runs FP32 convolutions in **TF32** by default, and another
# memory format or a compiled kernel picks other algorithms, so two correct FP32 variants differ by more than
# FP32's 1e-4. Those steps are judged at the TF32 row there (`fp32_tolerance`); on a CPU at FP32's.


# %% tags=["contract"]
def fp32_tolerance(device) -> str:
    """The tolerance row for a step that runs in 'fp32': TF32's where CUDA runs FP32 convolutions/matmuls in TF32."""
    if device.type == "cuda" and (torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32):
        return "tf32"
    return "fp32"


def output_fidelity(run, probe, ref_out) -> float:
    """Cosine similarity of run(probe) with the FP32 baseline's outputs ref_out, both minus the baseline's mean
    output over the probe: the part of the output that depends on the input (1.0 = the same outputs)."""
    with torch.inference_mode():
        out = run(probe).double()
    ref = ref_out.double().to(out.device)
    center = ref.mean(0, keepdim=True)  # random weights: a large output shared by all inputs would hide errors
    return float(torch.nn.functional.cosine_similarity((out - center).flatten(), (ref - center).flatten(), dim=0))


# %%
if device.type == "cuda":
    model, weights_note = cu.models.resnet("resnet18", device=device)
    model_name, batch = "resnet18", 8
    example = torch.randn(batch, 3, 224, 224, device=device)
    probe = torch.randn(cu.pick(full=64, smoke=16), 3, 224, 224, device=device)
    calib_pool = torch.randn(64, 3, 224, 224)
    with torch.inference_mode():
        probe_out = model(probe).float()

    def accuracy_fn(run) -> float:
        """Output cosine with the fp32 baseline on fixed inputs (top-1 agreement proves nothing on random weights)."""
        return output_fidelity(run, probe, probe_out)

else:
    model = cu.models.load_digits_model("cnn", device=device)
    weights_note = "trained digits weights shipped in data/ (sha256 checked)"
    model_name, batch = "digits-cnn", 32
    digits = cu.data.load_digits_split()
    example = digits.x_test[:batch].to(device)
    calib_pool = digits.x_train

    def accuracy_fn(run) -> float:
        """Top-1 accuracy on the held-out digits."""
        return cu.models.accuracy(run, digits.x_test, digits.y_test)


n_params = sum(p.numel() for p in model.parameters())
print(f"Model: {model_name}, {n_params / 1e6:.2f} M parameters ({weights_note})")
print(f"Example batch: {tuple(example.shape)} on {device}; {threads} threads")

# %% [markdown]
# ## 1. Profile first
# `torch.profiler.profile` with a `schedule` (skip one step, warm up one, record three) and `record_function`
# around the forward pass. The operator table says where the time goes: in the compute operators
# (convolutions, matrix multiplies), or spread over many small operators and framework overhead.

# %%
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
with (
    torch.inference_mode(),
    profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=3), record_shapes=True) as prof,
):
    for _ in range(5):
        with record_function("forward"):
            model(example)
        cu.device.synchronize(device)
        prof.step()
prof.export_chrome_trace(str(work / "baseline_trace.json"))
sort_key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
print(prof.key_averages().table(sort_by=sort_key, row_limit=10))

# %%
ops = pd.DataFrame(
    [
        {"op": e.key, "self_ms": (e.self_device_time_total if device.type == "cuda" else e.self_cpu_time_total) / 1e3}
        for e in prof.key_averages()
        if e.key != "forward"
    ]
).sort_values("self_ms", ascending=False)
compute = ops["op"].str.contains("conv|mm|linear|matmul|gemm", case=False)
compute_share = ops.loc[compute, "self_ms"].sum() / ops["self_ms"].sum()
print(
    f"Compute operators (convolution, matrix multiply) take {compute_share:.0%} of the self time; the other "
    f"{(~compute).sum()} operator kinds take the rest."
)

# %% [markdown]
# Where the time goes does not say what bounds it: a convolution on a tiny image can spend its time in
# per-call overhead. Lesson 01's rule asks how many FLOP/s the model achieves against what this device's
# arithmetic reaches: under 10% of it is overhead-bound (or memory-bound), whatever operators the time sits in.
# The model's FLOP come from `torch.utils.flop_counter`; the device's reach from a large matmul timed here.

# %%
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

with torch.inference_mode(), FlopCounterMode(display=False) as flop_counter:
    model(example)
model_flop = flop_counter.get_total_flops()
with torch.inference_mode():
    m_model = cu.measure(lambda: model(example), device=device, batch_size=batch, label="baseline forward")
    n_mm = 2048 if device.type == "cuda" else cu.pick(full=512, smoke=256)
    a_mm = torch.randn(n_mm, n_mm, device=device)
    m_mm = cu.measure(lambda: a_mm @ a_mm, device=device, label=f"matmul {n_mm}")
model_flops = model_flop / (m_model.median_ms / 1e3)
matmul_flops = 2 * n_mm**3 / (m_mm.median_ms / 1e3)
roof_name = f"matmul {n_mm} ({matmul_flops / 1e9:.0f} GFLOP/s)"
bound = cu.intervals.roof_says(f"the model ({model_flops / 1e9:.2f} GFLOP/s)", model_flops / matmul_flops, roof_name)
print(
    f"{bound}: "
    + {
        "far under the roof": "overhead- or memory-bound by lesson 01's rule, however much time the convolutions "
        "take: fusing operators and cutting calls (torch.compile, ONNX Runtime, a larger batch) should pay first.",
        "under the roof": "not far from the arithmetic's reach, not at it: both fusion and cheaper arithmetic may pay.",
        "near the roof": "compute-bound: lower precision and INT8 in the convolutions and matmuls should pay.",
        "above the roof": "the matmul was timed on a busy moment; measure again before choosing.",
    }.get(bound.verdict, "not judged.")
)

# %% [markdown]
# ## 2. The bench: check, measure, keep or drop
# Every step below goes through `try_step`: outputs compared with the baseline's within the tolerance of the
# step's precision, accuracy within the budget, then timed with `cu.measure`. A step is **kept** when it is
# correct and faster than the best so far; the next step builds on the best kept one.

# %%
budget = 0.01
with torch.inference_mode():
    ref = model(example).float()
base_acc = accuracy_fn(model)
stack: list[dict] = []
runs: dict = {}  # each step's run, so that the best kept one can be timed again beside the next step


def try_step(name: str, run, precision: str, builds_on: str) -> dict:
    """Check ``run`` against the baseline; time it in rounds with the baseline and the best step kept so far
    (lesson 01's ``cu.compare``); keep it only when its interval shows it faster than that best step."""
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = run(example)
        cu.device.synchronize(device)
        first_s = time.perf_counter() - t0
        cmp = cu.compare_outputs(out.float(), ref, precision)
        acc = accuracy_fn(run)
    best = max((r for r in stack if r["kept"]), key=lambda r: r["speedup"], default=None)
    ok = cmp.within and base_acc - acc <= budget
    m = m_base = ratio = vs_best = None
    if cmp.within and not stack:  # the baseline itself: timed alone, 1.0 by definition
        with torch.inference_mode():
            m = m_base = cu.measure(lambda: run(example), device=device, batch_size=batch, label=name)
    elif cmp.within:

        def call(f):
            def fn():
                with torch.inference_mode():
                    f(example)

            return fn

        variants = {"baseline": call(model), name: call(run)}
        if best is not None and best["step"] != stack[0]["step"]:
            variants[best["step"]] = call(runs[best["step"]])
        rounds = cu.compare(variants, baseline="baseline", device=device, batch_size=batch)
        m, m_base, ratio = rounds.measurements[name], rounds.measurements["baseline"], rounds.ratio(name)
        vs_best = (
            rounds.ratio(name, vs=best["step"]) if best["step"] in variants and best["step"] != "baseline" else ratio
        )
    speedup = 1.0 if m is not None and ratio is None else (ratio.estimate if ratio else None)
    kept = ok and m is not None and (best is None or vs_best.verdict == "faster")
    runs[name] = run
    row = {
        "step": name,
        "builds on": builds_on,
        "precision": precision,
        "check": "OK" if cmp.within else cmp.reason,
        "accuracy": acc,
        "baseline_ms": m_base.median_ms if m else None,
        "median_ms": m.median_ms if m else None,
        "speedup": speedup,
        "low": ratio.low if ratio else None,
        "high": ratio.high if ratio else None,
        "ratio": ratio,
        "first_call_s": first_s,
        "kept": kept,
    }
    stack.append(row)
    if m:
        cu.record(
            "14",
            f"stack: {name}",
            model=model_name,
            device=device.type,
            dtype=precision,
            measurement=m,
            speedup_vs_baseline=ratio if ratio else speedup,
            error_vs_baseline=cmp.max_rel,
            notes=f"accuracy {acc:.4f}",
        )
    verdict = "rejected" if not ok else "kept" if kept else "correct, but not shown faster than the best so far"
    timing = "not timed"
    if ratio is not None:
        timing = f"{m.median_ms:.3f} ms vs baseline {m_base.median_ms:.3f} ms: {ratio}, {verdict}"
        if vs_best is not ratio:
            timing += f" (vs {best['step']}: {vs_best})"
    elif m is not None:
        timing = f"{m.median_ms:.3f} ms, the baseline"
    print(f"{name}: {cmp}; accuracy {acc:.4f}; {timing}")
    return row


def best_kept() -> str:
    return max((r for r in stack if r["kept"]), key=lambda r: r["speedup"])["step"]


def eager_run(x):
    return model(x)


try_step("baseline (eager fp32)", eager_run, "fp32", "-")

# %% [markdown]
# ## 3. channels_last
# `memory_format=torch.channels_last` stores activations as NHWC, the layout oneDNN (CPU) and cuDNN tensor
# cores prefer; the model's weights and the input both move to it.

# %%
model_cl = copy.deepcopy(model).to(memory_format=torch.channels_last)


def channels_last_run(x):
    return model_cl(x.contiguous(memory_format=torch.channels_last))


try_step("channels_last", channels_last_run, fp32_tolerance(device), "baseline")

# %% [markdown]
# ## 4. + reduced precision (autocast)
# `torch.autocast` runs convolutions and matrix multiplies in BF16 on a CPU (FP16 on a GPU) and keeps the
# rest in FP32. On a CPU without BF16 instructions (`avx512_bf16`/`amx_bf16`) it is emulated and usually
# slower: the measurement decides.

# %%
amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
amp_name = "fp16" if amp_dtype == torch.float16 else "bf16"
base_run = channels_last_run if stack[-1]["kept"] else eager_run
base_name = stack[-1]["step"] if stack[-1]["kept"] else "baseline"


def autocast_run(x):
    with torch.autocast(device.type, dtype=amp_dtype):
        return base_run(x).float()


bf16_native = bool({"avx512_bf16", "amx_bf16"} & cu.device.cpu_flags()) or device.type == "cuda"
print(f"native {amp_name} arithmetic here: {bf16_native}")
try_step(f"+ autocast {amp_name}", autocast_run, amp_name, base_name)

# %% [markdown]
# ## 5. + torch.compile
# `torch.compile` fuses the best kept variant's operators into generated kernels. The first call compiles
# (`first_call_s` in the table); later calls run the compiled code.

# %%
runs = {"baseline (eager fp32)": eager_run, "channels_last": channels_last_run, f"+ autocast {amp_name}": autocast_run}
best_name = best_kept()
compiled = torch.compile(runs[best_name])
try_step("+ torch.compile", compiled, amp_name if "autocast" in best_name else fp32_tolerance(device), best_name)

# %% [markdown]
# ## 6. + INT8 on the Linear layers (torchao `quantize_`)
# `quantize_(model, Int8DynamicActivationInt8WeightConfig())` stores Linear weights as INT8 and quantizes
# activations per call; it pays under `torch.compile`, which fuses the quantize steps into the matmul.
# Convolutions stay FP32 (for them: static INT8, step 8).

# %%
if cu.modes.available(("torchao",), "step 6 (torchao INT8)"):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    # on top of the best FP32 layout so far (autocast does not stack with INT8 weights); try_step also times it
    # against the best step kept so far, whichever it is
    cl_kept = any(r["step"] == "channels_last" and r["kept"] for r in stack)
    model_q = copy.deepcopy(model_cl if cl_kept else model)
    quantize_(model_q, Int8DynamicActivationInt8WeightConfig())
    n_q = sum(type(m.weight).__name__ != "Parameter" for m in model_q.modules() if isinstance(m, torch.nn.Linear))
    print(f"Linear layers with INT8 weights: {n_q}; best so far: {best_kept()}")
    layout = torch.channels_last if cl_kept else torch.contiguous_format
    compiled_q = torch.compile(lambda x: model_q(x.contiguous(memory_format=layout)))
    q_base = ("channels_last" if cl_kept else "baseline") + " + compile"
    try_step("+ int8 linear (torchao) + compile", compiled_q, "int8", q_base)

# %% [markdown]
# ## 7. The runtime path: ONNX Runtime
# Export with the dynamo exporter and a dynamic batch, then an ORT session at the highest optimization level
# with the same thread count as PyTorch (lesson 07). On a GPU, the CUDA provider with IOBinding.

# %%
onnx_path = work / f"{model_name}.onnx"
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    torch.onnx.export(
        copy.deepcopy(model).cpu(),
        (example[:2].cpu(),),
        onnx_path,
        dynamo=True,
        dynamic_shapes={"x": {0: "batch"}},
        input_names=["input"],
        output_names=["logits"],
        external_data=False,
        verbose=False,
    )
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
so.intra_op_num_threads = threads
so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads would hold eager's cores (07)
if device.type == "cuda":
    session = onnx_runtime.ort_session(onnx_path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    ort_run = onnx_runtime.ort_iobinding_runner(session, lambda s: (s[0], ref.shape[1]))
else:
    session = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])

    def ort_run(x):
        return torch.from_numpy(session.run(["logits"], {"input": x.cpu().numpy()})[0])


try_step("onnxruntime", ort_run, "tf32" if device.type == "cuda" else "fp32", "baseline (export)")  # CUDA EP: use_tf32

# %% [markdown]
# ## 8. + static INT8 in ONNX Runtime (QDQ)
# Calibrate on training images with a `CalibrationDataReader`, `quantize_static` to QDQ, and let ORT fuse the
# pairs into INT8 kernels (lesson 07). On a GPU, INT8 is TensorRT's path (lesson 08): skipped here.

# %%
if device.type == "cpu":

    class Calib(CalibrationDataReader):
        def __init__(self, x: torch.Tensor, n: int, bs: int) -> None:
            self.batches = iter(x[: n * bs].split(bs))

        def get_next(self):
            x = next(self.batches, None)
            return None if x is None else {"input": x.numpy()}

    pre_path, int8_path = work / f"{model_name}.pre.onnx", work / f"{model_name}.int8.onnx"
    quant_pre_process(str(onnx_path), str(pre_path))  # shape inference and clean-up first
    quantize_static(
        str(pre_path),
        str(int8_path),
        Calib(calib_pool, cu.pick(full=16, smoke=4), 32),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    session8 = ort.InferenceSession(str(int8_path), so, providers=["CPUExecutionProvider"])

    def ort_int8_run(x):
        return torch.from_numpy(session8.run(["logits"], {"input": x.cpu().numpy()})[0])

    try_step("onnxruntime + static int8", ort_int8_run, "int8", "onnxruntime")
else:
    print("Skipped on the GPU: ONNX Runtime's CUDA provider runs few QDQ operators; TensorRT is the GPU INT8 path.")

# %% [markdown]
# ## The cumulative table
# Built from the cells above: each step, what it built on, its check, accuracy, speed-up over the baseline,
# its first-call cost, and whether it was kept. `best so far` is the cumulative speed-up going down.

# %%
table = pd.DataFrame(stack)
table["best so far"] = table["speedup"].where(table["kept"]).cummax().ffill().fillna(1.0)
display(table.drop(columns="ratio").round(4))
fig = cu.plots.speedup_bars(
    {r["step"]: r["ratio"] for r in stack[1:] if r["ratio"] is not None},
    title=f"{model_name} on {device.type}: each step vs the eager baseline",
)
_ = cu.plots.save(fig, "14", "stack")
best = table.loc[table["speedup"].where(table["kept"]).idxmax()]
dropped = table[~table["kept"] & table["ratio"].notna()]
print(
    f"Best stack here: {best['step']}"
    + (f", {best['ratio']} vs the baseline" if best["ratio"] is not None else " (the baseline itself)")
    + f", accuracy {best['accuracy']:.4f} (baseline {base_acc:.4f})."
)
for _, r in dropped.iterrows():
    print(f"Not kept: {r['step']} ({r['ratio']} vs the baseline; {r['check']}, accuracy {r['accuracy']:.4f}).")

# %% [markdown]
# ## 9. The cross-check: `optimize()`
# The course's pipeline runs the same families of techniques automatically (`course_utils.capstone.optimize`), with
# the same checks. It is the second opinion, not the lesson: if it finds something faster than your best
# stack, look at what it did differently. In smoke mode (the tests) `torch.compile` is left out, and a
# technique that fails stops the run instead of becoming a "failed" row.

# %%
techniques = cu.pick(full=list(TECHNIQUES[1:]), smoke=[t for t in TECHNIQUES[1:] if t != "compile"])
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=cu.timing.HighSpreadWarning)
    report = optimize(
        model,
        example,
        accuracy_fn,
        device=device,
        accuracy_budget=budget,
        techniques=techniques,
        batch_size=4 * batch,
        model_name=model_name,
        verbose=False,
    )
df = report.df
display(df[["technique", "applied", "check", "accuracy", "speedup", "cumulative_speedup", "reason"]])
print(decision_guide(report))
auto_best = report.paying(1.0)
if not auto_best.empty:
    a = auto_best.iloc[0]
    a_ratio = next(s.ratio for s in report.steps if s.technique == a["technique"] and s.ratio is not None)
    print(
        f"optimize()'s best: {a['technique']} at {a_ratio}; your stack's best: {best['step']} at "
        + (f"{best['ratio']}." if best["ratio"] is not None else "the baseline.")
    )
n_rows = report.record("14", model=model_name)
print(f"Wrote {n_rows} rows for lesson 14 to {cu.results.results_dir()}")

# ## The leaderboard
# `leaderboard.load()` reads this machine's results folder and the reference runs shipped in
# `data/reference/` (each labelled with its GPU, versions and date). In a workshop, collect every
# attendee's `results/*.csv` into one folder and pass it as `extra=[folder]`: a malformed file is skipped
# with a warning naming it, and nothing else is lost.

# %%
board = leaderboard.load()
leaderboard.machines(board)

# %%
table = leaderboard.leaderboard(board, lesson="14", value="speedup_vs_baseline")
table

# %%
fig = leaderboard.plot(
    table, title="Lesson 14: speed-up per technique and machine", xlabel="speed-up vs baseline (x, higher is better)"
)
_ = cu.plots.save(fig, "14", "leaderboard")
for r in leaderboard.best_technique(board, "14", extra=["speedup_low", "speedup_high"]).itertuples():
    # each machine's highest estimate, phrased from its interval: a best that is within noise of 1x is no best
    if pd.notna(r.speedup_low) and pd.notna(r.speedup_high) and r.speedup_low > 0:
        est = min(max(r.speedup_vs_baseline, r.speedup_low), r.speedup_high)
        rr = cu.intervals.ratio_from_bounds(r.technique, "baseline", est, r.speedup_low, r.speedup_high)
        line = rr.says(r.technique, "its baseline")
        if rr.verdict != "faster":
            line += ": no technique is shown faster than the baseline on that machine"
    else:
        line = f"{r.technique}: the highest estimate, recorded without an interval, so it judges nothing"
    print(f"{r.label}: {line}.")
if device.type != "cuda":
    cu.results.show_reference("14")

# %% [markdown]
# ### Pooling a workshop's files
# A dry run of what an instructor does: copy this machine's file into a folder with a broken file beside it
# (as happens when an attendee sends the wrong thing) and pool the folder. The broken file is named in a
# warning; every row of the good file is kept.

# %%
with tempfile.TemporaryDirectory() as tmp:
    pooled_dir = Path(tmp)
    own = sorted(cu.results.results_dir().glob("*.csv"))
    for f in own:
        (pooled_dir / f"attendee-{f.name}").write_bytes(f.read_bytes())
    (pooled_dir / "attendee-broken.csv").write_text("this is not,a results file\n1,2\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pooled = leaderboard.pool([pooled_dir])
for w in caught:
    print(f"warning: {w.message}")
own_rows = sum(len(pd.read_csv(f)) for f in own)
print(f"Pooled {len(pooled)} rows from {pooled['source'].nunique()} good file(s); this machine has {own_rows}.")

# %% [markdown]
# ## What surprised us
# Printed from this run: how many of the techniques paid on this model and machine, which one cost the most
# before its first result (the first call: export, compilation, calibration), and whether the automatic
# pipeline agreed with your stack.

# %%
tried = [r for r in stack[1:] if r["ratio"] is not None]
kept_steps = [r["step"] for r in tried if r["kept"]]
print(
    f"1. Of {len(tried)} timed steps, {len(kept_steps)} paid and were kept"
    + (f" ({', '.join(kept_steps)})" if kept_steps else "")
    + ": a technique that helps on one model and machine is no law."
)
costly = max(stack[1:], key=lambda r: r["first_call_s"] or 0.0)
print(
    f"2. The costliest first call: {costly['step']}, {costly['first_call_s']:.2f} s before its first output, "
    f"against {stack[0]['first_call_s']:.2f} s for the eager baseline (warm from the reference run): a server "
    "pays it at every start."
)
if not auto_best.empty:
    pick, mine = a["technique"].lower(), best["step"].lower().removeprefix("+ ")
    print(
        f"3. optimize() picked {a['technique']}, your stack {best['step']}: "
        + (
            "they agree."
            if pick == mine
            else f"your stack's best uses {a['technique']} too, with more on top."
            if pick in mine
            else "they differ (other steps, other rounds: compare their intervals above)."
        )
    )

# %% [markdown]
# ## Exercises
# **14.stack.** Profile first, then stack three techniques yourself. Write `stacked(model, example)` returning
# `(prof, run)`: `prof` is the `torch.profiler.profile` you ran around `model(example)` **before** changing
# anything; `run(x)` runs a copy of `model` with three techniques stacked: every BatchNorm **folded** into the
# convolution before it (`torch.nn.utils.fusion.fuse_conv_bn_eval`, the BatchNorm replaced by `nn.Identity()`:
# one kernel fewer per block, the fusion ONNX Runtime and Inductor do for you), weights and input in
# **channels_last**, and **BF16 autocast** (CPU), in inference mode, returning **float32** outputs. The check
# draws the digits at random, compares with FP32 within the BF16 tolerance, and looks inside the model at the
# operators that run: each convolution in bfloat16, inside the model's own `Conv2d` layers (not `F.conv2d`
# beside a decoy), on channels_last weights and inputs, and no BatchNorm. Do not change the model you are
# given: fusion and `.to(...)` act in place, so work on `copy.deepcopy(model)`.


# %%
def stacked(model: torch.nn.Module, example: torch.Tensor):
    raise NotImplementedError  # your code here


cu.exercises.check("14.stack", stacked)

# %% [markdown]
# **14.pick.** From measured rows (`technique`, `speedup`, `accuracy_drop`), return the technique with the
# highest speed-up above 1 whose accuracy drop is within the budget, or `"baseline"` when none qualifies. The
# check draws random rows and budgets.


# %%
def pick_technique(rows: list[dict], budget: float) -> str:
    raise NotImplementedError  # your code here


cu.exercises.check("14.pick", pick_technique)

# %% [markdown]
# ## Summary
# You profiled one model, stacked the techniques yourself in your own cells, each verified against the
# baseline before it was timed and kept only when it paid; `optimize()` gave the second opinion, and the
# leaderboard shows how the answer changes with the machine. For a workshop: `make course` runs every
# notebook headless and renders the same leaderboard into `build/course/index.html`.
# Next: **15 · LLM decoding**, where the model is a language model and the bottleneck is one token at a time.
