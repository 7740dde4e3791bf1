# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 09 · Data pipeline
#
# **Goals.** Feed a model real images fast enough. You write the `Dataset` (read, `decode_jpeg`, resize,
# normalize the JPEG photos shipped in `data/images`) and the `DataLoader(...)`; sweep `num_workers`; remove
# the workers' start-up cost with `persistent_workers`; measure the model alone and decide whether the
# **loader or the model** limits end-to-end throughput. For the GPU: `pin_memory=True` vs `False` end to end,
# uint8 batches normalized on the device (4x fewer bytes to copy), a prefetcher that copies the next batch on a
# side stream, and JPEG decoding on the GPU.
#
# **The bottleneck it attacks.** In the taxonomy of *01 · Measuring inference* this is the *input* side of a
# pipeline: the device waits for data, so the model's own speed does not matter. A faster model does not help
# an input-bound pipeline; a faster loader does not help a compute-bound one. Measure both before optimizing.

# %%
import course_utils as cu

device = cu.lesson.start("09", "Data pipeline")

# %%
import os
import time

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import display
from torch.utils.data import DataLoader

from course_utils.techniques import pipeline

SIZE = cu.pick(full=224, smoke=64)  # model input resolution
N_IMAGES = cu.pick(full=64, smoke=16)  # the shipped photos, repeated
BATCH = cu.pick(full=16, smoke=4)
CORES = os.cpu_count() or 1
WORKERS = cu.pick(full=tuple(sorted({0, 1, 2, CORES, CORES + 2})), smoke=(0, 2))
PATHS = cu.data.jpeg_paths()
print(
    f"{len(PATHS)} shipped JPEGs, repeated to {N_IMAGES} samples, resized to {SIZE}x{SIZE}, batch {BATCH}; "
    f"{CORES} cores, torch uses {torch.get_num_threads()} threads"
)

# %% [markdown]
# ## The data set
# A `Dataset` has `__len__` and `__getitem__(i)`; here item *i* does what a real image data set does: read the
# file, decode the JPEG (TorchCodec's `decode_jpeg`, which replaces torchvision.io's image decoders, deprecated
# since torchvision 0.29), resize with antialiasing, then scale to [0, 1] and normalize with the ImageNet mean
# and standard deviation. With `normalize=False` it stops at the resized uint8 image (used on the GPU below).

# %% tags=["export"]
from pathlib import Path

import torch  # noqa: F811 - an exported cell carries its own imports
import torchvision.transforms.v2.functional as F
from torch.utils.data import Dataset

try:
    from torchcodec.decoders import decode_jpeg
except ImportError:  # no TorchCodec here (the lent GPU machine has none): the same call on torchvision.io's decoder
    from course_utils.techniques import pipeline

    def decode_jpeg(raw, mode="RGB", device="cpu"):
        return pipeline.decode_jpeg(raw, device)


MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class PhotoDataset(Dataset):
    """The photos in `paths` repeated to `n` samples; item i = (image, label = which photo)."""

    def __init__(self, paths, n: int, size: int, normalize: bool = True):
        if n < 1 or not paths:
            raise ValueError(f"PhotoDataset needs n >= 1 and some paths (got n={n}, {len(paths)} paths)")
        self.paths, self.n, self.size, self.normalize = [str(p) for p in paths], n, size, normalize

    def __len__(self) -> int:
        return self.n

    def raw(self, i: int) -> torch.Tensor:
        """The encoded JPEG bytes of sample i, as a uint8 tensor (what GPU decoding starts from)."""
        return torch.frombuffer(bytearray(Path(self.paths[i % len(self.paths)]).read_bytes()), dtype=torch.uint8)

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} samples")
        img = decode_jpeg(self.raw(i), mode="RGB")  # read the file, decode: uint8 (3, H, W)
        img = F.resize(img, [self.size, self.size], antialias=True)
        label = i % len(self.paths)
        if not self.normalize:
            return img, label
        return F.normalize(F.to_dtype(img, torch.float32, scale=True), MEAN, STD), label


# %%
# Workers started with "spawn" (macOS, Windows) re-import the Dataset's module, and a notebook is no module: there,
# use this very class from the module that the cell above is exported to (course_utils/from_lessons/).
if torch.multiprocessing.get_start_method() != "fork":
    from course_utils.from_lessons.l09_data_pipeline import PhotoDataset

