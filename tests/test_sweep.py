import pandas as pd
import pytest
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


def _flaky_model(fail_at: int, exc: BaseException):
    lin = torch.nn.Linear(8, 2)

    def model(x):
        if x.shape[0] == fail_at:
            raise exc
        return lin(x)

    return model


@pytest.mark.parametrize("exc", [ValueError("shape bug"), KeyboardInterrupt()])
def test_non_oom_error_or_ctrl_c_keeps_the_measured_rows(exc):
    with pytest.raises(type(exc)) as info:
        sweep.batch_sweep(_flaky_model(8, exc), lambda b: torch.randn(b, 8), [1, 2, 4, 8, 16], device="cpu",
                          progress=False, min_repeats=3, warmup=1, warn_spread=False)  # fmt: skip
    kept = info.value.partial_rows
    assert list(kept["batch_size"]) == [1, 2, 4] and kept["median_ms"].notna().all()
    assert sweep.last_partial is kept
    assert any("3 row(s) measured before it are kept" in n for n in info.value.__notes__)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: "
                     "you tried to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"),
        MemoryError(),
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    ],
)  # fmt: skip
def test_cpu_allocation_failure_counts_as_out_of_memory(exc, capsys):
    df = sweep.batch_sweep(_flaky_model(8, exc), lambda b: torch.randn(b, 8), [1, 4, 8, 16], device="cpu",
                           progress=False, min_repeats=3, warmup=1, warn_spread=False)  # fmt: skip
    assert list(df["batch_size"]) == [1, 4] and df.attrs["oom_at"] == 8 and df.attrs["max_fit"] == 4
    assert "Out of memory at batch_size=8" in capsys.readouterr().out
    assert sweep.last_partial is None


def test_cap_below_the_first_batch_gives_the_expected_columns():
    df = sweep.batch_sweep(torch.nn.Linear(1024, 8), lambda b: torch.randn(b, 1024), [64, 128], device="cpu",
                           memory_limit_mb=0.01, progress=False)  # fmt: skip
    assert df.empty and list(df.columns) == sweep.SWEEP_COLUMNS
    assert df.attrs["oom_at"] == 64 and df.attrs["max_fit"] is None
    assert df["throughput"].max() != df["throughput"].max()  # NaN, not KeyError
    assert sweep.best_under_budget(df, 10.0) is None
    empty = sweep.sweep(lambda v: (_ for _ in ()).throw(MemoryError()), [1], name="n", progress=False)
    assert list(empty.columns) == ["n"]


def test_knee_of_an_empty_sweep_names_the_fix():
    from course_utils.errors import BadArgumentError

    empty = pd.DataFrame(columns=sweep.SWEEP_COLUMNS)
    with pytest.raises(BadArgumentError, match="smaller batch size"):
        sweep.knee(empty)
