"""Lesson 08's self-checks reject wrong answers (the reference solutions pass in test_exercises.py)."""

from __future__ import annotations

import pytest
import torch

from course_utils import exercises
from course_utils.lesson_exercises import l08

DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16}


def _runner(*, v2=False, skip_shape=False, stream_handle=None, skip_output_address=False, first_input_only=False,
            float_outputs=False, as_list=False, path_arg=False):  # fmt: skip
    """A run_engine with one planted mistake."""

    def run(trt, engine, context, feeds, stream):
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
        if v2:
            context.execute_async_v2([t.data_ptr() for t in feeds.values()], handle)
        elif path_arg:
            context.execute_async_v3(str(handle))
        else:
            context.execute_async_v3(handle)
        return list(outs.values()) if as_list else outs

    return run


def test_the_reference_runner_passes():
    l08._check_runner(exercises.get("08.runner").solution)


@pytest.mark.parametrize(
    "mistake",
    [
        {"v2": True},
        {"skip_shape": True},
        {"stream_handle": 0},
        {"skip_output_address": True},
        {"first_input_only": True},
        {"float_outputs": True},
        {"as_list": True},
        {"path_arg": True},
    ],  # fmt: skip
    ids=lambda m: next(iter(m)),
)
def test_the_runner_check_rejects_wrong_loops(mistake):
    with pytest.raises(AssertionError):
        l08._check_runner(_runner(**mistake))


def test_unsolved_runner_is_reported_not_raised(capsys):
    def run_engine(trt, engine, context, feeds, stream):
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
