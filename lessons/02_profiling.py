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
# * Profile a deliberately slow inference pipeline with `torch.profiler` (CPU activity always, CUDA activity
#   on a GPU), using a schedule (wait / warm-up / active steps).
# * Name the stages with `record_function` ranges (and NVTX ranges on a GPU, for Nsight Systems).
# * Read the top-operators table, export a Chrome trace and open it in Perfetto.
# * Find the hotspot **in code, from the profile data**, fix it, re-measure, and repeat until the model
#   itself is the largest stage.
# * Know the Nsight Systems command line for a GPU machine.
#
# **The bottleneck this attacks.** In *01 · Measuring inference* we sorted slow inference into compute-,
# memory-, launch- and transfer-bound work. Real pipelines add a fifth kind: time spent *around* the model:
# Python loops in pre- and post-processing, thousands of tiny operators (each one launch- and
# framework-overhead-bound), and host-device synchronizations (`.item()`, `.cpu()`) that stall the GPU queue.
# A timer tells you the pipeline is slow; a profiler tells you *where*.

# %%
from IPython.display import display

import course_utils as cu
import course_utils.profiling

device = cu.lesson.start("02", "Profiling")

# %% [markdown]
# ## A deliberately slow pipeline
# Requests arrive as decoded 8×8 grey images (`uint8`, values 0–16, from scikit-learn's digits). The
# pipeline turns them into a batch, runs the trained digits CNN, and returns `(label, confidence)` per image.
# It contains four classic mistakes, on purpose:
# 1. **pre-processing in Python loops**: one small tensor per image, filled row by row;
# 2. **many tiny operators**: every row and every image is its own operator call;
# 3. **the model called once per image** instead of once per batch (lesson 03 measures what batching buys);
# 4. **a sync inside the loop**: post-processing calls `.item()` and `.cpu()` once per image. On a GPU each
#    of these waits for the device to finish and copies a single number back.
#
# We will not guess which one matters most: the profiler will tell us.
#
# Each stage is wrapped in `cu.profiling.annotate(name)`: a `torch.profiler.record_function` range (and a
# `torch.cuda.nvtx.range` when a GPU is present), so the profiler can report time per stage.

# %%
import numpy as np
import torch

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
    with cu.profiling.annotate("preprocess"):
        x = preprocess(images)
    with cu.profiling.annotate("model"):
        with torch.inference_mode():
            logits = model(x.to(device))  # the stage function: per image or batched
    with cu.profiling.annotate("postprocess"):
        return postprocess(logits)


slow = {"preprocess": preprocess_slow, "model": infer_per_image, "postprocess": postprocess_slow}
baseline_out = run_pipeline(images, **slow)
acc = np.mean([label == int(y) for (label, _), y in zip(baseline_out, digits.y_test[:n_images], strict=True)])
print(f"First results: {baseline_out[:3]} ... accuracy on these images: {acc:.1%}")

# %% [markdown]
# ## Baseline, measured
# `cu.measure` (lesson 01) times the whole pipeline: warm-up, synchronization, median and spread.

# %%
reps = dict(min_repeats=cu.pick(full=10, smoke=3))  # the slow pipeline is slow: fewer repeats suffice
m_slow = cu.measure(lambda: run_pipeline(images, **slow), device=device, batch_size=n_images, label="slow pipeline",
                    **reps)  # fmt: skip
print(m_slow)

# %% [markdown]
# ## Profile it
# `cu.profiling.profile(fn, name=...)` wraps `torch.profiler.profile` with
# `activities=[ProfilerActivity.CPU]` (+ `ProfilerActivity.CUDA` on a GPU), `record_shapes=True` and
# `schedule(wait=1, warmup=1, active=N)`: the first call is skipped, the second is profiled but thrown away
# (one-off costs), the next *N* (here 2) are kept. The loop calls `prof.step()` after each call. When the active
# steps are done, `on_trace_ready` exports a Chrome trace.
#
# *What not to do:* older tutorials pass `on_trace_ready=tensorboard_trace_handler(...)` and open the result
# in TensorBoard. The TensorBoard profiler plugin is deprecated; export a Chrome trace and open it in
# [Perfetto](https://ui.perfetto.dev) (or `chrome://tracing`) instead.

# %%
prof_slow = cu.profiling.profile(lambda: run_pipeline(images, **slow), name="02_slow_pipeline", device=device, active=2)
print(f"Chrome trace: {prof_slow.trace_path} ({prof_slow.trace_bytes:,} bytes)")
assert prof_slow.trace_bytes > 0, "the trace file is empty"
print(prof_slow.table(row_limit=10))

# %% [markdown]
# The same numbers as a DataFrame (per profiled step), sorted two ways: by **self time** (time spent in the
# operator itself, not its children) and by **number of calls**. Many calls of a few microseconds each is the
# signature of "many tiny ops".

