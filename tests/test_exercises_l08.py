"""Lesson 08's self-checks accept the reference solutions and right alternatives, and reject wrong answers with
their reason: the builder judged from the config the engine was built with, the runner on the host and on the
stand-in GPU (too-small buffers give an error, not a crash); every wrong answer and every right one on 200 seeds."""

from __future__ import annotations

import gc
import json

import pytest
import torch

from course_checks import exercises
from course_checks.lesson_exercises import l08

DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16}
SWEEP = range(200)


_WARM: list[bool] = []


@pytest.fixture(autouse=True, scope="module")
def _small_gc_census():
    """The fake TensorRT bounds-checks the buffers of each engine run in one pass over the objects the garbage
    collector tracks (``tensorrt_exec._host_rooms``): in a test process that is ~350k objects (pytest, torch, every
    module), 0.1 s an engine run. Frozen objects are left out of that census, so everything alive after one check
    of each kind has run (the modules a check imports; nothing a later check allocates) is frozen: the same full
    checks then run at 3-90 ms a call on 200 seeds. A buffer of a frozen object would be found too small (an
    error, not a pass)."""
    if not _WARM:  # once a process (the random order may set this fixture up again and again)
        exercises.verdict("08.runner", exercises.get("08.runner").solution, seed=0)
        exercises.verdict("08.builder", exercises.get("08.builder").solution, seed=0)
        _WARM.append(True)
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


verdict = exercises.verdict


def _runner(
    *,
    v2=False,
    skip_shape=False,
    stream_handle=None,
    skip_output_address=False,
    first_input_only=False,
    float_outputs=False,
    as_list=False,
    path_arg=False,
    no_wait_before=False,
    no_wait_after=False,
    recompute=False,
    clones=False,
    own_engine=False,
    engine_shapes=False,
    outputs_first=False,
):
    """A run_engine with one planted mistake."""

    def run(trt, engine, context, feeds, stream, producer):
        if own_engine:  # a hard-coded engine: built from a file of one's own, ignoring the one given
            import tempfile
            from pathlib import Path

            path = Path(tempfile.mkdtemp()) / "mine.onnx"
            width = next(iter(feeds.values())).shape[1]
            l08.two_io_onnx(path, 2.0, width)
            engine = l08.engine_of(trt, path, {"a": (1, 4, 8), "b": (1, 4, 8)}, width)
            context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outs = {}

        def allocate_outputs():
            for name in names:
                if name in inputs:
                    continue
                dtype = torch.float32 if float_outputs else DTYPES[engine.get_tensor_dtype(name).name]
                if engine_shapes or outputs_first:  # the engine's (-1, width), or the context's before any input shape
                    shape = tuple((engine if engine_shapes else context).get_tensor_shape(name))
                else:
                    shape = tuple(max(d, 0) for d in context.get_tensor_shape(name))
                device = next(iter(feeds.values())).device
                outs[name] = torch.empty(shape, dtype=dtype, device=device)
                if not skip_output_address:
                    context.set_tensor_address(name, outs[name].data_ptr())

        if outputs_first:
            allocate_outputs()
        for name in inputs[:1] if first_input_only else inputs:
            if not skip_shape:
                context.set_input_shape(name, tuple(feeds[name].shape))
            context.set_tensor_address(name, feeds[name].data_ptr())
        if not outputs_first:
            allocate_outputs()
        handle = stream.cuda_stream if stream_handle is None else stream_handle
        if not no_wait_before:
            stream.wait_stream(producer)
        if v2:
            context.execute_async_v2([t.data_ptr() for t in feeds.values()], handle)
        elif path_arg:
            context.execute_async_v3(str(handle))
        else:
            context.execute_async_v3(handle)
        if not no_wait_after:
            producer.wait_stream(stream)
        if recompute:  # the engine ran, but the answer is computed again in torch
            outs = {"sum": feeds["a"] + feeds["b"], "scaled": (feeds["a"] * feeds["b"]).half()}
        if clones:
            outs = {k: v.clone() for k, v in outs.items()}
        return list(outs.values()) if as_list else outs

    return run


def test_the_reference_runner_passes():
    assert verdict("08.runner", exercises.get("08.runner").solution) == "accepted"
    solution = exercises.get("08.runner").solution
    bad = {s: v for s in SWEEP if (v := verdict("08.runner", solution, seed=s)) != "accepted"}
    assert not bad, bad


RUNNER_WRONG = [
    ({"v2": True}, "does not accept"),
    ({"skip_shape": True}, "set_input_shape"),
    ({"stream_handle": 0}, "execute on the stream you were given"),
    ({"skip_output_address": True}, "needs an address"),
    ({"first_input_only": True}, "set_input_shape"),
    ({"float_outputs": True}, "engine's dtype"),
    ({"as_list": True}, "return {output name: tensor}"),
    ({"path_arg": True}, "does not accept"),
    ({"no_wait_before": True}, "never waited for the stream that wrote the inputs"),
    ({"no_wait_after": True}, "producer stream never waited"),
    ({"recompute": True}, "not the buffer whose address"),
    ({"clones": True}, "not the buffer whose address"),
    ({"own_engine": True}, "the context you were given"),
]


@pytest.mark.parametrize("mistake, reason", RUNNER_WRONG, ids=lambda m: next(iter(m)) if isinstance(m, dict) else "")
def test_the_runner_check_rejects_wrong_loops(mistake, reason):
    for seed in SWEEP:
        msg = verdict("08.runner", _runner(**mistake), seed=seed)
        assert reason in msg and f"seed {seed}" in msg, (seed, msg)
    msg = verdict("08.runner", _runner(**mistake))  # a fresh seed, as a learner's call draws
    assert reason in msg, msg


@pytest.mark.parametrize("mistake", [{"engine_shapes": True}, {"outputs_first": True}], ids=["engine", "first"])
def test_the_runner_check_names_outputs_sized_with_the_dynamic_batch(mistake):
    """Outputs sized with engine.get_tensor_shape, or with the context's before any input shape is set: torch.empty
    refuses the -1 on every draw (the loop crashes before anything random matters), so ten seeds."""
    for seed in range(10):
        msg = verdict("08.runner", _runner(**mistake), seed=seed)
        assert "an output shape still holds -1" in msg and f"seed {seed}" in msg, (seed, msg)


# ------------------------------------------------------------------ 08.builder


def _builder(
    *,
    throwaway_config=False,
    clear_after_build=False,
    keep_tf32=False,
    old_workspace=False,
    one_input=False,
    swap=False,
    fixed=False,
    other_file=False,
    engine_returned=False,
    fp16_flag=False,
    two_profiles=False,
    workspace_mib=False,
    from_bytes=False,
    names_from_network=False,
):
    def build(trt, onnx_path, shapes, workspace_bytes, true_fp32):
        if other_file:
            import tempfile
            from pathlib import Path

            onnx_path = Path(tempfile.mkdtemp()) / "mine.onnx"
            l08.two_io_onnx(onnx_path, 2.0, next(iter(shapes.values()))[0][1])
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(0)
        if from_bytes:  # right too: the file's bytes through OnnxParser.parse
            with open(onnx_path, "rb") as f:
                assert trt.OnnxParser(network, logger).parse(f.read())
        else:
            trt.OnnxParser(network, logger).parse_from_file(str(onnx_path))
        config = builder.create_builder_config()
        if old_workspace:
            config.max_workspace_size = workspace_bytes
        else:  # workspace_mib: the limit given in MiB, the unit a workspace is usually quoted in
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes >> 20 if workspace_mib else
                                         workspace_bytes)  # fmt: skip
        if fp16_flag:
            config.set_flag(trt.BuilderFlag.FP16)
        if true_fp32 and throwaway_config:
            builder.create_builder_config().clear_flag(trt.BuilderFlag.TF32)  # cleared on a config never built
        elif true_fp32 and not keep_tf32 and not clear_after_build:
            config.clear_flag(trt.BuilderFlag.TF32)
        profile = builder.create_optimization_profile()
        if names_from_network:  # right too: the input names read from the network, as NVIDIA's samples do
            names = [network.get_input(i).name for i in range(network.num_inputs)]
            shapes = {name: shapes[name] for name in names}
        for i, (name, (lo, opt, hi)) in enumerate(shapes.items()):
            if one_input and i:
                continue
            if two_profiles and i:
                config.add_optimization_profile(profile)
                profile = builder.create_optimization_profile()
            if swap:
                opt, hi = hi, opt
            if fixed:
                lo, opt, hi = (1, lo[1]), (8, lo[1]), (32, lo[1])
            profile.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(profile)
        plan = builder.build_serialized_network(network, config)
        if true_fp32 and clear_after_build:
            config.clear_flag(trt.BuilderFlag.TF32)  # too late: the engine is built
        if engine_returned:
            return trt.Runtime(logger).deserialize_cuda_engine(plan)
        return plan if plan is None else bytes(plan)

    return build


