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
    return lesson_namespace("02", torch=torch, pd=pd, profile=profile, ProfilerActivity=ProfilerActivity,
                            record_function=record_function, schedule=schedule)  # fmt: skip


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
    assert list(table.index) == ["a", "b"] and abs(table["share"].sum() - 1) < 1e-9


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