# %%
ops = cu.profiling.top_ops(prof_slow, n=200, sort_by="self_cpu_ms")
ops.head(8).round(4)

# %%
cu.profiling.top_ops(prof_slow, n=8, sort_by="calls").round(4)

# %% [markdown]
# `record_shapes=True` lets the profiler group operators by input shape: the tiny shapes (one row of 8
# pixels, one row of 10 logits) show where the calls come from.

# %%
by_shape = prof_slow.prof.key_averages(group_by_input_shape=True)
print(by_shape.table(sort_by="count", row_limit=6, max_name_column_width=30))

# %% [markdown]
# ## The hotspot, found from the data
# `cu.profiling.stage_times` reads the `record_function` ranges; `cu.profiling.hotspot` names the largest
# one. No eyeballing: the code below decides what to fix.

# %%
stages = ["preprocess", "model", "postprocess"]
times_slow = cu.profiling.stage_times(prof_slow, stages)
hot, share = cu.profiling.hotspot(times_slow)
print(f"Hotspot: '{hot}' takes {share:.0%} of the pipeline's profiled time.")
times_slow.round(4)

# %% [markdown]
# ## Fix what the data points at, then look again
# The fixes: build the batch with one `np.stack` and one conversion (no per-row ops), call the model once
# on the whole batch, and post-process the whole batch at once with a single copy back to the host
# (`softmax` and `max` over dim 1, then `.tolist()`). The loop reads the stage times from the latest
# profile, fixes the largest stage that still has a fix, re-measures and re-profiles; it stops when every
# stage is fixed or the largest unfixed one is too small to matter. The outputs must not change: the checks
# below run **before** any speed figure.

# %%
def preprocess_fast(images):
    return torch.from_numpy(np.stack(images)).float().div_(16.0).unsqueeze(1)


def infer_batched(x):
    return cnn(x)  # one call for the whole batch


def postprocess_fast(logits):
    conf, label = torch.softmax(logits, dim=1).max(dim=1)
    return list(zip(label.cpu().tolist(), conf.cpu().tolist(), strict=True))  # one copy (and one sync) per batch


fixes = {"preprocess": preprocess_fast, "model": infer_batched, "postprocess": postprocess_fast}
current = dict(slow)
steps = [("slow pipeline", m_slow, hot, share)]
prof_now = prof_slow
MIN_SHARE = 0.05  # a stage below this share of the time is not worth a fix (change it and rerun)
for _ in range(len(fixes)):
    times = cu.profiling.stage_times(prof_now, stages)
    top, top_share = cu.profiling.hotspot(times)
    pending = times[[s in fixes and current[s] is not fixes[s] for s in times["stage"]]]
    if pending.empty:
        print(f"Hotspot '{top}' ({top_share:.0%}); every stage is fixed: what is left is the work itself.")
        break
    hot, share = str(pending.iloc[0]["stage"]), float(pending.iloc[0]["share"])  # largest stage not yet fixed
    if share < MIN_SHARE:
        print(f"Hotspot '{top}' ({top_share:.0%}); the largest unfixed stage, '{hot}', is only {share:.0%}: stop.")
        break
    if hot != top:
        print(f"Hotspot '{top}' ({top_share:.0%}) is already fixed; next largest: '{hot}'.")
    current[hot] = fixes[hot]
    print(f"Fixing '{hot}' ({share:.0%} of the time) ...")
    out = run_pipeline(images, **current)
    assert [lab for lab, _ in out] == [lab for lab, _ in baseline_out], "labels changed: the fix is wrong"
    cu.check_outputs(torch.tensor([c for _, c in out]), torch.tensor([c for _, c in baseline_out]), "fp32",
                     label=f"confidences after fixing {hot}")  # fmt: skip
    m = cu.measure(lambda: run_pipeline(images, **current), device=device, batch_size=n_images, label=f"fixed {hot}",
                   **reps)  # fmt: skip
    prof_now = cu.profiling.profile(lambda: run_pipeline(images, **current), name=f"02_fixed_{hot}", device=device,
                                    active=2)  # fmt: skip
    new_hot, new_share = cu.profiling.hotspot(cu.profiling.stage_times(prof_now, stages))
    steps.append((f"+ fixed {hot}", m, new_hot, new_share))
    print(f"  {m}\n  {m_slow.median_ms / m.median_ms:.2f}x the slow pipeline's speed; hotspot now '{new_hot}'")

# %% [markdown]
# ## Results: table and plot

# %%
import pandas as pd

