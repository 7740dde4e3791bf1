"""Lesson 01's timer and copy-bandwidth code, as the learner reads it, run on CPU; its CUDA branch runs against
a stand-in for ``torch.cuda.Event`` whose methods and signatures are checked against the real class."""

from __future__ import annotations

import inspect
import re
import time

import numpy as np
import pytest
import torch

from course_utils.measuring import timing
from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "01.gpu-sync": "time_calls' CUDA branch (Event(enable_timing=True), record, synchronize, elapsed_time order) "
    "against the real torch.cuda.Event interface; its CPU branch against cu.measure",
    "01.transfer": "copy_bandwidth's copy and bandwidth arithmetic with CPU tensors (pin_memory needs a GPU)",
}

WORK_S = 0.02  # long against the wake-up delays of a loaded machine


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("01", time=time, torch=torch, np=np, re=re)


def sleep_work():
    time.sleep(WORK_S)


class FakeEvent:
    """Stand-in for torch.cuda.Event on CPU: the same methods and parameters, host clock instead of GPU clock."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, external=False):
        self.enable_timing, self.t = enable_timing, None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        assert self.t is not None, "synchronize() on an event that was never recorded"

    def elapsed_time(self, end_event):
        assert self.enable_timing and end_event.enable_timing, "elapsed_time needs Event(enable_timing=True)"
        assert self.t is not None and end_event.t is not None, "elapsed_time on an unrecorded event"
        return (end_event.t - self.t) * 1000


def test_fake_event_matches_the_real_interface():
    real = torch.cuda.Event
    for name in ("record", "synchronize", "elapsed_time"):
        want = list(inspect.signature(getattr(real, name)).parameters)
        got = list(inspect.signature(getattr(FakeEvent, name)).parameters)
        assert got == want, f"torch.cuda.Event.{name}{want} vs fake {got}"
    real_init = set(inspect.signature(real.__new__).parameters) - {"cls"}
    assert {"enable_timing"} <= real_init <= set(inspect.signature(FakeEvent.__init__).parameters)


def test_time_calls_cpu_agrees_with_measure(ns):
    times = ns["time_calls"](sleep_work, "cpu", warmup=2, repeats=15)
    assert len(times) == 15
    ref = timing.measure(sleep_work, device="cpu", min_repeats=15, min_time_s=0.0, warn_spread=False)
    assert 0.8 <= np.median(times) / ref.median_ms <= 1.25, (np.median(times), ref.median_ms)
    s = ns["summarize"](times)
    assert s["p10_ms"] <= s["median_ms"] <= s["p90_ms"] and s["n"] == 15


def test_time_calls_cuda_branch_uses_events(ns, monkeypatch):
    made = []

    class Recording(FakeEvent):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    synced = []
    monkeypatch.setattr(torch.cuda, "Event", Recording)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    times = ns["time_calls"](sleep_work, "cuda", warmup=2, repeats=6)
    assert len(made) == 12, "two events per timed call"
    assert all(e.enable_timing for e in made)
    assert synced, "the queue is synchronized before timing"
    assert all(0.9 * WORK_S * 1000 <= t <= 10 * WORK_S * 1000 for t in times), times


def test_copy_bandwidth_cpu(ns):
    src, dst = torch.randn(1 << 20), torch.empty(1 << 20)
    gbs = ns["copy_bandwidth"](dst, src, "cpu")
    assert torch.equal(dst, src)
    assert 0.05 < gbs < 1000


@pytest.mark.parametrize(
    "name, entry",
    [
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),  # a substring test gave the A10's roofs
        ("NVIDIA L40", "L40"),  # ... and the L4's
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),  # ... and nothing
        ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA GeForce RTX 3090", None),
    ],
)
def test_datasheet_lookup_matches_whole_model_words(ns, name, entry):
    assert ns["datasheet_entry"](name) == entry
