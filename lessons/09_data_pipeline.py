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
# **Goals.** Feed a model real images fast enough: decode, resize and normalize the JPEG photos shipped in
# `data/images` with a `Dataset` and a `DataLoader`; sweep `num_workers` and measure images/s; measure the
# model alone; decide from both numbers whether the **loader or the model** limits end-to-end throughput.
# On a GPU: `pin_memory=True` + `non_blocking=True`, prefetching the next batch onto the GPU while the
# current one runs, preprocessing on the GPU (`decode_jpeg(device="cuda")`, transforms on GPU tensors), and
# the pitfall that pinning memory on every call can be slower than not pinning at all.
#
# **The bottleneck it attacks.** In the taxonomy of *01 · Measuring inference* this is the *input* side
# of a pipeline: the device (or the model's cores) waits for data, so the model's own speed does not
# matter. A faster model does not help an input-bound pipeline; a faster loader does not help a
# compute-bound one. Measure both before optimizing either.

# %%
import course_utils as cu

device = cu.lesson.start("09", "Data pipeline")

# %%
import os
import time

import matplotlib.pyplot as plt
import pandas as pd
import torch

from course_utils import pipeline as pl

SIZE = cu.pick(full=224, smoke=64)  # model input resolution
N_IMAGES = cu.pick(full=96, smoke=8)  # the shipped photos, repeated
BATCH = cu.pick(full=16, smoke=4)
CORES = os.cpu_count() or 1
WORKERS = cu.pick(full=tuple(sorted({0, 1, 2, CORES, CORES + 1})), smoke=(0, 1, 2))  # up to one more than cores
print(f"JPEG decoder: {pl.jpeg_decoder()}")
print(f"{len(cu.data.jpeg_paths())} shipped JPEGs, repeated to {N_IMAGES} samples, resized to {SIZE}x{SIZE}, "
      f"batch {BATCH}; torch uses {torch.get_num_threads()} threads")  # fmt: skip

# %% [markdown]
# ## The data set
# `cu.pipeline.JpegDataset` does per sample what a real image data set does: read the file, decode the
# JPEG (`cu.pipeline.decode_jpeg`: TorchCodec's `decode_jpeg`, which replaces torchvision.io's image
# decoders, deprecated since torchvision 0.29), resize with antialiasing, scale to [0, 1] and normalize with the
# ImageNet mean and standard deviation (`torchvision.transforms.v2.functional`, which works on tensors of
# any device: the GPU section below reuses the same function). Photos differ in size, so decode cost differs.

# %%
ds = pl.JpegDataset(N_IMAGES, size=SIZE)
x0, label0 = ds[0]
print(f"one sample: {tuple(x0.shape)} {x0.dtype}, label {label0}, mean {x0.mean():.3f}, std {x0.std():.3f}")
per_image = []
for i, path in enumerate(ds.paths):
    t0 = time.perf_counter()
    ds[i]
    per_image.append({"photo": path.rsplit("/", 1)[-1], "ms": (time.perf_counter() - t0) * 1000})
pd.DataFrame(per_image)

# %% [markdown]
# ## Baseline: the loader in the main process (`num_workers=0`), and the same batches from workers
# Correct before fast: batches from worker processes must be the same tensors as batches from the main
# process (same order, `shuffle=False`). Compared with the fp32 tolerance of `cu.compare`.

# %%
def first_batch(num_workers: int) -> torch.Tensor:
    loader = pl.make_loader(ds, batch_size=BATCH, num_workers=num_workers)
    with pl.loader_batches(loader) as batches:  # workers are shut down when the block ends
        return next(batches)[0]


ref_batch = first_batch(0)
_ = cu.check_outputs(first_batch(max(WORKERS)), ref_batch, "fp32", label=f"num_workers={max(WORKERS)} vs 0")

# %% [markdown]
# ## Sweep `num_workers`
# Each worker is a separate process that runs `__getitem__` and collates batches; the main process only
# receives finished batches. Each pass starts fresh workers (no `persistent_workers`), so their start-up
# cost is included: the time to the first batch shows it.

# %%
sweep_df = pl.num_workers_sweep(ds, WORKERS, batch_size=BATCH)
base_ips = float(sweep_df.loc[sweep_df["num_workers"] == 0, "images_per_s"].iloc[0])
sweep_df["speedup_vs_0"] = sweep_df["images_per_s"] / base_ips
sweep_df

# %% [markdown]
# ## The model alone
# Two models on batches already in memory: ResNet-18 (random weights, fine for speed) and a deliberately
# tiny CNN, the stand-in for a model that runs very fast (as most models do on a GPU). Timed with `cu.measure`.

