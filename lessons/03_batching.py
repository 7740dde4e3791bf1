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
# * Write the batch-size sweep yourself: latency and throughput per batch size, under `torch.inference_mode`,
#   stopping cleanly at **out-of-memory** (`torch.OutOfMemoryError` → free the cache → keep the rows).
# * Find the **knee** (where throughput stops growing) and the **best batch under a latency budget**.
# * On a GPU: `torch.backends.cudnn.benchmark`, and a real out-of-memory.
# * Simulate **dynamic batching** (Poisson arrivals, a batcher with `max_batch_size` and `max_wait_ms`) with
#   service times measured in this run: the maximum sustainable throughput of each policy, and p50/p99 latency
#   compared where neither policy is overloaded.
#
# **The bottleneck this attacks.** In *01 · Measuring inference*, small workloads were **overhead-bound**: the
# fixed cost of a call (Python, dispatch, kernel launches, weight reads) dwarfs the arithmetic. A batch shares
# that fixed cost among many inputs and gives the device enough parallel work to fill its cores. The price is
# latency: a batch takes longer than one input, and in a server a request may wait for others to arrive.

# %%
import copy
import gc
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import display

import course_utils as cu
import course_utils.techniques.batching_sim

device = cu.lesson.start("03", "Batching")
# The batch-vs-single checks below compare FP32 outputs at the FP32 tolerance. On a GPU, cuDNN convolutions
# run TF32 by default (and matmuls may): switch both off so FP32 means FP32 (lesson 04 measures TF32).
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False

# %% [markdown]
# ## The models and the sizes
# On a GPU the CNN is ResNet-18 at 224×224. On a CPU the same network runs at a smaller resolution so that the
# sweep finishes in minutes (the shape of the curves is what matters here). The digits CNN and MLP are the
# course's small trained models. ResNet weights are random unless they are in your local torch cache: fine for
# speed.

# %%
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
# Batching must not change the answer. For each model, eight inputs run once as a batch and once one by one;
# the outputs are compared at the FP32 tolerance (max error relative to the largest output at most 1e-4, cosine
# at least 0.99999). Kernels may pick different algorithms for different batch sizes, so the match is close,
# not always bit-exact.

# %%
cu.tolerance_table().loc[["fp32"]]

# %%
with torch.inference_mode():
    for name, (model, make_input, _) in models.items():
        x = make_input(8)
        one_by_one = torch.cat([model(x[i : i + 1]) for i in range(8)])
        cu.check_outputs(model(x), one_by_one, "fp32", label=f"{name}: batch of 8 vs 8 single calls")

# %% [markdown]
# ## Exercise first: a sweep that survives out-of-memory
# **03.oom-sweep.** Before you read the course's sweep below, write the loop yourself:
# `oom_safe_sweep(model, make_input, batch_sizes, measure)` returns a list of rows
# `{"batch_size": b, "ms": measure(lambda: model(x))}`, one per batch size that fit, in order. Three rules:
# * run the whole sweep under `torch.inference_mode()`;
# * catch `torch.OutOfMemoryError` around each batch: stop the sweep there and **keep the rows** measured so far;
#   catch nothing else (not `Exception`, not `RuntimeError`, of which it is a subclass): any other error is a bug
#   and must reach the caller;
# * free memory **after leaving the `except` block** (inside it, the exception's traceback still holds the failed
#   batch and its activations): drop your reference to the batch (`x = None`), `gc.collect()`,
#   `torch.cuda.empty_cache()` (it does nothing where CUDA never started).
#
# The self-check plants an out-of-memory error at a batch size drawn at random (and, in another sweep, an ordinary
# RuntimeError), runs the sweeps with the inputs on the GPU (the rehearsal's stand-in on a CPU), and watches where
# and when you free memory.


# %%
def oom_safe_sweep(model, make_input, batch_sizes, measure):
    raise NotImplementedError  # your code here


cu.exercises.check("03.oom-sweep", oom_safe_sweep)

