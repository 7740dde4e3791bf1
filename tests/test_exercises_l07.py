"""Lesson 07's exercise checkers reject wrong answers, each with its reason (the references pass): 07.session and
07.fusion on 200 seeds each, 07.static-int8's drawn calibration on 200 and its full path on fewer."""

from __future__ import annotations

import collections
import gc
import re
import shutil
import tempfile
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from course_checks import exercises
from course_checks.exercises import verdict
from course_checks.lesson_exercises import l07
from course_checks.lesson_exercises.observe import Cases

SWEEP = range(200)


@pytest.fixture(autouse=True, scope="module")
def _small_gc_census():
    """Everything alive before this module's tests is frozen out of the garbage collector's generations: the
    ~250k objects of pytest, torch and ORT are not traversed again at each collection, which the many small
    objects a checker call makes (ORT sessions, ONNX protos) would otherwise trigger. The checks are the same."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


@pytest.mark.parametrize("key", ["07.session", "07.fusion", "07.static-int8"])
def test_reference_passes(key):
    assert verdict(key, exercises.get(key).solution) == "accepted"


# ------------------------------------------------------------------ 07.session


def _options(level="all", threads=1, spinning="0"):
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    so.intra_op_num_threads = threads
    if spinning is not None:
        so.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    return so


def level_ignored(p, level, t):
    return ort.InferenceSession(p, _options("all", t), providers=["CPUExecutionProvider"])


def changed_after_creation(p, level, t):
    sess = ort.InferenceSession(p, ort.SessionOptions(), providers=["CPUExecutionProvider"])
    so = sess.get_session_options()  # the session's copy: changing it now changes nothing that runs
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    so.intra_op_num_threads = t
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return sess


def own_options_changed_after(p, level, t):
    so = ort.SessionOptions()
    sess = ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    so.intra_op_num_threads = t
    return sess


def threads_ignored(p, level, t):
    return ort.InferenceSession(p, _options(level, 1 if t != 1 else 2), providers=["CPUExecutionProvider"])


def spinning_left_on(p, level, t):
    return ort.InferenceSession(p, _options(level, t, spinning=None), providers=["CPUExecutionProvider"])


def no_options(p, level, t):
    return ort.InferenceSession(p, providers=["CPUExecutionProvider"])


def another_model(p, level, t):
    other = Path(tempfile.mkdtemp()) / "other.onnx"
    l07.random_cnn_onnx(other, Cases(12345))
    return ort.InferenceSession(str(other), _options(level, t), providers=["CPUExecutionProvider"])


def not_a_session(p, level, t):
    return _options(level, t)


_CACHED = {}


def made_before(p, level, t):
    return _CACHED.setdefault("s", ort.InferenceSession(p, _options(level, t), providers=["CPUExecutionProvider"]))


def cuda_listed_first(p, level, t):
    """CUDA first "to use the GPU when there is one": on a machine with CUDA the session would not run on the CPU."""
    return ort.InferenceSession(p, _options(level, t), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])


def all_available_providers(p, level, t):
    """providers=get_available_providers(): what the package was built with, CUDA first in ORT's GPU build."""
    return ort.InferenceSession(p, _options(level, t), providers=ort.get_available_providers())


def inter_op_settings_too(p, level, t):  # right too: inter-op threads and spinning set as well
    so = _options(level, t)
    so.inter_op_num_threads = t
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])


SESSION_WRONG = [
    (level_ignored, "was created at"),
    (changed_after_creation, "was created (at|with)"),  # the default level is "all": then threads tell
    (own_options_changed_after, "was created (at|with)"),
    (threads_ignored, "intra_op_num_threads"),
    (spinning_left_on, "spinning"),
    (no_options, "created without SessionOptions"),
    (another_model, "differ from the model's"),
    (not_a_session, "InferenceSession"),
    (cuda_listed_first, "created with providers=\\['CUDAExecutionProvider'"),
    (all_available_providers, "not onnxruntime.get_available_providers\\(\\)"),
]


FULL_SEEDS = (1, 2, 3)  # the checker itself, drawing included; the sweeps below share each seed's drawn case


@pytest.mark.parametrize("fn, reason", SESSION_WRONG, ids=[f.__name__ for f, _ in SESSION_WRONG])
def test_session_rejects(fn, reason):
    for seed in FULL_SEEDS:
        msg = verdict("07.session", fn, seed=seed)
        assert re.search(reason, msg) and f"seed {seed}" in msg, (seed, msg)
    msg = verdict("07.session", fn)
    assert re.search(reason, msg), msg