ds = PhotoDataset(PATHS, N_IMAGES, SIZE)
per_image = []
for i in range(len(PATHS)):
    t0 = time.perf_counter()
    x0, label0 = ds[i]
    per_image.append({"photo": Path(PATHS[i]).name, "ms": (time.perf_counter() - t0) * 1000})
print(f"one sample: {tuple(x0.shape)} {x0.dtype}, mean {x0.mean():.3f}, std {x0.std():.3f}")
pd.DataFrame(per_image)  # the first decode in a process also loads the decoder: it is the slowest

# %% [markdown]
# ## The DataLoader, and the same batches from worker processes
# `DataLoader(ds, batch_size=..., num_workers=w)` with `w > 0` starts `w` processes; each runs `__getitem__`
# for whole batches and collates them, the main process only receives finished batches. Correct before fast:
# with `shuffle=False` the batches from workers must equal those of the main process (fp32 tolerance of
# `cu.check_outputs`).

# %%
ref_batch = next(iter(DataLoader(ds, batch_size=BATCH, num_workers=0)))[0]
with pipeline.loader_batches(DataLoader(ds, batch_size=BATCH, num_workers=max(WORKERS))) as batches:
    worker_batch = next(batches)[0]  # loader_batches stops the workers when we leave early
_ = cu.check_outputs(worker_batch, ref_batch, "fp32", label=f"num_workers={max(WORKERS)} vs 0")

# %% [markdown]
# ## Sweep `num_workers`
# One pass over the data set per setting, timed from `iter(loader)` (worker start-up included) to the last
# batch. The time to the first batch shows the start-up.

# %%
sweep_rows = []
for w in WORKERS:
    loader = DataLoader(ds, batch_size=BATCH, num_workers=w)
    n, first = 0, None
    t0 = time.perf_counter()
    for x, _ in loader:
        first = first if first is not None else time.perf_counter() - t0
        n += x.shape[0]
    total = time.perf_counter() - t0
    sweep_rows.append({"num_workers": w, "first batch ms": first * 1000, "images/s": n / total})
sweep_df = pd.DataFrame(sweep_rows)
base_ips = float(sweep_df.loc[sweep_df["num_workers"] == 0, "images/s"].iloc[0])
sweep_df

# %% [markdown]
# One pass per setting says little on a busy machine: the best setting, the main process and (where it exists)
# the best setting with more workers than cores then run again, taking turns in rounds (lesson 01), for ratios
# with their intervals.


# %%
def loader_pass(w):
    """Images/s of one pass over `ds` with `w` workers (start-up included), for cu.comparing.compare_runs."""

    def run():
        n, t0 = 0, time.perf_counter()
        for x, _ in DataLoader(ds, batch_size=BATCH, num_workers=w):
            n += x.shape[0]
        return n / (time.perf_counter() - t0)

    return run


with_workers = sweep_df[sweep_df["num_workers"] > 0]
best_w = int(with_workers.loc[with_workers["images/s"].idxmax(), "num_workers"])  # the best setting with workers
over_cores = sweep_df[sweep_df["num_workers"] > CORES]
best_over = int(over_cores.loc[over_cores["images/s"].idxmax(), "num_workers"]) if len(over_cores) else None
within = with_workers[with_workers["num_workers"] <= CORES]
best_within = int(within.loc[within["images/s"].idxmax(), "num_workers"]) if len(within) else best_w
settings = sorted({0, best_w, best_within} | ({best_over} if best_over is not None else set()))
workers_cmp = cu.comparing.compare_runs(
    {f"num_workers={w}": loader_pass(w) for w in settings},
    baseline="num_workers=0",
    rounds=6,  # the fewest whose median has a 95% interval: the bottleneck verdict below reads it
    higher_is_better=True,
    metric="images/s",
)
display(workers_cmp.table().round(3))
print(f"num_workers={best_w} vs 0: {workers_cmp.ratio(f'num_workers={best_w}')} the images/s")

# %% [markdown]
# ## The first batch: `persistent_workers`
# Every pass over a loader with workers starts its processes again, and a pass waits for them. A serving job
# or a training loop makes many passes: with `persistent_workers=True` the workers stay between passes.

# %%
W = best_w  # the best setting with workers (timed in the rounds above)
persist_rows = []
for persistent in (False, True):
    loader = DataLoader(ds, batch_size=BATCH, num_workers=W, persistent_workers=persistent)
    for epoch in range(3):
        t0 = time.perf_counter()
        it = iter(loader)
        next(it)
        first = time.perf_counter() - t0
        for _ in it:
            pass
        persist_rows.append(
            {
                "persistent_workers": persistent,
                "pass": epoch,
                "first batch ms": first * 1000,
                "pass s": time.perf_counter() - t0,
            }
        )
    del it, loader  # a persistent loader's workers end with it
