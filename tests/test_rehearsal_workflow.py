"""A dry run of the GPU workflow (.github/workflows/gpu.yml): every command it runs names things that exist.

The workflow can only run on a self-hosted CUDA runner; here its YAML is parsed and each step's command is
checked: make targets exist in the Makefile, ``python -m`` modules exist and accept the flags given, pytest's
plugins and paths exist, the environment switches are ones the course reads, and the notebooks step really
runs nbmake in strict GPU mode at full size.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = yaml.safe_load((ROOT / ".github" / "workflows" / "gpu.yml").read_text())
STEPS = WORKFLOW["jobs"]["gpu-test"]["steps"]
MAKE_TARGETS = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))


def _runs():
    return [(s, s["run"]) for s in STEPS if "run" in s]


def test_make_targets_exist():
    used = {t for _, cmd in _runs() for t in re.findall(r"\bmake ([\w-]+)", cmd)}
    assert used and used <= MAKE_TARGETS, f"make targets missing from the Makefile: {sorted(used - MAKE_TARGETS)}"


def test_notebooks_run_through_nbmake_strict_and_full_size():
    step = next(s for s, cmd in _runs() if "--nbmake" in cmd)
    assert step["env"]["COURSE_STRICT_GPU"] == "1" and step["env"].get("COURSE_SMOKE", "0") == "0"
    args = shlex.split(step["run"])
    assert (ROOT / args[0]).as_posix().endswith(".venv/bin/python") and args[1:3] == ["-m", "pytest"]
    assert "notebooks" in args and (ROOT / "notebooks").is_dir() and list((ROOT / "notebooks").glob("*.ipynb"))
    import importlib.util

    assert importlib.util.find_spec("nbmake") is not None
    out = subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, cwd=ROOT)
    for flag in (a.split("=")[0] for a in args if a.startswith("--")):
        assert flag in out.stdout, f"pytest does not know {flag}"


def test_environment_switches_are_read_by_the_course(monkeypatch):
    from course_utils.supply import modes

    readers = {"COURSE_STRICT_GPU": modes.is_strict_gpu, "COURSE_SMOKE": modes.is_smoke}
    for step in STEPS:
        for name, value in (step.get("env") or {}).items():
            if name == "COURSE_RESULTS_DIR":
                continue
            assert name in readers, f"the workflow sets {name}, which the course does not read"
            monkeypatch.setenv(name, value)
            assert readers[name]() is (value == "1")  # parsed strictly: a bad value would raise here


def test_make_gpu_targets_call_gpu_check_with_known_flags():
    text = (ROOT / "Makefile").read_text()
    help_text = subprocess.run(
        [sys.executable, "-m", "scripts.gpu_check", "--help"], capture_output=True, text=True, cwd=ROOT
    ).stdout
    for target in ("gpu-test", "gpu-check"):
        recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", text, re.MULTILINE).group(1)
        assert "scripts.gpu_check" in recipe
        for flag in re.findall(r"(--[\w-]+)", recipe):
            assert flag in help_text, f"make {target} passes {flag}, which scripts/gpu_check.py does not accept"


def test_artifacts_name_what_the_steps_write():
    upload = next(s for s in STEPS if s.get("uses", "").startswith("actions/upload-artifact"))
    paths = upload["with"]["path"]
    assert "build/gpu-check/" in paths and "data/reference/*.env.json" in paths and "build/gpu-notebooks/" in paths
