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
# **Goals.** Know where inference memory goes and how to measure it: memory a program uses vs memory its
# allocator keeps (**allocated vs reserved**), what `torch.cuda.empty_cache()` does and does not do,
# `inference_mode` vs `no_grad` vs autograd left on, **peak memory vs batch size**, and **preallocated static
# buffers** filled with `copy_` (the pattern CUDA graphs need). Everything has a CPU equivalent, measured
# here on this machine: resident memory (RSS) and its peak, glibc's cache of freed blocks and
# `malloc_trim`, and what Python's `tracemalloc` can and cannot see.
#
# **The bottleneck it attacks.** In the taxonomy of *01 · Measuring inference*: memory *capacity*. Peak
# memory decides the largest batch that fits, and the batch size decides throughput (lesson 03). Needless
# allocations also cost time (allocator calls, and on a GPU cudaMalloc synchronizes).

# %%
import course_utils as cu

device = cu.lesson.start("11", "Memory")

# %%
import gc

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from course_utils import memory as mem

SIZE = cu.pick(full=224, smoke=32)
print(f"RSS now {mem.rss_mb():.0f} MiB (torch and its libraries are loaded); peak reset supported: "
      f"{mem.reset_peak_rss()}")  # fmt: skip

# %% [markdown]
# ## Allocated vs reserved, on the CPU
# When a program frees memory, the allocator may keep it for the next request instead of returning it to the
# operating system. On a GPU, PyTorch's caching allocator does this (`memory_reserved` >= `memory_allocated`).
# On the CPU, glibc's `malloc` does the same for small blocks, while large blocks are mapped and unmapped
# directly. We allocate many small tensors and one large one, free them, and watch RSS.

# %%
def rss_story(make: callable, label: str) -> list[dict]:
    gc.collect()
    mem.malloc_trim()
    start = mem.rss_mb()
    objs = make()
    held = mem.rss_mb()
    del objs
    gc.collect()
    freed = mem.rss_mb()
    mem.malloc_trim()
    trimmed = mem.rss_mb()
    return [{"case": label, "step": s, "RSS above start (MiB)": v - start}
            for s, v in (("allocated", held), ("after del", freed), ("after malloc_trim", trimmed))]  # fmt: skip


N_SMALL = cu.pick(full=3000, smoke=600)
story = pd.DataFrame(
    rss_story(lambda: [torch.ones(16_000) for _ in range(N_SMALL)], f"{N_SMALL} small tensors ({16_000 * 4 / 1024:.1f} KiB each)")
    + rss_story(lambda: torch.ones(N_SMALL * 16_000), "one large tensor (same total)")
)
story.pivot(index="case", columns="step", values="RSS above start (MiB)")[["allocated", "after del", "after malloc_trim"]]

# %%
small = story[story["case"].str.contains("small")].set_index("step")["RSS above start (MiB)"]
large = story[story["case"].str.contains("large")].set_index("step")["RSS above start (MiB)"]
print(f"Small tensors: {small['after del']:.0f} of {small['allocated']:.0f} MiB stayed resident after `del` "
      f"(kept by malloc, like 'reserved' on a GPU); malloc_trim gave back "
      f"{small['after del'] - small['after malloc_trim']:.0f} MiB of it.")
print(f"One large tensor: {large['after del']:.0f} of {large['allocated']:.0f} MiB stayed after `del`: large blocks go "
      "straight back to the OS.")  # fmt: skip

# %% [markdown]
# From here on, `cu.memory.mmap_large_blocks()` tells glibc to map every block above 128 KiB separately and
# unmap it on free, so RSS follows live tensors and the peaks below measure the model, not malloc's cache.

# %%
print(f"fixed mmap threshold set: {mem.mmap_large_blocks()}")

# %% [markdown]
# ## What `tracemalloc` sees
# `tracemalloc` is Python's allocation tracer. NumPy reports its buffers to it; torch tensors come from
# torch's own C++ allocator and are invisible to it. To measure torch on the CPU, use RSS (`cu.memory`).

# %%
n_floats = cu.pick(full=25_000_000, smoke=2_500_000)
tm_np, _ = mem.tracemalloc_peak_mb(lambda: np.ones(n_floats, dtype=np.float32).sum())
tm_torch, _ = mem.tracemalloc_peak_mb(lambda: torch.ones(n_floats).sum())
rss_torch, _ = mem.cpu_peak_mb(lambda: torch.ones(n_floats).sum())
expected = n_floats * 4 / 2**20
pd.DataFrame([{"what": "numpy array", "tracemalloc peak MiB": tm_np, "actual MiB": expected},
              {"what": "torch tensor", "tracemalloc peak MiB": tm_torch, "RSS peak MiB": rss_torch,
               "actual MiB": expected}])  # fmt: skip

# %% [markdown]
# ## `inference_mode` vs `no_grad` vs autograd on
# With autograd on, every layer keeps the activations its backward pass would need, so they all stay alive
# until the output is freed. `no_grad` and `inference_mode` free each activation as soon as the next layer
# has used it; `inference_mode` also skips autograd's version counters and view tracking (a little less
# work per op). First the outputs, compared with the autograd-off baseline, then peak memory and time.

# %%
model, note = cu.models.resnet("resnet18")
BATCH = cu.pick(full=8, smoke=2)
x = torch.randn(BATCH, 3, SIZE, SIZE)
outs = {}
for mode in ("grad", "no_grad", "inference_mode"):
    with mem.grad_context(mode):
        outs[mode] = model(x).detach()
for mode in ("grad", "no_grad"):
    cu.check_outputs(outs[mode], outs["inference_mode"], "fp32", label=f"{mode} vs inference_mode")

# %%
rows = []
for mode in ("grad", "no_grad", "inference_mode"):

    def run(mode: str = mode) -> None:
        with mem.grad_context(mode):
            y = model(x)
        del y

    peak, _ = mem.cpu_peak_mb(run)
    m = cu.measure(run, device="cpu", batch_size=BATCH, label=mode, warmup=1, min_repeats=cu.pick(full=3, smoke=2),
                   min_time_s=cu.pick(full=0.5, smoke=0.05))  # fmt: skip
    rows.append({"mode": mode, "peak MiB (RSS)": peak, "median ms": m.median_ms})
    cu.record("11", f"resnet18 forward, {mode}", model="resnet18", device="cpu", dtype="fp32", measurement=m,
              notes=f"peak {peak:.1f} MiB")  # fmt: skip
modes = pd.DataFrame(rows).set_index("mode")
modes

# %%
g, inf = modes.loc["grad"], modes.loc["inference_mode"]
print(f"Autograd on needed {g['peak MiB (RSS)'] / max(inf['peak MiB (RSS)'], 1e-9):.1f}x the peak memory of "
      f"inference_mode ({g['peak MiB (RSS)']:.0f} vs {inf['peak MiB (RSS)']:.0f} MiB) at batch {BATCH}.")
ng = modes.loc["no_grad"]
faster = "faster" if inf["median ms"] < ng["median ms"] else "not faster"
print(f"inference_mode was {faster} than no_grad here ({ng['median ms'] / inf['median ms']:.2f}x): its saving is per "
      "op bookkeeping, small next to a convolution.")  # fmt: skip

# %% [markdown]
# ## Peak memory vs batch size
# `cu.memory.peak_vs_batch` measures one forward pass per batch size (input created beforehand). Peak
# grows about linearly with the batch: a fixed part (weights are already loaded, so mostly workspace) plus
# a per-image part (activations). The fitted slope tells you how many images fit in a memory budget.

