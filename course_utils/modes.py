"""Run modes: smoke sizes, strict GPU mode, and the record of GPU-only sections.

* ``COURSE_SMOKE=1`` shrinks sizes and repeats so that the tests run fast (``make test`` sets it).
* ``COURSE_STRICT_GPU=1`` turns every skipped GPU-only section into a :class:`GPURequiredError`,
  so a run on a CUDA test machine cannot pass by skipping.
* Every GPU-only section calls :func:`gpu_section`; the outcome (ran or skipped, and why) is appended
  to ``sections.jsonl`` in the results folder, so a run can report what it skipped.

Switches are parsed strictly by :func:`switch`: ``1/0, true/false, yes/no, on/off`` (any case, spaces
ignored) or unset; any other value (``2``, ``smoke``) raises :class:`SettingError` naming the variable, so the
mode a run reports is always the mode it used.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
import warnings
from pathlib import Path
from typing import TypeVar

from .errors import GPURequiredError, SettingError
from .paths import append_text, results_dir

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


def _record(section: str, ran: bool, reason: str, kind: str) -> None:
    row = {"section": section, "ran": ran, "reason": reason, "kind": kind, "time": time.time()}
    append_text(sections_file(), json.dumps(row) + "\n")


def missing_modules(modules: tuple[str, ...] | list[str]) -> list[str]:
    """The names in ``modules`` that cannot be imported here (checked without importing them)."""
    out = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def gpu_section(section: str, *, needs: tuple[str, ...] = (), why: str = "") -> bool:
    """Enter a GPU-only section: True if it can run here, else print the reason and return False.

    Use it as ``if gpu_section("08.build-fp16", needs=("tensorrt",)):`` around the GPU-only code.
    ``needs`` lists Python modules the section imports besides torch. In strict GPU mode a section
    that cannot run raises :class:`GPURequiredError` naming the section and what is missing.
    """
    import torch

    problems = []
    if not torch.cuda.is_available():
        problems.append("no CUDA GPU (torch.cuda.is_available() is False)")
    missing = missing_modules(needs)
    if missing:
        hint = " (install the GPU extras: run `make setup` on a CUDA machine)"
        problems.append("missing Python package(s): " + ", ".join(missing) + hint)
    if problems:
        reason = "; ".join(problems)
        _record(section, False, reason, "gpu")
        if is_strict_gpu():
            raise GPURequiredError(
                f"strict GPU mode (COURSE_STRICT_GPU=1): section '{section}' needs a GPU but cannot run: {reason}"
            )
        print(f"⏭  GPU-only section '{section}' skipped: {reason}." + (f" {why}" if why else ""))
        return False
    _record(section, True, "", "gpu")
    print(f"▶  GPU-only section '{section}' runs on {torch.cuda.get_device_name(0)}.")
    return True


def opt_in_section(section: str, env_var: str, why: str) -> bool:
    """Enter a section that runs only when the learner sets ``env_var=1`` (e.g. one that starts Ray).

    Tests never set it; the skip is recorded with kind ``opt-in`` so it is not mistaken for a failure.
    """
    if switch(env_var):
        _record(section, True, "", "opt-in")
        return True
    _record(section, False, f"opt-in: set {env_var}=1 to run it", "opt-in")
    print(f"⏭  Opt-in section '{section}' not run: {why} Set {env_var}=1 to run it.")
    return False


def read_sections(path: Path | None = None) -> list[dict]:
    """Rows of the section record (each: section, ran, reason, kind, time); empty if none yet.

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
    return rows
