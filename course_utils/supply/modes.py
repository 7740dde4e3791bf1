"""Run modes: smoke sizes, strict GPU mode, the rehearsal switch, and the record of GPU-only sections.

* ``COURSE_SMOKE=1`` shrinks sizes and repeats so that the tests run fast (``make test`` sets it).
* ``COURSE_STRICT_GPU=1`` turns every skipped GPU-only section into a :class:`GPURequiredError`,
  so a run on a CUDA test machine cannot pass by skipping.
* Every GPU-only section calls :func:`course_utils.sections.gpu_sections.gpu_section` (``cu.gpu_section``),
  whose life cycle lives a room above, with the fake GPU; the outcome is appended here
  (:func:`record_section`) to ``sections.jsonl`` in the results folder: ``entered`` when the body starts, then
  ``completed`` or ``failed`` when its cell ends (or ``skipped`` / ``not-rehearsable`` with the reason), so a run
  reports what really ran; :func:`read_sections` reads it back.
* ``COURSE_REHEARSE=1`` (CPU machines): GPU sections run on checked stand-ins
  (:mod:`fakegpu.standins.rehearsal`); :func:`rehearsing` says whether they do.

Switches are parsed strictly by :func:`switch`: ``1/0, true/false, yes/no, on/off`` (any case, spaces
ignored) or unset; any other value (``2``, ``smoke``) raises :class:`SettingError` naming the variable, so the
mode a run reports is always the mode it used.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import TypeVar

from course_utils.supply.errors import SettingError
from course_utils.supply.paths import append_text, results_dir
from fakegpu.real_gpu import no_real_gpu  # the stand-ins' own switch, re-exported

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def switch(name: str) -> bool:
    """The on/off environment variable ``name``: unset or empty is off; 1/true/yes/on and 0/false/no/off
    (any case, surrounding spaces ignored). Anything else raises :class:`SettingError` naming ``name``."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingError(
        f"{name}={raw!r} is not an on/off value: use one of 1/0, true/false, yes/no, on/off "
        f"(or leave {name} unset for off), then restart the kernel."
    )


def rehearsing() -> bool:
    """True when ``COURSE_REHEARSE`` is set and this machine has no real CUDA GPU: GPU sections run on the CPU
    stand-ins (:mod:`fakegpu.standins.rehearsal`)."""
    return switch("COURSE_REHEARSE") and no_real_gpu()


def is_smoke() -> bool:
    """True when ``COURSE_SMOKE`` is set: small sizes and few repeats (tests, quick looks)."""
    return switch("COURSE_SMOKE")


def is_strict_gpu() -> bool:
    """True when ``COURSE_STRICT_GPU`` is set: a GPU-only section that cannot run is an error."""
    return switch("COURSE_STRICT_GPU")


def pick(full: T, smoke: T) -> T:
    """Return ``smoke`` in smoke mode and ``full`` otherwise: ``n = pick(full=2000, smoke=50)``."""
    return smoke if is_smoke() else full


def mode_summary() -> dict[str, object]:
    """The modes in force, for lesson 00 and for result rows."""
    smoke = is_smoke()
    return {
        "size mode": f"smoke (COURSE_SMOKE={os.environ['COURSE_SMOKE'].strip()})" if smoke else "full",
        "strict GPU": is_strict_gpu(),
        "results folder": str(results_dir()),
    }


def sections_file() -> Path:
    """Where the record of GPU-only sections is written (inside the results folder)."""
    return results_dir() / "sections.jsonl"


_RUN = f"{os.getpid()}-{int(time.time() * 1000)}"  # groups the rows of one process (entered -> completed)


def record_section(section: str, ran: bool, reason: str, kind: str, path: Path | None = None, **extra: object) -> dict:
    """Append one row of the section record (``kind``: ``gpu`` or ``opt-in``; ``extra``: status, mode, ...)."""
    row = {"section": section, "ran": ran, "reason": reason, "kind": kind, "time": time.time(), "run": _RUN, **extra}
    append_text(path or sections_file(), json.dumps(row) + "\n")
    return row


def missing_modules(modules: tuple[str, ...] | list[str]) -> list[str]:
    """The names in ``modules`` that cannot be imported here (checked without importing them)."""
    out = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = name in sys.modules  # a stand-in module (the rehearsal's tensorrt) has no finder
        if not found:
            out.append(name)
    return out


def available(modules: tuple[str, ...], what: str) -> bool:
    """True when every module in ``modules`` can be imported; else print that ``what`` is skipped and why, and
    return False, so a lesson goes on past a step whose optional package is missing (the GPU machine lent for a
    run has no torchao or TorchCodec; a GPU-only section names its own ``needs``)."""
    missing = missing_modules(modules)
    if missing:
        print(f"⏭  {what} skipped: missing Python package(s): {', '.join(missing)} (make setup installs them)")
    return not missing


def standin_label() -> str:
    """Appended to a timing sentence of a GPU section: under the rehearsal it says the numbers are the CPU
    stand-in's (and judge nothing); on a GPU it is empty."""
    if rehearsing():
        return " [rehearsal stand-in timing, not a GPU measurement: it judges nothing]"
    return ""


def outcomes(rows: list[dict]) -> list[dict]:
    """The last row of each section in each run (entered -> completed/failed), in the order of those last rows."""
    last: dict[tuple, dict] = {}
    for i, row in enumerate(rows):
        key = (row["run"], row["section"]) if row.get("run") else (None, row["section"], i)
        last.pop(key, None)
        last[key] = row
    return sorted(last.values(), key=lambda r: rows.index(r))


def opt_in_section(section: str, env_var: str, why: str) -> bool:
    """Enter a section that runs only when the learner sets ``env_var=1`` (e.g. one that starts Ray).

    Tests never set it; the skip is recorded with kind ``opt-in`` so it is not mistaken for a failure.
    """
    if switch(env_var):
        record_section(section, True, "", "opt-in")
        return True
    record_section(section, False, f"opt-in: set {env_var}=1 to run it", "opt-in")
    print(f"⏭  Opt-in section '{section}' not run: {why} Set {env_var}=1 to run it.")
    return False


def read_sections(path: Path | None = None, *, raw: bool = False) -> list[dict]:
    """Outcomes of the section record (each: section, ran, reason, kind, time; newer rows also status, mode,
    device, checks, run); empty if none yet. One row per section and run (its last: an ``entered`` row with no
    later one means the body never completed); ``raw=True`` returns every row.

    A line that is not a JSON object (torn by a killed process, edited by hand) is skipped with a warning
    naming the file and line; the other rows are returned.
    """
    path = path or sections_file()
    if not path.exists():
        return []
    rows, bad = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict) and "section" in row:
            rows.append(row)
        else:
            bad.append(number)
    if bad:
        warnings.warn(
            f"skipped {len(bad)} unreadable line(s) of {path} (line {', '.join(map(str, bad[:5]))}"
            f"{', ...' if len(bad) > 5 else ''}): a run was probably killed while writing; the other rows are kept",
            stacklevel=2,
        )
    return rows if raw else outcomes(rows)