def _first_rejection(judge, calls):
    """The message of the first call ``judge`` rejects, or "accepted" (as the checker runs the calls in turn)."""
    try:
        for call in calls:
            judge(*call)
    except AssertionError as exc:
        return str(exc)
    return "accepted"


def test_session_judged_on_200_seeds():
    """Each seed's case drawn once (draw_session_case: the CNN, the input, the four levels in their order and
    thread counts), then every submission called and judged as the checker does (judge_session_call, call by
    call): the reference accepted, each wrong one rejected with its reason, on all 200 seeds."""
    _CACHED.clear()
    first = Path(tempfile.mkdtemp()) / "m.onnx"
    l07.random_cnn_onnx(first, Cases(7))
    made_before(str(first), "all", 1)
    wrong = [*SESSION_WRONG, (made_before, "created \\(not one made before")]
    for seed in SWEEP:
        with tempfile.TemporaryDirectory() as tmp:
            path, x, ref, calls = l07.draw_session_case(Cases(seed), Path(tmp))
            right = [(exercises.get("07.session").solution, "^accepted$"), (inter_op_settings_too, "^accepted$")]
            for fn, reason in [*right, *wrong]:
                msg = _first_rejection(partial(l07.judge_session_call, fn, path, x, ref), calls)
                assert re.search(reason, msg), (seed, fn.__name__, msg)


def test_session_rejects_a_session_made_before_the_call():
    _CACHED.clear()
    first = Path(tempfile.mkdtemp()) / "m.onnx"
    l07.random_cnn_onnx(first, Cases(7))
    made_before(str(first), "all", 1)
    for seed in FULL_SEEDS:
        msg = verdict("07.session", made_before, seed=seed)
        assert "created (not one made before" in msg, (seed, msg)


# ------------------------------------------------------------------ 07.fusion


def _ops(path):
    import onnx

    return collections.Counter(n.op_type for n in onnx.load(path).graph.node)


def counted_input(p, level):
    return _ops(p)


def always_extended(p, level):
    return exercises.get("07.fusion").solution(p, "extended")


def level_all_instead(p, level):
    return exercises.get("07.fusion").solution(p, "all")


def hard_coded(p, level):
    return collections.Counter({"FusedConv": 3, "Flatten": 1, "Gemm": 1})


def as_list(p, level):
    return list(exercises.get("07.fusion").solution(p, level).elements())


def _domain_keyed(p, level, default=""):
    """fused_ops counting f"{node.domain}:{node.op_type}" (ORT's fused nodes are in com.microsoft); ``default``:
    how the default ONNX domain is spelled."""
    import onnx

    out = Path(tempfile.mkdtemp(prefix="fused_")) / "optimized.onnx"
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, l07._LEVEL_NAMES[level])
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
    return collections.Counter(f"{n.domain or default}:{n.op_type}" for n in onnx.load(str(out)).graph.node)


def domain_keyed(p, level):  # right too: the keys "domain:op_type"
    return _domain_keyed(p, level)


def domain_keyed_ai_onnx(p, level):  # right too: the default domain written "ai.onnx"
    return _domain_keyed(p, level, "ai.onnx")


def domain_keyed_wrong_domain(p, level):  # every node put in the default domain: FusedConv is com.microsoft's
    return collections.Counter(f":{k.split(':')[1]}" for k in _domain_keyed(p, level).elements())


def domain_keyed_input(p, level):  # the given file's nodes, by domain
    import onnx

    return collections.Counter(f"{n.domain}:{n.op_type}" for n in onnx.load(p).graph.node)


def _at(levels):
    """fused_ops with its own map from level names to ORT's levels."""
    import onnx

    def fused(p, level):
        out = Path(tempfile.mkdtemp(prefix="fused_")) / "optimized.onnx"
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, levels[level])
        so.optimized_model_filepath = str(out)
        ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
        return collections.Counter(n.op_type for n in onnx.load(str(out)).graph.node)

    return fused


basic_as_disable = _at({"basic": "ORT_DISABLE_ALL", "extended": "ORT_ENABLE_EXTENDED"})  # 'basic' read as "none"
basic_as_extended = _at({"basic": "ORT_ENABLE_EXTENDED", "extended": "ORT_ENABLE_EXTENDED"})
basic_as_disable.__name__, basic_as_extended.__name__ = "basic_as_disable", "basic_as_extended"

