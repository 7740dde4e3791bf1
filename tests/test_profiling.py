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


def test_op_calls_leaves_out_the_schedule_s_profiler_steps():
    from torch.profiler import schedule

    x = torch.randn(4, 4)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3, repeat=1)) as prof:
        for _ in range(6):
            for _ in range(3):
                x = x * 2
            prof.step()
    steps = [e.key for e in prof.key_averages() if e.key.startswith("ProfilerStep")]
    assert steps, "the schedule records ProfilerStep# rows"
    assert all(profiling.op_calls(prof, key) == 0.0 for key in steps), "a ProfilerStep# row is not an operator"
    assert profiling.op_calls(prof, "aten::mul") == 9.0, "3 multiplications in each of the 3 active steps"


def test_op_calls_sums_the_counts_of_operator_rows_only():
    """Rows as key_averages() gives them; some torch versions do not mark ProfilerStep# as a user annotation."""

    class Row:
        def __init__(self, key: str, count: int, user: bool = False) -> None:
            self.key, self.count, self.is_user_annotation = key, count, user

    class Prof:
        def key_averages(self):
            return [Row("ProfilerStep#4", 1), Row("ProfilerStep*", 3), Row("stage", 2, user=True),
                    Row("aten::add", 7), Row("aten::item", 1), Row("aten::add_", 5)]  # fmt: skip

    assert profiling.op_calls(Prof()) == 13.0
    assert profiling.op_calls(Prof(), "aten::add") == 7.0
    assert profiling.op_calls(Prof(), "ProfilerStep#4") == 0.0 and profiling.op_calls(Prof(), "stage") == 0.0
