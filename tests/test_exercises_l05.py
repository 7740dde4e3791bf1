"""Lesson 05's exercise checkers reject answers that skip the technique (each with its reason); references pass."""

from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch
from torch import nn

from course_checks import exercises
from course_checks.exercises import verdict


@pytest.mark.parametrize("key", ["05.torchao-mlp", "05.pt2e"])
def test_reference_passes(key):
    assert verdict(key, exercises.get(key).solution) == "accepted"


def test_torchao_mlp_reference_passes_on_200_seeds():
    bad = {
        s: v
        for s in range(200)
        if (v := verdict("05.torchao-mlp", exercises.get("05.torchao-mlp").solution, seed=s)) != "accepted"
    }
    assert not bad, bad


def test_pt2e_alternatives_pass():
    for seed in (4, 5):
        assert verdict("05.pt2e", concatenated, seed=seed) == "accepted"
        assert verdict("05.pt2e", reversed_order, seed=seed) == "accepted"


def test_pt2e_calibration_batches_hold_separate_extremes_on_200_seeds():
    """The drawing core: one batch holds the lowest input values, another the highest, so any single batch (the
    widest one too) misses 15% or more of the input's range; the third holds the strongest first-layer
    response. The judge rejects a scale 2% off and accepts an equal one."""
    from course_checks.lesson_exercises import l05
    from course_checks.lesson_exercises.observe import Cases

    for seed in range(200):
        c = Cases(seed)
        model = l05._random_cnn(c)
        calib = l05.draw_calibration(c, model)
        lo, hi = min(float(x.min()) for x in calib), max(float(x.max()) for x in calib)
        assert len({x.shape[0] for x in calib}) == 3
        for x in calib:
            assert float(x.max()) - float(x.min()) <= 0.85 * (hi - lo), seed
        expected = {"input": 0.5, "3": 0.1}
        l05.judge_scales(dict(expected), expected)
        with pytest.raises(AssertionError, match="observers saw other data"):
            l05.judge_scales({"input": 0.5, "3": 0.1 * 1.021}, expected)


# ------------------------------------------------------------------ 05.torchao-mlp


def _q(model, keep, config=None, everything=False):
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(
        model,
        config or Int8WeightOnlyConfig(),
        filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and (everything or fqn not in keep),
    )
    return model


def unquantized_copy(m, keep):
    return copy.deepcopy(m)


def legacy_quantize_dynamic(m, keep):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(m), {nn.Linear}, dtype=torch.qint8)


def keep_ignored(m, keep):
    return _q(copy.deepcopy(m), keep, everything=True)


def in_place(m, keep):
    return _q(m, keep)


def half_instead(m, keep):
    return copy.deepcopy(m).half()


def decoy(m, keep):
    """A correctly quantized copy whose forward runs an FP32 copy hidden in a closure."""
    q = _q(copy.deepcopy(m), keep)
    hidden = copy.deepcopy(m)
    q.forward = lambda x: hidden(x)
    return q


def hard_coded_names(m, keep):
    return _q(copy.deepcopy(m), {"0"})  # the names of one model, not the ones asked for


def first_name_only(m, keep):
    """Keeps only one of the names asked for (the first, sorted) FP32."""
    return _q(copy.deepcopy(m), {sorted(keep)[0]})


def substring_match(m, keep):  # names matched by substring: keeping '0' keeps '2.0' too
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    q = copy.deepcopy(m)
    quantize_(q, Int8WeightOnlyConfig(), filter_fn=lambda mod, fqn: isinstance(mod, nn.Linear)
              and not any(k in fqn for k in keep))  # fmt: skip
    return q


def last_component(m, keep):  # the module's own name, fqn.split('.')[-1], not its path: '2.0' taken for '0'
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    q = copy.deepcopy(m)
    quantize_(q, Int8WeightOnlyConfig(), filter_fn=lambda mod, fqn: isinstance(mod, nn.Linear)
              and fqn.split(".")[-1] not in keep)  # fmt: skip
    return q


def dynamic_activation_config(m, keep):  # right too: INT8 weights and dynamically quantized INT8 activations
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    return _q(copy.deepcopy(m), keep, config=Int8DynamicActivationInt8WeightConfig())


