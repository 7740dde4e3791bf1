"""Lesson 13 exercises: where batching starts to pay, HTTP overhead per request, Triton preferred sizes."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from ..exercises import exercise


def _check_pays_at(fn: Callable[[pd.DataFrame], int | None]) -> None:
    df = pd.DataFrame({
        "server": ["none"] * 4 + ["batched"] * 4,
        "concurrency": [1, 4, 16, 64] * 2,
        "throughput": [100, 150, 160, 160, 60, 140, 250, 320],
    })  # fmt: skip
    assert fn(df) == 16, "batched beats none first at concurrency 16 (250 > 160); at 4 it is still slower (140 < 150)"
    never = df.assign(throughput=[100, 150, 160, 160, 60, 100, 150, 150])
    assert fn(never) is None, "when batched never beats none, return None"
    shuffled = df.sample(frac=1.0, random_state=0)
    assert fn(shuffled) == 16, "sort by concurrency: the rows may come in any order"


@exercise(
    "13.pays-at",
    "Given a table with columns server ('none' or 'batched'), concurrency and throughput, return the smallest "
    "concurrency at which the batched server's throughput is higher than the unbatched one's (None if never).",
    _check_pays_at,
)
def batching_pays_at(df: pd.DataFrame) -> int | None:
    a = df[df["server"] == "batched"].set_index("concurrency")["throughput"]
    b = df[df["server"] == "none"].set_index("concurrency")["throughput"]
    for c in sorted(set(a.index) & set(b.index)):
        if a[c] > b[c]:
            return int(c)
    return None


def _check_overhead(fn: Callable[[float, float], float]) -> None:
    got = fn(200.0, 1.5)
    assert abs(got - 3.5) < 1e-9, (
        f"200 requests/s one at a time is 5 ms each; minus 1.5 ms of model time is 3.5 ms, got {got}"
    )
    assert abs(fn(50.0, 20.0)) < 1e-9, "50 requests/s with a 20 ms model leaves no overhead"
    assert fn(1000.0, 0.2) > 0


@exercise(
    "13.overhead",
    "At concurrency 1 a server answered `throughput` requests per second; the model alone takes `model_ms` per "
    "item. Return the milliseconds per request spent outside the model (HTTP, JSON, queues, client).",
    _check_overhead,
)
def overhead_ms(throughput: float, model_ms: float) -> float:
    return 1000.0 / throughput - model_ms


def _check_preferred(fn: Callable[[int], list[int]]) -> None:
    for max_bs in (1, 6, 8, 32, 100):
        sizes = fn(max_bs)
        assert sizes, f"give at least one preferred size for max_batch_size={max_bs}"
        assert sizes == sorted(set(sizes)), f"sizes must be increasing without repeats, got {sizes}"
        assert all(1 <= s <= max_bs for s in sizes), f"every size must be in 1..{max_bs}, got {sizes}"
        assert all(s & (s - 1) == 0 for s in sizes), f"use powers of two, got {sizes}"
        assert len(sizes) <= 3, f"at most three sizes, got {sizes}"
    assert fn(32) == [8, 16, 32] and fn(6) == [1, 2, 4], "the three largest powers of two not above the maximum"


@exercise(
    "13.preferred",
    "Return Triton's preferred_batch_size list for a given max_batch_size: the (up to) three largest powers of two "
    "that do not exceed it, increasing.",
    _check_preferred,
)
def preferred_sizes(max_batch_size: int) -> list[int]:
    sizes = []
    p = 1
    while p <= max_batch_size:
        sizes.append(p)
        p *= 2
    return sizes[-3:]
