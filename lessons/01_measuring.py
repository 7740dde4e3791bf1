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
# 1. See, with numbers from this run, how the usual quick timing goes wrong: the cold first call, the thread
#    count, a benchmark tool's single-thread default, and on a GPU the missing synchronization.
# 2. Time correctly: warm-up, synchronization, many repeats, the median and the spread (`cu.measure`).
# 3. Learn the **bottleneck taxonomy** every later lesson links back to, by placing four micro-benchmarks
#    (compute-, memory-, overhead- and transfer-bound) on a roofline built from peaks measured here.

# %%
import time

import numpy as np
import pandas as pd
import torch

import course_utils as cu

device = cu.lesson.start("01", "Measuring inference")
threads = torch.get_num_threads()

# %% [markdown]
# ## The bottleneck taxonomy
# A model's time goes to one of a few limits. Each later lesson attacks one of them:
#
# | bottleneck | what limits it | sign in a measurement | lessons that attack it |
# |---|---|---|---|
# | **compute-bound** | arithmetic units (FLOP/s) | time grows with FLOPs; near the compute roof | 04 precision, 05 quantization, 08 TensorRT, 12 pruning |
# | **memory-bound** | memory bandwidth (bytes/s) | time grows with bytes moved; near the bandwidth roof | 04 precision, 06/07/08 operator fusion, 11 memory |
# | **overhead-bound** (launch, Python, framework) | per-op fixed cost | time barely depends on size; far below both roofs | 03 batching, 06 compilation and CUDA graphs |
# | **transfer-bound** | host↔device copies | time tracks bytes copied across the bus | 09 data pipeline, 10 streams |
# | **input-bound** | data loading and preprocessing | the device waits for the next batch | 09 data pipeline, 10 streams |
#
# Before optimizing anything, find out which one you are in: that is what this lesson measures.

# %% [markdown]
# ## 1. Naive vs correct timing
# The workload: a small CNN-sized matrix product chain. The naive way is what most tutorials print:
# one call, `time.time()` before and after, no warm-up, no synchronization.

# %%
n = cu.pick(full=1024, smoke=256)
a = torch.randn(n, n, device=device)
b = torch.randn(n, n, device=device)


def work():
    return torch.relu(a @ b) @ b


fresh = torch.randn(n, n, device=device)  # a first call on never-used memory pays one-off costs
naive_cold_ms = cu.timing.naive_time(lambda: torch.relu(fresh @ b) @ b)
good = cu.measure(work, device=device, label="measure (warm-up, many calls, median)")
print(f"naive, cold first call : {naive_cold_ms:8.3f} ms")
print(good)
print(f"The cold single call was {naive_cold_ms / good.median_ms:.2f}x the steady-state median on this machine.")

# %% [markdown]
# ### The thread count matters on a CPU
# PyTorch uses all cores by default. The same workload with one thread is a different measurement:
# always report the thread count with a CPU number.

# %%
rows = []
for t in sorted({1, threads}):
    torch.set_num_threads(t)
    m = cu.measure(work, device=device, label=f"{t} thread(s)")
    rows.append({"threads": t, "median_ms": m.median_ms, "p90_ms": m.p90_ms})
torch.set_num_threads(threads)
thread_table = pd.DataFrame(rows)
thread_table

# %%
if len(thread_table) > 1:
    ratio = thread_table.median_ms.iloc[0] / thread_table.median_ms.iloc[-1]
    print(f"One thread took {ratio:.2f}x the time of {threads} threads for this workload.")
else:
    print("This machine has a single thread: no difference to show.")

# %% [markdown]
# ### `torch.utils.benchmark` is single-threaded unless told otherwise
# `torch.utils.benchmark.Timer` is a good tool (it warms up, synchronizes, and reports median and IQR),
# but its `num_threads` defaults to **1**. Compared with a model that runs on all cores, that is the wrong
# baseline. `cu.timing.benchmark_median_ms` passes the current thread count.

# %%
from torch.utils import benchmark

