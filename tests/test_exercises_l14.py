"""Lesson 14's exercises reject wrong answers. 14.stack: no profile or a profile of the wrong model, a technique
left out (fewer than three), the wrong precision, NCHW inputs, F.conv2d beside a decoy conv, low-precision outputs,
autograd left on, the given model changed in place, outputs that do not match. 14.pick: hard-coded or wrong
choices on random rows."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils.fusion import fuse_conv_bn_eval
from torch.profiler import ProfilerActivity, profile

from course_checks import exercises
from course_checks.lesson_exercises import l14
from course_checks.lesson_exercises.digits import digits_cnn, held_out_digits
from course_checks.lesson_exercises.observe import Cases


def verdict(fn, key="14.stack") -> str:
    return exercises.verdict(key, fn)


def _fold(m):
    layers = list(m.features)
    for i, (conv, bn) in enumerate(zip(layers, layers[1:], strict=False)):
        if isinstance(conv, torch.nn.Conv2d) and isinstance(bn, torch.nn.BatchNorm2d):
            m.features[i], m.features[i + 1] = fuse_conv_bn_eval(conv, bn), torch.nn.Identity()
    return m


def _variant(
    *,
    prof=True,
    prof_after=False,
    fold=True,
    cl=True,
    amp=torch.bfloat16,
    out_float=True,
    inference=True,
    copy_model=True,
    scale=1.0,
):
    def stacked(model, example):
        p = None
        if prof and not prof_after:
            with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as p:
                model(example)
        m = copy.deepcopy(model).eval() if copy_model else model
        m = _fold(m) if fold else m
        m = m.to(memory_format=torch.channels_last) if cl else m
        if prof_after:
            with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as p:
                m(example)

        def run(x):
            x = x.contiguous(memory_format=torch.channels_last) if cl else x
            ctx = torch.inference_mode() if inference else torch.enable_grad()
            with ctx, torch.autocast("cpu", dtype=amp, enabled=amp is not None):
                y = m(x) * scale
            return y.float() if out_float else y

        return p, run

    return stacked


def decoy_functional(model, example):
    """F.conv2d in FP32 on the model's weights; a decoy Conv2d called under autocast so a module hook sees bf16."""
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as p:
        model(example)
    m = _fold(copy.deepcopy(model).eval())
    decoy = torch.nn.Conv2d(1, 1, 1).to(memory_format=torch.channels_last)

    def run(x):
        with torch.inference_mode():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                decoy(x.contiguous(memory_format=torch.channels_last))  # the decoy: bf16, channels_last
            h = x
            for layer in m.features:
                h = (
                    F.conv2d(h, layer.weight, layer.bias, padding=layer.padding)
                    if isinstance(layer, torch.nn.Conv2d)
                    else layer(h)
                )
            return m.classifier(h).float()

    return p, run


def decoy_functional_bf16(model, example):
    """Every convolution through F.conv2d in bf16 (right dtype), none inside a Conv2d module."""
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as p:
        model(example)
    m = _fold(copy.deepcopy(model).eval())

    def run(x):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            h = x.contiguous(memory_format=torch.channels_last)
            for layer in m.features:
                h = (
                    F.conv2d(h, layer.weight, layer.bias, padding=layer.padding)
                    if isinstance(layer, torch.nn.Conv2d)
                    else layer(h)
                )
            return m.classifier(h).float()

    return p, run


def in_place(model, example):
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as p:
        model(example)
    m = model.to(memory_format=torch.channels_last)  # converts the given model's weights in place

    def run(x):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            return m(x.contiguous(memory_format=torch.channels_last)).float()

    return p, run


def in_place_fold(model, example):
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as p:
        model(example)
    return p, _run_on(_fold(model))  # folds the given model itself


def _run_on(m):
    m = m.to(memory_format=torch.channels_last)

    def run(x):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            return m(x.contiguous(memory_format=torch.channels_last)).float()

    return run


def by_hand_bn(model, example):
    """BatchNorm computed by hand after each conv (elementwise), not folded: no batch_norm operator runs."""
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as p:
        model(example)
    m = copy.deepcopy(model).eval().to(memory_format=torch.channels_last)

    def run(x):
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            h = x.contiguous(memory_format=torch.channels_last)
            for layer in m.features:
                if isinstance(layer, torch.nn.BatchNorm2d):
                    scale = layer.weight / torch.sqrt(layer.running_var + layer.eps)
                    h = (h - layer.running_mean[:, None, None]) * scale[:, None, None] + layer.bias[:, None, None]
                else:
                    h = layer(h)
            return m.classifier(h).float()

    return p, run


