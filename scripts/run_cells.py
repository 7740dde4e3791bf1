"""Run a lesson's text copy cell by cell, as a notebook kernel would, deciding its GPU sections per cell.

    cd lessons && python -m scripts.run_cells 03_batching.py          (PYTHONPATH = the repository root)
    COURSE_REHEARSE=1 ... python -m scripts.run_cells 10_streams.py   (GPU sections on the CPU stand-ins)
    ... python -m scripts.run_cells 10_streams.py --until 10.streams   (stop after that section's cell)

Cells are the ``# %%`` blocks of the jupytext percent format, executed in order in one namespace (line numbers
kept for tracebacks). After each cell :func:`course_utils.supply.modes.finish_cell` records the sections entered in it
as ``completed`` or ``failed`` (or ``not-rehearsable``: that cell stops there and the run goes on, as the
skipped section's ``else`` branch is not taken). The first failing cell ends the run with exit status 1. In
rehearsal mode the fake TensorRT is importable from the start (lesson 08 imports it in its first cell).
"""

from __future__ import annotations

import re
import sys
import traceback
from pathlib import Path

_CELL = re.compile(r"^# %%")


def cells(text: str) -> list[tuple[int, str]]:
    """(first line number, source) of every ``# %%`` cell; code before the first marker is a cell too."""
    out: list[tuple[int, list[str]]] = [(1, [])]
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if _CELL.match(line):
            out.append((number, []))
        out[-1][1].append(line)
    return [(start, "".join(lines)) for start, lines in out if "".join(lines).strip()]


def _standin_gap(exc: BaseException) -> bool:
    """An error from the real CUDA runtime (no driver here), a CUDA-only kernel, or a wrapper-tensor limit of the
    stand-in: code the stand-ins do not cover yet (recorded "not rehearsable", not a lesson failure)."""
    import torch

    text = str(exc)
    return isinstance(exc, getattr(torch, "AcceleratorError", ())) or any(
        s in text
        for s in (
            "NVIDIA driver",
            "CUDA driver version is insufficient",
            "Torch not compiled with CUDA",
            "with arguments from the 'CPU' backend",
            "version_counter for inference tensor",
        )  # fmt: skip
    )


def _display_shim() -> None:
    """Machines without IPython (the lent GPU machine): ``from IPython.display import display`` prints instead."""
    try:
        import IPython.display  # noqa: F401
    except ImportError:
        import types

        def display(*objs: object, **kwargs: object) -> None:
            for obj in objs:
                print(obj.to_string() if hasattr(obj, "to_string") else obj)

        ipython, shown = types.ModuleType("IPython"), types.ModuleType("IPython.display")
        shown.display = display
        ipython.display = shown
        ipython.get_ipython = lambda: None
        sys.modules.update({"IPython": ipython, "IPython.display": shown})


def run(path: Path, until: str | None = None) -> int:
    """Run ``path`` cell by cell; ``until``: stop after the cell that enters that section (0 if it completed)."""
    from course_utils.check.standins import rehearsal
    from course_utils.supply import modes

    _display_shim()
    modes._HOOKS["cells"] = True
    if modes.rehearsing() and "tensorrt" not in sys.modules:
        import importlib.util

        if importlib.util.find_spec("tensorrt") is None:
            from course_utils.check.standins.tensorrt import fake_from_snapshot

            sys.modules["tensorrt"] = fake_from_snapshot(device_pointers=True)
    if modes.rehearsing() and rehearsal.whole_lesson():
        rehearsal.pin()  # COURSE_REHEARSE_SCOPE=lesson: every cell as on a GPU machine
    namespace = {"__name__": "__main__", "__file__": str(path)}
    sys.argv = [str(path)]
    for start, source in cells(path.read_text()):
        code = compile("\n" * (start - 1) + source, str(path), "exec")
        try:
            exec(code, namespace)  # noqa: S102 - the lesson itself, as a kernel runs it
        except rehearsal.NotRehearsable as exc:
            modes.finish_cell(False, exc)
            print(f"⏭  not rehearsable (cell at line {start}): {exc}")
            continue
        except BaseException as exc:  # noqa: BLE001 - record, report, stop like a failing notebook
            if rehearsal.active() and _standin_gap(exc):  # the code reached real CUDA: a gap of the stand-in
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                gap = rehearsal.NotRehearsable(
                    f"the stand-in does not cover a call here ({type(exc).__name__}: {first})"
                )
                modes.finish_cell(False, gap)
                print(f"⏭  not rehearsable (cell at line {start}): {gap}")
                continue
            modes.finish_cell(False, exc)
            traceback.print_exc()
            print(f"cell at line {start} of {path.name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        hidden = modes.finish_cell(True)
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
    sys.exit(run(Path(args[0]).resolve(), stop))
