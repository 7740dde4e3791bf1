"""Lesson 02's profiling code, as the learner reads it, run on CPU: the schedule keeps exactly the active steps,
the record_function ranges become stages, the Chrome trace is written; with CUDA requested the same function
adds ProfilerActivity.CUDA and synchronizes the device after every step."""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "02.cuda-profile": "profile_pipeline with device 'cuda': CUDA activity requested, device synchronized each "
    "step, schedule and trace export; stage_table on the record_function ranges",
}


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace(
        "02",
        torch=torch,
        pd=pd,
        profile=profile,
        ProfilerActivity=ProfilerActivity,
        record_function=record_function,
        schedule=schedule,
    )


def work():
    x = torch.ones(8)
    with record_function("a"):
        for _ in range(10):
            x = x + 1
    with record_function("b"):
        x = x * 2
    return x


def test_schedule_keeps_active_steps_and_writes_trace(ns, tmp_path):
    calls = []
    prof = ns["profile_pipeline"](lambda: calls.append(work()), "cpu", tmp_path / "t.json", active=2)
    assert len(calls) == 4, "1 wait + 1 warm-up + 2 active steps"
    adds = next(e for e in prof.key_averages() if e.key == "aten::add")
    assert adds.count == 20, "only the 2 active steps are recorded"
    names = {ev.get("name") for ev in json.loads((tmp_path / "t.json").read_text())["traceEvents"]}
    assert {"a", "b", "aten::add"} <= names
    table = ns["stage_table"](prof, ["a", "b"])
    # largest first (which range is larger depends on the machine's load: check the order, not a fixed answer)
    assert set(table.index) == {"a", "b"} and list(table["ms"]) == sorted(table["ms"], reverse=True)
    assert abs(table["share"].sum() - 1) < 1e-9


def test_cuda_request_synchronizes_each_step(ns, tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available, disabling CUDA profiling" on this machine
        ns["profile_pipeline"](work, "cuda", tmp_path / "c.json", active=1)
    assert len(synced) == 3
    assert (tmp_path / "c.json").stat().st_size > 0


def test_cuda_activity_requested(ns, tmp_path, monkeypatch):
    seen = {}
    real = ns["profile"]

    def spy(**kwargs):
        seen.update(kwargs)
        return real(**{**kwargs, "activities": [ProfilerActivity.CPU]})

    monkeypatch.setitem(ns, "profile", spy)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    ns["profile_pipeline"](work, "cuda", tmp_path / "s.json", active=1)
    assert seen["activities"] == [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    assert seen["record_shapes"] is True


def _event(i, name, start, end, children=(), kernel_us=0.0):
    from torch.autograd.profiler_util import FunctionEvent

    e = FunctionEvent(
        i,
        name,
        thread=1,
        start_us=start,
        end_us=end,
        use_device="cuda",
        input_shapes=[],
        stack=[],
        is_user_annotation=name in ("preprocess", "model", "postprocess"),
    )
    if kernel_us:
        e.append_kernel(f"kernel of {name}", 0, kernel_us)
    for c in children:
        e.append_cpu_child(c)
        c.set_cpu_parent(e)
    return e


class FakeCudaProfile:
    """One profiled step of a GPU pipeline: the model's kernels take 5 ms of device time, but post-processing's
    `.item()` waits for them in cudaStreamSynchronize, so post-processing has the largest CPU time."""

    def __init__(self):
        from torch.autograd.profiler_util import EventList

        sync = _event(1, "cudaStreamSynchronize", 6300, 11500)
        item = _event(2, "aten::item", 6250, 11550, [sync], kernel_us=10)
        conv = _event(3, "aten::conv2d", 1050, 1200, kernel_us=5000)
        self.evs = [
            _event(4, "preprocess", 0, 1000),
            _event(5, "model", 1000, 1200, [conv]),
            _event(6, "postprocess", 6200, 11600, [item]),
            conv,
            item,
            sync,
        ]
        self.list = EventList(self.evs, use_device="cuda")
        self.list._tree_built = True  # the parents and children are set above

    def events(self):
        return self.list

    def key_averages(self):
        return self.list.key_averages()


def test_stage_table_charges_kernels_to_the_stage_that_launched_them(ns):
    table = ns["stage_table"](FakeCudaProfile(), ["preprocess", "model", "postprocess"], steps=1)
    assert list(table.index) == ["model", "preprocess", "postprocess"], table
    assert table.loc["model", "ms"] == pytest.approx(5.0)
    assert table.loc["postprocess", "ms"] == pytest.approx(0.2)  # its host work, without the wait
    assert table.loc["preprocess", "ms"] == pytest.approx(1.0)
    assert abs(table["share"].sum() - 1) < 1e-9


def test_stage_table_on_cpu_is_cpu_time(ns, tmp_path):
    prof = ns["profile_pipeline"](work, "cpu", tmp_path / "t.json", active=2)
    table = ns["stage_table"](prof, ["a", "b"])
    ka = {e.key: e.cpu_time_total / 1000 / 2 for e in prof.key_averages() if e.key in ("a", "b")}
    for k, v in ka.items():
        assert table.loc[k, "ms"] == pytest.approx(v, rel=1e-6)
    assert (table["device_ms"] == 0).all()
