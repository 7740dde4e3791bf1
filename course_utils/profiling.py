"""Profile a callable with ``torch.profiler`` and read the answer out of the data, not by eye.

:func:`profile` runs a function under the profiler (CPU activity always, CUDA activity when a GPU is
present) with a wait/warm-up/active schedule, exports a Chrome trace to ``<results>/traces/`` (open it in
https://ui.perfetto.dev or ``chrome://tracing``) and returns a :class:`ProfileResult`.
:func:`top_ops` turns the operator statistics into a DataFrame, :func:`stage_times` the user ranges
(``record_function``), and :func:`hotspot` names the stage that takes the largest share of the time, so a
notebook can fix what the data points at. :func:`annotate` opens a range that both the PyTorch profiler
(``record_function``) and Nsight Systems (NVTX, on a GPU) see. :func:`nsys_command` prints the Nsight
Systems command line for GPU users.

Lesson 02 writes the profiler block, the ranges and the stage table out in its own cells first; this module keeps
the same calls for reuse in later lessons. Trace files are written to the results folder, never into the
repository.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, record_function

from .modes import pick
from .results import results_dir


def traces_dir() -> Path:
    """Where Chrome traces go: ``<results folder>/traces`` (created if missing; outside the repository)."""
    path = results_dir() / "traces"
    path.mkdir(parents=True, exist_ok=True)
    return path


def activities(device: str | torch.device | None = None) -> list[ProfilerActivity]:
    """Profiler activities for ``device``: CPU always, plus CUDA when the device (or, if None, the machine) has it."""
    if device is None:
        cuda = torch.cuda.is_available()
    else:
        cuda = torch.device(device).type == "cuda"
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]


@contextlib.contextmanager
def annotate(name: str) -> Iterator[None]:
    """A named range seen by ``torch.profiler`` (``record_function``) and, on a GPU, by Nsight (NVTX).

    ``with annotate("preprocess"): ...`` makes the block one row in :func:`stage_times` and one bar in the
    Chrome trace; under ``nsys profile -t nvtx`` the same block appears on the NVTX row.
    """
    nvtx = torch.cuda.nvtx.range(name) if torch.cuda.is_available() else contextlib.nullcontext()
    with record_function(name), nvtx:
        yield


@dataclass
class ProfileResult:
    """What :func:`profile` returns: the profiler object, the Chrome trace path, and the schedule used."""

    prof: Any
    trace_path: Path
    active_steps: int
    device: str

    @property
    def trace_bytes(self) -> int:
        """Size of the exported trace file in bytes (0 if it is missing)."""
        return self.trace_path.stat().st_size if self.trace_path.exists() else 0

    def table(self, *, sort_by: str | None = None, row_limit: int = 12) -> str:
        """The profiler's own text table (``key_averages().table``), sorted by self time on the profiled device."""
        sort_by = sort_by or ("self_cuda_time_total" if self.device == "cuda" else "self_cpu_time_total")
        return self.prof.key_averages().table(sort_by=sort_by, row_limit=row_limit)


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "trace"