FUSION_WRONG = [
    (counted_input, "you report the unoptimized graph's counts"),
    (basic_as_disable, "you report the unoptimized graph's counts"),
    (basic_as_extended, "you report the graph ORT optimizes at level 'extended'"),
    (always_extended, "you report"),
    (level_all_instead, "you report"),
    (hard_coded, "you report"),
    (as_list, "return a Counter"),
    (domain_keyed_input, "you report the unoptimized graph's counts"),
    (domain_keyed_wrong_domain, "by domain and op_type, ORT's optimized graph at that level holds"),
]
FUSION_RIGHT = [domain_keyed, domain_keyed_ai_onnx]


@pytest.mark.parametrize("fn, reason", FUSION_WRONG, ids=[f.__name__ for f, _ in FUSION_WRONG])
def test_fusion_rejects(fn, reason):
    for seed in FULL_SEEDS:
        msg = verdict("07.fusion", fn, seed=seed)
        assert reason in msg and f"seed {seed}" in msg, (seed, msg)


def test_fusion_accepts_counts_keyed_by_domain_and_op_type():
    for fn in FUSION_RIGHT:
        for seed in FULL_SEEDS:
            assert verdict("07.fusion", fn, seed=seed) == "accepted", (fn.__name__, seed)


def _judge_fusion(fn, path, original, others, level, want):
    l07.judge_fusion(fn(str(path), level), want, original, level, others)


def test_fusion_judged_on_200_seeds():
    """Each seed's case drawn once (draw_fusion_case: the CNN, its op counts, the two levels in their order with
    ORT's optimized op counts at each), then every submission called and judged as the checker does
    (judge_fusion, level by level): the reference accepted, each wrong one rejected with its reason, on all 200
    seeds (`basic` only removes the drawn graph's Identity node, so the level order decides which call shows a
    mistake)."""
    for seed in SWEEP:
        with tempfile.TemporaryDirectory() as tmp:
            path, original, levels = l07.draw_fusion_case(Cases(seed), Path(tmp))
            right = [(fn, "accepted") for fn in (exercises.get("07.fusion").solution, *FUSION_RIGHT)]
            for fn, reason in [*right, *FUSION_WRONG]:
                msg = _first_rejection(partial(_judge_fusion, fn, path, original, dict(levels)), levels)
                assert reason in msg, (seed, fn.__name__, msg)


# ------------------------------------------------------------------ 07.static-int8


def _static(src, dst, batches, exclude=None, fmt=None, per_channel=True):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(batches)

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {"input": x}

    quantize_static(
        src, dst, Reader(), quant_format=fmt or QuantFormat.QDQ, per_channel=per_channel,
        nodes_to_exclude=exclude or []
    )  # fmt: skip


def dynamic_instead(src, dst, calib, keep):
    from onnxruntime.quantization import quantize_dynamic

    quantize_dynamic(src, dst, nodes_to_exclude=[keep])


def keep_ignored(src, dst, calib, keep):
    _static(src, dst, calib)


def own_choice(src, dst, calib, keep):
    """Keeps the last conv FP32 whatever keep_fp32 says (a node chosen by reading the graph, not the argument)."""
    import onnx

    last = [n.name for n in onnx.load(src).graph.node if n.op_type == "Conv"][-1]
    _static(src, dst, calib, [last])


def random_calibration(src, dst, calib, keep):
    _static(src, dst, [np.random.default_rng(0).standard_normal(x.shape).astype(np.float32) for x in calib], [keep])


def first_batch_only(src, dst, calib, keep):
    _static(src, dst, calib[:1], [keep, _feeding(src, keep)])


def widest_only(src, dst, calib, keep):
    _static(src, dst, [max(calib, key=lambda x: float(x.max() - x.min()))], [keep, _feeding(src, keep)])


def two_of_three(src, dst, calib, keep):
    _static(src, dst, calib[:2], [keep, _feeding(src, keep)])


def _feeding(src, keep):
    import onnx

    nodes = onnx.load(src).graph.node
    producer = {o: n.name for n in nodes for o in n.output}
    return next(producer[n.input[0]] for n in nodes if n.name == keep)


