"""The server subprocess that :func:`course_utils.serve.server_process.serve` starts: load the lesson's target,
install the guards and watchdogs, bind 127.0.0.1 and run.

``python -m course_utils.serve.server_main FILE.py:NAME --run-dir ... --instance ... --parent-pid ...``: TARGET
is a function returning a ``LitServer`` or a ``LitAPI`` subclass. The port the server got is written to
``<run_dir>/port``; a port uvicorn could not bind is retried (a free one) up to five times.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any


def _load_target(target: str, a: argparse.Namespace) -> Any:
    import importlib.util

    import litserve as ls

    path, _, name = target.rpartition(":")
    folder, mod_name = str(Path(path).parent), Path(path).stem
    sys.path.insert(0, folder)  # spawned inference workers import the module by name (sys.path is passed on)
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    obj = getattr(module, name)
    if isinstance(obj, type) and issubclass(obj, ls.LitAPI):
        api = obj(max_batch_size=a.max_batch_size, batch_timeout=a.batch_timeout)
        return ls.LitServer(api, accelerator=a.accelerator, workers_per_device=a.workers_per_device, timeout=30)
    server = obj(max_batch_size=a.max_batch_size, batch_timeout=a.batch_timeout,
                 workers_per_device=a.workers_per_device, accelerator=a.accelerator)  # fmt: skip
    if not isinstance(server, ls.LitServer):
        raise SystemExit(f"{target} returned {type(server).__name__}, expected a litserve.LitServer")
    return server


def main(argv: list[str] | None = None) -> None:
    """Entry point of the server subprocess (started by :func:`course_utils.serve.server_process.serve`)."""
    import resource

    from course_utils.serve import server_guard as g
    from course_utils.serve import server_watch as w

    p = argparse.ArgumentParser(description="Run a course LitServe server (started by course_utils.serve).")
    p.add_argument("target")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--instance", required=True)
    p.add_argument("--parent-pid", type=int, required=True)
    for knob, typ in (("max-batch-size", int), ("batch-timeout", float), ("workers-per-device", int),
                      ("accelerator", str), ("port", int), ("max-connections", int), ("limit-concurrency", int),
                      ("header-timeout", float)):  # fmt: skip
        p.add_argument(f"--{knob}", type=typ, required=True)
    a = p.parse_args(argv)
    run_dir = Path(a.run_dir)
    w.start_watchdog(a.parent_pid, run_dir)
    os.register_at_fork(after_in_child=w.watch_main_after_fork)  # API servers and the manager are forked
    (run_dir / "workers").mkdir(exist_ok=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    server = _load_target(a.target, a)
    callbacks = [w.CallRecorder(str(run_dir / "calls.txt")), w.WorkerSetup(str(run_dir))]
    server._callback_runner._add_callbacks(callbacks)  # private, LitServe 0.2.19
    server.app.add_middleware(g.RequestGuard, run_dir=str(run_dir))
    g.install_error_handler(server.app)
    server.app.add_api_route("/course/instance", lambda: {"id": a.instance, "pid": os.getpid()}, methods=["GET"])
    g.GuardedHttpProtocol.header_timeout, g.GuardedHttpProtocol.max_connections = a.header_timeout, a.max_connections
    attempts = 1 if a.port else 5  # a fixed port is tried once; a free one is picked anew on each try
    for attempt in range(attempts):
        port = a.port
        if not port:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        (run_dir / "port.tmp").write_text(str(port))
        os.replace(run_dir / "port.tmp", run_dir / "port")
        try:
            server.run(host="127.0.0.1", port=port, num_api_servers=1, log_level="warning",
                       generate_client_file=False, timeout_keep_alive=5, limit_concurrency=a.limit_concurrency,
                       http=g.GuardedHttpProtocol)  # fmt: skip
            return
        except SystemExit as exc:
            if exc.code != 3 or attempt == attempts - 1:  # 3: uvicorn could not bind; anything else is not retried
                if exc.code == 3:
                    (run_dir / "bind_error").write_text(f"port {port} is taken" + (" (and 4 others)" * (attempts > 1)))
                raise


if __name__ == "__main__":
    main()
