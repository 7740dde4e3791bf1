"""The load generator and the server guard pinned on known answers: percentiles of a known list, open-loop latency
(and the streaming load's line times) counted from each request's due time (a client that falls behind a bunched
burst against a server with a known delay), closed-loop latencies that fit in the wall time, the body-size limit
over many small chunks, and the exact nesting and integer-size boundaries."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from course_utils.serve import load_generator, stream_load
from course_utils.serve import server_guard as g


def test_load_result_percentiles_of_a_known_list():
    lat = [float(x) for x in range(101)]
    r = load_generator.LoadResult("open", 8, 5.0, 101, 3, 4.0, lat, {200: 101, 500: 3}, n_not_sent=2)
    assert (r.p50_ms, r.p90_ms, r.p99_ms) == (50.0, 90.0, 99.0)
    assert r.percentile(10) == 10.0 and r.percentile(75) == 75.0
    assert r.throughput == pytest.approx(101 / 4.0)
    d = r.as_dict()
    assert (d["p50_ms"], d["p90_ms"], d["p99_ms"], d["n_ok"], d["n_failed"], d["n_not_sent"]) == (
        50.0,
        90.0,
        99.0,
        101,
        3,
        2,
    )
    empty = load_generator.LoadResult("closed", 1, float("nan"), 0, 0, 0.0, [])
    assert empty.throughput == 0.0 and empty.p50_ms != empty.p50_ms  # nan, not an error


# ------------------------------------------------------------------------- open-loop latency from the due time

DELAY_S = 0.02  # the server's known answer time
BLOCK_S = 0.03  # the client's known lag per request (encoding a body blocks the event loop)
N = 8


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("content-length", 0)))
        time.sleep(DELAY_S)
        body = b'{"ok": 1}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/predict"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class SlowBody(dict):
    """A JSON body whose encoding takes BLOCK_S: the client falls behind its schedule by a known amount."""

    def items(self):
        time.sleep(BLOCK_S)
        return super().items()


def test_open_loop_latency_counts_from_the_due_time(slow_server):
    # N arrivals bunched into microseconds, so all are due at once. The client falls behind: starting request k
    # (encoding its body) blocks the event loop for BLOCK_S, so no answer can be read before all N have started,
    # N * BLOCK_S after they were due. Counted from the due time, every latency is at least that; counted from
    # the moment each request was started or sent, the backlog would vanish (request k would lose k * BLOCK_S).
    r = load_generator.open_loop(slow_server, [SlowBody(x=1)], rate=1e6, n_requests=N, max_in_flight=64, seed=3)
    assert r.n_ok == N and r.n_failed == 0 and r.n_not_sent == 0
    lat = sorted(r.latencies_ms)
    assert lat[0] >= N * BLOCK_S * 1000 * 0.9, (
        f"all {N} requests were due at once and none could be sent before ~{N * BLOCK_S * 1000:.0f} ms, yet the "
        f"shortest latency is {lat[0]:.0f} ms: latency must count from the due time, not from the send"
    )
    assert lat[-1] < 5000, lat


def test_open_loop_refuses_beyond_max_in_flight(slow_server):
    # six arrivals at once, at most two outstanding: exactly two are sent, four are counted as not sent
    r = load_generator.open_loop(slow_server, [b'{"x": 1}'], rate=1e6, n_requests=6, max_in_flight=2, seed=0)
    assert (r.n_ok, r.n_not_sent, r.n_failed) == (2, 4, 0), r.as_dict()
    assert r.concurrency == 2 and r.rate == 1e6 and r.mode == "open"


def test_closed_loop_counts_every_answer(slow_server):
    r = load_generator.closed_loop(slow_server, [b'{"x": 1}'], n_requests=6, concurrency=2)
    assert r.n_ok == 6 and r.statuses == {200: 6} and len(r.latencies_ms) == 6
    assert min(r.latencies_ms) >= DELAY_S * 1000 * 0.9
    # each of the 2 clients waits for one answer at a time: its latencies are disjoint parts of the run, so all 6
    # together fit in 2 x the wall time (counted from the run's start instead, they would add up to ~4 x)
    assert sum(r.latencies_ms) <= 2 * r.wall_s * 1000 * 1.01, (sum(r.latencies_ms), r.wall_s)


def test_streamed_line_times_count_from_the_due_time(slow_server):
    # as in the open-loop test: all N due at once, each body's encoding blocks the loop BLOCK_S, so no line can be
    # read before N * BLOCK_S after the due time; counted from each send, the backlog would vanish
    answers = stream_load.open_loop_stream(slow_server, [SlowBody(x=1)], rate=1e6, n_requests=N, timeout=30)
    assert len(answers) == N and all(a.ok for a in answers), [a.error for a in answers]
    assert all(a.lines == [{"ok": 1}] and len(a.times_s) == 1 for a in answers)
    first = min(a.times_s[0] for a in answers)
    assert first >= N * BLOCK_S * 0.9, f"the earliest line came {first * 1000:.0f} ms after it was due"


# ---------------------------------------------------------------------------------------------- server guard


def _call_guard(chunks: list[bytes], headers: tuple = (), **limits) -> tuple[int, dict, bool]:
    """Send ``chunks`` as one POST body through RequestGuard (no content-length); return status, JSON, app ran."""
    ran = []

    async def app(scope, receive, send):
        msg = await receive()
        ran.append(msg["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "headers": [(b"content-type", b"application/json"), *headers]}
    asyncio.run(g.RequestGuard(app, **limits)(scope, receive, send))
    status = sent[0]["status"]
    body = json.loads(sent[1]["body"])
    return status, body, bool(ran)


def test_body_limit_is_on_the_total_over_many_small_chunks():
    payload = json.dumps({"x": "a" * 3000}).encode()  # 3,009 bytes
    chunks = [payload[i : i + 100] for i in range(0, len(payload), 100)]  # 31 chunks of at most 100 bytes
    status, body, ran = _call_guard(chunks, max_bytes=3008)
    assert status == 413 and not ran, "3,009 bytes in 100-byte chunks exceed a 3,008-byte limit in total"
    assert body["detail"] == "the body exceeds the limit of 3008 bytes"
    status, _, ran = _call_guard(chunks, max_bytes=3009)
    assert status == 200 and ran, "exactly the limit is allowed"


def test_declared_length_is_refused_before_reading_only_above_the_limit():
    body = b'{"x": "' + b"a" * 91 + b'"}'  # 100 bytes
    status, detail, ran = _call_guard([body], headers=((b"content-length", b"100"),), max_bytes=100)
    assert status == 200 and ran
    status, detail, ran = _call_guard([body], headers=((b"content-length", b"101"),), max_bytes=100)
    assert status == 413 and not ran
    assert detail["detail"] == "a body of 101 bytes exceeds the limit of 100 bytes"


def test_nesting_limit_exact_boundary():
    def objects(k: int) -> bytes:  # k nested objects, the innermost empty: depth k
        return b'{"a": ' * (k - 1) + b"{}" + b"}" * (k - 1)

    for n in (1, 5, 32):
        g.check_json(b"[" * n + b"]" * n, max_depth=n)  # depth n is allowed
        g.check_json(objects(n), max_depth=n)
        g.check_json(b"[" * (n - 1) + b"[7]" + b"]" * (n - 1), max_depth=n + 1)  # a number is one level more
        for body in (b"[" * (n + 1) + b"]" * (n + 1), objects(n + 1), b"[" * (n - 1) + b"[7]" + b"]" * (n - 1)):
            with pytest.raises(g._Reject) as info:
                g.check_json(body, max_depth=n)
            assert info.value.status == 400
            assert info.value.message == f"the JSON is nested too deeply (more than {n} levels)"
    assert g.DEFAULT_MAX_DEPTH == 32
    g.check_json(b"[" * 32 + b"]" * 32)
    with pytest.raises(g._Reject):
        g.check_json(b"[" * 33 + b"]" * 33)


def test_integer_digits_exact_boundary():
    assert g.check_json(b'{"n": ' + b"9" * 18 + b"}")["n"] == int("9" * 18)
    assert g.check_json(b'{"n": -' + b"9" * 18 + b"}")["n"] == -int("9" * 18)
    with pytest.raises(g._Reject) as info:
        g.check_json(b'{"n": ' + b"9" * 19 + b"}")
    assert info.value.status == 422 and "19 digits" in info.value.message
    assert g.check_json(b"[1234]", max_int_digits=4) == [1234]
    with pytest.raises(g._Reject):
        g.check_json(b"[12345]", max_int_digits=4)
