"""The leaderboard: this machine's results beside shipped GPU reference runs and workshop attendees' files.

Every lesson appends rows to ``<results folder>/<machine>.csv`` (:mod:`course_utils.show.results`). A workshop
collects those files from every attendee into one folder; :func:`pool` reads them (a malformed file is
skipped with a warning naming it, and nothing else is lost), :func:`load` adds the shipped reference runs
from ``data/reference/`` (labelled with GPU, versions and date), and :func:`leaderboard` puts machines side
by side for each lesson and technique. :func:`machines` lists who is on the board. For the room's one board
(``make collect``), :func:`room` reads one copy of a results folder per attendee, labelled by the name the
attendee wrote into ``attendee.txt`` and the install id.
"""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from course_utils.show.machine_label import INSTALL_ID_FILE
from course_utils.show.results import (
    COLUMNS,
    NUMERIC_COLUMNS,
    REFERENCE_DIR,
    load_results,
    recorded_in_check,
    results_dir,
)
from course_utils.supply.errors import BadArgumentError

NUMERIC = NUMERIC_COLUMNS
KEYS = ["lesson", "technique", "model", "dtype", "batch_size"]


PLAUSIBLE_MAX = {"speedup_vs_baseline": 1e4}  # no technique in the course is 10,000x faster than its baseline
PLAUSIBLE_MAX_ANY = 1e12  # any other measured value (ms, items/s, error) above this is not a measurement


def _normalise(df: pd.DataFrame, source: str = "") -> pd.DataFrame:
    """Numeric columns as numbers (rows with non-numbers were already skipped by ``read_rows``), every course
    column present, lesson ids as two digits. A value that is not a measurement (``inf``,
    ``1e308``, a negative time) is dropped from the board with a warning naming the file, row and value: one
    bad number must not top the leaderboard."""
    df = df.copy()
    for col in NUMERIC:
        if col in df.columns:
            raw = df[col]
            df[col] = pd.to_numeric(raw, errors="coerce")
            limit = PLAUSIBLE_MAX.get(col, PLAUSIBLE_MAX_ANY)
            bad = (~np.isfinite(df[col]) & df[col].notna()) | (df[col].abs() > limit) | (df[col] < 0)
            if bad.any():
                shown = ", ".join(f"{df.at[i, 'technique']!s} = {raw.at[i]!s}" for i in list(df.index[bad])[:3]) + (
                    f" and {int(bad.sum()) - 3} more" if bad.sum() > 3 else ""
                )
                warnings.warn(
                    f"dropped {int(bad.sum())} {col} value(s) of {source or 'the results'} that are not measurements "
                    f"({shown}; allowed: finite, 0 to {limit:g})",
                    stacklevel=3,
                )
                df.loc[bad, col] = np.nan
    for col in COLUMNS:
        if col not in df.columns:
            df[col] = None
    df["lesson"] = df["lesson"].astype(str).str.zfill(2)
    return df


def pool(paths: Iterable[str | Path], *, origin: str = "attendee") -> pd.DataFrame:
    """Read a list of result files (or folders of them) into one frame with ``origin`` and ``source`` columns.

    Each file is read on its own: a malformed row (wrong field count, a non-number in a numeric column) is
    skipped with a warning naming the file and line, and the file's good rows load; a file that cannot be
    parsed, lacks the course's columns or has no good rows is skipped with a warning naming it.
    """
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        files += sorted(p.glob("*.csv")) if p.is_dir() else [p]
    frames = []
    for f in files:
        if not f.exists():
            warnings.warn(f"skipped results file {f}: it does not exist", stacklevel=2)
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            df = load_results([f])
        for w in caught:
            warnings.warn(str(w.message), stacklevel=2)
        if (marked := recorded_in_check(df)).any():  # an answer's own rows are no measurement of the lesson
            warnings.warn(f"kept {int(marked.sum())} row(s) of {f} off the board: recorded inside an exercise check "
                          "(by code an exercise check ran)", stacklevel=2)  # fmt: skip
            df = df[~marked]
        if df.empty:
            if not any("skipped results file" in str(w.message) for w in caught):
                warnings.warn(f"skipped results file {f}: it has no (good) rows", stacklevel=2)
            continue
        df = _normalise(df, str(f))
        df["origin"] = origin
        df["source"] = f.name
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=COLUMNS + ["source", "origin"])
    return pd.concat(frames, ignore_index=True)


def reference_env(csv_path: Path) -> dict:
    """The ``<name>.env.json`` shipped beside a reference CSV (GPU, driver, CUDA, versions, date), or {}."""
    env = csv_path.with_suffix(".env.json")
    if not env.exists():
        return {}
    try:
        return json.loads(env.read_text())
    except (OSError, ValueError) as exc:
        warnings.warn(f"ignored {env}: not valid JSON ({exc})", stacklevel=2)
        return {}


def references(folder: Path = REFERENCE_DIR) -> pd.DataFrame:
    """Shipped reference rows from real GPUs, with a ``label`` naming GPU, versions and date."""
    frames = []
    for f in sorted(Path(folder).glob("*.csv")):
        df = pool([f], origin="reference")
        if df.empty:
            continue
        env = reference_env(f)
        gpu = env.get("gpu") or (df["gpu"].dropna().astype(str).iloc[0] if df["gpu"].notna().any() else f.stem)
        fields = ("torch", "tensorrt", "onnxruntime", "cuda", "driver")
        versions = ", ".join(f"{k} {env[k]}" for k in fields if env.get(k))
        date = env.get("date") or str(df["time"].dropna().astype(str).max())[:10]
        df["label"] = f"reference: {gpu} ({versions or 'torch ' + str(df['torch'].iloc[0])}; {date})"
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=COLUMNS + ["source", "origin", "label"])
    return pd.concat(frames, ignore_index=True)


def _label(row: pd.Series) -> str:
    """``<GPU or CPU> [<host>]``, plus the install id when the machine name carries one (``host_hw_id``), so
    attendees on identical machine images get distinct labels and neither's rows replace the other's."""
    hw = row.get("gpu") if isinstance(row.get("gpu"), str) and row.get("gpu") else row.get("cpu") or "?"
    machine = str(row.get("machine") or "")
    host = machine.split("_", 1)[0]
    parts = machine.split("_")
    who = f"{host} #{parts[-1]}" if len(parts) >= 3 and re.fullmatch(r"[0-9a-f]{6}", parts[-1]) else host
    mode = row.get("mode")
    return f"{hw} [{who}]" + (f" ({mode})" if isinstance(mode, str) and mode == "smoke" else "")


def load(
    folder: str | Path | None = None, *, extra: Iterable[str | Path] = (), include_reference: bool = True
) -> pd.DataFrame:
    """This machine's results folder (default :func:`course_utils.show.results.results_dir`), extra attendee
    files or folders, and the shipped references, in one frame with a ``label`` per machine."""
    folder = Path(folder) if folder is not None else results_dir(write=False)  # reading only: read-only is fine
    own = pool([folder], origin="this folder") if folder.exists() else pool([], origin="this folder")
    parts = [own, pool(list(extra), origin="attendee")]
    for p in parts:
        if not p.empty:
            p["label"] = p.apply(_label, axis=1)
    if include_reference:
        parts.append(references())
    parts = [p for p in parts if not p.empty]
    if not parts:
        return pd.DataFrame(columns=COLUMNS + ["source", "origin", "label"])
    return pd.concat(parts, ignore_index=True)


ATTENDEE_FILE = "attendee.txt"  # in a results folder: the name its attendee wants on the room's board
NAME_LIMIT = 40


def attendee_name(folder: Path) -> str:
    """The name in ``folder/attendee.txt``: its first line, printable characters only, at most 40; else ''."""
    path, first = Path(folder) / ATTENDEE_FILE, ""
    with contextlib.suppress(OSError):
        if path.is_file():  # a FIFO or a folder of that name is no name (and must not block the read)
            with open(path, "rb") as f:
                first = f.read(4 * NAME_LIMIT).decode("utf-8", "replace").split("\n")[0]
    return "".join(c for c in first if c.isprintable()).strip()[:NAME_LIMIT]


def _install_id(machine: object, folder: Path) -> str:
    """The install id a row's machine name ends with (``host_hw_id``), else the folder's ``.install_id``."""
    m = re.search(r"_([0-9a-f]{6})$", str(machine or ""))
    if m:
        return m.group(1)
    try:
        return re.sub(r"[^0-9a-f]", "", (folder / INSTALL_ID_FILE).read_text(errors="replace").split()[0])[:12]
    except (OSError, IndexError):
        return ""


def room(root: str | Path) -> pd.DataFrame:
    """Every attendee's results under ``root`` in one frame, one ``label`` per attendee and machine.

    ``root`` holds one copy of a results folder per attendee (a sub-folder each; CSV files lying in ``root``
    itself count as one more, unnamed). Each file is read by :func:`pool`, so damaged rows and files are
    skipped with the store's own warnings; only regular files are read (a FIFO would block). The label is
    the attendee's name (:func:`attendee_name`), if any, before the machine's own label (GPU or CPU, host and
    install id); ``attendee``, ``install_id`` and ``folder`` columns say the same separately.
    """
    root = Path(root)
    if not root.is_dir():
        raise BadArgumentError(f"{root} is not a folder: collect each attendee's results/ folder into one folder")
    frames = []
    for folder in [root, *sorted(p for p in root.iterdir() if p.is_dir())]:
        files = [f for f in sorted(folder.glob("*.csv")) if f.is_file()]
        for f in sorted(set(folder.glob("*.csv")) - set(files)):
            warnings.warn(f"skipped {f}: not a regular file", stacklevel=2)
        df = pool(files, origin="attendee") if files else pd.DataFrame()
        if df.empty:
            continue
        name = attendee_name(folder) if folder != root else ""
        df["attendee"] = name
        df["install_id"] = [_install_id(m, folder) for m in df["machine"]]
        df["folder"] = folder.name if folder != root else ""
        df["label"] = [(f"{name} · " if name else "") + _label(r) for _, r in df.iterrows()]
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=COLUMNS + ["source", "origin", "attendee", "install_id", "folder", "label"])
    return pd.concat(frames, ignore_index=True)


def _text(s: pd.Series) -> pd.Series:
    return s.astype(object).where(s.notna(), "").astype(str)


def latest_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The newest row per machine label and (lesson, technique, model, dtype, batch size)."""
    if df.empty:
        return df
    keys = ["label"] + KEYS
    df = df.copy()
    df["_t"] = df["time"].astype(str)
    out = df.sort_values("_t").groupby(keys, dropna=False, as_index=False).tail(1)
    return out.drop(columns="_t").reset_index(drop=True)


def leaderboard(df: pd.DataFrame, *, lesson: str | None = None, value: str = "median_ms") -> pd.DataFrame:
    """Machines side by side: one row per (lesson, technique, model, dtype, batch size), one column per machine.

    ``value`` is ``median_ms`` (lower is better), ``throughput`` or ``speedup_vs_baseline`` (higher is better).
    """
    if value not in NUMERIC:
        raise BadArgumentError(f"value must be one of {NUMERIC}, got '{value}'")
    if df.empty:
        return pd.DataFrame()
    if lesson is not None:
        df = df[df["lesson"].astype(str) == str(lesson).zfill(2)]
        if df.empty:
            return pd.DataFrame()
    df = latest_rows(df)
    df = df.assign(batch_size=df["batch_size"].fillna(-1).astype(int), dtype=_text(df["dtype"]),
                   model=_text(df["model"]))  # fmt: skip
    table = df.pivot_table(index=KEYS, columns="label", values=value, aggfunc="last")
    return table.dropna(how="all")


def machines(df: pd.DataFrame) -> pd.DataFrame:
    """Who is on the board: label, origin, GPU, CPU, torch, mode, rows and lessons, newest time."""
    if df.empty:
        return pd.DataFrame(columns=["label", "origin", "gpu", "cpu", "torch", "mode", "rows", "lessons", "newest"])
    g = df.groupby("label", dropna=False)
    out = pd.DataFrame({
        "origin": g["origin"].first(),
        "gpu": g["gpu"].first(),
        "cpu": g["cpu"].first(),
        "torch": g["torch"].first(),
        "mode": g["mode"].agg(lambda s: ", ".join(sorted(set(s.dropna().astype(str))))),
        "rows": g.size(),
        "lessons": g["lesson"].agg(lambda s: ", ".join(sorted(set(s.astype(str))))),
        "newest": g["time"].max(),
    })  # fmt: skip
    return out.reset_index()


def best_technique(df: pd.DataFrame, lesson: str, *, extra: Iterable[str] = ()) -> pd.DataFrame:
    """Per machine, the technique with the highest ``speedup_vs_baseline`` in ``lesson`` (and ``extra`` columns)."""
    cols = list(dict.fromkeys(["label", "technique", "speedup_vs_baseline", "median_ms", *extra]))
    sub = latest_rows(df[df["lesson"].astype(str) == str(lesson).zfill(2)])
    sub = sub.dropna(subset=["speedup_vs_baseline"])
    if sub.empty:
        return pd.DataFrame(columns=cols)
    idx = sub.groupby("label")["speedup_vs_baseline"].idxmax()
    return sub.loc[idx, cols].reset_index(drop=True)


def plot(table: pd.DataFrame, *, title: str = "Leaderboard", xlabel: str = "median ms (lower is better)"):
    """Grouped horizontal bars of a :func:`leaderboard` table: one group per row, one bar per machine."""
    import matplotlib.pyplot as plt

    if table.empty:
        fig, ax = plt.subplots(figsize=(6, 1.5))
        ax.text(0.5, 0.5, "no results yet", ha="center", va="center")
        ax.set_axis_off()
        return fig
    labels = [" · ".join(str(v) for v in (k if isinstance(k, tuple) else (k,)) if str(v) not in ("", "-1"))
              for k in table.index]  # fmt: skip
    table = table.copy()
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(table) * max(1, len(table.columns)) / 1.5 + 1.8))
    table.index = labels
    table.plot.barh(ax=ax)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig
