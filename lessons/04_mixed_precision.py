# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 04 · Mixed precision
#
# **Goals.** Run the same model in FP32, BF16 and FP16, by `torch.autocast` and by casting the whole model
# (`.half()` / `.to(torch.bfloat16)`), with and without the `channels_last` memory layout. For each variant:
# the error against FP32 (max error and top-1 agreement on the digits test set), the speed at batch 1 and at
# a large batch, and the weight memory. Then two pitfalls, with numbers: FP16 overflow, and a small batch
# where reduced precision does not pay. TF32 and GPU FP16/BF16 are in a GPU-only section.
#
# **The bottleneck it attacks** (see *01 · Measuring inference*, the taxonomy): **compute-bound** work gets
# faster when the hardware has low-precision units (GPU Tensor Cores, CPU AMX/AVX-512 BF16), and
# **memory-bound** work moves half the bytes. Launch- or overhead-bound work (tiny batches) gains nothing.

# %%
import course_utils as cu

device = cu.lesson.start("04", "Mixed precision")

# %%
import pandas as pd
import torch

from course_utils import precision as prec
from course_utils.quant import accuracy_flag

caps = cu.device.capabilities()
print(f"CPU BF16 instructions: {caps['cpu_bf16']}; threads: {torch.get_num_threads()}")

# %% [markdown]
# ## Baseline: the digits CNN in FP32
# Two models: the trained digits CNN (accuracy and agreement on the whole test set) and ResNet-18 with
# random weights (speed on a model big enough to be compute-bound). The FP32 outputs are the reference.

# %%
digits = cu.data.load_digits_split()
cnn = cu.models.load_digits_model("cnn")
x_test, y_test = digits.x_test, digits.y_test
base_acc = cu.models.accuracy(cnn, x_test, y_test)
print(f"FP32 digits accuracy: {base_acc:.2%} on {len(x_test)} test images")

# %% [markdown]
# ## The variants, compared with FP32 before any timing
# `prec.standard_variants` builds: FP32, FP32 + channels_last, and for BF16 and FP16 each: autocast,
# cast (`.to(dtype)`), and autocast + channels_last. Each output is checked with `cu.compare` against the
# per-precision tolerance below. An accuracy drop of more than `THRESHOLD` points is flagged.

# %%
THRESHOLD = 0.5  # accuracy points a variant may lose before it is flagged
cu.compare.tolerance_table()

# %%
variants = prec.standard_variants(cnn, device=device)
ref = variants[0].run(x_test)
rows = []
for v in variants:
    out = v.run(x_test)
    cmp = cu.check_outputs(out, ref, v.dtype, label=v.name)
    acc = float((out.argmax(-1).cpu() == y_test).float().mean())
    rows.append({"variant": v.name, "max abs err": cmp.max_abs, "top-1 agreement": cmp.top1, "accuracy": acc,
                 "flag": accuracy_flag(acc, base_acc, THRESHOLD), "weight KiB": v.weight_bytes / 1024})  # fmt: skip
acc_df = pd.DataFrame(rows)
acc_df

# %% [markdown]
# ## Speed: batch 1 and a large batch, digits CNN and ResNet-18
# Every variant of both models at batch 1 and at a large batch (`cu.pick` shrinks it in smoke mode).

# %%
import warnings

big = cu.pick(full=256, smoke=32)
res_batch = cu.pick(full=16, smoke=2)
res_size = cu.pick(full=224, smoke=64)
resnet, note = cu.models.resnet("resnet18")
print(f"ResNet-18: {note}")
res_variants = prec.standard_variants(resnet, device=device, dtypes=cu.pick(full=("bf16", "fp16"), smoke=("bf16",)))

speed_rows = []
for model_name, vs, inputs in [
    ("digits CNN", variants, {1: x_test[:1], big: x_test[:big]}),
    ("ResNet-18", res_variants, {1: torch.randn(1, 3, res_size, res_size), res_batch: torch.randn(res_batch, 3, res_size, res_size)}),
]:  # fmt: skip
    for b, xb in inputs.items():
        for v in vs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", cu.timing.HighSpreadWarning)
                m = cu.measure(lambda v=v, xb=xb: v.run(xb), device=device, batch_size=b, label=f"{model_name} {v.name} b{b}",
                               min_repeats=5 if model_name == "ResNet-18" else None)  # slow FP16 CPU convs: few repeats
            speed_rows.append({"model": model_name, "variant": v.name, "batch": b, "median_ms": m.median_ms,
                               "iqr_ms": m.iqr_ms, "m": m})  # fmt: skip
speed = pd.DataFrame(speed_rows)
fp32_ms = speed[speed.variant == "fp32"].set_index(["model", "batch"])["median_ms"]
speed["speedup"] = [fp32_ms[(r.model, r.batch)] / r.median_ms for r in speed.itertuples()]
speed.drop(columns="m").round(3)

# %%
fig_rows = speed[speed.variant != "fp32"]
for (model_name, b), grp in fig_rows.groupby(["model", "batch"]):
    cu.plots.speedup_bars(dict(zip(grp.variant, grp["speedup"], strict=True)),
                          title=f"{model_name}, batch {b}: speed-up vs FP32 on {device}")  # fmt: skip

# %% [markdown]
# ## What surprised us
# Printed from this run's numbers: whether BF16 pays on this CPU, whether casting beats autocast, and where
# reduced precision does not pay at all.

# %%
def best(model_name: str, batch: int) -> pd.Series:
    g = speed[(speed.model == model_name) & (speed.batch == batch) & ~speed.variant.str.startswith("fp32")]
    return g.sort_values("speedup", ascending=False).iloc[0]


for model_name, b_large in (("digits CNN", big), ("ResNet-18", res_batch)):
    for b in (1, b_large):
        r = best(model_name, b)
        verdict = "faster" if r["speedup"] > 1.05 else "no faster (within 5%)" if r["speedup"] > 0.95 else "slower"
        print(f"{model_name}, batch {b}: best reduced-precision variant '{r.variant}' is {r['speedup']:.2f}x "
              f"the FP32 speed: {verdict}.")  # fmt: skip
bf16 = speed[(speed.model == "ResNet-18") & (speed.batch == res_batch) & (speed.variant == "bf16 autocast")].iloc[0]
print(f"This CPU {'benefits' if bf16['speedup'] > 1.05 else 'does not benefit'} from BF16 autocast on "
      f"ResNet-18 at batch {res_batch} ({bf16['speedup']:.2f}x); BF16 instructions reported: {caps['cpu_bf16']}.")  # fmt: skip
fp16 = speed[(speed.model == "ResNet-18") & (speed.batch == res_batch) & (speed.variant == "fp16 cast")]
if len(fp16):  # ResNet-18 FP16 variants are measured in full mode only
    print(f"FP16 cast on this CPU: {fp16.speedup.iloc[0]:.2f}x the FP32 speed on ResNet-18 (CPUs rarely have fast FP16 math).")
saved = 1 - acc_df.set_index("variant").loc["bf16 cast", "weight KiB"] / acc_df.set_index("variant").loc["fp32", "weight KiB"]
print(f"Casting halves weight memory ({saved:.0%} saved); autocast keeps FP32 weights and saves none.")

# %% [markdown]
# ### Pitfall: FP16 overflow
# FP16's largest value is printed below. A layer whose activations exceed it produces `inf` in FP16, by
# autocast or by cast; BF16 keeps FP32's exponent range and stays finite (with a larger rounding error).
# The constructed layer has inputs and weights of a few hundred, like an un-normalized feature.

# %%
print(f"FP16 max finite value: {prec.fp16_max():.0f}")
layer, x_big = prec.fp16_overflow_case()
overflow = prec.overflow_table(layer, x_big, device=device)
overflow

