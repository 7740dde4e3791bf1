# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # NN · Title
#
# The skeleton every lesson has (CONTRIBUTING.md, "Add a lesson"; tests/test_contributing.py checks the fixed
# parts). Copy it to `lessons/NN_slug.py`, replace NN, the title and every placeholder, then `make notebooks`.
# Files in lessons/ whose name starts with "_" are no lesson: no notebook is made from this one and no lesson
# test runs it. Fixed parts: this title line (`# # NN · Title`), **Goals.**, **The bottleneck it attacks**,
# "## What surprised us", "## Exercise..." and "## Summary..." (the last heading), with a "Next:" line.
#
# **Goals.** What the learner writes and measures here, in two to five sentences: the technique's own calls,
# which stand in this lesson's cells (tests/test_key_calls.py), not only inside course_utils.
#
# **The bottleneck it attacks** (*01 · Measuring inference*, the taxonomy): compute-, memory-, overhead-,
# transfer- or input-bound, and why this technique attacks that one.

# %%
# The setup cell of a real lesson (a few lines; it seeds, picks the device and prints the modes):
#     import course_utils as cu
#
#     device = cu.lesson.start("NN", "Title")
# The template only prints, so that `python lessons/_template.py` runs anywhere.
SIZE = 64  # a real lesson: SIZE = cu.pick(full=..., smoke=...), smoke sizes for the tests
print(f"template: a lesson's setup cell goes here (size {SIZE})")

# %% [markdown]
# ## Baseline, measured
# The untouched model or pipeline, measured with lesson 01's timer (`cu.measure`, or the timer written out).

# %%
print("template: the baseline, measured")

# %% [markdown]
# ## The technique, written out
# The technique's own calls in this lesson's cells, then its outputs compared with the baseline's (a stated
# tolerance) before any speed figure.

# %%
print("template: the technique, checked against the baseline")

# %% [markdown]
# ## Measured: table and plot
# Every ratio from `cu.compare` (variants interleaved in rounds, printed with its interval); the table and a plot.

# %%
print("template: the table and the plot")

# %% [markdown]
# ## What surprised us
# Pitfalls, and when the technique does not pay, phrased from this run's numbers (never typed in).

# %%
print("template: what surprised us, from this run's numbers")

# %% [markdown]
# ## Exercise
# **NN.slug.** What the learner writes (the technique's core calls) and what the self-check observes. The
# reference solution is never shown in a cell above; `cu.exercises.show_solution("NN.slug")` prints it.


# %%
def your_function(x):
    raise NotImplementedError  # your code here


# A real lesson: cu.exercises.check("NN.slug", your_function)
print("template: the exercise cell calls cu.exercises.check")

# %% [markdown]
# ## Summary
# Three or four bullets of what was measured, and the rows written to this machine's results.
#
# Next: **NN+1 · Title of the next lesson**.

# %%
# A real lesson: cu.record("NN", "technique", model=..., device=..., ...) for each measured variant.
print("template: the result rows are recorded here")
