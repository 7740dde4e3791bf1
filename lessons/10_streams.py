# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 10 · Streams and async
#
# **Goals.** Hide one stage of a pipeline behind another. Measure each stage alone, run them one after the
# other, then overlapped, and compare with the **best case**: a two-stage pipeline can never beat
# `max(stage A, stage B)` per item. On the CPU: a background thread prepares (decodes, resizes) the next
# batch while the model runs on the current one. On a GPU: two CUDA streams overlap host-to-device copies
# from pinned memory with compute, CUDA events order them, and a timeline shows the overlap.
#
# **The bottleneck it attacks.** In the taxonomy of *01 · Measuring inference*: *transfer-bound* and idle
# time between stages. Overlap does not make any stage faster; it stops the stages from waiting for each
# other, so it pays most when the stages take similar time, and nothing when one stage dominates.

# %%
import course_utils as cu

device = cu.lesson.start("10", "Streams and async")

# %%
import os

import numpy as np
import pandas as pd
import torch

from course_utils import pipeline as pl

SIZE = cu.pick(full=160, smoke=64)
BATCH = cu.pick(full=4, smoke=2)
N_BATCHES = cu.pick(full=10, smoke=4)
ds = pl.JpegDataset(BATCH * N_BATCHES, size=SIZE)
raw_batches = [[ds.raw(b * BATCH + i) for i in range(BATCH)] for b in range(N_BATCHES)]
print(f"{N_BATCHES} batches of {BATCH} JPEGs at {SIZE}x{SIZE}")

# %% [markdown]
# ## The two stages, measured alone
# *Prepare*: decode the batch's JPEG bytes and preprocess them (`cu.pipeline.preprocess`). *Compute*: a
# model on the prepared batch. Overlap can hide at most the shorter stage, so it shows best when both take
# similar time: from three models (random weights, fine for speed) we pick the one whose compute time is
# closest to the preparation time on this machine (both timed with one torch thread), and say which.

# %%
import torchvision


