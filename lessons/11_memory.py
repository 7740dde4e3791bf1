# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 11 · Memory
#
# **Goals.** Know where inference memory goes and measure it with PyTorch's own calls: **allocated vs
# reserved** (`torch.cuda.memory_allocated`, `memory_reserved`, `mem_get_info`, `memory_summary`), what
# `empty_cache()` does and does not do, the peak of one call (`reset_peak_memory_stats`,
# `max_memory_allocated`), `inference_mode` vs `no_grad` vs autograd left on, **peak memory vs batch size** and
# the largest batch that fits (predicted, then run), `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`, and
# fixed buffers for **CUDA graphs**. On this CPU the same questions are answered with the process's resident
# memory (RSS), measured here.
#
# **The bottleneck it attacks.** In the taxonomy of *01 · Measuring inference*: memory *capacity*. Peak memory
# decides the largest batch that fits, and the batch size decides throughput (lesson 03). Needless allocations
# also cost time (on a GPU, a `cudaMalloc` synchronizes the device).

# %%
import course_utils as cu

device = cu.lesson.start("11", "Memory")

# %%
import os
import subprocess
import sys
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import display
from torch.profiler import ProfilerActivity, profile

from course_utils.measuring import memory

SIZE = cu.pick(full=224, smoke=32)
BATCH = cu.pick(full=8, smoke=2)
REPS = dict(warmup=1, min_repeats=cu.pick(full=3, smoke=2), min_time_s=cu.pick(full=0.5, smoke=0.05))
model, note = cu.models.resnet("resnet18")
x = torch.randn(BATCH, 3, SIZE, SIZE)
print(f"ResNet-18 ({note}), batch {BATCH} at {SIZE}x{SIZE}; RSS now {memory.rss_mb():.0f} MiB")

# %% [markdown]
# ## Allocated vs reserved: the GPU's caching allocator
# `torch.cuda.memory_allocated()` counts the bytes of live tensors; `memory_reserved()` what the caching
# allocator holds from the driver. Freeing a tensor lowers allocated, not reserved: the block is kept for the
# next request (no `cudaMalloc` then). `torch.cuda.mem_get_info()` asks the driver what is free on the whole GPU
# (other processes included). `torch.cuda.empty_cache()` hands unused cached blocks back to the driver. It
# **does not** free live tensors (drop the references first), does not defragment, and makes nothing faster:
# the next allocation pays `cudaMalloc` again. It helps another process on the same GPU, and that is all.
# Verification level of the GPU sections of this lesson: **not yet executed on a GPU** by the course unless
# reference results appear instead; what each is checked by is named beside it.
#
# This section is **unverified** (not contract-testable: it reads the CUDA allocator's counters; `NOT_TESTABLE` in
# `tests/gpu_contract/test_l11_memory.py`).
#
# Timing the allocator: `torch.empty(..., device="cuda")` and `empty_cache()` are **host-side** calls: the
# caching allocator runs on the CPU, and `cudaMalloc`/`cudaFree` block the CPU (they may even wait for the
# device) without putting any work in a stream. CUDA events time work *in a stream*, so two events around an
# allocation measure an empty stretch of stream, not the call. Host-side calls are timed with `perf_counter`
# (after a `synchronize`, so queued device work does not land in the timing); events stay for device work.