def cast_to_bf16(model, example):
    """The copy cast to bfloat16 (model.to(torch.bfloat16)) instead of autocast: bf16 weights, no autocast."""
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as p:
        model(example)
    m = _fold(copy.deepcopy(model).eval()).to(memory_format=torch.channels_last).to(torch.bfloat16)

    def run(x):
        with torch.inference_mode():
            return m(x.contiguous(memory_format=torch.channels_last).bfloat16()).float()

    return p, run


WRONG_STACKS = {
    "no-profile": (_variant(prof=False), "profile first"),
    "profile-of-the-stack": (_variant(prof_after=True), "no convolution and BatchNorm"),
    "two-techniques": (_variant(fold=False), "BatchNorm still ran"),
    "no-autocast": (_variant(amp=None), "computed in torch.float32"),
    "fp16": (_variant(amp=torch.float16), "computed in torch.float16"),
    "nchw": (_variant(cl=False), "NCHW"),
    "bf16-out": (_variant(out_float=False), "float32"),
    "autograd": (_variant(inference=False), "inference_mode"),
    "wrong-values": (_variant(scale=1.5), "tolerance"),
    "decoy-conv-fp32": (decoy_functional, "computed in torch.float32"),
    "functional-bf16": (decoy_functional_bf16, "inside Conv2d modules"),
    "in-place-layout": (in_place, "changed in place"),
    "in-place-fold": (in_place_fold, "changed in place"),
    "no-model": (lambda model, example: (None, lambda x: torch.zeros(len(x), 10)), "profile first"),
    "bn-by-hand": (by_hand_bn, "applied some other way"),
    "cast-not-autocast": (cast_to_bf16, "weights were cast to torch.bfloat16"),
}


def test_reference_passes():
    for seed in range(4):
        assert exercises.verdict("14.stack", l14.stacked, seed=seed) == "accepted", seed
    assert verdict(_variant()) == "accepted"


@pytest.mark.parametrize("name", sorted(WRONG_STACKS))
def test_wrong_stacks_are_rejected(name):
    """The full checker, on one fresh seed per run."""
    fn, message = WRONG_STACKS[name]
    got = verdict(fn)
    assert message in got, got


def judged_on_200_seeds(fn):
    """The checker's judgment of ``fn`` on each of seeds 0-199, by its own judges (``draw_stack``,
    ``judge_answer``, ``judge_unchanged``, ``run_stacked``, ``judge_stack_outputs``).

    A full call costs 20-180 ms (the answer profiles the model; the checker reads the profile). The seeds draw 13
    example sizes (4-16 images): the answer is called once per size on a given model (on that size's first
    seed's example), its profile and the model judged, and its run(x) judged on all 450 test images (one call);
    each seed's probe rows of those outputs are then compared with the FP32 model's (eval mode: each image is
    computed alone).
    """
    digits, _ = held_out_digits()
    draws = {seed: l14.draw_stack(Cases(seed), len(digits)) for seed in range(200)}
    with torch.inference_mode():
        ref = digits_cnn()(digits)
    by_size = {}
    for example_rows, _ in draws.values():
        if len(example_rows) in by_size:
            continue
        model = digits_cnn()
        n_convs = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
        before = l14._snapshot(model)
        try:
            _, run, _ = l14.judge_answer(fn(model, digits[example_rows]))
            l14.judge_unchanged(model, before)
            by_size[len(example_rows)] = l14.run_stacked(run, digits, l14._folded_weights(model), n_convs)[0]
        except AssertionError as exc:
            by_size[len(example_rows)] = str(exc)
    reasons = {}
    for seed, (example_rows, probe_rows) in draws.items():
        out = by_size[len(example_rows)]
        if isinstance(out, str):
            reasons[seed] = out
            continue
        try:
            l14.judge_stack_outputs(out[probe_rows], ref[probe_rows])
            reasons[seed] = "accepted"
        except AssertionError as exc:
            reasons[seed] = str(exc)
    return reasons


@pytest.mark.parametrize("name", sorted(WRONG_STACKS))
def test_wrong_stacks_are_rejected_on_200_seeds(name):
    fn, message = WRONG_STACKS[name]
    bad = {seed: reason for seed, reason in judged_on_200_seeds(fn).items() if message not in reason}
    assert not bad, bad


def folded_without_identity(model, example):
    """Right too: each BatchNorm folded and removed from the Sequential (no nn.Identity left), autocast's default
    CPU dtype (bfloat16) not spelled out."""
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as p:
        model(example)
    m = copy.deepcopy(model).eval()
    layers, kept = list(m.features), []
    for layer in layers:
        if isinstance(layer, torch.nn.BatchNorm2d):
            kept[-1] = fuse_conv_bn_eval(kept[-1], layer)
        else:
            kept.append(layer)
    m.features = torch.nn.Sequential(*kept)
    m = m.to(memory_format=torch.channels_last)

    def run(x):
        with torch.inference_mode(), torch.autocast("cpu"):
            return m(x.contiguous(memory_format=torch.channels_last)).float()

    return p, run


