"""No reference solution is shown above its exercise: `show_solution` is the only way to see one.

For every `cu.exercises.check("KEY", ...)` in a lesson, the ordered calls of KEY's reference solution must not all
appear, in the same order, in one code cell above the check (a cell that writes the answer out for the learner to
copy). No code cell calls `show_solution` (a learner types it when stuck), and every registered exercise is checked
in its lesson.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import pytest

from course_checks import exercises

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))
_CELL = re.compile(r"^# %%(.*)$", re.M)
_CHECK = re.compile(r"""exercises\.check\(\s*["'](\d\d\.[\w-]+)["']""")
MIN_CALLS = 3  # a solution of one or two calls is a pattern the lesson must show, not an answer to copy


def code_cells(path: Path) -> list[str]:
    text = path.read_text()
    heads = list(_CELL.finditer(text))
    cells = []
    for i, head in enumerate(heads):
        if "[markdown]" in head.group(1):
            continue
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        cells.append(text[head.end() : end])
    return cells


def call_names(source: str) -> list[str]:
    """The called names of ``source`` in source order (``torch.autocast(...)`` -> ``autocast``)."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return []
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name:
                calls.append((node.lineno, node.col_offset, name))
    return [name for *_, name in sorted(calls)]


def is_subsequence(needle: list[str], hay: list[str]) -> bool:
    it = iter(hay)
    return all(any(h == n for h in it) for n in needle)


def solution_calls(key: str) -> list[str]:
    source = inspect.getsource(exercises.get(key).solution)
    body = ast.parse(textwrap.dedent(source)).body[0]
    inner = body.body if isinstance(body, ast.FunctionDef | ast.ClassDef) else [body]
    if inner and isinstance(inner[0], ast.Expr) and isinstance(getattr(inner[0], "value", None), ast.Constant):
        inner = inner[1:]  # the docstring
    return call_names("\n".join(ast.unparse(n) for n in inner))


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_no_solution_above_its_exercise(lesson):
    cells = code_cells(lesson)
    problems = []
    for i, cell in enumerate(cells):
        for line in cell.splitlines():
            if "show_solution(" in line and not line.lstrip().startswith("#"):
                problems.append(f"cell {i} calls show_solution (it prints the answer): leave it in a comment")
        for key in _CHECK.findall(cell):
            needle = solution_calls(key)
            if len(needle) < MIN_CALLS:
                continue
            for j, above in enumerate(cells[:i]):
                if is_subsequence(needle, call_names(above)):
                    problems.append(f"{key}: cell {j} above the exercise makes every call of its solution {needle}")
    assert not problems, f"{lesson.name}:\n" + "\n".join(problems)


def test_every_exercise_is_checked_in_its_lesson():
    text = {p.name[:2]: p.read_text() for p in LESSONS}
    missing = [k for k in exercises.registry() if k[:2] in text and f'"{k}"' not in text[k[:2]]]
    assert not missing, f"exercises registered but never checked in their lesson: {missing}"


def test_the_subsequence_rule_catches_a_printed_solution():
    solution = "with torch.autocast('cpu', dtype=torch.bfloat16):\n    y = model(x)\nreturn y.float()"
    cell = "x = load()\nwith torch.autocast('cpu', dtype=torch.bfloat16):\n    out = model(x)\nprint(out.float())"
    assert is_subsequence(call_names(solution.replace("return", "_ =")), call_names(cell))
    assert not is_subsequence(["autocast", "model", "float"], ["model", "autocast"])
