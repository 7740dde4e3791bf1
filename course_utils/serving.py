"""Serve a model over HTTP with dynamic batching (LitServe), start and stop it safely, and load-test it.

Three pieces, shared by lesson 13 and its tests:

* :class:`ServedModelAPI`, a LitServe ``LitAPI`` serving the digits CNN (or ResNet-18 at 32x32) with the
  two batching knobs, ``max_batch_size`` and ``batch_timeout``. Requests are validated in the HTTP
  process, **before** the batch queue (a pydantic request model whose validator calls
  :func:`validate_payload`; a size-limit middleware for oversized bodies). Why before: LitServe runs
  ``decode_request`` inside the batch loop, and an exception there fails *every* request batched with the
  bad one. ``validate="worker"`` keeps that naive design so the lesson can show the failure.
* :func:`serve`, a context manager that starts the server as a subprocess in its own process group, bound
  to 127.0.0.1 on a free port, waits (bounded) until ``/health`` answers, and on exit, also after an
  exception, terminates the whole group (SIGTERM, then SIGKILL) and checks that no process and no
  listening port is left. Stopping only the main process would leave LitServe's workers listening.
* :func:`run_load`, an async load generator (httpx) with a bounded request count and time and a
  concurrency parameter, loopback hosts only, returning throughput and p50/p90/p99.

Run the server by hand with ``python -m course_utils.serving --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import litserve as ls
import numpy as np
from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, PrivateAttr, model_validator

from .errors import CourseError

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Models the server can serve: per-item input shape (without the batch dimension).
MODEL_SHAPES: dict[str, tuple[int, ...]] = {"cnn": (1, 8, 8), "resnet18": (3, 32, 32)}
#: Default request-size limit: generous for one item of any served model, small enough to stop abuse.
DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024


class ServingError(CourseError, RuntimeError):
    """The server did not start, or something it started was still alive after shutdown."""


class LoopbackOnlyError(CourseError, ValueError):
    """The load generator was pointed at a host that is not this machine."""


# ----------------------------------------------------------------------------------------------------------
# Request validation (pure functions: run in the HTTP process, before the batch queue)
# ----------------------------------------------------------------------------------------------------------


def expected_shape(model: str) -> tuple[int, ...]:
    """Per-item input shape of a served model; a ValueError lists the known models."""
    if model not in MODEL_SHAPES:
        raise ValueError(f"unknown model '{model}': use one of {sorted(MODEL_SHAPES)}")
    return MODEL_SHAPES[model]


def _describe_format(shape: tuple[int, ...]) -> str:
    n = int(np.prod(shape))
    return (
        f'send {{"inputs": <nested list of numbers with shape {list(shape)}>}} or '
        f'{{"b64": <base64 of {n} little-endian float32 values ({4 * n} bytes)>, "dtype": "float32"}}'
    )


def validate_payload(payload: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Check one request body and return it as a float32 array of ``shape``; ValueError names what was expected.

    Accepted bodies: ``{"inputs": nested list}`` with exactly ``shape`` (a leading batch dimension of 1 is
    allowed) and numbers only, or ``{"b64": base64 string, "dtype": "float32"}`` holding exactly
    ``prod(shape)`` float32 values. Anything else (wrong shape, wrong dtype, strings or booleans, bad base64,
    non-finite values, unknown keys) raises ``ValueError`` whose message says what to send.
    """
    shape = tuple(shape)
    hint = _describe_format(shape)
    if not isinstance(payload, dict):
        raise ValueError(f"expected a JSON object, got {type(payload).__name__}; {hint}")
    extra = set(payload) - {"inputs", "b64", "dtype"}
    if extra:
        raise ValueError(f"unknown key(s) {sorted(extra)}; {hint}")
    has_inputs, has_b64 = "inputs" in payload, "b64" in payload
    if has_inputs == has_b64:
        raise ValueError(f"give exactly one of 'inputs' or 'b64'; {hint}")
    dtype = payload.get("dtype", "float32")
    if dtype != "float32":
        raise ValueError(f"dtype must be 'float32', got {dtype!r}; {hint}")
    if has_b64:
        data = payload["b64"]
        if not isinstance(data, str):
            raise ValueError(f"'b64' must be a base64 string, got {type(data).__name__}; {hint}")
        try:
            raw = base64.b64decode(data, validate=True)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"'b64' is not valid base64 ({exc}); {hint}") from None
        want = 4 * int(np.prod(shape))
        if len(raw) != want:
            raise ValueError(f"'b64' decodes to {len(raw)} bytes, expected {want} (shape {list(shape)}, float32)")
        arr = np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float32)
    else:
        arr = _nested_to_array(payload["inputs"], hint)
        if arr.shape == (1, *shape):
            arr = arr[0]
        if arr.shape != shape:
            raise ValueError(f"'inputs' has shape {list(arr.shape)}, expected {list(shape)}; {hint}")
    if not np.isfinite(arr).all():
        raise ValueError(f"inputs contain NaN or infinity; expected finite float32 values of shape {list(shape)}")
    return np.ascontiguousarray(arr)


