import pandas as pd
import torch

from course_utils import sweep


def test_batch_sweep_columns_and_throughput():
    model = torch.nn.Linear(32, 8)
    df = sweep.batch_sweep(model, lambda b: torch.randn(b, 32), [1, 4, 16], device="cpu", progress=False)
    assert list(df["batch_size"]) == [1, 4, 16]
    assert {"median_ms", "p90_ms", "throughput", "ms_per_item"} <= set(df.columns)
    assert df.attrs["oom_at"] is None and df.attrs["max_fit"] == 16


def test_batch_sweep_stops_cleanly_at_memory_limit(capsys):
    model = torch.nn.Linear(1024, 8)
    df = sweep.batch_sweep(
        model, lambda b: torch.randn(b, 1024), [1, 64, 1024, 4096], device="cpu", memory_limit_mb=1.0,
        progress=False,
    )  # fmt: skip
    assert list(df["batch_size"]) == [1, 64] and df.attrs["oom_at"] == 1024 and df.attrs["max_fit"] == 64
    assert "Out of memory at batch_size=1024" in capsys.readouterr().out


def test_general_sweep_propagates_other_errors():
    def run(v):
        if v == 2:
            raise ValueError("boom")
        return {"y": v}

    try:
        sweep.sweep(run, [1, 2], progress=False)
    except ValueError as e:
        assert "boom" in str(e)
    else:
        raise AssertionError("expected ValueError")


def test_knee_and_budget():
    df = pd.DataFrame({"batch_size": [1, 2, 4, 8, 16], "throughput": [10, 19, 36, 38, 39],
                       "p90_ms": [1, 1.1, 1.2, 2.2, 4.1]})  # fmt: skip
    assert sweep.knee(df) == 4
    assert sweep.best_under_budget(df, 2.5)["batch_size"] == 8
    assert sweep.best_under_budget(df, 0.5) is None
