# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 02 · Profiling: find the hotspot from data, fix it, measure again
#
# **Goals.**
# * Profile a deliberately slow inference pipeline with `torch.profiler.profile` and a **schedule**
#   (wait / warm-up / active steps): CPU activity always, CUDA activity on a GPU.
# * Name the stages with `record_function` ranges (NVTX ranges on a GPU, for Nsight Systems).
# * Read the operator table (`key_averages().table`), export a Chrome trace (`export_chrome_trace`) and
#   open it in Perfetto; make `with_stack` point at the Python function behind an operator.
# * Read the table, **write the fix yourself**, check it, re-measure, and repeat until the model itself is the
#   largest stage.
# * Know the Nsight Systems command line for a GPU machine.
#
# **The bottleneck this attacks.** *01 · Measuring inference* sorted slow inference into compute-, memory-,
# overhead- and transfer-bound work. Real pipelines add time spent *around* the model: Python loops in pre- and
# post-processing, thousands of tiny operators (each one overhead-bound), and host-device synchronizations
# (`.item()`, `.cpu()`) that stall the GPU queue. A timer tells you the pipeline is slow; a profiler tells you
# *where*.

# %%
import numpy as np
import pandas as pd
import torch
from IPython.display import display
from torch.profiler import ProfilerActivity, profile, record_function, schedule

import course_utils as cu

device = cu.lesson.start("02", "Profiling")
# Each fix is checked against the slow pipeline's FP32 outputs at the FP32 tolerance. On a GPU, cuDNN convolutions
# run TF32 by default (a batched and a per-image call may then differ by more): switch it off, and for matmuls.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False

# %% [markdown]
# ## A deliberately slow pipeline
# Requests arrive as decoded 8×8 grey images (`uint8`, values 0–16, from scikit-learn's digits). The pipeline
# turns them into a batch, runs the trained digits CNN, and returns `(label, confidence)` per image. It contains
# four classic mistakes, on purpose:
# 1. **pre-processing in Python loops**: one small tensor per image, filled row by row;
# 2. **many tiny operators**: every row and every image is its own operator call;
# 3. **the model called once per image** instead of once per batch (lesson 03 measures what batching buys);
# 4. **a sync inside the loop**: post-processing calls `.item()` and `.cpu()` once per image. On a GPU each of
#    these waits for the device to finish and copies a single number back.
#
# We will not guess which one matters most: the profiler will tell us. Each stage sits in a
# `record_function(name)` range, so the profiler reports time per stage.

# %%
digits = cu.data.load_digits_split()
n_images = cu.pick(full=128, smoke=48)
raw = (digits.x_test[:n_images, 0] * 16).round().to(torch.uint8).numpy()
images = [raw[i] for i in range(n_images)]  # a list of decoded images, as a server would receive them
cnn = cu.models.load_digits_model("cnn", device=device)
print(f"{len(images)} images of shape {images[0].shape} ({images[0].dtype}); model on {device}")


def preprocess_slow(images):
    batch = torch.empty(len(images), 1, 8, 8)
    for i, img in enumerate(images):  # mistake 1: a Python loop per image...
        for r in range(img.shape[0]):  # ...and per row: mistake 2, one tiny op each
            batch[i, 0, r] = torch.from_numpy(img[r]).float() / 16.0
    return batch


def infer_per_image(x):
    return torch.cat([cnn(x[i : i + 1]) for i in range(len(x))])  # mistake 3: one model call per image


def postprocess_slow(logits):
    out = []
    for row in logits:
        probs = torch.softmax(row, dim=0)
        label = int(probs.argmax().item())  # mistake 4: a host-device sync per image
        conf = float(probs[label].cpu())  # ...and a one-number copy per image
        out.append((label, conf))
    return out


def run_pipeline(images, preprocess, model, postprocess):
    with record_function("preprocess"):
        x = preprocess(images)
    with record_function("model"), torch.inference_mode():
        logits = model(x.to(device))
    with record_function("postprocess"):
        return postprocess(logits)