# %%
resnet, note = cu.models.resnet("resnet18")
print(f"ResNet-18: {note}")
models = {"resnet18": resnet, "tiny_cnn": pl.tiny_cnn()}
x_mem = torch.stack([ds[i][0] for i in range(BATCH)])
model_ips = {}
with torch.inference_mode():
    for name, m in models.items():
        meas = cu.measure(lambda m=m: m(x_mem), device="cpu", batch_size=BATCH, label=name, warmup=1,
                          min_repeats=cu.pick(full=5, smoke=2), min_time_s=cu.pick(full=0.5, smoke=0.05))  # fmt: skip
        model_ips[name] = meas.throughput
        print(meas)
        cu.record("09", f"model alone ({name})", model=name, device="cpu", dtype="fp32", measurement=meas)

# %% [markdown]
# ## Loader or model: which is the bottleneck?
# With workers, loading and computing overlap (workers prepare the next batches while the main process
# runs the model), so the best end-to-end rate is the **slower** of the two: `min(loader, model)`. With
# `num_workers=0` they take turns, and the rates combine like resistors in parallel: `1 / (1/L + 1/M)`.
# On a machine with few cores, workers and the model's threads compete for the same cores, so measure
# end to end as well.

# %%
best_w = int(sweep_df.loc[sweep_df["images_per_s"].idxmax(), "num_workers"])
best_w = best_w if best_w > 0 else max(WORKERS)
rows = []
for name, m in models.items():
    for w in (0, best_w):
        loader_ips = float(sweep_df.loc[sweep_df["num_workers"] == w, "images_per_s"].iloc[0])
        measured = pl.end_to_end(pl.make_loader(ds, batch_size=BATCH, num_workers=w), m)
        if w == 0:
            predicted = 1 / (1 / loader_ips + 1 / model_ips[name])
        else:
            predicted = min(loader_ips, model_ips[name])
        rows.append({"model": name, "num_workers": w, "loader img/s": loader_ips, "model img/s": model_ips[name],
                     "bottleneck": "loader" if loader_ips < model_ips[name] else "model",
                     "predicted img/s": predicted, "measured img/s": measured["images_per_s"]})  # fmt: skip
e2e = pd.DataFrame(rows)
e2e

# %%
fig, ax = plt.subplots(figsize=(8, 4))
ax.bar(sweep_df["num_workers"].astype(str), sweep_df["images_per_s"], color="tab:blue", label="loader alone")
for (name, ips), color in zip(model_ips.items(), ("tab:red", "tab:green"), strict=False):
    ax.axhline(ips, color=color, ls="--", label=f"{name} alone")
ax.set_yscale("log")
ax.set_xlabel("num_workers")
ax.set_ylabel("images/s (log)")
ax.set_title("Loader throughput vs the model's: the lower line is the ceiling")
ax.legend()
fig.tight_layout()

# %%
for name in models:
    r = e2e[(e2e["model"] == name) & (e2e["num_workers"] == best_w)].iloc[0]
    ratio = r["model img/s"] / r["loader img/s"]
    if r["bottleneck"] == "loader":
        print(f"{name}: the loader ({r['loader img/s']:.0f} img/s) is {ratio:.1f}x slower than the model "
              f"({r['model img/s']:.0f} img/s): end to end it reached {r['measured img/s']:.0f} img/s. "
              "Speeding up this model would change nothing; more workers, cheaper decoding or GPU "
              "preprocessing would.")  # fmt: skip
    else:
        print(f"{name}: the model ({r['model img/s']:.0f} img/s) is {1 / ratio:.1f}x slower than the loader "
              f"({r['loader img/s']:.0f} img/s): end to end it reached {r['measured img/s']:.0f} img/s. "
              "Here the model is the bottleneck; a faster loader would change nothing.")  # fmt: skip
    cu.record("09", f"end to end ({name}, workers={best_w})", model=name, device="cpu", dtype="fp32",
              batch_size=BATCH, throughput=r["measured img/s"],
              notes=f"bottleneck={r['bottleneck']}; loader {r['loader img/s']:.1f} img/s")  # fmt: skip

# %% [markdown]
# ## What surprised us
# Printed from this run: worker start-up, whether more workers than cores help, and how far the measured
# end-to-end rate is from the simple prediction.

# %%
cores = CORES
w0 = sweep_df.iloc[0]
wmax = sweep_df.iloc[-1]
print(f"Time to the first batch: {w0['first_batch_s'] * 1000:.0f} ms in the main process, "
      f"{wmax['first_batch_s'] * 1000:.0f} ms with {int(wmax['num_workers'])} workers (processes must start).")  # fmt: skip
best_row = sweep_df.loc[sweep_df["images_per_s"].idxmax()]
print(f"This machine has {cores} cores; the best loader used num_workers={int(best_row['num_workers'])} "
      f"({best_row['speedup_vs_0']:.2f}x the main-process loader).")
one = sweep_df.loc[sweep_df["num_workers"] == 1, "speedup_vs_0"]
if len(one) and float(one.iloc[0]) > 1.2:
    # A single worker cannot add more than one core's worth of work; check the thread count instead.
    def per_image_s(threads: int) -> float:
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            t0 = time.perf_counter()
            for i in range(len(ds.paths)):
                ds[i]
            return time.perf_counter() - t0
        finally:
            torch.set_num_threads(old)

    t_all, t_one = per_image_s(torch.get_num_threads()), per_image_s(1)
    print(f"One worker was {float(one.iloc[0]):.2f}x the main process. DataLoader workers run torch with ONE thread; "
          f"preparing the {len(ds.paths)} photos in the main process took {t_all * 1000:.0f} ms with "
          f"{torch.get_num_threads()} threads and {t_one * 1000:.0f} ms with 1: small per-image ops "
          + ("run slower multi-threaded here." if t_all > t_one else "are not slowed by multi-threading here."))  # fmt: skip
over = sweep_df[sweep_df["num_workers"] > cores]
if len(over):
    gain = over["images_per_s"].max() / sweep_df[sweep_df["num_workers"] <= cores]["images_per_s"].max()
    print(f"More workers than cores gave {gain:.2f}x the best rate with at most {cores} workers: "
          + ("no gain, they only compete for the same cores." if gain < 1.05 else "a gain (workers wait on I/O)."))
err = (e2e["measured img/s"] / e2e["predicted img/s"] - 1).abs()
print(f"Measured end-to-end rates differ from the simple prediction by {err.min():.0%} to {err.max():.0%} "
      "(workers and the model share the same cores here).")

# %% [markdown]
# ## On a GPU: pinned memory, `non_blocking`, prefetching, GPU preprocessing
# The sections below run only on a CUDA machine. **They have not yet been run on a GPU by the course**
# unless reference results are shown in their place.
#
# **Pinned memory.** A copy from ordinary (pageable) host memory first goes through a pinned staging
# buffer inside the driver, and it blocks the CPU. From page-locked (pinned) memory the GPU's copy engine
# reads directly, and `non_blocking=True` returns at once. `DataLoader(pin_memory=True)` pins each batch in a
# background thread. The pitfall: `x.pin_memory()` allocates page-locked memory and copies into it, so
# pinning on every call can cost more than the copy it was meant to speed up. Measured:

# %%
if cu.gpu_section("09.pinned-copies"):
    big = torch.randn(cu.pick(full=64, smoke=8), 3, 224, 224)
    copy_ms = {mode: pl.copy_to_device_ms(big, mode) for mode in ("pageable", "pin_each_call", "pinned")}
    mb = big.nelement() * 4 / 2**20
    for mode, ms in copy_ms.items():
        print(f"{mode:>14}: {ms:.3f} ms for {mb:.0f} MiB ({mb / 1024 / (ms / 1000):.1f} GiB/s)")
        cu.record("09", f"H2D copy {mode}", model="tensor", device="cuda", dtype="fp32", median_ms=ms,
                  speedup_vs_baseline=copy_ms["pageable"] / ms)  # fmt: skip
    slower = copy_ms["pin_each_call"] > copy_ms["pageable"]
    print(f"Pinning on every call was {'SLOWER' if slower else 'not slower'} than a plain copy here "
          f"({copy_ms['pin_each_call'] / copy_ms['pageable']:.2f}x its time); pinned once it took "
          f"{copy_ms['pinned'] / copy_ms['pageable']:.2f}x.")
else:
    cu.results.show_reference("09", "H2D copy")

# %% [markdown]
# **Prefetching onto the GPU.** `cu.pipeline.CudaPrefetcher` issues the copy of batch *i+1* on a side
# stream while batch *i* computes; the compute stream waits for the copy (`wait_stream`), and
# `record_stream` tells the caching allocator that the tensor is used on the compute stream. Compared with
# a plain loop over a pinned loader.

