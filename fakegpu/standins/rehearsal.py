"""Rehearsal mode (``COURSE_REHEARSE=1``): GPU-only sections executed on a CPU machine, on checked stand-ins.

On a machine without CUDA, :func:`course_utils.sections.gpu_sections.gpu_section` then returns True and calls
:func:`activate`: until the cell ends (:func:`cell_done`, called by
:func:`course_utils.sections.gpu_sections.finish_cell` from the cell runner or the IPython hook, so a rehearsal in
JupyterLab is the one the tests run), "cuda" means the stand-in GPU of :mod:`fakegpu.standins`:

* ``torch.cuda.*`` answers for one sm_90 stand-in (streams, events, graphs, memory counters, the pinned cache and
  the allocation history); ``cuda:1`` and beyond raise CUDA's "invalid device ordinal";
* the kernel CUDA would choose (:mod:`.kernels`): cuDNN's autotuning workspace under ``cudnn.benchmark`` in the
  memory peak, the SDPA backend (or "No available kernel"), the TF32 switches in force at each matrix product, and
  device events for ``torch.profiler.profile(activities=[..., ProfilerActivity.CUDA])``;
* ``.cuda()``, ``.to("cuda")``, ``Module.to("cuda")`` and factories with ``device="cuda"`` make
  :class:`~fakegpu.standins.tensor.Rehearsed` tensors; their operators are checked and queued per stream
  (:mod:`.dispatch`, :mod:`.streams`) on a virtual device clock (:mod:`.clock`);
* ``onnxruntime.InferenceSession`` with the CUDA provider, ``tensorrt`` (TensorRT 11.1's API, device pointers and
  stream order checked), ``pycuda`` and torchcodec's ``decode_jpeg(device="cuda")`` have stand-ins (the fakes are put
  in ``sys.modules`` only where the real package is missing); ``torch.onnx.export`` exports a stand-in model's CPU
  weights;
* what only a GPU machine can run raises :class:`NotRehearsable` with its name (:data:`GPU_ONLY`: Inductor/Triton
  kernels, INT4 tile packing, 2:4 sparse kernels, FP8 scaled matrix products; :data:`NOT_REHEARSABLE`: sections
  that start other processes on the GPU); any other error fails the section, a gap of the stand-in included.

``COURSE_REHEARSE_SCOPE=lesson`` keeps the stand-ins for the whole lesson (``pick_device()`` gives "cuda" from the
first cell, as on a GPU machine); :func:`course_utils.sections.gpu_sections.begin_lesson` starts it.
:func:`checks` reports what the stand-ins enforced (counts), which the section record keeps.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import torch

from fakegpu.real_gpu import no_real_gpu  # re-exported: the machine has no real CUDA GPU
from fakegpu.standins import collectives, kernels, memory, packages, switches
from fakegpu.standins import cuda as scuda
from fakegpu.standins.cuda import GPU_ONLY, NotRehearsable
from fakegpu.standins.mode import CudaMode, pin_batch
from fakegpu.standins.streams import MODEL
from fakegpu.standins.tensor import STATE, RehearsalError, check_index

__all__ = ["NotRehearsable", "RehearsalError", "activate", "active", "checks", "deactivate", "no_real_gpu"]

_ACTIVE: dict[str, Any] = {}
# Sections only a GPU machine can run (other processes on the GPU, named GPU-only kernels): not entered.
NOT_REHEARSABLE = {
    "11.expandable-segments": "it starts worker processes that allocate CUDA memory themselves; the stand-in lives in "
    "this process only",
    "13.serve-gpu": "the LitServe server's worker processes would need the GPU; the stand-in lives in this "
    "process only",
    "15.gpu-int4": GPU_ONLY["int4"],
    "15.gpu-cuda-graphs": GPU_ONLY["inductor"],
    "06.compile-cuda": GPU_ONLY["inductor"],
    "12.gpu-2to4": GPU_ONLY["sparse"],
    "05.gpu-fp8-int4": f"{GPU_ONLY['int4']}; {GPU_ONLY['fp8']}",
    "17.nccl-tp": "its rank processes would each need a GPU of their own, and NCCL has no CPU implementation; the "
    "stand-in lives in this process only",
}
# Sections that show a mistake on purpose ("what not to do"), and which rule would otherwise stop them.
DELIBERATE = {
    "01.gpu-sync": {"unsynchronized timing"},  # times a launch without synchronize, to show the difference
    "10.pageable-copy": {"unsynchronized timing"},  # how long a non_blocking call holds the CPU, before the copy ends
}
MEMORY_MIB = 1024  # the stand-in GPU's memory (small, so that OOM sweeps stop early on a CPU)
_PROVIDED = {"tensorrt", "pycuda"}  # packages the rehearsal provides stand-ins for (checked by gpu_section's needs=)


def active() -> bool:
    return bool(_ACTIVE)


def provided(module: str) -> bool:
    return module in _PROVIDED


def whole_lesson() -> bool:
    """``COURSE_REHEARSE_SCOPE=lesson``: the whole lesson runs as on a GPU machine."""
    return os.environ.get("COURSE_REHEARSE_SCOPE", "section").strip().lower() == "lesson"


def _compile(*args: Any, **kwargs: Any) -> Any:
    raise NotRehearsable(GPU_ONLY["inductor"])


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Within the block the stand-ins are off (real ``torch.cuda``, no mode); they come back after it."""
    patches, mode = _ACTIVE.get("patches", []), _ACTIVE.get("mode")
    if mode is not None:
        mode.__exit__(None, None, None)
    saved = [(owner, name, getattr(owner, name, None)) for owner, name, _, _ in patches]
    for owner, name, value, existed in reversed(patches):
        if existed:
            setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        if mode is not None:
            mode.__enter__()


def _patch(owner: Any, name: str, value: Any) -> None:
    _ACTIVE.setdefault("patches", []).append((owner, name, getattr(owner, name, None), hasattr(owner, name)))
    setattr(owner, name, value)


def activate(total_memory: int | None = None) -> None:
    """Install the stand-ins (idempotent). :func:`deactivate` removes them; counters restart at each activation."""
    if _ACTIVE:
        return
    _ACTIVE["on"] = True
    STATE.counts.clear()
    STATE.deferred.clear()
    STATE.notes.clear()
    STATE.total_memory = total_memory or MEMORY_MIB * 2**20
    MODEL.reset()
    memory.reset()
    STATE.streams, STATE.history = MODEL, None
    STATE.reset_peak()
    for name, fn in scuda.functions().items():
        _patch(torch.cuda, name, fn)
    for name, fn in memory.memory_functions().items():
        _patch(torch.cuda.memory, name, fn)
    _patch(torch, "compile", _compile)
    import time

    _patch(time, "perf_counter", _timer(time.perf_counter))
    accelerator = {"is_available": lambda *a, **k: True, "device_count": lambda: 1,
                   "current_accelerator": lambda *a, **k: torch.device("cuda"), "current_device_index": lambda: 0,
                   "set_device_index": lambda d: check_index(d, "torch.accelerator.set_device_index"),
                   "synchronize": lambda *a: MODEL.sync_all(), "current_stream": lambda *a: MODEL.current}  # fmt: skip
    for name, fn in accelerator.items():
        if hasattr(torch, "accelerator") and hasattr(torch.accelerator, name):
            _patch(torch.accelerator, name, fn)
    from torch.profiler import profile as profiler_class

    _patch(profiler_class, "__init__", packages.profiler_init(profiler_class.__init__))
    kernels.profiler_patches(_patch)
    import torch.utils.data._utils.pin_memory as pinning

    _patch(pinning, "pin_memory", pin_batch)  # DataLoader(pin_memory=True) pins in a thread: no mode there
    # Module.to("cuda") must make new Parameters (of the stand-in type), not set .data of the CPU ones
    _ACTIVE["overwrite"] = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    _patch(torch.onnx, "export", packages.onnx_export(torch.onnx.export, suspended))
    _ACTIVE["modules"] = packages.install(_patch)
    collectives.install(_patch)  # torch.distributed collectives on stand-in CUDA tensors are queued, as on NCCL
    kernels.forget_autotuning()  # cuDNN's algorithm searches start afresh, as in a new process
    mode = CudaMode()
    mode.__enter__()
    _ACTIVE["mode"] = mode


def enter(section: str) -> None:
    """The GPU section now running (its deliberate mistakes, :data:`DELIBERATE`, are allowed)."""
    _ACTIVE["section"] = section
    _ACTIVE["timer"] = None
    STATE.deliberate = set(DELIBERATE.get(section, set()))


def deliberate(what: str) -> bool:
    return what in DELIBERATE.get(_ACTIVE.get("section", ""), set())


