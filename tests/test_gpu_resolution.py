"""The GPU install resolves: pip's resolver, in dry-run mode, for the Linux x86_64 GPU set.

`make lab` / `make test` on a machine with an NVIDIA GPU install ``.[gpu,dev]`` beside the pinned torch. If
two pins clash (as ``nvidia-modelopt[onnx]`` does with ``onnxruntime-gpu==1.31``), pip ends in
ResolutionImpossible and the course never starts there. This test runs the same resolution on any machine:
``pip install --dry-run --only-binary=:all: --platform manylinux_*_x86_64 --python-version 3.11/3.12``
over every pin of pyproject.toml (base dependencies, the ``gpu`` and ``dev`` extras) and the Makefile's torch
pins. It needs the package index; it skips, saying why, only when the index cannot be reached.

Packages that ship only as source (their install step downloads NVIDIA's libraries, so pip cannot resolve
them for another platform) are named in SOURCE_ONLY: a metadata-only placeholder wheel with the same name,
version and requirements stands in for each, so every other pin is still checked against them.

The resolution takes minutes, so a pass is cached in ``build/gpu-resolution-cache.json`` under a digest of what
it depends on (pyproject's dependency lists, the Makefile's tritonclient pin, the Python version running the
tests, the target Python, SOURCE_ONLY and PLATFORMS): while the digest is unchanged, the check skips and says
how old the cached pass is; any change of the pins reruns it. ``COURSE_RECHECK_RESOLUTION=1`` forces a rerun.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# name -> (version, requirements), as the source distribution's PKG-INFO declares them.
SOURCE_ONLY = {
    "tensorrt-cu13": ("11.1.0.106", ["tensorrt-cu13-libs==11.1.0.106", "tensorrt-cu13-bindings==11.1.0.106"]),
    "tensorrt-cu13-libs": ("11.1.0.106", []),  # its build downloads libnvinfer from NVIDIA's index
    # Not in the course's set; ModelOpt's [onnx] extra needs it (see test_resolution_catches_a_clash).
    "cppimport": ("26.4.17", ["mako", "pybind11", "filelock", "setuptools"]),
}
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(5, 40)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]
CACHE = ROOT / "build" / "gpu-resolution-cache.json"
RECHECK_VAR = "COURSE_RECHECK_RESOLUTION"


def pins_digest(target: str, pyproject: Path = ROOT / "pyproject.toml", makefile: Path = ROOT / "Makefile") -> str:
    """A digest of everything a resolution result depends on; a different digest means: check again."""
    project = tomllib.loads(pyproject.read_text())["project"]
    triton = re.findall(r"tritonclient==[\w.]+", makefile.read_text())
    facts = {
        "dependencies": project.get("dependencies", []),
        "extras": project.get("optional-dependencies", {}),
        "tritonclient": sorted(set(triton)),
        "python": list(sys.version_info[:2]),
        "target": target,
        "source_only": SOURCE_ONLY,
        "platforms": PLATFORMS,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def cached_pass(name: str, digest: str, cache: Path = CACHE, now: float | None = None) -> str | None:
    """Why ``name`` can skip (a cached pass of the same digest, with its age), or None: run it."""
    if os.environ.get(RECHECK_VAR, "").strip() not in ("", "0"):
        return None
    try:
        entry = json.loads(cache.read_text()).get(name)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(entry, dict) or entry.get("digest") != digest:
        return None
    age = max(0.0, (time.time() if now is None else now) - float(entry.get("passed_at", 0)))
    return (
        f"{name} passed {_age(age)} ago with the same pins (digest {digest}, cached in {cache.name}); "
        f"it reruns when the pins change, or with {RECHECK_VAR}=1"
    )


def store_pass(name: str, digest: str, cache: Path = CACHE, now: float | None = None) -> None:
    """Record that ``name`` passed with these pins (the other entries are kept)."""
    try:
        data = json.loads(cache.read_text())
        data = data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        data = {}
    data[name] = {"digest": digest, "passed_at": time.time() if now is None else now}
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, cache)


def makefile_pins() -> list[str]:
    """The torch/torchvision pins the Makefile installs (read from pyproject.toml: one place)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in deps if re.match(r"torch(vision)?==", d)]


def gpu_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """Every requirement of the GPU install: base dependencies and the gpu and dev extras."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    return list(project["dependencies"]) + list(extras["gpu"]) + list(extras["dev"])


def placeholder_wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """Write a metadata-only wheel ``name==version`` declaring ``requires`` (a stand-in for a source package)."""
    dist = name.replace("-", "_")
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    wheel = "Wheel-Version: 1.0\nGenerator: course-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{info}/METADATA", meta)
        zf.writestr(f"{info}/WHEEL", wheel)
        zf.writestr(f"{info}/RECORD", "")
    return path


def resolve(requirements: list[str], python: str, tmp: Path) -> subprocess.CompletedProcess:
    """pip's resolver in dry-run mode for Linux x86_64 and CPython ``python`` (binary wheels only)."""
    links = tmp / "placeholders"
    links.mkdir(exist_ok=True)
    for name, (version, requires) in SOURCE_ONLY.items():
        placeholder_wheel(links, name, version, requires)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        python,
        "--target",
        str(tmp / "target"),
        "--find-links",
        str(links),
        "--report",
        str(tmp / f"report-{python}.json"),
    ]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    return subprocess.run(cmd + requirements, capture_output=True, text=True, timeout=600)