def test_the_reference_builder_passes():
    assert verdict("08.builder", exercises.get("08.builder").solution) == "accepted"
    solution = exercises.get("08.builder").solution
    bad = {s: v for s in SWEEP if (v := verdict("08.builder", solution, seed=s)) != "accepted"}
    assert not bad, bad


def test_a_builder_parsing_the_files_bytes_is_accepted():
    """``OnnxParser.parse(f.read())`` is the same network as ``parse_from_file(path)``: the check compares the
    model the plan was built from with the given file's bytes, not the path."""
    bad = {s: v for s in SWEEP if (v := verdict("08.builder", _builder(from_bytes=True), seed=s)) != "accepted"}
    assert not bad, bad


def test_a_builder_reading_input_names_from_the_network_is_accepted():
    """``network.get_input(i).name`` for i in ``range(network.num_inputs)`` (TensorRT 11.1 has it; NVIDIA's
    samples read the inputs so) gives the parsed model's names: accepted on every seed, parsed from the file or
    its bytes."""
    for from_bytes in (False, True):
        fn = _builder(names_from_network=True, from_bytes=from_bytes)
        bad = {s: v for s in SWEEP if (v := verdict("08.builder", fn, seed=s)) != "accepted"}
        assert not bad, bad


def test_the_fake_networks_inputs_and_outputs_are_the_parsed_models(tmp_path):
    """The fake's ``get_input``/``get_output``: the ONNX file's tensors with their names, -1 for the dynamic batch,
    their width and dtype, the same object on each call, and ``None`` out of range (the C++ API's nullptr) or
    before anything is parsed."""
    trt = l08.fake_trt()
    logger = trt.Logger(trt.Logger.WARNING)
    network = trt.Builder(logger).create_network(0)
    assert network.num_inputs == 0 and network.get_input(0) is None and network.get_output(0) is None
    l08.two_io_onnx(tmp_path / "m.onnx", 2.0, 7)
    assert trt.OnnxParser(network, logger).parse_from_file(str(tmp_path / "m.onnx"))
    ins = [network.get_input(i) for i in range(network.num_inputs)]
    outs = [network.get_output(i) for i in range(network.num_outputs)]
    assert [t.name for t in ins] == ["a", "b"] and [t.name for t in outs] == ["sum", "scaled"]
    assert [tuple(t.shape) for t in ins + outs] == [(-1, 7)] * 4
    assert [t.dtype for t in ins + outs] == [trt.DataType.FLOAT] * 3 + [trt.DataType.HALF]  # scaled: float16
    assert [t.is_network_input for t in ins + outs] == [True, True, False, False]
    assert [t.is_network_output for t in ins + outs] == [False, False, True, True]
    assert network.get_input(0) is ins[0] and network.get_input(2) is None and network.get_output(-1) is None
    with pytest.raises(TypeError, match="incompatible function arguments"):
        network.get_input("a")


BUILDER_WRONG = [
    ({"keep_tf32": True}, "built with TF32 on"),
    ({"throwaway_config": True}, "built with TF32 on"),
    ({"clear_after_build": True}, "built with TF32 on"),
    ({"old_workspace": True}, "does not accept"),
    ({"one_input": True}, "returned None"),
    ({"swap": True}, "min <= opt <= max"),  # the fake refuses it as TensorRT does
    ({"fixed": True}, "profile shapes"),
    ({"other_file": True}, "not from the file you were given"),
    ({"engine_returned": True}, "return the serialized plan"),
    ({"fp16_flag": True}, "does not accept"),
    ({"two_profiles": True}, "exactly one optimization profile"),
    ({"workspace_mib": True}, "that is the limit in MiB"),
]


@pytest.mark.parametrize("mistake, reason", BUILDER_WRONG, ids=lambda m: next(iter(m)) if isinstance(m, dict) else "")
def test_the_builder_check_rejects(mistake, reason):
    for seed in SWEEP:
        msg = verdict("08.builder", _builder(**mistake), seed=seed)
        assert reason in msg and f"seed {seed}" in msg, (seed, msg)
    msg = verdict("08.builder", _builder(**mistake))
    assert reason in msg, msg


def test_the_builder_draws_distinct_strictly_increasing_profiles_on_every_seed():
    from course_checks.lesson_exercises.l08_builder import draw_build_case
    from course_checks.lesson_exercises.observe import Cases

    for seed in SWEEP:
        _, _, bounds, workspace = draw_build_case(Cases(seed))
        assert bounds["a"] != bounds["b"] and all(lo < opt < hi for lo, opt, hi in bounds.values())
        assert workspace >= 1 << 20