def _nested_to_array(value: Any, hint: str) -> np.ndarray:
    def bad_leaf(x: Any) -> bool:
        return isinstance(x, bool) or not isinstance(x, (int, float))

    def walk(x: Any) -> None:
        if isinstance(x, list):
            for item in x:
                walk(item)
        elif bad_leaf(x):
            raise ValueError(f"'inputs' must hold numbers only, found {type(x).__name__} {x!r:.40}; {hint}")

    if not isinstance(value, list):
        raise ValueError(f"'inputs' must be a nested list, got {type(value).__name__}; {hint}")
    walk(value)
    try:
        return np.asarray(value, dtype=np.float32)
    except ValueError:
        raise ValueError(f"'inputs' is ragged (rows of different lengths); {hint}") from None


def make_payload(x: Any, *, fmt: str = "b64") -> bytes:
    """Encode one input (array or tensor, without batch dimension) as a request body.

    ``fmt="b64"`` sends raw float32 bytes in base64 (compact, cheap to parse); ``fmt="json"`` sends a
    nested list (readable, slower to parse).
    """
    arr = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if fmt == "b64":
        body: dict[str, Any] = {"b64": base64.b64encode(arr.astype("<f4").tobytes()).decode(), "dtype": "float32"}
    elif fmt == "json":
        body = {"inputs": arr.tolist()}
    else:
        raise ValueError(f"fmt must be 'b64' or 'json', got {fmt!r}")
    return json.dumps(body).encode()


# ----------------------------------------------------------------------------------------------------------
# The LitServe side (imported lazily: only the server process needs litserve)
# ----------------------------------------------------------------------------------------------------------

_SERVED_SHAPE: tuple[int, ...] = MODEL_SHAPES["cnn"]  # set by the server's main() before the app starts


class TensorRequest(BaseModel):
    """The request body as FastAPI sees it: validated in the HTTP process (422 naming what was expected)."""

    model_config = ConfigDict(extra="allow")
    _array: Any = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _check(cls, data: Any, handler: Any) -> Any:
        if isinstance(data, cls):
            return data
        arr = validate_payload(data, _SERVED_SHAPE)  # ValueError -> 422 with its message
        obj = handler({})
        obj._array = arr
        return obj