# %% tags=["contract"]
def host_call_ms(fn, repeats: int) -> list[float]:
    """Wall time in ms of each of `repeats` host-side calls fn() (allocator, driver): perf_counter, not events."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()  # earlier device work must not be counted in this call
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return times


# %%
if cu.gpu_section("11.allocator"):
    MiB = 2**20
    steps = []

    def snap(step: str) -> None:
        free, total = torch.cuda.mem_get_info()
        steps.append(
            {
                "step": step,
                "allocated MiB": torch.cuda.memory_allocated() / MiB,
                "reserved MiB": torch.cuda.memory_reserved() / MiB,
                "free on GPU MiB": free / MiB,
            }
        )

    snap("start")
    t = torch.empty(cu.pick(full=2048, smoke=64), MiB, dtype=torch.uint8, device="cuda")
    snap("allocated a tensor")
    del t
    snap("del tensor")
    torch.cuda.empty_cache()
    snap("empty_cache()")
    display(pd.DataFrame(steps).set_index("step"))
    print(torch.cuda.memory_summary(abbreviated=True))

    nbytes = cu.pick(full=512, smoke=32) * MiB
    n_calls = cu.pick(full=20, smoke=5)
    torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # warm-up: the block is now in the cache
    warm = cu.timing.Measurement(
        host_call_ms(lambda: torch.empty(nbytes, dtype=torch.uint8, device="cuda"), n_calls),
        device="cuda",
        label="allocation from the cache (host time)",
    )

    def alloc_after_empty() -> None:
        torch.cuda.empty_cache()
        torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    cold = cu.timing.Measurement(
        host_call_ms(alloc_after_empty, n_calls), device="cuda", label="empty_cache() then allocation (host time)"
    )
    print(warm, cold, sep="\n")
    alloc_cmp = cu.compare(  # both, taking turns in rounds; device="cpu": host time, the allocator's own cost
        {"from the cache": lambda: torch.empty(nbytes, dtype=torch.uint8, device="cuda"),
         "after empty_cache": alloc_after_empty},
        baseline="from the cache",
        device="cpu",
    )  # fmt: skip
    slow = alloc_cmp.ratio("after empty_cache")
    print(f"{slow.says('an allocation after empty_cache', 'one from the cache')}{cu.modes.standin_label()}")
    cu.record(
        "11",
        "gpu alloc after empty_cache",
        model="tensor",
        device="cuda",
        measurement=cold,
        speedup_vs_baseline=slow,
    )
else:
    cu.results.show_reference("11", "empty_cache")

# %% [markdown]
# ## `inference_mode` vs `no_grad` vs autograd on
# With autograd on, every layer keeps the activations its backward pass would need, alive until the output is
# freed. `no_grad` and `inference_mode` free each activation once the next layer has used it;
# `inference_mode` also skips autograd's version counters and view tracking. Outputs first (fp32 tolerance),
# then time, then peak memory. On the CPU the peak is the rise of RSS during the call: glibc normally keeps
# freed blocks for reuse and hides it, so the peaks are taken inside `cu.memory.rss_follows_tensors()`, where
# every large block is mapped and unmapped on its own. That costs a page fault per allocation, which is why
# every timing of this lesson is taken outside such a block.


# %%
def forward(mode: str) -> torch.Tensor:
    ctx = {"grad": torch.enable_grad(), "no_grad": torch.no_grad(), "inference_mode": torch.inference_mode()}[mode]
    with ctx:
        return model(x)


outs = {mode: forward(mode).detach() for mode in ("grad", "no_grad", "inference_mode")}
for mode in ("grad", "no_grad"):
    cu.check_outputs(outs[mode], outs["inference_mode"], "fp32", label=f"{mode} vs inference_mode")
# the modes take turns in rounds (lesson 01), so a busy moment of the machine does not land on one mode only
mode_cmp = cu.compare(
    {mode: (lambda m=mode: forward(m)) for mode in outs},
    baseline="no_grad",
    device="cpu",
    batch_size=BATCH,
    warmup=REPS["warmup"],
    min_calls=1,
)
times = mode_cmp.measurements


def forward_and_drop(mode: str) -> None:
    forward(mode)  # the output is freed at once: the peak is what the call needed


with memory.rss_follows_tensors():
    peaks = {mode: memory.cpu_peak_mb(lambda m=mode: forward_and_drop(m))[0] for mode in outs}
modes = pd.DataFrame({"peak MiB (RSS)": peaks, "median ms": {k: v.median_ms for k, v in times.items()}})
for mode, m in times.items():
    cu.record(
        "11",
        f"resnet18 forward, {mode}",
        model="resnet18",
        device="cpu",
        dtype="fp32",
        measurement=m,
        notes=f"peak {peaks[mode]:.1f} MiB",
    )
modes

# %%
g, inf, ng = modes.loc["grad"], modes.loc["inference_mode"], modes.loc["no_grad"]
# "less" or "more" only beyond 10% and 1 MiB, what a peak varies by from run to run
mem = cu.intervals.memory_says("inference_mode", inf["peak MiB (RSS)"], "autograd on", g["peak MiB (RSS)"])
print(f"At batch {BATCH}: {mem}.")
im = mode_cmp.ratio("inference_mode")  # no_grad's time / inference_mode's: above 1, inference_mode is faster
why = {
    "faster": "inference_mode was faster: it skips autograd's per-op bookkeeping",
    "slower": "no_grad was faster, although inference_mode does strictly less work per op: other programs on these "
    "cores are the likely cause; rerun",
}.get(im.verdict, "no difference measurable here")
print(
    f"inference_mode took {inf['median ms']:.0f} ms per call, no_grad {ng['median ms']:.0f} ms; inference_mode vs "
    f"no_grad: {im}: {why}. "
    + (
        "Either way the bookkeeping is small next to a convolution; the memory saving above is what counts."
        if mem.verdict == "less"
        else "The bookkeeping is small next to a convolution, and at this batch the peaks did not differ either."
    )
)

# %% [markdown]
# On a GPU the peak of one call comes from the caching allocator itself: `reset_peak_memory_stats()`, run,
# `max_memory_allocated()` minus what was allocated before. For a timeline of every allocation:
# `torch.cuda.memory._record_memory_history()` and `_dump_snapshot(path)`, then drop the file on
# https://pytorch.org/memory_viz. This section is contract-tested: `tests/gpu_contract/test_l11_memory.py` runs
# `gpu_peak_mb` against a stand-in for the `torch.cuda` memory calls whose signatures are the real ones.


# %% tags=["contract"]
def gpu_peak_mb(fn) -> float:
    """Peak extra MiB allocated on the GPU while fn() ran (its inputs, allocated before, do not count)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def batch_peak_mb(model, make_input, b) -> float:
    """Peak MiB of one forward at batch `b` with its input batch included: the input is made inside the measured
    call, since a batch that fits must hold its input as well as its activations."""

    def run():
        x = make_input(b)
        with torch.inference_mode():
            model(x)

    return gpu_peak_mb(run)