stages = ["preprocess", "model", "postprocess"]
slow = {"preprocess": preprocess_slow, "model": infer_per_image, "postprocess": postprocess_slow}
baseline_out = run_pipeline(images, **slow)
acc = np.mean([label == int(y) for (label, _), y in zip(baseline_out, digits.y_test[:n_images], strict=True)])
print(f"First results: {baseline_out[:3]} ... accuracy on these images: {acc:.1%}")

# %% [markdown]
# ## Baseline, measured
# `cu.measure` (lesson 01's timer) times the whole pipeline: warm-up, synchronization, median and spread.

# %%
reps = dict(min_repeats=cu.pick(full=10, smoke=3))  # the slow pipeline is slow: fewer repeats suffice
m_slow = cu.measure(
    lambda: run_pipeline(images, **slow), device=device, batch_size=n_images, label="slow pipeline", **reps
)
print(m_slow)

# %% [markdown]
# ## Profile it
# `torch.profiler.profile` records every operator call between `__enter__` and `__exit__`. Three arguments do
# most of the work:
# * `activities`: `ProfilerActivity.CPU` always; add `ProfilerActivity.CUDA` on a GPU for kernel times;
# * `schedule(wait=1, warmup=1, active=2)`: the loop calls `prof.step()` after each pipeline call; the first
#   step is skipped, the second is recorded but thrown away (one-off costs: allocator growth, kernel
#   selection), the next two are kept;
# * `on_trace_ready`: called when the active steps are done; here it writes a Chrome trace with
#   `export_chrome_trace` (open it in [Perfetto](https://ui.perfetto.dev) or `chrome://tracing`).
#
# `record_shapes=True` keeps each operator's input shapes. On a GPU the loop synchronizes after each call, so
# a step's kernels are finished inside the step. *What not to do:* older tutorials pass
# `on_trace_ready=tensorboard_trace_handler(...)` and open the result in TensorBoard; the TensorBoard profiler
# plugin is deprecated.


# %% tags=["contract"]
def profile_pipeline(fn, device, trace_path, active=2, **options):
    """Profile fn() for `active` steps (after 1 skipped and 1 warm-up step); write a Chrome trace."""
    dev = torch.device(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(
        activities=acts,
        schedule=schedule(wait=1, warmup=1, active=active),
        record_shapes=True,
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path)),
        **options,
    ) as prof:
        for _ in range(1 + 1 + active):
            fn()
            torch.get_device_module(dev).synchronize()
            prof.step()
    return prof


SYNC_CALLS = {
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "cudaMemcpyAsync",
}  # CUDA runtime calls in which the host may wait for the device


def stage_table(prof, stages, steps=2):
    """ms per call of each record_function range in `stages`, largest first, with its share of the total.

    cpu_ms: the range's CPU time. device_ms: device time of the kernels (and copies) launched under it.
    On a GPU a range's CPU time also holds its waits for kernels queued *before* it (post-processing's `.item()`
    waits for the model's kernels), so a stage is charged the larger of its host work (CPU time minus time in
    synchronizing CUDA calls) and its own device time. On a CPU that is the CPU time.
    """

    def below(e):
        for c in e.cpu_children:
            yield c
            yield from below(c)

    rows = {s: {"cpu_ms": 0.0, "wait_ms": 0.0, "device_ms": 0.0} for s in stages}
    for e in prof.events():
        if e.name in rows and e.device_type == torch.autograd.DeviceType.CPU:
            r = rows[e.name]
            r["cpu_ms"] += e.cpu_time_total / 1000 / steps
            r["device_ms"] += e.device_time_total / 1000 / steps
            r["wait_ms"] += sum(c.cpu_time_total for c in below(e) if c.name in SYNC_CALLS) / 1000 / steps
    table = pd.DataFrame(rows).T
    table["ms"] = pd.concat([table["cpu_ms"] - table["wait_ms"], table["device_ms"]], axis=1).max(axis=1)
    table = table.sort_values("ms", ascending=False)
    table["share"] = table["ms"] / table["ms"].sum()
    return table[["ms", "share", "cpu_ms", "device_ms"]]


