# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 12 · Pruning and distillation
#
# **Goals.** Make the model itself smaller and measure what that buys:
# 1. unstructured magnitude pruning (`torch.nn.utils.prune`): accuracy vs sparsity, and the measured fact
#    that dense kernels run no faster on a matrix full of zeros;
# 2. structured pruning: remove whole channels, rebuild smaller layers, fine-tune briefly: a real speed-up;
# 3. 2:4 semi-structured sparsity (GPU-only);
# 4. knowledge distillation: a small student trained from the CNN teacher's soft targets vs the same student
#    trained on labels alone; an accuracy/speed Pareto plot of everything.
#
# **The bottleneck it attacks** (*01 · Measuring inference*): **compute-bound** work shrinks only if the
# FLOPs really go away (fewer channels, a smaller network, or sparse kernels the hardware accelerates).

# %%
import course_utils as cu

device = cu.lesson.start("12", "Pruning and distillation")

# %%
import warnings

import pandas as pd
import torch

from course_utils import pruning as P
from course_utils.quant import accuracy_flag

warnings.filterwarnings("ignore", category=cu.timing.HighSpreadWarning)
THRESHOLD = 1.0  # accuracy points a variant may lose before it is flagged
digits = cu.data.load_digits_split()
teacher = cu.models.load_digits_model("cnn")
base_acc = cu.models.accuracy(teacher, digits.x_test, digits.y_test)
BATCH = cu.pick(full=256, smoke=64)
x_bench = digits.x_test[:BATCH]


def timed(model, label: str):
    with torch.inference_mode():
        return cu.measure(lambda: model(x_bench), device=device, batch_size=BATCH, label=label)


m_base = timed(teacher, "teacher fp32")
print(f"Baseline digits CNN: accuracy {base_acc:.2%}, {P.count_params(teacher):,} parameters, "
      f"{m_base.median_ms:.3f} ms at batch {BATCH}")  # fmt: skip
pareto_rows = [{"variant": "teacher", "accuracy": base_acc, "median_ms": m_base.median_ms, "params": P.count_params(teacher)}]

# %% [markdown]
# ## 1. Unstructured magnitude pruning
# `P.magnitude_prune` zeroes the smallest-magnitude weights across all Conv/Linear layers
# (`prune.global_unstructured` with L1), then folds the masks into the weights (`prune.remove`). Each output
# is compared with the baseline first; accuracy and speed follow.

# %%
sparsities = cu.pick(full=[0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95], smoke=[0.0, 0.5, 0.9])
rows = []
with torch.inference_mode():
    ref = teacher(digits.x_test)
for s in sparsities:
    pm = P.magnitude_prune(teacher, s)
    with torch.inference_mode():
        cmp = cu.compare_outputs(pm(digits.x_test), ref, "fp32")
    acc = cu.models.accuracy(pm, digits.x_test, digits.y_test)
    m = timed(pm, f"pruned {s:.0%}")
    rows.append({"sparsity": s, "measured sparsity": P.sparsity_report(pm)["sparsity"].iloc[-1], "accuracy": acc,
                 "top-1 agreement": cmp.top1, "flag": accuracy_flag(acc, base_acc, THRESHOLD),
                 "median_ms": m.median_ms, "speedup": m_base.median_ms / m.median_ms, "m": m})  # fmt: skip
unstructured = pd.DataFrame(rows)
unstructured.drop(columns="m").round(4)

# %%
import matplotlib.pyplot as plt

fig, ax1 = plt.subplots()
ax1.plot(unstructured.sparsity * 100, unstructured.accuracy * 100, "o-", color="tab:blue")
ax1.set_xlabel("weights set to zero (%)")
ax1.set_ylabel("test accuracy (%)", color="tab:blue")
ax2 = ax1.twinx()
ax2.plot(unstructured.sparsity * 100, unstructured.speedup, "s--", color="tab:red")
ax2.axhline(1.0, color="tab:red", lw=0.5)
ax2.set_ylabel("speed-up vs dense (x)", color="tab:red")
ax1.set_title("Unstructured pruning: accuracy falls, speed does not rise")
fig.tight_layout()
P.sparsity_report(P.magnitude_prune(teacher, 0.5))

