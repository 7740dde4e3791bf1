"""Open-loop load for a local *streaming* server: Poisson arrivals, each answer read line by line as it streams.

:func:`open_loop_stream` sends ``n_requests`` POSTs at Poisson-distributed times (``rate`` per second, whatever the
server is doing) and reads every streamed answer line by line, keeping the moment each line arrived, counted
from the moment its request was *due* (so time queued anywhere, client or server, is counted). Lesson 16 computes
from those times what vLLM's benchmark reports: time to first token, inter-token latency, time per output token.
Loopback only (:func:`course_utils.serve.load_generator.check_loopback`), bounded in count and time.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from course_utils.serve.load_generator import check_loopback, run


@dataclass
class StreamedAnswer:
    """One streamed request: when it was due (s after the start), its status, and each line with its arrival.

    ``times_s[i]`` is when line ``i`` arrived, in seconds after ``due_s``; ``error`` names what went wrong (a
    refused connection, the time bound) when the stream did not finish, and also when it finished empty (no
    line) or with a line ``{"error": ...}``: such an answer is a failure, never :attr:`ok`.
    """

    index: int
    due_s: float
    status: int = 0
    lines: list[Any] = field(default_factory=list)
    times_s: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and not self.error


def _line(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


async def _one(client: Any, url: str, body: Any, answer: StreamedAnswer, start: float) -> None:
    import httpx

    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        async with client.stream("POST", url, content=content, headers={"content-type": "application/json"}) as r:
            answer.status = r.status_code
            async for raw in r.aiter_lines():
                if raw.strip():
                    answer.times_s.append(time.perf_counter() - start - answer.due_s)
                    answer.lines.append(_line(raw))
    except httpx.HTTPError as exc:
        answer.error = f"{type(exc).__name__}: {exc}"
        return
    reported = next((x["error"] for x in answer.lines if isinstance(x, dict) and "error" in x), None)
    if reported is not None:  # a stream that ends with the server's error line failed, whatever its status
        answer.error = f"the server reported: {str(reported)[:200]}"
    elif not answer.lines:
        answer.error = f"an empty answer (status {answer.status}): no line streamed"


async def _open(url: str, bodies: Sequence[Any], rate: float, n_requests: int, max_seconds: float,
                max_in_flight: int, timeout: float, seed: int) -> list[StreamedAnswer]:  # fmt: skip
    import httpx

    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n_requests)
    due = np.cumsum(gaps) - gaps[0]  # the first request goes at once
    answers = [StreamedAnswer(i, float(d)) for i, d in enumerate(due) if d <= max_seconds]
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
    async with httpx.AsyncClient(trust_env=False, timeout=timeout, limits=limits) as client:
        start, tasks = time.perf_counter(), []
        for a in answers:
            wait = start + a.due_s - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(_one(client, url, bodies[a.index % len(bodies)], a, start)))
        left = max(0.0, start + max_seconds + timeout - time.perf_counter())
        _, pending = await asyncio.wait(tasks, timeout=left)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for a, t in zip(answers, tasks, strict=True):
        if t in pending:
            a.error = a.error or "cancelled: the load's time bound ran out before the stream ended"
    return answers


def open_loop_stream(
    url: str,
    bodies: Sequence[Any],
    *,
    rate: float,
    n_requests: int,
    max_seconds: float = 60.0,
    max_in_flight: int = 64,
    timeout: float = 60.0,
    seed: int = 0,
) -> list[StreamedAnswer]:
    """Poisson arrivals at ``rate``/s (none due after ``max_seconds``); every streamed answer with its line times.

    Body ``i`` goes with request ``i`` (cycled). Streams still open ``timeout`` seconds after the last arrival are
    cancelled and marked with an ``error``; at most ``max_in_flight`` connections are open at once.
    """
    check_loopback(url)
    if rate <= 0 or n_requests < 1 or not bodies or max_seconds <= 0 or max_in_flight < 1:
        raise ValueError("need rate > 0, n_requests >= 1, at least one body, max_seconds > 0, max_in_flight >= 1")
    return run(_open(url, bodies, rate, n_requests, max_seconds, max_in_flight, timeout, seed))
