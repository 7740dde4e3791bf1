"""Lesson 03's batch-size sweep and cudnn.benchmark code, as the learner reads them, run on CPU: an
out-of-memory stops the sweep, frees the cache on the CUDA path and keeps the rows; a non-OOM error keeps the
rows too; the cudnn.benchmark flag is restored."""

from __future__ import annotations

import gc
import sys
import time
import weakref

import pandas as pd
import pytest
import torch

import course_utils as cu
from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "03.real-oom": "batch_sweep with a real torch.OutOfMemoryError (rows kept, torch.cuda.empty_cache called on the "
    "'cuda' path) and with a non-OOM RuntimeError (rows kept, error reported), under inference_mode",
    "03.cudnn-benchmark": "cudnn_benchmark_effect on CPU: both settings timed, torch.backends.cudnn.benchmark restored",
}

FAST = dict(warmup=0, min_repeats=1, min_time_s=0.0, warn_spread=False)


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("03", torch=torch, pd=pd, gc=gc, time=time, cu=cu)


class Failing:
    """A model that works until batch `limit`, then raises `exc`; records whether it ran under inference_mode."""

    def __init__(self, limit, exc):
        self.limit, self.exc, self.inference = limit, exc, []

    def __call__(self, x):
        self.inference.append(torch.is_inference_mode_enabled())
        if len(x) >= self.limit:
            raise self.exc
        return x * 2


def test_oom_keeps_rows_and_frees_cache(ns, monkeypatch):
    freed = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: freed.append(True))
    model = Failing(8, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    df = ns["batch_sweep"](model, lambda b: torch.ones(b, 4), [1, 2, 4, 8, 16], "cpu", **FAST)
    assert list(df["batch_size"]) == [1, 2, 4] and df.attrs["max_fit"] == 4
    assert "out of memory at batch 8" in df.attrs["stopped"]
    assert all(model.inference) and not freed, "CPU path: no CUDA cache to free"

    def fake_measure(fn, **kwargs):  # no CUDA here: run the call once, report a fixed time
        fn()
        return cu.timing.Measurement(times_ms=[1.0, 1.0, 1.0])

    monkeypatch.setattr(cu, "measure", fake_measure)
    ns_cuda = lesson_namespace("03", torch=torch, pd=pd, gc=gc, time=time, cu=cu)
    df = ns_cuda["batch_sweep"](Failing(4, torch.OutOfMemoryError("oom")), lambda b: torch.ones(b), [1, 2, 4], "cuda")
    assert list(df["batch_size"]) == [1, 2] and freed == [True], "CUDA path: empty_cache after the OOM"


def test_other_errors_keep_rows(ns):
    model = Failing(4, RuntimeError("input tensor has more than 2^31 elements"))
    df = ns["batch_sweep"](model, lambda b: torch.ones(b, 4), [1, 2, 4, 8], "cpu", **FAST)
    assert list(df["batch_size"]) == [1, 2]
    assert df.attrs["stopped"].startswith("RuntimeError at batch 4")


def test_cap_simulates_oom(ns):
    df = ns["batch_sweep"](lambda x: x, lambda b: torch.ones(b, 1024), [1, 64, 512], "cpu", cap_mb=1.0, **FAST)
    assert list(df["batch_size"]) == [1, 64] and "out of memory at batch 512" in df.attrs["stopped"]


def test_cudnn_benchmark_flag_restored(ns):
    before = torch.backends.cudnn.benchmark
    conv = torch.nn.Conv2d(3, 4, 3)
    out = ns["cudnn_benchmark_effect"](conv, torch.randn(5, 3, 16, 20), "cpu")
    assert list(out.index) == ["benchmark=False", "benchmark=True"]
    assert (out[["first call ms", "median ms"]] > 0).all().all()
    assert torch.backends.cudnn.benchmark == before


def test_cudnn_benchmark_compares_the_same_work(ns):
    """Both settings run the same batch size and pixel count (the old code timed batch 33 against 32), each on a
    shape the other setting has not used (cuDNN caches its choice per shape whatever the flag)."""
    seen = {}

    def model(x):
        seen.setdefault(torch.backends.cudnn.benchmark, set()).add(tuple(x.shape))
        return x.sum()

    ns["cudnn_benchmark_effect"](model, torch.randn(32, 3, 12, 14), "cpu")
    (off,), (on,) = seen[False], seen[True]
    assert off[0] == on[0] == 32, f"batch sizes differ: {off} vs {on}"
    assert off != on and sorted(off) == sorted(on), f"same work, different shapes expected: {off} vs {on}"
    with pytest.raises(ValueError, match="height != width"):
        ns["cudnn_benchmark_effect"](model, torch.randn(32, 3, 12, 12), "cpu")


def test_memory_freed_after_leaving_except(ns, monkeypatch):
    """The clean-up runs outside the except block, when the failed batch is no longer held by the traceback."""
    seen = []

    class Remember(Failing):
        def __call__(self, x):
            if len(x) >= self.limit:
                self.failed = weakref.ref(x)
                raise torch.OutOfMemoryError("CUDA out of memory")  # a new exception: its traceback dies with it
            return x * 2

    model = Remember(4, None)

    def empty_cache():
        seen.append((sys.exc_info()[0], model.failed() is None))

    def fake_measure(fn, **kwargs):
        fn()
        return cu.timing.Measurement(times_ms=[1.0, 1.0, 1.0])

    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    monkeypatch.setattr(cu, "measure", fake_measure)
    ns_cuda = lesson_namespace("03", torch=torch, pd=pd, gc=gc, time=time, cu=cu)
    df = ns_cuda["batch_sweep"](model, lambda b: torch.ones(b, 8), [1, 2, 4, 8], "cuda")
    assert list(df["batch_size"]) == [1, 2]
    assert seen == [(None, True)], (
        f"empty_cache saw (exception being handled, failed batch freed) = {seen}: free after the except block"
    )
