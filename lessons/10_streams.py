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
# **Goals.** Hide one stage of a pipeline behind another. You will write the stream code yourself: a side
# stream that copies the next batch while the current one computes (`wait_stream`, `record_stream`), and a
# double-buffered loop ordered by events (`Event.record`, `wait_event`). The code is written against
# `torch.get_device_module(device)`, so the same lines run on a GPU (`torch.cuda`) and on this CPU
# (`torch.cpu`, whose streams are stand-ins): the ordering is checked everywhere, the overlap measured where a
# GPU exists. On the CPU, the analogue that does overlap: a background thread prepares the next batch.
#
# **The bottleneck it attacks.** In the taxonomy of *01 · Measuring inference*: *transfer-bound* and idle
# time between stages. Overlap makes no stage faster; it stops the stages from waiting for each other, so
# two stages of similar length gain most, and nothing is gained when one stage dominates.

# %%
import course_utils as cu

device = cu.lesson.start("10", "Streams and async")

# %%
import copy
import os
import time

import numpy as np
import pandas as pd
import torch
import torchvision
from IPython.display import display

from course_utils.techniques import pipeline

SIZE = cu.pick(full=160, smoke=64)
BATCH = cu.pick(full=4, smoke=2)
N_BATCHES = cu.pick(full=10, smoke=4)
REPS = dict(warmup=1, min_repeats=cu.pick(full=5, smoke=3), min_time_s=cu.pick(full=0.5, smoke=0.05), warn_spread=False)

# %% [markdown]
# ## Streams, events and the device module
# A stream is a queue of device work: work in one stream runs in order, work in different streams may run
# at the same time. An **event** marks a point in a stream (`event.record(stream)`); another stream can wait
# for it (`stream.wait_event(event)`) without blocking the CPU, and `stream.wait_stream(other)` waits for
# everything issued to `other` so far. `torch.get_device_module(device)` returns `torch.cuda` on a GPU and
# `torch.cpu` here; both have `Stream`, `Event`, `stream(...)`, `current_stream()` and `synchronize()`.

# %%
dm = torch.get_device_module(device)
side = dm.Stream()
done = dm.Event()
with dm.stream(side):
    y = torch.ones(4) * 2  # issued on the side stream
    done.record(side)
dm.current_stream().wait_event(done)  # the default stream waits for the side stream's work so far
print(f"device module for {device}: {dm.__name__}; a stream here is a {type(side).__module__}.{type(side).__name__}")
if device.type == "cpu":
    print(
        "torch.cpu's streams and events are stand-ins (their methods do nothing): code written against them runs "
        "unchanged on a GPU, but on this CPU everything runs in order and nothing overlaps."
    )

# %% [markdown]
# ## Feeding a model from host memory: one stream vs a side stream
# The baseline copies each chunk to the device and runs the model, on one stream. The second version copies
# chunk *i+1* on a **side stream** while chunk *i* computes. Two rules make it correct:
# * before computing on a chunk, the compute stream waits for the copy (`wait_stream`);
# * the chunk's memory was allocated while the side stream was current, so the caching allocator would hand
#   it out again as soon as the Python object dies, even if the compute stream still reads it:
#   `tensor.record_stream(compute_stream)` tells the allocator to wait for that stream first. (`record_stream`
#   needs a device's allocator: `torch.cpu`'s stand-in streams have none, so the CPU run skips it.)
#
# On a GPU, `non_blocking=True` returns at once only when the host memory is pinned, so the chunks are pinned
# there (more in the GPU section).


# %% tags=["contract"]
def one_stream(model, chunks, device):
    """Baseline: copy, then compute, chunk after chunk, on the current stream."""
    return [model(chunk.to(device, non_blocking=True)) for chunk in chunks]