class _ModelAPI(ls.LitAPI):
    """Shared part of the served APIs: load the model, batch, predict, unbatch, encode."""

    def __init__(self, model: str = "cnn", *, threads: int = 1, device: str = "cpu", stats_path: str = "",
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.model_name, self.threads, self.device_name, self.shape = model, threads, device, expected_shape(model)
        self.stats_path = stats_path  # one line per model call: "<batch size> <predict ms>"

    def setup(self, device: str) -> None:
        import torch

        torch.set_num_threads(self.threads)
        if self.model_name == "cnn":
            from .models import load_digits_model

            net = load_digits_model("cnn")
        else:
            from .models import resnet

            net, _ = resnet(self.model_name)
        self.net = net.to(self.device_name).eval()

    def batch(self, inputs: list) -> Any:
        import torch

        return torch.stack(inputs)

    def unbatch(self, output: Any) -> list:
        return list(output)

    def predict(self, x: Any) -> Any:
        import torch

        single = x.dim() == len(self.shape)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.net((x.unsqueeze(0) if single else x).to(self.device_name)).float().cpu()
        if self.stats_path:
            with open(self.stats_path, "a") as fh:
                fh.write(f"{1 if single else len(x)} {(time.perf_counter() - t0) * 1000:.3f}\n")
        return out[0] if single else out

    def encode_response(self, output: Any) -> dict:
        return {"logits": output.tolist(), "label": int(output.argmax())}


class ServedModelAPI(_ModelAPI):
    """Validation before the batch queue: a bad request gets its 4xx alone, its batch-mates are answered."""

    def decode_request(self, request: TensorRequest) -> Any:
        import torch

        if request._array is None:  # pragma: no cover - FastAPI always runs the validator
            raise HTTPException(400, detail=f"unvalidated request; {_describe_format(self.shape)}")
        return torch.from_numpy(request._array)


# LitServe reads the request type from this annotation; with postponed annotations it would be a string.
ServedModelAPI.decode_request.__annotations__["request"] = TensorRequest


class NaiveServedModelAPI(_ModelAPI):
    """What not to do: validating in ``decode_request`` runs inside the batch, so one bad request fails it all."""

    def decode_request(self, request: Any) -> Any:
        import torch

        try:
            return torch.from_numpy(validate_payload(request, self.shape))
        except ValueError as exc:
            raise HTTPException(400, detail=str(exc)) from None


def build_api(model: str = "cnn", *, max_batch_size: int = 1, batch_timeout: float = 0.0, threads: int = 1,
              device: str = "cpu", validate: str = "server", stats_path: str = "") -> _ModelAPI:  # fmt: skip
    """A LitAPI instance serving ``model`` with the given batching knobs.

    ``validate="server"`` (default) validates before the batch queue; ``validate="worker"`` validates in
    ``decode_request`` inside the batch loop, where one bad request fails its whole batch (for the lesson).
    """
    if validate not in ("server", "worker"):
        raise ValueError(f"validate must be 'server' or 'worker', got {validate!r}")
    cls = ServedModelAPI if validate == "server" else NaiveServedModelAPI
    return cls(model, threads=threads, device=device, stats_path=stats_path, max_batch_size=max_batch_size,
               batch_timeout=batch_timeout)  # fmt: skip


class PayloadLimitMiddleware:
    """ASGI middleware: reject bodies larger than ``max_bytes`` with 413 and a message, before any parsing."""

    def __init__(self, app: Any, *, max_bytes: int, hint: str = "") -> None:
        self.app, self.max_bytes, self.hint = app, max_bytes, hint

    async def _reject(self, send: Any, size: int | str) -> None:
        msg = f"payload of {size} bytes exceeds the limit of {self.max_bytes} bytes; {self.hint}"
        body = json.dumps({"detail": msg}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._reject(send, int(length))
            return
        # Streamed bodies without Content-Length: read them fully (bounded), then replay.
        chunks: list[bytes] = []
        total = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await self._reject(send, f"more than {self.max_bytes}")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body, sent = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _install_error_handler(app: Any, hint: str) -> None:
    """Turn FastAPI's validation errors into one readable message: 400 for malformed JSON, 422 otherwise."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    async def handler(request: Any, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = f"the body is not valid JSON ({errors[0].get('ctx', {}).get('error', 'decode error')}); {hint}"
            return JSONResponse({"detail": detail}, status_code=400)
        msgs = [str(e.get("msg", "")).removeprefix("Value error, ") for e in errors]
        return JSONResponse({"detail": "; ".join(msgs) or hint}, status_code=422)

    app.add_exception_handler(RequestValidationError, handler)


def _server_main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the server subprocess (``python -m course_utils.serving``)."""
    global _SERVED_SHAPE
    p = argparse.ArgumentParser(description="Serve a course model with LitServe (dynamic batching).")
    p.add_argument("--model", default="cnn", choices=sorted(MODEL_SHAPES))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-batch-size", type=int, default=1)
    p.add_argument("--batch-timeout", type=float, default=0.0, help="seconds to wait for a batch to fill")
    p.add_argument("--threads", type=int, default=1, help="torch threads in the inference worker")
    p.add_argument("--device", default="cpu")
    p.add_argument("--validate", default="server", choices=["server", "worker"])
    p.add_argument("--max-payload-bytes", type=int, default=DEFAULT_MAX_PAYLOAD_BYTES)
    p.add_argument("--request-timeout", type=float, default=30.0)
    p.add_argument("--stats-path", default="", help="append '<batch size> <predict ms>' per model call here")
    a = p.parse_args(argv)
    if not _is_loopback(a.host):
        raise SystemExit(f"refusing to bind to {a.host}: the course serves on loopback only (127.0.0.1)")
    _SERVED_SHAPE = expected_shape(a.model)
    api = build_api(a.model, max_batch_size=a.max_batch_size, batch_timeout=a.batch_timeout,
                    threads=a.threads, device=a.device, validate=a.validate, stats_path=a.stats_path)  # fmt: skip
    hint = f"one request carries one input; {_describe_format(_SERVED_SHAPE)}"
    server = ls.LitServer(
        api,
        accelerator="cuda" if a.device.startswith("cuda") else "cpu",
        devices=1,
        workers_per_device=1,
        timeout=a.request_timeout,
        middlewares=[(PayloadLimitMiddleware, {"max_bytes": a.max_payload_bytes, "hint": hint})],
    )
    _install_error_handler(server.app, hint)
    server.run(host=a.host, port=a.port, num_api_servers=1, log_level="warning", generate_client_file=False)


# ----------------------------------------------------------------------------------------------------------
# Starting and stopping the server subprocess
# ----------------------------------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid`` (Linux: read from /proc; else a signal-0 probe)."""
    proc = Path("/proc")
    if proc.is_dir():
        out = []
        for d in proc.iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
            state, pgrp = fields[0], int(fields[2])
            if pgrp == pgid and state not in ("Z", "X"):
                out.append(int(d.name))
        return sorted(out)
    try:  # pragma: no cover - non-Linux
        os.killpg(pgid, 0)
        return [pgid]
    except ProcessLookupError:  # pragma: no cover
        return []


@dataclass
class Server:
    """A running server: where it listens, its process group, its log file and its settings."""

    host: str
    port: int
    pgid: int
    log_path: Path
    settings: dict[str, Any]
    process: subprocess.Popen = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def predict_url(self) -> str:
        return f"{self.url}/predict"

    def batch_stats(self, *, since: int = 0):
        """Model calls the server made so far (from line ``since``): a DataFrame with batch_size and predict_ms.

        Pass ``since=len(previous frame)`` to see only the calls of the latest load test.
        """
        import pandas as pd

        path = self.log_path.parent / "batches.txt"
        rows = []
        if path.exists():
            for line in path.read_text().splitlines()[since:]:
                parts = line.split()
                if len(parts) == 2:
                    rows.append({"batch_size": int(parts[0]), "predict_ms": float(parts[1])})
        return pd.DataFrame(rows, columns=["batch_size", "predict_ms"])

    def log_tail(self, n: int = 30) -> str:
        """The last ``n`` lines of the server's log (stdout and stderr)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def _wait_ready(srv: Server, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    with httpx.Client(trust_env=False, timeout=1.0) as client:
        while time.monotonic() < deadline:
            if srv.process.poll() is not None:
                raise ServingError(
                    f"the server exited with code {srv.process.returncode} before it was ready. Log:\n{srv.log_tail()}"
                )
            try:
                r = client.get(f"{srv.url}/health")
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise ServingError(
        f"the server was not ready within {timeout:.0f} s (raise start_timeout on a slow machine). "
        f"Log:\n{srv.log_tail()}"
    )


def stop(srv: Server, *, grace: float = 5.0) -> None:
    """Terminate the server's whole process group (SIGTERM, then SIGKILL after ``grace`` s); verify it is gone.

    Raises :class:`ServingError` if a process of the group or the listening port survives.
    """

    def signal_group(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(srv.pgid, sig)

    def wait_gone(limit: float) -> bool:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                srv.process.wait(timeout=0.05)
            if srv.process.poll() is not None and not group_pids(srv.pgid):
                return True
            time.sleep(0.05)
        return srv.process.poll() is not None and not group_pids(srv.pgid)

    signal_group(signal.SIGTERM)
    if not wait_gone(grace):
        signal_group(signal.SIGKILL)
        wait_gone(5.0)
    left = group_pids(srv.pgid)
    deadline = time.monotonic() + 3.0
    while port_open(srv.port, srv.host) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left or port_open(srv.port, srv.host):
        raise ServingError(
            f"after stopping the server, processes {left} of group {srv.pgid} or port {srv.port} are still alive; "
            f"kill them with: kill -9 -- -{srv.pgid}"
        )


@contextlib.contextmanager
def serve(
    model: str = "cnn",
    *,
    max_batch_size: int = 1,
    batch_timeout: float = 0.0,
    threads: int = 1,
    device: str = "cpu",
    validate: str = "server",
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    start_timeout: float = 90.0,
    grace: float = 5.0,
) -> Iterator[Server]:
    """Start a LitServe server for ``model`` on 127.0.0.1 (free port) and stop it on exit, even on errors.

    The server runs as ``python -m course_utils.serving`` in a new session, so it and every worker it forks
    share one process group that :func:`stop` signals as a whole. Yields a :class:`Server`.
    ``batch_timeout`` is in seconds; ``max_batch_size=1`` means no batching.
    """
    expected_shape(model)
    if max_batch_size < 1 or batch_timeout < 0:
        raise ValueError("max_batch_size must be >= 1 and batch_timeout >= 0 (seconds)")
    host, port = "127.0.0.1", free_port()
    log_dir = Path(tempfile.mkdtemp(prefix="course_serve_"))
    log_path = log_dir / "server.log"
    cmd = [sys.executable, "-m", "course_utils.serving", "--model", model, "--host", host, "--port", str(port),
           "--max-batch-size", str(max_batch_size), "--batch-timeout", str(batch_timeout),
           "--threads", str(threads), "--device", device, "--validate", validate,
           "--max-payload-bytes", str(max_payload_bytes), "--stats-path", str(log_dir / "batches.txt")]  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=str(log_dir), start_new_session=True)  # fmt: skip
    settings = {"model": model, "max_batch_size": max_batch_size, "batch_timeout": batch_timeout,
                "threads": threads, "device": device, "validate": validate}  # fmt: skip
    srv = Server(host, port, proc.pid, log_path, settings, proc)
    try:
        _wait_ready(srv, start_timeout)
        yield srv
    finally:
        try:
            stop(srv, grace=grace)
        finally:
            shutil.rmtree(log_dir, ignore_errors=True)  # the log and batch record go with the server


# ----------------------------------------------------------------------------------------------------------
# Clients: single requests and the load generator (loopback only)
# ----------------------------------------------------------------------------------------------------------


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_loopback(url: str) -> None:
    """Raise :class:`LoopbackOnlyError` unless ``url`` points at this machine (127.0.0.0/8, ::1, localhost)."""
    host = urlsplit(url).hostname or ""
    if not _is_loopback(host):
        raise LoopbackOnlyError(
            f"refusing to send load to '{host}': the course's load generator only targets this machine "
            "(use http://127.0.0.1:PORT, e.g. the url of cu.serving.serve())"
        )


def post(url: str, body: bytes | dict, *, timeout: float = 30.0) -> tuple[int, Any]:
    """POST one request (bytes sent as-is, a dict as JSON) and return (status code, decoded JSON or text)."""
    import httpx

    check_loopback(url)
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with httpx.Client(trust_env=False, timeout=timeout) as client:
        r = client.post(url, content=content, headers={"content-type": "application/json"})
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def post_many(url: str, bodies: Sequence[bytes], *, timeout: float = 30.0) -> list[tuple[int, Any]]:
    """Send all ``bodies`` at once (concurrently) and return (status, JSON) per body, in order."""
    import httpx

    check_loopback(url)

    async def go() -> list[tuple[int, Any]]:
        limits = httpx.Limits(max_connections=len(bodies) or 1)
        async with httpx.AsyncClient(trust_env=False, timeout=timeout, limits=limits) as client:
            rs = await asyncio.gather(
                *(client.post(url, content=b, headers={"content-type": "application/json"}) for b in bodies)
            )
        out = []
        for r in rs:
            try:
                out.append((r.status_code, r.json()))
            except ValueError:
                out.append((r.status_code, r.text))
        return out

    return _run_coro(go())


def _run_coro(coro: Any) -> Any:
    """Run a coroutine to completion, also from inside Jupyter (whose event loop is already running)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=target, name="course-load")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass
class LoadResult:
    """Outcome of one load test: counts, wall time, throughput (ok requests/s) and latency percentiles (ms)."""

    concurrency: int
    n_ok: int
    n_failed: int
    wall_s: float
    latencies_ms: list[float] = field(repr=False)
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.n_ok / self.wall_s if self.wall_s > 0 else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    @property
    def p50_ms(self) -> float:
        return self.percentile(50)

    @property
    def p90_ms(self) -> float:
        return self.percentile(90)

    @property
    def p99_ms(self) -> float:
        return self.percentile(99)

    def as_dict(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "n_ok": self.n_ok, "n_failed": self.n_failed,
                "wall_s": self.wall_s, "throughput": self.throughput, "p50_ms": self.p50_ms,
                "p90_ms": self.p90_ms, "p99_ms": self.p99_ms}  # fmt: skip


async def load_async(
    url: str,
    bodies: Sequence[bytes],
    *,
    n_requests: int,
    concurrency: int,
    max_seconds: float = 30.0,
    warmup: int = 0,
    timeout: float = 30.0,
) -> LoadResult:
    """Closed-loop load: ``concurrency`` clients each send a request, wait for the answer, send the next.

    Stops after ``n_requests`` requests or ``max_seconds``, whichever comes first (both bounded). Bodies are
    used round-robin. ``warmup`` requests are sent first and not counted. Latency is measured per request
    from send to full response; throughput counts successful (2xx) requests over the wall time.
    """
    import httpx

    check_loopback(url)
    if n_requests < 1 or concurrency < 1 or not bodies:
        raise ValueError("need n_requests >= 1, concurrency >= 1 and at least one body")
    if max_seconds <= 0:
        raise ValueError("max_seconds must be > 0")
    headers = {"content-type": "application/json"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(trust_env=False, timeout=timeout, limits=limits) as client:
        for i in range(warmup):
            await client.post(url, content=bodies[i % len(bodies)], headers=headers)
        latencies: list[float] = []
        statuses: dict[int, int] = {}
        counter = 0
        start = time.perf_counter()
        deadline = start + max_seconds

        async def worker() -> None:
            nonlocal counter
            while counter < n_requests and time.perf_counter() < deadline:
                i = counter
                counter += 1
                t0 = time.perf_counter()
                try:
                    r = await client.post(url, content=bodies[i % len(bodies)], headers=headers)
                    code = r.status_code
                except httpx.HTTPError:
                    code = 0
                dt = (time.perf_counter() - t0) * 1000
                statuses[code] = statuses.get(code, 0) + 1
                if 200 <= code < 300:
                    latencies.append(dt)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, n_requests))))
        wall = time.perf_counter() - start
    n_ok = len(latencies)
    return LoadResult(concurrency, n_ok, sum(statuses.values()) - n_ok, wall, latencies, statuses)