def small_outputs(trt, engine, context, feeds, stream, producer):
    """Outputs allocated for the profile's smallest batch: too small for the batch that runs."""
    outs = {}
    for name in ("a", "b"):
        context.set_input_shape(name, tuple(feeds[name].shape))
        context.set_tensor_address(name, feeds[name].data_ptr())
    for name, dtype in (("sum", torch.float32), ("scaled", torch.float16)):
        lo = engine.get_tensor_profile_shape("a", 0)[0]
        outs[name] = torch.empty(tuple(lo), dtype=dtype, device=feeds["a"].device)
        context.set_tensor_address(name, outs[name].data_ptr())
    stream.wait_stream(producer)
    context.execute_async_v3(stream.cuda_stream)
    producer.wait_stream(stream)
    return outs


def test_too_small_output_buffers_are_an_error_not_a_crash():
    """The fake TensorRT bounds-checks each copy against the buffer it writes (it used to corrupt the heap); the
    drawn batch is above the profile's minimum on every seed, so outputs sized for the minimum are too small."""
    for seed in SWEEP:
        msg = verdict("08.runner", small_outputs, seed=seed)
        assert "has room for" in msg and "needs" in msg and "get_tensor_shape" in msg, (seed, msg)


def host_outputs(trt, engine, context, feeds, stream, producer):
    """Right on the host, wrong on a GPU: outputs allocated in host memory (no device=)."""
    run = exercises.get("08.runner").solution
    for name in ("a", "b"):
        context.set_input_shape(name, tuple(feeds[name].shape))
        context.set_tensor_address(name, feeds[name].data_ptr())
    outs = {}
    for name, dtype in (("sum", torch.float32), ("scaled", torch.float16)):
        outs[name] = torch.empty(tuple(context.get_tensor_shape(name)), dtype=dtype)
        context.set_tensor_address(name, outs[name].data_ptr())
    stream.wait_stream(producer)
    context.execute_async_v3(stream.cuda_stream)
    producer.wait_stream(stream)
    assert run is not None
    return outs


def test_the_runner_is_checked_on_the_gpu_too():
    for seed in SWEEP:
        msg = verdict("08.runner", host_outputs, seed=seed)
        assert "with the inputs on the GPU" in msg and "live CUDA memory" in msg, (seed, msg)


def test_the_device_run_sees_a_missing_wait_after():
    import tempfile
    from pathlib import Path

    from course_checks.lesson_exercises.observe import Cases

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        l08.two_io_onnx(path, 2.0, 5)
        with pytest.raises(AssertionError, match="with the inputs on the GPU"):
            l08._run_on_device(_runner(no_wait_after=True), Cases(1), path, 2.0, 5, 3)
        with pytest.raises(AssertionError, match="with the inputs on the GPU"):
            l08._run_on_device(_runner(no_wait_before=True), Cases(1), path, 2.0, 5, 3)
        assert "both stream orders held" in l08._run_on_device(l08.run_engine, Cases(1), path, 2.0, 5, 3)


def test_unsolved_runner_is_reported_not_raised(capsys):
    def run_engine(trt, engine, context, feeds, stream, producer):
        raise NotImplementedError

    exercises.check("08.runner", run_engine)
    assert "not solved yet" in capsys.readouterr().out


# ------------------------------------------------------------------ 08.profile and 08.stale, 200 seeds each
def _profile(opt_rule):
    def fn(batches):
        if not batches:
            raise ValueError("no traffic")
        return min(batches), opt_rule(batches), max(batches)

    return fn


def _most_common(batches):
    import collections

    return collections.Counter(batches).most_common(1)[0][0]


def _mode(batches):
    import statistics

    return statistics.mode(batches)


def _largest_on_ties(batches):
    return max(set(batches), key=lambda b: (batches.count(b), b))


