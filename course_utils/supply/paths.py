"""Where things are: the repository, its shipped data, and the folders the course's path switches name.

One place for paths, imported by every other module, importing no other course module but ``errors``
(so ``modes`` and ``results`` no longer import each other). Every path switch (``COURSE_RESULTS_DIR``,
``COURSE_LLM_CACHE``) is read by :func:`resolve_path_setting` the same way whatever folder a notebook kernel or
script runs in: ``~`` and ``$VARS`` are expanded; quotes kept in the value, a URL, an unset ``$VARIABLE`` or
``~nosuchuser`` raise :class:`SettingError` naming the variable; a relative path is taken from the repository
root (results) or refused (the model cache: 540 MB must not land in the workspace); and
:func:`ensure_writable` turns a folder that cannot be created or written into one :class:`SettingError` naming
the folder, the variable and the fix, instead of an ``OSError`` deep inside pandas or a stray
``notebooks/~/`` folder.
:func:`append_text` appends to a file shared by concurrent processes (results CSVs, the section record)
under an exclusive lock, so four lessons writing their first row at once still give one header.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; appends are still single writes
    fcntl = None  # type: ignore[assignment]

from course_utils.supply.errors import SettingError

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"
REFERENCE_DIR = DATA_DIR / "reference"
RESULTS_VAR = "COURSE_RESULTS_DIR"

_writable: set[Path] = set()  # folders already checked in this process (the check writes a file)


def _bad_value(raw: str, expanded: str) -> str | None:
    """Why a path switch's value cannot name a folder (None when it can): each of these would
    otherwise become a stray folder inside the checkout (``results/$SCRATCH``, ``~nosuchuser``, ``file:``)."""
    if raw[:1] in "'\"" or raw[-1:] in "'\"":
        return "it contains quote characters (the shell did not remove them): set the path without quotes"
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+://", raw):
        plain = re.sub(r"^file://(localhost)?", "", raw) if raw.startswith("file:") else "/path/to/folder"
        return f"it is a URL, not a path: set a plain path such as {plain!r}"
    unset = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expanded)
    if unset:
        return f"it uses the variable ${unset[0]}, which is not set: set ${unset[0]} first or write the path out"
    if expanded.startswith("~"):
        user = expanded[1:].split("/", 1)[0]
        return f"'~{user}' names no user on this machine: write the path out (e.g. {str(Path.home())!r}/...)"
    return None


def resolve_path_setting(var: str, value: str | None, *, default: Path, relative_to: Path | None,
                         example: str) -> Path:  # fmt: skip
    """The folder a path switch's value names, without touching the disk.

    Empty or unset means ``default``; ``~`` and ``$VARS`` are expanded. A relative path is taken from
    ``relative_to``, or refused when that is None (it would be taken from whatever folder the kernel runs in).
    A value that cannot name a folder (quotes kept in the value, a ``file://`` URL, an unset ``$VARIABLE``,
    ``~nosuchuser``) raises :class:`SettingError` naming ``var`` and saying why, instead of creating a folder of
    that name inside the checkout.
    """
    raw = (value or "").strip()
    if not raw:
        return default
    expanded = os.path.expandvars(os.path.expanduser(raw))
    why = _bad_value(raw, expanded)
    if not why and relative_to is None and not os.path.isabs(expanded):
        why = (f"it is a relative path, which would be taken inside whatever folder the notebook runs in (the "
               f"workspace or the repository): write an absolute path such as {example!r}")  # fmt: skip
    if why:
        raise SettingError(f"{var}={raw!r} cannot be used: {why}; then restart the kernel.")
    path = Path(expanded)
    return path if path.is_absolute() else (relative_to / path).resolve()


def resolve_results_dir(value: str | None) -> Path:
    """The folder a ``COURSE_RESULTS_DIR`` value names (:func:`resolve_path_setting`): empty means ``results/``
    in the repository, and a relative path is relative to the repository root (not to the folder the kernel
    happens to start in)."""
    return resolve_path_setting(RESULTS_VAR, value, default=REPO_ROOT / "results", relative_to=REPO_ROOT,
                                example="~/course-results")  # fmt: skip


def suggestion(path: Path, candidates: tuple[str, ...]) -> str:
    """A folder to suggest instead of ``path``: never ``path`` itself (nor a folder inside it)."""
    for candidate in candidates:
        full = Path(os.path.expanduser(candidate))
        if full != path and path not in full.parents:
            return candidate
    return "/path/to/a/folder/you/can/write"


def ensure_writable(path: Path, var: str, *, what: str, suggest: tuple[str, ...]) -> None:
    """Create ``path`` if needed and write a file in it; else raise one :class:`SettingError` naming the
    folder (``what`` it is), the switch ``var`` it came from and a folder to set instead (from ``suggest``)."""
    if path in _writable and path.is_dir():
        return
    raw = os.environ.get(var)
    source = f"{var}={raw!r}" if raw and raw.strip() else f"the default {what} ({var} unset)"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # a real write: os.access says yes to root on read-only mounts
            pass
    except OSError as exc:
        raise SettingError(
            f"the {what} {path} from {source} cannot be written ({type(exc).__name__}: {exc.strerror or exc}). "
            f"Set {var} to a folder you can write, e.g. `export {var}={suggestion(path, suggest)}`, "
            "and restart the kernel."
        ) from None
    _writable.add(path)


def _ensure_writable(path: Path) -> None:
    suggest = ("~/course-results", os.path.join(tempfile.gettempdir(), "course-results"))
    ensure_writable(path, RESULTS_VAR, what="results folder", suggest=suggest)


def results_dir(*, write: bool = True) -> Path:
    """The results folder: ``$COURSE_RESULTS_DIR`` (see :func:`resolve_results_dir`), created if needed.

    Raises :class:`SettingError` naming ``COURSE_RESULTS_DIR`` when the value is unusable or the folder cannot
    be created or written. With ``write=False`` (readers: the leaderboard, ``load_results``) the folder is
    neither created nor checked for writing: a read-only folder of results can still be read.
    """
    path = resolve_results_dir(os.environ.get(RESULTS_VAR))
    if write:
        _ensure_writable(path)
    return path


def append_text(
    path: Path, text: str | Callable[[bool], str], *, recover: Callable[[bytes], tuple[int, str]] | None = None
) -> None:
    """Append ``text`` to ``path`` under an exclusive file lock (``fcntl.flock``), creating the file if needed.

    ``text`` may be a function of ``empty`` (True when the file has no bytes yet, decided under the lock):
    a CSV writer passes one that adds the header only then, so concurrent first writes give one header.
    A last line left without its newline (a writer killed mid-line) is ended first, so the torn line does
    not swallow the new one. A format that knows where its records end passes ``recover``: given the file's
    bytes, ``(length of its complete part, text to write before the new text)``; a torn tail beyond that length
    is cut off (a results row torn inside a quoted note), its bytes appended to ``<path>.torn`` (nothing is
    deleted) and a warning names both files.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8", newline="") as fh:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            fd = fh.fileno()
            size = os.fstat(fd).st_size
            if recover is None:
                keep, before = size, ("\n" if size > 0 and os.pread(fd, 1, size - 1) != b"\n" else "")
            else:
                data = os.pread(fd, size, 0)
                keep, before = recover(data)
                if keep < size:
                    torn = path.with_name(path.name + ".torn")
                    with open(torn, "ab") as out:
                        out.write(data[keep:])
                    os.ftruncate(fd, keep)
                    warnings.warn(f"the last {size - keep} bytes of {path} were a row cut short by a writer that "
                                  f"was killed: removed before appending (kept in {torn})", stacklevel=3)  # fmt: skip
            fh.write(before + (text(keep == 0) if callable(text) else text))
            fh.flush()
        finally:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
