"""The life cycle of a GPU-only section (``cu.gpu_section``): entered, run (on a GPU, or on the fake GPU's
stand-ins under ``COURSE_REHEARSE=1``), then completed or failed when its cell ends.

The switches it reads (smoke, strict GPU, rehearsal) and the record it appends to (``sections.jsonl``) live a room
below, in :mod:`course_utils.supply.modes`; the stand-ins in :mod:`fakegpu.standins.rehearsal`.
"""

from __future__ import annotations

import atexit
import sys

from course_utils.supply.errors import GPURequiredError
from course_utils.supply.modes import is_strict_gpu, missing_modules, record_section, rehearsing, sections_file

_PENDING: list[dict] = []  # sections entered whose cell has not finished yet
_HOOKS: dict[str, bool] = {}


def begin_lesson() -> None:
    """Called by :func:`course_utils.sections.lesson.start`: with ``COURSE_REHEARSE_SCOPE=lesson`` the rehearsal's
    stand-ins hold for the whole lesson (``pick_device()`` gives "cuda" from the first cell), in a kernel as in
    the cell runner."""
    from fakegpu.standins import rehearsal

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
    :mod:`fakegpu.standins.rehearsal`, and the timings it prints are the stand-in's.
    """
    import torch

    from fakegpu.standins import rehearsal, switches

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
        record_section(section, False, reason, "gpu", status="skipped", mode="rehearsal" if rehearse else "gpu")
        print(f"⏭  GPU-only section '{section}' skipped: {reason}.")
        return False
    if problems:
        reason = "; ".join(problems)
        if rehearse:
            record_section(section, False, f"not rehearsable: {reason}", "gpu", status="not-rehearsable",
                           mode="rehearsal")  # fmt: skip
            print(f"⏭  GPU-only section '{section}' not rehearsed: {reason}.")
            return False
        record_section(section, False, reason, "gpu", status="skipped", mode="cpu")
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
    record_section(section, False, "", "gpu", path, status="entered", mode=mode, device=device)
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
    (:func:`fakegpu.standins.rehearsal.end_cell`). Returns an error the cell hid (a stream-order
    violation found when memory was freed, a switch left changed, an error of queued work) so the caller fails
    the cell with it."""
    from fakegpu.standins import rehearsal

    pending, _PENDING[:] = list(_PENDING), []
    entered = [(p["section"], p.get("switches", {})) for p in pending]
    success, error, hidden, checks = rehearsal.end_cell(success, error, entered)
    for p in pending:
        extra = {"mode": p["mode"], "device": p["device"], "checks": checks}
        if success:
            record_section(p["section"], True, "", "gpu", p["path"], status="completed", **extra)
        elif isinstance(error, rehearsal.NotRehearsable):
            first = (str(error).strip().splitlines() or [""])[0][:300]
            record_section(p["section"], False, f"not rehearsable: {first}", "gpu", p["path"], status="not-rehearsable",
                    **extra)  # fmt: skip
        else:
            reason = rehearsal.failure(error, p["mode"] == "rehearsal")
            record_section(p["section"], False, reason, "gpu", p["path"], status="failed", **extra)
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