persist = pd.DataFrame(persist_rows)
display(persist.pivot(index="pass", columns="persistent_workers", values="first batch ms"))
later = persist[persist["pass"] > 0].groupby("persistent_workers")["first batch ms"].median()
print(
    f"num_workers={W}: after the first pass, the first batch took {later[False]:.0f} ms with workers restarted "
    f"and {later[True]:.0f} ms with persistent workers."
)

# %% [markdown]
# ## The model alone, then loader and model together
# Two models on a batch already in memory: ResNet-18 (random weights, fine for speed) and a deliberately tiny
# CNN, the stand-in for a model that runs very fast (as most models do on a GPU). With workers, loading and
# computing overlap, so the pipeline runs at the **slower** of the two: `min(loader, model)`; with
# `num_workers=0` they take turns: `1 / (1/L + 1/M)`. The end-to-end loop below (it runs unchanged on a
# GPU, where `non_blocking` and the final `synchronize` matter) measures what really happens.


# %% tags=["contract"]
def images_per_s(loader, model, device, prepare=None) -> float:
    """One pass: each batch to `device` (non_blocking), optional `prepare` on the device, the model; synchronized."""
    dm = torch.get_device_module(device)
    n = 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for x, _ in loader:
            x = x.to(device, non_blocking=True)
            model(prepare(x) if prepare is not None else x)
            n += x.shape[0]
    dm.synchronize()  # GPU work is asynchronous: wait for it before reading the clock
    return n / (time.perf_counter() - t0)


# %%
resnet, note = cu.models.resnet("resnet18")
print(f"ResNet-18: {note}")
models = {"resnet18": resnet, "tiny_cnn": pipeline.tiny_cnn()}
x_mem = torch.stack([ds[i][0] for i in range(BATCH)])
model_ips, model_rates = {}, {}
with torch.inference_mode():
    for name, m in models.items():
        meas = cu.measure(
            lambda m=m: m(x_mem),
            device="cpu",
            batch_size=BATCH,
            label=name,
            warmup=1,
            min_repeats=cu.pick(full=9, smoke=6),  # 6 calls at least: the median of its rate gets a 95% interval
            min_time_s=cu.pick(full=0.5, smoke=0.05),
        )
        model_ips[name] = meas.throughput
        model_rates[name] = [BATCH * 1e3 / t for t in meas.times_ms]  # images/s of each call, for an interval
        print(meas)
        cu.record("09", f"model alone ({name})", model=name, device="cpu", dtype="fp32", measurement=meas)
rows = []
for name, m in models.items():
    for w in (0, W):
        loader_ips = float(sweep_df.loc[sweep_df["num_workers"] == w, "images/s"].iloc[0])
        measured = images_per_s(DataLoader(ds, batch_size=BATCH, num_workers=w), m, "cpu")
        predicted = min(loader_ips, model_ips[name]) if w else 1 / (1 / loader_ips + 1 / model_ips[name])
        # which side limits: the loader's rounds above against the model's calls, from their medians' intervals
        limit = cu.intervals.tail_says(
            "the loader", workers_cmp.per_round[f"num_workers={w}"], "the model", model_rates[name], q=0.5,
            what="median", unit="img/s", samples="passes",
        )  # fmt: skip
        rows.append(
            {
                "model": name,
                "num_workers": w,
                "loader img/s": loader_ips,
                "model img/s": model_ips[name],
                "bottleneck": {"lower": "loader", "higher": "model"}.get(limit.verdict, "not shown"),
                "predicted img/s": predicted,
                "measured img/s": measured,
            }
        )
e2e = pd.DataFrame(rows)
e2e

# %%
fig, ax = plt.subplots(figsize=(8, 4))
ax.bar(sweep_df["num_workers"].astype(str), sweep_df["images/s"], color="tab:blue", label="loader alone")
for (name, ips), color in zip(model_ips.items(), ("tab:red", "tab:green"), strict=False):
    ax.axhline(ips, color=color, ls="--", label=f"{name} alone")
ax.set_yscale("log")
ax.set_xlabel("num_workers")
ax.set_ylabel("images/s (log)")
ax.set_title("Loader throughput vs the model's: the lower line is the ceiling")
ax.legend()
fig.tight_layout()
_ = cu.plots.save(fig, "09", "loader_vs_model")

