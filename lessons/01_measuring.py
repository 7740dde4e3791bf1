# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 01 · Measuring inference
#
# **Goals.**
# 1. See, with numbers from this run, how quick timing goes wrong: a cold first call, the thread count, a
#    benchmark tool's single-thread default, and on a GPU the missing synchronization.
# 2. Write the correct timer yourself (about a dozen lines: `perf_counter`, `synchronize`, warm-up, CUDA
#    events, median and percentiles). `cu.measure`, which every later lesson uses, is that timer.
# 3. Tell per-call latency from pipelined throughput (many launches, one synchronization).
# 4. Learn the **bottleneck taxonomy** every later lesson links back to, by placing micro-benchmarks on a
#    roofline whose roofs come from the hardware's spec sheet, beside the peaks measured here.

# %%
import os
import re
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import psutil
import torch
from IPython.display import display
from torch.utils import benchmark

import course_utils as cu

device = cu.lesson.start("01", "Measuring inference")
threads = torch.get_num_threads()

# %% [markdown]
# ## The bottleneck taxonomy
# A model's time goes to one of a few limits. Each later lesson attacks one of them:
#
# | bottleneck | limited by | sign in a measurement | attacked in |
# |---|---|---|---|
# | **compute-bound** | arithmetic units (FLOP/s) | near the compute roof | 04, 05, 08, 12 |
# | **memory-bound** | memory bandwidth (bytes/s) | near the bandwidth roof | 04, 06/07/08 (fusion), 11 |
# | **overhead-bound** (launch, Python, framework) | per-op fixed cost | time barely depends on size | 03, 06 |
# | **transfer-bound** | host↔device copies | time tracks bytes copied across the bus | 09, 10 |
# | **input-bound** | data loading and preprocessing | the device waits for the next batch | 09, 10 |
#
# Before optimizing anything, find out which one you are in: that is what this lesson measures.

# %% [markdown]
# ## 1. What not to do: one cold call and `time.time()`
# The workload is a chain of two matrix products. The naive way is what many tutorials print: one call,
# `time.time()` before and after, no warm-up, no synchronization. Here the single call also runs on inputs
# of a shape nothing has used yet.

# %%
n = cu.pick(full=1024, smoke=256)
a = torch.randn(n, n, device=device)
b = torch.randn(n, n, device=device)


def work():
    return torch.relu(a @ b) @ b


t0 = time.time()  # what not to do: wall clock, one call, no warm-up, no synchronize
work()
naive_ms = (time.time() - t0) * 1000
print(f"naive single call: {naive_ms:.3f} ms")

# %% [markdown]
# ## 2. Warm-up: first calls are different
# The first calls of something new pay one-off costs: memory is allocated and touched for the first time,
# libraries choose and prepare kernels for a new shape, a compiled function compiles. Below, two genuinely
# cold things, each timed call by call: a **fresh module** on a **shape never seen before**, and (full size
# only: it takes seconds) a **`torch.compile`d function**'s first calls.

# %%
sync = torch.get_device_module(device).synchronize  # torch.cuda.synchronize on a GPU; a no-op on the CPU


def first_calls(fn, k=5):
    out = []
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1000)
    return out


cold = {}
with torch.inference_mode():
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3)).to(device)
    x_new = torch.randn(2, 3, 45, 45, device=device)  # a shape no kernel here has run yet
    cold["fresh conv module, new shape"] = first_calls(lambda: conv(x_new))
if cu.pick(full=True, smoke=False):
    compiled = torch.compile(lambda t: torch.relu(t @ t) + 1)
    t_in = torch.randn(64, 64, device=device)
    cold["torch.compile'd function"] = first_calls(lambda: compiled(t_in), k=4)
else:
    print("Smoke mode: the torch.compile example is skipped (its first call takes seconds).")
cold_table = pd.DataFrame({k: pd.Series(v) for k, v in cold.items()}).rename_axis("call").round(3)
display(cold_table)
for name, times in cold.items():  # a one-off cost happens once: two numbers, not a ratio with an interval
    extra = times[0] - times[-1]
    print(
        f"{name}: first call {times[0]:.2f} ms, last {times[-1]:.2f} ms "
        + (f"({extra:.2f} ms one-off)" if extra > 0 else "(no one-off cost seen: single calls, moved by the load)")
    )

# %% [markdown]
# A compiled function's first call includes tracing and code generation. Inductor keeps an on-disk cache,
# so on a second run of this notebook the "cold" call is faster: it loads the cached code instead (set
# `TORCHINDUCTOR_FORCE_DISABLE_CACHES=1` to see a truly cold compile).

# %% [markdown]
# ## 3. The correct timer, written out
# Five rules, each a line or two:
# 1. **warm up**: call the function a few times before timing;
# 2. **synchronize** before timing starts, so work queued earlier does not land in the first call;
# 3. **time each call and wait for it**: on a GPU, `torch.cuda.Event(enable_timing=True)` records a
#    timestamp on the device's own queue and `elapsed_time` reads the gap; on the CPU `time.perf_counter()`
#    around the call, after `synchronize`;
# 4. **repeat** many times;
# 5. report the **median** and the spread (percentiles), not the mean of a few calls.
#
# `torch.get_device_module(device)` gives `torch.cuda` on a GPU and `torch.cpu` on the CPU, so one timer
# serves both (`torch.cpu.synchronize()` does nothing: CPU work is finished when the call returns).