def side_stream_prefetch(model, chunks, device):
    """Copy chunk i+1 on a side stream while chunk i computes on the current stream."""
    dm = torch.get_device_module(device)
    side, main = dm.Stream(), dm.current_stream()

    def start_copy(chunk):
        with dm.stream(side):
            return chunk.to(device, non_blocking=True)

    outs = []
    nxt = start_copy(chunks[0])
    for i in range(len(chunks)):
        main.wait_stream(side)  # compute i waits for copy i (and for nothing issued later)
        x = nxt
        if not isinstance(main, torch.cpu.Stream):
            x.record_stream(main)  # x was allocated on `side` and is used on `main`
        if i + 1 < len(chunks):
            nxt = start_copy(chunks[i + 1])  # runs on the side stream during compute i
        outs.append(model(x))
    return outs


# %% [markdown]
# Correct before fast: on this machine's device module, both give the model's outputs, in order (fp32
# tolerance of `cu.check_outputs`). The ordering itself is checked without a GPU in
# `tests/gpu_contract/test_l10_streams.py`, which runs these very functions against a recording device module
# that flags any copy and kernel that no wait orders.

# %%
tiny = pipeline.tiny_cnn()  # stays on the CPU: the CPU section below runs it on CPU tensors
tiny_dev = copy.deepcopy(tiny).to(device)  # the stream code feeds it tensors on `device`: the model must live there
host_chunks = [torch.randn(BATCH, 3, SIZE, SIZE) for _ in range(N_BATCHES)]
if device.type == "cuda":  # a non_blocking copy overlaps only from pinned memory (pageable: CUDA stages it, CPU waits)
    host_chunks = [c.pin_memory() for c in host_chunks]
with torch.inference_mode():
    base_out = torch.cat(one_stream(tiny_dev, host_chunks, device))
    _ = cu.check_outputs(
        torch.cat(side_stream_prefetch(tiny_dev, host_chunks, device)),
        base_out,
        "fp32",
        label="side-stream prefetch vs one stream",
    )

# %% [markdown]
# ## On the CPU: overlap with a prefetching thread
# CPU work has no streams, but a second thread can prepare batch *i+1* (decode the JPEGs, resize, normalize)
# while the main thread computes batch *i*. Python threads overlap here because torch and the JPEG decoder
# release the GIL inside their C++ code. `cu.pipeline.Prefetcher` is such a thread with a bounded queue (a
# context manager, so the thread stops even if the loop fails).
#
# Overlap can hide at most the shorter stage, so we pick, from three models, the one whose compute time is
# closest to the preparation time here (both timed with one torch thread), and say which.

# %%
from course_utils.from_lessons.l09_data_pipeline import PhotoDataset  # lesson 09's data set, exported from its cell

ds = PhotoDataset(cu.data.jpeg_paths(), BATCH * N_BATCHES, SIZE)
raw_batches = [[ds.raw(b * BATCH + i) for i in range(BATCH)] for b in range(N_BATCHES)]


