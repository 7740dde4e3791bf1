"""The verification level of every GPU-only section, generated from run records, as a table for README.

Levels (docs/DESIGN.md, "GPU code without a GPU: four levels"), strongest first:

* **executed**: its body *completed* on a named real GPU: a reference run in ``data/reference/*.env.json``
  (written by ``scripts/gpu_check.py``, which judges sections by completion) lists it under ``sections_ran``;
* **rehearsed**: its body completed in this CI run's rehearsal (``COURSE_REHEARSE=1``, the lessons-as-scripts
  tests, run by ``scripts/gpu_check.py`` as on the lent GPU machine) on the CPU stand-ins and exercised at least
  one CUDA rule there; the table names what the stand-ins enforced, from the record's checks (a body that
  completed without exercising any rule counts as API-checked at most);
* **API-checked**: a contract test ``tests/gpu_contract/test_*.py`` names it in its literal dict ``COVERS``
  (names and signatures against the real packages, its code run against fakes);
* **unverified**: none of these, with the reason (the rehearsal's "not rehearsable: ..." or failure, a
  contract file's ``NOT_TESTABLE`` reason, or no record).

No level string is written by hand: the rehearsal records are ``sections*.jsonl`` rows with ``mode:
rehearsal`` in the records folder (``--records DIR``, default ``$COURSE_RESULTS_DIR`` or
``build/test-results``). ``python -m scripts.gpu_levels --write --records DIR`` rewrites README's table between
its markers; ``tests/after_run/test_run_record.py`` regenerates it from the test run's own records and fails
when README differs. Sections are found as ``gpu_section("NN.slug", ...)`` calls in ``lessons/*.py`` and in
``course_utils`` (``sections/gpu_sections.py``, which defines ``gpu_section``, is skipped).
"""

from __future__ import annotations

import ast
import json
import os
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
    package = [
        p for p in sorted((root / "course_utils").rglob("*.py")) if p.name not in {"modes.py", "gpu_sections.py"}
    ]
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


# what a rehearsal check counter means, in the words of the table (the counters come from fakegpu.standins)
ENFORCED = {
    "placement checks": "placement", "stream-order checks": "stream order", "timing checks": "event timing",
    "timer reads checked": "wall-clock timers wait for the GPU", "synchronizations": "synchronization",
    "graph captures": "CUDA-graph capture rules", "graph replays": "CUDA-graph replay on static memory",
    "TensorRT pointer checks": "TensorRT device pointers", "ORT options validated": "ORT CUDA provider options",
    "ORT IOBinding pointer checks": "ORT IOBinding pointers", "ORT CUDA graph replay checks":
    "ORT CUDA-graph shapes/addresses", "pinned host buffers": "pinned memory",
    "copies from pinned memory": "asynchronous copies from pinned memory",
    "asynchronous copies to the host": "asynchronous device-to-host copies",
    "peak-memory reads": "peak-memory resets", "global switches compared": "global switches restored",
}  # fmt: skip
# checked when the section's cell ends, whatever its body did: not evidence that the body exercised a rule
AT_THE_END = {"global switches compared"}


def records_dir() -> Path:
    env = os.environ.get("COURSE_RESULTS_DIR")
    return Path(env).expanduser() if env else ROOT / "build" / "test-results"


def rehearsal_outcomes(folder: Path | None) -> dict[str, dict]:
    """Section -> its final rehearsal row (completed beats not-rehearsable beats failed) in ``folder``."""
    if folder is None or not folder.exists():
        return {}
    sys.path.insert(0, str(ROOT))
    from course_utils.supply.modes import read_sections

    rank = {"completed": 3, "not-rehearsable": 2, "failed": 1, "entered": 0}
    out: dict[str, dict] = {}
    for path in sorted(folder.glob("sections*.jsonl")):
        for row in read_sections(path):
            if row.get("mode") != "rehearsal":
                continue
            old = out.get(row["section"])
            if old is None or rank.get(row.get("status"), 0) > rank.get(old.get("status"), 0):
                out[row["section"]] = row
    return out


def enforced(checks: dict[str, int]) -> str:
    """The kinds of rule the stand-ins enforced (deterministic: kinds, not counts, so README stays stable)."""
    kinds = sorted({ENFORCED[k] for k, n in checks.items() if k in ENFORCED and n})
    return ", ".join(kinds) or "nothing beyond running the body"


def exercised(checks: dict[str, int]) -> bool:
    """Did the body exercise at least one CUDA rule on the stand-ins (not only the checks at the cell's end)?"""
    return any(n for k, n in checks.items() if k in ENFORCED and k not in AT_THE_END)


def levels(root: Path = ROOT, records: Path | None = None) -> list[Level]:
    """The level of every GPU-only section, in lesson order (``records``: the folder of this run's records)."""
    covered, not_testable = contract_claims(root)
    executed = executed_runs(root)
    rehearsed = rehearsal_outcomes(records)
    rows = []
    for key in sorted(lesson_sections(root)):
        also = f"; API-checked: {covered[key]}" if key in covered else ""
        r = rehearsed.get(key, {})
        if key in executed:
            rows.append(Level(key, "executed", f"completed on {executed[key]}{also}"))
        elif r.get("status") == "completed" and exercised(r.get("checks", {})):
            rows.append(Level(key, "rehearsed", f"body completed on the CPU stand-ins, which enforced: "
                              f"{enforced(r.get('checks', {}))}{also}"))  # fmt: skip
        elif r.get("status") == "completed":
            ran = "rehearsal: its body completed on the CPU stand-ins but exercised no CUDA rule"
            rows.append(Level(key, "API-checked", f"{covered[key]} ({ran})") if key in covered
                        else Level(key, "unverified", ran))  # fmt: skip
        elif key in covered:
            why = f" (rehearsal: {r['reason']})" if r.get("reason") else ""
            rows.append(Level(key, "API-checked", f"{covered[key]}{why}"))
        elif r.get("reason"):
            rows.append(Level(key, "unverified", f"rehearsal: {r['reason']}"))
        elif key in not_testable:
            rows.append(Level(key, "unverified", f"not contract-testable: {not_testable[key]}"))
        else:
            rows.append(Level(key, "unverified", "no run record and no contract test names it"))
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
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="rewrite README.md's table")
    ap.add_argument("--records", type=Path, default=None, help="folder of this run's sections*.jsonl")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    rows = levels(records=args.records or records_dir())
    if args.write:
        readme = ROOT / "README.md"
        readme.write_text(render_readme(readme.read_text(), rows))
        print(f"README.md: table of {len(rows)} GPU-only sections written")
    else:
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