def only_the_conv_excluded(src, dst, calib, keep):  # the conv excluded, its input still Q/DQ: ORT fuses it to INT8
    _static(src, dst, calib, [keep])


def one_batch_of_all(src, dst, calib, keep):  # right too: every calibration image in one batch
    _static(src, dst, [np.concatenate(calib)], [keep, _feeding(src, keep)])


def qoperator_format(src, dst, calib, keep):
    """QuantFormat.QOperator: QLinearConv nodes in the file instead of Q/DQ pairs around Conv."""
    from onnxruntime.quantization import QuantFormat

    _static(src, dst, calib, [keep, _feeding(src, keep)], fmt=QuantFormat.QOperator)


def signed_activations(src, dst, calib, keep):  # right too: INT8 (signed) activations, not asked otherwise
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calib)

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {"input": x}

    quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, nodes_to_exclude=[keep, _feeding(src, keep)])  # fmt: skip


def per_tensor_weights(src, dst, calib, keep):  # per_channel left at its default, False: one scale per weight
    _static(src, dst, calib, exclude=[keep, _feeding(src, keep)], per_channel=False)


def fp32_copied(src, dst, calib, keep):
    shutil.copy(src, dst)


def nothing_written(src, dst, calib, keep):
    _static(src, str(Path(tempfile.mkdtemp()) / "elsewhere.onnx"), calib, [keep])


STATIC_WRONG = [
    (dynamic_instead, "QuantizeLinear/DequantizeLinear"),
    (keep_ignored, "nodes_to_exclude"),
    (own_choice, "nodes_to_exclude"),
    (random_calibration, "the reader fed other data"),
    (first_batch_only, "the reader fed other data"),
    (widest_only, "the reader fed other data"),
    (two_of_three, "the reader fed other data"),
    (only_the_conv_excluded, "ran in INT8 although excluded"),
    (fp32_copied, "QuantizeLinear/DequantizeLinear"),
    (nothing_written, "nothing was written"),
    (qoperator_format, "that is the QOperator format"),
    (per_tensor_weights, "the weights were quantized per tensor"),
]


# judged on the file's structure, the profile or what was written: the full path on STATIC_SEEDS (~30 ms a call)
STATIC_STRUCTURE = [dynamic_instead, keep_ignored, own_choice, only_the_conv_excluded, fp32_copied, nothing_written,
                    qoperator_format, per_tensor_weights]  # fmt: skip
STATIC_SEEDS = range(30)
# judged on the activation scales: the drawn batches and the judge on 200 seeds (below), the full path on 3
STATIC_FEEDS = {
    random_calibration: lambda calib: [np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
                                       for x in calib],
    first_batch_only: lambda calib: calib[:1],
    widest_only: lambda calib: [max(calib, key=lambda x: float(x.max() - x.min()))],
    two_of_three: lambda calib: calib[:2],
}  # fmt: skip


def test_static_int8_sweeps_cover_every_wrong_answer():
    assert {f for f, _ in STATIC_WRONG} == {*STATIC_STRUCTURE, *STATIC_FEEDS}


@pytest.mark.parametrize("fn, reason", STATIC_WRONG, ids=[f.__name__ for f, _ in STATIC_WRONG])
def test_static_int8_rejects(fn, reason):
    """The full path: quantize_static, the file read back, ORT's profile. A structural mistake on STATIC_SEEDS (30:
    each call quantizes twice, ~30 ms); a calibration mistake on 3 seeds, its scales on 200 below."""
    for seed in STATIC_SEEDS if fn in STATIC_STRUCTURE else (1, 2, 3):
        msg = verdict("07.static-int8", fn, seed=seed)
        assert reason in msg and f"seed {seed}" in msg, (seed, msg)


def test_static_int8_reference_and_one_concatenated_batch_pass():
    solution = exercises.get("07.static-int8").solution
    bad = {s: v for s in STATIC_SEEDS if (v := verdict("07.static-int8", solution, seed=s)) != "accepted"}
    assert not bad, bad
    for seed in (3, 4, 5):
        assert verdict("07.static-int8", one_batch_of_all, seed=seed) == "accepted"
        assert verdict("07.static-int8", signed_activations, seed=seed) == "accepted"


