"""Start a lesson's LitServe server as a subprocess, know it is *ours* and ready, and always stop it.

``with serve("embed_server.py:build_server", max_batch_size=16, batch_timeout=0.01) as srv:`` runs
``python -m course_utils.serve.server_main TARGET ...`` in a new session (one process group for the server and
every worker it forks) and yields a :class:`Server` once ``/health`` answers on the port the server reports.
TARGET is ``file.py:name``: a function ``name(max_batch_size=, batch_timeout=, workers_per_device=, accelerator=)``
returning a ``LitServer``, or a ``LitAPI`` subclass (served as ``LitServer(cls(max_batch_size=, batch_timeout=))``).

What can go wrong, and what happens:

* the port is taken: the server binds 127.0.0.1 itself, retries with another port, writes the port it got into
  its run folder; readiness asks ``/course/instance`` for the random id this process gave it, so another
  program on the port is never mistaken for it; if no port binds, :class:`ServingError` says so;
* the notebook's process dies (even SIGKILL): a watchdog thread in the server notices its parent is gone,
  removes the run folder and kills the whole group; the server's main process dies: each worker process's own
  watchdog kills the group (:func:`course_utils.serve.server_watch.start_watchdog`); if the notebook's process
  then dies too, the next start removes the run folder it left (its ``owner`` file names a process that is
  gone); at interpreter exit (``atexit``) every live server is stopped;
* the ``with`` body raises: the group gets SIGTERM, then SIGKILL, and :func:`stop` checks that no process and no
  listening port is left.

Limits against bad clients come from :mod:`course_utils.serve.server_guard`; the subprocess's entry point is
:mod:`course_utils.serve.server_main`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_utils.supply.errors import CourseError
from course_utils.supply.paths import REPO_ROOT

_LIVE: dict[int, Server] = {}


class ServingError(CourseError, RuntimeError):
    """The server did not start (the message says why and shows its log), or something outlived its stop."""


@dataclass
class Server:
    """A running server: its address, process group, run folder (log, port, model-call record) and settings."""

    host: str
    port: int
    pgid: int
    run_dir: Path
    settings: dict[str, Any]
    process: subprocess.Popen = field(repr=False)
    ours: bool = False  # the port answered with this server's instance id (only then is the port checked at stop)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def predict_url(self) -> str:
        return f"{self.url}/predict"

    def calls(self, *, since: int = 0):
        """The model calls so far (from call ``since``): a DataFrame with ``start_s`` and ``predict_ms``."""
        import pandas as pd

        rows = []
        with contextlib.suppress(OSError):
            for line in (self.run_dir / "calls.txt").read_text().splitlines()[since:]:
                parts = line.split()
                if len(parts) == 2:
                    rows.append({"start_s": float(parts[0]), "predict_ms": float(parts[1])})
        return pd.DataFrame(rows, columns=["start_s", "predict_ms"])

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join((self.run_dir / "server.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    if not port:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie, dead but not yet reaped by its parent, counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, from /proc), or "" if it is gone: with the pid, it
    names one process, so a pid reused by a later process is not mistaken for the one recorded."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rfind(")") + 2 :].split()[19]


def _remove_stale_run_dirs() -> None:
    """Remove this user's ``<TMPDIR>/course_serve_*`` folders whose owner (the process that started the server,
    named in their ``owner`` file) is gone. When the server's main process is killed and then the kernel dies,
    no process is left to remove its run folder (the workers' watchdogs only kill the group); the next start
    does. Folders without an owner file, or of other users, are left alone."""
    for d in Path(tempfile.gettempdir()).glob("course_serve_*"):
        try:
            if d.is_symlink() or not d.is_dir() or d.stat().st_uid != os.getuid():
                continue
            pid, started = (d / "owner").read_text().split()
        except (OSError, ValueError):
            continue
        if pid.isdigit() and _started(int(pid)) != started:
            shutil.rmtree(d, ignore_errors=True)


def _worker_died(srv: Server) -> bool:
    """True when the server's main process or a registered model worker exited before we stopped it."""
    if srv.process.poll() is not None:
        return True
    with contextlib.suppress(OSError):
        return any(p.name.isdigit() and not pid_alive(int(p.name)) for p in (srv.run_dir / "workers").iterdir())
    return False


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, read from /proc."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                out.append(int(d.name))
    return sorted(out)


def stop(srv: Server, *, grace: float = 5.0) -> None:
    """SIGTERM the server's whole group, SIGKILL after ``grace`` s; raise if a process or the port survives."""

    def gone(limit: float) -> bool:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            with contextlib.suppress(subprocess.TimeoutExpired):
                srv.process.wait(timeout=0.05)
            if srv.process.poll() is not None and not group_pids(srv.pgid):
                return True
        return False

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(srv.pgid, sig)
        if gone(wait):
            break
    port = srv.port if srv.ours else 0  # a port we never saw answer as ours may belong to another program
    end = time.monotonic() + 3.0
    while port_open(port, srv.host) and time.monotonic() < end:
        time.sleep(0.05)
    _LIVE.pop(srv.pgid, None)
    left = group_pids(srv.pgid)
    if left or port_open(port, srv.host):
        raise ServingError(f"after stopping the server, processes {left} or port {srv.port} are still alive: "
                           f"kill -9 -- -{srv.pgid}")  # fmt: skip


@atexit.register
def _stop_all() -> None:
    for srv in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            stop(srv, grace=2.0)
        shutil.rmtree(srv.run_dir, ignore_errors=True)


def _wait_ready(srv: Server, instance: str, timeout: float) -> None:
    import httpx

    end, seen_foreign = time.monotonic() + timeout, ""
    with httpx.Client(trust_env=False, timeout=2.0) as client:
        while time.monotonic() < end:
            if srv.process.poll() is not None:
                bind = srv.run_dir / "bind_error"
                why = f"could not bind a port on 127.0.0.1: {bind.read_text()}" if bind.exists() else "it exited"
                raise ServingError(f"the server did not start ({why}, code {srv.process.returncode}).{_cwd_hint(srv)} "
                                   f"Log:\n{srv.log_tail()}")  # fmt: skip
            with contextlib.suppress(OSError, ValueError):
                srv.port = int((srv.run_dir / "port").read_text())
            if srv.port:
                try:
                    r = client.get(f"{srv.url}/course/instance")
                    if r.status_code == 200 and r.json().get("id") == instance:
                        srv.ours = True
                        if client.get(f"{srv.url}/health").status_code == 200:
                            return
                    else:
                        seen_foreign = f" (port {srv.port} was answered by another program)"
                except (httpx.HTTPError, ValueError):
                    pass
            time.sleep(0.1)
    raise ServingError(f"the server was not ready within {timeout:.0f} s{seen_foreign}; raise start_timeout on a "
                       f"slow machine.{_cwd_hint(srv)} Log:\n{srv.log_tail()}")  # fmt: skip


def _cwd_hint(srv: Server) -> str:
    """When the log shows a missing file: where a relative path in the server's code is looked up."""
    tail = srv.log_tail(80)
    if "FileNotFoundError" in tail or "No such file" in tail:
        return (
            f" A file was not found: the server runs in the folder {srv.settings.get('cwd')}, so a relative "
            "path in setup() is relative to it; use an absolute path (e.g. Path(__file__).parent / name)."
        )
    return ""


@contextlib.contextmanager
def serve(target: str | Path, *, max_batch_size: int = 1, batch_timeout: float = 0.0, workers_per_device: int = 1,
          accelerator: str = "cpu", port: int = 0, start_timeout: float = 240.0, grace: float = 5.0,
          max_connections: int = 256, limit_concurrency: int = 128,
          header_timeout: float = 10.0) -> Iterator[Server]:  # fmt: skip
    """Serve ``target`` (``"file.py:name"``) on 127.0.0.1; stop it on exit, also after an error. See the module doc."""
    path, _, name = str(target).rpartition(":")
    if not path or not name or not Path(path).is_file():
        raise ServingError(f"target {str(target)!r} must be 'path/to/file.py:name' with an existing file")
    if max_batch_size < 1 or batch_timeout < 0 or workers_per_device < 1:
        raise ServingError("need max_batch_size >= 1, batch_timeout >= 0 (seconds) and workers_per_device >= 1")
    _remove_stale_run_dirs()
    run_dir, instance = Path(tempfile.mkdtemp(prefix="course_serve_")), secrets.token_hex(8)
    (run_dir / "owner").write_text(f"{os.getpid()} {_started(os.getpid())}")  # who may still need the folder
    knobs = {"max_batch_size": max_batch_size, "batch_timeout": batch_timeout, "workers_per_device": workers_per_device,
             "accelerator": accelerator, "port": port,
             "max_connections": max_connections, "limit_concurrency": limit_concurrency,
             "header_timeout": header_timeout}  # fmt: skip
    cmd = [sys.executable, "-m", "course_utils.serve.server_main", f"{Path(path).resolve()}:{name}",
           "--run-dir", str(run_dir), "--instance", instance, "--parent-pid", str(os.getpid())]  # fmt: skip
    cmd += [x for k, v in knobs.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    cwd = _caller_folder(run_dir)  # the lesson's folder: a relative path in setup() means what it means there
    with open(run_dir / "server.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=cwd, start_new_session=True)  # fmt: skip
    srv = Server("127.0.0.1", 0, proc.pid, run_dir, {"target": str(target), "cwd": cwd, **knobs}, proc)
    _LIVE[srv.pgid] = srv
    died = False
    try:
        _wait_ready(srv, instance, start_timeout)
        yield srv
    finally:
        died = srv.ours and _worker_died(srv)  # a process of it stopped on its own while in use
        try:
            stop(srv, grace=grace)
        finally:
            if died:  # keep the log the 503s named; say where it is
                warnings.warn(f"the server (or one of its model workers) stopped on its own while in use; its log "
                              f"is kept at {run_dir / 'server.log'}", stacklevel=3)  # fmt: skip
            else:
                shutil.rmtree(run_dir, ignore_errors=True)


def _caller_folder(fallback: Path) -> str:
    """The folder this process runs in (a notebook's kernel: the notebook's folder), or ``fallback`` if gone."""
    try:
        return os.getcwd()
    except OSError:
        return str(fallback)


def writefile_fallback(dest: str | Path, lesson_file: str | Path) -> Path:
    """Write the body of the lesson cell that starts ``%%writefile .../<dest name>`` to ``dest``.

    In Jupyter the ``%%writefile`` magic writes the file; run as a plain script (``python lessons/13_....py``)
    that line is a comment, so the lesson calls this to write the same cell text from its own source. The
    path may be quoted (``%%writefile "{WORK}/x.py"``: a temporary folder whose path has a space needs it).
    """
    dest, lines = Path(dest), Path(lesson_file).read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# %%writefile") and line.rstrip().rstrip("'\"").endswith("/" + dest.name):
            body = []
            for nxt in lines[i + 1 :]:
                if nxt.startswith("# %%"):
                    break
                body.append(nxt)
            dest.write_text("\n".join(body).rstrip() + "\n")
            return dest
    raise ServingError(f"no cell starting with '%%writefile .../{dest.name}' in {lesson_file}")
