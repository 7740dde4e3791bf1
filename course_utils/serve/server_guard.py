"""What a careless or hostile local client cannot break: limits in front of a course server (LitServe/FastAPI).

Installed by :mod:`course_utils.serve.server_process` on every server it starts; no lesson's subject, so a lesson
never needs to read it. Each limit answers with a clear 4xx/5xx JSON message and keeps the connection usable:

* :class:`RequestGuard` (ASGI middleware, outermost): a POST body must arrive within ``body_timeout`` seconds
  (408), be at most ``max_bytes`` (413), not be empty (400), and be JSON with at most ``max_depth`` levels of
  nesting, integers of at most ``max_int_digits`` digits and finite numbers (400/422). An exception escaping the
  app becomes a 500 *response* (uvicorn would otherwise close the keep-alive connection, failing the next,
  good request on it).
* :func:`install_error_handler`: FastAPI's 422 names the field and the rule, never echoes the value sent.
* :class:`GuardedHttpProtocol` (uvicorn ``http=``): a client that connects and does not finish its request
  headers within ``header_timeout`` gets 408 and is closed; more than ``max_header_count`` header fields or
  ``max_header_bytes`` of request head get 431 and are closed, before they are held in memory; beyond
  ``max_connections`` open connections a new one gets 503 and is closed (no descriptor exhaustion).
  uvicorn's ``limit_concurrency`` gives 503 for too many requests in flight, and ``timeout_keep_alive``
  closes idle connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from course_utils.serve.server_watch import WorkerWatch

DEFAULT_MAX_BYTES = 64 * 1024
DEFAULT_MAX_DEPTH = 32
DEFAULT_MAX_INT_DIGITS = 18
DEFAULT_BODY_TIMEOUT = 10.0


class _Reject(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _short(value: Any, n: int = 40) -> str:
    """A value as text, cut to ``n`` characters (huge values are never echoed back)."""
    text = repr(value)
    return text if len(text) <= n else f"{text[:n]}... ({len(text)} characters)"


def check_json(body: bytes, *, max_depth: int = DEFAULT_MAX_DEPTH,
               max_int_digits: int = DEFAULT_MAX_INT_DIGITS) -> Any:  # fmt: skip
    """Parse a request body as JSON within limits; raise ``_Reject(status, message)`` naming the problem."""
    if not body.strip():
        raise _Reject(400, "the request body is empty: send a JSON object")

    def parse_int(s: str) -> int:
        if len(s.lstrip("-")) > max_int_digits:
            raise _Reject(
                422, f"an integer with {len(s.lstrip('-'))} digits is out of range (at most {max_int_digits})"
            )
        return int(s)

    def parse_float(s: str) -> float:
        x = float(s)
        if not math.isfinite(x):
            raise _Reject(422, f"the number {_short(s, 20)} is out of range (it overflows a float)")
        return x

    def parse_constant(s: str) -> float:
        raise _Reject(422, f"{s} is not a JSON number: send finite numbers only")

    try:
        value = json.loads(body, parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant)
    except RecursionError:
        raise _Reject(400, f"the JSON is nested too deeply (at most {max_depth} levels)") from None
    except UnicodeDecodeError:
        raise _Reject(400, "the body is not UTF-8 text: send a JSON object") from None
    except json.JSONDecodeError as exc:
        raise _Reject(400, f"the body is not valid JSON ({exc.msg} at character {exc.pos})") from None
    stack = [(value, 1)]
    while stack:  # iterative: a deep document cannot overflow the stack here
        item, depth = stack.pop()
        if depth > max_depth:
            raise _Reject(400, f"the JSON is nested too deeply (more than {max_depth} levels)")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return value


async def _send_json(send: Any, status: int, detail: str, *, close: bool = False) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """ASGI middleware: bounded, timed, well-formed JSON bodies for POST requests; 500s as responses; with
    ``run_dir``, a 503 naming the server log as soon as a model worker dies (not a hang until a timeout)."""

    def __init__(self, app: Any, *, max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = DEFAULT_MAX_DEPTH,
                 max_int_digits: int = DEFAULT_MAX_INT_DIGITS, body_timeout: float = DEFAULT_BODY_TIMEOUT,
                 hint: str = "", run_dir: str = "") -> None:  # fmt: skip
        self.app, self.max_bytes, self.max_depth = app, max_bytes, max_depth
        self.max_int_digits, self.body_timeout, self.hint = max_int_digits, body_timeout, hint
        self.watch = WorkerWatch(run_dir) if run_dir else None

    def _msg(self, text: str) -> str:
        return f"{text}; {self.hint}" if self.hint else text

    async def _read_body(self, receive: Any) -> bytes:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        chunks, total, more = [], 0, True
        while more:
            left = deadline - loop.time()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(left, 0.001))
            except TimeoutError:
                raise _Reject(408, f"the request body did not arrive within {self.body_timeout:g} s") from None
            if message["type"] != "http.request":
                raise _Reject(400, "the client disconnected before sending the body")
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                raise _Reject(413, f"the body exceeds the limit of {self.max_bytes} bytes")
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked_send(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        if scope.get("method") in ("POST", "PUT", "PATCH"):
            headers = dict(scope.get("headers") or [])
            length = headers.get(b"content-length", b"")
            try:
                if length.isdigit() and int(length) > self.max_bytes:
                    raise _Reject(413, f"a body of {int(length)} bytes exceeds the limit of {self.max_bytes} bytes")
                body = await self._read_body(receive)
                check_json(body, max_depth=self.max_depth, max_int_digits=self.max_int_digits)
            except _Reject as exc:
                await _send_json(send, exc.status, self._msg(exc.message), close=exc.status in (408, 413))
                return
            sent, receive_more = False, receive  # the client's own receive, for what comes after the body

            async def replay() -> dict:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive_more()  # (a streaming answer listens here for the client's disconnect)

            receive = replay
        try:
            if self.watch is None:
                await self.app(scope, receive, tracked_send)
            else:
                await self._call_watched(scope, receive, send, tracked_send, lambda: started)
        except Exception as exc:  # noqa: BLE001 - answered as a 500 so the connection stays usable
            if started:
                raise
            await _send_json(send, 500, f"internal server error ({type(exc).__name__}); see the server log")

    async def _call_watched(self, scope: Any, receive: Any, send: Any, tracked_send: Any, started: Any) -> None:
        """Run the app, but answer 503 at once if a model worker dies before the answer has started."""
        dead = self.watch.start()
        if dead.is_set():
            await _send_json(send, 503, self.watch.why, close=True)
            return
        app_task = asyncio.ensure_future(self.app(scope, receive, tracked_send))
        dead_task = asyncio.ensure_future(dead.wait())
        try:
            await asyncio.wait({app_task, dead_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            dead_task.cancel()
        if app_task.done() or started():
            await app_task
            return
        app_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await app_task
        await _send_json(send, 503, self.watch.why, close=True)


def install_error_handler(app: Any, hint: str = "") -> None:
    """FastAPI validation errors as one short message (field and rule), never echoing the value sent."""
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    async def handler(request: Any, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors()[:5]:
            where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
            parts.append(f"{where}: {str(e.get('msg', 'invalid'))[:200]}")
        detail = "; ".join(parts) or "invalid request"
        return JSONResponse({"detail": f"{detail}; {hint}" if hint else detail}, status_code=422)

    app.add_exception_handler(RequestValidationError, handler)


def _raw_response(status: int, reason: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n")  # fmt: skip
    return head.encode() + body


class _HeadersTooLarge(Exception):
    """Raised inside the parser's header callback to stop parsing a request already answered with 431."""


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for request headers, limits on their number and size
    (431, so 60 MB of tiny headers cannot swell the server), and a cap on open connections."""

    header_timeout: float = 10.0
    max_connections: int = 256
    max_header_count: int = 100
    max_header_bytes: int = 32 * 1024  # request line and header fields together

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        self._rejected, self._in_head, self._head_bytes, self._n_headers, self._header_bytes = False, True, 0, 0, 0
        super().connection_made(transport)
        self._header_deadline = None
        if len(self.connections) > self.max_connections:
            transport.write(_raw_response(503, "Service Unavailable", f"too many open connections "
                                          f"(limit {self.max_connections}); retry later"))  # fmt: skip
            transport.close()
            return
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._too_slow)

    def _disarm(self) -> None:
        if getattr(self, "_header_deadline", None) is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _too_slow(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            msg = f"the request headers did not arrive within {self.header_timeout:g} s"
            self.transport.write(_raw_response(408, "Request Timeout", msg))
            self.transport.close()

    def _reject_headers(self, why: str) -> None:
        self._disarm()
        if not self._rejected:
            self._rejected = True
            msg = (f"the request headers are too large ({why}; at most {self.max_header_count} fields and "
                   f"{self.max_header_bytes} bytes)")  # fmt: skip
            self.transport.write(_raw_response(431, "Request Header Fields Too Large", msg))
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_header_bytes:  # one huge field never reaches on_header
            self._reject_headers(f"{self._head_bytes} bytes and no end of headers yet")

    def send_400_response(self, msg: str) -> None:
        if not self._rejected:  # after a 431 the parser's error is ours: nothing more is sent
            super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._n_headers = self._header_bytes = 0
        if self._header_deadline is None:
            self._arm()

    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._n_headers += 1
        self._header_bytes += len(name) + len(value) + 4
        if self._n_headers > self.max_header_count or self._header_bytes > self.max_header_bytes:
            self._reject_headers(f"more than {self._n_headers - 1} fields or {self._header_bytes} bytes")
            raise _HeadersTooLarge  # stops the parser: the rest of this chunk is not read into memory
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_head, self._head_bytes = False, 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0  # the next request on this connection starts its head

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