# %% [markdown]
# ## The sweep, written out
# For each batch size: build the input, time the model with `cu.measure` (lesson 01's timer), keep a row.
# Three things make it robust:
# * **`torch.inference_mode()`**: no autograd bookkeeping, less memory per batch;
# * **out of memory is an answer, not a crash**: `torch.OutOfMemoryError` stops the sweep and the rows measured
#   so far are kept. Free memory **after leaving the `except` block**: inside it, the exception's traceback still
#   holds the frames of the failed call, and with them the failed batch and its activations. Outside it, drop
#   your own reference to the batch, `gc.collect()`, and on a GPU `torch.cuda.empty_cache()` returns the cached
#   blocks, so the rest of the notebook still has memory;
# * **any other error also keeps the rows**: it is reported with the batch size it happened at, instead of
#   throwing away minutes of measurements.
#
# On a CPU there is no out-of-memory exception to catch: a Linux process that asks for more memory than the
# machine has is killed by the kernel's **OOM killer** (SIGKILL: no Python exception, the kernel of your
# notebook just dies). So the CPU path uses a **cap** (`cap_mb`): a batch whose input alone is larger raises
# `torch.OutOfMemoryError` itself, and takes the same path a real GPU out-of-memory takes.


# %% tags=["contract"]
def batch_sweep(model, make_input, batch_sizes, device, cap_mb=None, **timing):
    """Median (with its 95% interval), p10/p90 latency and throughput per batch size; stops at out-of-memory (or
    any error) keeping the rows. The per-call times stay in `df.attrs["times_ms"]` for later intervals."""
    rows, x, stopped, times = [], None, None, {}
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                if cap_mb is not None and x.nelement() * x.element_size() > cap_mb * 2**20:
                    raise torch.OutOfMemoryError(f"batch {b}: input over the {cap_mb} MiB cap")  # the CPU's stand-in
                m = cu.measure(lambda x=x: model(x), device=device, batch_size=b, **timing)
            except torch.OutOfMemoryError:
                stopped = f"out of memory at batch {b}"  # no clean-up here: the traceback still holds the batch
            except Exception as exc:  # not an OOM: keep what was measured, say what stopped the sweep
                stopped = f"{type(exc).__name__} at batch {b}: {str(exc)[:200]}"
            if stopped:
                break
            low, high, _ = cu.intervals.median_interval(m.times_ms)  # the median's 95% interval
            rows.append(
                {
                    "batch_size": b,
                    "median_ms": m.median_ms,
                    "median_low_ms": low,
                    "median_high_ms": high,
                    "p10_ms": m.p10_ms,
                    "p90_ms": m.p90_ms,
                    "throughput": b / (m.median_ms / 1e3),
                    "ms_per_item": m.median_ms / b,
                }
            )
            times[b] = list(m.times_ms)
    if stopped:  # out of the except block, the traceback (and the failed batch it holds) is gone: free now
        x = None  # drop our own reference to the failed batch's input
        gc.collect()
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()  # hand the cached blocks back
        print(f"sweep stopped: {stopped}; kept {len(rows)} rows")
    columns = ["batch_size", "median_ms", "median_low_ms", "median_high_ms", "p10_ms", "p90_ms", "throughput"]
    df = pd.DataFrame(rows, columns=[*columns, "ms_per_item"])
    df.attrs.update(stopped=stopped, max_fit=rows[-1]["batch_size"] if rows else None, times_ms=times)
    return df


# %%
# at least 9 calls per batch size: each median then has an interval the simulation below can carry
timing = dict(min_time_s=cu.pick(full=0.5, smoke=0.05), min_repeats=9)
sweeps = {}
for name, (model, make_input, sizes) in models.items():
    sweeps[name] = batch_sweep(model, make_input, sizes, device, **timing)
    base = sweeps[name].iloc[0]
    print(f"{name}: batch 1 takes {base.median_ms:.3f} ms ({base.throughput:,.0f} items/s)")
table = pd.concat([df.assign(variant=name) for name, df in sweeps.items()], ignore_index=True)
table[["variant", "batch_size", "median_ms", "p10_ms", "p90_ms", "throughput", "ms_per_item"]].round(3)

