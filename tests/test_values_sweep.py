"""sweep.batch_sweep pinned on a model of known cost: per-item time is the median divided by the batch,
throughput the batch over the median, and the model runs under inference_mode."""

from __future__ import annotations

import time

import pytest
import torch

from course_utils import sweep

COST_MS = 3.0


def test_batch_sweep_columns_on_a_known_cost_model():
    seen = []

    def model(x: torch.Tensor) -> torch.Tensor:
        seen.append((x.shape[0], torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        time.sleep(COST_MS / 1000)
        return x * 2

    df = sweep.batch_sweep(model, lambda b: torch.ones(b, 4), [1, 4, 16], device="cpu", progress=False,
                           warmup=1, min_repeats=5, min_time_s=0.0, warn_spread=False)  # fmt: skip
    assert list(df.columns) == sweep.SWEEP_COLUMNS and list(df["batch_size"]) == [1, 4, 16]
    assert all(mode and not grad for _, mode, grad in seen), "every call must run under torch.inference_mode()"
    assert {b for b, _, _ in seen} == {1, 4, 16}
    for _, row in df.iterrows():
        b = row["batch_size"]
        assert row["ms_per_item"] == pytest.approx(row["median_ms"] / b, rel=1e-12), "ms_per_item is median / batch"
        assert row["throughput"] == pytest.approx(b / (row["median_ms"] / 1000), rel=1e-12)
        assert row["median_ms"] >= COST_MS * 0.95, row["median_ms"]  # a loaded machine only adds time
        assert row["p10_ms"] <= row["median_ms"] <= row["p90_ms"] and row["n"] == 5
    assert df.attrs["oom_at"] is None and df.attrs["max_fit"] == 16


def test_oom_keeps_the_rows_that_fit():
    df = sweep.batch_sweep(lambda x: x, lambda b: torch.ones(b, 1024, 256), [1, 2, 8, 16], device="cpu",
                           memory_limit_mb=2.5, progress=False, warmup=0, min_repeats=2, min_time_s=0.0,
                           warn_spread=False)  # fmt: skip
    assert list(df["batch_size"]) == [1, 2] and df.attrs["oom_at"] == 8 and df.attrs["max_fit"] == 2


def test_knee_and_budget_on_known_rows():
    import pandas as pd

    df = pd.DataFrame({"batch_size": [1, 2, 4, 8], "throughput": [100.0, 180.0, 300.0, 320.0],
                       "p90_ms": [1.0, 2.0, 5.0, 9.0]})  # fmt: skip
    assert sweep.knee(df) == 4  # 300 >= 0.9 * 320, 180 is not
    assert sweep.knee(df, fraction=0.5) == 2
    assert sweep.best_under_budget(df, 5.0)["batch_size"] == 4
    assert sweep.best_under_budget(df, 0.5) is None
