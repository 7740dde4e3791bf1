# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 14 · Capstone: one model through every technique
#
# **Goals.**
# 1. Take one model through the course's techniques in order (baseline, batching, reduced precision,
#    `torch.compile`, ONNX Runtime, TensorRT where present, INT8 quantization), each step verified against
#    the baseline's outputs and an accuracy budget before it is timed.
# 2. Read the result as a decision: a table and a plot of speed-up and accuracy, the best configuration so
#    far (cumulative), and a guide printed from this run's numbers: "on this machine, try X first".
# 3. Reuse the pipeline on your own model: it is one function, `course_utils.optimize.optimize`.
# 4. Put this machine's results on the **leaderboard** beside shipped GPU reference runs and, in a
#    workshop, beside every attendee's machine.
#
# **The bottleneck.** All of them, one after the other: see the taxonomy in **01 · Measuring inference**.
# Batching attacks per-call overhead (03), precision and quantization attack compute and memory traffic
# (04, 05), compilers and runtimes attack framework overhead and memory traffic by fusing operators
# (06, 07, 08). Which one pays depends on which bottleneck this model has on this machine, and that is
# what the run measures.

# %%
import tempfile
import warnings
from pathlib import Path

import pandas as pd
import torch

import course_utils as cu
from course_utils import leaderboard
from course_utils.optimize import TECHNIQUES, decision_guide, optimize

device = cu.lesson.start("14", "Capstone")

# %% [markdown]
# ## The model and what "accurate" means
# On a GPU the capstone uses **ResNet-18** at batch 1 (224×224 images). torchvision's ImageNet weights are
# used only if they are already in the local torch cache; with random weights, "accuracy" is the top-1
# agreement with the fp32 baseline's predictions on a fixed set of inputs (a variant must predict what the
# baseline predicts). On a CPU it uses the course's trained **digits CNN** at batch 1, and accuracy is its
# real top-1 accuracy on the held-out digits. The accuracy function is yours to choose: `optimize()` only
# needs `accuracy_fn(run) -> float`, where `run(x)` behaves like the model.

# %%
if device.type == "cuda":
    model, weights_note = cu.models.resnet("resnet18", device=device)
    model_name = "resnet18"
    example = torch.randn(1, 3, 224, 224, device=device)
    probe = torch.randn(cu.pick(full=64, smoke=16), 3, 224, 224, device=device)
    with torch.inference_mode():
        probe_labels = model(probe).argmax(-1)

    def accuracy_fn(run) -> float:
        """Top-1 agreement with the fp32 baseline on fixed inputs (valid with random weights too)."""
        with torch.inference_mode():
            return float((run(probe).argmax(-1) == probe_labels).float().mean())

else:
    model = cu.models.load_digits_model("cnn", device=device)
    weights_note = "trained digits weights shipped in data/ (sha256 checked)"
    model_name = "digits-cnn"
    digits = cu.data.load_digits_split()
    example = digits.x_test[:1].to(device)

    def accuracy_fn(run) -> float:
        """Top-1 accuracy on the held-out digits."""
        return cu.models.accuracy(run, digits.x_test, digits.y_test)


n_params = sum(p.numel() for p in model.parameters())
print(f"Model: {model_name}, {n_params / 1e6:.2f} M parameters ({weights_note})")
print(f"Example input: {tuple(example.shape)} on {device}; threads: {torch.get_num_threads()}")

# %% [markdown]
# ## The techniques, in order
# `optimize()` tries each technique in the course's order. Each one is first **checked**: its outputs on the
# example are compared with the baseline's within the tolerance of its precision (the table below,
# `cu.compare.TOLERANCES`), and its accuracy must stay within the budget (a drop of at most
# `accuracy_budget`). Only a variant that passes the output check is timed with `cu.measure`: a speed-up of
# something that computes something else is no speed-up. What does not apply here is skipped with the
# reason (TensorRT needs a GPU; dynamic INT8 needs Linear layers).
#
# In smoke mode (the tests) `torch.compile` is left out, because a cold compile costs tens of seconds on a
# small CPU; the full run includes it.