summary = pd.DataFrame(
    [
        {"pipeline": name, "median_ms": m.median_ms, "p90_ms": m.p90_ms, "images_per_s": m.throughput,
         "speedup": m_slow.median_ms / m.median_ms, "hotspot": h, "hotspot_share": s}
        for name, m, h, s in steps
    ]
)  # fmt: skip
display(summary.round(3))
cu.plots.speedup_bars(summary.set_index("pipeline")["speedup"], title=f"Pipeline speed-up on {device}");

# %%
times_fixed = cu.profiling.stage_times(prof_now, stages)
both = pd.concat([times_slow.assign(pipeline="slow"), times_fixed.assign(pipeline="fixed")])
ax = both.pivot(index="stage", columns="pipeline", values="ms").loc[stages].plot.barh(logx=True)
ax.set_xlabel("ms per pipeline call (profiled, log scale)")
ax.set_title("Time per stage, before and after");

# %%
final = steps[-1][1]
speedup = m_slow.median_ms / final.median_ms
print(f"End to end, the fixed pipeline runs at {speedup:.2f}x the slow one's speed "
      f"({m_slow.median_ms:.2f} ms -> {final.median_ms:.2f} ms for {n_images} images).")  # fmt: skip
print(f"Operator calls per pipeline call: {cu.profiling.op_calls(prof_slow):,.0f} slow vs "
      f"{cu.profiling.op_calls(prof_now):,.0f} fixed.")  # fmt: skip
print(f"Chrome traces to compare in Perfetto:\n  {prof_slow.trace_path}\n  {prof_now.trace_path}")

# %% [markdown]
# ### Two more profiler switches
# `profile_memory=True` records how much memory each operator allocates (on the CPU here, on the GPU too
# where present); `with_stack=True` records the Python line that called each operator, so the trace and
# `key_averages(group_by_stack_n=5)` point at *your* code (both make profiling slower and traces larger:
# switch them on when you need them). Memory per operator in the fixed pipeline:

# %%
prof_mem = cu.profiling.profile(lambda: run_pipeline(images, **current), name="02_fixed_memory", device=device,
                                active=1, profile_memory=True)  # fmt: skip
print(prof_mem.prof.key_averages().table(sort_by="self_cpu_memory_usage", row_limit=6))

# %% [markdown]
# ## On a GPU: CUDA activity, NVTX and the cost of a sync
# *This section has not yet been run on a GPU by the course unless reference results are shown below.*
# With `ProfilerActivity.CUDA` the table gains device-time columns and CUDA runtime calls. The per-image
# `.item()` in the slow post-processing shows up as one `cudaStreamSynchronize` / `cudaMemcpyAsync` per
# image; the fixed version has one per batch. The NVTX ranges from `annotate` appear in Nsight Systems.

# %%
if cu.gpu_section("02.cuda-profile"):
    prof_gpu = cu.profiling.profile(lambda: run_pipeline(images, **slow), name="02_slow_pipeline_cuda", device="cuda")
    display(cu.profiling.top_ops(prof_gpu, n=10, sort_by="self_cpu_ms").round(4))
    display(cu.profiling.top_ops(prof_gpu, n=8, sort_by="self_device_ms").round(4))
    prof_gpu_fixed = cu.profiling.profile(
        lambda: run_pipeline(images, **current), name="02_fixed_pipeline_cuda", device="cuda"
    )
    for api in ("cudaStreamSynchronize", "cudaMemcpyAsync", "cudaLaunchKernel"):
        print(f"{api}: {cu.profiling.op_calls(prof_gpu, api):,.0f} calls per pipeline call (slow) vs "
              f"{cu.profiling.op_calls(prof_gpu_fixed, api):,.0f} (fixed)")  # fmt: skip
    display(cu.profiling.stage_times(prof_gpu_fixed, stages).round(4))
    print(f"CUDA traces: {prof_gpu.trace_path}, {prof_gpu_fixed.trace_path}")
    m_gpu_slow = cu.measure(lambda: run_pipeline(images, **slow), device="cuda", batch_size=n_images)
    m_gpu_fixed = cu.measure(lambda: run_pipeline(images, **current), device="cuda", batch_size=n_images)
    gpu_speedup = m_gpu_slow.median_ms / m_gpu_fixed.median_ms
    print(f"On {torch.cuda.get_device_name(0)} the fixed pipeline runs at {gpu_speedup:.2f}x the slow one's speed.")
    cu.record("02", "slow pipeline (CUDA)", model="digits_cnn", device="cuda", dtype="fp32", measurement=m_gpu_slow)
    cu.record("02", "fixed pipeline (CUDA)", model="digits_cnn", device="cuda", dtype="fp32",
              measurement=m_gpu_fixed, speedup_vs_baseline=gpu_speedup)  # fmt: skip
else:
    cu.results.show_reference("02")