def _median(batches):
    return sorted(batches)[len(batches) // 2]


def _profile_numpy(batches):
    import numpy as np

    if not batches:
        raise ValueError("empty")
    values, counts = np.unique(np.array(batches), return_counts=True)
    return np.array([values.min(), values[np.argmax(counts)], values.max()])  # np.argmax: the first (smallest) tie


def _first_most_common_unguarded(batches):  # no check for an empty list: most_common(1)[0] raises IndexError
    import collections

    counts = collections.Counter(batches)
    opt = collections.Counter(batches).most_common(1)[0][0]
    opt = min(b for b in counts if counts[b] == counts[opt])
    return min(batches), opt, max(batches)


PROFILE_RIGHT = [exercises.get("08.profile").solution, _profile_numpy,
                 lambda b: list(exercises.get("08.profile").solution(b))]  # fmt: skip
PROFILE_WRONG = [
    (_profile(_most_common), "tied for most frequent"),
    (_profile(_mode), "tied for most frequent"),
    (_profile(_largest_on_ties), "tied for most frequent"),
    (_profile(_median), "tied for most frequent|opt the most frequent batch"),
    (lambda b: (min(b), max(b), _most_common(b)), "(min, opt, max)"),
    (lambda b: (min(b), _most_common(b), max(b)) if b else (0, 0, 0), "raise ValueError|tied"),
    (_first_most_common_unguarded, "raised IndexError (list index out of range), not ValueError"),
]


def test_profile_right_answers_pass_on_every_seed():
    for fn in PROFILE_RIGHT:
        bad = {s: v for s in SWEEP if (v := verdict("08.profile", fn, seed=s)) != "accepted"}
        assert not bad, bad


@pytest.mark.parametrize("fn, reason", PROFILE_WRONG, ids=range(len(PROFILE_WRONG)))
def test_profile_wrong_answers_fail_on_every_seed(fn, reason):
    import re

    for seed in SWEEP:
        msg = verdict("08.profile", fn, seed=seed)
        assert re.search(re.escape(reason) if "|" not in reason else reason, msg) and f"seed {seed}" in msg, msg


def _stale(compare, fields=l08.FIELDS, missing_all=True):
    def fn(stored, here):
        if stored is None:
            return list(l08.FIELDS) if missing_all else []
        return [f for f in fields if compare(stored.get(f), here.get(f))]

    return fn


STALE_RIGHT = [
    exercises.get("08.stale").solution,
    _stale(lambda a, b: json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True)),
    lambda stored, here: tuple(f for f in l08.FIELDS if stored is None or stored.get(f) != here.get(f)),
]
STALE_WRONG = [
    (_stale(lambda a, b: a is not b), "compare values with != (not `is not`)"),
    (_stale(lambda a, b: a != b, [f for f in l08.FIELDS if f != "build"]), "the build settings too"),
    (_stale(lambda a, b: a != b, [f for f in l08.FIELDS if f != "precision"]), "you left out ['precision']"),
    (_stale(lambda a, b: a != b, [f for f in l08.FIELDS if f != "profile"]), "you left out ['profile']"),
    (_stale(lambda a, b: a != b, [f for f in l08.FIELDS if f != "onnx_sha256"]), "you left out ['onnx_sha256']"),
    (_stale(lambda a, b: a != b, sorted(l08.FIELDS)), "in FIELDS order"),
    (
        lambda stored, here: (
            set(l08.FIELDS) if stored is None else {f for f in l08.FIELDS if stored.get(f) != here.get(f)}
        ),
        "in FIELDS order",
    ),
    (lambda stored, here: list(l08.FIELDS) if stored is None or stored != here else [], "stale fields are"),
    (_stale(lambda a, b: a != b, missing_all=False), "no stored metadata"),
    (  # stored[f]: a record written before a field existed raises KeyError
        lambda stored, here: list(l08.FIELDS) if stored is None else [f for f in l08.FIELDS if stored[f] != here[f]],
        "your function raised KeyError. A field missing from stored is stale",
    ),
    (  # nothing stored not handled: None.get raises
        lambda stored, here: [f for f in l08.FIELDS if stored.get(f) != here.get(f)],
        "nothing stored (stored is None, no engine built yet): your function raised AttributeError",
    ),
    (  # every key of the record compared, the build date too
        lambda stored, here: list(l08.FIELDS) if stored is None else [f for f in here if stored.get(f) != here.get(f)],
        "you returned ['built'], not in FIELDS",
    ),
]


def test_stale_right_answers_pass_on_every_seed():
    for fn in STALE_RIGHT:
        bad = {s: v for s in SWEEP if (v := verdict("08.stale", fn, seed=s)) != "accepted"}
        assert not bad, bad


@pytest.mark.parametrize("fn, reason", STALE_WRONG, ids=range(len(STALE_WRONG)))
def test_stale_wrong_answers_fail_on_every_seed(fn, reason):
    for seed in SWEEP:
        msg = verdict("08.stale", fn, seed=seed)
        assert reason in msg and f"seed {seed}" in msg, (seed, msg)
