"""timing.measure and Measurement on this machine's CPU: the summary fields, the spread warning and the clear error
for CUDA without a GPU.

timing.measure and Measurement pinned on known answers: a workload of known cost, an asynchronous device whose
work completes only when synchronized (CPU and a recording stand-in for CUDA events), cold first calls, and the
percentiles of a known list. Each test fails when the bug it names is planted (see scripts/mutate.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from course_utils.measuring import device as device_mod
from course_utils.measuring import timing


def test_measure_summary_fields():
    m = timing.measure(lambda: time.sleep(0.002), device="cpu", batch_size=4, min_repeats=5, min_time_s=0.02)
    assert m.n >= 5
    assert 1.5 <= m.median_ms <= 50
    assert m.p10_ms <= m.median_ms <= m.p90_ms
    assert m.iqr_ms >= 0 and m.mean_ms > 0
    assert m.throughput == pytest.approx(4 / (m.median_ms / 1000))
    assert set(m.as_dict()) >= {"median_ms", "p90_ms", "throughput", "n"}
    assert "median" in str(m)


def test_measure_without_batch_has_no_throughput():
    m = timing.measure(lambda: None, device="cpu", min_repeats=3, min_time_s=0.0, warmup=0)
    assert m.throughput is None and m.n == 3


def test_high_spread_warns():
    calls = iter(range(1000))

    def jumpy():
        time.sleep(0.02 if next(calls) % 2 else 0.0005)

    with pytest.warns(timing.HighSpreadWarning):
        timing.measure(jumpy, device="cpu", min_repeats=8, min_time_s=0.0, warmup=0)


def test_measure_cuda_without_gpu_is_one_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from course_utils.supply.errors import DeviceUnavailableError

    with pytest.raises(DeviceUnavailableError, match="no usable NVIDIA GPU"):
        timing.measure(lambda: None, device="cuda")


WORK_MS = 4.0


class FakeGpu:
    """An in-order queue of work on the host clock: a launch returns at once, the work ends later."""

    def __init__(self) -> None:
        self.busy_until = 0.0
        self.launches = 0
        self.syncs = 0

    def launch(self, work_ms: float = WORK_MS) -> None:
        self.busy_until = max(time.perf_counter(), self.busy_until) + work_ms / 1000
        self.launches += 1

    def synchronize(self, *args: object) -> None:
        self.syncs += 1
        delay = self.busy_until - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


def make_event_class(gpu: FakeGpu, made: list):
    class Event:
        """torch.cuda.Event's interface: record() stamps the time the queue reaches it; elapsed_time between two
        stamps, and only once the end event has completed (a real CUDA event raises 'not ready' otherwise)."""

        def __init__(self, enable_timing=False, blocking=False, interprocess=False, external=False):
            self.enable_timing, self.t, self.synced = enable_timing, None, False
            made.append(self)

        def record(self, stream=None):
            self.t = max(time.perf_counter(), gpu.busy_until)

        def query(self):
            return self.t is not None and time.perf_counter() >= self.t

        def synchronize(self):
            assert self.t is not None, "synchronize() on an event never recorded"
            delay = self.t - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self.synced = True

        def elapsed_time(self, end_event):
            assert self.enable_timing and end_event.enable_timing, "elapsed_time needs Event(enable_timing=True)"
            if not end_event.query():
                raise RuntimeError("CUDA error: device not ready (the end event has not completed: synchronize it)")
            return (end_event.t - self.t) * 1000

    return Event


@pytest.fixture
def fake_cuda(monkeypatch):
    gpu, made = FakeGpu(), []
    monkeypatch.setattr(timing, "_resolve_device", lambda d: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "Event", make_event_class(gpu, made))
    monkeypatch.setattr(torch.cuda, "synchronize", gpu.synchronize)
    return gpu, made


def test_cuda_branch_times_the_queued_work_with_events(fake_cuda):
    gpu, made = fake_cuda
    m = timing.measure(gpu.launch, device="cuda", warmup=2, min_repeats=10, min_time_s=0.0, warn_spread=False)
    assert m.n == 10 and gpu.launches == 12, "2 warm-up calls, then exactly min_repeats timed calls"
    assert m.device == "cuda"
    assert len(made) == 20 and all(e.enable_timing for e in made), "a start and an end event per timed call"
    assert all(e.synced for e in made[1::2]), "every end event must be synchronized before elapsed_time"
    # each call queues WORK_MS and the events see that (plus, at most, a preemption of this busy machine)
    assert m.median_ms >= WORK_MS * 0.99, m.median_ms


def test_cuda_branch_synchronizes_before_timing(fake_cuda):
    gpu, _ = fake_cuda
    timing.measure(gpu.launch, device="cuda", warmup=3, min_repeats=3, min_time_s=0.0, warn_spread=False)
    assert gpu.syncs >= 1, "torch.cuda.synchronize() must run after the warm-up"


def test_cpu_branch_synchronizes_an_asynchronous_device(monkeypatch):
    gpu = FakeGpu()
    monkeypatch.setattr(device_mod, "synchronize", gpu.synchronize)
    m = timing.measure(gpu.launch, device="cpu", warmup=2, min_repeats=10, min_time_s=0.0, warn_spread=False)
    assert m.median_ms >= WORK_MS * 0.9, (  # no upper bound: a loaded machine only adds time
        f"median {m.median_ms:.3f} ms for {WORK_MS} ms of queued work: the timer must synchronize after each call"
    )


def test_known_cost_workload_and_repeat_rules():
    calls = []

    def work():
        calls.append(1)
        time.sleep(WORK_MS / 1000)

    m = timing.measure(work, device="cpu", warmup=3, min_repeats=7, min_time_s=0.0, warn_spread=False)
    assert m.n == 7 and len(calls) == 10
    assert m.median_ms >= WORK_MS * 0.95, m.median_ms  # sleep never returns early; a loaded machine adds time
    assert m.throughput is None
    # min_time_s keeps it going past min_repeats
    t0 = time.perf_counter()
    m = timing.measure(work, device="cpu", warmup=0, min_repeats=2, min_time_s=0.1, warn_spread=False)
    assert time.perf_counter() - t0 >= 0.1 and m.n > 2, "min_time_s keeps it going past min_repeats"
    m = timing.measure(work, device="cpu", warmup=0, min_repeats=50, min_time_s=0.0, max_repeats=4)
    assert m.n == 4, "max_repeats caps the sample"


def test_warmup_calls_are_not_timed():
    state = {"n": 0}

    def cold_then_warm():
        state["n"] += 1
        time.sleep(0.3 if state["n"] <= 3 else 0.001)

    m = timing.measure(cold_then_warm, device="cpu", warmup=3, min_repeats=5, min_time_s=0.0, warn_spread=False)
    assert m.n == 5 and state["n"] == 8
    assert m.median_ms < 150, "the cold calls were timed: 3 of the 5 timed calls took 300 ms"


def test_measurement_statistics_of_a_known_list():
    m = timing.Measurement(times_ms=[float(x) for x in range(101)], batch_size=8, label="k")
    assert (m.median_ms, m.p10_ms, m.p90_ms, m.p99_ms) == (50.0, 10.0, 90.0, 99.0)
    assert m.mean_ms == 50.0 and m.iqr_ms == 50.0 and m.n == 101
    assert m.spread == 1.0
    assert m.throughput == pytest.approx(8 / 0.05)
    d = m.as_dict()
    assert (d["median_ms"], d["p10_ms"], d["p90_ms"], d["iqr_ms"], d["n"]) == (50.0, 10.0, 90.0, 50.0, 101)
    assert d["throughput"] == pytest.approx(160.0)
    shuffled = timing.Measurement(times_ms=list(np.random.default_rng(0).permutation(101).astype(float)))
    assert (shuffled.p10_ms, shuffled.p90_ms) == (10.0, 90.0), "percentiles do not depend on the order"
    assert "median 50.000 ms (p10 10.000, p90 90.000" in str(m)


def test_high_spread_warning_threshold():
    steady = timing.Measurement(times_ms=[10.0] * 10)
    assert steady.spread == 0.0
    # IQR 2 on a median of 10 is 20%: under the 25% threshold; IQR 3 is 30%: over it
    assert timing.HIGH_SPREAD == 0.25
    assert timing.Measurement(times_ms=[9.0, 9.0, 10.0, 11.0, 11.0]).spread == pytest.approx(0.2)


def test_median_and_throughput_of_a_skewed_list():
    m = timing.Measurement(times_ms=[1.0, 1.0, 1.0, 2.0, 20.0], batch_size=10)
    assert (m.median_ms, m.mean_ms) == (1.0, 5.0)
    assert m.throughput == 10_000.0, "items per second at the MEDIAN time"
    assert m.p90_ms == pytest.approx(12.8) and m.p10_ms == 1.0