bench_default = benchmark.Timer(stmt="work()", globals={"work": work}).blocked_autorange(
    min_run_time=cu.pick(full=1.0, smoke=0.1)
)
bench_threads = cu.timing.benchmark_median_ms(work, min_run_time=cu.pick(full=1.0, smoke=0.1))
print(f"torch.utils.benchmark, default num_threads=1 : {bench_default.median * 1000:.3f} ms")
print(f"torch.utils.benchmark, num_threads={threads}          : {bench_threads:.3f} ms")
print(f"cu.measure ({threads} threads)                       : {good.median_ms:.3f} ms")
agreement = good.median_ms / bench_threads
print(f"cu.measure / torch.utils.benchmark at the same threads = {agreement:.3f} (course target: within 10%)")
print(f"cu.measure's mean / torch.utils.benchmark = {good.mean_ms / bench_threads:.3f}")

# %% [markdown]
# The two tools summarize differently. `cu.measure` times **every call** and reports the median call;
# `torch.utils.benchmark` times **blocks** of many calls and reports the median of the block averages, so
# a slow call (the OS or another program took a core) raises every block it lands in. When the calls are
# steady the two agree; when they are not, the benchmark's number sits near `cu.measure`'s *mean*. The
# check below repeats the comparison on one thread, where a 2-core machine has a core to spare for
# everything else.

# %%
torch.set_num_threads(1)
one_measure = cu.measure(work, device=device, label="1 thread")
one_bench = cu.timing.benchmark_median_ms(work, num_threads=1, min_run_time=cu.pick(full=1.0, smoke=0.1))
torch.set_num_threads(threads)
agreement_1t = one_measure.median_ms / one_bench
print(f"1 thread: cu.measure median {one_measure.median_ms:.3f} ms (spread {one_measure.spread:.1%}), "
      f"torch.utils.benchmark {one_bench:.3f} ms: ratio {agreement_1t:.3f}")  # fmt: skip
for label, r in [(f"{threads} threads", agreement), ("1 thread", agreement_1t)]:
    verdict = "within" if abs(r - 1) <= 0.10 else "outside"
    print(f"{label}: the timers are {verdict} 10% of each other here.")

# %% [markdown]
# ### On a GPU: the missing synchronization
# CUDA calls return as soon as the work is *queued*. `time.time()` around a launch measures the launch.
# `cu.measure` brackets each call with CUDA events and waits for them.

# %%
if cu.gpu_section("01.gpu-sync"):
    ag = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        ag @ ag
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ag @ ag  # no synchronize: measures the launch only
    launch_ms = (time.perf_counter() - t0) * 1000
    torch.cuda.synchronize()
    gpu_good = cu.measure(lambda: ag @ ag, device="cuda", label="4096² matmul, CUDA events")
    print(f"without synchronize: {launch_ms:.3f} ms; with CUDA events: {gpu_good.median_ms:.3f} ms")
    print(f"The unsynchronized timer reported {gpu_good.median_ms / launch_ms:.1f}x less than the real time.")
    cu.record("01", "unsynchronized timer (wrong)", model="matmul4096", device="cuda", dtype="fp32",
              median_ms=launch_ms, notes="launch time only")  # fmt: skip
    cu.record("01", "CUDA events (right)", model="matmul4096", dtype="fp32", measurement=gpu_good)
else:
    cu.results.show_reference("01")

# %% [markdown]
# ## 2. Warm-up and spread
# Time the first calls one by one and compare them with the steady state. Then look at the whole distribution:
# a single number hides the tail, which is what users of a service feel.

# %%
torch.manual_seed(0)
c = torch.randn(n, n, device=device)
first_calls = []
for _ in range(5):
    t0 = time.perf_counter()
    torch.relu(c @ b) @ b
    cu.device.synchronize(device)
    first_calls.append((time.perf_counter() - t0) * 1000)
print("first five calls (ms):", ", ".join(f"{t:.3f}" for t in first_calls))
print(f"steady-state median {good.median_ms:.3f} ms, p10 {good.p10_ms:.3f}, p90 {good.p90_ms:.3f} "
      f"(spread IQR/median = {good.spread:.1%}, n = {good.n})")  # fmt: skip

# %%
cu.plots.latency_distribution({"steady state": good.times_ms}, title=f"{n}² matmul chain, {threads} threads");

