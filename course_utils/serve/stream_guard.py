"""Admission in front of a streaming LLM endpoint: a bad request refused with a 4xx, a vanished client reported.

A streamed answer starts with HTTP 200 before its first token; an error found later can only end the stream. So
:class:`AdmissionGuard` (ASGI middleware, in the HTTP process) reads each POST body for ``path`` first and asks
``check(body)`` whether the engine could ever run it: a ``ValueError`` is answered at once with ``status`` (422) and
``{"error": message}``, and the request never reaches the model worker. A body naming a ``request_id`` that is
still streaming gets 409. Every admitted body is tagged with a connection id (``"conn"``); when the client goes
away before its stream ended, that id is put on ``cancelled`` (a ``multiprocessing`` queue the worker reads
before each engine step), so the engine drops the request within a step and frees its KV blocks.

Lesson 16's server installs it (``LitServer(..., middlewares=[(AdmissionGuard, {...})])``).
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from typing import Any


async def _refuse(send: Any, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class AdmissionGuard:
    """ASGI middleware: ``check(body)`` before admission (422 on ``ValueError``), one stream per ``request_id``
    (409), and the connection id of every client that left before its stream ended put on ``cancelled``."""

    def __init__(self, app: Any, *, check: Callable[[dict], None], cancelled: Any, path: str = "/predict",
                 status: int = 422) -> None:  # fmt: skip
        if not 400 <= status < 500:
            raise ValueError(f"status must be a 4xx code, not {status}")
        self.app, self.check, self.cancelled, self.path, self.status = app, check, cancelled, path, status
        self._ids = itertools.count()
        self._streaming: set[str] = set()  # request_ids whose streams are open

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") != self.path:
            await self.app(scope, receive, send)
            return
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # gone before its body arrived: nothing was admitted
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        try:
            body = json.loads(b"".join(chunks))
            if not isinstance(body, dict):
                raise ValueError(f"the body must be a JSON object, not {type(body).__name__}")
            self.check(body)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError too
            await _refuse(send, self.status, str(exc))
            return
        rid = body.get("request_id")
        if rid is not None and str(rid) in self._streaming:
            await _refuse(send, 409, f"request_id {rid!r} is still streaming: give each request its own id")
            return
        conn = f"{os.getpid()}-{next(self._ids)}"
        await self._admitted(scope, receive, send, json.dumps({**body, "conn": conn}).encode(), conn, rid)

    async def _admitted(self, scope: Any, receive: Any, send: Any, body: bytes, conn: str, rid: Any) -> None:
        state = {"replayed": False, "ended": False}
        if rid is not None:
            self._streaming.add(str(rid))

        def left() -> None:  # the client went away before the last byte of its answer: cancel it, once
            if not state["ended"]:
                state["ended"] = True
                self.cancelled.put(conn)

        async def replay() -> dict:
            if not state["replayed"]:
                state["replayed"] = True
                return {"type": "http.request", "body": body, "more_body": False}
            message = await receive()
            if message["type"] == "http.disconnect":
                left()
            return message

        async def watched_send(message: dict) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                state["ended"] = True  # the whole answer went out: a later disconnect is the normal end
            try:
                await send(message)
            except OSError:
                left()
                raise

        try:
            await self.app(scope, replay, watched_send)
        finally:
            if rid is not None:
                self._streaming.discard(str(rid))