# %% tags=["contract"]
def time_calls(fn, device, warmup=5, repeats=50):
    """Per-call times (ms) of fn() on device: warm-up, synchronize, CUDA events on a GPU, perf_counter elsewhere."""
    dev = torch.device(device)
    mod = torch.get_device_module(dev)  # torch.cuda or torch.cpu: the same synchronize() call
    for _ in range(warmup):  # 1. warm-up: one-off costs stay out of the numbers
        fn()
    mod.synchronize()  # 2. start from an empty queue
    times = []
    for _ in range(repeats):  # 4. many calls
        if dev.type == "cuda":  # 3. time on the GPU's own clock
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()  # wait until the GPU reached `end`
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            mod.synchronize()
            times.append((time.perf_counter() - t0) * 1000)
    return times


def summarize(times):
    """5. median and spread of per-call times (ms)."""
    p10, p50, p90 = np.percentile(times, [10, 50, 90])
    return {"median_ms": p50, "p10_ms": p10, "p90_ms": p90, "n": len(times)}


# %%
mine = summarize(time_calls(work, device, repeats=cu.pick(full=50, smoke=10)))
print(
    f"time_calls: median {mine['median_ms']:.3f} ms (p10 {mine['p10_ms']:.3f}, p90 {mine['p90_ms']:.3f}, n={mine['n']})"
)
inside = mine["p10_ms"] <= naive_ms <= mine["p90_ms"]
print(
    f"The naive single call said {naive_ms:.3f} ms; the median of {mine['n']} warm calls is "
    f"{mine['median_ms']:.3f} ms: "
    f"the cold call {'happens to lie inside' if inside else 'lies outside'} the p10-p90 range of the warm ones."
)

# %% [markdown]
# **`cu.measure` is this timer.** It adds two conveniences: it repeats until a minimum time has passed (so
# short workloads get many calls), and it returns a `Measurement` with the median, p10/p90/p99, IQR and
# items/s. Every later lesson times with it. Here both on the same workload:

# %%
good = cu.measure(work, device=device, label="cu.measure")
print(good)
# the two timers take turns (6 rounds, random order each round): the ratio of their medians with its interval
timers = cu.comparing.compare_runs(
    {
        "cu.measure": lambda: (
            cu.measure(work, device=device, min_time_s=cu.pick(full=0.3, smoke=0.05), warn_spread=False).median_ms
        ),
        "time_calls": lambda: summarize(time_calls(work, device, repeats=cu.pick(full=50, smoke=10)))["median_ms"],
    },
    baseline="cu.measure",
    rounds=6,
    higher_is_better=False,
    metric="median ms",
    device=device,
)
print(f"time_calls vs cu.measure, 6 interleaved rounds: {timers.ratio('time_calls')}")

# %% [markdown]
# ### The thread count matters on a CPU
# PyTorch uses all cores by default. The same workload with one thread is a different measurement: always
# report the thread count with a CPU number.


# %%
def at_threads(t):
    """work() on t threads: torch.set_num_threads before the call when the count differs."""

    def fn():
        if torch.get_num_threads() != t:
            torch.set_num_threads(t)
        return work()

    return fn


if threads > 1:  # both counts take turns in rounds, so a change of load hits both alike
    by_threads = cu.compare(
        {"1 thread": at_threads(1), f"{threads} threads": at_threads(threads)}, baseline="1 thread", device=device
    )
    torch.set_num_threads(threads)
    display(by_threads.table().round(3))
    print(f"{threads} threads vs 1 thread on this workload: {by_threads.ratio(f'{threads} threads')}")
else:
    print("This machine has a single thread: no difference to show.")

# %% [markdown]
# ### `torch.utils.benchmark` is single-threaded unless told otherwise
# `torch.utils.benchmark.Timer` warms up, synchronizes and reports the median and IQR, but its `num_threads`
# defaults to **1**. Compared with a model running on all cores, that is the wrong baseline: pass
# `num_threads`.

# %%
run_time = cu.pick(full=1.0, smoke=0.1)
bench_default = benchmark.Timer(stmt="work()", globals={"work": work}).blocked_autorange(min_run_time=run_time)
bench_threads = benchmark.Timer(stmt="work()", globals={"work": work}, num_threads=threads).blocked_autorange(
    min_run_time=run_time
)
print(f"torch.utils.benchmark, default num_threads=1 : {bench_default.median * 1000:.3f} ms")
print(f"torch.utils.benchmark, num_threads={threads}          : {bench_threads.median * 1000:.3f} ms")
print(f"cu.measure ({threads} threads)                       : {good.median_ms:.3f} ms")
print(
    "(one measurement each, taken at different moments (cu.measure's above): the machine's load moves them "
    "between timings, so these three numbers are not a comparison; the interleaved rounds below are)"
)


