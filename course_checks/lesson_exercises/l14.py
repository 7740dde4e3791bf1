"""Lesson 14 exercises: profile first, then stack three techniques yourself; choose a technique from measured rows.

14.stack: ``stacked(model, example)`` returns ``(prof, run)``: the ``torch.profiler.profile`` the learner ran on
the given model first, and ``run(x)``, a copy of the model with three techniques stacked: BatchNorm folded into
the convolutions, channels_last, BF16 autocast. The check draws the example and the probe images at random per
call (the seed is printed on failure) and looks inside the model while ``run`` works: every convolution operator
(an operator log, :class:`~course_checks.lesson_exercises.observe.OpLog`, so ``F.conv2d`` beside a decoy module
shows) computes in bfloat16 on a channels_last input inside a ``Conv2d`` module, one per conv layer; no BatchNorm
operator runs; outputs are float32 within the BF16 tolerance of the FP32 model; and the given model is left as it
was (values, dtypes, memory format, modules).

14.pick: random measured rows per call, negative accuracy drops among them (a technique can score higher than
the baseline on a finite test set); the answer must be the fastest technique within the accuracy budget, ranked by
speed-up alone.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

from course_checks.exercises import exercise, observed
from course_checks.lesson_exercises.digits import digits_cnn, held_out_digits
from course_checks.lesson_exercises.observe import CONV_OPS, Cases, OpLog, cases


def _check_pick(fn: Callable[[list[dict], float], str]) -> None:
    names = ["compile", "int8", "onnxruntime", "precision bf16", "channels_last", "tensorrt", "pruned", "distilled"]
    with cases("14.pick") as c:
        for _ in range(6):
            picked = c.rng.sample(names, c.randint(1, 6))
            speedups = c.rng.sample(range(40, 400), len(picked))  # distinct: "the fastest" is one row
            # drops from -0.02 to 0.06: a technique can score higher than the baseline on a finite test set
            rows = [{"technique": t, "speedup": v / 100, "accuracy_drop": c.randint(-20, 60) / 1000}
                    for t, v in zip(picked, speedups, strict=True)]  # fmt: skip
            budget = c.choice([0.0, 0.005, 0.01, 0.02, 0.05])
            ok = [r for r in rows if r["speedup"] > 1.0 and r["accuracy_drop"] <= budget]
            want = max(ok, key=lambda r: r["speedup"])["technique"] if ok else "baseline"
            got = fn([dict(r) for r in rows], budget)
            assert got == want, (
                f"rows {rows}, budget {budget}: the fastest technique (speed-up > 1) whose accuracy_drop is within "
                f"the budget is {want!r}, got {got!r}"
                + (" ('baseline' when none qualifies)" if want == "baseline" else "")
                + _boundary(rows, budget, got, want)
            )
        # a case with a choice to make: the fastest within budget is less accurate than a slower one, and a
        # faster technique is over the budget
        budget = c.choice([0.01, 0.02, 0.05])
        t_fast, t_safe, t_over = c.rng.sample(names, 3)
        fast = c.randint(150, 400) / 100
        rows = [{"technique": t_fast, "speedup": fast, "accuracy_drop": round(budget * 0.8, 4)},
                {"technique": t_safe, "speedup": round(c.randint(101, int(fast * 100) - 1) / 100, 2),
                 "accuracy_drop": 0.0},
                {"technique": t_over, "speedup": fast + 0.5, "accuracy_drop": budget * 2}]  # fmt: skip
        c.rng.shuffle(rows)
        got = fn([dict(r) for r in rows], budget)
        assert got == t_fast, (
            f"rows {rows}, budget {budget}: {t_over!r} is over the budget and {t_safe!r} is slower; the fastest "
            f"within the budget is {t_fast!r} (rank by speedup alone among the rows within it), got {got!r}"
        )
        # a negative drop (accuracy went up, as real runs measure) larger than the budget: within any budget
        budget = c.choice([0.0, 0.005, 0.01, 0.02])
        t_up, t_flat = c.rng.sample(names, 2)
        up_speed = c.randint(150, 400) / 100
        up_drop = -round(budget + c.randint(1, 30) / 1000, 4)
        rows = [{"technique": t_up, "speedup": up_speed, "accuracy_drop": up_drop},
                {"technique": t_flat, "speedup": round(up_speed - c.randint(10, 40) / 100, 2),
                 "accuracy_drop": 0.0}]  # fmt: skip
        c.rng.shuffle(rows)
        got = fn([dict(r) for r in rows], budget)
        assert got == t_up, (
            f"rows {rows}, budget {budget}: {t_up!r} is the fastest and its accuracy_drop {up_drop} is negative "
            "(accuracy went up), which is within any budget: keep rows with accuracy_drop <= budget, not "
            f"abs(accuracy_drop) <= budget; got {got!r}"
        )
        # the fastest row within the budget against a slightly slower one whose drop is far lower (negative): a
        # ranking by speedup - accuracy_drop (or any mix of the two) picks the slower one
        budget = c.choice([0.01, 0.02, 0.05])
        t_top, t_near = c.rng.sample(names, 2)
        top = c.randint(150, 400) / 100
        top_drop, near_drop = round(budget / 2, 4), -c.randint(10, 30) / 1000
        gap = c.randint(1, math.ceil((top_drop - near_drop) * 100 - 1e-9) - 1) / 100  # below the drops' difference
        rows = [{"technique": t_top, "speedup": top, "accuracy_drop": top_drop},
                {"technique": t_near, "speedup": round(top - gap, 2), "accuracy_drop": near_drop}]  # fmt: skip
        c.rng.shuffle(rows)
        got = fn([dict(r) for r in rows], budget)
        assert got == t_top, (
            f"rows {rows}, budget {budget}: both are within the budget and {t_top!r} is the faster; {t_near!r} is "
            "slower though its accuracy_drop is lower. The budget alone judges accuracy: among the rows within it, "
            f"rank by speedup alone (not speedup - accuracy_drop); got {got!r}"
        )
        # on the boundaries: the fastest row's drop is exactly the budget (within it: <=), another row has a
        # speed-up of exactly 1.0 (no faster than the baseline: > 1), the budget 0 allows a drop of exactly 0
        budget = c.choice([0.01, 0.02, 0.05])
        t_edge, t_one, t_slower = c.rng.sample(names, 3)
        edge = c.randint(150, 300) / 100
        rows = [{"technique": t_edge, "speedup": edge, "accuracy_drop": budget},
                {"technique": t_one, "speedup": 1.0, "accuracy_drop": 0.0},
                {"technique": t_slower, "speedup": round(edge - 0.3, 2), "accuracy_drop": 0.0}]  # fmt: skip
        c.rng.shuffle(rows)
        got = fn([dict(r) for r in rows], budget)
        assert got == t_edge, (
            f"rows {rows}, budget {budget}: {t_edge!r} drops accuracy by exactly the budget, which is within it "
            f"(accuracy_drop <= budget), and it is the fastest; got {got!r}"
        )
        rows = [
            {"technique": t_one, "speedup": 1.0, "accuracy_drop": 0.0},
            {"technique": t_edge, "speedup": edge, "accuracy_drop": 0.0},
        ]
        got = fn([dict(r) for r in rows[:1]], 0.0)
        assert got == "baseline", (
            f"rows {rows[:1]}: a speed-up of exactly 1.0 is no faster than the baseline (speed-up > 1): answer "
            f"'baseline', got {got!r}"
        )
        got = fn([dict(r) for r in rows], 0.0)
        assert got == t_edge, f"rows {rows}, budget 0.0: a drop of exactly 0 is within a budget of 0; got {got!r}"
        slow = [{"technique": "precision bf16", "speedup": 0.6, "accuracy_drop": 0.0}]
        got = fn(slow, 0.01)
        assert got == "baseline", f"nothing faster than the baseline (speed-up > 1): answer 'baseline', got {got!r}"
        got = fn([], 0.01)
        assert got == "baseline", f"no rows at all: answer 'baseline', got {got!r}"
    observed("7 random row sets (drops from -0.02), a fastest row whose accuracy went up by more than the budget, "
             "a slightly slower row with a far lower drop, a drop of exactly the budget, a speed-up of exactly 1.0, "
             "a budget of 0, only slower rows and no rows: your pick matched on every one")  # fmt: skip


@exercise(
    "14.pick",
    "Return the technique with the highest speed-up (> 1) whose accuracy_drop is within the budget, "
    "or 'baseline' when none qualifies.",
    _check_pick,
    time_limit=20,
)
def pick_technique(rows: list[dict], budget: float) -> str:
    ok = [r for r in rows if r["speedup"] > 1.0 and r["accuracy_drop"] <= budget]
    return max(ok, key=lambda r: r["speedup"])["technique"] if ok else "baseline"


def _boundary(rows: list[dict], budget: float, got: Any, want: str) -> str:
    """What a wrong pick got wrong when a row sits on a boundary of the rule."""
    by = {r["technique"]: r for r in rows}
    if want in by and by[want]["accuracy_drop"] < 0 and -by[want]["accuracy_drop"] > budget:
        return (f": {want!r} has a negative accuracy_drop (accuracy went up), within any budget "
                "(accuracy_drop <= budget, not abs(accuracy_drop))")  # fmt: skip
    if want in by and by[want]["accuracy_drop"] == budget:
        return f": {want!r} drops accuracy by exactly the budget, which is within it (accuracy_drop <= budget)"
    if got in by and by[got]["speedup"] == 1.0:
        return f": {got!r} has a speed-up of exactly 1.0, no faster than the baseline (speed-up > 1)"
    if want in by and got in by and by[got]["accuracy_drop"] <= budget and 1.0 < by[got]["speedup"]:
        return f": {got!r} is within the budget but slower than {want!r}: rank by speedup alone"
    return ""


def _snapshot(model: Any) -> tuple[list, list]:
    """What 'unchanged' means: every tensor's value, dtype and strides, and every module's type."""
    tensors = [(k, v.detach().clone(), v.dtype, v.stride()) for k, v in model.state_dict().items()]
    return tensors, [(n, type(m).__name__) for n, m in model.named_modules()]


def _profiled_ops(prof: Any) -> set[str]:
    return {e.key for e in prof.key_averages()}


def draw_stack(c: Cases, n_images: int) -> tuple[Any, Any]:
    """What a seed draws: the rows of the example (4-16 images) and of the probe images (8-32), disjoint."""
    import torch

    pick = c.rng.sample(range(n_images), 48)
    return torch.tensor(pick[: c.randint(4, 16)]), torch.tensor(pick[16 : 16 + c.randint(8, 32)])


def judge_answer(answer: Any) -> tuple[Any, Callable[[Any], Any], set[str]]:
    """The judgment of what ``stacked(model, example)`` returned: (prof, run), the profile showing the given
    model's convolution and BatchNorm. Returns (prof, run, the profiled operators)."""
    import torch

    assert isinstance(answer, tuple) and len(answer) == 2, (
        "stacked(model, example) must return (prof, run): the profiler you ran on the given model first, and "
        f"run(x); got {type(answer).__name__}"
    )
    prof, run = answer
    assert isinstance(prof, torch.profiler.profile), (
        "profile first: return the torch.profiler.profile object you ran around model(example) before changing "
        f"anything (got {type(prof).__name__})"
    )
    seen = _profiled_ops(prof)
    assert any("conv" in k for k in seen) and any("batch_norm" in k for k in seen), (
        "the profile shows no convolution and BatchNorm of the given model: run model(example) inside "
        "`with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:` before stacking techniques "
        f"(profiled ops: {sorted(seen)[:8]})"
    )
    assert callable(run), f"the second item must be a function run(x), got {type(run).__name__}"
    return prof, run, seen