# %%
traces = cu.profiling.traces_dir()  # <results folder>/traces: outside the repository
prof_slow = profile_pipeline(lambda: run_pipeline(images, **slow), device, traces / "02_slow.json")
print(f"Chrome trace: {traces / '02_slow.json'} ({(traces / '02_slow.json').stat().st_size:,} bytes)")
sort_key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
print(prof_slow.key_averages().table(sort_by=sort_key, row_limit=12, max_name_column_width=30))

# %% [markdown]
# How to read it: **Self CPU** is the time spent in the operator itself, not in operators it called (`aten::to`
# calls `aten::_to_copy`, which calls `aten::copy_`); **CPU total** includes them; **# of Calls** counts calls
# over the two active steps. The table also lists the `record_function` ranges (`preprocess`, `model`, ...):
# a range's *self* time is Python time spent inside it outside any operator. Many calls of a few microseconds
# each is the signature of "many tiny ops". Sorted by number of calls:

# %%
print(prof_slow.key_averages().table(sort_by="count", row_limit=8, max_name_column_width=30))

# %% [markdown]
# `record_shapes=True` lets the profiler group operators by input shape: the tiny shapes (one row of 8
# pixels, one row of 10 logits) show where the calls come from.

# %%
print(prof_slow.key_averages(group_by_input_shape=True).table(sort_by="count", row_limit=6, max_name_column_width=30))

# %% [markdown]
# ### Which line of my code? `with_stack`
# `with_stack=True` records the Python call stack of every operator. In torch 2.14 the stack is only filled
# in with the profiler's verbose experimental config; the frames then read `file(line): function`, the
# function that made the call and the line it was called from. The most-called operator, traced back:

# %%
verbose = torch._C._profiler._ExperimentalConfig(verbose=True)
with profile(activities=[ProfilerActivity.CPU], with_stack=True, experimental_config=verbose) as prof_stack:
    run_pipeline(images, **slow)
counts = pd.Series({e.key: e.count for e in prof_stack.key_averages() if e.key.startswith("aten::")})
busiest = counts.idxmax()
frame = next((e.stack for e in prof_stack.events() if e.name == busiest and e.stack), [])
print(f"{busiest}: {counts[busiest]} calls per pipeline call; first call made from:")
for line in frame[:3] or ["(no Python stack recorded by this torch build)"]:
    print("   ", line)

# %% [markdown]
# ## The hotspot, read from the data
# The ranges answer "which stage": their time per pipeline call, and each one's share. On a CPU that is the
# range's CPU time. On a GPU the CPU time of a range misleads: kernels run asynchronously, so the first
# synchronizing call (post-processing's `.item()`) waits for the model's kernels, and its range would be charged
# with them. There each stage is charged the device time of the kernels launched under its range, or its own
# host work (CPU time minus the waits in synchronizing CUDA calls) if that is larger.

# %%
times_slow = stage_table(prof_slow, stages)
hot = times_slow.index[0]
print(f"Largest stage: '{hot}', {times_slow.loc[hot, 'share']:.0%} of the profiled time.")
times_slow.round(4)

# %% [markdown]
# **The decision rule** you follow from here: fix the largest stage that still has a fix, check the outputs
# did not change, measure, profile again, and read the new table; stop when no fix is left or the next one
# would save little (under 5% of the time). If the model is then the largest stage, the model is what to
# optimize next (lessons 04-08).
#
# ## Exercises: write the fixes, before you see any
# You have the tables above. Write the fixes for the two stages around the model; the self-checks run your
# code for parity with the slow version on random inputs and **count the operator calls** that run (they must
# not grow with the number of images). Moving the per-image loop into numpy or into worker threads hides it
# from a profiler but does not remove it: the checks look for that too.
#
# **02.vectorize.** Write `preprocess_vectorized(images)`: the same `(N, 1, 8, 8)` float tensor in [0, 1] as
# `preprocess_slow`, with a fixed number of operator calls however many images there are.


# %%
def preprocess_vectorized(images):
    raise NotImplementedError  # your code here


cu.exercises.check("02.vectorize", preprocess_vectorized)

# %% [markdown]
# **02.one-sync.** Write `postprocess_batched(logits)`: the same `[(label, confidence), ...]` as
# `postprocess_slow`, with one copy back to the host for the whole batch instead of an `.item()` per row.