def _index_reachable() -> str | None:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", "/tmp/_course_probe", "six==1.16.0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return None if out.returncode == 0 else out.stderr.strip().splitlines()[-1:]


def test_makefile_installs_the_pyproject_pins():
    makefile = (ROOT / "Makefile").read_text()
    assert "torch==" not in makefile, "the torch pins live in pyproject.toml only; the Makefile reads them from there"
    assert sorted(makefile_pins()) == ["torch==2.14.1", "torchvision==0.29.1"]


def test_placeholder_wheel_is_a_wheel(tmp_path):
    path = placeholder_wheel(tmp_path, "demo-pkg", "1.0", ["six"])
    names = zipfile.ZipFile(path).namelist()
    assert "demo_pkg-1.0.dist-info/METADATA" in names
    assert "Requires-Dist: six" in zipfile.ZipFile(path).read("demo_pkg-1.0.dist-info/METADATA").decode()


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_gpu_set_resolves(python, tmp_path):
    name, digest = f"gpu_set_resolves[{python}]", pins_digest(python)
    cached = cached_pass(name, digest)
    if cached:
        pytest.skip(cached)
    why = _index_reachable()
    if why is not None:
        pytest.skip(f"the package index cannot be reached, so the GPU resolution was not checked: {why}")
    result = resolve(gpu_requirements(), python, tmp_path)
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
    assert "ResolutionImpossible" not in result.stderr, f"the GPU set does not resolve for Python {python}:\n{tail}"
    assert result.returncode == 0, f"pip's dry run failed for Python {python}:\n{tail}"
    store_pass(name, digest)


def test_resolution_catches_a_clash(tmp_path):
    """The check can fail: ModelOpt's [onnx] extra pins onnxruntime-gpu~=1.24 beside our 1.31."""
    name, digest = "resolution_catches_a_clash", pins_digest("3.12")
    cached = cached_pass(name, digest)
    if cached:
        pytest.skip(cached)
    if _index_reachable() is not None:
        pytest.skip("the package index cannot be reached")
    reqs = [r for r in gpu_requirements() if not r.startswith("nvidia-modelopt")] + ["nvidia-modelopt[onnx]==0.47.*"]
    result = resolve(reqs, "3.12", tmp_path)
    assert result.returncode != 0
    assert "ResolutionImpossible" in result.stderr or "conflict" in result.stderr.lower()
    store_pass(name, digest)


def test_resolution_cache_skips_only_while_the_pins_are_unchanged(tmp_path, monkeypatch):
    monkeypatch.delenv(RECHECK_VAR, raising=False)
    project = tmp_path / "pyproject.toml"
    makefile = tmp_path / "Makefile"
    project.write_text(
        '[project]\nname = "x"\ndependencies = ["numpy==2.0.0"]\n[project.optional-dependencies]\ngpu = ["a==1"]\n'
    )
    makefile.write_text("\tpip install tritonclient==2.73.0\n")
    cache = tmp_path / "build" / "cache.json"
    d1 = pins_digest("3.12", project, makefile)
    assert d1 == pins_digest("3.12", project, makefile), "the digest must be deterministic"
    assert d1 != pins_digest("3.11", project, makefile), "each target Python is checked on its own"
    assert cached_pass("t", d1, cache) is None, "no cache yet: run the check"
    store_pass("t", d1, cache, now=1000.0)
    store_pass("other", "ffff", cache, now=1000.0)
    why = cached_pass("t", d1, cache, now=1000.0 + 3 * 3600)
    assert why is not None and "3.0 h ago" in why and d1 in why, why
    assert cached_pass("t", d1, cache, now=1000.0 + 90).startswith("t passed 90 s ago")
    monkeypatch.setenv(RECHECK_VAR, "1")
    assert cached_pass("t", d1, cache, now=1000.0) is None, "the recheck switch forces a rerun"
    monkeypatch.delenv(RECHECK_VAR)
    # any pin change gives a new digest, so the cached pass no longer applies
    for path, old, new in [
        (project, "numpy==2.0.0", "numpy==2.0.1"),
        (project, "a==1", "a==2"),
        (makefile, "2.73.0", "2.74.0"),
    ]:
        path.write_text(path.read_text().replace(old, new))
        d2 = pins_digest("3.12", project, makefile)
        assert d2 != d1, f"changing {old} -> {new} must change the digest"
        assert cached_pass("t", d2, cache) is None
        d1 = d2
    cache.write_text("not json")
    assert cached_pass("t", d1, cache) is None, "an unreadable cache means: run the check"
    store_pass("t", d1, cache, now=5.0)
    assert json.loads(cache.read_text())["t"] == {"digest": d1, "passed_at": 5.0}