# %%
# The loader's images/s over the rounds above (num_workers=W) against the model's over its calls: which one
# limits the pipeline is decided by their intervals, not by two single numbers.
loader_rounds = workers_cmp.per_round[f"num_workers={W}"]
vs_main = workers_cmp.ratio(f"num_workers={W}")
if vs_main.verdict == "slower":
    print(
        f"With {W} workers the loader was slower than in the main process ({vs_main} the images/s): on this machine "
        "the workers cost more than they give, and the pipeline below inherits that."
    )
for name in models:
    r = e2e[(e2e["model"] == name) & (e2e["num_workers"] == W)].iloc[0]
    limit = cu.intervals.tail_says(
        "the loader", loader_rounds, "the model", model_rates[name], q=0.5, what="median", unit="img/s",
        samples="passes",
    )  # fmt: skip
    # "the slower stage sets the pace" holds only when the stages run side by side without slowing each other:
    # the end-to-end rate it predicts must hold before either stage is called the bottleneck
    pace = cu.intervals.prediction_says("images/s", r["predicted img/s"], r["measured img/s"])
    if pace.verdict != "held":
        advice = (
            "the pipeline did not run at its slower stage's rate, so the stages slowed each other down (here they "
            f"share {CORES} cores): neither is shown to be the bottleneck, and the end-to-end rate is what to improve"
        )
    else:
        advice = {
            "lower": "the loader is the bottleneck: speeding up the model would change nothing here",
            "higher": "the model is the bottleneck: a faster loader would change nothing here",
        }.get(limit.verdict, "neither is shown to be the bottleneck: speeding up either may help")
    print(f"{name}, num_workers={W}: {limit}. End to end, one pass: {pace}: {advice}.")
    cu.record(
        "09",
        f"end to end ({name}, workers={W})",
        model=name,
        device="cpu",
        dtype="fp32",
        batch_size=BATCH,
        throughput=r["measured img/s"],
        notes=f"bottleneck={r['bottleneck']}",
    )
err = (e2e["measured img/s"] / e2e["predicted img/s"] - 1).abs()
print(
    f"Measured rates differ from the simple prediction by {err.min():.0%} to {err.max():.0%}: workers and the "
    f"model's threads share the same {CORES} cores here."
)

# %% [markdown]
# ## What surprised us
# Printed from this run: how much a worker process costs to start, and whether more workers than cores help
# (they only can when the workers wait on something other than a core, such as slow storage).

# %%
w0, wmax = sweep_df.iloc[0], sweep_df.iloc[-1]
print(
    f"Time to the first batch: {w0['first batch ms']:.0f} ms in the main process, {wmax['first batch ms']:.0f} ms "
    f"with {int(wmax['num_workers'])} workers (the processes must start first)."
)
if best_over is not None and best_over != best_within:
    gain = workers_cmp.ratio(f"num_workers={best_over}", vs=f"num_workers={best_within}")
    print(
        f"More workers than cores ({best_over}) vs the best with at most {CORES} ({best_within}): {gain}: "
        + ("a gain." if gain.verdict == "faster" else "no gain shown: decoding needs cores and there are no more.")
    )

# %% [markdown]
# ## Exercise: a loader for slow storage
# Data often comes from a network file system or an object store, where reading a file mostly **waits**.
# Write `make_fast_loader(dataset)`: return a `DataLoader` over `dataset` with `batch_size=8`, batches in
# order, that reaches the target the check sets on this machine (2.5 times the rate of
# `DataLoader(dataset, batch_size=8)`) over 3 passes. The check's data set waits 40 ms per sample on
# simulated storage, holds different random images at every check and every pass, and logs which process read
# each sample: it rejects changed batches, batches kept from an earlier pass (every pass must read the data
# set), samples read in the main process, a loader over a copy of the data, and a rate below the target; it
# prints what you reached.


# %%
def make_fast_loader(dataset) -> DataLoader:
    raise NotImplementedError  # your code here


cu.exercises.check("09.loader", make_fast_loader)

