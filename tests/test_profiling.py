"""Unit tests for course_utils.profiling (torch.profiler helpers)."""

from __future__ import annotations

import pytest
import torch

from course_utils import profiling


@pytest.fixture(autouse=True)
def _results(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))


def _work():
    x = torch.randn(64, 64)
    with profiling.annotate("slow"):
        for _ in range(200):
            x = x + 1  # many tiny ops
    with profiling.annotate("fast"):
        _ = x.sum().item()


def test_activities_cpu():
    assert profiling.activities("cpu") == [torch.profiler.ProfilerActivity.CPU]


def test_profile_exports_trace_in_results(tmp_path):
    res = profiling.profile(_work, name="unit test", wait=0, warmup=1, active=2)
    assert res.trace_path.parent == tmp_path / "traces"
    assert res.trace_bytes > 0
    assert "aten::add" in res.table()


def test_top_ops_stage_times_and_hotspot():
    res = profiling.profile(_work, name="unit", wait=0, warmup=1, active=2)
    ops = profiling.top_ops(res, n=50, sort_by="calls")
    assert {"name", "calls", "self_cpu_ms", "self_cpu_pct", "us_per_call"} <= set(ops.columns)
    assert ops.loc[ops["name"] == "aten::add", "calls"].item() == pytest.approx(200)
    assert profiling.op_calls(res, "aten::add") == pytest.approx(200)
    assert profiling.op_calls(res) >= 201
    stages = profiling.stage_times(res, ["slow", "fast"])
    assert list(stages["stage"]) == ["slow", "fast"] or set(stages["stage"]) == {"slow", "fast"}
    assert stages["share"].sum() == pytest.approx(1.0)
    name, share = profiling.hotspot(stages)
    assert name == "slow" and 0.5 < share <= 1.0
    with pytest.raises(ValueError, match="annotate"):
        profiling.stage_times(res, ["missing"])
    with pytest.raises(ValueError):
        profiling.top_ops(res, sort_by="nope")
    with pytest.raises(ValueError):
        profiling.hotspot(stages.iloc[0:0])


def test_nsys_command_names_traces():
    cmd = profiling.nsys_command("pipe.py")
    assert cmd.startswith("nsys profile -t cuda,nvtx,osrt") and cmd.endswith("python pipe.py")