def _timer(real: Any) -> Any:
    """``time.perf_counter`` while rehearsing. A read that ends a timing (its line subtracts a start time:
    ``time.perf_counter() - t0``) taken while work issued since the previous read is still queued is a wall-clock
    timer around GPU work that never waited for it: it measured the launch only."""
    import linecache
    import re
    import threading

    ends = re.compile(r"perf_counter\(\)\s*-")

    def perf_counter() -> float:
        if threading.current_thread() is threading.main_thread() and _ACTIVE:
            last = _ACTIVE.get("timer")
            waiting = MODEL.pending(since=last) if last is not None else 0
            if waiting and not deliberate("unsynchronized timing"):
                caller = sys._getframe(1)
                if ends.search(linecache.getline(caller.f_code.co_filename, caller.f_lineno)):
                    STATE.count("timing violations")
                    _ACTIVE["timer"] = None
                    raise RehearsalError(
                        f"time.perf_counter() - start read while {waiting} GPU operation(s) issued since the start "
                        "are still queued: a wall-clock timer around GPU work measures only the launch unless the "
                        "host waits first. Fix: torch.cuda.synchronize() (or end_event.synchronize()) before reading "
                        "the clock, or time with CUDA events (rehearsal stand-in)"
                    )
            STATE.count("timer reads checked")
            _ACTIVE["timer"] = MODEL.issued
        return real()

    return perf_counter


def checks() -> dict[str, int]:
    """What the stand-ins enforced since :func:`activate` (counts by kind)."""
    return dict(STATE.counts)


def pending_violation() -> str | None:
    """A stream-order violation found when memory was freed and not yet raised (checked at the cell's end)."""
    return STATE.deferred[0] if STATE.deferred else None


def take_notes() -> list[str]:
    """What the stand-ins reported without failing since the last call (printed at the cell's end)."""
    notes, STATE.notes[:] = list(STATE.notes), []
    return notes


def end_cell(success: bool, error: BaseException | None, entered: list[tuple[str, dict]]) -> tuple:
    """The end of a cell that entered the sections ``entered`` ([(key, switches at entry)]): the work they queued
    runs (its errors are theirs), a violation found when memory was freed is raised, and the global switches are
    compared (on a GPU too). Returns (success, error, hidden error, check counts)."""
    hidden = None
    if success and active():
        try:
            MODEL.drain()
            if pending_violation():
                raise RehearsalError(pending_violation())
        except Exception as exc:  # noqa: BLE001 - the cell's hidden error
            hidden = exc
    for section, before in entered if success and hidden is None else []:
        try:
            switches.check(section, before)
        except RehearsalError as exc:
            hidden = exc
            break
    if hidden is not None:
        success, error = False, hidden
    notes = take_notes() if active() else []
    try:
        counts = cell_done() if active() else {}
    except Exception as exc:  # noqa: BLE001 - queued work that failed while the stand-ins left
        counts, success, error, hidden = {}, False, exc, hidden or exc
    for note in notes:
        print(f"⚠  rehearsal: {note}")
    return success, error, hidden, counts


def failure(error: BaseException | None, rehearsed: bool) -> str:
    """The reason recorded for a failed section: the error's first line; in rehearsal, an error of the real CUDA
    runtime (no driver here) says that the stand-in lacks the call (a gap to fix, still a failure)."""
    first = (str(error).strip().splitlines() or [""])[0][:300]
    text = str(error)
    runtime = isinstance(error, getattr(torch, "AcceleratorError", ())) or any(
        s in text for s in ("NVIDIA driver", "CUDA driver version is insufficient", "Torch not compiled with CUDA")
    )
    gap = (
        " (the rehearsal's stand-in reached the real CUDA runtime: a gap of the stand-in)"
        if rehearsed and runtime
        else ""
    )
    return f"{type(error).__name__}: {first}{gap}"


def cell_done() -> dict[str, int]:
    """At the end of a cell: the check counts since the last call; the stand-ins stay only in whole-lesson scope."""
    if _ACTIVE.get("pinned"):
        MODEL.drain()
        counts = checks()
        STATE.counts.clear()
        return counts
    return deactivate()


def pin() -> None:
    """Activate for the rest of the process (whole-lesson scope)."""
    activate()
    _ACTIVE["pinned"] = True


def deactivate() -> dict[str, int]:
    """Remove the stand-ins; return the check counts. Stand-in tensors kept in variables stay usable (their queued
    work has run)."""
    if not _ACTIVE:
        return {}
    MODEL.drain()
    counts = checks()
    mode = _ACTIVE.get("mode")
    if mode is not None:
        mode.__exit__(None, None, None)
    for owner, name, value, existed in reversed(_ACTIVE.get("patches", [])):
        if existed:
            setattr(owner, name, value)
        else:
            delattr(owner, name)
    torch.__future__.set_overwrite_module_params_on_conversion(_ACTIVE.get("overwrite", False))
    for name in _ACTIVE.get("modules", []):
        sys.modules.pop(name, None)
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "AutoinitRefused"]
    STATE.capture = None
    STATE.history = None
    STATE.deliberate = set()
    _ACTIVE.clear()
    return counts
