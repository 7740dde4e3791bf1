"""Run modes: smoke sizes, strict GPU mode, and the record of GPU-only sections.

* ``COURSE_SMOKE=1`` shrinks sizes and repeats so that the tests run fast (``make test`` sets it).
* ``COURSE_STRICT_GPU=1`` turns every skipped GPU-only section into a :class:`GPURequiredError`,
  so a run on a CUDA test machine cannot pass by skipping.
* Every GPU-only section calls :func:`gpu_section`; the outcome (ran or skipped, and why) is appended
  to ``sections.jsonl`` in the results folder, so a run can report what it skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import TypeVar

from .errors import GPURequiredError

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def is_smoke() -> bool:
    """True when ``COURSE_SMOKE`` is set: small sizes and few repeats (tests, quick looks)."""
    return _flag("COURSE_SMOKE")


def is_strict_gpu() -> bool:
    """True when ``COURSE_STRICT_GPU`` is set: a GPU-only section that cannot run is an error."""
    return _flag("COURSE_STRICT_GPU")


def pick(full: T, smoke: T) -> T:
    """Return ``smoke`` in smoke mode and ``full`` otherwise: ``n = pick(full=2000, smoke=50)``."""
    return smoke if is_smoke() else full


def mode_summary() -> dict[str, object]:
    """The modes in force, for lesson 00 and for result rows."""
    from .results import results_dir

    return {
        "size mode": "smoke (COURSE_SMOKE=1)" if is_smoke() else "full",
        "strict GPU": is_strict_gpu(),
        "results folder": str(results_dir()),
    }


def sections_file() -> Path:
    """Where the record of GPU-only sections is written (inside the results folder)."""
    from .results import results_dir

    return results_dir() / "sections.jsonl"


def _record(section: str, ran: bool, reason: str, kind: str) -> None:
    path = sections_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {"section": section, "ran": ran, "reason": reason, "kind": kind, "time": time.time()}
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


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
    if _flag(env_var):
        _record(section, True, "", "opt-in")
        return True
    _record(section, False, f"opt-in: set {env_var}=1 to run it", "opt-in")
    print(f"⏭  Opt-in section '{section}' not run: {why} Set {env_var}=1 to run it.")
    return False


def read_sections(path: Path | None = None) -> list[dict]:
    """Rows of the section record (each: section, ran, reason, kind, time); empty if none yet."""
    path = path or sections_file()
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
