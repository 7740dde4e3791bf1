"""The verification level of every GPU-only section, as a table for README.

Levels (COURSE.md, "GPU paths: how each is verified"):

* **executed**: the section ran on a real GPU; a reference run in ``data/reference/*.env.json`` lists it
  under ``sections_ran`` (written by ``scripts/gpu_check.py``), with the GPU's name and the date.
* **contract-tested**: a file ``tests/gpu_contract/test_*.py`` names it in its literal dict ``COVERS``
  (section -> what the file checks in CPU CI against the real packages' APIs).
* **not contract-testable**: named in a ``NOT_TESTABLE`` dict of such a file, with the reason.
* **unverified**: none of these.

Sections are found as ``gpu_section("NN.slug", ...)`` calls in ``lessons/*.py`` and in ``course_utils``
(lesson 14's ``optimize()`` enters some itself; ``modes.py``, which defines ``gpu_section``, is skipped).
``python -m scripts.gpu_levels --write`` rewrites the table in README.md between its markers;
``tests/test_gpu_levels.py`` fails when README is stale or a section is unverified.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- gpu-levels:start -->", "<!-- gpu-levels:end -->"
_CALL = re.compile(r"gpu_section\(\s*(?P<q>[\"'])(?P<key>[^\"']+)(?P=q)")


@dataclass
class Level:
    section: str
    level: str
    detail: str


def lesson_sections(root: Path = ROOT) -> dict[str, str]:
    """Every GPU-only section key -> the file that enters it (literal keys only; else ValueError)."""
    found: dict[str, str] = {}
    package = [p for p in sorted((root / "course_utils").rglob("*.py")) if p.name != "modes.py"]
    for path in sorted((root / "lessons").glob("[0-9][0-9]_*.py")) + package:
        text = path.read_text()
        calls = [m for m in re.finditer(r"gpu_section\(", text) if not text[: m.start()].endswith("def ")]
        keys = [m.group("key") for m in _CALL.finditer(text)]
        if len(keys) != len(calls):
            raise ValueError(
                f'{path.name}: every gpu_section(...) call needs a literal key, e.g. gpu_section("08.build")'
            )
        for key in keys:
            found[key] = path.name
    return found


def _literal_dict(tree: ast.Module, name: str, path: Path) -> dict[str, str]:
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
            value = ast.literal_eval(node.value)
            if not isinstance(value, dict):
                raise ValueError(f"{path}: {name} must be a literal dict")
            return value
    return {}


def contract_claims(root: Path = ROOT) -> tuple[dict[str, str], dict[str, str]]:
    """(covered, not_testable): section -> 'file: what it checks' / 'file: why not', from tests/gpu_contract/."""
    covered: dict[str, str] = {}
    not_testable: dict[str, str] = {}
    for path in sorted((root / "tests" / "gpu_contract").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        rel = path.relative_to(root).as_posix()
        for key, what in _literal_dict(tree, "COVERS", path).items():
            covered[key] = f"`{rel}`: {what}" if key not in covered else f"{covered[key]}; `{rel}`: {what}"
        for key, why in _literal_dict(tree, "NOT_TESTABLE", path).items():
            not_testable[key] = f"{why} (`{rel}`)"
    return covered, not_testable


def executed_runs(root: Path = ROOT) -> dict[str, str]:
    """Section -> 'GPU, date, torch version' of the newest reference run that executed it."""
    out: dict[str, str] = {}
    for path in sorted((root / "data" / "reference").glob("*.env.json")):
        info = json.loads(path.read_text())
        label = f"{info.get('gpu', '?')}, {info.get('date', '?')}, torch {info.get('torch', '?')}"
        for key in info.get("sections_ran", []):
            out[key] = label
    return out


def levels(root: Path = ROOT) -> list[Level]:
    """The level of every GPU-only section, in lesson order."""
    covered, not_testable = contract_claims(root)
    executed = executed_runs(root)
    rows = []
    for key in sorted(lesson_sections(root)):
        if key in executed:
            extra = f"; also {covered[key]}" if key in covered else ""
            rows.append(Level(key, "executed", f"on {executed[key]}{extra}"))
        elif key in covered:
            rows.append(Level(key, "contract-tested", covered[key]))
        elif key in not_testable:
            rows.append(Level(key, "unverified", f"not contract-testable: {not_testable[key]}"))
        else:
            rows.append(Level(key, "unverified", "no contract test names it"))
    return rows


def stale_claims(root: Path = ROOT) -> list[str]:
    """Keys named in COVERS/NOT_TESTABLE that no lesson enters (renamed or removed sections)."""
    covered, not_testable = contract_claims(root)
    sections = lesson_sections(root)
    return sorted(k for k in set(covered) | set(not_testable) if k not in sections)


def table(rows: list[Level]) -> str:
    """The markdown table, with counts per level."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.level] = counts.get(r.level, 0) + 1
    summary = ", ".join(f"{n} {lvl}" for lvl, n in sorted(counts.items()))
    lines = [f"{len(rows)} GPU-only sections: {summary}.", "", "| section | level | how |", "|---|---|---|"]
    lines += [f"| `{r.section}` | {r.level} | {r.detail.replace('|', '/')} |" for r in rows]
    return "\n".join(lines)


def render_readme(readme: str, rows: list[Level]) -> str:
    """README text with the table between the markers replaced."""
    if START not in readme or END not in readme:
        raise ValueError(f"README.md needs the markers {START} and {END}")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table(rows)}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rows = levels()
    if "--write" in argv:
        readme = ROOT / "README.md"
        readme.write_text(render_readme(readme.read_text(), rows))
        print(f"README.md: table of {len(rows)} GPU-only sections written")
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
