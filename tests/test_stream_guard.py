"""The streaming endpoint's admission guard (course_utils.serve.stream_guard.AdmissionGuard), driven as ASGI
middleware with scripted messages: no server starts. Lesson 16's server runs it for real (test_llm_serving.py)."""

from __future__ import annotations

import asyncio
import json
import queue

import pytest

from course_utils.serve.stream_guard import AdmissionGuard


class _App:
    """The wrapped app: records each body it was given, then streams two chunks (the last ends the answer),
    or, with ``disconnect_first``, reads the client's next message first (a client that leaves mid-stream)."""

    def __init__(self, disconnect_first: bool = False) -> None:
        self.bodies: list[dict] = []
        self.disconnect_first = disconnect_first

    async def __call__(self, scope, receive, send):
        message = await receive()
        self.bodies.append(json.loads(message["body"]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if self.disconnect_first:
            await receive()
        await send({"type": "http.response.body", "body": b"tok ", "more_body": True})
        await send({"type": "http.response.body", "body": b"end", "more_body": False})


def _check(body: dict) -> None:
    if body.get("max_tokens", 1) > 100:
        raise ValueError(f"max_tokens {body['max_tokens']} > 100")


def _call(guard, body: bytes | list[bytes], after: list[dict] | None = None, path: str = "/predict"):
    """One POST through ``guard``: the body (in chunks), then ``after`` (what the client sends later); returns
    (status, the response body's bytes)."""
    chunks = body if isinstance(body, list) else [body]
    incoming = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    incoming += after or [{"type": "http.disconnect"}]
    sent = []

    async def receive():
        return incoming.pop(0)

    async def send(message):
        sent.append(message)

    asyncio.run(guard({"type": "http", "method": "POST", "path": path}, receive, send))
    status = next((m["status"] for m in sent if m["type"] == "http.response.start"), None)
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


@pytest.fixture
def guarded():
    app, cancelled = _App(), queue.Queue()
    return app, cancelled, AdmissionGuard(app, check=_check, cancelled=cancelled)


def test_a_good_body_is_admitted_tagged_with_its_connection(guarded):
    app, cancelled, guard = guarded
    status, out = _call(guard, [b'{"prompt": "hi", ', b'"max_tokens": 5}'])  # a body in two chunks
    assert (status, out) == (200, b"tok end")
    (body,) = app.bodies
    assert body["prompt"] == "hi" and body["max_tokens"] == 5 and body["conn"].endswith("-0")
    _call(guard, b'{"prompt": "again"}')
    assert app.bodies[1]["conn"].endswith("-1") and cancelled.empty()  # both ended normally: nothing cancelled


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"max_tokens": 101}', "max_tokens 101 > 100"),
        (b"{not json", "Expecting property name"),
        (b"[1, 2]", "the body must be a JSON object, not list"),
    ],  # fmt: skip
    ids=["check", "not-json", "not-object"],
)
def test_a_bad_body_is_refused_with_422_before_the_model(guarded, body, message):
    app, _, guard = guarded
    status, out = _call(guard, body)
    assert status == 422 and message in json.loads(out)["error"] and app.bodies == []


def test_the_boundary_body_is_admitted(guarded):
    app, _, guard = guarded
    assert _call(guard, b'{"max_tokens": 100}')[0] == 200 and len(app.bodies) == 1


def test_a_request_id_still_streaming_gets_409_and_is_free_again_after(guarded):
    app, _, guard = guarded
    guard._streaming.add("r1")  # r1's stream is open (another request in flight)
    status, out = _call(guard, b'{"request_id": "r1"}')
    assert status == 409 and "request_id 'r1' is still streaming" in json.loads(out)["error"] and app.bodies == []
    guard._streaming.discard("r1")
    assert _call(guard, b'{"request_id": "r1"}')[0] == 200
    assert _call(guard, b'{"request_id": "r1"}')[0] == 200, "the id is released when its stream ends"
    assert guard._streaming == set()


def test_a_client_that_leaves_mid_stream_is_cancelled_once_one_that_read_all_is_not():
    app, cancelled = _App(disconnect_first=True), queue.Queue()
    guard = AdmissionGuard(app, check=_check, cancelled=cancelled)
    _call(guard, b'{"prompt": "x"}', after=[{"type": "http.disconnect"}, {"type": "http.disconnect"}])
    assert cancelled.get_nowait() == app.bodies[0]["conn"] and cancelled.empty()
    calm, calm_cancelled = _App(), queue.Queue()
    guard = AdmissionGuard(calm, check=_check, cancelled=calm_cancelled)

    async def app_then_disconnect(scope, receive, send):  # the whole answer went out, then the client leaves
        await calm(scope, receive, send)
        await receive()

    guard.app = app_then_disconnect
    assert _call(guard, b'{"prompt": "x"}')[0] == 200 and calm_cancelled.empty()


def test_other_paths_and_methods_pass_through_and_the_status_must_be_4xx(guarded):
    app, _, guard = guarded
    assert _call(guard, b'{"max_tokens": 500}', path="/health")[0] == 200  # not the guarded path: not checked
    assert app.bodies == [{"max_tokens": 500}]  # and not tagged
    for status in (399, 500):
        with pytest.raises(ValueError, match=f"status must be a 4xx code, not {status}"):
            AdmissionGuard(app, check=_check, cancelled=queue.Queue(), status=status)
    assert AdmissionGuard(app, check=_check, cancelled=queue.Queue(), status=499).status == 499
