"""Record measured rows to a results folder and compare them across machines.

Each lesson appends one row per measured variant with :func:`record`. Rows go to
``<results folder>/<machine>.csv``; the folder is ``$COURSE_RESULTS_DIR`` or ``results/`` at the repository
root (ignored by git; see :mod:`course_utils.supply.paths`). Workshop attendees' files can be pooled and compared
with :func:`load_results`. Nothing measured is lost to a fault: rows are appended under a file lock (parallel
test runs write one header per file), a malformed row is skipped with a warning instead of dropping its
file, and the machine name carries a per-folder install id
(:mod:`course_utils.show.machine_label`) so identical machine images stay apart.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from course_utils.measuring.intervals import Ratio
from course_utils.show import results_file
from course_utils.show.machine_label import machine_id
from course_utils.supply.modes import is_smoke
from course_utils.supply.paths import REFERENCE_DIR, append_text, results_dir
from course_utils.supply.paths import REPO_ROOT as REPO_ROOT  # re-exported: results.REPO_ROOT

NUMERIC_COLUMNS = ["batch_size", "median_ms", "p90_ms", "throughput", "speedup_vs_baseline", "error_vs_baseline",
                   "speedup_low", "speedup_high"]  # fmt: skip
# speedup_low/high (the 95% interval of a cu.compare ratio) came last: older files without them still load
COLUMNS = [
    "lesson", "technique", "model", "device", "dtype", "batch_size", "median_ms", "p90_ms", "throughput",
    "speedup_vs_baseline", "error_vs_baseline", "notes", "machine", "gpu", "cpu", "torch", "mode", "time",
    "speedup_low", "speedup_high",
]  # fmt: skip

TEXT_LIMIT = 32_000  # characters per text field: a spreadsheet cell holds 32,767; csv's default field limit is 131,072
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet runs a cell starting with these as a formula


CHECK_MARK = "inside exercise check"  # in the mode column of a row recorded while an exercise check ran
INSIDE_CHECK_VAR = "COURSE_INSIDE_CHECK"  # set while a check runs, so processes an answer starts mark rows too
_INSIDE: list[str] = []  # the exercise checks running now (process-wide: an answer's threads count too)


@contextlib.contextmanager
def inside_check(key: str) -> Iterator[None]:
    """Rows recorded inside (by an answer that exercise ``key``'s check runs) are marked in their ``mode``
    (``smoke; inside exercise check 03.knee``) and kept off the leaderboard (:func:`recorded_in_check`): an
    answer can record any speed-up it likes. :func:`course_checks.exercises.check` enters it."""
    _INSIDE.append(key)
    before = os.environ.get(INSIDE_CHECK_VAR)
    os.environ[INSIDE_CHECK_VAR] = key
    try:
        yield
    finally:
        _INSIDE.pop()
        if before is None:
            os.environ.pop(INSIDE_CHECK_VAR, None)
        else:
            os.environ[INSIDE_CHECK_VAR] = before


def recorded_in_check(df: pd.DataFrame) -> pd.Series:
    """True for the rows of ``df`` that were recorded while an exercise check ran (see :func:`inside_check`)."""
    if "mode" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["mode"].astype(str).str.contains(CHECK_MARK, regex=False)


def _machine_fields() -> dict[str, str]:
    import torch

    from course_utils.measuring.device import cpu_model, has_cuda

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
    speedup_vs_baseline: float | Ratio | None = None,
    error_vs_baseline: float | None = None,
    notes: str = "",
) -> dict[str, Any]:
    """Append one row to this machine's results file and return it.

    Pass a :class:`course_utils.measuring.timing.Measurement` as ``measurement`` to fill the timing columns
    (median, p90, throughput, batch size, device) from it; explicit arguments win over it. Pass a
    :class:`course_utils.measuring.intervals.Ratio` (``cu.compare(...).ratio(name)``) as ``speedup_vs_baseline``
    to record its interval too (``speedup_low``/``speedup_high``; its flags go into the notes).
    """
    row: dict[str, Any] = {c: None for c in COLUMNS}
    if isinstance(speedup_vs_baseline, Ratio):
        ratio = speedup_vs_baseline
        speedup_vs_baseline = ratio.estimate
        row.update(speedup_low=ratio.low, speedup_high=ratio.high)
        notes = "; ".join(x for x in [notes, ratio.verdict, *ratio.flags] if x)
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
    check = _INSIDE[-1] if _INSIDE else os.environ.get(INSIDE_CHECK_VAR, "")
    if check:
        row["mode"] = f"{row['mode']}; {CHECK_MARK} {check}"
    row = {k: _safe_text(k, v) if isinstance(v, str) else v for k, v in row.items()}
    path = results_dir() / f"{row['machine']}.csv"
    columns = _existing_header(path) or COLUMNS  # an older file keeps its own columns (new ones are left out)
    line = pd.DataFrame([row]).reindex(columns=columns).to_csv(index=False, header=False, lineterminator="\n")
    header = ",".join(COLUMNS) + "\n"
    # The header is written only if the file is empty, decided under the lock: one header per file.
    # A tail torn by a writer killed mid-row is cut first (results_file.complete_part), so it swallows nothing.
    append_text(path, lambda empty: header + line if empty else line, recover=results_file.complete_part)
    return {k: unneutralize(v) if isinstance(v, str) else v for k, v in row.items()}


def _existing_header(path: Path) -> list[str] | None:
    """The columns of an existing results file when they differ from :data:`COLUMNS` (one written by an older
    course version), else None."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            first = fh.readline().strip()
    except OSError:
        return None
    columns = first.split(",") if first else []
    return columns if columns and columns != COLUMNS and {"lesson", "technique"} <= set(columns) else None


def neutralize(text: str) -> str:
    """``text`` as written to a results CSV: one ``'`` in front when a spreadsheet would run it as a formula.

    A note such as ``=HYPERLINK(...)`` opened in a spreadsheet is a formula (CSV injection); with the quote it
    is shown as text. Text already starting with quotes before such a character gets one more, so
    :func:`unneutralize` gives back exactly what was recorded.
    """
    return "'" + text if text.lstrip("'").startswith(_FORMULA_START) else text


def unneutralize(text: str) -> str:
    """The inverse of :func:`neutralize`: the course's own views show the text as it was recorded."""
    return text[1:] if text.startswith("'") and text.lstrip("'").startswith(_FORMULA_START) else text


def _safe_text(column: str, text: str) -> str:
    """A text field as written: no NUL bytes (they make a CSV unreadable), "\\r" line ends as "\\n", at most
    :data:`TEXT_LIMIT` characters (warned), neutralized against spreadsheet formulas."""
    if "\x00" in text or "\r" in text:  # csv quotes "\n" but not a lone "\r", which would split the row
        text = text.replace("\x00", "").replace("\r\n", "\n").replace("\r", "\n")
    if len(text) > TEXT_LIMIT:
        warnings.warn(
            f"the {column} text has {len(text)} characters: recorded its first {TEXT_LIMIT} (a spreadsheet cell "
            f"holds at most 32,767)",
            stacklevel=3,
        )
        text = text[:TEXT_LIMIT] + " [cut]"
    return neutralize(text)


def read_rows(path: str | Path) -> pd.DataFrame:
    """One results CSV as a DataFrame, keeping every good row.

    A row with the wrong number of fields (an extra comma, a line torn by a killed process), a non-number in a
    numeric column, NUL bytes (the zeroed tail a crash leaves) or an oversized field is skipped with one
    warning naming the file, its line numbers and the cause; rows after it still load, also after a row torn
    inside a quoted note (:func:`course_utils.show.results_file.parse_rows` re-synchronises). Repeated header lines
    (left by older, unlocked concurrent writes) are dropped; text fields come back as recorded (see
    :func:`unneutralize`). Raises ``ValueError`` (or ``OSError``) naming the cause when the file is not a
    UTF-8, comma-separated CSV at all (a cp1252 or semicolon-separated re-save from a spreadsheet).
    """
    path = Path(path)
    text = results_file.decode(path.read_bytes())
    old_limit = csv.field_size_limit(max(csv.field_size_limit(), 1 << 26))  # older files' long notes still load
    try:
        header, good, bad = results_file.parse_rows(text, NUMERIC_COLUMNS)
    finally:
        csv.field_size_limit(old_limit)
    numeric = {i for i, c in enumerate(header) if c in NUMERIC_COLUMNS}
    good = [[f if i in numeric else unneutralize(f) for i, f in enumerate(row)] for row in good]
    dropped = [b for b in bad if b.endswith("(value dropped, row kept)")]
    bad = [b for b in bad if b not in dropped]
    for what, items in (("skipped {} malformed row(s)", bad), ("dropped {} value(s) that are not numbers", dropped)):
        if items:
            more = f" and {len(items) - 5} more" if len(items) > 5 else ""
            warnings.warn(
                f"{what.format(len(items))} of results file {path} ({'; '.join(items[:5])}{more}); "
                f"kept its {len(good)} good row(s)",
                stacklevel=2,
            )
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows([header, *good])
    buf.seek(0)
    return pd.read_csv(buf, dtype={"lesson": str})


def load_results(paths: Iterable[str | Path] | None = None) -> pd.DataFrame:
    """Read result CSVs (default: every ``*.csv`` in the results folder) into one DataFrame.

    Malformed rows are skipped by :func:`read_rows` (warned, the file's good rows kept); a file that cannot be
    read at all or lacks the course's columns is skipped with a warning naming it; the other files are still
    loaded. Returns an empty frame with :data:`COLUMNS` when nothing loads.
    """
    if paths is None:
        paths = sorted(results_dir(write=False).glob("*.csv"))
    frames = []
    for p in paths:
        p = Path(p)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                df = read_rows(p)
        except Exception as exc:  # noqa: BLE001 - any unreadable file is skipped, loudly
            warnings.warn(f"skipped results file {p}: cannot be read ({type(exc).__name__}: {exc})", stacklevel=2)
            continue
        for w in caught:
            warnings.warn(str(w.message), w.category, stacklevel=2)
        missing = {"lesson", "technique", "median_ms", "machine"} - set(df.columns)
        if missing:
            warnings.warn(f"skipped results file {p}: missing columns {sorted(missing)}", stacklevel=2)
            continue
        df["source"] = p.name
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=COLUMNS + ["source"])
    return pd.concat(frames, ignore_index=True)


def reference_results(lesson: str | None = None, *, folder: Path | None = None) -> pd.DataFrame:
    """Results measured on real GPUs and shipped in ``data/reference/`` (optionally one lesson's rows)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = load_results(sorted(Path(folder or REFERENCE_DIR).glob("*.csv")))
    if lesson is not None and not df.empty:
        df = df[df["lesson"].astype(str).str.zfill(2) == str(lesson).zfill(2)]
    return df


def show_reference(lesson: str, technique_contains: str = "", *, folder: Path | None = None) -> pd.DataFrame | None:
    """Show shipped GPU reference rows for ``lesson`` (labelled with GPU, torch and date), or say there are none.

    Called in the ``else`` branch of a GPU-only section, so a learner without a GPU still sees real numbers.
    The table is displayed here (rich table in a notebook, text in a plain script), because a value returned
    inside an ``else:`` branch is never shown; the frame is also returned for code that wants it.
    """
    from IPython.display import display

    df = reference_results(lesson, folder=folder)
    if technique_contains and not df.empty:
        df = df[df["technique"].str.contains(technique_contains, case=False, na=False, regex=False)]
    if df.empty:
        print(
            f"No GPU reference results are shipped for lesson {lesson} yet: this GPU path has not been executed "
            "on a GPU by the course (see its verification level in README). Run it on a CUDA machine to see its "
            "numbers."
        )
        return None
    cols = [c for c in ["technique", "model", "dtype", "batch_size", "median_ms", "throughput", "speedup_vs_baseline",
                        "gpu", "torch", "time"] if c in df.columns]  # fmt: skip
    gpus = ", ".join(sorted(df["gpu"].dropna().astype(str).unique())) or "an unnamed GPU"
    print(f"Reference results measured on {gpus} (not this machine):")
    table = df[cols].reset_index(drop=True)
    with pd.option_context("display.max_columns", None, "display.width", 200):  # a script shows every column
        display(table)
    return table
