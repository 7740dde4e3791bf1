"""Every course_utils module is reachable as cu.<name>, loaded lazily."""

import subprocess
import sys
from pathlib import Path

import course_utils as cu


def test_every_module_is_listed():
    files = {p.stem for p in Path(cu.__file__).parent.glob("*.py") if p.stem != "__init__"}
    assert files == set(cu._MODULES)


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
