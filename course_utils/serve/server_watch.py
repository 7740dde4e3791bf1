"""Which server processes are alive: watchdogs, the model-worker registry, and a record of model calls.

Installed by :mod:`course_utils.serve.server_process` on every server it starts (no lesson's subject):

* :func:`start_watchdog`: in the server's main process (watching the notebook's process) and in every process
  it forks or spawns (watching the main process): when the watched parent is gone, the whole process group is
  killed, so no worker keeps the port after a crash.
* :class:`WorkerSetup` (LitServe callback): each model worker registers its pid in ``<run_dir>/workers``;
  :class:`WorkerWatch` (in each API-server process) notices when one has died, so requests waiting for it get a
  503 naming the server log at once instead of a client timeout.
* :class:`CallRecorder` (LitServe callback): when each model call started and how long it ran.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from litserve.callbacks import Callback

from course_utils.serve.server_process import pid_alive
from course_utils.supply.children import wait_for_parent_gone


def watch_parent(parent: int, run_dir: Path | None) -> None:
    """Thread: when the parent process is gone, remove the run folder (if given) and kill this process group.

    The server's main process watches the notebook's process; every worker process (forked API servers and
    LitServe's manager, spawned model workers) watches the main process, so killing the main process alone
    (SIGKILL: no clean-up runs) no longer leaves workers holding the port.
    """
    wait_for_parent_gone(parent, poll_s=0.5)
    if run_dir is not None:
        shutil.rmtree(run_dir, ignore_errors=True)
    os.killpg(0, signal.SIGKILL)


def start_watchdog(parent: int, run_dir: Path | None = None) -> None:
    threading.Thread(target=watch_parent, args=(parent, run_dir), daemon=True, name="watchdog").start()


def watch_main_after_fork() -> None:
    """``os.register_at_fork`` hook: a process forked by the server's main process watches its parent."""
    start_watchdog(os.getppid())


class WorkerWatch:
    """In each API-server process: notices within ``interval`` s when a model worker registered in
    ``<run_dir>/workers/<pid>`` has died, so requests waiting for it fail at once, naming the server log."""

    def __init__(self, run_dir: str, interval: float = 0.2) -> None:
        self.folder, self.log, self.interval = Path(run_dir) / "workers", Path(run_dir) / "server.log", interval
        self.dead: asyncio.Event | None = None
        self.why = ""

    def start(self) -> asyncio.Event:
        if self.dead is None:
            self.dead = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._poll())
        return self.dead

    async def _poll(self) -> None:
        while True:
            try:
                pids = [int(p.name) for p in self.folder.iterdir() if p.name.isdigit()]
            except OSError:
                pids = []
            gone = [pid for pid in pids if not pid_alive(pid)]
            if gone:
                self.why = (f"the model worker process (pid {gone[0]}) died, so this request cannot be answered; "
                            f"see the server log at {self.log}")  # fmt: skip
                self.dead.set()
                return
            await asyncio.sleep(self.interval)


class CallRecorder(Callback):
    """LitServe callback (runs in each inference worker): one line per model call, '<start s> <predict ms>'."""

    def __init__(self, path: str) -> None:
        self.path, self._t0 = path, 0.0

    def on_before_predict(self, *args: Any, **kwargs: Any) -> None:
        self._t0 = time.time()

    def on_after_predict(self, *args: Any, **kwargs: Any) -> None:
        with open(self.path, "a") as fh:
            fh.write(f"{self._t0:.6f} {(time.time() - self._t0) * 1000:.3f}\n")


class WorkerSetup(Callback):
    """LitServe callback, run in each spawned model worker before ``setup``: register the worker's pid in
    ``<run_dir>/workers`` (the API server answers 503 naming the log when it dies) and watch the main process."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir

    def on_before_setup(self, *args: Any, **kwargs: Any) -> None:
        start_watchdog(os.getppid())
        folder = Path(self.run_dir) / "workers"
        folder.mkdir(exist_ok=True)
        (folder / str(os.getpid())).write_text("")