# %%
for r in overflow.itertuples():
    print(f"{r.variant}: {'finite' if r.finite else 'OVERFLOW to inf'} (max |output| {r.max_abs_output:.3g})")

# %% [markdown]
# ## GPU: TF32, FP16 and BF16 on Tensor Cores
# Not yet run on a GPU by the course unless reference results are shown below. TF32 is a matmul mode for
# FP32 tensors (`torch.set_float32_matmul_precision("high")`), so it needs no cast. The section also
# measures peak memory per variant.

# %%
if cu.gpu_section("04.gpu-precisions"):
    gpu_rows = []
    gb = 256
    xg = torch.randn(gb, 3, 224, 224, device="cuda")
    for mode in ("highest", "high"):
        torch.set_float32_matmul_precision(mode)
        v = prec.make_variant(resnet, "fp32", channels_last=True, device="cuda")
        torch.cuda.reset_peak_memory_stats()
        m = cu.measure(lambda v=v: v.run(xg), device="cuda", batch_size=gb, label=f"fp32 matmul={mode}")
        gpu_rows.append({"variant": "tf32" if mode == "high" else "fp32", "median_ms": m.median_ms,
                         "peak_MiB": torch.cuda.max_memory_allocated() / 2**20, "m": m})  # fmt: skip
    torch.set_float32_matmul_precision("highest")
    g_ref = prec.make_variant(resnet, "fp32", device="cuda").run(xg[:32])
    for v in prec.standard_variants(resnet, device="cuda"):
        cu.check_outputs(v.run(xg[:32]), g_ref, v.dtype, label=v.name)
        torch.cuda.reset_peak_memory_stats()
        m = cu.measure(lambda v=v: v.run(xg), device="cuda", batch_size=gb, label=v.name)
        gpu_rows.append({"variant": v.name, "median_ms": m.median_ms,
                         "peak_MiB": torch.cuda.max_memory_allocated() / 2**20, "m": m})  # fmt: skip
    gdf = pd.DataFrame(gpu_rows)
    g32 = gdf.loc[gdf.variant == "fp32", "median_ms"].iloc[0]
    for r in gdf.itertuples():
        cu.record("04", f"gpu {r.variant}", model="resnet18", device="cuda", dtype=r.variant.split()[0],
                  measurement=r.m, speedup_vs_baseline=g32 / r.median_ms)  # fmt: skip
    print(gdf.drop(columns="m"))
else:
    cu.results.show_reference("04")

# %% [markdown]
# ## Exercises
# 1. **`04.overflow`**: write `overflows_fp16(t)` returning True when casting tensor `t` to FP16 would
#    produce an infinity (hint: compare its magnitude with `torch.finfo(torch.float16).max`).
# 2. **`04.agreement`**: write `top1_agreement(out, ref)` returning the fraction of rows whose argmax
#    matches between two logit tensors.

# %%
def overflows_fp16(t: torch.Tensor) -> bool:
    raise NotImplementedError  # your code here


cu.exercises.check("04.overflow", overflows_fp16)


# %%
def top1_agreement(out: torch.Tensor, ref: torch.Tensor) -> float:
    raise NotImplementedError  # your code here


cu.exercises.check("04.agreement", top1_agreement)

# %% [markdown]
# ## Summary
# One row per variant and batch size goes to this machine's results. Next: **05 · Quantization**, where
# precision drops to 8-bit integers.

# %%
accs = acc_df.set_index("variant")
for r in speed.itertuples():
    cu.record("04", f"{r.variant} b{r.batch}", model=r.model, device=str(device), dtype=r.variant.split()[0],
              measurement=r.m, speedup_vs_baseline=r.speedup,
              error_vs_baseline=float(accs.loc[r.variant, "max abs err"]) if r.model == "digits CNN" else None)  # fmt: skip
print(f"{len(speed)} rows recorded.")