# %%
if cu.gpu_section("09.prefetch"):
    gpu_model, _ = cu.models.resnet("resnet18", device="cuda")
    loader = pl.make_loader(ds, batch_size=BATCH, num_workers=best_w, pin_memory=True)
    plain = pl.end_to_end(loader, gpu_model, device="cuda")
    t0 = time.perf_counter()
    n = 0
    with torch.inference_mode(), pl.CudaPrefetcher(loader) as batches:
        for xb, _ in batches:
            gpu_model(xb)
            n += xb.shape[0]
    torch.cuda.synchronize()
    pref_ips = n / (time.perf_counter() - t0)
    print(f"plain pinned loop {plain['images_per_s']:.0f} img/s, with CUDA prefetcher {pref_ips:.0f} img/s "
          f"({pref_ips / plain['images_per_s']:.2f}x)")
    cu.record("09", "gpu prefetcher", model="resnet18", device="cuda", dtype="fp32", batch_size=BATCH,
              throughput=pref_ips, speedup_vs_baseline=pref_ips / plain["images_per_s"])  # fmt: skip
else:
    cu.results.show_reference("09", "prefetch")

# %% [markdown]
# **Preprocessing on the GPU.** Only the compressed JPEG bytes cross PCIe; `decode_jpeg(list, device="cuda")`
# decodes a whole list with nvJPEG and the same resize/normalize runs on GPU tensors. Decoders may round
# differently from the CPU's libjpeg by a few intensity levels, so the comparison uses the looser bf16
# tolerance row. (NVIDIA DALI, named by the source tutorial, is a dedicated library for the same idea:
# whole GPU input pipelines; it is not part of this course's install.)

# %%
if cu.gpu_section("09.gpu-preprocess"):
    raw = [ds.raw(i) for i in range(BATCH)]
    gpu_batch = pl.gpu_decode_preprocess(raw, SIZE)
    _ = cu.check_outputs(gpu_batch, ref_batch, "bf16", label="GPU decode+preprocess vs CPU loader")
    m_gpu = cu.measure(lambda: pl.gpu_decode_preprocess(raw, SIZE), device="cuda", batch_size=BATCH,
                       label="GPU decode+preprocess")  # fmt: skip
    print(m_gpu)
    print(f"GPU preprocessing: {m_gpu.throughput:.0f} img/s vs the best CPU loader {sweep_df['images_per_s'].max():.0f} "
          f"img/s ({m_gpu.throughput / sweep_df['images_per_s'].max():.1f}x)")  # fmt: skip
    cu.record("09", "gpu decode+preprocess", model="preprocess", device="cuda", dtype="fp32", measurement=m_gpu,
              speedup_vs_baseline=m_gpu.throughput / sweep_df["images_per_s"].max())  # fmt: skip
else:
    cu.results.show_reference("09", "gpu decode")

# %% [markdown]
# ## Exercises
# **1.** Write `predict_end_to_end(loader_ips, model_ips, overlapped)`: the best images/s of a pipeline whose
# loader alone reaches `loader_ips` and whose model alone reaches `model_ips`, when loading overlaps
# computing (workers) or when they take turns (`num_workers=0`).

# %%
def predict_end_to_end(loader_ips: float, model_ips: float, overlapped: bool) -> float:
    raise NotImplementedError  # your code here


cu.exercises.check("09.end-to-end", predict_end_to_end)

# %% [markdown]
# **2.** Write `to_model_input(img)`: a uint8 image (3, H, W) already at the right size -> float32 scaled to
# [0, 1], then normalized per channel with `pl.IMAGENET_MEAN` and `pl.IMAGENET_STD`, using plain tensor
# arithmetic (so it runs on any device).

# %%
def to_model_input(img: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError  # your code here


cu.exercises.check("09.normalize", to_model_input)

# %% [markdown]
# ## Summary
# * Measure the loader alone, the model alone and both together; the slower side sets the pace.
# * `num_workers` moves decoding into processes; more workers than cores do not add cores.
# * On a GPU: pin once (loader `pin_memory=True`), copy with `non_blocking=True`, prefetch the next batch on a
#   side stream, or move decoding and resizing to the GPU when the CPU cannot keep up.
#
# Rows were written to this machine's results file. Next: **10 · Streams and async**.

# %%
best = sweep_df.loc[sweep_df["images_per_s"].idxmax()]
cu.record("09", f"loader num_workers={int(best['num_workers'])} (best)", model="jpeg loader", device="cpu",
          dtype="fp32", batch_size=BATCH, throughput=float(best["images_per_s"]),
          speedup_vs_baseline=float(best["speedup_vs_0"]), notes=f"sweep {list(WORKERS)}")  # fmt: skip
_ = cu.record("09", "loader num_workers=0 (baseline)", model="jpeg loader", device="cpu", dtype="fp32",
          batch_size=BATCH, throughput=base_ips, speedup_vs_baseline=1.0)  # fmt: skip
