"""One results CSV, read and repaired so that no complete row is lost to a writer killed mid-row.

:mod:`course_utils.show.results` writes and reads these files; this module holds what a fault needs:

* :func:`complete_part`: under the writer's lock, where the file's complete rows end. A writer killed inside a
  quoted note leaves an open quote: ending the torn line with a newline is not enough, because a CSV reader is
  still inside the quote and swallows every row appended after it. The writer cuts the torn tail off first
  (its bytes are kept beside the file, see :func:`course_utils.supply.paths.append_text`).
* :func:`parse_rows`: the reader re-synchronises: a record that runs over several lines and is not a whole
  row (a torn row of an older file, which swallowed the rows after it) is skipped as one bad line, and
  reading goes on at the next line, so the rows after the tear load again.
* :func:`decode`: the file's text; a character cut at the very end of the file (the last bytes of a killed
  writer) does not make the whole file unreadable.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator


def decode(data: bytes) -> str:
    """A results file's text; ``ValueError`` naming the cause when it is not a UTF-8 comma-separated file."""
    try:
        text = data.decode("utf-8-sig")  # a spreadsheet's "CSV UTF-8" starts with a byte-order mark
    except UnicodeDecodeError as exc:
        if exc.end != len(data) or exc.reason != "unexpected end of data":
            raise ValueError(
                f"it is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}: saved by a spreadsheet "
                "as cp1252/'ANSI'?); save it again as 'CSV UTF-8 (comma delimited)'"
            ) from None
        text = data[: exc.start].decode("utf-8-sig")  # a character cut by a killed writer: its row is torn anyway
    first = text.split("\n", 1)[0]
    if first.count(";") >= 3 and "," not in first.replace('","', ""):
        raise ValueError(
            "its fields are separated by ';' (a spreadsheet in a decimal-comma locale saved it): save it again "
            "with ',' as the separator and '.' for decimals"
        )
    return text


def _fields(line: str) -> list[str] | None:
    """The fields of one physical line read as a whole record, or None when it is not one (an open quote)."""
    if line.count('"') % 2:
        return None
    try:
        return next(csv.reader([line]), [])
    except csv.Error:
        return None


def complete_part(data: bytes) -> tuple[int, str]:
    """``(length of the file's complete rows, text to write before the next row)`` for a results file's bytes.

    Python's CSV writer doubles every quote inside a quoted field, so a newline ends a row exactly when the
    quotes before it are even in number. A torn tail is what follows the last such newline. It is cut only
    when it holds no line that is a whole row by itself: in a file torn by an older writer, rows appended
    after the tear are kept, the open quote is closed instead, and the reader re-synchronises on them.
    """
    if not data or (data.endswith(b"\n") and data.count(b'"') % 2 == 0):
        return len(data), ""
    end = pos = quotes = 0
    for line in data.split(b"\n")[:-1]:
        pos += len(line) + 1
        quotes += line.count(b'"')
        if quotes % 2 == 0:
            end = pos
    text = data.decode("utf-8", errors="replace")
    header = _fields(text.split("\n", 1)[0]) if b"\n" in data else None
    tail = data[end:].decode("utf-8", errors="replace").split("\n")[1:]
    if header and any((f := _fields(line)) is not None and len(f) == len(header) for line in tail):
        odd = data.count(b'"') % 2 == 1
        return len(data), '"\n' if odd else ("" if data.endswith(b"\n") else "\n")
    return end, ""


class _Lines:
    """The physical lines of a text from line ``at`` on, counting how many a CSV reader took."""

    def __init__(self, lines: list[str], at: int) -> None:
        self.lines, self.at = lines, at

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self.at >= len(self.lines):
            raise StopIteration
        self.at += 1
        return self.lines[self.at - 1]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_rows(text: str, numeric_columns: list[str]) -> tuple[list[str], list[list[str]], list[str]]:
    """``(header, good rows as recorded, one 'line N: cause' per skipped row)`` of a results file's text.

    A row is good when it has the header's number of fields, no NUL bytes and numbers in ``numeric_columns``
    ('nan' is dropped from a row, which is kept). A bad record spanning several lines is skipped as its first
    line only, and reading starts again on the next line (re-synchronising after a torn row).
    """
    lines = io.StringIO(text, newline="").readlines()
    feed = _Lines(lines, 0)
    try:
        header = next(csv.reader(feed), None)
    except csv.Error as exc:
        raise ValueError(f"its header line cannot be parsed ({exc})") from None
    if not header or not any(h.strip() for h in header):
        raise ValueError("it is empty (no header line)")
    if "\x00" in "".join(header):
        raise ValueError("its header line holds NUL bytes (the file was damaged)")
    numeric = [i for i, c in enumerate(header) if c in numeric_columns]
    good, bad, at = [], [], feed.at
    while at < len(lines):
        feed = _Lines(lines, at)
        try:
            fields = next(csv.reader(feed))
        except StopIteration:
            break
        except csv.Error as exc:  # e.g. a field over the limit; reading goes on at the next line
            bad.append(f"line {at + 1}: {exc}")
            at += 1
            continue
        start, at = at, feed.at
        if not any(f.strip() for f in fields) or fields == header:
            continue
        problem = None
        if any("\x00" in f for f in fields):
            problem = "NUL bytes (a zeroed tail left by a crash, or a damaged line)"
        elif len(fields) != len(header):
            problem = f"{len(fields)} fields, header has {len(header)}"
        elif (wrong := next((i for i in numeric if fields[i].strip() and not _is_number(fields[i])), None)) is not None:
            problem = f"column '{header[wrong]}' holds {fields[wrong][:30]!r}"
        if problem is not None:
            if at - start > 1:  # a torn row that swallowed the lines after it: go on at its next line
                problem += f" (a row cut short on line {start + 1}; reading went on at the next line)"
                at = start + 1
            bad.append(f"line {start + 1}: {problem}")
            continue
        for i in numeric:  # 'nan' spelled out is no measurement: dropped (the leaderboard also drops inf, 1e308)
            if fields[i].strip().lower().lstrip("+-") == "nan":
                fields[i] = ""
                bad.append(f"line {start + 1}: column '{header[i]}' holds 'nan' (value dropped, row kept)")
        good.append(fields)
    return header, good, bad