def timer_rounds(t):
    """The three timers on work() at t threads, taking turns for 6 rounds (ratios: the benchmark's time over theirs)."""
    rt = cu.pick(full=0.3, smoke=0.05)
    bench = lambda n: benchmark.Timer(stmt="work()", globals={"work": work}, num_threads=n)  # noqa: E731
    variants = {
        "torch.utils.benchmark": lambda: bench(t).blocked_autorange(min_run_time=rt).median * 1000,
        "cu.measure": lambda: cu.measure(work, device=device, min_time_s=rt, warn_spread=False).median_ms,
    }
    if t != 1:
        variants["torch.utils.benchmark, default num_threads"] = lambda: (
            bench(1).blocked_autorange(min_run_time=rt).median * 1000
        )
    torch.set_num_threads(t)
    try:
        return cu.comparing.compare_runs(
            variants, baseline="torch.utils.benchmark", rounds=6, higher_is_better=False, metric="median ms"
        )
    finally:
        torch.set_num_threads(threads)


timer_cmp = timer_rounds(threads)
agreement = timer_cmp.ratio("cu.measure")  # > 1: cu.measure reads less time than the benchmark
print(
    f"cu.measure vs torch.utils.benchmark at {threads} threads, 6 interleaved rounds: {agreement}; course target "
    f"within 10%: {agreement.judge_within(0.9, 1.1)}"
)
if threads != 1:
    print(
        f"benchmark's default num_threads=1 vs num_threads={threads}: "
        f"{timer_cmp.ratio('torch.utils.benchmark, default num_threads')}"
    )

# %% [markdown]
# The two tools summarize differently. `cu.measure` times **every call** and reports the median call;
# `torch.utils.benchmark` times **blocks** of many calls and reports the median of the block averages, so a
# slow call (the OS or another program took a core) raises every block it lands in. When calls are steady
# they agree; when they are not, the benchmark's number sits nearer `cu.measure`'s *mean*. The check below
# repeats the comparison on one thread, where a 2-core machine keeps a core for everything else.

# %%
one_cmp = timer_rounds(1)
agreement_1t = one_cmp.ratio("cu.measure")
one_measure = one_cmp.measurements["cu.measure"]  # for compare_runs: the 6 rounds' medians (ms)
print(
    f"1 thread: cu.measure median {one_measure.median_ms:.3f} ms over 6 rounds (round-to-round spread "
    f"{one_measure.spread:.1%}), torch.utils.benchmark {one_cmp.measurements['torch.utils.benchmark'].median_ms:.3f} "
    f"ms: {agreement_1t}"
)
pairs = [(f"{threads} threads", agreement), ("1 thread", agreement_1t)] if threads > 1 else [("1 thread", agreement_1t)]
for label, r in pairs:
    print(f"{label}: are the two timers within 10% of each other here? {r.judge_within(0.9, 1.1)}")

# %% [markdown]
# ## 4. Latency per call vs throughput of a stream of calls
# A timer that synchronizes after every call measures **latency**: what one request waits. A GPU (and
# anything else that queues work) can accept the next launch while the previous one still runs, so **many
# launches followed by one synchronization** measure **throughput**: the rate at which work gets done when
# the queue never runs dry. On a GPU the second is shorter per call for small work (launch overhead is
# hidden behind the running kernel); on a CPU every call finishes before it returns, so the two should agree.

# %%
small = torch.randn(cu.pick(full=256, smoke=128), cu.pick(full=256, smoke=128), device=device)
calls = cu.pick(full=200, smoke=40)


def small_op():
    return small @ small


per_call = summarize(time_calls(small_op, device, repeats=calls))["median_ms"]
for _ in range(5):
    small_op()
sync()
t0 = time.perf_counter()
for _ in range(calls):  # many launches ...
    small_op()
sync()  # ... one synchronization
pipelined = (time.perf_counter() - t0) * 1000 / calls
print(f"{device}: per call, synchronized each time: {per_call:.4f} ms; pipelined ({calls} calls, one sync): "
      f"{pipelined:.4f} ms per call.")  # fmt: skip

# The same two ways, taking turns in rounds: 10 launches with a synchronize after each, or one after all ten.
k = 10


def synced_each():
    for _ in range(k):
        small_op()
        sync()


def one_sync_at_end():
    for _ in range(k):
        small_op()  # cu.compare synchronizes once after the call


lat_cmp = cu.compare(
    {"synchronized each call": synced_each, "pipelined (one sync)": one_sync_at_end},
    baseline="synchronized each call",
    device=device,
)
pipe = lat_cmp.ratio("pipelined (one sync)")
print(f"pipelined vs synchronized per call, in rounds: {pipe}")
if pipe.verdict == "faster":
    print("Pipelined calls were cheaper: work was queued while earlier work ran.")