# %%
def postprocess_batched(logits):
    raise NotImplementedError  # your code here


cu.exercises.check("02.one-sync", postprocess_batched)

# %% [markdown]
# **02.top-op.** Use the profiler itself: write `top_self_cpu_op(fn)` that profiles one call of `fn()` and
# returns the name of the **operator** (an `aten::...` name, not a `record_function` range) with the most
# self CPU time. The self-check runs it on workloads drawn at random (their names tell nothing) and checks that
# each one really ran under your profiler.


# %%
def top_self_cpu_op(fn):
    raise NotImplementedError  # your code here


cu.exercises.check("02.top-op", top_self_cpu_op)

# %% [markdown]
# ## Fix, check, measure, profile again
# The pipeline below uses **your** functions where their checks pass, and the course's reference solutions
# otherwise (`cu.exercises.show_solution("02.vectorize")` prints one). The third fix, calling the model once
# for the whole batch, is one line: `cnn(x)`.


# %%
def solved(key, answer):
    """Your answer if its self-check passes, else the course's reference solution."""
    try:
        cu.exercises.get(key).checker(answer)
        return answer
    except Exception:  # not solved yet, or not right yet
        return cu.exercises.get(key).solution


def infer_batched(x):
    return cnn(x)  # one call for the whole batch


fixes = {
    "preprocess": solved("02.vectorize", preprocess_vectorized),
    "model": infer_batched,
    "postprocess": solved("02.one-sync", postprocess_batched),
}
print({stage: f"{fn.__module__}.{fn.__name__}" for stage, fn in fixes.items()})

# %% [markdown]
# Now the decision rule, one step per pass: the largest stage not yet fixed gets its fix; the labels must be
# identical and the confidences equal at the FP32 tolerance **before** any speed figure; then measure and
# profile again.

# %%
current, table = dict(slow), times_slow
steps = [("slow pipeline", dict(slow), table)]  # (name, the pipeline's stages, its profile)
while any(current[s] is slow[s] for s in stages):
    hot = next(s for s in table.index if current[s] is slow[s])  # the largest stage not fixed yet
    if table.loc[hot, "share"] < 0.05:
        print(f"'{hot}' is only {table.loc[hot, 'share']:.0%} of the time: not worth a fix. Stop.")
        break
    current[hot] = fixes[hot]
    out = run_pipeline(images, **current)
    assert [lab for lab, _ in out] == [lab for lab, _ in baseline_out], f"labels changed after fixing {hot}"
    cu.check_outputs(
        torch.tensor([c for _, c in out]),
        torch.tensor([c for _, c in baseline_out]),
        "fp32",
        label=f"confidences after fixing {hot}",
    )
    prof_now = profile_pipeline(lambda: run_pipeline(images, **current), device, traces / "02_fixed.json")
    table = stage_table(prof_now, stages)
    steps.append((f"+ fixed {hot}", dict(current), table))
    print(f"fixed {hot}: largest stage now '{table.index[0]}' ({table['share'].iloc[0]:.0%} of the profiled time)")

# %% [markdown]
# ## Results: table and plot
# The profile decided what to fix; the speed of each step comes from one comparison, the pipelines taking turns
# in rounds (lesson 01), so a change of load on the machine hits every step alike.

# %%
pipes = cu.compare(
    {name: (lambda cfg=cfg: run_pipeline(images, **cfg)) for name, cfg, _ in steps},
    baseline="slow pipeline",
    device=device,
    batch_size=n_images,
    rounds=cu.pick(full=10, smoke=6),
    min_calls=1,
)
summary = pipes.table().rename(columns={"variant": "pipeline", "median": "median_ms"})
summary["images_per_s"] = [pipes.measurements[name].throughput for name, _, _ in steps]
summary["largest stage"] = [t.index[0] for _, _, t in steps]
summary["its share"] = [t["share"].iloc[0] for _, _, t in steps]
display(summary.drop(columns="unit").round(3))
for name, _, _ in steps[1:]:
    print(f"{name}: {pipes.ratio(name)} vs the slow pipeline")