# %% [markdown]
# One panel per model, log axes: a 0.05 ms model and a 20 ms one cannot share a linear axis. The whiskers are
# each median's 95% interval, the band p10-p90 of the calls; a hollow marker is a batch size whose throughput is
# within noise of the one before it (their intervals overlap): the curve there is flat as far as this run can
# tell. Each figure is also saved as a PNG beside this machine's results.

# %%
fig = cu.plots.batch_curve(table, title=f"Latency and throughput vs batch size on {device}")
png = cu.plots.save(fig, "03", "batch_curves")
flat = cu.plots.figure_data(png).query("within_noise")  # the numbers travel inside the PNG
print(
    f"saved {png}; within noise of the size before them: "
    + (", ".join(f"{r.model} batch {r.batch_size}" for r in flat.itertuples()) or "none")
)

# %% [markdown]
# ## The knee and the best batch under a budget
# The **knee** is the smallest batch whose throughput reaches 90% of the best measured: beyond it, a larger
# batch buys little throughput and costs latency. The **best batch under a latency budget** is the one with
# the highest throughput whose p90 latency fits the budget. Change `LATENCY_BUDGET_MS` to your own target.


# %% tags=["contract"]
def batch_choice(name, df, budget_ms):
    """The knee, the best batch under `budget_ms` (p90) and the sweep's top-throughput batch of one sweep."""
    knee = int(df.loc[df["throughput"] >= 0.9 * df["throughput"].max(), "batch_size"].min())
    fits = df[df["p90_ms"] <= budget_ms]
    best = None if fits.empty else fits.loc[fits["throughput"].idxmax()]
    return {
        "model": name,
        "knee": knee,
        "max_throughput": float(df["throughput"].max()),
        "budget_ms": budget_ms,
        "best_batch": None if best is None else int(best["batch_size"]),
        "best_p90_ms": None if best is None else float(best["p90_ms"]),
        "top_batch": int(df.loc[df["throughput"].idxmax(), "batch_size"]),
    }


def batches_to_compare(r):
    """Batch 1, the best batch under the budget and the top batch: [1] alone when batch 1 won everything."""
    best = None if pd.isna(r.best_batch) else int(r.best_batch)
    return sorted({1, int(r.top_batch)} | ({best} if best is not None else set()))


def compare_batches(model, make_input, batches, device):
    """Throughput per item of each batch against batch 1, in rounds; None when there is nothing to compare."""
    if batches == [1]:
        return None  # cu.compare needs a second variant: batch 1 won the sweep, nothing else is worth timing
    inputs = {b: make_input(b) for b in batches}
    with torch.inference_mode():
        return cu.compare(
            {f"batch {b}": (lambda x=inputs[b], mdl=model: mdl(x)) for b in batches},
            baseline="batch 1",
            device=device,
            items={f"batch {b}": b for b in batches},
        )


def choice_line(r, gains):
    """The sentence for one model's row of the choice table, whatever the sweep found."""
    if pd.isna(r.best_batch):
        return f"{r.model}: no batch size meets {r.budget_ms:.2f} ms at p90; raise the budget or use a faster model."
    if gains is None:
        return (
            f"{r.model}: batch 1 had the top throughput of the sweep and is the best under {r.budget_ms:.2f} ms: no "
            "larger batch paid on this run, so there is nothing to compare. On a busy machine the sweep's noise can "
            "hide a gain: run the sweep again before concluding that batching does not help this model."
        )
    if r.best_batch == 1:
        return f"{r.model}: knee at batch {r.knee}; under {r.budget_ms:.2f} ms the best batch is 1."
    gain = gains.ratio(f"batch {int(r.best_batch)}")
    return (
        f"{r.model}: knee at batch {r.knee}; under {r.budget_ms:.2f} ms the best batch is {int(r.best_batch)} "
        f"(p90 {r.best_p90_ms:.2f} ms): {gain.says(f'batch {int(r.best_batch)}', 'batch 1', 'the throughput of')}."
    )


