"""Lesson 03 exercises: the out-of-memory-surviving batch sweep; tune a dynamic batcher's max_wait_ms.

``03.oom-sweep`` runs the learner's sweep on a model that runs out of memory at a batch size drawn at random:
the failed batch is tracked by weak reference, ``torch.cuda.empty_cache`` is replaced by a recorder that notes
whether an exception was still being handled and whether the failed batch was already freed, the model notes
whether it ran under ``torch.inference_mode``, and the timing function returns values the checker knows.
``03.max-wait`` draws its service times, arrival rates and targets at random per call.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from course_utils.check.exercises import exercise
from course_utils.check.lesson_exercises.observe import Cases, cases

CANDIDATES = [0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0]


# ---- 03.oom-sweep -----------------------------------------------------------------------------------------------
class _Planted:
    """A small model that runs out of memory from batch ``limit`` on, after allocating activations (as a real
    out-of-memory does: the traceback then holds the batch and what was computed from it)."""

    def __init__(self, c: Cases, limit: int | None, features: int) -> None:
        self.limit, self.features = limit, features
        self.weight = c.randn(features, 4)
        self.calls: list[tuple[int, bool]] = []  # (batch, inference mode on)
        self.failed: list[weakref.ref] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        b = int(x.shape[0])
        self.calls.append((b, torch.is_inference_mode_enabled()))
        act = x @ self.weight  # an activation of the batch
        if self.limit is not None and b >= self.limit:
            self.failed += [weakref.ref(x), weakref.ref(act)]
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {b * 2:.2f} GiB (planted by the checker at batch {b})"
            )
        return act.relu()


def _run_sweep(fn: Callable[..., Any], c: Cases, limit_index: int | None) -> None:
    first = c.randint(0, 2)
    sizes = [2**k for k in range(first, first + c.randint(4, 7))]
    limit = None if limit_index is None else sizes[limit_index]
    model = _Planted(c, limit, features=c.randint(8, 24))
    freed: list[tuple[bool, bool]] = []  # per empty_cache call: (inside an except block, failed batch still alive)
    ms_of = {b: round(0.5 + 0.37 * b + c.rng.random(), 4) for b in sizes}  # what the timing function reports
    timed: list[int] = []

    def make_input(b: int) -> torch.Tensor:
        return torch.randn(b, model.features)

    def measure(call: Callable[[], Any]) -> float:
        before = len(model.calls)
        call()
        assert len(model.calls) > before, "measure(f) was given a function that does not call the model"
        b = model.calls[-1][0]
        timed.append(b)
        return ms_of[b]

    def recorder() -> None:
        alive = any(r() is not None for r in model.failed)
        freed.append((sys.exc_info()[0] is not None, alive))

    real = torch.cuda.empty_cache
    torch.cuda.empty_cache = recorder
    try:
        try:
            rows = fn(model, make_input, list(sizes), measure)
        except torch.OutOfMemoryError as exc:
            raise AssertionError(
                f"the out-of-memory at batch {limit} escaped your sweep ({exc}): catch torch.OutOfMemoryError around "
                "each batch, stop the sweep there and return the rows measured so far"
            ) from None
    finally:
        torch.cuda.empty_cache = real
    where = f"batch sizes {sizes}, out of memory from batch {limit}" if limit else f"batch sizes {sizes}, no OOM"
    assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows), (
        f"{where}: return a list of dicts, one per batch size that ran: {{'batch_size': b, 'ms': measure(...)}}"
    )
    fit = sizes if limit is None else [b for b in sizes if b < limit]
    got = [r.get("batch_size") for r in rows]
    assert got == fit, (
        f"{where}: your rows are for batches {got}, expected {fit}: one row per batch size that fit, in order, "
        "and none for the batch that ran out of memory"
    )
    for r in rows:
        want = ms_of[r["batch_size"]]
        assert r.get("ms") == want, (
            f"{where}: batch {r['batch_size']}: ms={r.get('ms')!r}, but measure() reported {want}: put the value "
            "measure(lambda x=x: model(x)) returns in the row"
        )
    off = sorted({b for b, inference in model.calls if not inference})
    assert not off, (
        f"{where}: the model ran outside torch.inference_mode() at batches {off} (torch.no_grad() is not "
        "inference_mode): wrap the whole sweep in `with torch.inference_mode():`"
    )
    later = sorted({b for b, _ in model.calls if limit is not None and b > limit})
    assert not later, (
        f"{where}: after the out-of-memory at batch {limit} the sweep went on to {later}: stop at the first "
        "out-of-memory (a larger batch needs even more memory)"
    )
    if limit is None:
        return
    assert freed, (
        f"{where}: after the out-of-memory nothing called torch.cuda.empty_cache(): free the cached blocks (after "
        "leaving the except block) so the rest of the notebook has memory"
    )
    assert not any(inside for inside, _ in freed), (
        f"{where}: torch.cuda.empty_cache() ran inside the except block, where the exception's traceback still "
        "holds the failed batch and its activations, so nothing is freed. Note the OOM in the except block, "
        "leave it, then drop the batch (x = None), gc.collect() and torch.cuda.empty_cache()"
    )
    assert not freed[-1][1], (
        f"{where}: when torch.cuda.empty_cache() ran, the failed batch was still referenced (your `x`, the "
        "exception kept in a variable, or a lambda holding x): set x = None (and drop the exception) before "
        "gc.collect() and torch.cuda.empty_cache()"
    )


def _check_oom_sweep(fn: Callable[..., list[dict[str, Any]]]) -> None:
    with cases("03.oom-sweep") as c:
        for limit_index in [c.randint(1, 3), 0, None]:  # OOM part-way (random), on the first batch, never
            _run_sweep(fn, c, limit_index)
            gc.collect()


@exercise(
    "03.oom-sweep",
    "oom_safe_sweep(model, make_input, batch_sizes, measure) -> [{'batch_size': b, 'ms': measure(...)}...]: under "
    "inference_mode; stop at torch.OutOfMemoryError keeping the rows; free (x = None, gc.collect(), "
    "torch.cuda.empty_cache()) after leaving the except block.",
    _check_oom_sweep,
    time_limit=30,
)
def oom_safe_sweep(
    model: Callable[[torch.Tensor], Any],
    make_input: Callable[[int], torch.Tensor],
    batch_sizes: list[int],
    measure: Callable[[Callable[[], Any]], float],
) -> list[dict[str, Any]]:
    rows, x, out_of_memory = [], None, False
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                ms = measure(lambda x=x: model(x))
            except torch.OutOfMemoryError:
                out_of_memory = True  # only note it: the traceback still holds the batch here
            if out_of_memory:
                break
            rows.append({"batch_size": b, "ms": ms})
    if out_of_memory:  # outside the except block: the traceback is gone
        x = None
        gc.collect()
        torch.cuda.empty_cache()
    return rows


# ---- 03.max-wait ------------------------------------------------------------------------------------------------
def _service(fixed_ms: float, per_item_ms: float) -> Callable[[int], float]:
    def service_ms(b: int) -> float:
        return fixed_ms + per_item_ms * b

    return service_ms


def _p99(arrivals: np.ndarray, service: Callable[[int], float], b: int, wait: float) -> float:
    from course_utils.techniques.batching_sim import simulate

    return simulate(arrivals, service, max_batch_size=b, max_wait_ms=wait).p99_ms


def _check_max_wait(fn: Callable[..., float | None]) -> None:
    from course_utils.techniques.batching_sim import poisson_arrivals

    with cases("03.max-wait") as c:
        found = 0
        for _ in range(12):
            if found == 3:
                break
            fixed, per_item = round(c.rng.uniform(1.0, 12.0), 2), round(c.rng.uniform(0.1, 1.2), 2)
            b = c.choice([8, 16, 32])
            rate = round(c.rng.uniform(0.3, 0.8) * 1000 * b / (fixed + per_item * b), 1)  # below capacity
            service = _service(fixed, per_item)
            arrivals = poisson_arrivals(rate, 2000, seed=c.randint(0, 10_000))
            p99 = {w: _p99(arrivals, service, b, w) for w in CANDIDATES}
            k = c.randint(1, len(CANDIDATES) - 2)
            target = p99[CANDIDATES[k]] * 1.0001
            want = max(w for w in CANDIDATES if p99[w] <= target)
            if want == min(w for w in CANDIDATES if p99[w] <= target):
                continue  # one candidate meets it: a case that cannot tell largest from smallest
            found += 1
            got = fn(arrivals, service, b, target, list(CANDIDATES))
            where = f"service {fixed} + {per_item}*b ms, {rate:g} req/s, max batch {b}, p99 target {target:.2f} ms"
            assert got is not None, f"{where}: some candidates meet the target, you returned None"
            assert got in CANDIDATES, f"{where}: return one of the candidates (a max_wait_ms), got {got!r}"
            assert p99[got] <= target, (
                f"{where}: max_wait_ms={got} gives p99 {p99[got]:.2f} ms, over the target: simulate each candidate"
            )
            assert got == want, (
                f"{where}: {got} meets the target, but a larger wait, {want}, does too (p99 {p99[want]:.2f} ms): "
                "return the largest candidate that meets it (fuller batches)"
            )
        fixed = round(c.rng.uniform(30.0, 60.0), 1)
        service = _service(fixed, 1.0)
        arrivals = poisson_arrivals(5.0, 300, seed=c.randint(0, 10_000))
        target = round(fixed / c.randint(3, 6), 1)
        got = fn(arrivals, service, 8, target, list(CANDIDATES))
        assert got is None, (
            f"a {target} ms p99 target cannot be met when one batch takes at least {fixed + 1:.0f} ms: return None, "
            f"not {got!r}"
        )


@exercise(
    "03.max-wait",
    "Simulate each candidate max_wait_ms (cu.batching_sim.simulate) and return the largest whose p99 meets the target, "
    "or None.",
    _check_max_wait,
    time_limit=60,
)
def choose_max_wait(
    arrivals_ms: np.ndarray,
    service_ms: Callable[[int], float],
    max_batch_size: int,
    p99_target_ms: float,
    candidates: list[float],
) -> float | None:
    from course_utils.techniques.batching_sim import simulate

    ok = [
        w
        for w in candidates
        if simulate(arrivals_ms, service_ms, max_batch_size=max_batch_size, max_wait_ms=w).p99_ms <= p99_target_ms
    ]
    return max(ok) if ok else None
