"""The conda files, pyproject.toml and the Makefile agree on pins; conda is not installable here, so parse.

environment.yml is the CPU path (a laptop or a Mac), environment-gpu.yml the NVIDIA path.
"""

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~\[;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def check_environment(path: Path, expected_extras: set[str]) -> list[str]:
    """Disagreements between a conda environment file and pyproject.toml (empty when they agree)."""
    env = yaml.safe_load(path.read_text())
    deps = env["dependencies"]
    conda = [d for d in deps if isinstance(d, str)]
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    problems = [] if "conda-forge" in env["channels"] else ["channel conda-forge missing"]
    py = next(d for d in conda if d.startswith("python"))
    minimum = re.search(r">=\s*(\d+\.\d+)", PROJECT["requires-python"]).group(1)
    if tuple(map(int, py.split("=")[1].split("."))) < tuple(map(int, minimum.split("."))):
        problems.append(f"{py} is below requires-python {minimum}")
    pins = {_name(r): r.replace(" ", "") for r in PROJECT["dependencies"]}
    for req in pip:
        if req.startswith("-e"):
            extras = set(re.search(r"\[(.*)\]", req).group(1).split(","))
            if extras != expected_extras:
                problems.append(f"{path.name} installs extras {sorted(extras)}, expected {sorted(expected_extras)}")
            continue
        if pins.get(_name(req)) != req.replace(" ", ""):
            problems.append(f"{req} differs from pyproject ({pins.get(_name(req))})")
    known = set(pins) | {_name(r) for extra in PROJECT["optional-dependencies"].values() for r in extra}
    for pkg in conda:
        if _name(pkg) not in known | {"python", "pip", "pycuda"}:  # pycuda: built by conda-forge
            problems.append(f"conda package {_name(pkg)} is not in pyproject.toml")
    return problems


@pytest.mark.parametrize(
    ("name", "extras"), [("environment.yml", {"cpu", "dev"}), ("environment-gpu.yml", {"gpu", "dev"})]
)
def test_environment_files_match_pyproject(name, extras):
    assert check_environment(ROOT / name, extras) == []


def test_check_environment_finds_a_wrong_pin(tmp_path):
    bad = tmp_path / "env.yml"
    bad.write_text((ROOT / "environment.yml").read_text().replace("torch==2.14.1", "torch==2.13.0"))
    assert any("torch==2.13.0 differs" in p for p in check_environment(bad, {"cpu", "dev"}))
    assert any("extras" in p for p in check_environment(ROOT / "environment.yml", {"gpu", "dev"}))


def test_makefile_installs_the_same_torch_pins():
    """The Makefile reads its torch pins from pyproject.toml (one place); check what it would install."""
    out = subprocess.run(["make", "-s", "-p", "-n", "-f", "Makefile"], cwd=ROOT, capture_output=True, text=True)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("TORCH_PINS :="))
    makefile = set(line.split(":=", 1)[1].split())
    assert makefile == {r for r in PROJECT["dependencies"] if re.match(r"torch(vision)?==", r)}
    assert makefile == {"torch==2.14.1", "torchvision==0.29.1"}