def top_batch_line(r, gains):
    """'What surprised us', point 1, for one model: the top batch against batch 1, from the interval."""
    if r.top_batch == 1 or gains is None:
        return (f"1. {r.model}: batch 1 had the top throughput of the sweep, so nothing was timed against it in "
                "rounds: nothing to conclude about batching from this run.")  # fmt: skip
    gain = gains.ratio(f"batch {int(r.top_batch)}")
    judged = gain.judge(2.0)
    return f"1. {r.model}: {gain.says(f'batch {int(r.top_batch)}', 'batch 1', 'the throughput of')}; " + (
        "batching pays a lot here."
        if judged == "met"
        else "little to gain here: a larger batch mostly adds latency."
        if judged == "missed"
        else "not shown to double it here."
    )


# %%
LATENCY_BUDGET_MS = None  # a number in ms sets your own budget; None uses 4x each model's batch-1 p90 here

choice = pd.DataFrame(
    [batch_choice(name, df, LATENCY_BUDGET_MS or 4 * float(df.iloc[0]["p90_ms"])) for name, df in sweeps.items()]
)
# The throughput of batch 1, the best batch under the budget and the sweep's fastest, taking turns in rounds
# (lesson 01): ratios per item, with their intervals. When batch 1 won everything there is nothing to compare.
gains = {r.model: compare_batches(*models[r.model][:2], batches_to_compare(r), device) for r in choice.itertuples()}
for r in choice.itertuples():
    print(choice_line(r, gains[r.model]))
choice.round(3)

# %%
fig, ax = plt.subplots()
for r in choice.itertuples():
    df = sweeps[r.model]
    (line,) = ax.plot(df["batch_size"], df["throughput"] / df.iloc[0]["throughput"], marker="o", label=r.model)
    ax.scatter(
        [r.knee],
        [df.set_index("batch_size").loc[r.knee, "throughput"] / df.iloc[0]["throughput"]],
        s=150,
        facecolors="none",
        edgecolors=line.get_color(),
    )
ax.set(
    xscale="log",
    xlabel="batch size",
    ylabel="throughput relative to batch 1",
    title="Throughput gain from batching (circles: knee)",
)
_ = ax.legend()

print(f"saved {cu.plots.save(fig, '03', 'batching_gain')}")

# %% [markdown]
# ## Out of memory: stop the sweep, keep the results, carry on
# With a cap of 1 MiB the digits CNN's doubling batches soon "run out of memory" on the CPU, the same way a GPU
# does; a sweep that only asks "does it fit?" runs each batch once.

# %%
once = dict(warmup=0, min_repeats=1, min_time_s=0.0, warn_spread=False)
cap_mb = 1.0
oom_df = batch_sweep(digits_cnn, models["digits_cnn"][1], [2**k for k in range(6, 20)], device, cap_mb=cap_mb, **once)
print(
    f"With a {cap_mb:g} MiB cap the largest batch that fit was {oom_df.attrs['max_fit']} "
    f"({oom_df.attrs['stopped']}); the notebook goes on."
)

# %% [markdown]
# ### On a GPU: a real out-of-memory, and the GPU still works after it
# The sweep below doubles ResNet-18's batch at 224×224 until the device runs out of memory, then checks that
# the GPU still runs a batch of 8. On a GPU with a lot of memory, batches near the limit hold tensors of more
# than 2^31 elements; a kernel may refuse such a tensor before memory runs out: the sweep reports that error
# and keeps its rows.
# *Verification: contract-tested (`tests/gpu_contract/test_l03_sweep.py` drives `batch_sweep` with a real
# `torch.OutOfMemoryError` and with a non-OOM error, on CPU tensors, checking the rows are kept and
# `torch.cuda.empty_cache` is called on the CUDA path); not yet executed on a GPU.*

