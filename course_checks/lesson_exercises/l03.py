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

from course_checks.exercises import exercise, observed
from course_checks.lesson_exercises.observe import Cases, cases, gpu
from fakegpu.standins.rehearsal import RehearsalError

# no candidate but 0 is a whole number below 7: an index into the list returned instead of a wait is no candidate
CANDIDATES = [0.0, 0.5, 1.5, 3.5, 7.5, 20.0, 40.0]


# ---- 03.oom-sweep -----------------------------------------------------------------------------------------------
class _Planted:
    """A small model that runs out of memory from batch ``limit`` on, after allocating activations (as a real
    out-of-memory does: the traceback then holds the batch and what was computed from it); or, with ``bug``,
    raises an ordinary RuntimeError at that batch (a bug, which a sweep must not mistake for out-of-memory)."""

    def __init__(self, c: Cases, limit: int | None, features: int, device: str, bug: bool = False) -> None:
        self.limit, self.features, self.bug = limit, features, bug
        self.weight = c.randn(features, 4).to(device)
        self.calls: list[tuple[int, bool]] = []  # (batch, inference mode on)
        self.failed: list[weakref.ref] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        b = int(x.shape[0])
        self.calls.append((b, torch.is_inference_mode_enabled()))
        act = x @ self.weight  # an activation of the batch
        if self.limit is not None and b >= self.limit:
            if self.bug:
                raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({b}x{self.features + 1} and "
                                   f"{self.features}x4) (planted by the checker at batch {b})")  # fmt: skip
            self.failed += [weakref.ref(x), weakref.ref(act)]
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {b * 2:.2f} GiB (planted by the checker at batch {b})"
            )
        return act.relu()


def draw_sweeps(c: Cases) -> list[tuple[list[int], int | None, bool]]:
    """The sweeps of one check, each (batch sizes, index of the failing batch or None, a bug instead of an OOM):
    an out-of-memory part-way, one on the first batch, none at all, and a planted RuntimeError that is no OOM."""
    runs = []
    for limit_index, bug in [(c.randint(1, 3), False), (0, False), (None, False), (c.randint(1, 3), True)]:
        first = c.randint(0, 2)
        runs.append(([2**k for k in range(first, first + c.randint(4, 7))], limit_index, bug))
    c.rng.shuffle(runs)
    return runs