# %% [markdown]
# ## 3. Four micro-benchmarks on a roofline
# We measure this machine's **peaks** first (the best matmul FLOP/s over a few sizes, and the copy bandwidth of
# a large buffer; a workload below that does better raises the roof), then place four workloads against them:
#
# * **compute-bound**: a large matrix product (intensity grows with size: 2n³ FLOPs over 3n² floats),
# * **memory-bound**: a large elementwise add (1 FLOP per 12 bytes moved),
# * **overhead-bound**: many tiny ops on an 8-element tensor (the cost is per call, not per byte),
# * **transfer-bound**: a large copy (host→device on a GPU; a memcpy on a CPU), reported as bandwidth.

# %%
sizes = cu.pick(full=[256, 512, 1024, 2048], smoke=[64, 128, 256])
peak_rows = []
for s in sizes:
    x = torch.randn(s, s, device=device)
    m = cu.measure(lambda x=x: x @ x, device=device, label=f"matmul {s}")
    peak_rows.append({"n": s, "median_ms": m.median_ms, "GFLOP/s": 2 * s**3 / (m.median_ms / 1e3) / 1e9})
peaks = pd.DataFrame(peak_rows)
peak_flops = peaks["GFLOP/s"].max() * 1e9

numel = cu.pick(full=32 * 2**20, smoke=2**20)  # float32 elements
src, dst = torch.randn(numel, device=device), torch.empty(numel, device=device)
copy = cu.measure(lambda: dst.copy_(src), device=device, label="copy")
peak_bw = 2 * numel * 4 / (copy.median_ms / 1e3)  # read + write
print(peaks.to_string(index=False))
print(f"measured peaks here: {peak_flops / 1e9:.1f} GFLOP/s (matmul), {peak_bw / 1e9:.1f} GB/s (copy)")

# %%
points = []
big = sizes[-1]
xb = torch.randn(big, big, device=device)
m_mm = cu.measure(lambda: xb @ xb, device=device, label="compute-bound matmul")
points.append(("compute: matmul", 2 * big**3 / (3 * big * big * 4), 2 * big**3 / (m_mm.median_ms / 1e3), m_mm))

ea, eb = torch.randn(numel, device=device), torch.randn(numel, device=device)
out = torch.empty_like(ea)
m_add = cu.measure(lambda: torch.add(ea, eb, out=out), device=device, label="memory-bound add")
points.append(("memory: add", 1 / 12, numel / (m_add.median_ms / 1e3), m_add))

tiny = torch.randn(8, device=device)
ops = 100


def many_tiny_ops():
    y = tiny
    for _ in range(ops):
        y = y + 1.0
    return y


m_tiny = cu.measure(many_tiny_ops, device=device, label="overhead-bound tiny ops")
points.append(("overhead: tiny ops", 1 / 12, ops * 8 / (m_tiny.median_ms / 1e3), m_tiny))

# A peak is the best this machine showed: if a workload beat the first estimate, it raises the roof.
peak_flops = max(peak_flops, points[0][2])
peak_bw = max(peak_bw, numel * 12 / (m_add.median_ms / 1e3))
roof = pd.DataFrame(
    [
        {"name": name, "intensity": i, "flops_per_s": f, "median_ms": m.median_ms,
         "fraction_of_roof": f / min(peak_flops, i * peak_bw)}
        for name, i, f, m in points
    ]
)  # fmt: skip
roof

# %%
cu.plots.roofline(roof, peak_flops=peak_flops, peak_bytes_per_s=peak_bw);

# %%
per_op_us = m_tiny.median_ms * 1000 / ops
print(f"compute-bound matmul reaches {roof.fraction_of_roof[0]:.0%} of its roof.")
print(f"memory-bound add reaches {roof.fraction_of_roof[1]:.0%} of its roof "
      f"({numel * 12 / (m_add.median_ms / 1e3) / 1e9:.1f} GB/s moved).")  # fmt: skip
print(f"overhead-bound tiny ops reach {roof.fraction_of_roof[2]:.2%} of their roof: each op costs "
      f"{per_op_us:.2f} µs whatever its size. Batching (03) and compilation (06) attack this.")  # fmt: skip

