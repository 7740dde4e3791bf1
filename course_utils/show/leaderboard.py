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
import os
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
# Columns that may be below zero: a change against the baseline (lesson 12's accuracy change is negative when a
# variant is more accurate than its baseline). Every other column is a time, a rate or a size.
SIGNED = {"error_vs_baseline"}


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
            bad = (~np.isfinite(df[col]) & df[col].notna()) | (df[col].abs() > limit)
            if col not in SIGNED:
                bad |= df[col] < 0
            if bad.any():
                shown = ", ".join(f"{df.at[i, 'technique']!s} = {raw.at[i]!s}" for i in list(df.index[bad])[:3]) + (
                    f" and {int(bad.sum()) - 3} more" if bad.sum() > 3 else ""
                )
                warnings.warn(
                    f"dropped {int(bad.sum())} {col} value(s) of {source or 'the results'} that are not measurements "
                    f"({shown}; allowed: finite, {'-' + format(limit, 'g') if col in SIGNED else 0} to {limit:g})",
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


# Folders that never hold an attendee's results (a whole checkout copied into the room folder brings them along).
NOT_RESULTS = frozenset({".git", ".venv", "venv", "site-packages", "node_modules", "__pycache__", ".ipynb_checkpoints",
                         ".pytest_cache", ".ruff_cache"})  # fmt: skip


def _is_reference(f: Path) -> bool:
    """A shipped GPU reference run (``data/reference/*.csv``, or a CSV with its ``.env.json`` beside it)."""
    return (f.parent.name == "reference" and f.parent.parent.name == "data") or f.with_suffix(".env.json").is_file()


def result_files(folder: Path) -> list[Path]:
    """Every ``*.csv`` under ``folder``, at any depth (a copied ``results/`` or a whole copied checkout), sorted.

    Environments and caches (:data:`NOT_RESULTS`) are not entered; symbolic links to folders are not followed
    (no loops). A CSV that is no regular file, or is a shipped reference run, is left out with a warning saying
    why; an unreadable sub-folder is warned about too, so nothing is left out without a word.
    """
    found: list[Path] = []

    def unreadable(exc: OSError) -> None:
        warnings.warn(f"skipped {exc.filename}: cannot be read ({exc.strerror}); make it readable and collect again",
                      stacklevel=3)  # fmt: skip

    for top, dirs, names in os.walk(folder, onerror=unreadable):
        dirs[:] = sorted(d for d in dirs if d not in NOT_RESULTS)
        for n in sorted(names):
            f = Path(top) / n
            if not n.lower().endswith(".csv"):
                continue
            if not f.is_file():
                warnings.warn(f"skipped {f}: not a regular file", stacklevel=2)
            elif _is_reference(f):
                warnings.warn(f"skipped {f}: a shipped GPU reference run (data/reference), not this attendee's "
                              "measurement", stacklevel=2)  # fmt: skip
            else:
                found.append(f)
    return found


def _nearest_name(f: Path, top: Path) -> str:
    """The name in the ``attendee.txt`` nearest to ``f``: in its folder, else in each folder above, up to ``top``."""
    for folder in [f.parent, *f.parent.parents]:
        name = attendee_name(folder)
        if name or folder == top or top not in folder.parents:
            return name
    return ""


def _unique_labels(df: pd.DataFrame) -> pd.Series:
    """One label per identity (attendee folder and machine): a label two identities share (cloned lab machines,
    two attendees of one name on clones) gets the folder added, and the machine name if that is not enough."""
    ident = df["folder"].astype(str) + "/" + df["machine"].astype(str)
    label = df["label"].copy()
    for extra in (df["folder"].astype(str), ident):
        shared = label.groupby(label).transform(lambda s: ident[s.index].nunique() > 1)
        label = label.where(~shared, label + " · " + extra)
    return label


def room(root: str | Path) -> pd.DataFrame:
    """Every attendee's results under ``root`` in one frame, one ``label`` per attendee folder and machine.

    ``root`` holds one copy of a results folder per attendee (a sub-folder each, the CSVs at any depth inside:
    a copied ``results/`` or a whole copied checkout; :func:`result_files`). A CSV lying in ``root`` itself
    counts as its own attendee, named by its file. Each file is read by :func:`pool`, so damaged rows and files
    are skipped with the store's own warnings. The identity of a machine is its attendee folder with its
    machine name: cloned lab machines (one machine name in two folders) stay two machines. The label is the
    attendee's name (the nearest ``attendee.txt``, :func:`attendee_name`), if any, before the machine's own label
    (GPU or CPU, host and install id), plus the folder where two identities would share a label;
    ``attendee``, ``install_id``, ``folder`` and ``source`` (the file's path under ``root``) columns say the same
    separately.
    """
    root = Path(root)
    if not root.is_dir():
        raise BadArgumentError(f"{root} is not a folder: collect each attendee's results/ folder into one folder")
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise BadArgumentError(f"{root} cannot be read ({exc.strerror}): make it readable and collect again") from None
    frames = []
    for entry in entries:
        if entry.is_dir() and entry.name not in NOT_RESULTS:
            files = result_files(entry)
        elif entry.name.lower().endswith(".csv"):
            files = [entry] if entry.is_file() else []
            if not files:
                warnings.warn(f"skipped {entry}: not a regular file", stacklevel=2)
        else:
            continue
        for f in files:
            df = pool([f], origin="attendee")
            if df.empty:
                continue
            top = entry if entry.is_dir() else root
            name = _nearest_name(f, top) if entry.is_dir() else ""
            df["attendee"] = name
            df["install_id"] = [_install_id(m, f.parent) for m in df["machine"]]
            df["folder"] = entry.name
            df["source"] = str(f.relative_to(root))
            df["label"] = [(f"{name} · " if name else "") + _label(r) for _, r in df.iterrows()]
            frames.append(df)
    if not frames:
        return pd.DataFrame(columns=COLUMNS + ["source", "origin", "attendee", "install_id", "folder", "label"])
    out = pd.concat(frames, ignore_index=True)
    out["label"] = _unique_labels(out)
    return out


def _text(s: pd.Series) -> pd.Series:
    return s.astype(object).where(s.notna(), "").astype(str)


def latest_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The newest row per machine label and (lesson, technique, model, dtype, batch size): a machine's last
    measurement, not its best-ever one. Rows are ordered by their ``time`` stamp (ISO, 24-hour, so text order is
    time order); rows of one stamp keep the order they were read in, the last one read wins."""
    if df.empty:
        return df
    keys = ["label"] + KEYS
    df = df.copy()
    df["_t"] = _text(df["time"])  # a row without a stamp counts as the oldest
    out = df.sort_values("_t", kind="stable").groupby(keys, dropna=False, as_index=False).tail(1)
    return out.drop(columns="_t").reset_index(drop=True)


def leaderboard(df: pd.DataFrame, *, lesson: str | None = None, value: str = "median_ms") -> pd.DataFrame:
    """Machines side by side: one row per (lesson, technique, model, dtype, batch size), one column per machine,
    each cell the machine's newest row (:func:`latest_rows`).

    ``value`` is ``median_ms`` (lower is better), ``throughput`` or ``speedup_vs_baseline`` (higher is better).
    For the speed-up, the 95% intervals the lessons recorded ride along in ``table.attrs`` (``"low"``,
    ``"high"``: ``{label: {row key: value}}``), which :func:`plot` draws as whiskers.
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
    table = df.pivot_table(index=KEYS, columns="label", values=value, aggfunc="last").dropna(how="all")
    table.attrs["value"] = value
    if value == "speedup_vs_baseline" and {"speedup_low", "speedup_high"} <= set(df.columns):
        for end in ("low", "high"):
            side = df.dropna(subset=[f"speedup_{end}"])
            if side.empty:
                continue
            wide = side.pivot_table(index=KEYS, columns="label", values=f"speedup_{end}", aggfunc="last")
            table.attrs[end] = {str(c): {k: float(v) for k, v in wide[c].dropna().items()} for c in wide.columns}
    return table


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


def _side(table: pd.DataFrame, end: str) -> pd.DataFrame:
    """The ``end`` ("low"/"high") interval values :func:`leaderboard` attached, shaped like ``table`` (NaN: none)."""
    given = table.attrs.get(end) or {}
    return pd.DataFrame(
        [[given.get(str(c), {}).get(k, np.nan) for c in table.columns] for k in table.index],
        index=table.index,
        columns=table.columns,
        dtype=float,
    )


NOISE_HATCH = "//"  # a bar whose 95% interval holds 1x: no difference beyond the machine's noise


def plot(table: pd.DataFrame, *, title: str = "Leaderboard", xlabel: str = "median ms (lower is better)"):
    """Grouped horizontal bars of a :func:`leaderboard` table: one group per row, one bar per machine.

    A speed-up table gets its 95% intervals as whiskers (where the lesson recorded one), a dashed line at 1x
    (the baseline) and hatching on each bar whose interval holds 1x: no difference beyond that machine's noise.
    Each bar's ``gid`` is ``"<row> | <machine>"``, so the drawn data can be read back.
    """
    import matplotlib.pyplot as plt

    if table.empty:
        fig, ax = plt.subplots(figsize=(6, 1.5))
        ax.text(0.5, 0.5, "no results yet", ha="center", va="center")
        ax.set_axis_off()
        return fig
    labels = [" · ".join(str(v) for v in (k if isinstance(k, tuple) else (k,)) if str(v) not in ("", "-1"))
              for k in table.index]  # fmt: skip
    speedup = table.attrs.get("value") == "speedup_vs_baseline" or "speed-up" in xlabel or "speedup" in xlabel
    low, high = _side(table, "low"), _side(table, "high")
    n, m = len(table), max(1, len(table.columns))
    fig, ax = plt.subplots(figsize=(9, 0.35 * n * m / 1.5 + 1.8))
    height = 0.8 / m
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, col in enumerate(table.columns):
        mid = table[col].to_numpy(dtype=float)
        lo, hi = low[col].to_numpy(), high[col].to_numpy()
        has = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(mid)
        ys = np.arange(n) - 0.4 + height * (j + 0.5)
        noisy = has & (lo <= 1.0) & (hi >= 1.0) if speedup else np.zeros(n, bool)
        bars = ax.barh(ys, np.nan_to_num(mid), height=height, color=colors[j % len(colors)], label=str(col))
        for i, bar in enumerate(bars):
            bar.set_gid(f"{labels[i]} | {col}")
            if noisy[i]:
                bar.set_hatch(NOISE_HATCH)
                bar.set_alpha(0.6)
        if has.any():
            err = np.vstack([mid[has] - lo[has], hi[has] - mid[has]]).clip(min=0)  # an estimate outside: no arm
            ax.errorbar(mid[has], ys[has], xerr=err, fmt="none", ecolor="black", capsize=3, lw=1,
                        gid=f"interval | {col}")  # fmt: skip
    if speedup:
        ax.axvline(1.0, color="gray", ls="--", lw=1, gid="1x", label="1x = the baseline")
    ax.set_yticks(np.arange(n), labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel + ("; whiskers: 95% interval; hatched: interval holds 1x" if low.notna().any().any() else ""))
    ax.set_title(title)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig
