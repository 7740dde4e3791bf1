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
# **Goals.** Run one model in FP32, BF16 and FP16 in the three ways PyTorch offers, written out in this
# notebook's cells: `torch.autocast` (weights stay FP32, each operation picks its precision), casting the
# whole model (`model.to(torch.bfloat16)` / `model.half()`), and the `channels_last` memory layout for model
# and input. Look inside the model to see which dtype each layer really ran in. Compare every variant with
# FP32 **before** timing it, then time it at batch 1 and at a large batch. On a GPU: TF32, the switch that
# makes "FP32" silently less precise, and a true FP32 baseline.
#
# **The bottleneck it attacks** (see *01 · Measuring inference*, the taxonomy): **compute-bound** work gets
# faster when the hardware has low-precision units (GPU Tensor Cores, CPU AMX/AVX-512 BF16), and
# **memory-bound** work moves half the bytes. Launch- or overhead-bound work (tiny batches) gains nothing.

# %% tags=["contract"]
import copy

import pandas as pd
import torch
from IPython.display import display
from torch import nn

import course_utils as cu

# %%
device = cu.lesson.start("04", "Mixed precision")

# %% [markdown]
# ## Two switches first: TF32, the FP32 that is not FP32
# On NVIDIA GPUs since Ampere, PyTorch may run FP32 convolutions and matmuls on Tensor Cores in **TF32**
# (FP32's range, a 10-bit mantissa like FP16). cuDNN convolutions do so **by default**; matmuls do not. A
# "FP32 baseline" measured with the defaults is partly TF32. Two switches, one per library, both set here
# with the same family of setters (mixing them with the newer `fp32_precision` settings makes PyTorch raise).
# The function is tagged for the course's contract tests, which run it on CPU.