def layer_by_layer(m, keep):  # right too: quantize_ called on each Linear to quantize
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    q = copy.deepcopy(m)
    for name, mod in q.named_modules():
        if isinstance(mod, nn.Linear) and name not in keep:
            quantize_(mod, Int8WeightOnlyConfig())
    return q


TORCHAO_WRONG = [
    (unquantized_copy, "not torchao INT8"),
    (legacy_quantize_dynamic, "quantize_dynamic"),
    (keep_ignored, "must stay FP32"),
    (in_place, "changed: quantize a copy"),
    (half_instead, "must stay FP32"),
    (decoy, "no INT8 weight of|was never used while the model ran"),  # which layer is checked first varies
    (first_name_only, r"must stay FP32 \(keep_fp32=\['[\d.]+', '[\d.]+'\]\)"),  # the call asking for two names fails
    (substring_match, r"'2\.0' stayed FP32, but keep_fp32 is \['0'\]: your filter matched '0' as a part of"),
    (last_component, r"matched '0' as a part of|fqn is the full path, '2\.[02]', not its last part"),
]


@pytest.mark.parametrize("fn", [dynamic_activation_config, layer_by_layer])
def test_torchao_mlp_alternatives_pass(fn):
    bad = {s: v for s in range(20) if (v := verdict("05.torchao-mlp", fn, seed=s)) != "accepted"}
    assert not bad, bad


@pytest.mark.parametrize("fn, reason", TORCHAO_WRONG, ids=[f.__name__ for f, _ in TORCHAO_WRONG])
def test_torchao_mlp_rejects(fn, reason):
    for seed in range(200):
        msg = verdict("05.torchao-mlp", fn, seed=seed)
        assert re.search(reason, msg), (seed, msg)
    msg = verdict("05.torchao-mlp", fn)
    assert re.search(reason, msg), msg
    assert "random case seed" in msg


def test_torchao_mlp_rejects_hard_coded_layer_names():
    # each call asks for two different layers to keep (drawn at random): a fixed name fails one of them
    for seed in range(200):
        msg = verdict("05.torchao-mlp", hard_coded_names, seed=seed)
        assert "must stay FP32" in msg, (seed, msg)


# ------------------------------------------------------------------ 05.pt2e


def _pt2e(model, example, calib, keep, *, convert=True, keep_layer=True, global_config=True):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    batch = torch.export.Dim("batch", min=1, max=1024)
    exported = torch.export.export(model, example, dynamic_shapes=({0: batch},))
    quantizer = X86InductorQuantizer()
    if global_config:
        quantizer.set_global(get_default_x86_inductor_quantization_config())
    if keep_layer:
        quantizer.set_module_name_qconfig(keep, None)
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        for x in calib:
            prepared(x)
    return convert_pt2e(prepared) if convert else prepared


def eager_returned(model, example, calib, keep):
    return model


def exported_only(model, example, calib, keep):
    return torch.export.export(model, example).module()


def not_converted(model, example, calib, keep):
    return _pt2e(model, example, calib, keep, convert=False)


def keep_ignored_pt2e(model, example, calib, keep):
    return _pt2e(model, example, calib, keep, keep_layer=False)


def own_choice_pt2e(model, example, calib, keep):
    """Keeps the last conv FP32 whatever keep_fp32 says (a layer chosen by reading the lesson, not the argument)."""
    last = [n for n, m in model.named_children() if isinstance(m, nn.Conv2d)][-1]
    return _pt2e(model, example, calib, last)


def throwaway_calibration(model, example, calib, keep):
    return _pt2e(model, example, [torch.randn_like(x) for x in calib], keep)


def first_batch_only(model, example, calib, keep):
    return _pt2e(model, example, calib[:1], keep)


def linspace_calibration(model, example, calib, keep):
    """Each batch replaced by an evenly spaced ramp over its own range (same shape, same min and max)."""
    ramps = [torch.linspace(float(x.min()), float(x.max()), x.numel()).reshape(x.shape) for x in calib]
    for x in calib:  # the real batches run too, outside the prepared model (so each shape is seen)
        model(x)
    return _pt2e(model, example, ramps, keep)


