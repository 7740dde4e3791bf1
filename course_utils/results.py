"""Record measured rows to a results folder and compare them across machines.

Each lesson appends one row per measured variant with :func:`record`. Rows go to
``<results folder>/<machine>.csv``; the folder is ``$COURSE_RESULTS_DIR`` or ``results/`` at the repository
root (ignored by git). Workshop attendees' files can be pooled and compared with :func:`load_results`.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

COLUMNS = [
    "lesson", "technique", "model", "device", "dtype", "batch_size", "median_ms", "p90_ms", "throughput",
    "speedup_vs_baseline", "error_vs_baseline", "notes", "machine", "gpu", "cpu", "torch", "mode", "time",
]  # fmt: skip

REPO_ROOT = Path(__file__).resolve().parent.parent


def results_dir() -> Path:
    """The results folder: ``$COURSE_RESULTS_DIR`` if set, else ``results/`` in the repository."""
    return Path(os.environ.get("COURSE_RESULTS_DIR") or REPO_ROOT / "results")


def machine_id() -> str:
    """A file-name-safe name for this machine: GPU name if present, else CPU model, plus host name."""
    import socket

    import torch

    from .device import cpu_model, has_cuda

    hw = torch.cuda.get_device_name(0) if has_cuda() else cpu_model()
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{socket.gethostname()}_{hw}").strip("-")[:120]


def _machine_fields() -> dict[str, str]:
    import torch

    from .device import cpu_model, has_cuda
    from .modes import is_smoke

    return {
        "machine": machine_id(),
        "gpu": torch.cuda.get_device_name(0) if has_cuda() else "",
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "mode": "smoke" if is_smoke() else "full",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def record(
    lesson: str,
    technique: str,
    *,
    model: str = "",
    device: str = "",
    dtype: str = "",
    batch_size: int | None = None,
    measurement: Any = None,
    median_ms: float | None = None,
    p90_ms: float | None = None,
    throughput: float | None = None,
    speedup_vs_baseline: float | None = None,
    error_vs_baseline: float | None = None,
    notes: str = "",
) -> dict[str, Any]:
    """Append one row to this machine's results file and return it.

    Pass a :class:`course_utils.timing.Measurement` as ``measurement`` to fill the timing columns
    (median, p90, throughput, batch size, device) from it; explicit arguments win over it.
    """
    row: dict[str, Any] = {c: None for c in COLUMNS}
    if measurement is not None:
        row.update(
            median_ms=measurement.median_ms,
            p90_ms=measurement.p90_ms,
            throughput=measurement.throughput,
            batch_size=measurement.batch_size,
            device=measurement.device,
        )
    given = dict(
        lesson=lesson, technique=technique, model=model, dtype=dtype, notes=notes, device=device or row["device"],
        batch_size=batch_size if batch_size is not None else row["batch_size"],
        median_ms=median_ms if median_ms is not None else row["median_ms"],
        p90_ms=p90_ms if p90_ms is not None else row["p90_ms"],
        throughput=throughput if throughput is not None else row["throughput"],
        speedup_vs_baseline=speedup_vs_baseline, error_vs_baseline=error_vs_baseline,
    )  # fmt: skip
    row.update(given)
    row.update(_machine_fields())
    path = results_dir() / f"{row['machine']}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([row], columns=COLUMNS).to_csv(path, mode="a", header=not path.exists(), index=False)
    return row


def load_results(paths: Iterable[str | Path] | None = None) -> pd.DataFrame:
    """Read result CSVs (default: every ``*.csv`` in the results folder) into one DataFrame.

    A file that cannot be read or lacks the course's columns is skipped with a warning naming it;
    the other files are still loaded. Returns an empty frame with :data:`COLUMNS` when nothing loads.
    """
    if paths is None:
        paths = sorted(results_dir().glob("*.csv"))
    frames = []
    for p in paths:
        p = Path(p)
        try:
            df = pd.read_csv(p, dtype={"lesson": str})
        except Exception as exc:  # noqa: BLE001 - any unreadable file is skipped, loudly
            warnings.warn(f"skipped results file {p}: cannot be read ({type(exc).__name__}: {exc})", stacklevel=2)
            continue
        missing = {"lesson", "technique", "median_ms", "machine"} - set(df.columns)
        if missing:
            warnings.warn(f"skipped results file {p}: missing columns {sorted(missing)}", stacklevel=2)
            continue
        df["source"] = p.name
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=COLUMNS + ["source"])
    return pd.concat(frames, ignore_index=True)


REFERENCE_DIR = REPO_ROOT / "data" / "reference"


def reference_results(lesson: str | None = None) -> pd.DataFrame:
    """Results measured on real GPUs and shipped in ``data/reference/`` (optionally one lesson's rows)."""
    import warnings as _w

    with _w.catch_warnings():
        _w.simplefilter("ignore")
        df = load_results(sorted(REFERENCE_DIR.glob("*.csv")))
    if lesson is not None and not df.empty:
        df = df[df["lesson"].astype(str) == str(lesson)]
    return df


def show_reference(lesson: str, technique_contains: str = "") -> pd.DataFrame | None:
    """Print shipped GPU reference rows for ``lesson`` (labelled with GPU, torch and date), or say there are none.

    Called in the ``else`` branch of a GPU-only section, so a learner without a GPU still sees real numbers.
    """
    df = reference_results(lesson)
    if technique_contains and not df.empty:
        df = df[df["technique"].str.contains(technique_contains, case=False, na=False)]
    if df.empty:
        print(
            f"No GPU reference results are shipped for lesson {lesson} yet: this GPU path has not been "
            "measured by the course on a real GPU (unverified). Run it on a CUDA machine to see its numbers."
        )
        return None
    cols = [c for c in ["technique", "model", "dtype", "batch_size", "median_ms", "throughput", "speedup_vs_baseline",
                        "gpu", "torch", "time"] if c in df.columns]  # fmt: skip
    gpus = ", ".join(sorted(df["gpu"].dropna().astype(str).unique()))
    print(f"Reference results measured on {gpus} (not this machine):")
    return df[cols].reset_index(drop=True)


def latest(df: pd.DataFrame) -> pd.DataFrame:
    """Keep only the newest row per (machine, lesson, technique, model, dtype, batch_size, mode)."""
    keys = ["machine", "lesson", "technique", "model", "dtype", "batch_size", "mode"]
    keys = [k for k in keys if k in df.columns]
    if df.empty:
        return df
    return df.sort_values("time").groupby(keys, dropna=False, as_index=False).tail(1).reset_index(drop=True)


def compare_machines(df: pd.DataFrame, value: str = "median_ms") -> pd.DataFrame:
    """Pivot rows to one column per machine: the same lesson/technique side by side (newest rows only)."""
    df = latest(df)
    index = ["lesson", "technique", "model", "dtype", "batch_size"]
    return df.pivot_table(index=index, columns="machine", values=value, aggfunc="last", dropna=False).dropna(how="all")