# %%
cu.compare.tolerance_table()

# %%
budget = 0.01
techniques = cu.pick(full=list(TECHNIQUES[1:]), smoke=[t for t in TECHNIQUES[1:] if t != "compile"])
print(f"Techniques tried: {techniques}; accuracy budget: a drop of at most {budget}")
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", category=cu.timing.HighSpreadWarning)
    report = optimize(model, example, accuracy_fn, device=device, accuracy_budget=budget, techniques=techniques,
                      model_name=model_name)  # fmt: skip

# %% [markdown]
# ## Verified first: every variant against the baseline
# The `check` column is the comparison with the baseline's outputs; `within_budget` combines it with the
# accuracy budget. A variant outside either one has no speed figure.

# %%
df = report.df
df[["technique", "applied", "check", "accuracy", "within_budget", "reason"]]

# %% [markdown]
# ## Then measured: speed-up and cumulative speed-up
# `speedup` is throughput (items per second) relative to the baseline, so that batching, which changes the
# batch size, is comparable with the rest. `cumulative_speedup` is the best configuration found so far going
# down the table (only steps within budget count). When batching and another technique both pay, the
# last row runs the best one at the larger batch too: stacked, not just side by side.

# %%
df[["technique", "batch_size", "median_ms", "throughput", "speedup", "cumulative_speedup", "setup_s"]]

# %%
fig = report.plot()

# %% [markdown]
# ## The decision guide, from this run
# Printed from the table above, not written in advance: it names what to try first on this machine, what
# does not pay here, and what was skipped and why.

# %%
print(decision_guide(report))

# %% [markdown]
# ## What surprised us
# Printed from this run's numbers. Things to look for: a technique that is *slower* than the baseline, a
# set-up cost (compile, export) that takes many calls to pay back, and an accuracy cost of INT8.

# %%
ran = df[df["applied"] & (df["technique"] != "baseline") & df["speedup"].notna()]
base = report.step("baseline")
for _, r in ran.iterrows():
    verdict = "faster than" if r["speedup"] >= 1.0 else "slower than"
    print(f"{r['technique']}: {r['speedup']:.2f}x, {verdict} the baseline here.")
slower = ran[ran["speedup"] < 1.0]
if slower.empty:
    print("No timed technique was slower than the baseline in this run.")
else:
    print(f"Did not pay here: {', '.join(slower['technique'])} — a technique that helps elsewhere can cost here.")
same_batch = ran[ran["batch_size"] == base.batch_size]
for _, r in same_batch.iterrows():
    saved = base.median_ms - r["median_ms"]
    if r["setup_s"] and r["setup_s"] > 1.0 and saved > 0:
        calls = r["setup_s"] * 1000.0 / saved
        print(f"{r['technique']} needs {r['setup_s']:.1f} s of set-up; at {saved:.3f} ms saved per call it pays back "
              f"after about {calls:,.0f} calls.")  # fmt: skip
if "batching" in set(ran["technique"]):
    bt = report.step("batching")
    print(f"Batching: {bt.speedup:.2f}x the throughput, but each batch of {bt.batch_size} takes "
          f"{bt.median_ms / base.median_ms:.2f}x the baseline's latency: throughput and latency pull apart.")  # fmt: skip
for s in report.steps:
    if s.technique.startswith("int8") and s.applied and s.accuracy is not None:
        print(f"INT8: accuracy {s.accuracy:.4f} vs baseline {report.baseline_accuracy:.4f} "
              f"(change {s.accuracy - report.baseline_accuracy:+.4f}); {s.reason}")  # fmt: skip

# %% [markdown]
# ## Record the run
# One row per timed step goes to this machine's results file, where the leaderboard below finds it.

# %%
n_rows = report.record("14", model=model_name)
print(f"Wrote {n_rows} rows for lesson 14 to {cu.results.results_dir()}")