def test_right_stacks_are_accepted_on_200_seeds():
    for fn in (l14.stacked, _variant(), folded_without_identity):
        bad = {seed: reason for seed, reason in judged_on_200_seeds(fn).items() if reason != "accepted"}
        assert not bad, bad


@pytest.mark.parametrize(
    ("fn", "message"),
    [(_variant(prof=False), "profile first"), (lambda model, example: (None, None), "profile first")],
    ids=["no-profile", "no-model"],
)
def test_wrong_stacks_without_a_profile_are_rejected_on_200_seeds(fn, message):
    # caught before anything runs (about 17 ms a call); the other mistakes and the reference cost 20-200 ms a call
    for seed in range(200):
        got = exercises.verdict("14.stack", fn, seed=seed)
        assert message in got, (seed, got)


def test_the_seed_is_printed_on_failure():
    assert "random case seed" in verdict(_variant(fold=False))


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda rows, budget: "onnxruntime", "got 'onnxruntime'"),  # the old fixed case's answer
        (lambda rows, budget: max(rows, key=lambda r: r["speedup"])["technique"] if rows else "baseline", "within"),
        (
            lambda rows, budget: next((r["technique"] for r in rows if r["accuracy_drop"] <= budget), "baseline"),
            "got",
        ),  # the first acceptable row, not the fastest
        (
            lambda rows, budget: max(
                (r for r in rows if r["accuracy_drop"] <= budget),
                key=lambda r: r["speedup"],
                default={"technique": "baseline"},
            )["technique"],
            "got",
        ),  # slower than baseline kept
        (
            lambda rows, budget: min(
                (r for r in rows if r["speedup"] > 1 and r["accuracy_drop"] <= budget),
                key=lambda r: r["accuracy_drop"],
                default={"technique": "baseline"},
            )["technique"],
            "got",
        ),  # the most accurate, not the fastest
    ],
    ids=["hard-coded", "ignores-budget", "first-not-fastest", "keeps-slowdowns", "most-accurate"],
)
def test_wrong_picks_are_rejected(fn, message):
    for seed in range(200):
        got = exercises.verdict("14.pick", fn, seed=seed)
        assert message in got and f"seed {seed}" in got, (seed, got)


def _pick(keep):
    def fn(rows, budget):
        ok = [r for r in rows if keep(r, budget)]
        return max(ok, key=lambda r: r["speedup"])["technique"] if ok else "baseline"

    return fn


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (_pick(lambda r, b: r["speedup"] > 1.0 and r["accuracy_drop"] < b), "exactly the budget"),
        (_pick(lambda r, b: r["speedup"] >= 1.0 and r["accuracy_drop"] <= b), "exactly 1.0"),
        (_pick(lambda r, b: r["speedup"] > 1.0 and abs(r["accuracy_drop"]) <= b), "not abs(accuracy_drop)"),
        (
            lambda rows, budget: max(
                (r for r in rows if r["speedup"] > 1 and r["accuracy_drop"] <= budget),
                key=lambda r: r["speedup"] - r["accuracy_drop"],
                default={"technique": "baseline"},
            )["technique"],
            "rank by speedup alone",
        ),
    ],
    ids=["strict-budget", "speedup-at-least-one", "abs-drop", "speedup-minus-drop"],
)
def test_boundary_picks_are_rejected_on_every_seed(fn, message):
    for seed in range(200):
        got = exercises.verdict("14.pick", fn, seed=seed)
        assert message in got and f"seed {seed}" in got, (seed, got)


def test_pick_reference_and_alternatives_pass_on_every_seed():
    import numpy as np

    def sorted_pick(rows, budget):
        ok = sorted((r for r in rows if r["speedup"] > 1 and r["accuracy_drop"] <= budget), key=lambda r: -r["speedup"])
        return ok[0]["technique"] if ok else "baseline"

    def numpy_pick(rows, budget):
        if not rows:
            return "baseline"
        s = np.array([r["speedup"] for r in rows])
        d = np.array([r["accuracy_drop"] for r in rows])
        ok = np.where((s > 1) & (d <= budget), s, -np.inf)
        return rows[int(ok.argmax())]["technique"] if np.isfinite(ok.max()) else "baseline"

    for fn in (l14.pick_technique, sorted_pick, numpy_pick):
        bad = {s: v for s in range(200) if (v := exercises.verdict("14.pick", fn, seed=s)) != "accepted"}
        assert not bad, (fn.__name__, bad)