# %%
if cu.gpu_section("11.gpu-peak"):
    gmodel, _ = cu.models.resnet("resnet50", device="cuda")
    gx = torch.randn(cu.pick(full=64, smoke=8), 3, 224, 224, device="cuda")
    gpu_modes = {}
    for mode in ("grad", "no_grad", "inference_mode"):
        ctx = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
        with ctx():
            gmodel(gx)  # warm-up (cuDNN workspaces)

        def grun(ctx=ctx) -> None:
            with ctx():
                gmodel(gx)

        gpu_modes[mode] = gpu_peak_mb(grun)
        cu.record(
            "11",
            f"gpu resnet50 peak, {mode}",
            model="resnet50",
            device="cuda",
            dtype="fp32",
            batch_size=gx.shape[0],
            notes=f"peak {gpu_modes[mode]:.0f} MiB",
        )
    print({k: f"{v:.0f} MiB" for k, v in gpu_modes.items()})
    snapshot = cu.results.results_dir() / "11_memory_snapshot.pickle"
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    with torch.inference_mode():
        gmodel(gx)
    torch.cuda.memory._dump_snapshot(str(snapshot))
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"Allocation timeline written to {snapshot}: open it at https://pytorch.org/memory_viz")
else:
    cu.results.show_reference("11", "peak")

# %% [markdown]
# ## Peak memory vs batch size, and the largest batch that fits
# Peak memory grows about linearly with the batch: a fixed part (workspace) plus a per-image part
# (activations). Fit the line, predict the largest batch under a budget, then **run that batch** and check
# the prediction.

# %%
batches = cu.pick(full=[1, 2, 4, 8, 16], smoke=[1, 2, 4])
make = lambda b: torch.randn(b, 3, SIZE, SIZE)  # noqa: E731
with memory.rss_follows_tensors():
    curves = {mode: memory.peak_vs_batch(model, make, batches, mode=mode) for mode in ("inference_mode", "grad")}
fits = {mode: np.polyfit(df["batch_size"], df["peak_mb"], 1) for mode, df in curves.items()}
fig, ax = plt.subplots()
for mode, df in curves.items():
    ax.plot(df["batch_size"], df["peak_mb"], marker="o", label=f"{mode} ({fits[mode][0]:.1f} MiB/image)")
