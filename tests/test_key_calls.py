"""The lesson is the code: each lesson's key calls (docs/DESIGN.md, "The lesson is the code") stand in its
notebook's code cells, not only inside course_utils.

A lesson whose rewrite has not landed yet is listed in PENDING and marked expected-to-fail (strict: once it
passes, it must leave PENDING). Comment lines do not count.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DESIGN = ROOT / "docs" / "DESIGN.md"


def read_key_calls(text: str) -> dict[str, list[str]]:
    """The ```key-calls block of the design document: one ``NN  pattern`` per line, in order."""
    block = re.search(r"^```key-calls\n(.*?)^```", text, re.M | re.S)
    if block is None:
        raise AssertionError('docs/DESIGN.md has no ```key-calls block ("The lesson is the code")')
    calls: dict[str, list[str]] = {}
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        lesson, _, pattern = line.strip().partition(" ")
        if not re.fullmatch(r"\d\d", lesson) or not pattern.strip():
            raise AssertionError(f"docs/DESIGN.md key-calls: {line!r} is not 'NN  pattern'")
        re.compile(pattern.strip())
        calls.setdefault(lesson, []).append(pattern.strip())
    return calls


# Patterns per lesson: docs/DESIGN.md, "The lesson is the code", is their one source.
KEY_CALLS = read_key_calls(DESIGN.read_text(encoding="utf-8"))


def lesson_numbers() -> list[str]:
    """Every lesson in lessons/ (the template excluded)."""
    return sorted(p.name[:2] for p in (ROOT / "lessons").glob("[0-9][0-9]_*.py"))


# Lessons whose rewrite has not landed: expected to fail until then (remove a line when its lesson passes).
PENDING: set[str] = set()  # every rewrite has landed


def code_lines(lesson: str) -> str:
    """The code cells of ``notebooks/NN_*.ipynb``."""
    (path,) = sorted((ROOT / "notebooks").glob(f"{lesson}_*.ipynb"))
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def missing_calls(lesson: str, code: str | None = None) -> list[str]:
    """The key-call patterns of ``lesson`` not found in its code cells (comment lines do not count)."""
    code = code_lines(lesson) if code is None else code
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith("#"))
    return [p for p in KEY_CALLS[lesson] if not re.search(p, code)]


@pytest.mark.parametrize(
    "lesson",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="rewrite pending")) if n in PENDING else n
        for n in sorted(KEY_CALLS)
    ],
)
def test_key_calls_stand_in_the_lesson(lesson):
    missing = missing_calls(lesson)
    print(f"lesson {lesson}: {len(KEY_CALLS[lesson]) - len(missing)}/{len(KEY_CALLS[lesson])} key calls in its cells")
    assert not missing, f"lesson {lesson}: key calls not in its code cells: {missing}"


def test_missing_calls_detects_absent_and_commented_calls():
    assert missing_calls("00", "x = 1\n# torch.cuda.is_available()") == KEY_CALLS["00"]
    full = "torch.cuda.is_available()\ntorch.cuda.get_device_capability()\ntorch.backends.cpu.get_cpu_capability()\n"
    assert missing_calls("00", full) == [r"get_available_providers"]


def test_every_lesson_has_key_calls_and_every_entry_a_lesson():
    assert sorted(KEY_CALLS) == lesson_numbers(), (
        "docs/DESIGN.md's key-calls block and lessons/ differ: lessons without key calls "
        f"{sorted(set(lesson_numbers()) - set(KEY_CALLS))}, entries without a lesson "
        f"{sorted(set(KEY_CALLS) - set(lesson_numbers()))}"
    )


def test_read_key_calls_refuses_a_malformed_block():
    with pytest.raises(AssertionError, match="no ```key-calls block"):
        read_key_calls("# design\n")
    with pytest.raises(AssertionError, match="is not 'NN  pattern'"):
        read_key_calls("```key-calls\n3  foo\n```\n")
    assert read_key_calls("```key-calls\n03  a|b\n03  c\n\n04  d\n```\n") == {"03": ["a|b", "c"], "04": ["d"]}
