"""Run modes: smoke sizes, strict GPU mode, and the record of GPU-only sections.

* ``COURSE_SMOKE=1`` shrinks sizes and repeats so that the tests run fast (``make test`` sets it).
* ``COURSE_STRICT_GPU=1`` turns every skipped GPU-only section into a :class:`GPURequiredError`,
  so a run on a CUDA test machine cannot pass by skipping.
* Every GPU-only section calls :func:`gpu_section`; the outcome is appended to ``sections.jsonl`` in the
  results folder: ``entered`` when the body starts, then ``completed`` or ``failed`` when its cell ends
  (or ``skipped`` / ``not-rehearsable`` with the reason), so a run reports what really ran.
* ``COURSE_REHEARSE=1`` (CPU machines): GPU sections run on checked stand-ins
  (:mod:`course_utils.fakegpu.standins.rehearsal`).

Switches are parsed strictly by :func:`switch`: ``1/0, true/false, yes/no, on/off`` (any case, spaces
ignored) or unset; any other value (``2``, ``smoke``) raises :class:`SettingError` naming the variable, so the
mode a run reports is always the mode it used.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import TypeVar

from course_utils.supply.errors import GPURequiredError, SettingError
from course_utils.supply.paths import append_text, results_dir

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
    stand-ins (:mod:`course_utils.fakegpu.standins.rehearsal`)."""
    from course_utils.fakegpu.standins import rehearsal

    return switch("COURSE_REHEARSE") and rehearsal.no_real_gpu()


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
_PENDING: list[dict] = []  # sections entered whose cell has not finished yet
_HOOKS: dict[str, bool] = {}


def _record(section: str, ran: bool, reason: str, kind: str, path: Path | None = None, **extra: object) -> dict:
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


def begin_lesson() -> None:
    """Called by :func:`course_utils.supply.lesson.start`: with ``COURSE_REHEARSE_SCOPE=lesson`` the rehearsal's
    stand-ins hold for the whole lesson (``pick_device()`` gives "cuda" from the first cell), in a kernel as in
    the cell runner."""
    from course_utils.fakegpu.standins import rehearsal

    if rehearsing() and rehearsal.whole_lesson():
        rehearsal.pin()


def _ort_providers() -> list[str]:
    try:
        import onnxruntime
    except ImportError:
        return []
    return list(onnxruntime.get_available_providers())


def gpu_section(
    section: str,
    *,
    needs: tuple[str, ...] = (),
    providers: tuple[str, ...] = (),
    requires: dict[str, bool] | None = None,
    why: str = "",
) -> bool:
    """Enter a GPU-only section: True if it can run here, else print the reason and return False.

    Use it as ``if gpu_section("08.build-fp16", needs=("tensorrt",)):`` around the GPU-only code, the whole
    body inside one cell, the call alone as the ``if``'s condition. ``needs`` lists Python modules the section
    imports besides torch; ``providers`` ONNX Runtime execution providers it needs (``"CUDAExecutionProvider"``:
    the CPU build of onnxruntime has none); ``requires`` what earlier cells must have produced, described
    (``{"the fp16 engine of 08.build": "fp16" in engines}``): a section whose body cannot run is skipped with the
    reason, never recorded as completed. In strict GPU mode a section that cannot run raises
    :class:`GPURequiredError` naming the section and what is missing.

    Entering records ``status: entered``; the section counts as run only when its cell completes
    (:func:`finish_cell`: ``completed``, or ``failed`` with the error's first line). With ``COURSE_REHEARSE=1``
    on a machine without CUDA the body runs on the checked CPU stand-ins of
    :mod:`course_utils.fakegpu.standins.rehearsal`, and the timings it prints are the stand-in's.
    """
    import torch

    from course_utils.fakegpu.standins import rehearsal, switches

    _settle_previous()
    rehearse = rehearsing()
    problems = []
    if not torch.cuda.is_available() and not rehearse:
        problems.append("no CUDA GPU (torch.cuda.is_available() is False)")
    missing = [m for m in missing_modules(needs) if not (rehearse and rehearsal.provided(m))]
    if rehearse and section in rehearsal.NOT_REHEARSABLE:
        problems.append(rehearsal.NOT_REHEARSABLE[section])
    if missing:
        hint = " (install the GPU extras: run `make setup` on a CUDA machine)"
        problems.append("missing Python package(s): " + ", ".join(missing) + hint)
    absent = [p for p in providers if not (rehearse and p == "CUDAExecutionProvider") and p not in _ort_providers()]
    if absent:
        build = "is the CPU build" if _ort_providers() else "is missing"
        problems.append(f"ONNX Runtime here has no {', '.join(absent)} (onnxruntime {build}: install onnxruntime-gpu)")
    unmet = [what for what, ok in (requires or {}).items() if not ok]
    if unmet and not problems:
        reason = "needs " + "; ".join(unmet) + ", which the cells above did not produce here"
        _record(section, False, reason, "gpu", status="skipped", mode="rehearsal" if rehearse else "gpu")
        print(f"⏭  GPU-only section '{section}' skipped: {reason}.")
        return False
    if problems:
        reason = "; ".join(problems)
        if rehearse:
            _record(section, False, f"not rehearsable: {reason}", "gpu", status="not-rehearsable", mode="rehearsal")
            print(f"⏭  GPU-only section '{section}' not rehearsed: {reason}.")
            return False
        _record(section, False, reason, "gpu", status="skipped", mode="cpu")
        if is_strict_gpu():
            raise GPURequiredError(
                f"strict GPU mode (COURSE_STRICT_GPU=1): section '{section}' needs a GPU but cannot run: {reason}"
            )
        print(f"⏭  GPU-only section '{section}' skipped: {reason}." + (f" {why}" if why else ""))
        return False
    if rehearse:
        rehearsal.activate()
        rehearsal.enter(section)
    mode = "rehearsal" if rehearse else "gpu"
    device = torch.cuda.get_device_name(0)
    path = sections_file()
    _record(section, False, "", "gpu", path, status="entered", mode=mode, device=device)
    _PENDING.append({"section": section, "mode": mode, "device": device, "path": path,
                     "switches": switches.snapshot()})  # fmt: skip
    _install_hooks()
    if rehearse:
        print(f"▶  GPU-only section '{section}' runs on the rehearsal's CPU stand-in of a GPU (COURSE_REHEARSE=1): "
              "CUDA's rules are checked; every timing it prints is the stand-in's (a CPU computing, a modelled GPU "
              "clock), not a GPU measurement, and judges nothing.")  # fmt: skip
    else:
        print(f"▶  GPU-only section '{section}' runs on {device}.")
    return True