elif pipe.verdict == "slower":
    print("Pipelined calls were dearer: on a CPU, where synchronize does nothing, that is the machine's noise.")
else:
    print("No difference beyond this machine's noise: nothing was queued ahead, so latency and throughput agree.")

# %% [markdown]
# ### On a GPU: the missing synchronization
# CUDA calls return as soon as the work is *queued*. `time.perf_counter()` around a launch without
# `synchronize` measures the launch. The cell below shows it on a large matrix product, then times it with
# the `time_calls` written above (CUDA events).
# *Verification: contract-tested (`tests/gpu_contract/test_l01_timer.py` runs `time_calls` down its CUDA branch
# against the real `torch.cuda.Event` interface); not yet executed on a GPU.*

# %%
if cu.gpu_section("01.gpu-sync"):
    n_gpu = cu.pick(full=4096, smoke=512)  # smoke: small enough for the CPU rehearsal (COURSE_REHEARSE=1)
    ag = torch.randn(n_gpu, n_gpu, device="cuda")
    for _ in range(3):
        ag @ ag
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ag @ ag  # no synchronize: measures the launch only
    launch_ms = (time.perf_counter() - t0) * 1000
    torch.cuda.synchronize()
    gpu_good = summarize(time_calls(lambda: ag @ ag, "cuda"))
    print(f"without synchronize: {launch_ms:.3f} ms; with CUDA events: {gpu_good['median_ms']:.3f} ms")
    print(f"The unsynchronized timer saw {launch_ms:.3f} ms of the {gpu_good['median_ms']:.3f} ms the work took.")
    cu.record(
        "01",
        "unsynchronized timer (wrong)",
        model=f"matmul{n_gpu}",
        device="cuda",
        dtype="fp32",
        median_ms=launch_ms,
        notes="launch time only",
    )
    cu.record(
        "01",
        "CUDA events (right)",
        model=f"matmul{n_gpu}",
        device="cuda",
        dtype="fp32",
        median_ms=gpu_good["median_ms"],
        p90_ms=gpu_good["p90_ms"],
    )
else:
    cu.results.show_reference("01")

# %% [markdown]
# ## 5. The spread
# A single number hides the tail, which is what the users of a service feel.

# %%
print(
    f"steady-state median {good.median_ms:.3f} ms, p10 {good.p10_ms:.3f}, p90 {good.p90_ms:.3f}, "
    f"p99 {good.p99_ms:.3f} (spread IQR/median = {good.spread:.1%}, n = {good.n})"
)
fig = cu.plots.latency_distribution({"steady state": good.times_ms}, title=f"{n}² matmul chain, {threads} threads")
_ = cu.plots.save(fig, "01", "latency_distribution")  # beside the results: a workshop shows it without a rerun

# %% [markdown]
# ## 6. Comparing two variants: a ratio and its interval
# "B is faster than A" from one timing of A, then one of B, measures the machine as much as the code: a
# browser tab or a test run that starts halfway makes B look slower. Every ratio in this course comes from
# `cu.compare`: the variants take turns in **rounds** (a fresh random order each round), each round gives one
# ratio (A's time / B's time: above 1 means B is faster), and the result is the median of the rounds with its
# **95% confidence interval**. Read it like this:
#
# * `1.45x (95% CI 1.31-1.62)`: B is faster, and on this machine, at this load, the true ratio is very likely
#   between 1.31 and 1.62. A target of 1.5x is **met** only when the low end clears it; here it is **not
#   shown** (the interval straddles it).
# * `no difference beyond this machine's noise (0.90-1.30x)`: the interval contains 1. That is a result, not a
#   failure: on this machine, at this load, the two cannot be told apart. A busy machine gives wide intervals.
#
# Below, two workloads whose ratio is known: one matmul against two of the same matmul (exactly 2x the work),
# and one matmul against itself.

# %%
mm_in = torch.randn(cu.pick(full=384, smoke=192), cu.pick(full=384, smoke=192), device=device)
mm_out = torch.empty_like(mm_in)


def one_matmul():
    torch.matmul(mm_in, mm_in, out=mm_out)


def two_matmuls():
    one_matmul()
    one_matmul()


known = cu.compare(
    {"two matmuls": two_matmuls, "one matmul": one_matmul, "one matmul again": one_matmul},
    baseline="two matmuls",
    device=device,
)
display(known.table().round(3))
half = known.ratio("one matmul")
same = known.ratio("one matmul again", vs="one matmul")  # the same work on both sides
print(
    f"one vs two matmuls (true ratio 2): {half}: the interval "
    + ("contains 2" if half.low <= 2 <= half.high else f"misses 2 ({half.low:.4g}-{half.high:.4g}, unrounded)")
)
print(f"one matmul vs two of them, judged against a 1.5x target: {half.judge(1.5)}; against 2.5x: {half.judge(2.5)}")
print(f"two identical variants: {same}")

