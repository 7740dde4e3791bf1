"""Run a lesson's text copy cell by cell, as a notebook kernel would, deciding its GPU sections per cell.

    cd lessons && python -m scripts.run_cells 03_batching.py          (PYTHONPATH = the repository root)
    COURSE_REHEARSE=1 ... python -m scripts.run_cells 10_streams.py   (GPU sections on the CPU stand-ins)
    ... python -m scripts.run_cells 10_streams.py --until 10.streams   (stop after that section's cell)

Cells are the ``# %%`` blocks of the jupytext percent format, executed in order in one namespace (line numbers
kept for tracebacks). After each cell :func:`course_utils.sections.gpu_sections.finish_cell` records the sections
entered in it as ``completed`` or ``failed`` (or ``not-rehearsable``, for a named GPU-only kernel: that cell stops
there and the run goes on, as the skipped section's ``else`` branch is not taken). The first failing cell ends the
run with exit status 1. The rehearsal's rules live in the package
(:mod:`fakegpu.standins.rehearsal`, whole-lesson scope started by ``cu.lesson.start``), so a rehearsal
in a Jupyter kernel is the one this runner does.

Where IPython is missing (the lent GPU machine), ``from IPython.display import display`` gets a module
``IPython.display`` whose ``display`` prints; no ``IPython`` module is made, so libraries that look for IPython
(matplotlib does when it draws) find none, as is true.
"""

from __future__ import annotations

import re
import sys
import traceback
from pathlib import Path
from typing import Any

_CELL = re.compile(r"^# %%")


def cells(text: str) -> list[tuple[int, str]]:
    """(first line number, source) of every ``# %%`` cell; code before the first marker is a cell too."""
    out: list[tuple[int, list[str]]] = [(1, [])]
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if _CELL.match(line):
            out.append((number, []))
        out[-1][1].append(line)
    return [(start, "".join(lines)) for start, lines in out if "".join(lines).strip()]


def _display_shim() -> None:
    """Machines without IPython (the lent GPU machine): ``from IPython.display import display`` prints instead."""
    import importlib.util

    try:
        found = importlib.util.find_spec("IPython") is not None
    except (ImportError, ValueError):
        found = False
    if found or "IPython.display" in sys.modules:
        return
    import types

    def display(*objs: object, **kwargs: object) -> None:
        for obj in objs:
            print(obj.to_string() if hasattr(obj, "to_string") else obj)

    shown = types.ModuleType("IPython.display", "scripts/run_cells.py's display for machines without IPython")
    shown.display = display
    sys.modules["IPython.display"] = shown


def run(path: Path, until: str | None = None) -> int:
    """Run ``path`` cell by cell; ``until``: stop after the cell that enters that section (0 if it completed)."""
    from course_utils.sections import gpu_sections
    from fakegpu.standins import rehearsal

    _display_shim()
    gpu_sections._HOOKS["cells"] = True
    namespace = {"__name__": "__main__", "__file__": str(path)}
    argv, sys.argv = sys.argv, [str(path)]
    try:
        return _run(path, until, namespace, gpu_sections, rehearsal)
    finally:
        sys.argv = argv


def _run(path: Path, until: str | None, namespace: dict, gpu_sections: Any, rehearsal: Any) -> int:
    for start, source in cells(path.read_text()):
        code = compile("\n" * (start - 1) + source, str(path), "exec")
        try:
            exec(code, namespace)  # noqa: S102 - the lesson itself, as a kernel runs it
        except rehearsal.NotRehearsable as exc:
            gpu_sections.finish_cell(False, exc)
            print(f"⏭  not rehearsable (cell at line {start}): {exc}")
            continue
        except BaseException as exc:  # noqa: BLE001 - record, report, stop like a failing notebook
            gpu_sections.finish_cell(False, exc)
            traceback.print_exc()
            print(f"cell at line {start} of {path.name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        hidden = gpu_sections.finish_cell(True)
        if hidden is not None:
            print(f"cell at line {start} of {path.name} failed: {type(hidden).__name__}: {hidden}", file=sys.stderr)
            return 1
        if until and f'gpu_section("{until}"' in source:
            return 0
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    stop = None
    if len(args) == 3 and args[1] == "--until":
        stop = args.pop(2)
        args.pop(1)
    if len(args) != 1:
        print(__doc__)
        sys.exit(2)
    lesson = Path(args[0])
    if not lesson.exists() and (Path(__file__).resolve().parent.parent / "lessons" / lesson).exists():
        lesson = Path(__file__).resolve().parent.parent / "lessons" / lesson  # a bare name: the lesson of that name
    if not lesson.is_file():
        print(f"no lesson file {args[0]}: give a path, or a name in lessons/ such as 03_batching.py", file=sys.stderr)
        sys.exit(2)
    sys.exit(run(lesson.resolve(), stop))