def profile(
    fn: Callable[[], object],
    *,
    name: str = "trace",
    device: str | torch.device | None = None,
    wait: int = 1,
    warmup: int = 1,
    active: int | None = None,
    record_shapes: bool = True,
    profile_memory: bool = False,
    with_stack: bool = False,
) -> ProfileResult:
    """Run ``fn()`` ``wait + warmup + active`` times under ``torch.profiler`` and export a Chrome trace.

    The schedule skips ``wait`` steps, runs ``warmup`` steps with the profiler on but discarded (first-call
    costs such as allocator growth and kernel selection), then records ``active`` steps (default: 3, or 2
    in smoke mode). CPU activity is always on; CUDA activity is added when ``device`` is a CUDA device (or,
    if ``device`` is None, when a GPU is present), and the GPU is synchronized after each step so its
    kernels land in the step. The trace goes to ``traces_dir()/<name>.json``.
    """
    if active is None:
        active = pick(full=3, smoke=2)
    if min(wait, warmup) < 0 or active < 1:
        raise ValueError(f"profile(): need wait >= 0, warmup >= 0 and active >= 1, got {wait}, {warmup}, {active}")
    acts = activities(device)
    dev = "cuda" if ProfilerActivity.CUDA in acts else "cpu"
    path = traces_dir() / f"{_safe_name(name)}.json"
    if path.exists():
        path.unlink()
    sched = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    with torch.profiler.profile(
        activities=acts,
        schedule=sched,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for _ in range(wait + warmup + active):
            fn()
            if dev == "cuda":
                torch.cuda.synchronize()
            prof.step()
    return ProfileResult(prof=prof, trace_path=path, active_steps=active, device=dev)


def _events(source: Any) -> Any:
    prof = source.prof if isinstance(source, ProfileResult) else source
    return prof.key_averages()


def _steps(source: Any) -> int:
    return source.active_steps if isinstance(source, ProfileResult) else 1


def top_ops(source: ProfileResult | Any, *, n: int = 10, sort_by: str = "self_cpu_ms") -> pd.DataFrame:
    """The ``n`` operators with the most ``sort_by`` time, as a DataFrame (times in ms per profiled step).

    Columns: ``name, calls, self_cpu_ms, cpu_total_ms, self_device_ms, device_total_ms, self_cpu_pct,
    us_per_call``. User ranges from ``record_function`` and the schedule's ``ProfilerStep#`` rows are left
    out (see :func:`stage_times` for those). ``sort_by`` may be any time column or ``"calls"``.
    """
    steps = _steps(source)
    rows = []
    for e in _events(source):
        if e.key.startswith("ProfilerStep") or getattr(e, "is_user_annotation", False):
            continue
        rows.append(
            {
                "name": e.key,
                "calls": e.count / steps,
                "self_cpu_ms": e.self_cpu_time_total / 1000 / steps,
                "cpu_total_ms": e.cpu_time_total / 1000 / steps,
                "self_device_ms": e.self_device_time_total / 1000 / steps,
                "device_total_ms": e.device_time_total / 1000 / steps,
            }
        )
    cols = ["name", "calls", "self_cpu_ms", "cpu_total_ms", "self_device_ms", "device_total_ms"]
    df = pd.DataFrame(rows, columns=cols)
    if sort_by not in df.columns:
        raise ValueError(f"top_ops(sort_by={sort_by!r}): use one of {cols[1:]}")
    total = df["self_cpu_ms"].sum()
    df["self_cpu_pct"] = 100 * df["self_cpu_ms"] / total if total > 0 else 0.0
    df["us_per_call"] = 1000 * df["self_cpu_ms"] / df["calls"].where(df["calls"] > 0)
    return df.sort_values(sort_by, ascending=False).head(n).reset_index(drop=True)


def op_calls(source: ProfileResult | Any, name: str | None = None) -> float:
    """Operator calls per profiled step: all of them, or only those called ``name`` (e.g. ``"aten::item"``)."""
    steps = _steps(source)
    total = 0
    for e in _events(source):
        if e.key.startswith("ProfilerStep") or getattr(e, "is_user_annotation", False):
            continue
        if name is None or e.key == name:
            total += e.count
    return total / steps


def stage_times(source: ProfileResult | Any, stages: Sequence[str] | None = None) -> pd.DataFrame:
    """Time per user range (``record_function`` / :func:`annotate`), in ms per profiled step, largest first.

    ``stages`` picks the ranges to compare (default: every user range except ``ProfilerStep#``); the
    ``share`` column is each stage's fraction of their sum. The time is the range's wall time on the CPU
    side, which includes any wait for the GPU inside it (a ``.item()`` that synchronizes shows up here).
    """
    steps = _steps(source)
    rows = []
    for e in _events(source):
        is_range = getattr(e, "is_user_annotation", False) and not e.key.startswith("ProfilerStep")
        if (stages is None and is_range) or (stages is not None and e.key in stages):
            rows.append({"stage": e.key, "calls": e.count / steps, "ms": e.cpu_time_total / 1000 / steps,
                         "device_ms": e.device_time_total / 1000 / steps})  # fmt: skip
    df = pd.DataFrame(rows, columns=["stage", "calls", "ms", "device_ms"])
    if stages is not None:
        missing = sorted(set(stages) - set(df["stage"]))
        if missing:
            raise ValueError(
                f"stage_times(): no profiled range named {missing}; wrap those blocks in "
                "course_utils.profiling.annotate(name) (or record_function) before profiling"
            )
    total = df["ms"].sum()
    df["share"] = df["ms"] / total if total > 0 else 0.0
    return df.sort_values("ms", ascending=False).reset_index(drop=True)


def hotspot(times: pd.DataFrame, *, column: str = "ms", name_column: str = "stage") -> tuple[str, float]:
    """The row with the largest ``column`` in a :func:`stage_times` or :func:`top_ops` frame: (name, share).

    The share is that row's fraction of the column's sum, so "where does the time go" is answered by data.
    """
    if times.empty:
        raise ValueError("hotspot() got an empty table: profile something with annotated stages first")
    i = times[column].idxmax()
    total = float(times[column].sum())
    return str(times.loc[i, name_column]), (float(times.loc[i, column]) / total if total > 0 else 0.0)


def nsys_command(script: str = "my_pipeline.py", *, output: str | Path | None = None) -> str:
    """The Nsight Systems command that records CUDA API calls, NVTX ranges and OS runtime calls of a script.

    Open the resulting ``.nsys-rep`` in the Nsight Systems GUI; the NVTX rows carry the names given to
    :func:`annotate`. Nsight Systems is a separate NVIDIA download (not a pip package).
    """
    out = Path(output) if output is not None else traces_dir() / Path(script).stem
    return f"nsys profile -t cuda,nvtx,osrt --cuda-memory-usage=true --force-overwrite=true -o {out} python {script}"