# %%
if cu.gpu_section("03.real-oom"):
    resnet_gpu = copy.deepcopy(resnet).to("cuda")  # its own copy on the GPU, wherever `device` put the lesson's
    gpu_oom = batch_sweep(
        resnet_gpu, lambda b: torch.randn(b, 3, 224, 224, device="cuda"), [2**k for k in range(6, 19)], "cuda", **once
    )
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    print(
        f"{torch.cuda.get_device_name(0)} ({total_gib:.0f} GiB): largest batch that fit "
        f"{gpu_oom.attrs['max_fit']} ({gpu_oom.attrs['stopped']})."
    )
    with torch.inference_mode():
        still_ok = resnet_gpu(torch.randn(8, 3, 224, 224, device="cuda"))
    torch.cuda.synchronize()
    alloc, reserved = torch.cuda.memory_allocated() / 2**20, torch.cuda.memory_reserved() / 2**20
    print(
        f"After the sweep the GPU still runs a batch of 8: output {tuple(still_ok.shape)}; "
        f"{alloc:.0f} MiB allocated, {reserved:.0f} MiB reserved."
    )
    cu.record(
        "03",
        "largest batch before OOM",
        model="resnet18@224",
        device="cuda",
        dtype="fp32",
        batch_size=gpu_oom.attrs["max_fit"],
        notes=str(gpu_oom.attrs["stopped"]),
    )
    display(gpu_oom.round(2))
else:
    cu.results.show_reference("03")

# %% [markdown]
# ### On a GPU: `torch.backends.cudnn.benchmark`
# For each new input shape, cuDNN can either use a heuristic's choice of convolution algorithm or, with
# `torch.backends.cudnn.benchmark = True`, time several algorithms on the first call and keep the fastest.
# That first call is slower; later calls may be faster. It pays when shapes repeat (a fixed batch size) and
# costs when they keep changing (every new batch size, every new image size pays the search again).
# A fair comparison times both settings on the same amount of work: batch 32 at 224×232 without the search,
# and batch 32 at 232×224 with it (PyTorch keeps the algorithm chosen per shape whatever the flag, so each
# setting gets a shape it has not seen).
# *Verification: contract-tested (`tests/gpu_contract/test_l03_sweep.py` runs `cudnn_benchmark_effect` on CPU,
# where the flag changes nothing, and checks the flag is restored); not yet executed on a GPU.*


# %% tags=["contract"]
def cudnn_benchmark_effect(model, x, device):
    """First-call and steady-state time of model(x) with cudnn.benchmark off and on (the flag is restored).

    cuDNN keeps the algorithm it picked per input shape, whatever the flag, so each setting needs a shape it has
    not seen: `x` (height != width) for benchmark=False, and an input with height and width swapped for
    benchmark=True: the same batch, the same number of pixels, the same FLOP, a new shape.
    """
    if x.dim() != 4 or x.shape[2] == x.shape[3]:
        raise ValueError(f"pass an NCHW batch with height != width (got {tuple(x.shape)}): the swapped shape is new")
    sync = torch.get_device_module(device).synchronize
    old, out = torch.backends.cudnn.benchmark, {}
    try:
        swapped = torch.randn(*x.shape[:2], x.shape[3], x.shape[2], device=x.device, dtype=x.dtype)
        for flag, xs in ((False, x), (True, swapped)):
            torch.backends.cudnn.benchmark = flag
            with torch.inference_mode():
                t0 = time.perf_counter()
                model(xs)
                sync()
                first_ms = (time.perf_counter() - t0) * 1e3
                m = cu.measure(lambda xs=xs: model(xs), device=device, warn_spread=False)
            out[f"benchmark={flag}"] = {
                "input": "x".join(map(str, xs.shape)),
                "first call ms": first_ms,
                "median ms": m.median_ms,
            }
    finally:
        torch.backends.cudnn.benchmark = old
    return pd.DataFrame(out).T