def prepare(raw: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([pl.preprocess(pl.decode_jpeg(r), SIZE) for r in raw])


resnet, note = cu.models.resnet("resnet18")
candidates = {"tiny_cnn": pl.tiny_cnn(), "mobilenet_v3_small": torchvision.models.mobilenet_v3_small().eval(),
              "resnet18": resnet}  # fmt: skip
prepared = [prepare(r) for r in raw_batches]
kw = dict(device="cpu", batch_size=BATCH, warmup=1, min_repeats=cu.pick(full=5, smoke=3), min_time_s=cu.pick(full=0.5, smoke=0.05),
          warn_spread=False)  # fmt: skip
default_threads = torch.get_num_threads()
torch.set_num_threads(1)  # one core per stage: the configuration the overlap experiment is about (see below)
try:
    m_prep = cu.measure(lambda: prepare(raw_batches[0]), label="prepare", **kw)
    print(m_prep)
    stage_rows = []
    with torch.inference_mode():
        for name, m in candidates.items():
            mc = cu.measure(lambda m=m: m(prepared[0]), label=f"compute {name}", **kw)
            print(mc)
            stage_rows.append({"model": name, "compute ms": mc.median_ms,
                               "compute / prepare": mc.median_ms / m_prep.median_ms})  # fmt: skip
finally:
    torch.set_num_threads(default_threads)
stages = pd.DataFrame(stage_rows)
pick_name = stages.loc[(np.log(stages["compute / prepare"])).abs().idxmin(), "model"]
model = candidates[pick_name]
print(f"Compute model for the overlap experiment: {pick_name} (closest to the preparation time here).")


def compute(x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(x)


stages

# %% [markdown]
# ## Sequential vs overlapped, against the best case
# `cu.pipeline.Prefetcher` runs `prepare` in a background thread, up to two batches ahead, while the main
# thread computes; it is a context manager, so the thread stops even if the loop fails. Python threads can
# overlap here because torch and torchvision release the GIL inside their C++ operators. The best case for
# `n` batches is `prep + (n-1) * max(prep, compute) + compute` (`cu.pipeline.overlap_bound`).
#
# Both stages use torch's intra-op thread pool. With all threads (`torch.get_num_threads()`), each stage
# alone already tries to use every core, so there is little idle hardware to overlap into; with one thread
# per stage, each stage gets its own core. We measure both.

# %%
# Correct before fast: the overlapped pipeline must produce the same outputs, in the same order.
ref_out = [compute(prepare(r)) for r in raw_batches]
ovl_out = []
with pl.Prefetcher(raw_batches, prepare) as batches:
    for x in batches:
        ovl_out.append(compute(x))
_ = cu.check_outputs(torch.cat(ovl_out), torch.cat(ref_out), "fp32", label="overlapped vs sequential outputs")

# %%
rows = []
timelines = {}
for threads in sorted({default_threads, 1}, reverse=True):
    torch.set_num_threads(threads)
    try:
        p = cu.measure(lambda: prepare(raw_batches[0]), label="prepare", **kw).median_ms / 1000
        c = cu.measure(lambda: compute(prepared[0]), label="compute", **kw).median_ms / 1000
        seq = pl.run_pipeline(raw_batches, prepare, compute, overlap=False)
        tl = pl.Timeline()
        ovl = pl.run_pipeline(raw_batches, tl.wrap("prepare (thread)", prepare), tl.wrap("compute (main)", compute),
                              overlap=True)  # fmt: skip
        timelines[threads] = tl
    finally:
        torch.set_num_threads(default_threads)
    bound = pl.overlap_bound(p, c, N_BATCHES)
    rows.append({"torch threads": threads, "prepare ms": p * 1000, "compute ms": c * 1000,
                 "sequential s": seq, "overlapped s": ovl, "best case s": bound, "gain": seq / ovl,
                 "best gain": seq / bound,
                 "share of possible gain": (seq - ovl) / (seq - bound) if seq > bound else float("nan")})  # fmt: skip
res = pd.DataFrame(rows)
res

# %%
for threads, tl in timelines.items():
    fig = tl.plot(title=f"CPU pipeline with a prefetching thread, torch threads={threads}")
    both = tl.busy_overlap_s("prepare (thread)", "compute (main)")
    print(f"threads={threads}: both stages were busy at the same time for {both:.2f} s of the run")

# %% [markdown]
# ## What surprised us
# Printed from this run's numbers.

# %%
cores = os.cpu_count() or 1
for _, r in res.iterrows():
    t = int(r["torch threads"])
    verdict = "faster" if r["gain"] > 1.02 else ("slower" if r["gain"] < 0.98 else "no faster")
    share = r["share of possible gain"]
    if share != share:
        share_txt = "the stage medians predict no gain at all (sequential was already at the bound)"
    elif share > 1.0:
        share_txt = (f"beating the bound predicted from the stages timed alone ({share:.0%} of the 'possible' gain): "
                     "the stages did not run at their solo speed, so that bound does not describe this run")  # fmt: skip
    else:
        share_txt = f"reaching {share:.0%} of the possible gain"
    print(f"threads={t}: overlapped was {verdict} than sequential ({r['gain']:.2f}x; the best case allows "
          f"{r['best gain']:.2f}x), {share_txt}.")  # fmt: skip
ratio = res["compute ms"].iloc[-1] / res["prepare ms"].iloc[-1]
print(f"Compute takes {ratio:.2f}x as long as preparing here: the closer this is to 1, the more overlap can hide.")
if len(res) > 1:
    r_all, r_one = res.iloc[0], res.iloc[-1]
    lesson = ("Overlap needs idle hardware: when each stage already fills every core, a second stage only "
              "competes for them." if r_one["overlapped s"] < r_all["overlapped s"] else
              "More threads per stage won here: the cores had room for both stages.")  # fmt: skip
    print(f"With {cores} cores, {int(r_all['torch threads'])} torch threads per stage gave {r_all['overlapped s']:.2f} s "
          f"overlapped; 1 thread per stage gave {r_one['overlapped s']:.2f} s. {lesson}")  # fmt: skip
    slow = r_all["compute ms"] / r_one["compute ms"]
    print(f"Timed alone, compute with {int(r_all['torch threads'])} threads took {slow:.2f}x the time it took with 1 "
          "thread. Above 1 means the cores were not free (other programs, or the other stage's threads): "
          "multi-threaded kernels wait at every barrier for their slowest thread.")  # fmt: skip
best = res.loc[res["overlapped s"].idxmin()]
cu.record("10", "cpu prefetch thread (overlapped)", model=pick_name, device="cpu", dtype="fp32", batch_size=BATCH,
          median_ms=best["overlapped s"] * 1000 / N_BATCHES, speedup_vs_baseline=best["gain"],
          notes=f"threads={int(best['torch threads'])}; best-case gain {best['best gain']:.2f}x")  # fmt: skip
_ = cu.record("10", "cpu sequential (baseline)", model=pick_name, device="cpu", dtype="fp32", batch_size=BATCH,
          median_ms=best["sequential s"] * 1000 / N_BATCHES, speedup_vs_baseline=1.0)  # fmt: skip

# %% [markdown]
# ## On a GPU: copies and compute on two streams
# **Not yet run on a GPU by the course** unless reference results are shown in its place.
#
# A CUDA stream is a queue: work in one stream runs in order, work in different streams may run at the same
# time. A GPU has copy engines separate from its compute units, so a host-to-device copy of batch *i+1*
# can run during the compute of batch *i*, if (1) the host memory is **pinned** (a copy from pageable
# memory is staged and synchronous), (2) the copy is issued with `non_blocking=True` on a **different
# stream**, and (3) something orders the streams: `cu.pipeline.stream_pipeline` records a CUDA **event**
# when copy *i* is done, and the compute stream waits on it (`wait_event`); copy *i+2* waits for the event of
# compute *i* before overwriting its buffer (two preallocated buffers, double buffering).
#
# The source tutorial's version issues each batch's copy and compute on its own stream and synchronizes
# both: it works, but nothing orders buffer reuse and no measurement shows whether anything overlapped.

# %%
if cu.gpu_section("10.streams"):
    gmodel, _ = cu.models.resnet("resnet50", device="cuda")
    chunk_batch = cu.pick(full=128, smoke=16)
    n_chunks = cu.pick(full=12, smoke=4)
    chunks = [torch.randn(chunk_batch, 3, 224, 224).pin_memory() for _ in range(n_chunks)]
    pl.stream_pipeline(gmodel, chunks[:2], overlap=True)  # warm-up (cuDNN autotune, allocator)
    # Each stage alone, per chunk.
    dbuf = torch.empty_like(chunks[0], device="cuda")
    copy_ms = cu.measure(lambda: dbuf.copy_(chunks[0], non_blocking=True), device="cuda", label="H2D copy").median_ms
    with torch.inference_mode():
        comp_ms = cu.measure(lambda: gmodel(dbuf), device="cuda", label="compute").median_ms
    serial_ms, out_serial = pl.stream_pipeline(gmodel, chunks, overlap=False)
    tl_gpu = pl.Timeline()
    overlap_ms, out_overlap = pl.stream_pipeline(gmodel, chunks, overlap=True, timeline=tl_gpu)
    # tf32 tolerance: cuDNN convolutions use TF32 by default and may pick different algorithms per call.
    cu.check_outputs(torch.cat(out_overlap), torch.cat(out_serial), "tf32", label="two streams vs one stream")
    best_ms = pl.overlap_bound(copy_ms, comp_ms, n_chunks)
    gpu_res = pd.DataFrame([{"copy ms/chunk": copy_ms, "compute ms/chunk": comp_ms, "one stream ms": serial_ms,
                             "two streams ms": overlap_ms, "best case ms": best_ms, "gain": serial_ms / overlap_ms,
                             "best gain": serial_ms / best_ms}])  # fmt: skip
    display(gpu_res)  # noqa: F821 - IPython built-in
    tl_gpu.plot(title="Copy stream and compute stream (from CUDA events)", unit="ms")
    print(f"Two streams took {overlap_ms:.1f} ms vs {serial_ms:.1f} ms on one stream ({serial_ms / overlap_ms:.2f}x); "
          f"the best case, max(copy, compute) per chunk, is {best_ms:.1f} ms.")  # fmt: skip
    cu.record("10", "gpu two streams (copy/compute overlap)", model="resnet50", device="cuda", dtype="fp32",
              batch_size=chunk_batch, median_ms=overlap_ms / n_chunks, speedup_vs_baseline=serial_ms / overlap_ms,
              notes=f"best-case gain {serial_ms / best_ms:.2f}x")  # fmt: skip

    # The same overlap in the profiler: a Chrome trace to open in https://ui.perfetto.dev
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        pl.stream_pipeline(gmodel, chunks[:4], overlap=True)
    trace = cu.results.results_dir() / "10_streams_trace.json"
    trace.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    assert trace.stat().st_size > 0
    print(f"Chrome trace: {trace} ({trace.stat().st_size / 1e6:.1f} MB). In Perfetto, the 'Memcpy HtoD' rows on "
          "one stream should sit under kernels on the other.")
else:
    cu.results.show_reference("10", "stream")

# %% [markdown]
# For a whole-system view (CPU threads, copies, kernels, NVTX ranges), Nsight Systems:
# `nsys profile -t cuda,nvtx,osrt -o streams python my_script.py`, then open the `.nsys-rep` file in the
# Nsight Systems GUI.
#
# ## Exercises
# **1.** Write `pipeline_bound(prep_s, compute_s, n)`: the best-case time of a two-stage pipeline over `n`
# items (first item's preparation, the slower stage for the `n - 1` items in between, the last compute).

# %%
def pipeline_bound(prep_s: float, compute_s: float, n: int) -> float:
    raise NotImplementedError  # your code here


cu.exercises.check("10.bound", pipeline_bound)

# %% [markdown]
# **2.** Write `share_of_possible_gain(sequential_s, overlapped_s, bound_s)`: the fraction of the time that
# overlap could save (`sequential - bound`) that it actually saved (`sequential - overlapped`).

# %%
def share_of_possible_gain(sequential_s: float, overlapped_s: float, bound_s: float) -> float:
    raise NotImplementedError  # your code here


cu.exercises.check("10.share", share_of_possible_gain)

# %% [markdown]
# ## Summary
# * Overlap hides the shorter stage behind the longer one; the best case is the longer stage alone.
# * It needs idle hardware: spare cores for CPU threads, a free copy engine and pinned memory for GPU copies.
# * Streams need ordering: events (`record`, `wait_event`) or `wait_stream`, and `record_stream` when a tensor
#   made on one stream is used on another.
#
# Next: **11 · Memory**.