def judge_unchanged(model: Any, before: tuple[list, list]) -> None:
    """The given model is as ``_snapshot`` saw it before the answer ran."""
    import torch

    tensors, modules = _snapshot(model)
    old = {k: (v, dt, st) for k, v, dt, st in before[0]}
    changed = [k for k, v, dt, st in tensors
               if k not in old or dt != old[k][1] or st != old[k][2] or not torch.equal(v, old[k][0])]  # fmt: skip
    changed += [k for k in old if k not in {t[0] for t in tensors}]
    assert not changed and modules == before[1], (
        "the given model was changed in place ("
        + (f"tensors {changed[:3]}" if changed else "its modules were replaced")
        + "): .to(...), fusion and layout changes act in place. Work on copy.deepcopy(model), so the baseline "
        "you compare against stays the baseline"
    )


def run_stacked(run: Callable[[Any], Any], probe: Any, folded: list[tuple[Any, Any]], n_convs: int) -> tuple:
    """``run(probe)`` watched (an operator log, every Conv2d module's forward) and judged: bf16 convolutions inside
    the model's own channels_last Conv2d layers with folded weights, no BatchNorm, float32 outputs without autograd.
    ``folded``: :func:`_folded_weights` of the given model. Returns (outputs, the convolution operators)."""
    import torch

    layouts: list[bool] = []
    weights: list[Any] = []
    kept: list[Any] = []  # the dtype each Conv2d keeps its weight in

    def watch(mod: Any, inputs: Any, output: Any) -> None:  # every Conv2d module's forward, copies included
        if isinstance(mod, torch.nn.Conv2d):  # (with 1 channel both layouts are the same: nothing to see)
            cl = torch.channels_last
            layouts.append((mod.in_channels == 1 or mod.weight.is_contiguous(memory_format=cl))
                           and (inputs[0].shape[1] == 1 or inputs[0].is_contiguous(memory_format=cl)))  # fmt: skip
            weights.append(mod.weight.detach().float().clone())
            kept.append(mod.weight.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(watch)
    try:
        with OpLog() as log:
            out = run(probe)
    finally:
        handle.remove()
    assert isinstance(out, torch.Tensor), f"run(x) must return a tensor, got {type(out).__name__}"
    assert out.dtype == torch.float32, f"run(x) must return float32 outputs (call .float()), got {out.dtype}"
    assert not out.requires_grad, "run under torch.inference_mode() (or no_grad): the outputs carry autograd history"
    top = log.named(*CONV_OPS)
    assert top, "no convolution ran: run(x) must run (a copy of) the model on x"
    fp32 = [op for op in top if torch.bfloat16 not in op.out_dtypes]
    assert not fp32, (
        f"{len(fp32)} of {len(top)} convolutions computed in {fp32[0].out_dtypes[0]}: run the model under "
        "torch.autocast('cpu', dtype=torch.bfloat16) (the model's own convolutions, not a decoy beside them)"
    )
    assert len(top) == n_convs, (
        f"{len(top)} convolutions ran for a model with {n_convs}: run each conv layer once per call, on x (not a "
        "decoy module or a throwaway input beside the model)"
    )
    assert len(layouts) == len(top), (
        f"{len(top)} convolutions ran but only {len(layouts)} inside Conv2d modules: F.conv2d calls beside the "
        "model are not the model. Run the model's own (copied) layers"
    )
    assert all(layouts), (
        f"{layouts.count(False)} convolutions ran on NCHW weights or inputs: convert the copy with "
        ".to(memory_format=torch.channels_last) and x with x.contiguous(memory_format=torch.channels_last)"
    )
    bn = log.named("batch_norm")
    assert not bn, (
        f"BatchNorm still ran ({len(bn)} operators): fold each BatchNorm into the convolution before it "
        "(torch.nn.utils.fusion.fuse_conv_bn_eval(conv, bn), then replace the BatchNorm with nn.Identity())"
    )
    cast = [dt for dt in kept if dt != torch.float32]
    assert not cast, (
        f"{len(cast)} of {len(kept)} Conv2d layers keep their weights in {cast[0]}: the model's weights were cast "
        f"to {cast[0]} (model.to(...)), which is not autocast. Keep the copy in float32 and run it under "
        "torch.autocast('cpu', dtype=torch.bfloat16): each convolution then computes in bf16 from fp32 weights"
    )
    for i, (w, (want, original)) in enumerate(zip(weights, folded, strict=False)):
        if w.shape != want.shape:
            continue
        if torch.allclose(w, original, rtol=1e-4, atol=1e-6) and not torch.allclose(want, original):
            raise AssertionError(
                f"convolution {i} ran with the model's original weights, not folded ones: its BatchNorm was "
                "applied some other way (by hand, in elementwise operations), not folded. Fold it: "
                "fuse_conv_bn_eval(conv, bn) gives a conv whose weights are scaled by gamma / sqrt(var + eps)"
            )
        assert torch.allclose(w, want, rtol=1e-3, atol=1e-5), (
            f"convolution {i}'s weights are neither the original ones nor the folded ones (conv weight x gamma / "
            "sqrt(running_var + eps)): fold each BatchNorm into the conv just before it"
        )
    return out, top


def judge_stack_outputs(out: Any, ref: Any) -> Any:
    """``run``'s outputs against the FP32 model's (``ref``) within the bf16 tolerance; returns the comparison."""
    from course_utils.measuring.outputs import compare_outputs

    cmp = compare_outputs(out.flatten(), ref.flatten(), "bf16")  # flattened: no top-1 over a few ambiguous digits
    assert cmp.within, f"outputs differ from the FP32 model beyond the bf16 tolerance: {cmp.reason}"
    return cmp


def _check_stack(fn: Callable[[Any, Any], Any]) -> None:
    import torch

    with cases("14.stack") as c:
        model = digits_cnn()
        n_convs = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
        digits, _ = held_out_digits()
        example_rows, probe_rows = draw_stack(c, len(digits))
        example, probe = digits[example_rows], digits[probe_rows]
        before = _snapshot(model)
        with torch.inference_mode():
            ref = model(probe)
        _, run, seen = judge_answer(fn(model, example))
        judge_unchanged(model, before)
        folded = _folded_weights(model)
        out, top = run_stacked(run, probe, folded, n_convs)
        cmp = judge_stack_outputs(out, ref)
        n_folded = sum(not torch.allclose(want, original) for want, original in folded)
        kinds = sorted({d for op in top for d in op.out_dtypes}, key=str)
    observed(f"a profile of the given model ({len(seen)} operator kinds, convolution and batch_norm among them); "
             f"then run(x): {len(top)} convolutions, each inside a Conv2d module, computing in {kinds}, on "
             f"channels_last weights and inputs, {n_folded} of them with weights equal to conv x BatchNorm folded; "
             f"0 BatchNorm operators; output float32 ({cmp})")  # fmt: skip


def _folded_weights(model: Any) -> list[tuple[Any, Any]]:
    """For each conv of ``model``, in order: the weight it has after folding the BatchNorm right after it (the same
    weight where none follows), and its original weight."""
    import torch
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    layers = [m for m in model.modules() if not list(m.children())]
    out = []
    for i, m in enumerate(layers):
        if isinstance(m, torch.nn.Conv2d):
            bn = layers[i + 1] if i + 1 < len(layers) and isinstance(layers[i + 1], torch.nn.BatchNorm2d) else None
            folded = fuse_conv_bn_eval(copy.deepcopy(m).eval(), copy.deepcopy(bn).eval()) if bn is not None else m
            out.append((folded.weight.detach().float().clone(), m.weight.detach().float().clone()))
    return out


@exercise(
    "14.stack",
    "stacked(model, example) -> (prof, run): profile model(example) with torch.profiler.profile first; then on "
    "copy.deepcopy(model): fold each BatchNorm into its conv (fuse_conv_bn_eval, the BatchNorm -> nn.Identity), "
    ".to(memory_format=torch.channels_last); run(x) feeds x in channels_last under torch.autocast('cpu', "
    "dtype=torch.bfloat16) and torch.inference_mode(), returning float32.",
    _check_stack,
    time_limit=60,
)
def stacked(model: Any, example: Any) -> tuple[Any, Callable[[Any], Any]]:
    import torch
    from torch.nn.utils.fusion import fuse_conv_bn_eval
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(example)
    fast = copy.deepcopy(model).eval()
    layers = list(fast.features)
    for i, (conv, bn) in enumerate(zip(layers, layers[1:], strict=False)):
        if isinstance(conv, torch.nn.Conv2d) and isinstance(bn, torch.nn.BatchNorm2d):
            fast.features[i], fast.features[i + 1] = fuse_conv_bn_eval(conv, bn), torch.nn.Identity()
    fast = fast.to(memory_format=torch.channels_last)

    def run(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            return fast(x.contiguous(memory_format=torch.channels_last)).float()

    return prof, run
