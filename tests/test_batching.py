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


# --- service_bounds: the service times' intervals, for a simulation that carries them -------------------------


def _timed_sweep(times: dict[int, list[float]]) -> pd.DataFrame:
    df = pd.DataFrame({"batch_size": list(times), "median_ms": [float(np.median(t)) for t in times.values()]})
    df.attrs["times_ms"] = times
    return df


def test_service_bounds_are_each_sizes_median_interval_at_the_bonferroni_level():
    rng = np.random.default_rng(0)
    times = {b: list(10.0 + b + rng.normal(0, 0.5, size=60)) for b in (1, 2, 4, 8, 16)}
    fast, slow, joint = batching.service_bounds(_timed_sweep(times), max_batch_size=4)
    # batches 1, 2, 4 are needed (and none above: 4 was measured): each at 1 - 0.05/3
    from course_utils.measuring.intervals import median_interval

    for b in (1, 2, 4):
        low, high, conf = median_interval(np.asarray(times[b]), 1 - 0.05 / 3)
        assert (fast(b), slow(b)) == (pytest.approx(low), pytest.approx(high))
        assert conf == pytest.approx(1 - 0.05 / 3)
    assert joint == pytest.approx(0.95)
    assert fast(3) < slow(3)  # interpolated between the bounds of 2 and 4
    with pytest.raises(ValueError, match="largest measured batch"):
        slow(8)  # beyond the needed sizes: not bounded


def test_service_bounds_with_few_calls_say_their_lower_confidence():
    times = {1: [1.0, 1.1, 1.2], 2: [2.0, 2.1, 2.2]}  # 3 calls: no 97.5% interval, the range at 75%
    fast, slow, joint = batching.service_bounds(_timed_sweep(times), max_batch_size=2)
    assert (fast(1), slow(1), fast(2), slow(2)) == (1.0, 1.2, 2.0, 2.2)
    assert joint == pytest.approx(0.5)  # 1 - 2 * 0.25


def test_service_bounds_needs_the_per_call_times():
    df = pd.DataFrame({"batch_size": [1, 2], "median_ms": [1.0, 2.0]})
    with pytest.raises(ValueError, match=r"per-call times of batches \[1, 2\]"):
        batching.service_bounds(df, max_batch_size=2)


# --- lesson 03's choice cell, fed the degenerate sweeps a busy machine gives --------------------------------


@pytest.fixture(scope="module")
def l03():
    import torch

    import course_utils as cu
    from tests.gpu_contract.lesson_code import lesson_namespace

    return lesson_namespace("03", torch=torch, pd=pd, cu=cu)


def _row(**kw):
    base = dict(model="m", knee=1, max_throughput=100.0, budget_ms=4.0, best_batch=1, best_p90_ms=1.0, top_batch=1)
    return next(pd.DataFrame([{**base, **kw}]).itertuples())


def _choice_sweep(ms: list[float], p90: list[float]) -> pd.DataFrame:
    b = [1, 2, 4, 8][: len(ms)]
    return pd.DataFrame({"batch_size": b, "median_ms": ms, "p90_ms": p90,
                         "throughput": [n * 1e3 / t for n, t in zip(b, ms, strict=True)]})  # fmt: skip


def test_l03_batch_one_winning_everything_leaves_nothing_to_compare(l03):
    # batch 1 has the top throughput (every larger batch took longer per item) and fits the budget
    r = l03["batch_choice"]("m", _choice_sweep([1.0, 2.5, 5.0, 12.0], [1.1, 2.6, 5.2, 13.0]), 4.4)
    assert (r["top_batch"], r["best_batch"], r["knee"]) == (1, 1, 1)
    row = _row(**r)
    assert l03["batches_to_compare"](row) == [1]
    assert l03["compare_batches"](lambda x: x, lambda b: None, [1], "cpu") is None  # no cu.compare, no error
    line = l03["choice_line"](row, None)
    assert line.startswith("m: batch 1 had the top throughput of the sweep and is the best under 4.40 ms: no larger")
    assert "run the sweep again before concluding" in line
    assert l03["top_batch_line"](row, None) == (
        "1. m: batch 1 had the top throughput of the sweep, so nothing was timed against it in rounds: nothing to "
        "conclude about batching from this run."
    )


def test_l03_choice_of_an_ordinary_sweep(l03):
    r = l03["batch_choice"]("m", _choice_sweep([1.0, 1.2, 1.5, 3.0], [1.1, 1.3, 1.6, 3.2]), 2.0)
    assert (r["knee"], r["best_batch"], r["top_batch"]) == (4, 4, 4)  # 8: 2667/s < 0.9 * 2667? equal: knee 4
    r = l03["batch_choice"]("m", _choice_sweep([1.0, 1.2, 1.5, 2.0], [1.1, 1.3, 1.6, 2.2]), 2.0)
    assert (r["best_batch"], r["top_batch"]) == (4, 8)  # batch 8 is faster per item but its p90 is over budget
    assert l03["batches_to_compare"](_row(**r)) == [1, 4, 8]
    none_fit = l03["batch_choice"]("m", _choice_sweep([1.0, 1.2], [1.1, 1.3]), 0.5)
    assert none_fit["best_batch"] is None
    row = _row(**{**none_fit, "best_batch": float("nan")})
    assert l03["batches_to_compare"](row) == [1, 2]
    assert l03["choice_line"](row, None) == (
        "m: no batch size meets 0.50 ms at p90; raise the budget or use a faster model."
    )


def test_l03_lines_phrase_the_interval(l03):
    from course_utils.measuring.comparing import Comparison
    from course_utils.measuring.intervals import Ratio

    def gains(low, high):
        r = Ratio("batch 8", "batch 1", (low + high) / 2, low, high, rounds=[1.0] * 9)
        return Comparison("batch 1", "", "time", {"batch 1": [1.0], "batch 8": [1.0]}, {}, {"batch 8": r})

    row = _row(knee=8, best_batch=8, top_batch=8, best_p90_ms=3.0)
    assert l03["choice_line"](row, gains(2.5, 3.5)) == (
        "m: knee at batch 8; under 4.00 ms the best batch is 8 (p90 3.00 ms): batch 8 is 3.00x (95% CI 2.50-3.50) "
        "the throughput of batch 1."
    )
    assert l03["top_batch_line"](row, gains(2.0, 3.5)).endswith("; batching pays a lot here.")
    assert l03["top_batch_line"](row, gains(1.9, 3.5)).endswith("; not shown to double it here.")
    assert l03["top_batch_line"](row, gains(1.2, 1.99)).endswith("; little to gain here: a larger batch mostly adds "
                                                                  "latency.")  # fmt: skip