# %% [markdown]
# ## 7. Micro-benchmarks on a roofline
# A roofline says how fast a workload *could* run: at arithmetic intensity *I* (FLOP per byte moved) it is
# capped by `min(peak FLOP/s, I × peak bytes/s)`. The roofs should come from the **hardware**, not from our own
# best run (a roof measured by the fastest workload is reached by that workload by construction).
#
# * **CPU compute roof (spec)**: cores **this run uses** (its torch threads, at most the physical cores) ×
#   clock × FLOP per cycle: a run on one thread cannot reach the roof of every core. FLOP per cycle for FP32 is
#   (vector lanes: 16 with AVX-512, 8 with AVX2, 4 otherwise) × 2 (a fused multiply-add is 2 FLOP) × 2 FMA
#   units per core (typical for server cores; some have one: then the real roof is half).
# * **GPU roofs (spec)**: FP32 TFLOP/s and memory bandwidth from the vendor's datasheet, for the models below.
# * **CPU bandwidth roof**: a datasheet does not tell what memory a virtual machine got, so it is measured
#   (a large copy), and said so.

# %%
cpu_capability = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2", "DEFAULT", ...
lanes = {"AVX512": 16, "AVX2": 8}.get(cpu_capability, 4)
physical = psutil.cpu_count(logical=False) or os.cpu_count()
ghz = psutil.cpu_freq().max / 1000 if psutil.cpu_freq() and psutil.cpu_freq().max else None
clock_from = "the CPU's maximum clock"
if not ghz:  # virtual machines often hide the maximum: use the current clock from /proc/cpuinfo
    ghz = float(next(line.split(":")[1] for line in open("/proc/cpuinfo") if line.startswith("cpu MHz"))) / 1000
    clock_from = "the clock /proc/cpuinfo reports (a virtual machine's nominal clock; the cores may boost above it)"
cores_used = min(physical, torch.get_num_threads())  # the roof of the threads this run uses
cpu_spec_flops = cores_used * ghz * 1e9 * lanes * 2 * 2
print(
    f"CPU: {cores_used} core(s) used ({torch.get_num_threads()} torch threads, {physical} physical cores) x "
    f"{ghz:.2f} GHz x {lanes} lanes ({cpu_capability}) x 2 (FMA) x 2 units = {cpu_spec_flops / 1e9:.0f} GFLOP/s "
    "FP32 (spec)"
)

# %% [markdown]
# The GPU's datasheet is found from its name, by **whole model words**: a substring test would give an
# "NVIDIA A100 80GB PCIe" the roofs of an A10 and an "NVIDIA L40" those of an L4. The H100 SXM calls itself
# "NVIDIA H100 80GB HBM3". When several entries match, the most specific one (most words) wins.


# %% tags=["contract"]
GPU_DATASHEET = {  # entry: (words that must all appear in the GPU's name, FP32 TFLOP/s without tensor cores, TB/s)
    "H200": (("H200",), 67.0, 4.8),
    "H100 SXM": (("H100", "HBM3"), 67.0, 3.35),
    "H100 PCIe": (("H100", "PCIE"), 51.0, 2.0),
    "A100 SXM4 80GB": (("A100", "SXM4", "80GB"), 19.5, 2.04),
    "A100 SXM4 40GB": (("A100", "SXM4", "40GB"), 19.5, 1.555),
    "A100 PCIe 40GB": (("A100", "PCIE", "40GB"), 19.5, 1.555),
    "A100 PCIe 80GB": (("A100", "PCIE", "80GB"), 19.5, 1.935),
    "L40S": (("L40S",), 91.6, 0.864),
    "L40": (("L40",), 90.5, 0.864),
    "L4": (("L4",), 30.3, 0.3),
    "A10": (("A10",), 31.2, 0.6),
    "T4": (("T4",), 8.1, 0.32),
    "RTX 4090": (("RTX", "4090"), 82.6, 1.008),
}


def datasheet_entry(gpu_name, table=GPU_DATASHEET):
    """The table entry whose model words all appear, as whole words, in `gpu_name` (the most specific), or None."""
    words = set(re.split(r"[\s_/-]+", gpu_name.upper()))
    hits = [k for k, (model_words, *_) in table.items() if set(model_words) <= words]
    return max(hits, key=lambda k: len(table[k][0]), default=None)


# %%
spec = None
if device.type == "cuda":
    gpu_name = torch.cuda.get_device_name(0)
    key = datasheet_entry(gpu_name)
    spec = GPU_DATASHEET[key][1:] if key else None
    print(
        f"GPU: {gpu_name}: "
        + (
            f"datasheet of the {key}: {spec[0]} TFLOP/s FP32, {spec[1]} TB/s"
            if spec
            else "not in the datasheet table: add it (measured peaks only below)"
        )
    )