# %% [markdown]
# ## On a GPU
# **Verification level: contract-tested** where noted: `tests/gpu_contract/test_l09_loader.py` runs this
# lesson's `images_per_s`, `normalize_on_device`, `DevicePrefetcher` and `gpu_decode` on the CPU (the
# prefetcher's stream ordering against a recording device module); the measurements themselves have **not yet
# been executed on a GPU** by the course, unless reference results appear instead.
#
# **Pinned memory, end to end (the source tutorial's experiment).** A copy from ordinary (pageable) memory goes
# through a staging buffer of the driver and blocks the CPU; from page-locked (pinned) memory the GPU's copy
# engine reads directly, and `non_blocking=True` returns at once. `DataLoader(pin_memory=True)` pins each batch
# in a background thread of the main process. Measured: the whole loop, loader + copy + model, both ways.
# Pinned memory is slow to allocate, so PyTorch caches it: `torch.cuda.host_memory_stats()` shows the cache.

# %%
if cu.gpu_section("09.pin-memory"):
    gpu_model, _ = cu.models.resnet("resnet18", device="cuda")
    mem_ds = torch.utils.data.TensorDataset(torch.stack([ds[i][0] for i in range(N_IMAGES)]), torch.zeros(N_IMAGES))
    pin_rows, pin_cmp = [], {}
    for source, data in (("JPEG loader", ds), ("in memory", mem_ds)):
        loaders = {
            pin: DataLoader(data, batch_size=BATCH, num_workers=W if data is ds else 0, pin_memory=pin)
            for pin in (False, True)
        }
        for loader in loaders.values():
            images_per_s(loader, gpu_model, "cuda")  # warm-up: cuDNN, the pinned-memory cache
        pin_cmp[source] = cu.comparing.compare_runs(  # both settings take turns in rounds
            {f"pin_memory={p}": (lambda ld=ld: images_per_s(ld, gpu_model, "cuda")) for p, ld in loaders.items()},
            baseline="pin_memory=False",
            rounds=cu.pick(full=6, smoke=3),
            higher_is_better=True,
            metric="images/s",
            device="cuda",
        )
        for p in (False, True):
            pin_rows.append({"source": source, "pin_memory": p,
                             "images/s": pin_cmp[source].measurements[f"pin_memory={p}"].median_ms})  # fmt: skip
    pins = pd.DataFrame(pin_rows).pivot(index="source", columns="pin_memory", values="images/s")
    display(pins)
    for source, r in pins.iterrows():
        ratio = pin_cmp[source].ratio("pin_memory=True")
        print(
            f"{source}: {ratio.says('pin_memory=True', 'pin_memory=False', 'the rate of')}" + cu.modes.standin_label()
        )
        cu.record(
            "09",
            f"gpu end to end pin_memory=True ({source})",
            model="resnet18",
            device="cuda",
            dtype="fp32",
            batch_size=BATCH,
            throughput=r[True],
            speedup_vs_baseline=pin_cmp[source].ratio("pin_memory=True"),
        )
    stats = torch.cuda.host_memory_stats()
    print(
        {
            k: v
            for k, v in stats.items()
            if k.startswith(
                (
                    "num_host_alloc",
                    "num_host_free",
                    "allocated_bytes.current",
                    "reserved_bytes.current",
                    "segment.current",
                )
            )
        }
    )
    big = torch.randn(BATCH, 3, 224, 224)
    t0 = time.perf_counter()
    p1 = big.pin_memory()
    first_ms = (time.perf_counter() - t0) * 1000
    del p1  # back to PyTorch's pinned cache, not to the OS
    t0 = time.perf_counter()
    p2 = big.pin_memory()
    again_ms = (time.perf_counter() - t0) * 1000
    print(
        f"pin_memory() of {big.nbytes / 2**20:.0f} MiB: {first_ms:.2f} ms the first time, {again_ms:.2f} ms again "
        "(the cached block is reused: only the host copy remains). host_memory_stats counts the page-locked "
        "allocations PyTorch made and still holds."
    )
else:
    cu.results.show_reference("09", "pin_memory")

# %% [markdown]
# **uint8 over the wire, normalization on the device.** A normalized float32 image is 4 bytes per value; the
# resized uint8 image is 1. Copy uint8 and normalize where the model runs (the same arithmetic, a few
# microseconds on a GPU). Correct before fast, here on this machine's device:


# %% tags=["contract"]
def normalize_on_device(x):
    """uint8 batch (N, 3, H, W) on any device -> float32, scaled to [0, 1] and ImageNet-normalized there."""
    mean = torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=x.device).view(1, 3, 1, 1)
    return (x.float() / 255 - mean) / std