# %%
sp = unstructured[unstructured.sparsity > 0]
noise = float((unstructured.m.map(lambda m: m.iqr_ms / m.median_ms)).median())  # typical relative spread
print(f"Speed-up across sparsities {sp.sparsity.min():.0%}-{sp.sparsity.max():.0%}: "
      f"{sp.speedup.min():.2f}x to {sp.speedup.max():.2f}x; typical run-to-run spread (IQR/median) {noise:.0%}.")  # fmt: skip
if (sp.speedup - 1).abs().max() <= max(0.1, noise):
    print("No speed-up beyond the spread: dense kernels multiply the zeros anyway.")
else:
    print("Differences larger than 10% appeared: with dense kernels they cannot come from the zeros; when the "
          "spread printed above is large, this machine was busy: rerun on a quiet machine before trusting them.")
ok = unstructured[unstructured.flag == "OK"]
print(f"Highest sparsity within {THRESHOLD} point(s) of the baseline: {ok.sparsity.max():.0%} "
      f"(accuracy {ok.accuracy.iloc[-1]:.2%}).")  # fmt: skip
for r in unstructured.itertuples():
    pareto_rows.append({"variant": f"unstructured {r.sparsity:.0%}", "accuracy": r.accuracy, "median_ms": r.median_ms,
                        "params": P.count_params(teacher)})  # fmt: skip

# %% [markdown]
# ## 2. Structured pruning: remove channels, rebuild, fine-tune
# `P.channel_prune_cnn(model, keep_fraction)` ranks each conv layer's filters by L1 norm, keeps the top
# fraction, and copies them (with their BatchNorm statistics and the matching inputs of the next layer) into
# a freshly built, smaller `DigitsCNN`. Accuracy drops right after the cut; a short fine-tune recovers it.

# %%
keep_fractions = cu.pick(full=[0.75, 0.5, 0.35, 0.25], smoke=[0.5])
ft_epochs = cu.pick(full=3, smoke=1)
ft_n = len(digits.x_train)
rows = []
for k in keep_fractions:
    small = P.channel_prune_cnn(teacher, k)
    acc_cut = cu.models.accuracy(small, digits.x_test, digits.y_test)
    P.train(small, digits.x_train[:ft_n], digits.y_train[:ft_n], epochs=ft_epochs, lr=1e-3, batch_size=128)
    acc = cu.models.accuracy(small, digits.x_test, digits.y_test)
    m = timed(small, f"channels kept {k:.0%}")
    rows.append({"channels kept": k, "params": P.count_params(small), "accuracy after cut": acc_cut,
                 "accuracy after fine-tune": acc, "flag": accuracy_flag(acc, base_acc, THRESHOLD),
                 "median_ms": m.median_ms, "speedup": m_base.median_ms / m.median_ms, "m": m})  # fmt: skip
    pareto_rows.append({"variant": f"structured {k:.0%}", "accuracy": acc, "median_ms": m.median_ms,
                        "params": P.count_params(small)})  # fmt: skip
structured = pd.DataFrame(rows)
structured.drop(columns="m").round(4)

# %%
good = structured[structured.flag == "OK"]
if len(good):
    best = good.sort_values("speedup", ascending=False).iloc[0]
    print(f"Best structured pruning within {THRESHOLD} point(s): {best['channels kept']:.0%} of channels kept, "
          f"{best.speedup:.2f}x the baseline speed at batch {BATCH}, accuracy {best['accuracy after fine-tune']:.2%} "
          f"(course target: 1.5x at <= 1 point loss: {'met' if best.speedup >= 1.5 else 'missed'}).")  # fmt: skip
else:
    best = None
    print(f"No structured variant stayed within {THRESHOLD} point(s) after {ft_epochs} fine-tune epoch(s) here.")
cu.plots.speedup_bars({f"structured {r['channels kept']:.0%}": r.speedup for _, r in structured.iterrows()}
                      | {f"unstructured {r.sparsity:.0%}": r.speedup for _, r in sp.iterrows()},
                      title=f"Speed-up vs the dense baseline, batch {BATCH}")  # fmt: skip

