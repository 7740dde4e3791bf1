"""Profiler plumbing that lesson 02 does not need to show: where traces go, calls counted, the Nsight command.

Lesson 02 writes the profiler block (``torch.profiler.profile`` with a schedule), the ``record_function`` ranges,
the tables and the Chrome trace out in its own cells. This module keeps only what that lesson then calls:
:func:`traces_dir` (trace files go to the results folder, never into the repository), :func:`op_calls` (how
many operator calls a profile holds, e.g. the ``aten::item`` syncs of a slow pipeline) and :func:`nsys_command`
(the Nsight Systems command line for GPU users).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from course_utils.show.results import results_dir


def traces_dir() -> Path:
    """Where Chrome traces go: ``<results folder>/traces`` (created if missing; outside the repository)."""
    path = results_dir() / "traces"
    path.mkdir(parents=True, exist_ok=True)
    return path


def op_calls(prof: Any, name: str | None = None) -> float:
    """Operator calls recorded by a ``torch.profiler.profile``: all of them, or only those called ``name``.

    User ranges (``record_function``) and the schedule's ``ProfilerStep#`` rows are not operators and are not
    counted. Divide by the number of active steps for calls per step.
    """
    total = 0
    for e in prof.key_averages():
        if e.key.startswith("ProfilerStep") or getattr(e, "is_user_annotation", False):
            continue
        if name is None or e.key == name:
            total += e.count
    return float(total)


def nsys_command(script: str = "my_pipeline.py", *, output: str | Path | None = None) -> str:
    """The Nsight Systems command that records CUDA API calls, NVTX ranges and OS runtime calls of a script.

    Open the resulting ``.nsys-rep`` in the Nsight Systems GUI; the NVTX rows carry the names given to
    ``torch.cuda.nvtx.range``. Nsight Systems is a separate NVIDIA download (not a pip package).
    """
    out = Path(output) if output is not None else traces_dir() / Path(script).stem
    return f"nsys profile -t cuda,nvtx,osrt --cuda-memory-usage=true --force-overwrite=true -o {out} python {script}"