fig = cu.plots.speedup_bars(
    {name: pipes.ratio(name) for name, _, _ in steps[1:]}, title=f"Pipeline speed-up on {device}"
)
_ = cu.plots.save(fig, "02", "pipeline_speedups")  # beside the results: a workshop shows it without a rerun

# %%
times_fixed = steps[-1][2]
both = pd.DataFrame({"slow": times_slow["ms"], "fixed": times_fixed["ms"]}).loc[stages]
ax = both.plot.barh(logx=True)
ax.set_xlabel("ms per pipeline call (profiled, log scale)")
_ = ax.set_title("Time per stage, before and after")

# %% [markdown]
# ### One more profiler switch: memory
# `profile_memory=True` records how much memory each operator allocates (on the CPU here, on the GPU too where
# present). It makes profiling slower and traces larger: switch it on when you need it.

# %%
prof_mem = profile_pipeline(
    lambda: run_pipeline(images, **current), device, traces / "02_fixed_memory.json", active=1, profile_memory=True
)
print(prof_mem.key_averages().table(sort_by="self_cpu_memory_usage", row_limit=6, max_name_column_width=30))

# %% [markdown]
# ## On a GPU: CUDA activity, NVTX and the cost of a sync
# With `ProfilerActivity.CUDA` the table gains device-time columns and CUDA runtime calls. The per-image
# `.item()` in the slow post-processing shows up as one `cudaStreamSynchronize` / `cudaMemcpyAsync` per image;
# the fixed version has one per batch. `torch.cuda.nvtx.range(name)` marks the same stages for Nsight Systems.
# *Verification: contract-tested (`tests/gpu_contract/test_l02_profile.py` runs `profile_pipeline` with
# `ProfilerActivity.CUDA` requested and checks the schedule, ranges and exported trace); not yet executed on a
# GPU.*

# %%
if cu.gpu_section("02.cuda-profile"):
    with torch.cuda.nvtx.range("slow pipeline"):
        prof_gpu = profile_pipeline(lambda: run_pipeline(images, **slow), "cuda", traces / "02_slow_cuda.json")
    prof_gpu_fixed = profile_pipeline(lambda: run_pipeline(images, **current), "cuda", traces / "02_fixed_cuda.json")
    print(prof_gpu.key_averages().table(sort_by="self_device_time_total", row_limit=10, max_name_column_width=30))
    for api in ("cudaStreamSynchronize", "cudaMemcpyAsync", "cudaLaunchKernel"):
        print(
            f"{api}: {cu.profiling.op_calls(prof_gpu, api) / 2:,.0f} calls per pipeline call (slow) vs "
            f"{cu.profiling.op_calls(prof_gpu_fixed, api) / 2:,.0f} (fixed)"
        )
    display(stage_table(prof_gpu_fixed, stages).round(4))
    gpu_cmp = cu.compare(
        {"slow": lambda: run_pipeline(images, **slow), "fixed": lambda: run_pipeline(images, **current)},
        baseline="slow",
        device="cuda",
        batch_size=n_images,
    )
    m_gpu_slow, m_gpu_fixed = gpu_cmp.measurements["slow"], gpu_cmp.measurements["fixed"]
    gpu_speedup = gpu_cmp.ratio("fixed")
    print(f"On {torch.cuda.get_device_name(0)}: {gpu_speedup.says('the fixed pipeline', 'the slow one')}")
    cu.record("02", "slow pipeline (CUDA)", model="digits_cnn", device="cuda", dtype="fp32", measurement=m_gpu_slow)
    cu.record(
        "02",
        "fixed pipeline (CUDA)",
        model="digits_cnn",
        device="cuda",
        dtype="fp32",
        measurement=m_gpu_fixed,
        speedup_vs_baseline=gpu_speedup,
    )
else:
    cu.results.show_reference("02")

# %% [markdown]
# ### Nsight Systems (GPU machines)
# The PyTorch profiler sees PyTorch's operators; Nsight Systems sees the whole process: CUDA API calls,
# kernels, copies, NVTX ranges and OS runtime calls (`osrt`: sleeps, locks, file reads) on one timeline. Put
# the pipeline in a script (with `torch.cuda.nvtx.range` around the stages) and run:

# %%
print(cu.profiling.nsys_command("my_pipeline.py"))

# %% [markdown]
# Useful variations: limit the capture to a region with `torch.cuda.profiler.start()` / `stop()` in the script
# and `--capture-range=cudaProfilerApi`; `nsys stats report.nsys-rep` prints summary tables in the terminal. For
# one kernel in depth (occupancy, memory throughput), Nsight Compute: `ncu --set full -o kernel_report python
# my_pipeline.py` (slow: it replays each kernel many times). For memory over time,
# `torch.cuda.memory._record_memory_history()` (lesson 11).

# %% [markdown]
# ## What surprised us
# Printed from this run's numbers.

# %%
prof_ms = float(times_slow["ms"].sum())
m_slow = pipes.measurements["slow pipeline"]
above = prof_ms > m_slow.p90_ms  # beyond the unprofiled calls' own p10-p90 range
print(
    f"1. Under the profiler the slow pipeline's stages took {prof_ms:.2f} ms per call; without it the calls took "
    f"{m_slow.median_ms:.2f} ms (median, p10-p90 {m_slow.p10_ms:.2f}-{m_slow.p90_ms:.2f}). "
    + (
        "The profiler adds a cost to every operator call, so code with many tiny ops looks worse under it."
        if above
        else "Here the profiler's own cost was within the run-to-run noise of this machine."
    )
    + " Use the profiler to find where the time goes, and a timer (cu.measure) for how much."
)
item = next((e for e in prof_slow.key_averages() if e.key == "aten::item"), None)
if item is not None:
    print(
        f"2. On {device}, the {item.count / 2:.0f} `.item()` calls per pipeline call cost "
        f"{item.cpu_time_total / item.count:.1f} us each (profiled). "
        + (
            "On a CPU there is no device queue to wait for, so the sync itself is cheap here; on a GPU each one "
            "stalls until all queued kernels finish."
            if device.type == "cpu"
            else "Each one waits for the GPU queue to drain."
        )
    )
model_share = float(times_fixed.loc["model", "share"])
print(
    f"3. After the fixes the model takes {model_share:.0%} of the pipeline time "
    f"(it was {float(times_slow.loc['model', 'share']):.0%}): "
    + (
        "now the model is what to optimize (lessons 04-08)."
        if model_share >= 0.5
        else "the code around the model still dominates; profile again before touching the model."
    )
)
ops_slow = sum(e.count for e in prof_slow.key_averages() if e.key.startswith("aten::")) / 2
ops_fixed = sum(e.count for e in prof_mem.key_averages() if e.key.startswith("aten::"))
print(f"4. Operator calls per pipeline call: {ops_slow:,.0f} slow vs {ops_fixed:,.0f} fixed.")
trace_mib = (traces / "02_slow.json").stat().st_size / 2**20
print(
    f"5. The Chrome trace of the slow pipeline is {trace_mib:.1f} MiB for 2 profiled calls: every tiny op is an "
    "event. Profile a few steps, not a whole run."
)

# %% [markdown]
# ## Summary
# You can now wrap any pipeline in `torch.profiler.profile` with a schedule and ranges, read which stage and
# which operator take the time (on a GPU, by the device time of the kernels each stage launched), and fix what
# the data points at. Later lessons profile with the same calls, written out where they are used. Next:
# **03 · Batching**.

# %%
cu.record(
    "02",
    "slow pipeline",
    model="digits_cnn",
    device=str(device),
    dtype="fp32",
    measurement=m_slow,
    notes="python-loop preprocessing, per-row .item()/.cpu()",
)
for name, _, t in steps[1:]:
    cu.record(
        "02",
        name.replace("+ ", ""),
        model="digits_cnn",
        device=str(device),
        dtype="fp32",
        measurement=pipes.measurements[name],
        speedup_vs_baseline=pipes.ratio(name),
        notes=f"largest stage after: {t.index[0]} ({t['share'].iloc[0]:.0%})",
    )
summary.round(3)