# %%
if cu.gpu_section("03.cudnn-benchmark"):
    resnet_gpu = copy.deepcopy(resnet).to("cuda")
    nb, h, w = cu.pick(full=(32, 224, 232), smoke=(4, 64, 72))  # smoke: small enough for the CPU rehearsal
    effect = cudnn_benchmark_effect(resnet_gpu, torch.randn(nb, 3, h, w, device="cuda"), "cuda")
    display(effect)
    x_plain = torch.randn(nb, 3, h, w, device="cuda")  # the shapes each setting has seen in the cell above
    x_search = torch.randn(nb, 3, w, h, device="cuda")

    def with_flag(flag, xs):
        def fn():
            torch.backends.cudnn.benchmark = flag
            with torch.inference_mode():
                resnet_gpu(xs)

        return fn

    old_flag = torch.backends.cudnn.benchmark
    try:  # the steady states taking turns in rounds; each setting keeps the shape it has seen
        flag_cmp = cu.compare(
            {"benchmark=False": with_flag(False, x_plain), "benchmark=True": with_flag(True, x_search)},
            baseline="benchmark=False",
            device="cuda",
            warmup=0,  # both settings ran above already
            rounds=cu.pick(full=15, smoke=3),  # smoke: few rounds of a full-size ResNet (the rehearsal runs it)
        )
    finally:
        torch.backends.cudnn.benchmark = old_flag
    gain = flag_cmp.ratio("benchmark=True")
    print(
        f"steady state: {gain.says('benchmark=True', 'the heuristic choice')}; first calls "
        f"{effect.loc['benchmark=True', 'first call ms']:.1f} ms with the search vs "
        f"{effect.loc['benchmark=False', 'first call ms']:.1f} ms without.{cu.modes.standin_label()}"
    )
    cu.record(
        "03",
        "cudnn.benchmark=True",
        model=f"resnet18@{h}x{w}",
        device="cuda",
        dtype="fp32",
        batch_size=nb,
        median_ms=flag_cmp.measurements["benchmark=True"].median_ms,
        speedup_vs_baseline=gain,
    )

# %% [markdown]
# ## Dynamic batching, simulated with this run's service times
# A server does not receive batches: requests arrive one by one, at random. A **dynamic batcher** holds waiting
# requests and sends them to the model as one batch when either `max_batch_size` are waiting or the oldest has
# waited `max_wait_ms` (the knobs of Triton's `dynamic_batching`, LitServe's `max_batch_size` /
# `batch_timeout`, Ray Serve's `@serve.batch`). Without batching, one request runs at a time.
#
# `cu.batching_sim.simulate` plays this out for Poisson arrivals (independent requests at a mean rate), with the
# time to serve a batch of *b* taken from the ResNet sweep above (interpolated). One model instance serves
# everything. Lesson 13 does the same with a real server.
#
# **Capacity** first: one instance serving batches of *b* finishes at most `b / service(b)` requests per
# second. Offered more than that, the queue grows for as long as requests keep coming: every latency figure of
# such a run depends on how long the run was, so it describes the run, not the server.
#
# The service times are measured, so they are uncertain: the simulation runs once with the medians and once
# with each end of their intervals (`service_bounds`: the fast and the slow end of every batch size's median
# interval, wide enough to hold together). The gain it reports is the range those runs allow.

# %%
sweep_cnn = sweeps[f"resnet18@{res}"]
service = cu.batching_sim.service_time_fn(sweep_cnn)
max_batch_size = int(min(32, sweep_cnn["batch_size"].max()))
service_fast, service_slow, joint = cu.batching_sim.service_bounds(sweep_cnn, max_batch_size)
max_wait_ms = service(1)  # a knob: here, wait at most as long as one single-request inference takes
dynamic = f"dynamic (max {max_batch_size}, wait {max_wait_ms:.2f} ms)"
policies = {"no batching": (1, 0.0), dynamic: (max_batch_size, max_wait_ms)}
n_requests = cu.pick(full=4000, smoke=800)


def run(rate, policy, n=n_requests, seed=1, svc=service):
    b, w = policies[policy]
    return cu.batching_sim.simulate(
        cu.batching_sim.poisson_arrivals(rate, n, seed=seed), svc, max_batch_size=b, max_wait_ms=w
    )


def sustainable(rate, policy, svc=service):
    """Stable at this rate: served as fast as offered, and p99 does not grow when the run is twice as long."""
    short, long = run(rate, policy, svc=svc), run(rate, policy, n=2 * n_requests, svc=svc)
    return long.throughput >= 0.95 * rate and long.p99_ms <= 1.3 * short.p99_ms


fractions = np.arange(0.5, 1.3, 0.05)


def max_sustainable(policy, svc=service):
    """The highest sustainable rate on a grid of fractions of the policy's capacity (NaN when none is)."""
    cap = cu.batching_sim.capacity(svc, policies[policy][0])
    return max([f * cap for f in fractions if sustainable(f * cap, policy, svc)], default=float("nan"))


capacity = {p: cu.batching_sim.capacity(service, b) for p, (b, _) in policies.items()}
max_rate = {p: max_sustainable(p) for p in policies}
limits = pd.DataFrame({"capacity b/service(b), req/s": capacity, "max sustainable (simulated), req/s": max_rate})
display(limits.round(1))
p_none, p_dyn = list(policies)
# the gain's range: dynamic at its slowest against no batching at its fastest, and the other way round
worst = max_sustainable(p_dyn, service_slow) / max_sustainable(p_none, service_fast)
best = max_sustainable(p_dyn, service_fast) / max_sustainable(p_none, service_slow)
tp_estimate = max_rate[p_dyn] / max_rate[p_none]
tp_gain = cu.intervals.ratio_from_bounds(
    p_dyn, p_none, tp_estimate, min(worst, tp_estimate), max(best, tp_estimate), joint
)
print(f"Simulated with this run's times: {tp_gain.says('dynamic batching', 'no batching', 'the sustainable rate of')}.")

# %% [markdown]
# **Latency where both policies keep up.** The fair comparison is at the highest arrival rate *neither* policy
# is overloaded at: 90% of what no batching sustains. Below, the same arrivals are served both ways.

# %%
fair_rate = 0.9 * max_rate[p_none]
fair_runs = {p: run(fair_rate, p) for p in policies}
fair = pd.DataFrame({p: r.summary() for p, r in fair_runs.items()}).T
display(fair.round(2))


def tail_verdict(rate):
    """Dynamic batching's p99 against no batching's at `rate`, with the requests' interval, at the medians; the
    verdict stands only if both ends of the service times' intervals give it too."""
    tail = cu.intervals.tail_says(p_dyn, run(rate, p_dyn).latencies_ms, p_none, run(rate, p_none).latencies_ms)
    ends = set()
    for dyn_svc, none_svc in ((service_slow, service_fast), (service_fast, service_slow)):
        dyn_ms, none_ms = run(rate, p_dyn, svc=dyn_svc).latencies_ms, run(rate, p_none, svc=none_svc).latencies_ms
        ends.add(cu.intervals.tail_says(p_dyn, dyn_ms, p_none, none_ms).verdict)
    if ends != {tail.verdict}:
        others = " or ".join(sorted(ends - {tail.verdict}))
        return cu.intervals.Finding(
            "not shown",
            f"at the measured service times, {tail.text}; at the ends of the service times' intervals it reads "
            f"{others}: not shown either way",
        )
    return tail


fair_tail = tail_verdict(fair_rate)
print(
    f"At {fair_rate:.1f} req/s (90% of no batching's limit), mean batch {fair.loc[p_dyn, 'mean_batch']:.1f}: "
    f"{fair_tail}."
)

# %% [markdown]
# The curves against the arrival rate, each policy drawn only where it is sustainable (past its limit its
# numbers depend on the run length):

# %%
rates = np.geomspace(0.1 * max_rate[p_none], 0.95 * max_rate[p_dyn], cu.pick(full=10, smoke=6))
sim = pd.DataFrame([{"rate": r, "policy": p, **run(r, p).summary()} for r in rates for p in policies])
sim = sim[sim["rate"] <= sim["policy"].map(max_rate)]
fig = cu.batching_sim.plot_rate_sweep(sim, title=f"resnet18@{res} on {device}: sustainable rates only")
_ = cu.plots.save(fig, "03", "dynamic_batching")

# %% [markdown]
# **What not to do:** compare the policies past saturation. The same overloaded rate, run for twice as long:

# %%
over = 1.5 * max_rate[p_none]
short, long = run(over, p_none), run(over, p_none, n=2 * n_requests)
print(
    f"No batching at {over:.1f} req/s: p99 {short.p99_ms:.0f} ms after {n_requests} requests, "
    f"{long.p99_ms:.0f} ms after {2 * n_requests}: {long.p99_ms / short.p99_ms:.2f}x, "
    "for the same server."
)