def run_load(url: str, bodies: Sequence[bytes], **kwargs: Any) -> LoadResult:
    """Synchronous wrapper of :func:`load_async` (works inside Jupyter too)."""
    return _run_coro(load_async(url, bodies, **kwargs))


def load_sweep(
    url: str, bodies: Sequence[bytes], concurrencies: Sequence[int], *, n_requests: int | Sequence[int],
    max_seconds: float = 30.0, warmup: int = 0, label: str = "",
):  # fmt: skip
    """One :func:`run_load` per concurrency; a DataFrame with a row each (plus ``label`` as a column)."""
    import pandas as pd

    counts = [n_requests] * len(concurrencies) if isinstance(n_requests, int) else list(n_requests)
    rows = []
    for c, n in zip(concurrencies, counts, strict=True):
        res = run_load(url, bodies, n_requests=max(n, c), concurrency=c, max_seconds=max_seconds, warmup=warmup)
        rows.append({"server": label, **res.as_dict()})
    return pd.DataFrame(rows)


def batching_pays_at(df, *, batched: str, unbatched: str, margin: float = 1.0) -> int | None:
    """The smallest concurrency at which the ``batched`` rows' throughput beats ``unbatched`` by ``margin``x.

    ``df`` has columns ``server, concurrency, throughput`` (as from :func:`load_sweep`); None if never.
    """
    a = df[df["server"] == batched].set_index("concurrency")["throughput"]
    b = df[df["server"] == unbatched].set_index("concurrency")["throughput"]
    for c in sorted(set(a.index) & set(b.index)):
        if a[c] > margin * b[c]:
            return int(c)
    return None