# %% [markdown]
# Now the measured peaks (best matmul over a few sizes; a large copy, read + write) and four workloads:
#
# * **compute-bound**: a large matrix product: 2n³ FLOP over 3n² floats of 4 bytes;
# * **memory-bound**: a large elementwise add: 1 FLOP per 12 bytes (two reads, one write of 4 bytes);
# * **overhead-bound**: 100 tiny adds on an 8-element tensor: each add is 8 FLOP for 64 bytes (8 floats read,
#   8 written), 1/8 FLOP per byte, but the cost is per call;
# * **transfer-bound**: the same add with both inputs first copied from the host, counted against the bytes
#   that cross the bus (1 FLOP per 8 bytes copied). On a GPU that bus is PCIe or NVLink; on a CPU the
#   "copy" is a memcpy in the same memory.

# %%
sizes = cu.pick(full=[256, 512, 1024, 2048], smoke=[64, 128, 256])
peak_rows, matmuls = [], {}
for s in sizes:
    x = torch.randn(s, s, device=device)
    matmuls[s] = m = cu.measure(lambda x=x: x @ x, device=device, label=f"matmul {s}")
    peak_rows.append({"n": s, "median_ms": m.median_ms, "GFLOP/s": 2 * s**3 / (m.median_ms / 1e3) / 1e9})
peaks = pd.DataFrame(peak_rows)
measured_flops = peaks["GFLOP/s"].max() * 1e9
big = int(peaks.loc[peaks["GFLOP/s"].idxmax(), "n"])  # the best matmul: the compute-bound point of the roofline

# Buffers 4x the last-level cache (at least 64 MiB), in smoke mode too: a copy that fits in the cache measures
# the cache (88.7 GB/s against 33.3 GB/s with 256 MiB buffers on one 2-core VM), not the memory.
cache = cu.device.last_level_cache_bytes(device)
numel = cu.device.bandwidth_buffer_bytes(device) // 4  # float32 elements per buffer
print(
    f"last-level cache {cache / 2**20 if cache else float('nan'):.0f} MiB; "
    f"bandwidth buffers {numel * 4 / 2**20:.0f} MiB"
)
src, dst = torch.randn(numel, device=device), torch.empty(numel, device=device)
copy = cu.measure(lambda: dst.copy_(src), device=device, label="copy")
measured_bw = 2 * numel * 4 / (copy.median_ms / 1e3)  # read + write
spec_flops = spec[0] * 1e12 if spec else (cpu_spec_flops if device.type == "cpu" else None)
spec_bw = spec[1] * 1e12 if spec else None
print(peaks.round(2).to_string(index=False))
print(f"measured: {measured_flops / 1e9:.1f} GFLOP/s (best matmul), {measured_bw / 1e9:.1f} GB/s (copy)")

# %%
ea, eb = torch.randn(numel, device=device), torch.randn(numel, device=device)
out = torch.empty_like(ea)

tiny = torch.randn(8, device=device)
ops = 100


def many_tiny_ops():
    y = tiny
    for _ in range(ops):
        y = y + 1.0
    return y


# the transfer-bound point: its inputs come from the host each call (pinned memory on a GPU, lesson 09)
host_a, host_b = torch.randn(numel), torch.randn(numel)
if device.type == "cuda":
    host_a, host_b = host_a.pin_memory(), host_b.pin_memory()


def add_from_host():
    ea.copy_(host_a, non_blocking=True)
    eb.copy_(host_b, non_blocking=True)
    return torch.add(ea, eb, out=out)


# the three other workloads take turns in rounds: their times come from one comparison. The compute point is the
# best matmul measured above, not a second timing of it: interleaved with 100 ms copies on a busy machine, a
# second timing once gave the same matmul 0% of the roof where the first gave 41%.
roof_cmp = cu.compare(
    {
        "memory: add": lambda: torch.add(ea, eb, out=out),
        "overhead: tiny adds": many_tiny_ops,
        "transfer: add, inputs from host": add_from_host,
    },
    baseline="memory: add",
    device=device,
)
m_add, m_tiny, m_h2d = (roof_cmp.measurements[k] for k in roof_cmp.names)
m_mm = matmuls[big]
points = [  # name, FLOP per call, bytes per call (for the intensity), measurement
    ("compute: matmul", 2 * big**3, 3 * big * big * 4, m_mm),
    ("memory: add", numel, 12 * numel, m_add),
    ("overhead: tiny adds", ops * 8, ops * 64, m_tiny),
    ("transfer: add from host", numel, 8 * numel, m_h2d),
]
roof = pd.DataFrame(
    [
        {"name": name, "intensity": fl / by, "flops_per_s": fl / (m.median_ms / 1e3), "median_ms": m.median_ms}
        for name, fl, by, m in points
    ]
)
# With no datasheet bandwidth, the bandwidth roof is measured: the best of the copy and the add, so one of
# them sits on it by construction (the compute roof, from the spec sheet, has no such guarantee).
measured_bw = max(measured_bw, 12 * numel / (m_add.median_ms / 1e3))
roof_flops = spec_flops or measured_flops
roof_bw = spec_bw or measured_bw
roof["fraction_of_roof"] = roof.flops_per_s / np.minimum(roof_flops, roof.intensity * roof_bw)
# which roof binds each point, and where it came from (a measured roof is only as good as the moment it was timed)
compute_binds = roof_flops <= roof.intensity * roof_bw
roof["roof"] = np.where(
    compute_binds,
    "spec-sheet compute" if spec_flops else "measured compute",
    "spec-sheet bandwidth" if spec_bw else "measured bandwidth",
)
display(roof.round(4))