# %%
ds_u8 = PhotoDataset(PATHS, N_IMAGES, SIZE, normalize=False)
u8_batch = next(iter(DataLoader(ds_u8, batch_size=BATCH)))[0]
_ = cu.check_outputs(
    normalize_on_device(u8_batch.to(device)).cpu(),
    ref_batch,
    "fp32",
    label="uint8 batch normalized on the device vs float32 loader",
)
print(
    f"bytes per batch to copy: float32 {ref_batch.nbytes / 2**20:.2f} MiB, uint8 {u8_batch.nbytes / 2**20:.2f} MiB "
    f"({ref_batch.nbytes / u8_batch.nbytes:.0f}x fewer)"
)

if cu.gpu_section("09.uint8-transfer"):
    runs_u8 = {}
    for label, data, prep in (("float32 batches", ds, None), ("uint8 + normalize on GPU", ds_u8, normalize_on_device)):
        loader = DataLoader(data, batch_size=BATCH, num_workers=W, pin_memory=True, persistent_workers=True)
        images_per_s(loader, gpu_model, "cuda", prepare=prep)  # warm-up
        runs_u8[label] = lambda ld=loader, prep=prep: images_per_s(ld, gpu_model, "cuda", prepare=prep)
    u8_cmp = cu.comparing.compare_runs(  # the two pipelines take turns in rounds
        runs_u8,
        baseline="float32 batches",
        rounds=cu.pick(full=6, smoke=3),
        higher_is_better=True,
        metric="images/s",
        device="cuda",
    )
    del runs_u8, loader  # the persistent workers end with their loaders
    u8 = u8_cmp.table().set_index("variant")
    display(u8.round(3))
    gain = u8_cmp.ratio("uint8 + normalize on GPU")
    print(f"{gain.says('uint8 transfer + GPU normalization', 'the float32 pipeline', 'the rate of')}"
          + cu.modes.standin_label())  # fmt: skip
    cu.record(
        "09",
        "gpu uint8 transfer + normalize on GPU",
        model="resnet18",
        device="cuda",
        dtype="fp32",
        batch_size=BATCH,
        throughput=float(u8.loc["uint8 + normalize on GPU", "median"]),
        speedup_vs_baseline=gain,
    )
else:
    cu.results.show_reference("09", "uint8")

# %% [markdown]
# **A prefetcher: copy batch *i+1* while batch *i* computes.** The copy runs on a side stream; before the
# caller uses a batch, its stream waits for the copy (`wait_stream`), and `record_stream` tells the caching
# allocator that the batch, allocated on the side stream, is used on the caller's. Written against
# `torch.get_device_module(device)`, it also runs on this CPU (stand-in streams: same batches, no overlap).
# Overlap can hide only the shorter of copy and compute, and only when the loader is not the bottleneck: on the
# GPU it runs over batches already in pinned memory, with the model whose compute time is closest to the
# copy time.


# %% tags=["contract"]
class DevicePrefetcher:
    """Iterate a loader's batches already on `device`; the next batch is copied on a side stream meanwhile."""

    def __init__(self, loader, device):
        self.loader, self.device = loader, device
        self.dm = torch.get_device_module(device)
        self.stream = self.dm.Stream()

    def _start_copy(self, batch):
        if batch is None:
            return None
        with self.dm.stream(self.stream):
            return [t.to(self.device, non_blocking=True) for t in batch]

    def __iter__(self):
        main = self.dm.current_stream()
        it = iter(self.loader)
        nxt = self._start_copy(next(it, None))
        while nxt is not None:
            main.wait_stream(self.stream)  # the copy of this batch is done before the caller uses it
            batch = nxt
            if not isinstance(main, torch.cpu.Stream):  # torch.cpu's stand-in streams have no allocator to tell
                for t in batch:
                    t.record_stream(main)
            nxt = self._start_copy(next(it, None))  # runs on the side stream while the caller computes
            yield batch


# %%
cpu_batches = [b for b, _ in DataLoader(ds, batch_size=BATCH)]
prefetched = [xb for xb, _ in DevicePrefetcher(DataLoader(ds, batch_size=BATCH), device)]
_ = cu.check_outputs(torch.cat(prefetched).cpu(), torch.cat(cpu_batches), "fp32", label="prefetched vs loader batches")

if cu.gpu_section("09.prefetch"):
    host = torch.stack([ds[i % len(PATHS)][0] for i in range(BATCH)]).pin_memory()  # pinned once
    dbuf = host.cuda()
    copy_ms = cu.measure(lambda: dbuf.copy_(host, non_blocking=True), device="cuda").median_ms
    tiny_gpu = pipeline.tiny_cnn().cuda()
    with torch.inference_mode():
        comp = {
            n: cu.measure(lambda m=m: m(dbuf), device="cuda").median_ms
            for n, m in (("resnet18", gpu_model), ("tiny_cnn", tiny_gpu))
        }
    pname = min(comp, key=lambda n: abs(comp[n] / copy_ms - 1))
    pmodel = gpu_model if pname == "resnet18" else tiny_gpu
    print(
        f"per batch: copy {copy_ms:.3f} ms; compute {', '.join(f'{n} {v:.3f} ms' for n, v in comp.items())}: "
        f"prefetching with {pname}"
    )
    pinned = DataLoader(mem_ds, batch_size=BATCH, pin_memory=True)
    plain = images_per_s(pinned, pmodel, "cuda")

    def prefetched_ips() -> float:
        n, t0 = 0, time.perf_counter()
        with torch.inference_mode():
            for xb, _ in DevicePrefetcher(pinned, "cuda"):
                pmodel(xb)
                n += xb.shape[0]
        torch.cuda.synchronize()
        return n / (time.perf_counter() - t0)

    prefetched_ips()  # warm-up
    pf_cmp = cu.comparing.compare_runs(  # the plain loop and the prefetcher take turns in rounds
        {"plain pinned loop": lambda: images_per_s(pinned, pmodel, "cuda"), "prefetcher": prefetched_ips},
        baseline="plain pinned loop",
        rounds=cu.pick(full=6, smoke=3),
        higher_is_better=True,
        metric="images/s",
        device="cuda",
    )
    plain = pf_cmp.measurements["plain pinned loop"].median_ms  # for compare_runs: the median of the runs' img/s
    pref = pf_cmp.measurements["prefetcher"].median_ms
    print(
        f"plain pinned loop {plain:.0f} img/s, with the prefetcher {pref:.0f} img/s (medians): "
        f"{pf_cmp.ratio('prefetcher').says('the prefetcher', 'the plain loop', 'the rate of')}"
        + cu.modes.standin_label()
    )
    cu.record(
        "09",
        "gpu prefetcher",
        model=pname,
        device="cuda",
        dtype="fp32",
        batch_size=BATCH,
        throughput=pref,
        speedup_vs_baseline=pf_cmp.ratio("prefetcher"),
    )
else:
    cu.results.show_reference("09", "prefetch")

# %% [markdown]
# **Decoding on the GPU.** Only the compressed JPEG bytes cross PCIe: `decode_jpeg(list, device="cuda")` decodes
# a whole list with nvJPEG, and resize and normalization run on GPU tensors. The function runs on the CPU too
# (TorchCodec decodes a list there as well), where it must match the loader at the FP32 tolerance. On a GPU
# two things round differently: nvJPEG's decoder is not libjpeg, and torchvision resizes a uint8 image on CUDA
# through float32 and rounds back (its CPU path has a native uint8 kernel). The results differ by an intensity
# level here and there, about 1e-2 relative after normalization: FP32's 1e-4 would fail a correct pipeline. So
# the GPU comparison is made on the uint8 images themselves, in intensity levels (`uint8_levels`).
# (NVIDIA DALI, named by the source tutorial, is a library for whole GPU input pipelines; it is not part of
# this course's install.)


# %% tags=["contract"]
def gpu_decode_u8(raws, size, device):
    """Encoded JPEGs (1-D uint8 CPU tensors) -> resized uint8 batch (N, 3, size, size) on `device`, decoded there."""
    imgs = decode_jpeg(list(raws), mode="RGB", device=device)
    return torch.stack([F.resize(img, [size, size], antialias=True) for img in imgs])


def gpu_decode(raws, size, device):
    """Encoded JPEGs -> normalized float32 batch on `device`: decode and resize there, then normalize there."""
    return normalize_on_device(gpu_decode_u8(raws, size, device))


UINT8_TOL = {"mean": 1.5, "p99": 5, "max": 32}  # intensity levels (of 255): decoder and resize rounding


