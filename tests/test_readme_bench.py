"""README's lab-bench table names every room folder of course_utils and every module in it."""

import re
from pathlib import Path

import course_utils as cu

ROOT = Path(__file__).resolve().parent.parent


def test_readme_lists_every_room_and_module():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## The shared package `course_utils`") : text.index("## Offline by design")]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)/` \|[^|]*\|(.*)\|$", section, re.M)}
    assert set(rows) == set(cu._ROOMS), f"README rooms {sorted(rows)} vs package {sorted(cu._ROOMS)}"
    for room, names in cu._ROOMS.items():
        missing = [n for n in names if f"`{n}`" not in rows[room] and f"`{n}/`" not in rows[room]]
        assert not missing, f"README's row for {room}/ does not name {missing}"


def test_readme_lists_every_exercise():
    from course_checks import exercises

    text = (ROOT / "README.md").read_text()
    missing = [k for k in exercises.registry() if f"`{k}`" not in text]
    assert not missing, f"README's exercise list does not name {missing}"