def _run_sweep(fn: Callable[..., Any], c: Cases, sizes: list[int], limit_index: int | None, bug: bool,
               device: str) -> str:  # fmt: skip
    limit = None if limit_index is None else sizes[limit_index]
    model = _Planted(c, limit, features=c.randint(8, 24), device=device, bug=bug)
    freed: list[tuple[bool, bool]] = []  # per empty_cache call: (inside an except block, failed batch still alive)
    ms_of = {b: round(0.5 + 0.37 * b + c.rng.random(), 4) for b in sizes}  # what the timing function reports
    timed: list[int] = []
    built = [0]  # how many inputs make_input has built
    built_inside: list[int] = []  # the batches whose input was built inside the timed call

    def make_input(b: int) -> torch.Tensor:
        built[0] += 1
        return torch.randn(b, model.features, device=device)

    def measure(call: Callable[[], Any]) -> float:
        assert callable(call), (
            f"measure() was given {type(call).__name__}, not a function: the model already ran before measure "
            "could time it. Give it the call to time: measure(lambda x=x: model(x))"
        )
        before, made = len(model.calls), built[0]
        call()
        assert len(model.calls) > before, "measure(f) was given a function that does not call the model"
        b = model.calls[-1][0]
        if built[0] > made:
            built_inside.append(b)
        timed.append(b)
        return ms_of[b]

    def recorder() -> None:
        alive = any(r() is not None for r in model.failed)
        freed.append((sys.exc_info()[0] is not None, alive))

    real, real_memory = torch.cuda.empty_cache, torch.cuda.memory.empty_cache  # (the stand-in GPU replaces the first)
    # the same function under the names a sweep may call it by: torch.cuda.memory.empty_cache, or a name imported
    # with `from torch.cuda import empty_cache` into the sweep's module
    scope = getattr(fn, "__globals__", {})
    imported = {
        name: value
        for name, value in list(scope.items())
        if (value is real or value is real_memory) and not name.startswith("__")
    }
    torch.cuda.empty_cache = torch.cuda.memory.empty_cache = recorder
    scope.update(dict.fromkeys(imported, recorder))
    failure = f"a RuntimeError (no OOM) at batch {limit}" if bug else f"out of memory from batch {limit}"
    where = f"batch sizes {sizes} on {device}, " + ("no OOM" if limit is None else failure)
    try:
        try:
            rows = fn(model, make_input, list(sizes), measure)
        except torch.OutOfMemoryError as exc:
            raise AssertionError(
                f"the out-of-memory at batch {limit} escaped your sweep ({exc}): catch torch.OutOfMemoryError around "
                "each batch, stop the sweep there and return the rows measured so far"
            ) from None
        except RehearsalError as exc:  # a CUDA rule the stand-in GPU enforces, broken by the sweep
            raise AssertionError(f"{where}: on the GPU your sweep broke a CUDA rule: {exc}") from None
        except RuntimeError as exc:
            if bug and "planted by the checker" in str(exc):
                return "a planted RuntimeError (no OOM) propagated"
            raise
    finally:
        torch.cuda.empty_cache, torch.cuda.memory.empty_cache = real, real_memory
        scope.update(imported)
    if bug:
        raise AssertionError(
            f"{where}: your sweep caught the RuntimeError raised at batch {limit} (a bug: wrong shapes, not memory) "
            "and went on as if the batch had not fit. Catch only torch.OutOfMemoryError (not Exception, not "
            "RuntimeError, of which it is a subclass): any other error must reach the caller"
        )
    assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows), (
        f"{where}: return a list of dicts, one per batch size that ran: {{'batch_size': b, 'ms': measure(...)}}"
    )
    fit = sizes if limit is None else [b for b in sizes if b < limit]
    keyless = [sorted(r) for r in rows if "batch_size" not in r or "ms" not in r]
    assert not keyless, (
        f"{where}: a row has the keys {keyless[0]}: each row is {{'batch_size': b, 'ms': measure(...)}}, these two keys"
    )
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
    assert not built_inside, (
        f"{where}: the input of batch {built_inside[0]} was built inside the timed call (make_input(b) inside the "
        "function given to measure), so its ms include making the batch (a host-to-device copy on the GPU), not only "
        "the model: build it first, x = make_input(b), then time measure(lambda x=x: model(x))"
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
        return f"no OOM: {len(rows)} rows"
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
    return f"OOM at batch {limit}: {len(rows)} rows kept, empty_cache after the except block with the batch freed"


def run_sweeps(fn: Callable[..., Any], c: Cases, device: str) -> list[str]:
    """The four sweeps a check draws from ``c``, each run and judged on ``device`` (the check's device is the GPU or
    its stand-in; the judgment reads the rows, the model's calls and empty_cache's calls, so the tests run this
    over many seeds without a check's set-up, the wrong sweeps on the CPU)."""
    return [_run_sweep(fn, c, sizes, limit_index, bug, device) for sizes, limit_index, bug in draw_sweeps(c)]


def _check_oom_sweep(fn: Callable[..., list[dict[str, Any]]]) -> None:
    with cases("03.oom-sweep") as c, gpu() as device:
        seen = run_sweeps(fn, c, device)
        available = torch.cuda.is_available()
    observed(f"4 sweeps with inputs on {device} (torch.cuda.is_available() {available}) under inference_mode: "
             + "; ".join(seen))  # fmt: skip


@exercise(
    "03.oom-sweep",
    "oom_safe_sweep(model, make_input, batch_sizes, measure) -> [{'batch_size': b, 'ms': measure(...)}...]: under "
    "inference_mode; stop at torch.OutOfMemoryError keeping the rows (any other error propagates); free (x = None, "
    "gc.collect(), torch.cuda.empty_cache()) after leaving the except block.",
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


def _p99_p95(arrivals: np.ndarray, service: Callable[[int], float], b: int, wait: float) -> tuple[float, float]:
    from course_utils.techniques.batching_sim import simulate

    r = simulate(arrivals, service, max_batch_size=b, max_wait_ms=wait)
    return r.p99_ms, float(np.percentile(r.latencies_ms, 95))


def pick_target(c: Cases, p99: dict[float, float], exact: bool = False, gap: bool = False,
                lower: dict[float, float] | None = None) -> tuple[float, float] | None:  # fmt: skip
    """A p99 target exactly equal to one candidate's p99 ("meets" means <=, so a strict < is seen), chosen so that
    two or more candidates meet it (the largest and the smallest differ); and the largest that does. With
    ``exact``, only a candidate that is itself the largest to meet its p99 and that another beats (a strict <
    then returns another wait). With ``gap``, only a target that a smaller wait misses and a larger one meets
    (p99 does not always grow with the wait: a search that stops at the first miss returns too small a wait or
    None). With ``lower`` (each candidate's p95), only a target that a larger wait than the answer meets by its
    p95 (a p95, p50 or mean compared with the target returns a wait whose p99 misses it). None when no such target
    exists for these p99s."""

    def fits(w: float) -> bool:
        meet = [v for v in CANDIDATES if p99[v] <= p99[w]]
        if gap and not any(p99[v] > p99[w] for v in CANDIDATES if v < max(meet)):
            return False
        if lower is not None and not any(lower[v] <= p99[w] for v in CANDIDATES if v > max(meet)):
            return False
        return len(meet) >= 2 and (not exact or (max(meet) == w and any(p99[v] < p99[w] for v in meet)))

    options = [w for w in CANDIDATES[1:-1] if fits(w)]
    if not options:
        return None
    target = p99[c.choice(options)]
    return target, max(w for w in CANDIDATES if p99[w] <= target)


def judge_wait(got: Any, p99: dict[float, float], target: float, want: float, where: str) -> None:
    """The answer against the simulated p99 of every candidate (``want``: the largest that meets the target)."""
    first_miss = next((v for v in CANDIDATES if p99[v] > target), None)
    assert got is not None, (
        f"{where}: some candidates meet the target ({', '.join(str(v) for v in CANDIDATES if p99[v] <= target)}), "
        "you returned None"
        + (f": {first_miss} misses it, larger waits do not (p99 does not always grow with the wait): simulate every "
           "candidate rather than stop at the first that misses"
           if first_miss is not None and first_miss < want else "")
    )  # fmt: skip
    match = [w for w in CANDIDATES if _same_number(got, w)]
    assert match, f"{where}: return one of the candidates (a max_wait_ms), got {got!r}" + (
        f": that is an index into candidates; return candidates[{got}], the wait itself"
        if isinstance(got, int | np.integer) and not isinstance(got, bool) and 0 <= got < len(CANDIDATES)
        else ""
    )
    w = match[0]
    assert p99[w] <= target, (
        f"{where}: max_wait_ms={w} gives p99 {p99[w]:.2f} ms, over the target: simulate each candidate (max_wait_ms "
        "in milliseconds) and compare its p99 with the target: result.p99_ms, np.percentile(latencies, 99), not the "
        "p50, p95 or mean, nor np.percentile(latencies, 0.99) (a percent, 0 to 100)"
    )
    if w != want:
        missed = [v for v in CANDIDATES if w < v < want and p99[v] > target]
        # the wait right after yours misses: a search that stopped there; and/or a strict < at an exact p99
        after = [v for v in CANDIDATES if v > w]
        missed = missed if missed and missed[0] == after[0] else []
        exact = [v for v in CANDIDATES if p99[v] == target and v > w]
        raise AssertionError(
            f"{where}: {w} meets the target, but a larger wait, {want}, does too (p99 {p99[want]:.2f} ms"
            + (f"; {exact[0]} gives p99 exactly the target, and meeting it means p99 <= target, not <" if exact else "")
            + (f"; {missed[0]} misses it in between: p99 does not always grow with the wait, so simulate every "
               "candidate rather than stop at the first that misses" if missed else "")
            + "): return the largest candidate that meets it (fuller batches)"
        )  # fmt: skip


def _same_number(got: Any, w: float) -> bool:
    try:
        return not isinstance(got, bool) and float(got) == w
    except (TypeError, ValueError):
        return False


def _check_max_wait(fn: Callable[..., float | None]) -> None:
    from course_utils.techniques.batching_sim import poisson_arrivals

    with cases("03.max-wait") as c:
        seen = []
        sizes = [8, 16, 32]  # each server its own max batch size: a batch size typed in is wrong on two of them
        c.rng.shuffle(sizes)
        for _ in range(16):
            if len(seen) == 3:
                break
            fixed, per_item = round(c.rng.uniform(1.0, 12.0), 2), round(c.rng.uniform(0.1, 1.2), 2)
            b = sizes[len(seen)]
            rate = round(c.rng.uniform(0.3, 0.8) * 1000 * b / (fixed + per_item * b), 1)  # below capacity
            service = _service(fixed, per_item)
            arrivals = poisson_arrivals(rate, 800, seed=c.randint(0, 10_000))
            sims = {w: _p99_p95(arrivals, service, b, w) for w in CANDIDATES}
            p99, p95 = {w: v[0] for w, v in sims.items()}, {w: v[1] for w, v in sims.items()}
            # the first server's target is the p99 of the wait to return (a strict < misses it on every check),
            # the second's is one that a smaller wait misses (a search stopping at the first miss fails it) and the
            # third's one that a larger wait meets by its p95 (another percentile than p99 fails it)
            picked = pick_target(c, p99, exact=not seen, gap=len(seen) == 1, lower=p95 if len(seen) == 2 else None)
            if picked is None:
                continue  # no target that two candidates meet: a case that cannot tell largest from smallest
            target, want = picked
            got = fn(arrivals, service, b, target, list(CANDIDATES))
            where = f"service {fixed} + {per_item}*b ms, {rate:g} req/s, max batch {b}, p99 target {target:.4f} ms"
            judge_wait(got, p99, target, want, where)
            seen.append(f"{want} ms of {sum(p99[w] <= target for w in CANDIDATES)} meeting a {target:.2f} ms target")
        fixed = round(c.rng.uniform(30.0, 60.0), 1)
        service = _service(fixed, 1.0)
        arrivals = poisson_arrivals(5.0, 300, seed=c.randint(0, 10_000))
        target = round(fixed / c.randint(3, 6), 1)
        got = fn(arrivals, service, 8, target, list(CANDIDATES))
        assert got is None, (
            f"a {target} ms p99 target cannot be met when one batch takes at least {fixed + 1:.0f} ms: return None, "
            f"not {got!r}"
        )
    observed(f"{len(seen)} simulated servers, each with a target equal to one candidate's p99: you chose the largest "
             f"wait that meets it ({'; '.join(seen)}); None for a target no candidate meets")  # fmt: skip


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