# %% [markdown]
# ## 3. 2:4 semi-structured sparsity (GPU-only)
# Ampere and newer GPUs have sparse Tensor Cores that skip exactly two of every four weights. torchao prunes
# Linear weights to that pattern and swaps in the sparse kernels (`sparsify_` with `SemiSparseWeightConfig`,
# found in `torchao.sparsity.sparse_api` in torchao 0.18). It pays on large Linear layers (e.g. MiniLM's
# feed-forward) at large batch in FP16/BF16. Not yet run on a GPU by the course unless reference results
# are shown.

# %%
if cu.gpu_section("12.gpu-2to4", needs=("torchao",)):
    import copy

    from torchao.sparsity import sparsify_
    from torchao.sparsity.sparse_api import SemiSparseWeightConfig

    from course_utils import quant as Q

    st = cu.models.minilm("cuda").half()
    sents = [s for s in cu.data.verified_path("sentences.txt").read_text().splitlines() if s.strip()]
    feats = {k: v.repeat(16, 1).cuda() for k, v in Q.fixed_length_features(st, sents).items()}
    ref_emb = Q.embed(st, feats)
    m_dense = cu.measure(lambda: Q.embed(st, feats), device="cuda", batch_size=len(feats["input_ids"]), label="dense fp16")
    sp_model = copy.deepcopy(st)
    is_ffn = lambda mod, name: isinstance(mod, torch.nn.Linear) and ("intermediate" in name or "output.dense" in name)  # noqa: E731
    sparsify_(sp_model, SemiSparseWeightConfig(), filter_fn=is_ffn)
    cos = Q.mean_cosine(Q.embed(sp_model, feats), ref_emb)
    m_sp = cu.measure(lambda: Q.embed(sp_model, feats), device="cuda", batch_size=len(feats["input_ids"]), label="2:4 fp16")
    print(f"2:4 sparse FFN layers: cosine to dense {cos:.4f} (no fine-tune), {m_dense.median_ms / m_sp.median_ms:.2f}x the dense speed")
    cu.record("12", "gpu 2:4 sparsity", model="MiniLM", device="cuda", dtype="fp16", measurement=m_sp,
              speedup_vs_baseline=m_dense.median_ms / m_sp.median_ms, error_vs_baseline=1 - cos)  # fmt: skip
else:
    cu.results.show_reference("12")

# %% [markdown]
# ## 4. Knowledge distillation
# The student is the same architecture with an eighth of the channels. Trained twice with the same seed
# and batches: on labels alone, and on the teacher's soft targets (temperature `T`, weight `alpha`) plus the
# labels (`P.distillation_loss`).

# %%
student_widths = dict(c1=8, c2=16, c3=32, hidden=64)
kd_epochs = cu.pick(full=8, smoke=3)
kd_n = cu.pick(full=len(digits.x_train), smoke=512)
xs, ys = digits.x_train[:kd_n], digits.y_train[:kd_n]
torch.manual_seed(0)
s_labels = P.train(cu.models.DigitsCNN(**student_widths), xs, ys, epochs=kd_epochs, batch_size=64, lr=5e-3)
torch.manual_seed(0)
s_kd = P.distill(cu.models.DigitsCNN(**student_widths), teacher, xs, ys, epochs=kd_epochs, batch_size=64, lr=5e-3,
                 temperature=4.0, alpha=0.7)  # fmt: skip
kd_rows = []
for name, mdl in [("student, labels only", s_labels), ("student, distilled", s_kd)]:
    acc = cu.models.accuracy(mdl, digits.x_test, digits.y_test)
    m = timed(mdl, name)
    kd_rows.append({"variant": name, "params": P.count_params(mdl), "accuracy": acc,
                    "flag": accuracy_flag(acc, base_acc, THRESHOLD), "median_ms": m.median_ms,
                    "speedup": m_base.median_ms / m.median_ms, "m": m})  # fmt: skip
    pareto_rows.append({"variant": name, "accuracy": acc, "median_ms": m.median_ms, "params": P.count_params(mdl)})
kd = pd.DataFrame(kd_rows)
gain = (kd.accuracy.iloc[1] - kd.accuracy.iloc[0]) * 100
print(f"Distillation {'helped' if gain > 0 else 'did not help' if gain == 0 else 'hurt'}: {gain:+.2f} points over labels "
      f"alone, after {kd_epochs} epoch(s) on {kd_n} images.")  # fmt: skip
kd.drop(columns="m").round(4)

