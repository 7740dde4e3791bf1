"""Unit tests for course_utils.techniques.profiling: the trace folder, operator call counts, the Nsight command."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from course_utils.techniques import profiling


@pytest.fixture(autouse=True)
def _results(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))


def test_traces_go_to_the_results_folder(tmp_path):
    assert profiling.traces_dir() == tmp_path / "traces" and (tmp_path / "traces").is_dir()


def test_op_calls_counts_operators_not_ranges():
    x = torch.randn(8, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("stage"):
            for _ in range(7):
                x = x + 1
            x.sum().item()
    assert profiling.op_calls(prof, "aten::add") == 7.0
    assert profiling.op_calls(prof, "aten::item") == 1.0
    assert profiling.op_calls(prof, "stage") == 0.0, "a record_function range is not an operator"
    assert profiling.op_calls(prof) >= 9.0


def test_nsys_command_names_traces(tmp_path):
    cmd = profiling.nsys_command("pipe.py")
    assert cmd == (
        "nsys profile -t cuda,nvtx,osrt --cuda-memory-usage=true --force-overwrite=true "
        f"-o {tmp_path / 'traces' / 'pipe'} python pipe.py"
    )
