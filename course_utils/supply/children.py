"""Child processes that never outlive the process that started them, even while they are still importing.

A process started with ``spawn`` imports its target's module before it runs a line of the target: for lesson 17's
ranks that module imports torch (seconds; minutes on a busy machine). A watchdog started inside the target starts
only after that import, so a notebook killed meanwhile left its ranks importing torch for minutes.
:func:`run_watched` is a target in a module that imports nothing heavy: it starts the watchdog, then the target."""

from __future__ import annotations

import importlib
import os
import threading
import time
from typing import Any

POLL_S = 0.2  # how often the watchdog looks for its parent


def wait_for_parent_gone(parent_pid: int, poll_s: float = POLL_S) -> None:
    """Return once this process is re-parented: its starter is gone, even killed with SIGKILL (no clean-up ran)."""
    while os.getppid() == parent_pid:
        time.sleep(poll_s)


def _watch(parent_pid: int) -> None:
    wait_for_parent_gone(parent_pid)
    os._exit(1)  # at once, also in the middle of an import in the main thread


def run_watched(parent_pid: int, module: str, name: str, *args: Any) -> Any:
    """Target for ``multiprocessing`` (``spawn``): leave as soon as ``parent_pid`` is gone, from the first moment,
    while ``module.name(*args)`` is imported and run."""
    threading.Thread(target=_watch, args=(parent_pid,), daemon=True, name="parent-watch").start()
    return getattr(importlib.import_module(module), name)(*args)