def finish_cell(success: bool, error: BaseException | None = None) -> BaseException | None:
    """Decide the sections entered in the cell that just ended: completed, failed (with the error's first line)
    or, in rehearsal, not rehearsable (a named GPU-only kernel). First the section's queued stand-in work runs and
    its global switches (TF32, cuDNN, ...) are compared with their values at entry
    (:func:`course_utils.fakegpu.standins.rehearsal.end_cell`). Returns an error the cell hid (a stream-order
    violation found when memory was freed, a switch left changed, an error of queued work) so the caller fails
    the cell with it."""
    from course_utils.fakegpu.standins import rehearsal

    pending, _PENDING[:] = list(_PENDING), []
    entered = [(p["section"], p.get("switches", {})) for p in pending]
    success, error, hidden, checks = rehearsal.end_cell(success, error, entered)
    for p in pending:
        extra = {"mode": p["mode"], "device": p["device"], "checks": checks}
        if success:
            _record(p["section"], True, "", "gpu", p["path"], status="completed", **extra)
        elif isinstance(error, rehearsal.NotRehearsable):
            first = (str(error).strip().splitlines() or [""])[0][:300]
            _record(p["section"], False, f"not rehearsable: {first}", "gpu", p["path"], status="not-rehearsable",
                    **extra)  # fmt: skip
        else:
            reason = rehearsal.failure(error, p["mode"] == "rehearsal")
            _record(p["section"], False, reason, "gpu", p["path"], status="failed", **extra)
    return hidden


def _settle_previous() -> None:
    """A plain ``python lesson.py`` run has no cell boundaries: reaching the next section means the previous
    one's body completed (sections are one cell each; tests/test_rehearsal.py checks it)."""
    if _PENDING and not _HOOKS.get("cells"):
        finish_cell(True)


def _install_hooks() -> None:
    """Completion hooks: IPython's post_run_cell in a kernel; sys.excepthook + atexit for a plain script.
    The cell runner (scripts/run_cells.py) calls :func:`finish_cell` itself and sets ``_HOOKS["cells"]``."""
    if _HOOKS.get("installed") or _HOOKS.get("cells"):
        return
    _HOOKS["installed"] = True
    try:
        from IPython import get_ipython

        ip = get_ipython()
    except ImportError:
        ip = None
    if ip is not None:
        _HOOKS["cells"] = True
        ip.events.register("post_run_cell", lambda result: finish_cell(result.success, result.error_in_exec))
        return
    previous = sys.excepthook

    def hook(kind: type, value: BaseException, tb: object) -> None:
        finish_cell(False, value)
        previous(kind, value, tb)

    sys.excepthook = hook
    atexit.register(lambda: _PENDING and finish_cell(True))


def outcomes(rows: list[dict]) -> list[dict]:
    """The last row of each section in each run (entered -> completed/failed), in order of first appearance."""
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
        _record(section, True, "", "opt-in")
        return True
    _record(section, False, f"opt-in: set {env_var}=1 to run it", "opt-in")
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