def prepare(raw: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([pipeline.preprocess(pipeline.decode_jpeg(r), SIZE) for r in raw])


resnet, note = cu.models.resnet("resnet18")
candidates = {
    "tiny_cnn": tiny,
    "mobilenet_v3_small": torchvision.models.mobilenet_v3_small().eval(),
    "resnet18": resnet,
}
prepared = [prepare(r) for r in raw_batches]
default_threads = torch.get_num_threads()
torch.set_num_threads(1)
try:
    with torch.inference_mode():  # the preparation and each model take turns in rounds (lesson 01)
        stage_cmp = cu.compare(
            {"prepare": lambda: prepare(raw_batches[0])}
            | {name: (lambda m=m: m(prepared[0])) for name, m in candidates.items()},
            baseline="prepare",
            device="cpu",
            warmup=1,
        )
finally:
    torch.set_num_threads(default_threads)
m_prep = stage_cmp.measurements["prepare"]
stage_rows = [{"model": name, "compute ms": stage_cmp.measurements[name].median_ms,
               "prepare / compute": str(stage_cmp.ratio(name))} for name in candidates]  # fmt: skip
stages = pd.DataFrame(stage_rows)
pick_name = min(candidates, key=lambda n: abs(np.log(stage_cmp.ratio(n).estimate)))
model = candidates[pick_name]
print(
    f"prepare: {m_prep.median_ms:.1f} ms per batch; compute model for the overlap run: {pick_name} "
    f"(closest to the preparation time here; {note})"
)


def compute(x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(x)


stages

# %% [markdown]
# Sequential, then overlapped, against the best case: for `n` batches no two-stage pipeline beats
# `prep + (n-1) * max(prep, compute) + compute` (`cu.pipeline.overlap_bound`). Both stages use torch's
# intra-op thread pool: with all threads each stage alone already tries to use every core, with one thread
# per stage each gets its own core. We measure both.

# %%
ref_out = [compute(prepare(r)) for r in raw_batches]
with pipeline.Prefetcher(raw_batches, prepare) as batches:
    ovl_out = [compute(x) for x in batches]
_ = cu.check_outputs(torch.cat(ovl_out), torch.cat(ref_out), "fp32", label="thread-prefetched vs sequential")

rows, timelines = [], {}
for threads in sorted({default_threads, 1}, reverse=True):
    torch.set_num_threads(threads)
    try:
        p = cu.measure(lambda: prepare(raw_batches[0]), device="cpu", label="prepare", **REPS).median_ms / 1000
        c = cu.measure(lambda: compute(prepared[0]), device="cpu", label="compute", **REPS).median_ms / 1000

        def sequential():
            t0 = time.perf_counter()
            for r in raw_batches:
                compute(prepare(r))
            return time.perf_counter() - t0

        def overlapped(threads=threads):
            tl = pipeline.Timeline()
            t0 = time.perf_counter()
            with pipeline.Prefetcher(raw_batches, tl.wrap("prepare (thread)", prepare)) as batches:
                for x in batches:
                    tl.wrap("compute (main)", compute)(x)
            timelines[threads] = tl  # the last run's timeline is plotted
            return time.perf_counter() - t0

        runs = cu.comparing.compare_runs(  # whole runs, taking turns in rounds: seconds, lower is better
            {"sequential": sequential, "overlapped": overlapped},
            baseline="sequential",
            rounds=cu.pick(full=6, smoke=3),
            higher_is_better=False,
            metric="s",
        )
    finally:
        torch.set_num_threads(default_threads)
    bound = pipeline.overlap_bound(p, c, N_BATCHES)
    gain = runs.ratio("overlapped")
    rows.append(
        {
            "torch threads": threads,
            "prepare ms": p * 1000,
            "compute ms": c * 1000,
            "sequential s": runs.measurements["sequential"].median_ms,  # compare_runs: the median of the runs (s)
            "overlapped s": runs.measurements["overlapped"].median_ms,
            "best case s": bound,
            "gain": gain.estimate,
            "low": gain.low,
            "high": gain.high,
            "r": gain,
        }
    )
res = pd.DataFrame(rows)
res.drop(columns="r")

# %%
for threads, tl in timelines.items():
    tl.plot(title=f"CPU pipeline with a prefetching thread, torch threads={threads}")
    both = tl.busy_overlap_s("prepare (thread)", "compute (main)")
    print(f"threads={threads}: both stages were busy at the same time for {both:.2f} s of the run")
for _, r in res.iterrows():
    beyond = r["overlapped s"] < 0.95 * r["best case s"]
    print(
        f"threads={int(r['torch threads'])}: {r['r'].says('overlapped', 'sequential')} (overlapped took "
        f"{r['overlapped s']:.2f} s; the stage times allow at best {r['best case s']:.2f} s)"
        + (
            ": more than the stages timed alone allow, so they did not run at their solo speed in one of the two "
            "runs (other programs on these cores); rerun before concluding."
            if beyond
            else "."
        )
    )
if len(res) > 1:
    r_all, r_one = res.iloc[0], res.iloc[-1]
    verdict = (
        "Overlap needs idle hardware: when each stage already fills every core, the other stage only competes."
        if r_one["r"].verdict == "faster" and r_all["r"].verdict != "faster"
        else "Here the thread count did not decide whether overlap paid."
    )
    print(
        f"With {os.cpu_count()} cores, overlapped vs sequential: {int(r_all['torch threads'])} threads per stage "
        f"{r_all['r']}, 1 thread per stage {r_one['r']}. {verdict}"
    )
best = res.loc[res["low"].idxmax()]  # the surest gain
cu.record(
    "10",
    "cpu prefetch thread (overlapped)",
    model=pick_name,
    device="cpu",
    dtype="fp32",
    batch_size=BATCH,
    median_ms=best["overlapped s"] * 1000 / N_BATCHES,
    speedup_vs_baseline=best["r"],
    notes=f"threads={int(best['torch threads'])}; best case {best['best case s']:.2f} s",
)
_ = cu.record(
    "10",
    "cpu sequential (baseline)",
    model=pick_name,
    device="cpu",
    dtype="fp32",
    batch_size=BATCH,
    median_ms=best["sequential s"] * 1000 / N_BATCHES,
    speedup_vs_baseline=1.0,
)

# %% [markdown]
# ## What surprised us
# Printed from this run: how much of the time that overlap can save at best the prefetching thread saved
# (medians of the runs above), and for how long the two stages were really busy at the same time.

# %%
for _, r in res.iterrows():
    t = int(r["torch threads"])
    possible = r["sequential s"] - r["best case s"]  # the most a two-stage overlap can save
    saved = r["sequential s"] - r["overlapped s"]
    together = timelines[t].busy_overlap_s("prepare (thread)", "compute (main)")
    bound_text = (
        f"overlap could save at most {possible:.2f} s of {r['sequential s']:.2f} s"
        if possible > 0
        else f"no bound: the stages timed alone give a bound of {r['best case s']:.2f} s, not below the sequential "
        f"runs' {r['sequential s']:.2f} s, so the load differed between those timings"
    )
    print(
        f"threads={t}: {bound_text}; the medians differ by {saved:.2f} s (overlapped vs sequential: {r['r']}); "
        f"both stages were busy together for {together:.2f} s of the last run."
        + (" Overlap lost time here: the stages competed for the same cores." if r["r"].verdict == "slower" else "")
    )

# %% [markdown]
# ## Exercise: the event-ordered double-buffer loop
# The side-stream prefetch allocates a new device tensor per chunk. A serving loop reuses **two preallocated
# device buffers** instead: while the model reads buffer `i % 2`, the next chunk is copied into the other one.
# Events order the two streams: compute *i* waits for the event recorded after copy *i*; copy *i+2* (same
# buffer) waits for the event recorded after compute *i* has used it; at the end the caller's stream waits for
# the compute stream. Two more rules from the prefetch above apply: the buffers are allocated on the caller's
# stream, so both side streams wait for the caller (`wait_stream`) before touching them; each output is
# allocated on the compute stream and read on the caller's, so it needs `record_stream` (only where the stream
# is not `torch.cpu`'s stand-in, as above). Write `double_buffered(model, chunks, device)` with
# `dm = torch.get_device_module(device)`, `dm.Stream()`, `dm.Event()`, `with dm.stream(s):`,
# `buf.copy_(chunk, non_blocking=True)`, `wait_event`, `wait_stream` and `record_stream`; return the outputs in
# order.
#
# The check draws a random case (chunks, shapes, model) and runs your loop on this CPU's stream stand-ins
# (outputs must match the model's) and through a recording device module that logs the stream of every copy,
# kernel, event and wait: it rejects a data race, caller memory used before waiting for the caller, a missing
# `record_stream`, one stream for both, anything but two reused buffers, a model call on anything but the
# buffer, `synchronize()` in place of events, and orderings under which nothing overlaps.


# %%
def double_buffered(model, chunks, device):
    raise NotImplementedError  # your code here


cu.exercises.check("10.double-buffer", double_buffered)

# %% [markdown]
# ## The double-buffered loop
# One solution, used by the GPU sections below and as the exercise's reference (`cu.exercises.show_solution`
# prints it; the cell is exported to `course_utils/from_lessons/l10_streams.py`). Besides the events: the buffers
# are allocated on the caller's stream, so both side streams first wait for it (`wait_stream`) before they touch
# them; and the outputs were allocated on the compute stream and are read on the caller's stream: `record_stream`
# again.


# %% tags=["contract", "export"]
import torch


def double_buffered_loop(model, chunks, device):
    """Copy into two reused device buffers on a copy stream; compute on a compute stream; events order them."""
    dm = torch.get_device_module(device)
    copy_s, comp_s, caller = dm.Stream(), dm.Stream(), dm.current_stream()
    bufs = [torch.empty_like(chunks[0], device=device) for _ in range(2)]  # allocated on the caller's stream
    # Both streams start after what the caller issued so far: the buffers' memory may still be in use by the
    # caller's earlier kernels (the allocator reuses freed blocks in the caller's stream order), and the model's
    # weights may just have been copied there.
    copy_s.wait_stream(caller)
    comp_s.wait_stream(caller)
    copied = [dm.Event() for _ in range(2)]  # recorded after the copy into buffer k
    freed = [dm.Event() for _ in range(2)]  # recorded after the compute that read buffer k
    outs = []
    for i, chunk in enumerate(chunks):
        k = i % 2
        with dm.stream(copy_s):
            if i >= 2:
                copy_s.wait_event(freed[k])  # compute i-2 is done with buffer k
            bufs[k].copy_(chunk, non_blocking=True)
            copied[k].record(copy_s)
        with dm.stream(comp_s):
            comp_s.wait_event(copied[k])  # copy i is done
            out = model(bufs[k])
            freed[k].record(comp_s)
        if not isinstance(caller, torch.cpu.Stream):
            out.record_stream(caller)  # allocated on comp_s, read on the caller's stream
        outs.append(out)
    caller.wait_stream(comp_s)
    return outs


# %%
with torch.inference_mode():
    _ = cu.check_outputs(
        torch.cat(double_buffered_loop(tiny_dev, host_chunks, device)),
        base_out,
        "fp32",
        label="double-buffered vs one stream",
    )

# %% [markdown]
# ## On a GPU: copies and compute on two streams
# **Verification level: contract-tested** (`tests/gpu_contract/test_l10_streams.py` runs `one_stream`,
# `side_stream_prefetch` and `double_buffered_loop` against a recording device module and checks ordering and
# `record_stream`); **not yet executed on a GPU** by the course, unless reference results appear instead.
#
# A GPU has copy engines separate from its compute units, so the copy of chunk *i+1* can run during the
# compute of chunk *i*, if the host memory is **pinned**, the copy is `non_blocking` on **another stream**, and
# events or `wait_stream` order the streams. The gain is largest when copy and compute take about the same
# time: first a sweep over models and batch sizes finds where they do on this GPU.

# %%
if cu.gpu_section("10.streams"):
    gpu_models = {"tiny_cnn": pipeline.tiny_cnn().cuda(), "resnet18": cu.models.resnet("resnet18", device="cuda")[0]}
    sweep = []
    with torch.inference_mode():
        for b in cu.pick(full=[16, 64, 256], smoke=[8]):
            host = torch.randn(b, 3, 224, 224).pin_memory()
            dbuf = torch.empty_like(host, device="cuda")
            copy = lambda d=dbuf, h=host: d.copy_(h, non_blocking=True)  # noqa: E731
            cc = cu.compare(  # the copy and each model's compute take turns in rounds
                {"copy": copy} | {name: (lambda gm=gm, d=dbuf: gm(d)) for name, gm in gpu_models.items()},
                baseline="copy",
                device="cuda",
            )
            for name in gpu_models:
                sweep.append(
                    {
                        "model": name,
                        "batch": b,
                        "copy ms": cc.measurements["copy"].median_ms,
                        "compute ms": cc.measurements[name].median_ms,
                        "copy / compute": cc.ratio(name).estimate,
                        "r": cc.ratio(name),
                    }
                )
    sweep = pd.DataFrame(sweep)
    display(sweep.drop(columns="r"))
    best_row = sweep.loc[np.log(sweep["copy / compute"]).abs().idxmin()]
    gname, gb = best_row["model"], int(best_row["batch"])
    print(f"Copy and compute are closest at {gname}, batch {gb} (copy vs compute time: {best_row['r']}).")
    gmodel = gpu_models[gname]
    n_chunks = cu.pick(full=12, smoke=4)
    chunks = [torch.randn(gb, 3, 224, 224).pin_memory() for _ in range(n_chunks)]
    variants = {
        "one stream": one_stream,
        "side-stream prefetch": side_stream_prefetch,
        "double buffered": double_buffered_loop,
    }
    with torch.inference_mode():
        ref_gpu = torch.cat(one_stream(gmodel, chunks, "cuda"))
        for vname, fn in variants.items():
            # Same model, same TF32 convolutions on every stream; cuDNN may still pick other algorithms per call.
            cu.check_outputs(torch.cat(fn(gmodel, chunks, "cuda")), ref_gpu, "tf32", label=f"{vname} vs one stream")
        stream_cmp = cu.compare(  # the three loops take turns in rounds
            {vname: (lambda fn=fn: fn(gmodel, chunks, "cuda")) for vname, fn in variants.items()},
            baseline="one stream",
            device="cuda",
            batch_size=gb * n_chunks,
        )
    gpu_res = (
        stream_cmp.table().set_index("variant").rename(columns={"median": "median ms", "ratio": "gain vs one stream"})
    )
    bound_ms = pipeline.overlap_bound(best_row["copy ms"], best_row["compute ms"], n_chunks)
    display(gpu_res.drop(columns="unit"))
    print(
        f"Best case for {n_chunks} chunks (max of copy and compute per chunk): {bound_ms:.2f} ms; one stream "
        f"took {gpu_res.loc['one stream', 'median ms']:.2f} ms, double buffered "
        f"{gpu_res.loc['double buffered', 'median ms']:.2f} ms.{cu.modes.standin_label()}"
    )
    for vname, r in gpu_res.iterrows():
        cu.record(
            "10",
            f"gpu {vname}",
            model=gname,
            device="cuda",
            dtype="fp32",
            batch_size=gb,
            median_ms=r["median ms"] / n_chunks,
            speedup_vs_baseline=stream_cmp.ratio(vname) if vname != "one stream" else 1.0,
            notes=f"{n_chunks} chunks; best case {bound_ms:.2f} ms",
        )

    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        double_buffered_loop(gmodel, chunks[:4], "cuda")
        torch.cuda.synchronize()
    trace = cu.results.results_dir() / "10_streams_trace.json"
    trace.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(trace))
    print(
        f"Timeline: {trace} (open it in https://ui.perfetto.dev): the 'Memcpy HtoD' rows of the copy stream "
        "should sit under the kernels of the compute stream."
    )
else:
    cu.results.show_reference("10", "gpu")

# %% [markdown]
# **The source tutorial's copy: `non_blocking=True` from ordinary memory.** It copies pageable tensors with
# `non_blocking=True` and expects them to overlap. From pageable memory the driver first stages the data
# through a pinned buffer of its own, and the call returns only when that is done. Measured below: how long
# the call keeps the CPU (host ms) and how long the copy takes on the device. Verification level: **unverified**
# (not contract-testable: it measures the driver; see `NOT_TESTABLE` in `tests/gpu_contract/test_l10_streams.py`).

# %%
if cu.gpu_section("10.pageable-copy"):
    mb = cu.pick(full=256, smoke=16)
    src = {"pageable": torch.randn(mb * 2**18), "pinned": torch.randn(mb * 2**18).pin_memory()}
    dst = torch.empty(mb * 2**18, device="cuda")
    copy_rows = []
    for kind, x in src.items():
        host_ms, dev_ms = [], []
        for _ in range(cu.pick(full=10, smoke=3)):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            dst.copy_(x, non_blocking=True)
            host_ms.append((time.perf_counter() - t0) * 1000)  # until the call returned
            end.record()
            end.synchronize()
            dev_ms.append(start.elapsed_time(end))
        copy_rows.append(
            {
                "host memory": kind,
                "call returned after ms": np.median(host_ms),
                "copy took ms (events)": np.median(dev_ms),
                "GiB/s": mb / 1024 / (np.median(dev_ms) / 1000),
            }
        )
    copies = pd.DataFrame(copy_rows).set_index("host memory")
    display(copies)
    pg, pn = copies.loc["pageable"], copies.loc["pinned"]
    print(
        f"From pageable memory the non_blocking call held the CPU {pg['call returned after ms']:.2f} ms of a "
        f"{pg['copy took ms (events)']:.2f} ms copy; from pinned memory {pn['call returned after ms']:.3f} ms of "
        f"{pn['copy took ms (events)']:.2f} ms. Only a call that returns early lets the CPU queue work meanwhile."
        + cu.modes.standin_label()
    )
    cu.record(
        "10",
        "gpu non_blocking copy from pageable memory",
        model="tensor",
        device="cuda",
        dtype="fp32",
        median_ms=pg["call returned after ms"],
        notes=f"{mb} MiB; device copy {pg['copy took ms (events)']:.2f} ms",
    )
else:
    cu.results.show_reference("10", "pageable")

# %% [markdown]
# **Compute next to compute.** Streams also let independent kernels run side by side, but only when each one
# leaves most of the GPU idle: a small kernel uses a few of the GPU's multiprocessors. Below, the same list of
# small matrix products runs on one stream, then split over two; and the same with large products, which
# fill the GPU alone. Verification level: **unverified** (not contract-testable: it measures the hardware
# scheduler).

# %%
if cu.gpu_section("10.concurrent-kernels"):
    conc_rows = []
    big = cu.pick(full=4096, smoke=512)  # a product that fills the GPU alone (smoke: small enough for a stand-in)
    for label, n in (("small (64x64)", 64), (f"large ({big}x{big})", big)):
        mats = [torch.randn(n, n, device="cuda") for _ in range(8)]
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        reps = cu.pick(full=200, smoke=10) if n == 64 else cu.pick(full=10, smoke=2)

        def on_one(mats=mats, reps=reps) -> None:
            for _ in range(reps):
                for a in mats:
                    a @ a

        def on_two(mats=mats, reps=reps, s1=s1, s2=s2) -> None:
            s1.wait_stream(torch.cuda.current_stream())
            s2.wait_stream(torch.cuda.current_stream())
            for _ in range(reps):
                for j, a in enumerate(mats):
                    with torch.cuda.stream(s1 if j % 2 else s2):
                        a @ a
            torch.cuda.current_stream().wait_stream(s1)
            torch.cuda.current_stream().wait_stream(s2)

        two = cu.compare({"one stream": on_one, "two streams": on_two}, baseline="one stream", device="cuda")
        conc_rows.append({"kernels": label, "one stream ms": two.measurements["one stream"].median_ms,
                          "two streams ms": two.measurements["two streams"].median_ms,
                          "gain": two.ratio("two streams")})  # fmt: skip
    conc = pd.DataFrame(conc_rows).set_index("kernels")
    display(conc.assign(gain=conc["gain"].map(str)))
    for label, r in conc.iterrows():
        print(f"{label}: {r['gain'].says('two streams', 'one')}{cu.modes.standin_label()}")
        cu.record(
            "10",
            f"gpu two compute streams, {label}",
            model="matmul",
            device="cuda",
            dtype="fp32",
            median_ms=r["two streams ms"],
            speedup_vs_baseline=r["gain"],
        )
else:
    cu.results.show_reference("10", "compute streams")

# %% [markdown]
# For a whole-system view (CPU threads, copies, kernels, NVTX ranges), Nsight Systems:
# `nsys profile -t cuda,nvtx,osrt -o streams python my_script.py`, then open the `.nsys-rep` file in the
# Nsight Systems GUI.
#
# ## Summary
# * A stream is an ordered queue; events (`record`, `wait_event`) and `wait_stream` order different streams
#   without stopping the CPU. Write the code against `torch.get_device_module(device)`: it runs on CPU too.
# * Overlap hides the shorter stage behind the longer one; the best case is the longer stage alone, and it
#   needs idle hardware: spare cores for a CPU thread, a copy engine and pinned memory for GPU copies.
# * Memory used on a stream other than the one it was allocated on needs `record_stream`, or the allocator
#   may reuse it too early; reused buffers need events so a copy never overwrites what a kernel still reads.
#
# Next: **11 · Memory**.
