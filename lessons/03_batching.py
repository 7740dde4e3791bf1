# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 03 · Batching: throughput, latency, and the batch size to pick
#
# **Goals.**
# * Measure latency and throughput against batch size for a CNN (ResNet-18) and the digits MLP.
# * Find the **knee** (where throughput stops growing) and the **best batch under a latency budget** from
#   the data, with a budget you can change.
# * Handle **out-of-memory** in a sweep: report the largest batch that fit and carry on.
# * Simulate **dynamic batching** (Poisson request arrivals, a batcher with `max_batch_size` and
#   `max_wait_ms`) with service times measured in this run: p50/p99 latency and throughput against the
#   arrival rate, with and without batching.
#
# **The bottleneck this attacks.** In *01 · Measuring inference*, small workloads were **launch- and
# overhead-bound**: the fixed cost of a call (Python, dispatch, kernel launches, weight reads) dwarfs the
# arithmetic. A batch shares that fixed cost among many inputs and gives the device enough parallel work to
# fill its cores. The price is latency: a batch takes longer than one input, and in a server a request may
# wait for others to arrive.

# %%
from IPython.display import display

import course_utils as cu
import course_utils.batching

device = cu.lesson.start("03", "Batching")

# %% [markdown]
# ## The models and the sizes
# On a GPU the CNN is ResNet-18 at 224×224. On a CPU the same network runs at a smaller resolution so that
# the sweep finishes in minutes (the shape of the curves is what matters here). The digits CNN and MLP are
# the course's small trained models. ResNet weights are random unless they are in your local torch cache:
# fine for speed.

# %%
import torch

resnet, note = cu.models.resnet("resnet18", device=device)
res = 224 if device.type == "cuda" else cu.pick(full=64, smoke=32)
digits_cnn = cu.models.load_digits_model("cnn", device=device)
mlp = cu.models.load_digits_model("mlp", device=device)
print(f"ResNet-18 at {res}x{res} ({note})")

if device.type == "cuda":
    sizes_resnet = [2**k for k in range(0, 9)]
else:
    sizes_resnet = cu.pick(full=[1, 2, 4, 8, 16, 32, 64], smoke=[1, 2, 4, 8])
sizes_small = cu.pick(full=[2**k for k in range(0, 11)], smoke=[1, 4, 16, 64, 256])
models = {
    f"resnet18@{res}": (resnet, lambda b: torch.randn(b, 3, res, res, device=device), sizes_resnet),
    "digits_cnn": (digits_cnn, lambda b: torch.rand(b, 1, 8, 8, device=device), sizes_small),
    "digits_mlp": (mlp, lambda b: torch.rand(b, 64, device=device), sizes_small),
}

# %% [markdown]
# ## Correct first: a batch computes what single inputs compute
# Batching must not change the answer. For each model, eight inputs run once as a batch and once one by
# one; the outputs are compared at the FP32 tolerance (`cu.compare.TOLERANCES["fp32"]`: max error relative
# to the largest output at most 1e-4, cosine at least 0.99999). Kernels may pick different algorithms for
# different batch sizes, so the match is close, not always bit-exact.

# %%
cu.compare.tolerance_table().loc[["fp32"]]

# %%
with torch.inference_mode():
    for name, (model, make_input, _) in models.items():
        x = make_input(8)
        one_by_one = torch.cat([model(x[i : i + 1]) for i in range(8)])
        cu.check_outputs(model(x), one_by_one, "fp32", label=f"{name}: batch of 8 vs 8 single calls")

# %% [markdown]
# ## Baseline and sweep
# The baseline is batch 1. `cu.sweep.batch_sweep` times each batch size with `cu.measure` (warm-up,
# synchronization, median and p10/p90) under `torch.inference_mode()`.

# %%
import pandas as pd

timing = dict(min_time_s=cu.pick(full=0.5, smoke=0.05), min_repeats=cu.pick(full=10, smoke=3))
sweeps = {}
for name, (model, make_input, sizes) in models.items():
    sweeps[name] = cu.sweep.batch_sweep(model, make_input, sizes, device=device, **timing)
    base = sweeps[name].iloc[0]
    print(f"{name}: batch 1 takes {base.median_ms:.3f} ms ({base.throughput:,.0f} items/s)")
table = pd.concat([df.assign(variant=name) for name, df in sweeps.items()], ignore_index=True)
table["speedup_vs_b1"] = table["throughput"] / table.groupby("variant")["throughput"].transform("first")
table[["variant", "batch_size", "median_ms", "p90_ms", "throughput", "ms_per_item", "speedup_vs_b1"]].round(3)

# %%
cu.plots.batch_curve(sweeps[f"resnet18@{res}"], label=f"resnet18@{res}", title=f"ResNet-18 at {res}x{res} on {device}");

# %%
cu.plots.batch_curve(table[table["variant"] != f"resnet18@{res}"], title=f"Digits models on {device}");

# %% [markdown]
# ## The knee and the best batch under a budget
# The **knee** is the smallest batch whose throughput reaches 90% of the best measured
# (`cu.sweep.knee`): beyond it, a larger batch buys little throughput and costs latency. The **best batch
# under a latency budget** is the one with the highest throughput whose p90 latency fits the budget
# (`cu.sweep.best_under_budget`). Change `LATENCY_BUDGET_MS` to your own service-level target.

# %%
LATENCY_BUDGET_MS = None  # a number in ms sets your own budget; None uses 4x each model's batch-1 p90 here

rows = []
for name, df in sweeps.items():
    budget = LATENCY_BUDGET_MS or 4 * float(df.iloc[0]["p90_ms"])
    k = int(cu.sweep.knee(df))
    best = cu.sweep.best_under_budget(df, budget)
    rows.append({
        "model": name, "knee": k, "knee_throughput": float(df.set_index("batch_size").loc[k, "throughput"]),
        "max_throughput": float(df["throughput"].max()), "budget_ms": budget,
        "best_batch": None if best is None else int(best["batch_size"]),
        "best_p90_ms": None if best is None else float(best["p90_ms"]),
        "best_speedup_vs_b1": None if best is None else float(best["throughput"] / df.iloc[0]["throughput"]),
    })  # fmt: skip
choice = pd.DataFrame(rows)
for r in choice.itertuples():
    if r.best_batch is None:
        print(f"{r.model}: no batch size meets {r.budget_ms:.2f} ms at p90; raise the budget or use a faster model.")
    else:
        print(f"{r.model}: knee at batch {r.knee}; under {r.budget_ms:.2f} ms the best batch is {r.best_batch} "
              f"(p90 {r.best_p90_ms:.2f} ms, {r.best_speedup_vs_b1:.2f}x the batch-1 throughput).")  # fmt: skip
choice.round(3)

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots()
for name, df in sweeps.items():
    (line,) = ax.plot(df["batch_size"], df["throughput"] / df.iloc[0]["throughput"], marker="o", label=name)
    k = int(cu.sweep.knee(df))
    ax.scatter([k], [df.set_index("batch_size").loc[k, "throughput"] / df.iloc[0]["throughput"]], s=150,
               facecolors="none", edgecolors=line.get_color())  # fmt: skip
ax.set_xscale("log", base=2)
ax.set_xlabel("batch size")
ax.set_ylabel("throughput relative to batch 1")
ax.set_title("Throughput gain from batching (circles: knee)")
ax.legend();

# %% [markdown]
# ## Out of memory: stop the sweep, keep the results, carry on
# A batch too large for the device raises `torch.OutOfMemoryError`. `cu.sweep.batch_sweep` catches it,
# frees the cache, and returns the rows that fit, with `df.attrs["max_fit"]` and `df.attrs["oom_at"]`.
# On a CPU we show the same path with a memory cap (`memory_limit_mb`: a batch whose input alone exceeds
# it raises the same error); a sweep that only asks "does it fit?" runs each batch once.

# %%
once = dict(warmup=0, min_repeats=1, min_time_s=0.0, warn_spread=False)
cap_mb = 1.0
oom_df = cu.sweep.batch_sweep(digits_cnn, models["digits_cnn"][1], [2**k for k in range(6, 20)], device=device,
                              memory_limit_mb=cap_mb, **once)  # fmt: skip
print(f"With a {cap_mb:g} MiB cap the largest batch that fit was {oom_df.attrs['max_fit']}, "
      f"out of memory at {oom_df.attrs['oom_at']}; the notebook goes on.")  # fmt: skip

# %% [markdown]
# On a GPU the sweep goes on until the device really runs out of memory (ResNet-18 at 224×224, doubling
# the batch, one call per size), then reports the largest batch that fit and checks that the GPU still
# works. On a GPU with a lot of memory, the batches near the limit hold tensors of more than 2^31 elements;
# if a kernel refuses such a tensor before memory runs out, the cell says so and the notebook goes on.
# *This section has not yet been run on a GPU by the course unless reference results are shown below.*

# %%
if cu.gpu_section("03.real-oom"):
    big = [2**k for k in range(6, 19)]
    torch.cuda.empty_cache()
    try:
        gpu_oom = cu.sweep.batch_sweep(resnet, lambda b: torch.randn(b, 3, 224, 224, device="cuda"), big,
                                       device="cuda", **once)  # fmt: skip
    except RuntimeError as exc:  # not an OOM: e.g. a kernel's 32-bit index limit on a huge tensor
        print(f"The sweep stopped before memory ran out: {type(exc).__name__}: {str(exc)[:200]}")
        gpu_oom = pd.DataFrame(columns=["batch_size", "median_ms", "throughput"])
        gpu_oom.attrs.update(max_fit=None, oom_at=None)
    torch.cuda.empty_cache()
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    print(f"{torch.cuda.get_device_name(0)} ({total_gib:.0f} GiB): largest batch that fit "
          f"{gpu_oom.attrs['max_fit']}, out of memory at {gpu_oom.attrs['oom_at']}.")  # fmt: skip
    with torch.inference_mode():
        still_ok = resnet(torch.randn(8, 3, 224, 224, device="cuda"))
    torch.cuda.synchronize()
    alloc, reserved = torch.cuda.memory_allocated() / 2**20, torch.cuda.memory_reserved() / 2**20
    print(f"After the OOM the GPU still runs a batch of 8: output {tuple(still_ok.shape)}; "
          f"{alloc:.0f} MiB allocated, {reserved:.0f} MiB reserved.")  # fmt: skip
    cu.record("03", "largest batch before OOM", model="resnet18@224", device="cuda", dtype="fp32",
              batch_size=gpu_oom.attrs["max_fit"], notes=f"OOM at {gpu_oom.attrs['oom_at']}")  # fmt: skip
    display(gpu_oom[["batch_size", "median_ms", "throughput"]].round(2))
else:
    cu.results.show_reference("03")

# %% [markdown]
# ## Dynamic batching, simulated with this run's service times
# A server does not receive batches: requests arrive one by one, at random. A **dynamic batcher** holds
# waiting requests and sends them to the model as one batch when either `max_batch_size` are waiting or the
# oldest has waited `max_wait_ms` (the knobs of Triton's `dynamic_batching`, LitServe's `max_batch_size` /
# `batch_timeout`, Ray Serve's `@serve.batch`). Without batching, one request runs at a time.
#
# `cu.batching.simulate` plays this out for Poisson arrivals (independent requests at a mean rate), with
# the time to serve a batch of *b* taken from the ResNet sweep above (interpolated). One model instance
# serves everything. Lesson 13 does the same with a real server.

# %%
sweep_cnn = sweeps[f"resnet18@{res}"]
service = cu.batching.service_time_fn(sweep_cnn)
max_batch_size = int(min(32, sweep_cnn["batch_size"].max()))
max_wait_ms = service(1)  # a knob: here, wait at most as long as one single-request inference takes
cap_none = cu.batching.capacity(service, 1)
cap_batch = cu.batching.capacity(service, max_batch_size)
print(f"Capacity without batching: {cap_none:,.1f} requests/s; with batches of {max_batch_size}: "
      f"{cap_batch:,.1f} requests/s ({cap_batch / cap_none:.2f}x). max_wait_ms = {max_wait_ms:.2f}.")  # fmt: skip

n_requests = cu.pick(full=4000, smoke=600)
rates = [cap_none * f for f in (0.1, 0.25, 0.5, 0.8, 1.0, 1.5, 2.0, 4.0)]
sim = cu.batching.rate_sweep(rates, service, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms,
                             n_requests=n_requests)  # fmt: skip
sim["rate_vs_capacity_b1"] = sim["rate"] / cap_none
sim.round(2)

# %%
cu.batching.plot_rate_sweep(sim, title=f"ResNet-18@{res} on {device}: simulated server, measured service times");

# %% [markdown]
# ### Try a rate
# Move the slider to see the latency distribution of every request at one arrival rate, with and without
# batching. (Run headless, the widget is built and the plot is also drawn once directly below it.)

# %%
import ipywidgets as widgets
import numpy as np


def show_rate(rate: float) -> None:
    arrivals = cu.batching.poisson_arrivals(rate, n_requests, seed=1)
    runs = {
        "no batching": cu.batching.simulate(arrivals, service),
        "dynamic batching": cu.batching.simulate(arrivals, service, max_batch_size=max_batch_size,
                                                 max_wait_ms=max_wait_ms),
    }  # fmt: skip
    for name, r in runs.items():
        print(f"{name:>16}: p50 {r.p50_ms:8.2f} ms, p99 {r.p99_ms:8.2f} ms, {r.throughput:8.1f} req/s, "
              f"mean batch {r.mean_batch:.1f}")  # fmt: skip
    cu.plots.latency_distribution({k: np.log10(r.latencies_ms) for k, r in runs.items()},
                                  title=f"{rate:.1f} requests/s offered (x axis: log10 of latency in ms)")  # fmt: skip
    plt.show()


slider = widgets.FloatLogSlider(value=cap_none, base=10, min=np.log10(rates[0]), max=np.log10(rates[-1]),
                                step=0.05, description="req/s", continuous_update=False)  # fmt: skip
display(widgets.interactive(show_rate, rate=slider))

# %%
show_rate(1.5 * cap_none)

# %% [markdown]
# ## What surprised us
# Printed from this run's numbers.

# %%
def word(x: float, up: str, down: str) -> str:
    return up if x > 1 else down


sat = sim[sim["rate_vs_capacity_b1"] == sim["rate_vs_capacity_b1"].max()].set_index("policy")
none_row, dyn_row = sat.iloc[0], sat.iloc[1]
tp_ratio = dyn_row["throughput"] / none_row["throughput"]
print(f"1. Past saturation ({sat['rate'].iloc[0]:.1f} req/s offered), dynamic batching served {tp_ratio:.2f}x the "
      f"requests/s of no batching, with p99 {dyn_row['p99_ms']:.1f} ms vs {none_row['p99_ms']:.1f} ms "
      f"({word(none_row['p99_ms'] / dyn_row['p99_ms'], 'lower', 'higher')} with batching).")  # fmt: skip
low = sim[sim["rate_vs_capacity_b1"] == sim["rate_vs_capacity_b1"].min()].set_index("policy")
p50_cost = low.iloc[1]["p50_ms"] / low.iloc[0]["p50_ms"]
print(f"2. At light load ({low['rate'].iloc[0]:.1f} req/s) batching made the median request "
      f"{p50_cost:.2f}x {word(p50_cost, 'slower', 'faster')} "
      f"({low.iloc[0]['p50_ms']:.2f} -> {low.iloc[1]['p50_ms']:.2f} ms):"
      " a lone request waits max_wait_ms for company that rarely comes.")  # fmt: skip
for r in choice.itertuples():
    gain = r.max_throughput / float(sweeps[r.model].iloc[0]["throughput"])
    print(f"3. {r.model}: the best batch gave {gain:.2f}x the batch-1 throughput; "
          + ("batching pays a lot here." if gain >= 2 else "little to gain here: a larger batch mostly adds latency."))
mlp_df = sweeps["digits_mlp"]
per_item = mlp_df["ms_per_item"].iloc[0] / mlp_df["ms_per_item"].min()
print(f"4. For the tiny MLP one item costs {per_item:.1f}x more time at batch 1 than at its best batch: nearly all "
      "of a batch-1 call is fixed overhead (dispatch, weight reads), the launch-bound case from lesson 01.")

# %% [markdown]
# ## Exercises
# **03.knee.** Write `knee_batch(batch_sizes, throughputs, fraction)`: the smallest batch size whose
# throughput reaches `fraction` of the best.

# %%
def knee_batch(batch_sizes, throughputs, fraction=0.9):
    raise NotImplementedError  # your code here


cu.exercises.check("03.knee", knee_batch)

# %% [markdown]
# **03.capacity.** Write `max_rate(service_ms, max_batch_size)`: given `{batch_size: ms}`, the most
# requests per second one model instance can serve with full batches.

# %%
def max_rate(service_ms, max_batch_size):
    raise NotImplementedError  # your code here


cu.exercises.check("03.capacity", max_rate)

# %% [markdown]
# **03.poisson.** Write `arrivals(rate_per_s, n, seed)`: arrival times in ms of `n` requests from a Poisson
# process (hint: the gaps are exponential). Then try the simulation with `max_wait_ms=0` and with a much
# larger wait: what happens to p50 at low load and p99 at high load?

# %%
def arrivals(rate_per_s, n, seed=0):
    raise NotImplementedError  # your code here


cu.exercises.check("03.poisson", arrivals)

# %% [markdown]
# ## Summary
# Rows for this machine's results file: batch 1 and the best batch under the budget per model, and the
# simulated server at the highest rate. Next: **04 · Mixed precision**.

# %%
for r in choice.itertuples():
    df = sweeps[r.model].set_index("batch_size")
    b1 = df.loc[1]
    cu.record("03", "batch 1", model=r.model, device=str(device), dtype="fp32", batch_size=1,
              median_ms=b1.median_ms, p90_ms=b1.p90_ms, throughput=b1.throughput)  # fmt: skip
    if r.best_batch is not None:
        bb = df.loc[r.best_batch]
        cu.record("03", "best batch under budget", model=r.model, device=str(device), dtype="fp32",
                  batch_size=r.best_batch, median_ms=bb.median_ms, p90_ms=bb.p90_ms, throughput=bb.throughput,
                  speedup_vs_baseline=bb.throughput / b1.throughput,
                  notes=f"budget {r.budget_ms:.2f} ms p90; knee {r.knee}")  # fmt: skip
cu.record("03", "dynamic batching (simulated)", model=f"resnet18@{res}", device=str(device), dtype="fp32",
          batch_size=max_batch_size, median_ms=dyn_row["p50_ms"], throughput=dyn_row["throughput"],
          speedup_vs_baseline=tp_ratio,
          notes=f"at {dyn_row['rate']:.1f} req/s; p99 {dyn_row['p99_ms']:.1f} ms "
          f"vs {none_row['p99_ms']:.1f} ms unbatched")  # fmt: skip
choice.round(3)
