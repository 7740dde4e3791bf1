"""Unit tests for course_utils.techniques.batching_sim (dynamic-batching simulation)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from course_utils.techniques import batching_sim as batching


def _sweep() -> pd.DataFrame:
    # service time: fixed 10 ms overhead + 1 ms per item
    bs = [1, 2, 4, 8, 16]
    return pd.DataFrame({"batch_size": bs, "median_ms": [10.0 + b for b in bs]})


def test_service_time_fn_interpolates_and_refuses_beyond_sweep():
    svc = batching.service_time_fn(_sweep())
    assert svc(1) == pytest.approx(11.0)
    assert svc(3) == pytest.approx(13.0)  # linear between 2 and 4
    assert svc(16) == pytest.approx(26.0)
    with pytest.raises(ValueError, match="largest measured batch"):
        svc(32)
    with pytest.raises(ValueError):
        batching.service_time_fn(pd.DataFrame())


def test_poisson_arrivals_rate_and_order():
    arr = batching.poisson_arrivals(200.0, 20_000, seed=1)
    assert np.all(np.diff(arr) > 0)
    rate = len(arr) / (arr[-1] / 1000.0)
    assert rate == pytest.approx(200.0, rel=0.05)
    with pytest.raises(ValueError):
        batching.poisson_arrivals(0, 10)


def test_simulate_no_batching_by_hand():
    svc = batching.service_time_fn(_sweep())
    res = batching.simulate(np.array([0.0, 1.0, 100.0]), svc, max_batch_size=1)
    # first served 0..11, second waits until 11 and finishes at 22, third alone
    assert list(res.latencies_ms) == pytest.approx([11.0, 21.0, 11.0])
    assert list(res.batch_sizes) == [1, 1, 1]


def test_simulate_batches_wait_and_fill():
    svc = batching.service_time_fn(_sweep())
    # four requests within 3 ms; max batch 4 fills at t=3 before the 5 ms wait runs out
    res = batching.simulate(np.array([0.0, 1.0, 2.0, 3.0]), svc, max_batch_size=4, max_wait_ms=5.0)
    assert list(res.batch_sizes) == [4]
    assert res.latencies_ms[0] == pytest.approx(3.0 + 14.0)
    # a lone request waits max_wait_ms, then goes alone
    res = batching.simulate(np.array([0.0]), svc, max_batch_size=8, max_wait_ms=5.0)
    assert res.latencies_ms[0] == pytest.approx(5.0 + 11.0)
    with pytest.raises(ValueError):
        batching.simulate(np.array([2.0, 1.0]), svc)


def test_summary_of_a_known_run():
    res = batching.SimResult(latencies_ms=np.arange(1.0, 101.0), batch_sizes=np.array([1, 3]), span_ms=50.0)
    assert res.p50_ms == pytest.approx(50.5) and res.p99_ms == pytest.approx(99.01)
    assert res.throughput == pytest.approx(100 / 0.05) and res.mean_batch == 2.0
    # the span runs from the first arrival to the last completion, wherever the clock started
    late = batching.simulate(np.array([1000.0, 1001.0]), batching.service_time_fn(_sweep()), max_batch_size=1)
    assert late.span_ms == pytest.approx(22.0) and late.throughput == pytest.approx(2 / 0.022)  # 1000 to 1022 ms


def test_capacity_is_requests_per_second_at_the_batch_size():
    svc = batching.service_time_fn(_sweep())
    assert batching.capacity(svc, 1) == pytest.approx(1000.0 / 11.0)
    assert batching.capacity(svc, 16) == pytest.approx(16 * 1000.0 / 26.0)


def _rate_sweep(rates, svc, *, max_batch_size, max_wait_ms, n_requests):
    """The loop lesson 03 writes: each rate's arrivals through both policies, one row each."""
    rows = []
    for rate in rates:
        arrivals = batching.poisson_arrivals(rate, n_requests, seed=0)
        for policy, (b, w) in {"no batching": (1, 0.0), "dynamic": (max_batch_size, max_wait_ms)}.items():
            res = batching.simulate(arrivals, svc, max_batch_size=b, max_wait_ms=w)
            rows.append(
                {"rate": float(rate), "policy": policy, **res.summary(), "overloaded": rate > batching.capacity(svc, b)}
            )
    return pd.DataFrame(rows)


def test_batching_beats_none_at_saturation():
    svc = batching.service_time_fn(_sweep())
    cap1 = batching.capacity(svc, 1)
    df = _rate_sweep([0.5 * cap1, 2 * cap1], svc, max_batch_size=16, max_wait_ms=5.0, n_requests=1000)
    assert set(df.columns) >= {"rate", "policy", "p50_ms", "p99_ms", "throughput", "mean_batch", "overloaded"}
    high = df[df["rate"] == df["rate"].max()]
    high = high.set_index(high["policy"].str.startswith("dynamic"))
    assert high.loc[True, "throughput"] > 1.5 * high.loc[False, "throughput"]
    assert high.loc[True, "p99_ms"] < high.loc[False, "p99_ms"]
    assert bool(high.loc[False, "overloaded"]) and not bool(high.loc[True, "overloaded"])
    fig = batching.plot_rate_sweep(df)
    assert len(fig.axes) == 2


def test_service_time_fn_sorts_the_sweep_and_scales_below_its_smallest_batch():
    sweep = pd.DataFrame({"batch_size": [8, 2, 4], "median_ms": [18.0, 12.0, 14.0]})  # not in batch order
    svc = batching.service_time_fn(sweep)
    assert svc.max_batch == 8
    assert svc(1) == pytest.approx(6.0)  # below the smallest measured batch: its time, per item (12 ms for 2)
    assert svc(2) == pytest.approx(12.0) and svc(3) == pytest.approx(13.0) and svc(6) == pytest.approx(16.0)
    assert svc(8) == pytest.approx(18.0)