# %% [markdown]
# ## Bring your own model
# The whole pipeline is one call. Point it at your model with an input batch as production will send it
# and an accuracy function (higher is better), and read the table and the guide:
#
# ```python
# from course_utils.optimize import optimize, decision_guide
#
# report = optimize(my_model, my_batch, lambda run: my_metric(run, my_val_data),
#                   accuracy_budget=0.005, techniques=None)   # None: every technique
# report.df; report.plot(); print(decision_guide(report))
# report.record("mine", model="my-model")                     # onto the leaderboard
# ```
#
# `techniques` takes a subset of `TECHNIQUES` (leave out `"compile"` for a quick first look); the model's
# forward must return one tensor (wrap it otherwise: the error says how).

# %% [markdown]
# ## The leaderboard
# `leaderboard.load()` reads this machine's results folder and the reference runs shipped in
# `data/reference/` (each labelled with its GPU, versions and date). In a workshop, collect every
# attendee's `results/*.csv` into one folder and pass it as `extra=[folder]`: a malformed file is skipped
# with a warning naming it, and nothing else is lost.

# %%
board = leaderboard.load()
leaderboard.machines(board)

# %%
table = leaderboard.leaderboard(board, lesson="14", value="speedup_vs_baseline")
table

# %%
fig = leaderboard.plot(table, title="Lesson 14: speed-up per technique and machine",
                       xlabel="speed-up vs baseline (x, higher is better)")  # fmt: skip
print(leaderboard.best_technique(board, "14").to_string(index=False))
if device.type != "cuda":
    cu.results.show_reference("14")

# %% [markdown]
# ### Pooling a workshop's files
# A dry run of what an instructor does: copy this machine's file into a folder with a broken file beside it
# (as happens when an attendee sends the wrong thing) and pool the folder. The broken file is named in a
# warning; every row of the good file is kept.

# %%
with tempfile.TemporaryDirectory() as tmp:
    pooled_dir = Path(tmp)
    own = sorted(cu.results.results_dir().glob("*.csv"))
    for f in own:
        (pooled_dir / f"attendee-{f.name}").write_bytes(f.read_bytes())
    (pooled_dir / "attendee-broken.csv").write_text("this is not,a results file\n1,2\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pooled = leaderboard.pool([pooled_dir])
for w in caught:
    print(f"warning: {w.message}")
own_rows = sum(len(pd.read_csv(f)) for f in own)
print(f"Pooled {len(pooled)} rows from {pooled['source'].nunique()} good file(s); this machine has {own_rows}.")

# %% [markdown]
# ## Exercises
# **14.pick.** From measured rows (`technique`, `speedup`, `accuracy_drop`), return the technique with the
# highest speed-up above 1 whose accuracy drop is within the budget, or `"baseline"` when none qualifies.

# %%
def pick_technique(rows: list[dict], budget: float) -> str:
    raise NotImplementedError  # your code here


cu.exercises.check("14.pick", pick_technique)

# %% [markdown]
# **Break-even, revisited (exercise 06.break-even).** A compiled model or an ONNX export costs seconds before
# its first answer. Write again (or copy from lesson 06) the function that returns after how many calls the
# set-up has paid back (rounded up), `math.inf` if the variant is not faster, 0 if set-up cost nothing; then
# apply it to this run's `compile` or `onnxruntime` row (`setup_s` and `median_ms` columns of `report.df`).

# %%
def break_even(setup_s: float, baseline_ms: float, variant_ms: float) -> float:
    raise NotImplementedError  # your code here


cu.exercises.check("06.break-even", break_even)

# %% [markdown]
# ## Summary
# One model went through every technique of the course on this machine, each verified against the baseline
# before it was timed; the guide above says which one to try first *here*, and the leaderboard shows how
# that answer changes with the machine. For a workshop: `make course` runs every notebook headless and
# renders the same leaderboard into `build/course/index.html`.
