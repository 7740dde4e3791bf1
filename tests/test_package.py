"""Every course_utils module is reachable as cu.<name>, loaded lazily."""

import subprocess
import sys
from pathlib import Path

import course_utils as cu


def test_every_module_is_listed():
    """Every module of every room folder (and each room's subpackage) is reachable as cu.<name>."""
    root = Path(cu.__file__).parent
    found = {}
    for room in (d for d in root.iterdir() if d.is_dir() and (d / "__init__.py").exists()):
        for p in room.iterdir():
            if p.suffix == ".py" and p.stem != "__init__" or p.is_dir() and (p / "__init__.py").exists():
                found[p.stem] = f"course_utils.{room.name}.{p.stem}"
    assert found == {k: v for k, v in cu._MODULES.items() if v.startswith("course_utils.")}
    assert cu._MODULES["exercises"] == "course_checks.exercises"  # the checks, a package above, loaded by name
    rooms = set("measuring show supply sections serve techniques from_lessons capstone".split())
    assert set(cu._ROOMS) == rooms


def test_shortcuts_resolve(monkeypatch):
    assert cu.measure is cu.timing.measure and cu.record is cu.results.record
    monkeypatch.setenv("COURSE_SMOKE", "1")
    assert cu.pick(full=1, smoke=2) == 2
    monkeypatch.delenv("COURSE_SMOKE")
    assert cu.pick(full=1, smoke=2) == 1


def test_import_is_light():
    code = "import sys, course_utils; print('matplotlib' in sys.modules, 'pandas' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
