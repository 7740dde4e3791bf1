"""One board for the room: every attendee's results in one leaderboard and one HTML page for the projector.

    make collect FROM=dir                              # = python -m scripts.collect dir --out build/collect

``dir`` holds one copy of a results folder per attendee (a sub-folder each: their ``results/``, or a whole
copied checkout, the CSVs found at any depth; an ``attendee.txt`` names the attendee). A machine is its folder
with its machine name, so cloned lab machines (one machine name in two folders) stay apart.
:func:`course_utils.show.leaderboard.room` reads them with the results store's own reader, so a torn or
malformed row is skipped with the store's warning and the file's other rows are kept; a value that is no
measurement (inf, negative) is dropped. The board keeps, per lesson and machine, among the machine's newest row
of each technique, the one with the highest speed-up over its lesson's baseline, with the 95% interval the
lesson measured. Nobody is left off without a word: every file, row or lesson that is not on the board is
listed as skipped, with the reason.

Writes ``<out>/leaderboard.csv`` (text cells neutralized against spreadsheet formulas, as the store writes
them; a note over the store's 32,000 characters is cut there, saying so, so that a spreadsheet and Python's
``csv`` with its default field limit read the file back) and ``<out>/index.html`` (every text HTML-escaped,
notes cut to :data:`NOTE_SHOWN` characters; no script, no external file), and prints the board.
"""

from __future__ import annotations

import argparse
import html
import math
import sys
import time
import warnings
from pathlib import Path

import pandas as pd

from course_utils.measuring.intervals import NO_DIFFERENCE
from course_utils.show import leaderboard
from course_utils.show.results import TEXT_LIMIT, neutralize
from course_utils.supply.errors import BadArgumentError

ROOT = Path(__file__).resolve().parent.parent

BOARD_COLUMNS = ["attendee", "install_id", "folder", "speedup_vs_baseline", "speedup_low", "speedup_high",
                 "median_ms", "model", "dtype", "batch_size", "mode", "time", "source", "notes"]  # fmt: skip


def room_board(df: pd.DataFrame) -> pd.DataFrame:
    """Per lesson and machine, the best technique (:func:`leaderboard.best_technique`); best first per lesson."""
    extra = [c for c in BOARD_COLUMNS if c in df.columns]
    lessons = sorted(set(df["lesson"].dropna().astype(str)))
    parts = [leaderboard.best_technique(df, n, extra=extra).assign(lesson=n) for n in lessons]
    parts = [p for p in parts if not p.empty]
    cols = ["lesson", "label", "technique", *extra]
    if not parts:
        return pd.DataFrame(columns=cols)
    board = pd.concat(parts, ignore_index=True)
    board = board.sort_values(["lesson", "speedup_vs_baseline"], ascending=[True, False], kind="stable")
    return board[cols].reset_index(drop=True)


def _num(x: object) -> float | None:
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def verdict(row: pd.Series) -> str:
    """The speed-up as the lesson measured it, phrased from its 95% interval when the row carries one."""
    mid, low, high = (_num(row.get(c)) for c in ("speedup_vs_baseline", "speedup_low", "speedup_high"))
    if mid is None:
        return ""
    if low is None or high is None:
        return f"{mid:.3g}x (no interval recorded)"
    span = f"95% interval {low:.3g}-{high:.3g}"
    if low <= 1.0 <= high:
        return f"{NO_DIFFERENCE} ({span})"
    return f"{mid:.3g}x {'faster' if low > 1 else 'slower'} ({span})"


NOTE_SHOWN = 160  # characters of a note on the projector page; the CSV keeps the text


def cut(text: object, limit: int, where: str) -> object:
    """``text`` cut to ``limit`` characters, saying how long it was and ``where`` the whole text is."""
    if not isinstance(text, str) or len(text) <= limit:
        return text
    return f"{text[:limit]} [cut: {len(text):,} characters; the whole text is in {where}]"


def write_csv(board: pd.DataFrame, path: Path) -> None:
    """The board as CSV, every text cell neutralized as the results store writes it (a note ``=cmd|...``
    opens as text, not as a formula). A text over the store's own limit (:data:`TEXT_LIMIT`, which only a file
    not written by the store can hold) is cut, naming the attendee's file that has it whole: csv's default
    field limit (131,072) and a spreadsheet cell (32,767) both read the board back."""
    out = board.copy()
    sources = out["source"] if "source" in out.columns else pd.Series("", index=out.index)
    for col in out.columns:
        out[col] = [neutralize(cut(v, TEXT_LIMIT, f"the attendee's file {src or '(unknown)'}"))
                    if isinstance(v, str) else v for v, src in zip(out[col], sources, strict=True)]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(path, index=False)


def _cell(v: object) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return html.escape(f"{v:.4g}" if isinstance(v, float) else str(v))