# %% [markdown]
# ## Exercise
# **03.max-wait.** The knob you tune in every batching server. Write `choose_max_wait(arrivals_ms, service_ms,
# max_batch_size, p99_target_ms, candidates)`: simulate each candidate `max_wait_ms` with
# `cu.batching_sim.simulate(arrivals_ms, service_ms, max_batch_size=..., max_wait_ms=...)` and return the
# **largest** candidate whose p99 latency meets the target (more waiting means fuller batches: more
# throughput per instance), or `None` if none does. The self-check draws service times, arrival rates and targets
# at random.


# %%
def choose_max_wait(arrivals_ms, service_ms, max_batch_size, p99_target_ms, candidates):
    raise NotImplementedError  # your code here


cu.exercises.check("03.max-wait", choose_max_wait)

# %% [markdown]
# ## What surprised us
# Printed from this run's numbers.

# %%
for r in choice.itertuples():
    print(top_batch_line(r, gains[r.model]))
mlp = choice.set_index("model").loc["digits_mlp"]
if mlp.top_batch > 1 and gains["digits_mlp"] is not None:
    per_item = gains["digits_mlp"].ratio(f"batch {int(mlp.top_batch)}")  # per item: batch-1 time / batch-b time
    print(
        f"2. For the tiny MLP one item at batch {int(mlp.top_batch)} costs {per_item.interval_text} less time than at "
        "batch 1: "
        + (
            "most of a batch-1 call is fixed overhead (dispatch, weight reads), the overhead-bound case from lesson 01."
            if per_item.judge(2.0) == "met"
            else "on this run the fixed cost per call was not shown to dominate."
        )
    )
print(
    f"3. Simulated, {tp_gain.says('dynamic batching', 'no batching', 'the sustainable rate of')}; where both kept "
    + (
        f"up, its p99 was {fair_tail.verdict}: {fair_tail}."
        if fair_tail.verdict in ("lower", "higher")
        else f"up, the p99s were not told apart ({fair_tail})."
    )
)

# %% [markdown]
# ## Summary
# Rows for this machine's results file: batch 1 and the best batch under the budget per model, and the
# simulated server's sustainable rates. Next: **04 · Mixed precision**.

# %%
for r in choice.itertuples():
    df = sweeps[r.model].set_index("batch_size")
    b1 = df.loc[1]
    cu.record(
        "03",
        "batch 1",
        model=r.model,
        device=str(device),
        dtype="fp32",
        batch_size=1,
        median_ms=b1.median_ms,
        p90_ms=b1.p90_ms,
        throughput=b1.throughput,
    )
    if not pd.isna(r.best_batch) and r.best_batch != 1:
        bb = df.loc[int(r.best_batch)]
        cu.record(
            "03",
            "best batch under budget",
            model=r.model,
            device=str(device),
            dtype="fp32",
            batch_size=int(r.best_batch),
            median_ms=bb.median_ms,
            p90_ms=bb.p90_ms,
            throughput=bb.throughput,
            speedup_vs_baseline=gains[r.model].ratio(f"batch {int(r.best_batch)}"),
            notes=f"budget {r.budget_ms:.2f} ms p90; knee {r.knee}",
        )
cu.record(
    "03",
    "dynamic batching (simulated)",
    model=f"resnet18@{res}",
    device=str(device),
    dtype="fp32",
    batch_size=max_batch_size,
    median_ms=fair.loc[p_dyn, "p50_ms"],
    p90_ms=None,
    throughput=max_rate[p_dyn],
    speedup_vs_baseline=tp_gain,
    notes=f"max sustainable {max_rate[p_dyn]:.1f} vs {max_rate[p_none]:.1f} req/s; at {fair_rate:.1f} req/s "
    f"{fair_tail.verdict}: p99 {fair.loc[p_dyn, 'p99_ms']:.1f} vs {fair.loc[p_none, 'p99_ms']:.1f} ms",
)
choice.round(3)
