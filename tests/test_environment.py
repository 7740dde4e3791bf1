"""environment.yml (conda) and pyproject.toml must agree; conda is not installable here, so parse and compare."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~\[;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    conda = [d for d in deps if isinstance(d, str)]
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    assert "conda-forge" in env["channels"]

    py = next(d for d in conda if d.startswith("python"))
    minimum = re.search(r">=\s*(\d+\.\d+)", project["requires-python"]).group(1)
    assert tuple(map(int, py.split("=")[1].split("."))) >= tuple(map(int, minimum.split("."))), py

    pins = {_name(r): r.replace(" ", "") for r in project["dependencies"]}
    for req in pip:
        if req.startswith("-e"):
            extras = re.search(r"\[(.*)\]", req).group(1).split(",")
            assert set(extras) <= set(project["optional-dependencies"]), extras
            assert "gpu" in extras
            continue
        assert pins.get(_name(req)) == req.replace(" ", ""), f"{req} differs from pyproject ({pins.get(_name(req))})"

    all_pyproject = set(pins) | {_name(r) for extra in project["optional-dependencies"].values() for r in extra}
    for pkg in conda:
        name = _name(pkg)
        if name in {"python", "pip", "pycuda"}:
            continue  # pycuda: built by conda-forge; pip builds it only where CUDA headers exist
        assert name in all_pyproject, f"conda package {name} is not in pyproject.toml"