def _table(rows: list[list[object]], header: list[str], *, first: bool = False) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    top = "<tr class='top'>" if first else "<tr>"
    body = "".join(
        (top if i == 0 else "<tr>") + "".join(f"<td>{_cell(v)}</td>" for v in r) + "</tr>" for i, r in enumerate(rows)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


CSS = """body{font:20px/1.4 system-ui,sans-serif;margin:2em;background:#fff;color:#111}
h1{font-size:2em}h2{margin-top:1.5em}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #bbb;padding:.3em .7em;text-align:left;vertical-align:top}
th{background:#eee}tr.top td{background:#e6f4e6;font-weight:600}.small{font-size:.75em;color:#444}"""


def render_html(board: pd.DataFrame, who: pd.DataFrame, skipped: list[str], source: Path) -> str:
    """The projector page: one table per lesson (best machine first), who is on the board, what was skipped."""
    parts = [
        f"<h1>Workshop leaderboard</h1><p class='small'>{_cell(len(who))} machine(s) from {_cell(str(source))}, "
        f"collected {_cell(time.strftime('%Y-%m-%d %H:%M'))}. Each row: a machine's best technique in the "
        "lesson, among its newest row of each technique, by the speed-up over the lesson's baseline that the "
        "machine measured.</p>"
    ]
    for lesson, sub in board.groupby("lesson", sort=True):
        rows = [[r["label"], r["technique"], verdict(r), r.get("median_ms"), r.get("mode"),
                 cut(r.get("notes"), NOTE_SHOWN, "leaderboard.csv")] for _, r in sub.iterrows()]  # fmt: skip
        parts.append(f"<h2>Lesson {_cell(lesson)}</h2>")
        parts.append(_table(rows, ["machine", "best technique", "speed-up", "median ms", "mode", "notes"], first=True))
    if board.empty:
        parts.append("<p>No results yet: collect each attendee's results/ folder into the folder given.</p>")
    if not who.empty:
        cols = ["label", "gpu", "cpu", "torch", "mode", "rows", "lessons", "newest"]
        parts += ["<h2>Who is on the board</h2>", _table(who[cols].values.tolist(), cols)]
    if skipped:
        items = "".join(f"<li>{_cell(s)}</li>" for s in skipped)
        parts += [f"<h2>Skipped ({len(skipped)})</h2><ul class='small'>{items}</ul>"]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Workshop leaderboard</title>"
        f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>\n"
    )


def unranked(rows: pd.DataFrame, board: pd.DataFrame) -> list[str]:
    """One line per machine and lesson whose rows are loaded but not on the board (no speed-up recorded)."""
    if rows.empty:
        return []
    on = set(zip(board["label"], board["lesson"], strict=True)) if not board.empty else set()
    lines = []
    for (label, lesson), sub in rows.groupby(["label", "lesson"], sort=True):
        if (label, lesson) not in on:
            lines.append(f"{label}: lesson {lesson}'s {len(sub)} row(s) ({', '.join(sorted(set(sub['source'])))}) "
                         "carry no speed-up over the lesson's baseline, so there is nothing to rank")  # fmt: skip
    return lines


class OutError(Exception):
    """The board cannot be written where asked."""


def collect(source: Path, out: Path) -> tuple[pd.DataFrame, list[str]]:
    """Read every attendee folder under ``source``, write the board's CSV and HTML; (board, skipped lines)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = leaderboard.room(source)
    skipped = [str(w.message) for w in caught]
    board = room_board(rows)
    skipped += unranked(rows, board)
    page = render_html(board, leaderboard.machines(rows), skipped, source)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_csv(board, out / "leaderboard.csv")
        (out / "index.html").write_text(page, encoding="utf-8")
    except OSError as exc:
        raise OutError(
            f"cannot write the board into {out} ({type(exc).__name__}: {exc.strerror or exc}): give a folder you "
            "can write, --out DIR (make collect COLLECT_OUT=DIR)"
        ) from None
    return board, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="one copy of results/ per attendee inside (a sub-folder each)")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "collect")
    args = ap.parse_args(argv)
    try:
        board, skipped = collect(args.source, args.out)
    except (BadArgumentError, OutError) as exc:
        print(f"collect: {exc}", file=sys.stderr)
        return 2
    for line in skipped:
        print(f"skipped: {line}", file=sys.stderr)
    shown = board.assign(speedup=[verdict(r) for _, r in board.iterrows()])[["lesson", "label", "technique", "speedup"]]
    with pd.option_context("display.width", 200, "display.max_colwidth", 60):
        print(shown.to_string(index=False) if not board.empty else "no results yet")
    print(f"wrote {args.out / 'leaderboard.csv'} and {args.out / 'index.html'} (open it on the projector)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