# %% [markdown]
# ### Transfer-bound: copies between host and device
# The bus between host and device is often the slowest link: its bandwidth is a lower roof for any data that
# must cross it each call. Pinned (page-locked) host memory is needed for the fastest, asynchronous copies
# (lessons 09 and 10). On a CPU the analogue is a large memcpy.
# *Verification: contract-tested for the bandwidth arithmetic and the copy calls with CPU tensors
# (`tests/gpu_contract/test_l01_timer.py`); `pin_memory` itself needs a GPU: not yet executed on one.*


# %% tags=["contract"]
def copy_bandwidth(dst, src, device, non_blocking=False):
    """GB/s of dst.copy_(src), timed with time_calls (bytes crossing once)."""
    times = time_calls(lambda: dst.copy_(src, non_blocking=non_blocking), device, warmup=3, repeats=20)
    return src.numel() * src.element_size() / (float(np.median(times)) / 1e3) / 1e9


# %%
if cu.gpu_section("01.transfer"):
    host = torch.randn(numel)
    pinned = host.pin_memory()
    assert pinned.is_pinned() and not host.is_pinned(), "the 'pinned' row needs page-locked memory: host.pin_memory()"
    dev_buf = torch.empty(numel, device="cuda")
    bw = {
        "H2D pageable": copy_bandwidth(dev_buf, host, "cuda"),
        "H2D pinned": copy_bandwidth(dev_buf, pinned, "cuda", non_blocking=True),
    }
    print(pd.Series(bw, name="GB/s").round(1).to_string())
    bus_bw = bw["H2D pinned"] * 1e9
    for name, gbs in bw.items():
        cu.record(
            "01",
            name,
            model=f"copy{numel}",
            device="cuda",
            dtype="fp32",
            median_ms=numel * 4 / (gbs * 1e9) * 1e3,
            notes=f"{gbs:.1f} GB/s",
        )
else:
    host_src, host_dst = torch.randn(numel), torch.empty(numel)
    bus_bw = copy_bandwidth(host_dst, host_src, "cpu") * 1e9
    print(f"CPU memcpy of {numel * 4 / 2**20:.0f} MiB: {bus_bw / 1e9:.1f} GB/s (bytes copied once)")
    cu.results.show_reference("01", "H2D")

# %%
fig, ax = plt.subplots(figsize=(7, 4.5))
xs = np.logspace(-3, 3, 200)
if spec_flops and spec_bw:
    ax.plot(xs, np.minimum(spec_flops, xs * spec_bw), color="black", lw=2, label="roof: spec sheet")
elif spec_flops:
    ax.plot(
        xs,
        np.minimum(spec_flops, xs * measured_bw),
        color="black",
        lw=2,
        label="roof: spec compute, measured bandwidth",
    )
ax.plot(xs, np.minimum(measured_flops, xs * measured_bw), color="gray", ls="--", label="roof: measured peaks")
ax.plot(xs, xs * bus_bw, color="tab:red", ls=":", label="host→device copy bandwidth (bus roof)")
for row in roof.itertuples():
    ax.scatter(row.intensity, row.flops_per_s, s=60, zorder=3)
    ax.annotate(row.name, (row.intensity, row.flops_per_s), textcoords="offset points", xytext=(6, 4), fontsize=8)
ax.set(
    xscale="log",
    yscale="log",
    xlabel="arithmetic intensity (FLOP per byte)",
    ylabel="achieved FLOP/s",
    title=f"Roofline on {device}",
)
ax.legend(fontsize=8, loc="lower right")
_ = cu.plots.save(fig, "01", "roofline")

# %%
per_op_us = m_tiny.median_ms * 1000 / ops
f = roof.set_index("name")["fraction_of_roof"]
binding = roof.set_index("name")["roof"]
matmul_share = cu.intervals.roof_says("compute-bound matmul", f["compute: matmul"], binding["compute: matmul"])
print(
    f"{matmul_share}"
    + {
        "above the roof": (
            f". The roof's clock is {clock_from}: at {f['compute: matmul'] * cpu_spec_flops / 1e9:.0f} GFLOP/s the "
            f"cores ran at {f['compute: matmul'] * ghz:.2f} GHz or more, if the FLOP per cycle above holds."
            if spec_flops == cpu_spec_flops
            else "."
        ),
        "far under the roof": ": implausibly far for a large matmul. Other programs took the cores while it was "
        "timed, or torch runs fewer threads than the roof assumes; the roofline is not trusted: rerun on a "
        "quieter machine.",
    }.get(matmul_share.verdict, f" ({m_mm.median_ms:.3f} ms for n={big}: the best matmul above).")
)
print(
    f"{cu.intervals.roof_says('memory-bound add', f['memory: add'], binding['memory: add'])} "
    f"({12 * numel / (m_add.median_ms / 1e3) / 1e9:.1f} GB/s moved)."
)
tiny_share = cu.intervals.roof_says(
    "overhead-bound tiny adds", f["overhead: tiny adds"], binding["overhead: tiny adds"]
)
print(
    f"{tiny_share}: each add costs {per_op_us:.2f} µs whatever its size"
    + (
        ". Batching (03) and compilation (06) attack this."
        if tiny_share.verdict == "far under the roof"
        else ": not far under the roof this time, so not overhead-bound by lesson 01's rule (under 10%)."
    )
)
h2d = roof_cmp.ratio("transfer: add, inputs from host")
print(f"{h2d.says('the add with host inputs', 'the add alone')}: the copies, not the arithmetic, set its time.")

# %% [markdown]
# ## What surprised us
# Printed from this run: how far the quick numbers were from the careful ones.

# %%
fresh = cold["fresh conv module, new shape"]
rows = [
    ("naive single call vs the median of warm calls", f"{naive_ms:.3f} ms vs {mine['median_ms']:.3f} ms (one call)"),
    ("first vs last call of a fresh module on a new shape", f"{fresh[0]:.2f} ms vs {fresh[-1]:.2f} ms (one-off)"),
    (
        "cu.measure vs torch.utils.benchmark, same threads",
        f"{agreement} (within 10%: {agreement.judge_within(0.9, 1.1)})",
    ),
    (
        "cu.measure vs torch.utils.benchmark, 1 thread",
        f"{agreement_1t} (within 10%: {agreement_1t.judge_within(0.9, 1.1)})",
    ),
    ("pipelined vs synchronized per call, small matmul", str(pipe)),
    ("one vs two matmuls (true ratio 2)", str(half)),
    ("p90 vs median (tail)", f"p90 {good.p90_ms:.3f} ms vs median {good.median_ms:.3f} ms (one measurement)"),
]
if threads != 1:
    rows.insert(2, ("torch.utils.benchmark default (1 thread) vs num_threads set",
                    str(timer_cmp.ratio("torch.utils.benchmark, default num_threads"))))  # fmt: skip
surprises = pd.DataFrame(rows, columns=["comparison", "measured"])
with pd.option_context("display.max_colwidth", None):
    display(surprises)

# %% [markdown]
# ## Exercises
# **01.timer.** The tail is what users feel, and it is where timing bugs hide: a median survives a missing
# synchronize, a throughput figure or one call copied `repeats` times; the slowest calls do not. Write
# `latency_report(fn, synchronize, warmup, repeats)` returning a dict: `"times_ms"`, the `repeats` per-call
# times in **milliseconds**, in call order; `"p50_ms"` and `"p90_ms"`, their percentiles (`np.percentile`);
# `"max_ms"`, the slowest call. `synchronize` is the function that waits for queued work
# (`torch.cuda.synchronize` on a GPU). The self-check plants slow calls at random positions on an
# **asynchronous** fake device (its calls return at once; the work finishes only when you call `synchronize`,
# and the warm-up leaves a long queue), runs a workload whose first calls are cold, and compares your median
# with `torch.utils.benchmark` on a workload of known cost.


# %%
def latency_report(fn, synchronize, warmup=5, repeats=30):
    raise NotImplementedError  # your code here


cu.exercises.check("01.timer", latency_report)

# %% [markdown]
# **01.classify.** Write `classify(intensity, achieved, peak_flops, peak_bw)` returning `"compute-bound"`,
# `"memory-bound"` or `"overhead-bound"`: overhead-bound when the workload reaches under 10% of the roof at its
# intensity; otherwise compute-bound right of the ridge point (where the two roofs meet), memory-bound left.
# Then run it on the table `roof` above.


# %%
def classify(intensity: float, achieved: float, peak_flops: float, peak_bw: float) -> str:
    raise NotImplementedError  # your code here


cu.exercises.check("01.classify", classify)

# %% [markdown]
# ## Summary: rows written to this machine's results
# You can now time anything correctly by hand, and you know `cu.measure` does the same. Next:
# **02 · Profiling**, where the time goes inside a pipeline.

# %%
cu.record(
    "01",
    "naive single call",
    model=f"matmul-chain{n}",
    device=str(device),
    dtype="fp32",
    median_ms=naive_ms,
    notes="what not to do",
)
cu.record(
    "01",
    "measure (median)",
    model=f"matmul-chain{n}",
    device=str(device),
    dtype="fp32",
    measurement=good,
    notes=f"{threads} threads; benchmark agreement {agreement} ({agreement_1t} at 1 thread)",
)
for name, _, _, m in points:
    cu.record("01", name, model="micro", device=str(device), dtype="fp32", measurement=m)
print(
    f"measured peaks: {measured_flops / 1e9:.1f} GFLOP/s, {measured_bw / 1e9:.1f} GB/s"
    + (f"; spec compute roof {spec_flops / 1e9:.0f} GFLOP/s" if spec_flops else "")
    + f"; see {cu.results.results_dir()}"
)