# %% [markdown]
# ### Nsight Systems (GPU machines)
# The PyTorch profiler sees PyTorch's operators; Nsight Systems sees the whole process: CUDA API calls,
# kernels, copies, NVTX ranges and OS runtime calls (`osrt`: sleeps, locks, file reads) on one timeline.
# Put the pipeline in a script (the ranges from `cu.profiling.annotate` become NVTX rows) and run:

# %%
print(cu.profiling.nsys_command("my_pipeline.py"))

# %% [markdown]
# Useful variations: limit the capture to a region with `torch.cuda.profiler.start()` / `stop()` in the
# script and `--capture-range=cudaProfilerApi`; `nsys stats report.nsys-rep` prints summary tables in the
# terminal. For one kernel in depth (occupancy, memory throughput), Nsight Compute:
# `ncu --set full -o kernel_report python my_pipeline.py` (slow: it replays each kernel many times).
# For memory over time, `torch.cuda.memory._record_memory_history()` (lesson 11).

# %% [markdown]
# ## What surprised us
# Printed from this run's numbers.

# %%
def ratio_word(r):
    return "faster" if r > 1 else "slower"


prof_ms = float(times_slow["ms"].sum())
overhead = prof_ms / m_slow.median_ms
print(f"1. Under the profiler the slow pipeline's stages took {prof_ms:.2f} ms per call, {overhead:.2f}x the "
      f"{m_slow.median_ms:.2f} ms measured without it. "
      + ("The profiler adds a cost to every operator call, so code with many tiny ops looks worse under it."
         if overhead > 1 else "Here the profiler's own cost was lost in the run-to-run noise of this machine.")
      + " Use the profiler to find where the time goes, and a timer (cu.measure) for how much.")
item_us = ops.set_index("name")["us_per_call"].get("aten::item", float("nan"))
n_item = cu.profiling.op_calls(prof_slow, "aten::item")
print(f"2. On {device}, the {n_item:.0f} `.item()` calls per pipeline call cost {item_us:.1f} us each (profiled). "
      + ("On a CPU there is no device queue to wait for, so the sync itself is cheap here; on a GPU each one "
         "stalls until all queued kernels finish." if device.type == "cpu" else
         "Each one waits for the GPU queue to drain."))
model_share = float(times_fixed.set_index("stage").loc["model", "share"])
print(f"3. After the fixes the model takes {model_share:.0%} of the pipeline time "
      f"(it was {float(times_slow.set_index('stage').loc['model', 'share']):.0%}): "
      + ("now the model is what to optimize (lessons 04-08)." if model_share >= 0.5 else
         "the code around the model still dominates; profile again before touching the model."))
fix_gain = {name: m_slow.median_ms / m.median_ms for name, m, _, _ in steps[1:]}
first = next(iter(fix_gain.items()), None)
if first:
    print(f"4. The first fix alone ('{first[0]}') made the pipeline {first[1]:.2f}x {ratio_word(first[1])}; "
          f"all fixes together {speedup:.2f}x the slow pipeline's speed.")  # fmt: skip
print(f"5. The Chrome trace of the slow pipeline is {prof_slow.trace_bytes / 2**20:.1f} MiB for "
      f"{prof_slow.active_steps} profiled calls: every tiny op is an event. Profile a few steps, not a whole run.")

# %% [markdown]
# ## Exercises
# **02.vectorize.** Write `preprocess_vectorized(images)` that turns a list of `uint8` 8×8 images (0–16)
# into a float tensor of shape `(N, 1, 8, 8)` in [0, 1] with a fixed number of operator calls, however
# many images there are (the self-check counts them with the profiler).

# %%
def preprocess_vectorized(images):
    raise NotImplementedError  # your code here


cu.exercises.check("02.vectorize", preprocess_vectorized)

# %% [markdown]
# **02.one-sync.** Write `postprocess_batched(logits)` that returns `[(label, confidence), ...]` like
# `postprocess_slow`, without a per-row `.item()`: the number of operator calls must not grow with the
# batch.

# %%
def postprocess_batched(logits):
    raise NotImplementedError  # your code here


cu.exercises.check("02.one-sync", postprocess_batched)

# %% [markdown]
# ## Summary
# Rows for this machine's results file. Next: **03 · Batching**, how much throughput a larger batch buys
# and what it costs in latency.

# %%
cu.record("02", "slow pipeline", model="digits_cnn", device=str(device), dtype="fp32", measurement=m_slow,
          notes="python-loop preprocessing, per-row .item()/.cpu()")  # fmt: skip
for name, m, h, s in steps[1:]:
    cu.record("02", name.replace("+ ", ""), model="digits_cnn", device=str(device), dtype="fp32", measurement=m,
              speedup_vs_baseline=m_slow.median_ms / m.median_ms, notes=f"hotspot after: {h} ({s:.0%})")  # fmt: skip
summary.round(3)