# %%
batches = cu.pick(full=[1, 2, 4, 8, 16], smoke=[1, 2])
make = lambda b: torch.randn(b, 3, SIZE, SIZE)  # noqa: E731
curves = {mode: mem.peak_vs_batch(model, make, batches, mode=mode) for mode in ("inference_mode", "grad")}
fits = {mode: np.polyfit(df["batch_size"], df["peak_mb"], 1) for mode, df in curves.items()}
fig, ax = plt.subplots()
for mode, df in curves.items():
    slope, icept = fits[mode]
    ax.plot(df["batch_size"], df["peak_mb"], marker="o", label=f"{mode} ({slope:.1f} MiB/image)")
ax.set_xlabel("batch size")
ax.set_ylabel("peak extra memory (MiB, RSS)")
ax.set_title(f"ResNet-18 forward at {SIZE}x{SIZE}: peak memory vs batch size")
ax.legend()
fig.tight_layout()
pd.concat({m: d.set_index("batch_size")["peak_mb"] for m, d in curves.items()}, axis=1)

# %%
budget_mb = cu.pick(full=1024, smoke=256)
slope, icept = fits["inference_mode"]
print(f"Under inference_mode each image adds about {slope:.1f} MiB here; a {budget_mb} MiB budget fits about "
      f"{int(max(0, (budget_mb - icept) / slope)) if slope > 0 else 'unbounded'} images per batch.")  # fmt: skip

# %% [markdown]
# ## Static buffers with `copy_`
# A serving loop that does `model(torch.tensor(batch))` allocates a new input and output every call.
# `cu.memory.StaticRunner` allocates them once and copies each new batch in with `copy_`: the addresses
# never change, which is exactly what a captured CUDA graph needs (lesson 06), and nothing is allocated per
# call. The pitfall: the result IS the output buffer, so the next call overwrites it.

# %%
runner = mem.StaticRunner(model, x)
xs = [torch.randn_like(x) for _ in range(3)]
with torch.inference_mode():
    plain = [model(b) for b in xs]
static = [runner(b).clone() for b in xs]
for i, (a, b) in enumerate(zip(static, plain, strict=True)):
    cu.check_outputs(a, b, "fp32", label=f"static buffers, batch {i}")
kept = runner(xs[0])  # kept WITHOUT clone
ptr = kept.data_ptr()
runner(xs[1])
print(f"Output buffer address unchanged between calls: {runner(xs[2]).data_ptr() == ptr}. A result kept without "
      f"clone() now holds batch 2's output: {torch.equal(kept, static[2])}.")  # fmt: skip

# %%
with torch.inference_mode():
    m_plain = cu.measure(lambda: model(xs[0]), device="cpu", batch_size=BATCH, label="fresh tensors",
                         warmup=1, min_repeats=cu.pick(full=3, smoke=2), min_time_s=cu.pick(full=0.5, smoke=0.05))  # fmt: skip
m_static = cu.measure(lambda: runner(xs[0]), device="cpu", batch_size=BATCH, label="static buffers",
                      warmup=1, min_repeats=cu.pick(full=3, smoke=2), min_time_s=cu.pick(full=0.5, smoke=0.05))  # fmt: skip
print(m_plain)
print(m_static)
ratio = m_plain.median_ms / m_static.median_ms
print(f"Static buffers ran at {ratio:.2f}x the speed of fresh tensors on this CPU. The allocations they save "
      f"are small next to the model's {m_plain.median_ms:.0f} ms, so read any difference against the spread "
      f"(IQR {m_plain.iqr_ms:.0f} ms). Their payoff is on a GPU, where fixed addresses make CUDA graphs possible.")
_ = cu.record("11", "static buffers (copy_)", model="resnet18", device="cpu", dtype="fp32", measurement=m_static,
          speedup_vs_baseline=ratio)  # fmt: skip

# %% [markdown]
# ## On a GPU: the caching allocator, `empty_cache`, peaks, CUDA graphs
# **Not yet run on a GPU by the course** unless reference results are shown in their place.
#
# `torch.cuda.memory_allocated` counts live tensors; `memory_reserved` counts what the caching allocator
# holds from the driver. Freeing a tensor lowers allocated, not reserved: the block is kept for reuse (no
# cudaMalloc next time). `torch.cuda.empty_cache()` returns unused cached blocks to the driver. It **does
# not** free live tensors (drop references first: `del`, `gc.collect()`), it does not defragment, and it
# makes nothing faster: the next allocation pays cudaMalloc again. It helps other processes on the same GPU
# or a later, larger allocation, and that is all. Measured:

# %%
if cu.gpu_section("11.allocator"):
    steps = []
    snap = lambda s: steps.append({"step": s, **mem.gpu_memory_mb()})  # noqa: E731
    snap("start")
    t = torch.empty(cu.pick(full=2048, smoke=64), 2**20, dtype=torch.uint8, device="cuda")  # MiB
    snap("allocated a tensor")
    del t
    snap("del tensor")
    torch.cuda.empty_cache()
    snap("empty_cache()")
    display(pd.DataFrame(steps).set_index("step"))  # noqa: F821 - IPython built-in

    nbytes = cu.pick(full=512, smoke=32) * 2**20

    def alloc() -> None:
        torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    def alloc_after_empty() -> None:
        torch.cuda.empty_cache()
        torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    warm = cu.measure(alloc, device="cuda", label="allocation from the cache")
    cold = cu.measure(alloc_after_empty, device="cuda", label="empty_cache() then allocation")
    print(warm)
    print(cold)
    print(f"After empty_cache, each allocation took {cold.median_ms / warm.median_ms:.1f}x as long: empty_cache "
          "makes nothing faster.")
    cu.record("11", "gpu alloc after empty_cache", model="tensor", device="cuda", measurement=cold,
              speedup_vs_baseline=warm.median_ms / cold.median_ms)  # fmt: skip
else:
    cu.results.show_reference("11", "empty_cache")

# %% [markdown]
# Peak GPU memory around a call: `torch.cuda.reset_peak_memory_stats()`, run, `torch.cuda.max_memory_allocated()`
# (`cu.memory.gpu_peak_mb`). For a timeline of every allocation, `torch.cuda.memory._record_memory_history()`
# and `torch.cuda.memory._dump_snapshot(path)`, then drop the file on https://pytorch.org/memory_viz.

# %%
if cu.gpu_section("11.gpu-peak"):
    gmodel, _ = cu.models.resnet("resnet50", device="cuda")
    gx = torch.randn(cu.pick(full=64, smoke=8), 3, 224, 224, device="cuda")
    gpu_modes = {}
    for mode in ("grad", "no_grad", "inference_mode"):
        with mem.grad_context(mode):
            gmodel(gx)  # warm-up (cuDNN workspaces)

        def grun(mode: str = mode) -> None:
            with mem.grad_context(mode):
                y = gmodel(gx)
            del y

        gpu_modes[mode], _ = mem.gpu_peak_mb(grun)
        cu.record("11", f"gpu resnet50 peak, {mode}", model="resnet50", device="cuda", dtype="fp32",
                  batch_size=gx.shape[0], notes=f"peak {gpu_modes[mode]:.0f} MiB")  # fmt: skip
    print({k: f"{v:.0f} MiB" for k, v in gpu_modes.items()})
    gcurve = mem.peak_vs_batch(gmodel, lambda b: torch.randn(b, 3, 224, 224, device="cuda"),
                               cu.pick(full=[1, 8, 32, 64, 128, 256], smoke=[1, 4]), device="cuda")  # fmt: skip
    display(gcurve)  # noqa: F821 - IPython built-in
    snapshot = cu.results.results_dir() / "11_memory_snapshot.pickle"
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    with torch.inference_mode():
        gmodel(gx)
    torch.cuda.memory._dump_snapshot(str(snapshot))
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"Allocation timeline written to {snapshot}: open it at https://pytorch.org/memory_viz")
else:
    cu.results.show_reference("11", "peak")

# %% [markdown]
# Static buffers are what CUDA graph capture needs: the graph records the addresses it reads and writes, so
# new data must be `copy_`'d into the captured input before each replay, and the output must be read (or
# cloned) before the next one.

# %%
if cu.gpu_section("11.cuda-graph-static"):
    gm, _ = cu.models.resnet("resnet18", device="cuda")
    static_in = torch.randn(8, 3, 224, 224, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(3):
            gm(static_in)  # warm-up on a side stream before capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        static_out = gm(static_in)
    new = torch.randn_like(static_in)
    static_in.copy_(new)
    graph.replay()
    with torch.inference_mode():
        # tf32 tolerance: cuDNN convolutions use TF32 by default and may pick different algorithms per call.
        cu.check_outputs(static_out, gm(new), "tf32", label="CUDA graph replay vs eager")
    m_eager = cu.measure(lambda: gm(static_in), device="cuda", batch_size=8, label="eager")
    m_graph = cu.measure(graph.replay, device="cuda", batch_size=8, label="graph replay")
    print(m_eager)
    print(m_graph)
    cu.record("11", "gpu cuda graph on static buffers", model="resnet18", device="cuda", dtype="fp32",
              measurement=m_graph, speedup_vs_baseline=m_eager.median_ms / m_graph.median_ms)  # fmt: skip
else:
    cu.results.show_reference("11", "graph")

# %% [markdown]
# ## What surprised us
# Printed from this run.

# %%
print(f"After `del`, {small['after del']:.0f} MiB of small tensors stayed resident until malloc_trim: freeing is "
      "not returning. The GPU caching allocator behaves the same way, by design.")  # fmt: skip
print(f"tracemalloc saw {tm_torch:.2f} MiB of a {expected:.0f} MiB torch tensor and {tm_np:.0f} MiB of the "
      "same-size NumPy array.")
print(f"Autograd left on cost {g['peak MiB (RSS)'] - inf['peak MiB (RSS)']:.0f} MiB extra peak at batch {BATCH}; "
      f"per image, {fits['grad'][0]:.1f} vs {fits['inference_mode'][0]:.1f} MiB (grad vs inference_mode).")  # fmt: skip

# %% [markdown]
# ## Exercises
# **1.** Write `max_batch(per_image_mb, fixed_mb, budget_mb)`: the largest whole batch whose predicted peak
# `fixed_mb + batch * per_image_mb` stays within `budget_mb` (0 if not even one image fits).

# %%
def max_batch(per_image_mb: float, fixed_mb: float, budget_mb: float) -> int:
    raise NotImplementedError  # your code here


cu.exercises.check("11.max-batch", max_batch)

# %% [markdown]
# **2.** Write `fill_static(buffer, batch)`: put `batch` into the preallocated `buffer` without allocating a
# new tensor (same storage afterwards), and return the buffer. A batch of the wrong shape must raise
# `ValueError`.

# %%
def fill_static(buffer: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError  # your code here


cu.exercises.check("11.fill-static", fill_static)

# %% [markdown]
# ## Summary
# * Allocated (live) vs reserved (kept by the allocator): freeing lowers the first, not the second.
# * `empty_cache` / `malloc_trim` give cached memory back; they free nothing that is still referenced and
#   speed nothing up.
# * Run inference under `torch.inference_mode()`: autograd left on keeps every activation alive.
# * Peak memory grows linearly with the batch: measure the slope, then size batches to the budget.
# * Preallocate inputs and outputs and `copy_` into them: fixed addresses, the precondition for CUDA graphs.
#
# Next: **12 · Pruning and distillation**.

# %%
_ = cu.record("11", "peak memory per image (inference_mode)", model="resnet18", device="cpu", dtype="fp32",
              notes=f"{fits['inference_mode'][0]:.2f} MiB/image at {SIZE}px; grad {fits['grad'][0]:.2f}")  # fmt: skip
