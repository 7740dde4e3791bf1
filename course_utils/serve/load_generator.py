"""Load generators for a local server (loopback only, bounded in count and time), and single requests.

* :func:`closed_loop`: ``concurrency`` clients each send a request, wait for the answer, send the next. The
  offered load adapts to the server: when it slows down, clients send less, so the tail is understated.
* :func:`open_loop`: requests arrive as a Poisson process at ``rate`` per second whatever the server does, the
  way independent users arrive; latency counts from the moment a request *should* have been sent, so time
  spent waiting anywhere (client pool, server queue) is in the percentiles.
* :func:`post` and :func:`post_many`: one request, or many over one client with bounded concurrency.

Both generators return a :class:`LoadResult`: counts by status, throughput of good answers, p50/p90/p99.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from course_utils.supply.errors import CourseError

HEADERS = {"content-type": "application/json"}
KEEPALIVE_S = 1.0  # idle pooled connections dropped well before the server's 5 s keep-alive closes them (busy host)


class LoopbackOnlyError(CourseError, ValueError):
    """The load generator was pointed at a host that is not this machine."""


def check_loopback(url: str) -> None:
    """Raise :class:`LoopbackOnlyError` unless ``url`` points at this machine (127.0.0.0/8, ::1, localhost)."""
    host = urlsplit(url).hostname or ""
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise LoopbackOnlyError(
            f"refusing to send load to {host!r}: the course only loads this machine "
            "(use http://127.0.0.1:PORT, e.g. the url of a server from course_utils.serve.server_process.serve)"
        )


def run(coro: Any) -> Any:
    """Run a coroutine to completion, also inside Jupyter (whose event loop is already running)."""
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


def _body(body: bytes | dict | str) -> bytes:
    if isinstance(body, bytes):
        return body
    return body.encode() if isinstance(body, str) else json.dumps(body).encode()


def _decode(r: Any) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text


def post(url: str, body: bytes | dict | str, *, timeout: float = 60.0) -> tuple[int, Any]:
    """POST one request (a dict as JSON, bytes/str as they are); return (status, decoded JSON or text)."""
    import httpx

    check_loopback(url)
    with httpx.Client(trust_env=False, timeout=timeout) as client:
        r = client.post(url, content=_body(body), headers=HEADERS)
    return r.status_code, _decode(r)


def post_many(url: str, bodies: Sequence[bytes | dict | str], *, concurrency: int = 32,
              timeout: float = 60.0) -> list[tuple[int, Any]]:  # fmt: skip
    """Send ``bodies`` over one client, at most ``concurrency`` at a time (connections are reused).

    Returns (status, JSON or text) per body, in order; a request that got no answer has status 0.
    """
    import httpx

    check_loopback(url)

    async def go() -> list[tuple[int, Any]]:
        limits = httpx.Limits(
            max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=KEEPALIVE_S
        )
        gate = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(trust_env=False, timeout=timeout, limits=limits) as client:

            async def one(b: bytes | dict | str) -> tuple[int, Any]:
                async with gate:
                    try:
                        r = await client.post(url, content=_body(b), headers=HEADERS)
                    except httpx.HTTPError as exc:
                        return 0, f"{type(exc).__name__}: {exc}"
                    return r.status_code, _decode(r)

            return list(await asyncio.gather(*(one(b) for b in bodies)))

    return run(go())


@dataclass
class LoadResult:
    """One load test: how it was driven, counts by status, wall time, latencies of good (2xx) answers in ms.

    ``n_cancelled``: requests still unanswered when the time bound ran out (cancelled, neither good nor failed).
    """

    mode: str
    concurrency: int
    rate: float
    n_ok: int
    n_failed: int
    wall_s: float
    latencies_ms: list[float] = field(repr=False)
    statuses: dict[int, int] = field(default_factory=dict)
    n_not_sent: int = 0
    n_cancelled: int = 0

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
        return {"mode": self.mode, "concurrency": self.concurrency, "rate": self.rate, "n_ok": self.n_ok,
                "n_failed": self.n_failed, "n_not_sent": self.n_not_sent, "n_cancelled": self.n_cancelled,
                "wall_s": self.wall_s, "throughput": self.throughput, "p50_ms": self.p50_ms, "p90_ms": self.p90_ms,
                "p99_ms": self.p99_ms}  # fmt: skip


DRAIN_S = 2.0  # after max_seconds, requests in flight get this long to finish before they are cancelled


def _check(url: str, bodies: Sequence[Any], n_requests: int, max_seconds: float) -> None:
    check_loopback(url)
    if n_requests < 1 or not bodies or max_seconds <= 0:
        raise ValueError("need n_requests >= 1, at least one body and max_seconds > 0")


class _Deadline:
    """The time bound of one load test: per-request timeouts shrink to what is left of it."""

    def __init__(self, seconds: float, timeout: float) -> None:
        self.end, self.timeout = time.perf_counter() + seconds, timeout

    def left(self) -> float:
        return self.end - time.perf_counter()

    def request_timeout(self) -> float:
        return max(0.001, min(self.timeout, self.left()))


async def _send(client: Any, url: str, body: Any, deadline: _Deadline) -> int:
    """POST ``body`` within what is left of the deadline; the HTTP status, or 0 when no answer came."""
    import httpx

    try:
        r = await client.post(url, content=_body(body), headers=HEADERS, timeout=deadline.request_timeout())
    except httpx.HTTPError:
        return 0
    return r.status_code


async def _bounded(tasks: list[asyncio.Task], deadline: _Deadline) -> int:
    """Wait for ``tasks`` until the deadline; cancel the rest and return how many were cancelled."""
    if not tasks:
        return 0
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline.left()))
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return len(pending)


async def _closed(url: str, bodies: Sequence[Any], n_requests: int, concurrency: int, max_seconds: float,
                  warmup: int, timeout: float) -> LoadResult:  # fmt: skip
    import httpx

    limits = httpx.Limits(
        max_connections=concurrency, max_keepalive_connections=concurrency, keepalive_expiry=KEEPALIVE_S
    )
    deadline = _Deadline(max_seconds + DRAIN_S, timeout)  # the whole call, warm-up included, ends by then
    async with httpx.AsyncClient(trust_env=False, timeout=timeout, limits=limits) as client:
        for i in range(warmup):
            if deadline.left() <= DRAIN_S:
                break
            await _send(client, url, bodies[i % len(bodies)], deadline)
        lat: list[float] = []
        statuses: dict[int, int] = {}
        counter, start = 0, time.perf_counter()
        stop_at = min(max_seconds, deadline.left() - DRAIN_S)

        async def worker() -> None:
            nonlocal counter
            while counter < n_requests and time.perf_counter() - start < stop_at:
                i, counter = counter, counter + 1
                t0 = time.perf_counter()
                code = await _send(client, url, bodies[i % len(bodies)], deadline)
                statuses[code] = statuses.get(code, 0) + 1
                if 200 <= code < 300:
                    lat.append((time.perf_counter() - t0) * 1000)

        tasks = [asyncio.create_task(worker()) for _ in range(min(concurrency, n_requests))]
        cancelled = await _bounded(tasks, deadline)
        wall = time.perf_counter() - start
    return LoadResult("closed", concurrency, float("nan"), len(lat), sum(statuses.values()) - len(lat), wall, lat,
                      statuses, 0, cancelled)  # fmt: skip


def closed_loop(url: str, bodies: Sequence[Any], *, n_requests: int, concurrency: int, max_seconds: float = 30.0,
                warmup: int = 0, timeout: float = 60.0) -> LoadResult:  # fmt: skip
    """Closed-loop load: ``concurrency`` clients in a send-wait-send loop, ``n_requests`` or ``max_seconds``.

    The bound holds against a server that never answers: no request starts after ``max_seconds`` (warm-up
    included), per-request timeouts shrink to the time left, and requests still in flight
    :data:`DRAIN_S` seconds later are cancelled (counted in ``n_cancelled``).
    """
    _check(url, bodies, n_requests, max_seconds)
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    return run(_closed(url, bodies, n_requests, concurrency, max_seconds, warmup, timeout))


async def _open(url: str, bodies: Sequence[Any], rate: float, n_requests: int, max_seconds: float,
                max_in_flight: int, timeout: float, seed: int) -> LoadResult:  # fmt: skip
    import httpx

    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n_requests)
    due = np.cumsum(gaps) - gaps[0]  # the first request goes at once
    limits = httpx.Limits(
        max_connections=max_in_flight, max_keepalive_connections=max_in_flight, keepalive_expiry=KEEPALIVE_S
    )
    lat: list[float] = []
    statuses: dict[int, int] = {}
    in_flight, not_sent = 0, 0
    async with httpx.AsyncClient(trust_env=False, timeout=timeout, limits=limits) as client:
        start = time.perf_counter()
        deadline = _Deadline(max_seconds + DRAIN_S, timeout)

        async def one(i: int) -> None:
            nonlocal in_flight
            try:
                code = await _send(client, url, bodies[i % len(bodies)], deadline)
            finally:
                in_flight -= 1
            statuses[code] = statuses.get(code, 0) + 1
            if 200 <= code < 300:
                lat.append((time.perf_counter() - start - due[i]) * 1000)  # from when it was due, not sent

        tasks = []
        for i in range(n_requests):
            wait = start + due[i] - time.perf_counter()
            if due[i] > max_seconds:
                break
            if wait > 0:
                await asyncio.sleep(wait)
            if in_flight >= max_in_flight:  # bounded: the client refuses rather than piling up sockets
                not_sent += 1
                continue
            in_flight += 1
            tasks.append(asyncio.create_task(one(i)))
        cancelled = await _bounded(tasks, deadline)
        wall = time.perf_counter() - start
    n_ok = len(lat)
    return LoadResult("open", max_in_flight, rate, n_ok, sum(statuses.values()) - n_ok, wall, lat, statuses, not_sent,
                      cancelled)  # fmt: skip


def open_loop(url: str, bodies: Sequence[Any], *, rate: float, n_requests: int, max_seconds: float = 30.0,
              max_in_flight: int = 128, timeout: float = 60.0, seed: int = 0) -> LoadResult:  # fmt: skip
    """Open-loop (Poisson) load at ``rate`` requests/s: ``n_requests`` arrivals, none due after ``max_seconds``.

    At most ``max_in_flight`` requests are outstanding; an arrival beyond that is counted in ``n_not_sent``
    (the server could not keep up). Latency is measured from each request's due time. Requests still in flight
    :data:`DRAIN_S` seconds after ``max_seconds`` are cancelled (``n_cancelled``): the bound holds against a
    server that never answers.
    """
    _check(url, bodies, n_requests, max_seconds)
    if rate <= 0 or max_in_flight < 1:
        raise ValueError("rate must be > 0 and max_in_flight >= 1")
    return run(_open(url, bodies, rate, n_requests, max_seconds, max_in_flight, timeout, seed))