ax.set_xlabel("batch size")
ax.set_ylabel("peak extra memory (MiB, RSS)")
ax.set_title(f"ResNet-18 forward at {SIZE}x{SIZE}: peak memory vs batch size")
ax.legend()
fig.tight_layout()
_ = cu.plots.save(fig, "11", "peak_vs_batch")
pd.concat({m: d.set_index("batch_size")["peak_mb"] for m, d in curves.items()}, axis=1)

# %%
budget_mb = cu.pick(full=256, smoke=64)
slope, icept = fits["inference_mode"]
# a line whose slope is not positive says the noise hid the per-image memory: no prediction from it
plausible = slope > 0
if not plausible:
    print(
        f"The fitted slope is {slope:.2f} MiB per image: memory cannot shrink as the batch grows, so the noise hid "
        f"the per-image part on batches {batches}. No prediction from this line; the largest measured batch is run."
    )
predicted = max(1, int((budget_mb - icept) // slope)) if plausible else max(batches)
tries, b = [], predicted
with memory.rss_follows_tensors():
    for _ in range(3):  # run the prediction; if it does not fit, scale it down by the measured overshoot
        peak = memory.peak_vs_batch(model, make, [b], mode="inference_mode")["peak_mb"].iloc[0]
        tries.append({"batch": b, "peak MiB": peak, "fits": peak <= budget_mb})
        if peak <= budget_mb:
            break
        b = max(1, int(b * budget_mb / peak))
tries = pd.DataFrame(tries)
display(tries)
first, last = tries.iloc[0], tries.iloc[-1]
# the line's own prediction of the peak at the batch it chose, against the peak measured there
line_check = (
    cu.intervals.prediction_says(f"peak at batch {predicted}", icept + slope * predicted, first["peak MiB"], unit="MiB")
    if plausible
    else cu.intervals.Finding("not judged", "no prediction (the fitted slope was not positive)")
)
if not first["fits"]:  # whether the line held there is line_check's verdict
    verdict = "OVER the budget: " + {
        "held": "the line held within its tolerance, and that tolerance is no margin: leave one below the budget",
        "not judged": "even the largest measured batch",
    }.get(
        line_check.verdict, "a line fitted on small batches does not hold that far; leave a margin or measure near it"
    )
else:  # it ran under the budget; whether the line's prediction of its peak held is line_check's verdict
    verdict = {
        "held": "it fits, and the line held",
        "not judged": "it fits (no line to check)",
    }.get(
        line_check.verdict,
        "it fits, but the line was wrong there: the largest batch that fits may be far from this one",
    )
fitted = f" Largest batch checked to fit: {int(last['batch'])}." if last["fits"] else ""
print(
    f"Fitted on batches {batches}: {slope:.1f} MiB per image plus {icept:.0f} MiB; a {budget_mb} MiB budget "
    f"predicts batch {predicted}; run, it peaked at {first['peak MiB']:.0f} MiB: {verdict}. {line_check}.{fitted}"
)
cu.record(
    "11",
    "largest batch under a memory budget (checked by running it)",
    model="resnet18",
    device="cpu",
    dtype="fp32",
    batch_size=int(last["batch"]),
    notes=f"budget {budget_mb} MiB; predicted {predicted}; peak {last['peak MiB']:.0f} MiB",
)

# %% [markdown]
# On a GPU the budget is what the driver reports free (`mem_get_info`), less a margin for other work; the peak
# comes from `gpu_peak_mb`, and a batch that does not fit raises `torch.OutOfMemoryError` (lesson 03 handles it).
# Verification level: contract-tested through `gpu_peak_mb` (`tests/gpu_contract/test_l11_memory.py`).

# %%
if cu.gpu_section("11.max-batch"):
    free_b, _ = torch.cuda.mem_get_info()
    gbudget = min(free_b / 2**20 * 0.5, cu.pick(full=8192, smoke=512))
    gb = cu.pick(full=[8, 16, 32, 64], smoke=[2, 4])

    def make_batch(b):
        return torch.randn(b, 3, 224, 224, device="cuda")

    gpeaks = [batch_peak_mb(gmodel, make_batch, b) for b in gb]  # input batch included
    gslope, gicept = np.polyfit(gb, gpeaks, 1)
    if gslope <= 0:  # noise hid the per-image memory: no prediction from this line
        print(f"peak vs batch fitted {gslope:.2f} MiB per image on {gb}: no prediction; the largest measured runs")
    gpred = bb = max(1, int((gbudget - gicept) // gslope)) if gslope > 0 else max(gb)
    for _ in range(3):  # run it; scale down by the overshoot if it does not fit
        gpeak = batch_peak_mb(gmodel, make_batch, bb)
        print(f"batch {bb}: peak {gpeak:.0f} MiB ({'fits' if gpeak <= gbudget else 'OVER'} a {gbudget:.0f} MiB budget)")
        if gpeak <= gbudget:
            break
        bb = max(1, int(bb * gbudget / gpeak))
    print(
        f"ResNet-50 on {torch.cuda.get_device_name()}: {gslope:.1f} MiB per image, input included; predicted batch "
        f"{gpred}, checked {bb} (peak {gpeak:.0f} MiB)."
    )
    cu.record(
        "11",
        "gpu largest batch under a memory budget",
        model="resnet50",
        device="cuda",
        dtype="fp32",
        batch_size=bb,
        notes=f"budget {gbudget:.0f} MiB; predicted {gpred}; peak {gpeak:.0f} MiB",
    )
else:
    cu.results.show_reference("11", "largest batch")

# %% [markdown]
# ## Fragmentation: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`
# The caching allocator reserves memory in segments. When batch shapes vary, freed blocks of one size may not
# fit the next request, so reserved memory grows beyond what is allocated (fragmentation), and a large batch can
# fail with plenty reserved. With `expandable_segments:True` a segment grows in place instead. The variable is
# read when CUDA starts, so each setting runs in a fresh process below, with the same varying batches; printed:
# peak allocated and peak reserved. Verification level: **unverified** (not contract-testable: it measures the
# allocator's behaviour).

# %%
FRAG_SCRIPT = """
import torch
torch.manual_seed(0)
keep = []
for step in range(60):
    n = int(torch.randint(1, 64, ()).item())
    keep.append(torch.empty(n * 2**20, dtype=torch.uint8, device="cuda"))
    if len(keep) > 8:
        keep.pop(int(torch.randint(0, len(keep), ()).item()))
print(torch.cuda.max_memory_allocated() / 2**20, torch.cuda.max_memory_reserved() / 2**20)
"""
if cu.gpu_section("11.expandable-segments"):
    frag_rows = []
    for conf in ("", "expandable_segments:True"):
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf}
        out = subprocess.run([sys.executable, "-c", FRAG_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise RuntimeError(f"fragmentation script failed: {out.stderr[-500:]}")
        alloc_mb, reserved_mb = map(float, out.stdout.split())
        frag_rows.append(
            {
                "PYTORCH_CUDA_ALLOC_CONF": conf or "(default)",
                "peak allocated MiB": alloc_mb,
                "peak reserved MiB": reserved_mb,
                "reserved / allocated": reserved_mb / alloc_mb,
            }
        )
    frag = pd.DataFrame(frag_rows).set_index("PYTORCH_CUDA_ALLOC_CONF")
    display(frag)
    cu.record(
        "11",
        "gpu expandable_segments reserved/allocated",
        model="tensors",
        device="cuda",
        notes=f"default {frag['reserved / allocated'].iloc[0]:.2f}, "
        f"expandable {frag['reserved / allocated'].iloc[1]:.2f}",
    )
else:
    cu.results.show_reference("11", "expandable")

# %% [markdown]
# ## Fixed buffers, and what they do not save
# A serving loop can copy each batch into one preallocated input (`static_in.copy_(x)`) instead of making new
# tensors. In eager mode that saves the input and little else: every layer still allocates its activation on
# every call. Counted with the profiler's memory events (`profile_memory=True`), plain vs fixed input:

# %%
static_in = torch.empty_like(x)


def plain_call() -> torch.Tensor:
    with torch.inference_mode():
        return model(x.clone())  # a new input tensor, as when a request arrives


def static_call() -> torch.Tensor:
    static_in.copy_(x)
    with torch.inference_mode():
        return model(static_in)


alloc_rows = []
for name, fn in (("new input each call", plain_call), ("fixed input buffer", static_call)):
    fn()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    allocs = [e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0]
    alloc_rows.append({"call": name, "allocations": len(allocs), "MiB allocated": sum(allocs) / 2**20})
allocs_df = pd.DataFrame(alloc_rows).set_index("call")
display(allocs_df)
print(
    f"With a fixed input buffer, one eager call still made {allocs_df['allocations'].iloc[1]} allocations "
    f"({allocs_df['MiB allocated'].iloc[1]:.1f} MiB) vs {allocs_df['allocations'].iloc[0]} "
    f"({allocs_df['MiB allocated'].iloc[0]:.1f} MiB). The activations are allocated either way: only a CUDA graph "
    "(its memory pool is set at capture; a replay allocates nothing) or compiled code with planned buffers "
    "removes them."
)

# %% [markdown]
# ## What surprised us
# Printed from this run: where the memory went and where the time did not, whether a straight line fitted on
# small batches held at the batch it predicted, and how much a fixed input buffer saves in eager mode.

# %%
print(
    f"1. Memory at batch {BATCH}: {mem}. Time, inference_mode vs no_grad: {im}. "
    + (
        "The memory is the reason to turn autograd off, not the speed."
        if mem.verdict == "less" and im.verdict != "faster"
        else "Both favour inference_mode here."
        if mem.verdict == "less"
        else "inference_mode peaked higher, which its design (it keeps less) does not explain: other programs "
        "disturbed the RSS peak; rerun."
        if mem.verdict == "more"
        else "Neither memory nor time told the modes apart on this run: at this batch the activations autograd "
        "keeps are small beside what every mode needs; they grow with the batch (the peak-vs-batch curves above)."
        if im.verdict != "faster"
        else "Here the time, not the memory, told the modes apart."
    )
)
over = first["peak MiB"] - budget_mb
print(
    (
        f"2. The line fitted on batches {batches} predicted batch {predicted} for {budget_mb} MiB; run, it "
        if plausible
        else f"2. The line fitted on batches {batches} had no positive slope: batch {predicted}, the largest measured, "
        f"was run against {budget_mb} MiB; it "
    )
    + (f"stayed {-over:.0f} MiB under the budget" if first["fits"] else f"went {over:.0f} MiB over it")
    + f"; {line_check}."
)
fixed, fresh = allocs_df.loc["fixed input buffer"], allocs_df.loc["new input each call"]
print(
    f"3. A fixed input buffer removed {int(fresh['allocations'] - fixed['allocations'])} of "
    f"{int(fresh['allocations'])} allocations per eager call ({fresh['MiB allocated'] - fixed['MiB allocated']:.3g} "
    f"of {fresh['MiB allocated']:.3g} MiB): the activations are allocated anyway."
)

# %% [markdown]
# ## Exercise: a CUDA-graph runner with a CPU fallback
# A captured CUDA graph replays fixed kernels on fixed addresses: new data must be `copy_`'d into the captured
# input before each replay, and the output is overwritten by the next replay. Write
# `make_graph_runner(model, example)` returning `run(x)`. On CUDA (`example.is_cuda`): clone `example` as the
# static input, warm the model up a few times on a side stream, capture `static_out = model(static_in)` inside
# `torch.cuda.graph(g)` (a `torch.cuda.CUDAGraph()`, under `inference_mode`); `run` checks the shape
# (`ValueError` if it differs), copies `x` in, replays, returns a clone. Elsewhere: the same fixed input
# buffer, run eagerly under `inference_mode`.
#
# The check draws a random model and batch, and runs your runner on this machine's CPU path (and its CUDA
# path where a GPU exists), watching the operators that run (a dispatch mode, not a wrapper): outputs must
# match `model(x)`, kept results must not change, a wrong shape must raise; on the CPU the model's convolution
# must run once per call, on one fixed buffer; on CUDA no convolution may be dispatched after capture (a replay
# launches recorded kernels). `torch.jit.trace` is no graph (a traced module dispatches every operator again)
# and `torch.compile` would capture for you: both are refused.


# %%
def make_graph_runner(model, example):
    raise NotImplementedError  # your code here


cu.exercises.check("11.graph-runner", make_graph_runner)

# %% [markdown]
# ## On a GPU: CUDA graph on fixed buffers vs eager
# One runner (the CUDA half of the exercise's solution, which imports it from this cell's export), then eager
# and replay timed the same way, both under `inference_mode` (eager with autograd on would keep every activation
# and do autograd's bookkeeping: an unfair baseline).
# Memory allocated before and after a batch of replays shows that replay allocates nothing. This section is
# contract-tested: `tests/gpu_contract/test_l11_memory.py` runs `capture_runner` against a stand-in for the
# `torch.cuda` graph and stream calls whose signatures are the real ones, and replays the captured operations.


# %% tags=["contract", "export"]
import torch


def capture_runner(model, example):
    """Capture model(static_in) in a CUDA graph; run(x) copies x in, replays and returns a clone of the output."""
    static_in = example.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(3):
            model(static_in)  # warm-up outside the capture (cuDNN algorithms, allocator)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        static_out = model(static_in)

    def run(x):
        if x.shape != static_in.shape:
            raise ValueError(f"captured for {tuple(static_in.shape)}, got {tuple(x.shape)}")
        static_in.copy_(x)
        graph.replay()
        return static_out.clone()

    return run


# %%
if cu.gpu_section("11.cuda-graph-static"):
    gm, _ = cu.models.resnet("resnet18", device="cuda")
    gb1 = torch.randn(cu.pick(full=8, smoke=2), 3, 224, 224, device="cuda")
    run = capture_runner(gm, gb1)
    new, newer = torch.randn_like(gb1), torch.randn_like(gb1)
    with torch.inference_mode():
        # tf32 tolerance: cuDNN convolutions use TF32 by default and may pick other algorithms inside the graph.
        first, second = run(new), run(newer)  # the first result must survive the second replay
        cu.check_outputs(first, gm(new), "tf32", label="CUDA graph replay vs eager (the earlier call)")
        cu.check_outputs(second, gm(newer), "tf32", label="CUDA graph replay vs eager")

    def eager_call():
        with torch.inference_mode():
            gm(gb1)

    graph_cmp = cu.compare(  # eager and the replay take turns in rounds
        {"eager (inference_mode)": eager_call, "graph replay + clone": lambda: run(gb1)},
        baseline="eager (inference_mode)",
        device="cuda",
        batch_size=gb1.shape[0],
    )
    m_eager, m_graph = graph_cmp.measurements["eager (inference_mode)"], graph_cmp.measurements["graph replay + clone"]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    kept = [run(gb1) for _ in range(10)]
    torch.cuda.synchronize()
    grown = (torch.cuda.memory_allocated() - before) / 2**20
    print(m_eager, m_graph, sep="\n")
    print(
        f"{graph_cmp.ratio('graph replay + clone').says('Graph replay', 'eager')}. Ten replays grew "
        f"allocated memory by {grown:.2f} MiB: the ten clones kept ({kept[0].nbytes * 10 / 2**20:.2f} MiB); the "
        "activations live in the graph's own pool." + cu.modes.standin_label()
    )
    cu.record(
        "11",
        "gpu cuda graph on static buffers",
        model="resnet18",
        device="cuda",
        dtype="fp32",
        measurement=m_graph,
        speedup_vs_baseline=graph_cmp.ratio("graph replay + clone"),
    )
else:
    cu.results.show_reference("11", "graph")

# %% [markdown]
# ## Summary
# * Allocated (live) vs reserved (kept by the allocator): freeing lowers the first, not the second;
#   `empty_cache` gives cached memory back to the driver, frees nothing still referenced and speeds nothing up.
# * Run inference under `torch.inference_mode()`: autograd left on keeps every activation alive.
# * Peak memory grows linearly with the batch: measure the slope, predict the batch for a budget, then run it.
# * Varying shapes fragment the cache: `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.
# * Fixed input buffers alone save little in eager mode; with a CUDA graph, fixed addresses let a replay
#   run every kernel without allocating.
#
# Next: **12 · Pruning and distillation**.

# %%
_ = cu.record(
    "11",
    "peak memory per image (inference_mode)",
    model="resnet18",
    device="cpu",
    dtype="fp32",
    notes=f"{fits['inference_mode'][0]:.2f} MiB/image at {SIZE}px; grad {fits['grad'][0]:.2f}",
)
