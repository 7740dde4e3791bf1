"""Lesson 08's self-checks reject wrong answers (the reference solutions pass in test_exercises.py)."""

from __future__ import annotations

import pytest
import torch

from course_utils.check import exercises
from course_utils.check.lesson_exercises import l08

DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16}


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
):
    """A run_engine with one planted mistake."""

    def run(trt, engine, context, feeds, stream, producer):
        if own_engine:  # a hard-coded engine: built from a file of one's own, ignoring the one given
            import tempfile
            from pathlib import Path

            path = Path(tempfile.mkdtemp()) / "mine.onnx"
            width = next(iter(feeds.values())).shape[1]
            l08._two_io_onnx(path, 2.0, width)
            engine = l08._engine(trt, path, {"a": (1, 4, 8), "b": (1, 4, 8)}, width)
            context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        for name in inputs[:1] if first_input_only else inputs:
            if not skip_shape:
                context.set_input_shape(name, tuple(feeds[name].shape))
            context.set_tensor_address(name, feeds[name].data_ptr())
        outs = {}
        for name in names:
            if name in inputs:
                continue
            dtype = torch.float32 if float_outputs else DTYPES[engine.get_tensor_dtype(name).name]
            shape = tuple(context.get_tensor_shape(name))
            outs[name] = torch.empty(tuple(max(d, 0) for d in shape), dtype=dtype)
            if not skip_output_address:
                context.set_tensor_address(name, outs[name].data_ptr())
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
    assert exercises.verdict("08.runner", exercises.get("08.runner").solution) == "accepted"


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
    msg = exercises.verdict("08.runner", _runner(**mistake))
    assert reason in msg, msg


# ------------------------------------------------------------------ 08.builder


def _builder(
    *,
    keep_tf32=False,
    old_workspace=False,
    one_input=False,
    swap=False,
    fixed=False,
    other_file=False,
    engine_returned=False,
    fp16_flag=False,
    two_profiles=False,
):
    def build(trt, onnx_path, shapes, workspace_bytes, true_fp32):
        if other_file:
            import tempfile
            from pathlib import Path

            onnx_path = Path(tempfile.mkdtemp()) / "mine.onnx"
            l08._two_io_onnx(onnx_path, 2.0, next(iter(shapes.values()))[0][1])
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(0)
        trt.OnnxParser(network, logger).parse_from_file(str(onnx_path))
        config = builder.create_builder_config()
        if old_workspace:
            config.max_workspace_size = workspace_bytes
        else:
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
        if fp16_flag:
            config.set_flag(trt.BuilderFlag.FP16)
        if true_fp32 and not keep_tf32:
            config.clear_flag(trt.BuilderFlag.TF32)
        profile = builder.create_optimization_profile()
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
        if engine_returned:
            return trt.Runtime(logger).deserialize_cuda_engine(plan)
        return plan if plan is None else bytes(plan)

    return build


def test_the_reference_builder_passes():
    assert exercises.verdict("08.builder", exercises.get("08.builder").solution) == "accepted"


BUILDER_WRONG = [
    ({"keep_tf32": True}, "TF32 stays on"),
    ({"old_workspace": True}, "does not accept"),
    ({"one_input": True}, "returned None"),
    ({"swap": True}, "min <= opt <= max"),  # the fake refuses it as TensorRT does
    ({"fixed": True}, "profile shapes"),
    ({"other_file": True}, "not from the file you were given"),
    ({"engine_returned": True}, "return the serialized plan"),
    ({"fp16_flag": True}, "does not accept"),
    ({"two_profiles": True}, "exactly one optimization profile"),
]


@pytest.mark.parametrize("mistake, reason", BUILDER_WRONG, ids=lambda m: next(iter(m)) if isinstance(m, dict) else "")
def test_the_builder_check_rejects(mistake, reason):
    msg = exercises.verdict("08.builder", _builder(**mistake))
    assert reason in msg, msg


def test_unsolved_runner_is_reported_not_raised(capsys):
    def run_engine(trt, engine, context, feeds, stream, producer):
        raise NotImplementedError

    exercises.check("08.runner", run_engine)
    assert "not solved yet" in capsys.readouterr().out


def test_stale_check_rejects_ignoring_build_settings():
    fields_without_build = [f for f in l08.FIELDS if f != "build"]

    def stale(stored, here):
        if stored is None:
            return list(l08.FIELDS)
        return [f for f in fields_without_build if stored.get(f) != here.get(f)]

    with pytest.raises(AssertionError, match="TF32"):
        l08._check_rebuild(stale)