def uint8_levels(out, ref) -> dict:
    """How far two uint8 image batches are apart, in intensity levels; raises when beyond `UINT8_TOL`."""
    if out.shape != ref.shape or out.dtype != torch.uint8 or ref.dtype != torch.uint8:
        raise ValueError(
            f"compare uint8 batches of one shape: got {out.dtype} {tuple(out.shape)}, {ref.dtype} {tuple(ref.shape)}"
        )
    d = (out.cpu().int() - ref.cpu().int()).abs().float()
    got = {"mean": float(d.mean()), "p99": float(d.flatten().quantile(0.99)), "max": float(d.max())}
    over = [f"{k} {got[k]:.2f} > {UINT8_TOL[k]}" for k in got if got[k] > UINT8_TOL[k]]
    print(
        f"uint8 levels apart: mean {got['mean']:.3f}, p99 {got['p99']:.0f}, max {got['max']:.0f} "
        + (f"OUTSIDE ({'; '.join(over)})" if over else f"OK (tolerance {UINT8_TOL})")
    )
    if over:
        raise cu.errors.ToleranceError(f"uint8 images differ beyond the decode/resize rounding: {'; '.join(over)}")
    return got


# %%
raws = [ds.raw(i) for i in range(BATCH)]  # the encoded bytes: nvJPEG decodes them on the GPU
# the same code on the CPU: the same kernels as the loader, so the FP32 tolerance holds
_ = cu.check_outputs(gpu_decode(raws, SIZE, "cpu"), ref_batch, "fp32", label="gpu_decode on cpu vs loader")

if cu.gpu_section("09.gpu-decode", needs=("torchcodec",)):
    _ = uint8_levels(gpu_decode_u8(raws, SIZE, "cuda"), u8_batch)  # nvJPEG + CUDA resize vs the CPU loader's uint8
    gpu_batch = gpu_decode(raws, SIZE, "cuda")
    m_gpu = cu.measure(lambda: gpu_decode(raws, SIZE, "cuda"), device="cuda", batch_size=BATCH, label="GPU decode")
    print(m_gpu)

    def gpu_decode_pass():
        """Images/s decoding as many images as the CPU loader's pass reads, BATCH JPEGs per list."""
        n, t0 = 0, time.perf_counter()
        while n < N_IMAGES:
            gpu_decode(raws, SIZE, "cuda")
            n += BATCH
        torch.cuda.synchronize()
        return n / (time.perf_counter() - t0)

    dec_cmp = cu.comparing.compare_runs(  # the best CPU loader and GPU decoding take turns in rounds
        {f"CPU loader, num_workers={best_w}": loader_pass(best_w), "GPU decode": gpu_decode_pass},
        baseline=f"CPU loader, num_workers={best_w}",
        rounds=cu.pick(full=6, smoke=3),
        higher_is_better=True,
        metric="images/s",
        device="cuda",
    )
    print(f"{dec_cmp.ratio('GPU decode').says('GPU decoding', 'the best CPU loader', 'the rate of')}"
          + cu.modes.standin_label())  # fmt: skip
    cu.record(
        "09",
        "gpu decode+preprocess",
        model="preprocess",
        device="cuda",
        dtype="fp32",
        measurement=m_gpu,
        speedup_vs_baseline=dec_cmp.ratio("GPU decode"),
    )
else:
    cu.results.show_reference("09", "gpu decode")

# %% [markdown]
# ## Summary
# * Measure the loader alone, the model alone and both together; the slower side sets the pace.
# * `num_workers` moves decoding into processes: more workers than cores help only when workers wait (storage),
#   not when they decode; `persistent_workers=True` pays the start-up once instead of every pass.
# * On a GPU: `pin_memory=True` with `.to(device, non_blocking=True)`, copy uint8 and normalize on the device,
#   prefetch the next batch on a side stream, or decode on the GPU when the CPU cannot keep up.
#
# Rows were written to this machine's results file. Next: **10 · Streams and async**.

# %%
best = sweep_df.loc[sweep_df["images/s"].idxmax()]
cu.record(
    "09",
    f"loader num_workers={int(best['num_workers'])} (best)",
    model="jpeg loader",
    device="cpu",
    dtype="fp32",
    batch_size=BATCH,
    throughput=float(best["images/s"]),
    speedup_vs_baseline=workers_cmp.ratio(f"num_workers={int(best['num_workers'])}") if best["num_workers"] else 1.0,
    notes=f"sweep {list(WORKERS)}",
)
_ = cu.record(
    "09",
    "loader num_workers=0 (baseline)",
    model="jpeg loader",
    device="cpu",
    dtype="fp32",
    batch_size=BATCH,
    throughput=base_ips,
    speedup_vs_baseline=1.0,
)