def widest_only(model, example, calib, keep):
    widest = max(calib, key=lambda x: float(x.max() - x.min()))
    for x in calib:
        model(x)
    return _pt2e(model, example, [widest], keep)


def one_batch(model, example, calib, keep):
    for x in calib:
        model(x)
    return _pt2e(model, example, calib[1:2], keep)


def concatenated(model, example, calib, keep):  # right too: one batch of every calibration image
    return _pt2e(model, example, [torch.cat(calib)], keep)


def reversed_order(model, example, calib, keep):  # right too
    return _pt2e(model, example, calib[::-1], keep)


def no_calibration(model, example, calib, keep):
    return _pt2e(model, example, [], keep)


def _pt2e_export(model, example, calib, keep, dynamic_shapes, config=None):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    exported = torch.export.export(model, example, dynamic_shapes=dynamic_shapes)
    quantizer = X86InductorQuantizer().set_global(config or get_default_x86_inductor_quantization_config())
    quantizer.set_module_name_qconfig(keep, None)
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        for x in calib:
            prepared(x)
    return convert_pt2e(prepared)


def static_batch_export(model, example, calib, keep):
    """Exported without dynamic_shapes: the graph only takes the example's batch of 2."""
    return _pt2e_export(model, example, calib, keep, None)


def bounded_batch(model, example, calib, keep):
    """A dynamic batch bounded at 8: calibration batches of 9 or more, or any larger batch later, do not fit."""
    return _pt2e_export(model, example, calib, keep, ({0: torch.export.Dim("batch", max=8)},))


def qat_config(model, example, calib, keep):
    """The QAT config (fake quantizers with moving-average observers) used for post-training quantization."""
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import get_default_x86_inductor_quantization_config

    batch = ({0: torch.export.Dim("batch", min=1, max=1024)},)
    return _pt2e_export(model, example, calib, keep, batch, get_default_x86_inductor_quantization_config(is_qat=True))


def dynamic_config(model, example, calib, keep):
    """The dynamic config: activation scales computed at run time, calibration ignored."""
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import get_default_x86_inductor_quantization_config

    batch = ({0: torch.export.Dim("batch", min=1, max=1024)},)
    cfg = get_default_x86_inductor_quantization_config(is_dynamic=True)
    return _pt2e_export(model, example, calib, keep, batch, cfg)


def dynamic_quant_instead(model, example, calib, keep):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


PT2E_WRONG = [
    (eager_returned, "not the converted graph"),
    (exported_only, "no INT8 quantize/dequantize ops"),
    (not_converted, "call convert_pt2e"),
    (keep_ignored_pt2e, "set_module_name_qconfig"),
    (own_choice_pt2e, "set_module_name_qconfig"),
    (throwaway_calibration, "observers saw other data"),
    (first_batch_only, "never ran through the prepared model"),
    (no_calibration, "never ran through the prepared model"),
    (linspace_calibration, "observers saw other data"),
    (widest_only, "observers saw other data"),
    (one_batch, "observers saw other data"),
    (dynamic_quant_instead, "not the converted graph"),
    (static_batch_export, "did not fit the exported graph"),
    (bounded_batch, "fixed or bounded too tightly"),
    (qat_config, "QAT config"),
    (dynamic_config, "that is dynamic quantization"),
]


PT2E_RIGHT = [exercises.get("05.pt2e").solution, concatenated, reversed_order]


@pytest.mark.parametrize("fn, reason", PT2E_WRONG, ids=[f.__name__ for f, _ in PT2E_WRONG])
def test_pt2e_rejects(fn, reason):
    """The full path (export, prepare, calibration, convert: 0.3-0.6 s a call) on two seeds; the 200-seed tests
    below judge each seed's drawn case with the same judging functions the checker calls."""
    for seed in (11, 12):
        msg = verdict("05.pt2e", fn, seed=seed)
        assert reason in msg and f"seed {seed}" in msg, msg