def plot_latency_vs_throughput(df, *, inproc=None, title: str = "Served model: latency vs throughput"):
    """Two panels from a :func:`load_sweep` table (column ``server`` per setting).

    Left: p50 (solid) and p99 (dashed) latency against throughput, each point one concurrency (labelled).
    Right: throughput against concurrency; ``inproc`` (a :func:`course_utils.sweep.batch_sweep` table of the
    same model) adds the model's own throughput at batch size = concurrency, the ceiling without HTTP.
    """
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (name, g) in enumerate(df.groupby("server", sort=False)):
        g = g.sort_values("concurrency")
        color = f"C{i}"
        ax1.plot(g["throughput"], g["p50_ms"], marker="o", color=color, label=f"{name} p50")
        ax1.plot(g["throughput"], g["p99_ms"], marker="x", ls="--", color=color, label=f"{name} p99")
        for _, r in g.iterrows():
            ax1.annotate(f"c={int(r['concurrency'])}", (r["throughput"], r["p50_ms"]), fontsize=7,
                         textcoords="offset points", xytext=(3, 3))  # fmt: skip
        ax2.plot(g["concurrency"], g["throughput"], marker="o", color=color, label=name)
    if inproc is not None and len(inproc):
        ax2.plot(inproc["batch_size"], inproc["throughput"], marker="s", color="gray", ls=":",
                 label="model in-process (batch = concurrency)")  # fmt: skip
    ax1.set_xlabel("throughput (requests/s)")
    ax1.set_ylabel("latency per request (ms)")
    ax1.set_yscale("log")
    ax1.legend(fontsize=8)
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("concurrent clients (in-process: batch size)")
    ax2.set_ylabel("throughput (items/s)")
    ax2.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    _server_main()