def _simulated_scales(path, batches):
    """The MinMax scales quantize_static writes for the input and each ReLU's output, from the FP32 CNN in torch
    (test_static_simulated_scales_are_the_files checks them against a quantized file)."""
    scales = [s / 255 for s in _minmax_scales(_activations(path, batches))]
    return {"input": scales[0], **{f"r{i}": v for i, v in enumerate(scales[1:])}}


def test_static_calibration_batches_hold_separate_extremes_on_200_seeds():
    """The drawing core: each batch holds an extreme no other holds (the input's lowest values, its highest, the
    strongest first-layer response, by a clear margin), so MinMax calibration on any one or two batches changes a
    scale by more than the 2% the judge allows; each wrong feed's scales are rejected by judge_scales on every
    seed, the batches in another order or concatenated accepted; the judge itself, on its boundary."""
    import tempfile
    from pathlib import Path

    from course_checks.lesson_exercises import l07, l07_int8
    from course_checks.lesson_exercises.observe import Cases

    with tempfile.TemporaryDirectory() as tmp:
        for seed in SWEEP:
            c = Cases(seed)
            path, _ = l07.random_cnn_onnx(Path(tmp) / "m.onnx", c, blocks=3)
            calib = l07_int8.draw_calibration(c, path)
            assert len({x.shape[0] for x in calib}) == 3
            full = _minmax_scales(_activations(path, calib))
            for i in range(3):  # leaving batch i out changes some MinMax scale by more than 3% (the judge allows 2%)
                part = _minmax_scales(_activations(path, calib[:i] + calib[i + 1 :]))
                assert max(1 - p / f for p, f in zip(part, full, strict=True)) > 0.03, (seed, i)
            expected = _simulated_scales(path, calib)
            for fn, feed in STATIC_FEEDS.items():
                with pytest.raises(AssertionError, match=dict(STATIC_WRONG)[fn]):
                    l07_int8.judge_scales(_simulated_scales(path, feed(calib)), expected)
            for right in (calib[::-1], [np.concatenate(calib)]):
                l07_int8.judge_scales(_simulated_scales(path, right), expected)
    l07_int8.judge_scales({"input": 1.0, "r0": 0.5}, {"input": 1.0, "r0": 0.5})
    with pytest.raises(AssertionError, match="the reader fed other data"):
        l07_int8.judge_scales({"input": 1.0, "r0": 0.5 * 1.021}, {"input": 1.0, "r0": 0.5})


def test_static_simulated_scales_are_the_files():
    """The full path of the scale judgment: the scales quantize_static writes for the input and the ReLU outputs
    are the simulated ones, for a wrong feed and the right one (one seed)."""
    import tempfile
    from pathlib import Path

    from course_checks.lesson_exercises import l07, l07_int8
    from course_checks.lesson_exercises.observe import Cases

    with tempfile.TemporaryDirectory() as tmp:
        c = Cases(3)
        path, convs = l07.random_cnn_onnx(Path(tmp) / "m.onnx", c, blocks=3)
        calib = l07_int8.draw_calibration(c, path)
        for feed in (calib[:2], calib):
            out = Path(tmp) / "q.onnx"
            _static(str(path), str(out), feed, [convs[1], _feeding(str(path), convs[1])])
            got, want = l07_int8._qdq_info(out)["scales"], _simulated_scales(path, feed)
            shared = set(got) & set(want)
            assert {"input", "r1", "r2"} <= shared, (got, want)
            assert all(abs(got[n] / want[n] - 1) < 1e-4 for n in shared), (got, want)


def _minmax_scales(layers):
    """MinMax scales (up to the 1/255) over these batches: the input's range including 0, each ReLU's maximum."""
    top = [max(v) for v in zip(*layers, strict=True)]
    return [max(top[0], 0) + max(top[1], 0), *top[2:]]


def _activations(path, calib):
    """Per batch: -min and max of the input, and the max of each ReLU's output (the FP32 CNN in torch)."""
    import onnx
    import torch
    from onnx import numpy_helper

    g = onnx.load(str(path)).graph
    inits = {i.name: torch.from_numpy(numpy_helper.to_array(i)) for i in g.initializer}
    convs = [n for n in g.node if n.op_type == "Conv"]
    out = []
    for x in calib:
        h = torch.from_numpy(x)
        row = [float(-h.min()), float(h.max())]
        for n in convs:
            h = torch.relu(torch.nn.functional.conv2d(h, inits[n.input[1]], inits[n.input[2]], padding=1))
            row.append(float(h.max()))
        out.append(row)
    return out
