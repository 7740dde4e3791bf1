"""Where things are: the repository, its shipped data, and the results folder (``COURSE_RESULTS_DIR``).

One place for paths, imported by every other module, importing no other course module but ``errors``
(so ``modes`` and ``results`` no longer import each other). ``COURSE_RESULTS_DIR`` is read the same way
whatever folder a notebook kernel or script runs in: ``~`` is expanded, a relative path is taken relative to
the repository root, and a folder that cannot be created or written raises :class:`SettingError` naming the
variable, instead of an ``OSError`` deep inside pandas or a stray ``notebooks/~/`` folder.
:func:`append_text` appends to a file shared by concurrent processes (results CSVs, the section record)
under an exclusive lock, so four lessons writing their first row at once still give one header.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; appends are still single writes
    fcntl = None  # type: ignore[assignment]

from .errors import SettingError

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
REFERENCE_DIR = DATA_DIR / "reference"
RESULTS_VAR = "COURSE_RESULTS_DIR"

_writable: set[Path] = set()  # folders already checked in this process (the check writes a file)


def resolve_results_dir(value: str | None) -> Path:
    """The folder a ``COURSE_RESULTS_DIR`` value names, without touching the disk.

    Empty or unset means ``results/`` in the repository; ``~`` and ``$VARS`` are expanded; a relative path
    is relative to the repository root (not to the folder the kernel happens to start in).
    """
    value = (value or "").strip()
    if not value:
        return REPO_ROOT / "results"
    path = Path(os.path.expandvars(os.path.expanduser(value)))
    return path if path.is_absolute() else (REPO_ROOT / path).resolve()


def _ensure_writable(path: Path) -> None:
    if path in _writable and path.is_dir():
        return
    raw = os.environ.get(RESULTS_VAR)
    source = f"{RESULTS_VAR}={raw!r}" if raw and raw.strip() else f"the default results folder ({RESULTS_VAR} unset)"
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # a real write: os.access says yes to root on read-only mounts
            pass
    except OSError as exc:
        raise SettingError(
            f"the results folder {path} from {source} cannot be written ({type(exc).__name__}: {exc.strerror or exc}). "
            f"Set {RESULTS_VAR} to a folder you can write, e.g. `export {RESULTS_VAR}=~/course-results`, "
            "and restart the kernel."
        ) from None
    _writable.add(path)


def results_dir() -> Path:
    """The results folder, created if needed: ``$COURSE_RESULTS_DIR`` (see :func:`resolve_results_dir`).

    Raises :class:`SettingError` naming ``COURSE_RESULTS_DIR`` when the folder cannot be created or written.
    """
    path = resolve_results_dir(os.environ.get(RESULTS_VAR))
    _ensure_writable(path)
    return path


def append_text(path: Path, text: str | Callable[[bool], str]) -> None:
    """Append ``text`` to ``path`` under an exclusive file lock (``fcntl.flock``), creating the file if needed.

    ``text`` may be a function of ``empty`` (True when the file has no bytes yet, decided under the lock):
    a CSV writer passes one that adds the header only then, so concurrent first writes give one header.
    A last line left without its newline (a writer killed mid-line) is ended first, so the torn line does
    not swallow the new one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8", newline="") as fh:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            size = os.fstat(fh.fileno()).st_size
            torn = size > 0 and os.pread(fh.fileno(), 1, size - 1) != b"\n"
            fh.write(("\n" if torn else "") + (text(size == 0) if callable(text) else text))
            fh.flush()
        finally:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