# %% [markdown]
# ## Accuracy vs speed: the Pareto plot
# Teacher, unstructured-pruned, structured-pruned and distilled models, measured at batch `BATCH`.

# %%
pareto_df = pd.DataFrame(pareto_rows)
pareto_df["accuracy"] = pareto_df["accuracy"] * 100
cu.plots.pareto(pareto_df, x="median_ms", y="accuracy", label="variant",
                title=f"Digits CNN variants: accuracy (%) vs latency at batch {BATCH}")  # fmt: skip
pareto_df.round(3)

# %% [markdown]
# ## What surprised us

# %%
print(f"Unstructured pruning up to {sp.sparsity.max():.0%} zeros: speed {sp.speedup.min():.2f}x-{sp.speedup.max():.2f}x "
      f"of the dense model (spread {noise:.0%}); the tensors keep their shape and the zeros are still multiplied.")  # fmt: skip
s_small = structured.sort_values("channels kept").iloc[0]
param_cut = P.count_params(teacher) / s_small.params
print(f"Keeping {s_small['channels kept']:.0%} of the channels cuts parameters {param_cut:.1f}x; speed changed "
      f"{s_small.speedup:.2f}x" + (": far less than the parameter cut, because per-layer fixed costs (framework "
      "overhead, small kernels) do not shrink with the channels." if s_small.speedup < param_cut / 2 else "."))  # fmt: skip
print(f"The distilled student has {kd.params.iloc[1]:,} parameters ({P.count_params(teacher) / kd.params.iloc[1]:.0f}x fewer) "
      f"and is {kd.speedup.iloc[1]:.2f}x the teacher's speed at {kd.accuracy.iloc[1]:.2%} accuracy.")  # fmt: skip

# %% [markdown]
# ## Beyond this lesson: NAS and operator fusion
# * **Neural architecture search (NAS)** automates what section 4 did by hand: it searches over widths,
#   depths and operators for the best accuracy under a latency budget measured on the target hardware
#   (hardware-aware NAS, e.g. Once-for-All). It costs many training runs; the Pareto plot above is the
#   object it optimizes.
# * **Operator fusion** merges consecutive operations into one kernel so intermediate results never go
#   back to memory. It is measured in **06 · Graph compilation** (Inductor fuses automatically), **07 · ONNX
#   Runtime** (node counts before and after graph optimization) and **08 · TensorRT** (layer fusion in the
#   engine). Folding BatchNorm into the preceding convolution, used in lesson 05's QAT, is the simplest case.

# %% [markdown]
# ## Exercises
# 1. **`12.sparsity`**: write `sparsity(model)` returning the fraction of zeros among all Conv2d and Linear
#    weights.
# 2. **`12.soft-targets`**: write `soft_targets(logits, T)` returning the softmax of `logits / T` (each row
#    sums to 1; larger `T` gives flatter distributions).

# %%
def sparsity(model: torch.nn.Module) -> float:
    raise NotImplementedError  # your code here


cu.exercises.check("12.sparsity", sparsity)


# %%
def soft_targets(logits: torch.Tensor, T: float) -> torch.Tensor:
    raise NotImplementedError  # your code here


cu.exercises.check("12.soft-targets", soft_targets)

# %% [markdown]
# ## Summary rows

# %%
cu.record("12", "baseline", model="digits CNN", device=str(device), dtype="fp32", measurement=m_base, speedup_vs_baseline=1.0)
for r in unstructured.itertuples():
    cu.record("12", f"unstructured {r.sparsity:.0%}", model="digits CNN", device=str(device), dtype="fp32",
              measurement=r.m, speedup_vs_baseline=r.speedup, error_vs_baseline=base_acc - r.accuracy)  # fmt: skip
for _, r in structured.iterrows():
    cu.record("12", f"structured keep {r['channels kept']:.0%}", model="digits CNN", device=str(device), dtype="fp32",
              measurement=r.m, speedup_vs_baseline=r.speedup, error_vs_baseline=base_acc - r["accuracy after fine-tune"])  # fmt: skip
for r in kd.itertuples():
    cu.record("12", r.variant, model="digits CNN student", device=str(device), dtype="fp32", measurement=r.m,
              speedup_vs_baseline=r.speedup, error_vs_baseline=base_acc - r.accuracy)  # fmt: skip
print("rows recorded")