# %% [markdown]
# ### Transfer-bound: copies between host and device
# On a GPU the bus between host and device is often the slowest link; pinned (page-locked) host memory is
# needed for the fastest, asynchronous copies (lessons 09 and 10). On a CPU the analogue is a large memcpy.

# %%
if cu.gpu_section("01.transfer"):
    host = torch.randn(numel)
    pinned = host.pin_memory()
    dev_buf = torch.empty(numel, device="cuda")
    m_pageable = cu.measure(lambda: dev_buf.copy_(host), device="cuda", label="H2D pageable")
    m_pinned = cu.measure(lambda: dev_buf.copy_(pinned, non_blocking=True), device="cuda", label="H2D pinned")
    m_dev = cu.measure(lambda: dst.copy_(src), device="cuda", label="device-to-device")
    bw = {m.label: numel * 4 / (m.median_ms / 1e3) / 1e9 for m in (m_pageable, m_pinned)}
    bw["device-to-device"] = 2 * numel * 4 / (m_dev.median_ms / 1e3) / 1e9
    print(pd.Series(bw, name="GB/s").round(1).to_string())
    for m in (m_pageable, m_pinned):
        cu.record("01", m.label, model=f"copy{numel}", dtype="fp32", measurement=m)
else:
    host_src, host_dst = torch.randn(numel), torch.empty(numel)
    m_memcpy = cu.measure(lambda: host_dst.copy_(host_src), device="cpu", label="CPU memcpy")
    print(f"CPU memcpy of {numel * 4 / 2**20:.0f} MiB: {m_memcpy.median_ms:.3f} ms, "
          f"{2 * numel * 4 / (m_memcpy.median_ms / 1e3) / 1e9:.1f} GB/s (read + write)")  # fmt: skip
    cu.results.show_reference("01", "H2D")

# %% [markdown]
# ## What surprised us
# Printed from this run: how far the naive numbers were from the truth.

# %%
surprises = pd.DataFrame(
    [
        ("cold first call vs steady median", naive_cold_ms / good.median_ms),
        ("torch.utils.benchmark default (1 thread) vs same-thread median", bench_default.median * 1000 / bench_threads),
        ("cu.measure vs torch.utils.benchmark, same threads", agreement),
        ("cu.measure vs torch.utils.benchmark, 1 thread", agreement_1t),
        ("p90 vs median (tail)", good.p90_ms / good.median_ms),
    ],
    columns=["comparison", "ratio"],
)
surprises

# %% [markdown]
# ## Exercises
# **1.** Write `matmul_intensity(n, bytes_per_element)`: the arithmetic intensity (FLOP per byte) of an n×n by
# n×n matrix product that reads both inputs and writes the output once.
#
# **2.** Write `classify(intensity, achieved, peak_flops, peak_bw)` returning `"compute-bound"`,
# `"memory-bound"` or `"overhead-bound"`: overhead-bound when the workload reaches under 10% of the roof at
# its intensity; otherwise compute-bound right of the ridge point (peak_flops / peak_bw), memory-bound left.


# %%
def matmul_intensity(n: int, bytes_per_element: int) -> float:
    raise NotImplementedError  # your code here


cu.exercises.check("01.intensity", matmul_intensity)


# %%
def classify(intensity: float, achieved: float, peak_flops: float, peak_bw: float) -> str:
    raise NotImplementedError  # your code here


cu.exercises.check("01.classify", classify)

# %% [markdown]
# ## Summary: rows written to this machine's results

# %%
cu.record("01", "naive cold single call", model=f"matmul-chain{n}", device=str(device), dtype="fp32",
          median_ms=naive_cold_ms, notes="what not to do")  # fmt: skip
cu.record("01", "measure (median)", model=f"matmul-chain{n}", dtype="fp32", measurement=good,
          notes=f"{threads} threads; benchmark agreement {agreement:.3f} ({agreement_1t:.3f} at 1 thread)")  # fmt: skip
for name, _, _, m in points:
    cu.record("01", name, model="micro", dtype="fp32", measurement=m)
print(f"peaks: {peak_flops / 1e9:.1f} GFLOP/s, {peak_bw / 1e9:.1f} GB/s; see {cu.results.results_dir()}")