# what each submission's graph is rejected by: its structure (judge_pt2e_graph), the batches it ran
# (judge_calibration_ran) or the activation scales its observers saw (judge_scales)
PT2E_STRUCTURE = [eager_returned, exported_only, not_converted, keep_ignored_pt2e, own_choice_pt2e,
                  dynamic_quant_instead, dynamic_config]  # fmt: skip
PT2E_BATCH = [static_batch_export, bounded_batch]  # the exported batch dimension (test_pt2e_serving_batch_...)
PT2E_QAT = [qat_config]  # test_pt2e_qat_config_named_on_seeds
PT2E_RAN = {first_batch_only: lambda calib: calib[:1], no_calibration: lambda calib: []}
PT2E_SCALES = {
    throwaway_calibration: lambda calib: [torch.randn_like(x) for x in calib],
    linspace_calibration: lambda calib: [
        torch.linspace(float(x.min()), float(x.max()), x.numel()).reshape(x.shape) for x in calib
    ],
    widest_only: lambda calib: [max(calib, key=lambda x: float(x.max() - x.min()))],
    one_batch: lambda calib: calib[1:2],
}
PT2E_RIGHT_FEEDS = {
    PT2E_RIGHT[0]: lambda calib: calib,
    concatenated: lambda calib: [torch.cat(calib)],
    reversed_order: lambda calib: calib[::-1],
}


def test_pt2e_covers_every_submission_in_the_sweeps():
    assert {f for f, _ in PT2E_WRONG} == {*PT2E_STRUCTURE, *PT2E_RAN, *PT2E_SCALES, *PT2E_BATCH, *PT2E_QAT}
    assert set(PT2E_RIGHT) == set(PT2E_RIGHT_FEEDS)


def _reason(fn):
    return dict(PT2E_WRONG)[fn]


def test_pt2e_graph_structure_judged_on_200_seeds():
    """Each submission's converted graph is built once per conv to keep (its structure is what the seed's weights
    and widths do not change: the conv names are 0, 2, 4 on every seed), then judged by judge_pt2e_graph for the
    keep_fp32 order each of 200 seeds draws: the right graphs pass both calls, each structural mistake is rejected
    with its reason at the call that shows it (keeping the last conv whatever asked fails when '2' is asked)."""
    from course_checks.lesson_exercises import l05
    from course_checks.lesson_exercises.observe import Cases

    model, convs, calib, example, _ = l05.draw_pt2e_case(Cases(0))
    graphs = {
        fn: {keep: fn(copy.deepcopy(model), example, [x.clone() for x in calib], keep) for keep in convs[1:]}
        for fn in [*PT2E_STRUCTURE, *PT2E_RIGHT]
    }
    orders = set()
    for seed in range(200):
        _, convs, _, _, keeps = l05.draw_pt2e_case(Cases(seed))
        orders.add(tuple(keeps))
        for fn in PT2E_RIGHT:
            for keep in keeps:
                l05.judge_pt2e_graph(graphs[fn][keep], convs, keep)
        for fn in PT2E_STRUCTURE:
            with pytest.raises(AssertionError) as info:
                for keep in keeps:
                    l05.judge_pt2e_graph(graphs[fn][keep], convs, keep)
            assert _reason(fn) in str(info.value), (seed, fn.__name__, str(info.value))
    assert orders == {("2", "4"), ("4", "2")}


def test_pt2e_calibration_runs_judged_on_200_seeds():
    """What each submission runs through the prepared model (the conv input shapes the checker's operator log
    records: the batches fed, plus those the wrong ones run through the eager model), judged by
    judge_calibration_ran for each seed's batches: skipping batches is rejected, every batch (in any order, or
    concatenated into one) passes, as do the submissions rejected later by their scales."""
    from course_checks.lesson_exercises import l05
    from course_checks.lesson_exercises.observe import Cases

    eager_too = {linspace_calibration, widest_only, one_batch}  # these also run the real batches, outside
    for seed in range(200):
        _, _, calib, _, _ = l05.draw_pt2e_case(Cases(seed))
        for fn, feed in PT2E_RAN.items():
            with pytest.raises(AssertionError, match=_reason(fn)):
                l05.judge_calibration_ran({tuple(x.shape) for x in feed(calib)}, calib)
        for fn, feed in [*PT2E_RIGHT_FEEDS.items(), *PT2E_SCALES.items()]:
            ran = {tuple(x.shape) for x in feed(calib) + (calib if fn in eager_too else [])}
            l05.judge_calibration_ran(ran, calib)


SCALE_SEEDS = range(24)


def test_pt2e_activation_scales_judged_on_seeds():
    """The activation scales a graph holds are what its observers computed from the batches fed
    (activation_scales runs the same observer class on the same activations: test_pt2e_graph_scales_are_the_
    observers' checks that on the full path). For each seed the scales of each submission's feed are judged by
    judge_scales against the given batches': the wrong feeds rejected, the right ones accepted. Only on
    SCALE_SEEDS (24): the histogram observers' parameter search costs ~40 ms a feed, seven feeds a seed."""
    from course_checks.lesson_exercises import l05
    from course_checks.lesson_exercises.observe import Cases

    torch.manual_seed(0)  # the throwaway batches are torch.randn_like
    for seed in SCALE_SEEDS:
        model, _, calib, _, _ = l05.draw_pt2e_case(Cases(seed))
        expected = l05.activation_scales(model, calib)
        for fn, feed in PT2E_SCALES.items():
            with pytest.raises(AssertionError, match=_reason(fn)):
                l05.judge_scales(l05.activation_scales(model, feed(calib)), expected)
        for feed in PT2E_RIGHT_FEEDS.values():
            l05.judge_scales(l05.activation_scales(model, feed(calib)), expected)


def test_pt2e_graph_scales_are_the_observers():
    """The full path of the scale judgment: a converted graph's activation scales equal what activation_scales
    gives for the batches it was calibrated on (a wrong feed and a right one, one seed)."""
    from course_checks.lesson_exercises import l05
    from course_checks.lesson_exercises.observe import Cases

    model, _, calib, example, keeps = l05.draw_pt2e_case(Cases(3))
    for feed in (PT2E_SCALES[widest_only], PT2E_RIGHT_FEEDS[reversed_order]):
        gm = _pt2e(copy.deepcopy(model), example, feed(calib), keeps[0])
        got, want = l05.graph_scales(gm), l05.activation_scales(model, feed(calib))
        assert "input" in got and set(got) <= set(want), (got, want)  # the kept conv's input is not quantized
        assert all(abs(got[n] / want[n] - 1) < 1e-3 for n in got), (got, want)


def test_pt2e_serving_batch_exceeds_every_calibration_batch_on_200_seeds():
    """The graph is served a batch of every calibration image at once: larger than any calibration batch, so a
    batch dimension bounded just wide enough for calibration (or fixed at the example's) is rejected by name on
    every seed (the full path of static_batch_export and bounded_batch runs in test_pt2e_rejects)."""
    from course_checks.lesson_exercises import l05
    from course_checks.lesson_exercises.observe import Cases

    for seed in range(200):
        _, _, calib, example, _ = l05.draw_pt2e_case(Cases(seed))
        sizes = [x.shape[0] for x in calib]
        assert torch.cat(calib).shape[0] > max(sizes) > example[0].shape[0], (seed, sizes)


def test_pt2e_qat_config_named_on_seeds():
    """A graph calibrated with the QAT config holds the input scale its fake quantizer gives (test_pt2e_rejects
    runs the full path): judged against the given batches' scales, it is named on every seed, and the right
    scales are not taken for it. On 8 seeds: the default observers' parameter search is what costs (see
    SCALE_SEEDS)."""
    from course_checks.lesson_exercises import l05
    from course_checks.lesson_exercises.observe import Cases

    for seed in range(8):
        model, _, calib, _, _ = l05.draw_pt2e_case(Cases(seed))
        expected, qat = l05.activation_scales(model, calib), l05.activation_scales(model, calib, is_qat=True)
        with pytest.raises(AssertionError, match=_reason(qat_config)):
            l05.judge_scales(dict(qat), expected, qat)
        l05.judge_scales(dict(expected), expected, qat)