# %% tags=["contract"]
def set_tf32(enabled: bool) -> None:
    """TF32 on or off for FP32 math on CUDA: matmuls AND cuDNN convolutions."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


# %%
print(
    f"CPU kernels: {torch.backends.cpu.get_cpu_capability()}; BF16 instructions (AVX-512 BF16 / AMX): "
    f"{cu.device.capabilities()['cpu_bf16']}; threads: {torch.get_num_threads()}"
)


def tf32_state() -> str:
    return f"matmul TF32 {torch.backends.cuda.matmul.allow_tf32}, cuDNN conv TF32 {torch.backends.cudnn.allow_tf32}"


print(f"defaults: {tf32_state()}")
set_tf32(False)  # every FP32 reference in this lesson is true FP32
print(f"now:      {tf32_state()}; torch.get_float32_matmul_precision() = {torch.get_float32_matmul_precision()!r}")

# %% [markdown]
# ## Baseline: the digits CNN in FP32
# The trained digits CNN (accuracy on the whole test set) first; ResNet-18 with random weights (a model big
# enough to be compute-bound) comes in the speed section. The FP32 outputs are the reference.

# %%
digits = cu.data.load_digits_split()
cnn = cu.models.load_digits_model("cnn", device=device).eval()
x_test, y_test = digits.x_test.to(device), digits.y_test.to(device)
with torch.inference_mode():
    ref = cnn(x_test)
base_acc = float((ref.argmax(-1) == y_test).float().mean())
print(f"FP32: accuracy {base_acc:.2%} on {len(x_test)} test images; output dtype {ref.dtype}")

# %% [markdown]
# ## Three ways to lower precision, written out
# 1. **autocast**: a context manager. The weights stay FP32; inside it, each operation on the autocast
#    list (convolutions, matmuls, linear layers) casts its inputs to the low dtype and runs there; other
#    operations run in whatever dtype their inputs have, and a few are forced to FP32.
# 2. **cast**: convert every parameter and buffer with `.to(torch.bfloat16)` or `.half()`, and cast the
#    input to match. Every operation and every stored weight is in the low dtype: half the weight memory.
# 3. **channels_last**: not a precision at all but a memory layout (NHWC instead of NCHW) that many
#    convolution kernels prefer. Both the model's weights and the input are converted.

# %% [markdown]
# ## Exercises first: write two of them before you see ours
# 1. **`04.bf16-autocast`**: write `bf16_autocast(model, x)` that runs `model` on `x` under
#    `torch.autocast(device_type=x.device.type, dtype=torch.bfloat16)` and returns the output as FP32
#    (`.float()`), leaving the model's weights in FP32. The check builds a random small CNN and input, and
#    watches every operator your function runs, on the CPU and with model and input on the GPU (the rehearsal's
#    stand-in on a CPU, so `torch.autocast("cpu")` written in shows): each convolution and matmul on *your* input
#    must run in BF16 on the model's FP32 weights, BatchNorm on FP32 statistics, and your output must be that
#    forward's output.
# 2. **`04.channels-last`**: write `to_channels_last(model, x)` returning `(model, x)` both in the
#    channels_last layout (`.to(memory_format=torch.channels_last)`), in FP32; the check compares the output with
#    FP32 and inspects every convolution's weight and the layout of the input it receives.


# %%
def bf16_autocast(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError  # your code here


cu.exercises.check("04.bf16-autocast", bf16_autocast)


# %%
def to_channels_last(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor]:
    raise NotImplementedError  # your code here


cu.exercises.check("04.channels-last", to_channels_last)

# %% [markdown]
# The course's version of all three, on the trained digits CNN:

# %%
with torch.inference_mode(), torch.autocast(device_type=device.type, dtype=torch.bfloat16):
    out_autocast = cnn(x_test)

cnn_bf16 = copy.deepcopy(cnn).to(torch.bfloat16)  # copies: the FP32 model stays the reference
cnn_fp16 = copy.deepcopy(cnn).half()
with torch.inference_mode():
    out_bf16 = cnn_bf16(x_test.to(torch.bfloat16))
    out_fp16 = cnn_fp16(x_test.half())

cnn_cl = copy.deepcopy(cnn).to(memory_format=torch.channels_last)
x_cl = x_test.to(memory_format=torch.channels_last)
with torch.inference_mode():
    out_cl = cnn_cl(x_cl)

made = [
    ("autocast bf16", out_autocast, cnn),
    ("cast bf16", out_bf16, cnn_bf16),
    ("cast fp16 (.half())", out_fp16, cnn_fp16),
    ("channels_last fp32", out_cl, cnn_cl),
]
for name, out, model in made:
    print(f"{name:22s} output dtype {str(out.dtype):15s} weights {next(model.parameters()).dtype}")
cl_input = x_cl.is_contiguous(memory_format=torch.channels_last)
print(
    f"channels_last: first conv weight strides {cnn_cl.features[0].weight.stride()} (NCHW was "
    f"{cnn.features[0].weight.stride()}); input is channels_last: {cl_input}"
)

# %% [markdown]
# ### What dtype did each layer run in?
# The output dtype alone does not tell what happened inside. A forward hook on every layer records the
# dtype that went in and came out.

# %%
seen = []


def record_dtypes(module, inputs, output):
    seen.append({"layer": type(module).__name__, "input": str(inputs[0].dtype), "output": str(output.dtype)})


hooks = [m.register_forward_hook(record_dtypes) for m in cnn.modules() if not list(m.children())]
with torch.inference_mode(), torch.autocast(device_type=device.type, dtype=torch.bfloat16):
    cnn(x_test[:4])
for h in hooks:
    h.remove()
inside = pd.DataFrame(seen)
display(inside)
print(
    f"Under autocast the first Conv2d received {inside.input[0]} and returned {inside.output[0]}; the weights "
    f"stayed {next(cnn.parameters()).dtype}."
)

# %% [markdown]
# ### What autocast keeps in FP32
# Autocast has three lists: operations that run in the low dtype, operations forced to FP32 because they
# lose too much precision (on CUDA: softmax, log_softmax, layer_norm, sums, losses; on CPU a shorter list),
# and the rest, which follow their inputs. The table runs a few operations on an FP32 and on a BF16 tensor
# inside `torch.autocast` on this device and prints the output dtype.

# %%
a = torch.randn(8, 8, device=device)
ops = {
    "matmul": lambda t: t @ t,
    "softmax": lambda t: torch.softmax(t, -1),
    "log_softmax": lambda t: torch.log_softmax(t, -1),
    "layer_norm": lambda t: nn.functional.layer_norm(t, (8,)),
    "sum": lambda t: t.sum(),
    "mse_loss": lambda t: nn.functional.mse_loss(t, t.detach()),
    "exp": lambda t: t.exp(),
}
rows = []
with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
    for name, op in ops.items():
        rows.append({"op": name, "FP32 input ->": str(op(a).dtype), "BF16 input ->": str(op(a.bfloat16()).dtype)})
autocast_ops = pd.DataFrame(rows)
display(autocast_ops)

# %%
kept = autocast_ops[autocast_ops["BF16 input ->"] == "torch.float32"].op.tolist()
lowered = autocast_ops[autocast_ops["FP32 input ->"] == "torch.bfloat16"].op.tolist()
print(
    f"On {device.type}, autocast ran {lowered} in BF16 even from FP32 inputs, and forced {kept} back to FP32 "
    "even from BF16 inputs; the others followed their input's dtype. The parameters are never cast."
)

# %% [markdown]
# ### What not to do: `torch.cuda.amp.autocast`
# Older tutorials (this course's sources among them) write
#
# ```python
# with torch.cuda.amp.autocast():   # deprecated: do not copy
#     out = model(x)
# ```
#
# It is **deprecated**: PyTorch emits a FutureWarning and forwards to `torch.autocast("cuda", ...)`, and it
# only ever covered CUDA. Write `torch.autocast(device_type, dtype=...)`, which works on every device, as
# every cell of this lesson does. (It is shown here as text only, so no cell runs a deprecated API.)

# %% [markdown]
# ## Every variant compared with FP32 before any timing
# The function below builds each distinct way of running a model (it is the same code as above, in a
# function so both models and the GPU section can reuse it). Each variant returns FP32 logits so it compares
# directly with the reference. Tolerances per precision are the course's table; an accuracy drop of more
# than `THRESHOLD` points is flagged.

# %% tags=["contract"]
LOW = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def make_variants(model, dtypes=(torch.bfloat16, torch.float16)):
    """Name -> function(x) returning FP32 outputs, one per distinct way to run `model` in reduced precision.

    Each function's `.weights` is the module whose weights it reads (for its own memory figure).
    """
    model = model.eval()
    model_cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
    variants = {
        "fp32": lambda x: model(x),
        "fp32 channels_last": lambda x: model_cl(x.to(memory_format=torch.channels_last)),
    }
    for dt in dtypes:
        model_lp = copy.deepcopy(model).to(dt)  # for float16 this is model.half()

        def autocast_run(x, dt=dt):
            with torch.autocast(device_type=x.device.type, dtype=dt):
                return model(x).float()

        def autocast_cl_run(x, dt=dt):
            with torch.autocast(device_type=x.device.type, dtype=dt):
                return model_cl(x.to(memory_format=torch.channels_last)).float()

        variants[f"{LOW[dt]} autocast"] = autocast_run
        variants[f"{LOW[dt]} cast"] = lambda x, m=model_lp, dt=dt: m(x.to(dt)).float()
        variants[f"{LOW[dt]} autocast channels_last"] = autocast_cl_run
        variants[f"{LOW[dt]} cast"].weights = model_lp
    for name, run in variants.items():
        if not hasattr(run, "weights"):
            run.weights = model_cl if "channels_last" in name else model
    return variants


def own_peak_mib(run, x, memory, resident):
    """Peak memory of one variant alone: its own weights, the input, and what running it allocated on top of
    the `resident` bytes (every model copy of the grid stays resident, so the raw peak would count them all)."""
    own = sum(t.numel() * t.element_size() for t in (*run.weights.parameters(), *run.weights.buffers()))
    return (memory.max_memory_allocated() - resident + own + x.numel() * x.element_size()) / 2**20


# %%
THRESHOLD = 0.5  # accuracy points a variant may lose before it is flagged
display(cu.tolerance_table())
cnn_variants = make_variants(cnn)
acc_rows = []
with torch.inference_mode():
    for name, run in cnn_variants.items():
        out = run(x_test)
        cmp = cu.check_outputs(out, ref, name.split()[0], label=name)
        acc = float((out.argmax(-1) == y_test).float().mean())
        acc_rows.append(
            {
                "variant": name,
                "max abs err": cmp.max_abs,
                "cosine": cmp.cosine,
                "top-1 agreement": cmp.top1,
                "accuracy": acc,
                "flag": cu.quantization.accuracy_flag(acc, base_acc, THRESHOLD),
            }
        )
acc_df = pd.DataFrame(acc_rows)
display(acc_df)

# %%
weight_kib = {
    "fp32": cu.precision.param_bytes(cnn) / 1024,
    "bf16 cast": cu.precision.param_bytes(cnn_bf16) / 1024,
    "fp16 cast": cu.precision.param_bytes(cnn_fp16) / 1024,
}
print("weight memory (KiB):", {k: round(v, 1) for k, v in weight_kib.items()})
print(
    f"Casting keeps {weight_kib['bf16 cast'] / weight_kib['fp32']:.0%} of the FP32 weight bytes; autocast keeps "
    "the FP32 weights (and makes low-precision copies on the fly)."
)

# %% [markdown]
# ## Speed: batch 1 and a large batch, digits CNN and ResNet-18
# Each ResNet-18 variant is checked against FP32 on the same input right before it is timed. On a CPU
# ResNet-18 runs FP32 and BF16 only (CPUs rarely have FP16 arithmetic: the digits CNN rows show what FP16
# costs here); on a GPU it runs every precision. Sizes stay small on a CPU so the lesson finishes in minutes.


# %% tags=["contract"]
def precision_grid(
    model,
    device,
    batches,
    *,
    image_size=224,
    dtypes=(torch.bfloat16, torch.float16),
    tf32=None,
    memory=None,
    **compare_kw,
):
    """One row per distinct variant and batch: checked against true FP32 first, then timed.

    The baseline is plain FP32 (contiguous, TF32 off). On CUDA (or tf32=True) two TF32 rows are added.
    `memory`: the device's memory module (torch.cuda on a GPU) for each variant's own peak memory.
    Per batch the checked variants are timed by one `cu.compare` (taking turns in rounds): `speedup` is its
    ratio to FP32, `low`/`high` its 95% interval, `ratio` the Ratio itself.
    """
    device = torch.device(device)
    tf32 = device.type == "cuda" if tf32 is None else tf32
    memory = torch.cuda if memory is None and device.type == "cuda" else memory
    model = copy.deepcopy(model).to(device).eval()
    variants = make_variants(model, dtypes)
    plan = [(name, run, False) for name, run in variants.items()]
    if tf32:
        plan[2:2] = [("tf32", variants["fp32"], True), ("tf32 channels_last", variants["fp32 channels_last"], True)]
    rows = []
    for b in batches:
        x = torch.randn(b, 3, image_size, image_size, device=device)
        set_tf32(False)
        with torch.inference_mode():
            ref = model(x)
        checked = {}
        for name, run, use_tf32 in plan:
            set_tf32(use_tf32)
            precision = "tf32" if use_tf32 else name.split()[0]
            with torch.inference_mode():
                cmp = cu.check_outputs(run(x), ref, precision, label=f"{name} b{b}")
                if memory is not None:
                    memory.synchronize()
                    resident = memory.memory_allocated()  # all model copies, the input, the reference output
                    memory.reset_peak_memory_stats()
                    run(x)
            peak = None if memory is None else own_peak_mib(run, x, memory, resident)
            checked[name] = (precision, cmp.max_rel, peak)

        def timed(run, x, use_tf32):
            def fn():
                set_tf32(use_tf32)
                with torch.inference_mode():
                    run(x)

            return fn

        speed = cu.compare(
            {name: timed(run, x, use_tf32) for name, run, use_tf32 in plan},
            baseline="fp32",
            device=device,
            batch_size=b,
            label=f"batch {b}",
            **compare_kw,
        )
        set_tf32(False)
        for name, (precision, max_rel, peak) in checked.items():
            m, r = speed.measurements[name], speed.ratios.get(name)
            rows.append(
                {
                    "variant": name,
                    "batch": b,
                    "precision": precision,
                    "median_ms": m.median_ms,
                    "iqr_ms": m.iqr_ms,
                    "max_rel_err": max_rel,
                    "peak_MiB": peak,
                    "speedup": r.estimate if r else 1.0,
                    "low": r.low if r else 1.0,
                    "high": r.high if r else 1.0,
                    "verdict": r.verdict if r else "baseline",
                    "m": m,
                    "ratio": r,
                }
            )
    return pd.DataFrame(rows)


# %%
big = cu.pick(full=256, smoke=32)
speed_rows = []
with torch.inference_mode():
    for b in (1, big):
        xb = x_test[:b]
        cnn_cmp = cu.compare(  # the variants take turns in rounds (lesson 01): ratios to FP32 with intervals
            {name: (lambda run=run, xb=xb: run(xb)) for name, run in cnn_variants.items()},
            baseline="fp32",
            device=device,
            batch_size=b,
        )
        for name in cnn_variants:
            m, r = cnn_cmp.measurements[name], cnn_cmp.ratios.get(name)
            speed_rows.append(
                {
                    "variant": name,
                    "batch": b,
                    "precision": name.split()[0],
                    "median_ms": m.median_ms,
                    "iqr_ms": m.iqr_ms,
                    "speedup": r.estimate if r else 1.0,
                    "low": r.low if r else 1.0,
                    "high": r.high if r else 1.0,
                    "verdict": r.verdict if r else "baseline",
                    "m": m,
                    "ratio": r,
                }
            )
cnn_speed = pd.DataFrame(speed_rows)
display(cnn_speed.drop(columns=["m", "ratio"]).round(3))

# %%
resnet, note = cu.models.resnet("resnet18", device=device)
print(f"ResNet-18: {note}")
res_batch = cu.pick(full=8, smoke=2) if device.type == "cpu" else cu.pick(full=64, smoke=8)
res_size = cu.pick(full=96, smoke=64) if device.type == "cpu" else 224
cpu_dtypes = (torch.bfloat16,) if device.type == "cpu" else (torch.bfloat16, torch.float16)
res_speed = precision_grid(
    resnet, device, (1, res_batch), image_size=res_size, dtypes=cpu_dtypes, warmup=1, min_calls=1
)
display(res_speed.drop(columns=["m", "ratio", "peak_MiB"]).round(3))

# %%
for model_name, df in (("digits CNN", cnn_speed), (f"ResNet-18 {res_size}px", res_speed)):
    for b, grp in df[df.variant != "fp32"].groupby("batch"):
        fig = cu.plots.speedup_bars(
            dict(zip(grp.variant, grp["ratio"], strict=True)),
            title=f"{model_name}, batch {b}: speed vs FP32 on {device}",
        )
        _ = cu.plots.save(fig, "04", f"{'cnn' if model_name == 'digits CNN' else 'resnet18'}_batch{b}_vs_fp32")

# %% [markdown]
# ## What surprised us
# Printed from this run's numbers: whether reduced precision pays on this machine, whether casting beats
# autocast, and where nothing pays at all.

# %%
for model_name, df in (("digits CNN", cnn_speed), ("ResNet-18", res_speed)):
    for b, grp in df[df.variant != "fp32"].groupby("batch"):
        r = grp.sort_values("low", ascending=False).iloc[0]  # the best lower end: the surest gain
        print(f"{model_name}, batch {b}: best variant {r.ratio.says(repr(r.variant), 'FP32')}.")
rb = res_speed[res_speed.batch == res_batch].set_index("variant")
print(
    f"ResNet-18 batch {res_batch} vs FP32: BF16 autocast {rb.loc['bf16 autocast', 'ratio']}, BF16 cast "
    f"{rb.loc['bf16 cast', 'ratio']}, FP32 channels_last {rb.loc['fp32 channels_last', 'ratio']}. "
    f"CPU kernels here: {torch.backends.cpu.get_cpu_capability()}, BF16 instructions: "
    f"{cu.device.capabilities()['cpu_bf16']}"
    + (
        ""
        if device.type == "cuda"
        else " (without them BF16 math is converted back and forth in software, so it rarely pays)."
    )
)
noisy = [r.m.label for df in (cnn_speed, res_speed) for r in df.itertuples() if r.m.spread > cu.timing.HIGH_SPREAD]
if noisy:
    print(
        f"Careful: {len(noisy)} timings had a high spread (IQR > {cu.timing.HIGH_SPREAD:.0%} of the median), e.g. "
        f"{noisy[:3]}: the machine was busy; the intervals above are wide for that reason."
    )
if "fp16 cast" in rb.index:
    print(f"FP16 cast on {device.type} vs FP32 on ResNet-18: {rb.loc['fp16 cast', 'ratio']}.")
worst = acc_df[~acc_df.variant.str.startswith("fp32")].sort_values("accuracy").iloc[0]
print(
    f"Accuracy: the lowest variant is '{worst.variant}' at {worst.accuracy:.2%} vs {base_acc:.2%} in FP32 "
    f"(top-1 agreement with FP32 {worst['top-1 agreement']:.2%})."
)

# %% [markdown]
# ### Pitfall: FP16 overflow
# FP16's largest finite value is printed below. A layer whose activations exceed it produces `inf` in FP16,
# by autocast or by cast; BF16 keeps FP32's exponent range and stays finite (with a larger rounding error).
# The layer has inputs and weights of 300, like an un-normalized feature.

# %%
print(f"FP16 max finite value: {torch.finfo(torch.float16).max:.0f}; BF16: {torch.finfo(torch.bfloat16).max:.3g}")
layer = nn.Linear(64, 4, bias=False).to(device)
nn.init.constant_(layer.weight, 300.0)
x_big = torch.full((2, 64), 300.0, device=device)
with torch.inference_mode():
    exact = layer(x_big)
    for dt in (torch.bfloat16, torch.float16):
        with torch.autocast(device_type=device.type, dtype=dt):
            y_auto = layer(x_big)
        y_cast = copy.deepcopy(layer).to(dt)(x_big.to(dt))
        for how, y in (("autocast", y_auto), ("cast", y_cast)):
            finite = bool(torch.isfinite(y).all())
            rel = float((y.float() - exact).abs().max() / exact.abs().max())
            err = f"rel. error {rel:.2e}" if finite else "OVERFLOW to inf"
            peak = float(y.float().abs().max())
            print(f"{LOW[dt]} {how}: max |output| {peak:.4g} (exact {float(exact.max()):.4g}): {err}")

# %% [markdown]
# ## GPU: TF32, FP16 and BF16 on Tensor Cores, small and large batch
# ResNet-18 at 224 px, batch 1 and 256: every distinct variant, TF32 rows included, checked against a true
# FP32 baseline (both TF32 switches off), then timed, with each variant's own peak memory (`peak_MiB`: its
# weights, the input, and what its run allocated above what was already resident; the grid keeps every model
# copy resident, so the raw `max_memory_allocated()` would count them all in every row).
# Verification: **contract-tested** (`tests/gpu_contract/test_l04_precision.py` runs `precision_grid` and
# `set_tf32` on CPU; not yet executed on a GPU by the course, unless reference results are shown below).

# %%
if cu.gpu_section("04.gpu-precisions"):
    big_gpu = cu.pick(full=256, smoke=16)
    gpu = precision_grid(resnet, "cuda", (1, big_gpu), image_size=cu.pick(full=224, smoke=64))
    for r in gpu.itertuples():
        cu.record(
            "04",
            f"gpu {r.variant} b{r.batch}",
            model="resnet18",
            device="cuda",
            dtype=r.precision,
            measurement=r.m,
            speedup_vs_baseline=r.ratio if r.ratio is not None else 1.0,
            error_vs_baseline=r.max_rel_err,
        )
    display(gpu.drop(columns=["m", "ratio"]).round(3))
    large = gpu[(gpu.batch == big_gpu) & (gpu.variant != "fp32")].sort_values("low", ascending=False).iloc[0]
    print(
        f"Best at batch {big_gpu}: {large.variant} vs true FP32: {large.ratio}; course target for FP16/BF16 at "
        f"batch 256, >= 2.5x: {large.ratio.judge(2.5)}{cu.modes.standin_label()}"
    )
else:
    cu.results.show_reference("04")

# %% [markdown]
# ## Summary
# One row per variant and batch goes to this machine's results. Next: **05 · Quantization**, where
# precision drops to 8-bit integers.

# %%
accs = acc_df.set_index("variant")
for model_name, df in (("digits CNN", cnn_speed), ("resnet18", res_speed)):
    for r in df.itertuples():
        err = float(accs.loc[r.variant, "max abs err"]) if model_name == "digits CNN" else float(r.max_rel_err)
        cu.record(
            "04",
            f"{r.variant} b{r.batch}",
            model=model_name,
            device=str(device),
            dtype=r.precision,
            measurement=r.m,
            speedup_vs_baseline=r.ratio if r.ratio is not None else 1.0,
            error_vs_baseline=err,
        )
print(f"{len(cnn_speed) + len(res_speed)} rows recorded.")
