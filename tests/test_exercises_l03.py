"""Lesson 03's exercises: the OOM-surviving sweep rejects sweeps that crash, lose rows, free memory where the
traceback still holds the failed batch or run outside inference_mode; max_wait_ms rejects wrong tuning rules."""

import gc
import re
import sys

import pytest
import torch
from torch.cuda import empty_cache  # a sweep below frees memory through this imported name

from course_checks import exercises
from course_utils.techniques.batching_sim import simulate

CHECK = exercises.get("03.max-wait").checker


def p99(arrivals, service, b, w):
    return simulate(arrivals, service, max_batch_size=b, max_wait_ms=w).p99_ms


def always_zero(arrivals, service, b, target, candidates):
    return 0.0


def always_largest(arrivals, service, b, target, candidates):
    return max(candidates)


def smallest_that_meets(arrivals, service, b, target, candidates):
    ok = [w for w in candidates if p99(arrivals, service, b, w) <= target]
    return min(ok) if ok else None


def lowest_p99(arrivals, service, b, target, candidates):
    return min(candidates, key=lambda w: p99(arrivals, service, b, w))


def never_none(arrivals, service, b, target, candidates):
    ok = [w for w in candidates if p99(arrivals, service, b, w) <= target]
    return max(ok) if ok else min(candidates)


def returns_p99(arrivals, service, b, target, candidates):
    ok = [p99(arrivals, service, b, w) for w in candidates]
    return max(p for p in ok if p <= target)


def strictly_below(arrivals, service, b, target, candidates):  # "meets" read as p99 < target
    ok = [w for w in candidates if p99(arrivals, service, b, w) < target]
    return max(ok) if ok else None


def stops_at_first_miss(arrivals, service, b, target, candidates):  # assumes p99 grows with the wait
    best = None
    for w in sorted(candidates):
        if p99(arrivals, service, b, w) > target:
            break
        best = w
    return best


def p95_for_p99(arrivals, service, b, target, candidates):  # the wrong percentile: the p95 held to the p99 target
    import numpy as np

    ok = [
        w
        for w in candidates
        if np.percentile(simulate(arrivals, service, max_batch_size=b, max_wait_ms=w).latencies_ms, 95) <= target
    ]
    return max(ok) if ok else None


def index_of_wait(arrivals, service, b, target, candidates):  # the position in candidates, not the wait
    ok = [i for i, w in enumerate(candidates) if p99(arrivals, service, b, w) <= target]
    return max(ok) if ok else None


def numpy_answer(arrivals, service, b, target, candidates):  # right: a numpy float
    import numpy as np

    ok = np.array([w for w in candidates if p99(arrivals, service, b, w) <= target])
    return ok.max() if ok.size else None


WRONG_RULES = [
    (always_zero, "larger wait|over the target"),  # 0 ms may already miss the target
    (always_largest, "over the target"),
    (smallest_that_meets, "larger wait"),
    (lowest_p99, "larger wait"),
    (never_none, "return None"),
    (returns_p99, "one of the candidates"),
    (strictly_below, "meeting it means p99 <= target, not <"),
    (stops_at_first_miss, "rather than stop at the first that misses"),
    (p95_for_p99, "over the target: simulate each candidate .* not the p50, p95 or mean"),
    (index_of_wait, r"that is an index into candidates; return candidates\[\d\]"),
]


@pytest.mark.parametrize("wrong, message", WRONG_RULES)
def test_wrong_rules_rejected(wrong, message):
    with pytest.raises(AssertionError, match=message) as err:
        CHECK(wrong)
    assert "random case seed" in str(err.value)


def test_reference_and_a_numpy_answer_pass():
    for seed in (1, 2):
        assert exercises.verdict("03.max-wait", exercises.get("03.max-wait").solution, seed=seed) == "accepted"
        assert exercises.verdict("03.max-wait", numpy_answer, seed=seed) == "accepted"


@pytest.fixture
def simulated_once(monkeypatch):
    """``simulate`` remembered by its inputs (the arrivals, the service function's constants, the batcher's
    settings): the checker and the answer simulate the same servers, and it is deterministic, so each server of a
    seed is simulated once for all the answers judged on it."""
    from course_utils.techniques import batching_sim

    real, memo = batching_sim.simulate, {}

    def remembered(arrivals_ms, service_ms, *, max_batch_size=1, max_wait_ms=0.0):
        consts = tuple(cell.cell_contents for cell in service_ms.__closure__ or ())
        key = (arrivals_ms.tobytes(), service_ms.__code__, consts, max_batch_size, max_wait_ms)
        if key not in memo:
            memo[key] = real(arrivals_ms, service_ms, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
        return memo[key]

    monkeypatch.setattr(batching_sim, "simulate", remembered)
    monkeypatch.setattr(sys.modules[__name__], "simulate", remembered)
    return memo


def test_max_wait_over_200_seeds(simulated_once):
    """The full check on seeds 0-199 (simulated servers, drawn targets, the None case): the reference and a numpy
    answer are accepted on each, and every wrong rule of this file is rejected on each with its reason."""
    answers = [(exercises.get("03.max-wait").solution, None), (numpy_answer, None), *WRONG_RULES]
    for seed in range(200):
        for answer, message in answers:
            got = exercises.verdict("03.max-wait", answer, seed=seed)
            if message is None:
                assert got == "accepted", (seed, answer.__name__, got)
            else:
                assert re.search(message, got) and "random case seed" in got, (seed, answer.__name__, got)
    assert simulated_once


def test_the_max_wait_judge_over_200_seeds():
    """The drawing/judging core on synthetic p99 tables (the full check simulates every candidate): the target is
    always exactly one candidate's p99 and at least two candidates meet it, so a strict <, the smallest wait, a
    fixed wait or a p99 returned instead of a wait is rejected on every seed; right answers pass."""
    import random

    from course_checks.lesson_exercises import l03
    from course_checks.lesson_exercises.observe import Cases

    rules = {
        "meeting it means p99 <= target": lambda p, t: (
            max(w for w in p if p[w] < t) if any(p[w] < t for w in p) else None
        ),
        "a larger wait": lambda p, t: min(w for w in p if p[w] <= t),
        "one of the candidates": lambda p, t: max(p[w] for w in p if p[w] <= t) + 0.123,
    }
    for seed in range(200):
        rng = random.Random(seed)
        base = sorted(rng.uniform(5, 50) for _ in l03.CANDIDATES)
        p99 = dict(zip(l03.CANDIDATES, base, strict=True))
        picked = l03.pick_target(Cases(seed), p99)
        assert picked is not None
        target, want = picked
        assert target in p99.values() and sum(v <= target for v in p99.values()) >= 2
        l03.judge_wait(want, p99, target, want, "case")
        l03.judge_wait(__import__("numpy").float64(want), p99, target, want, "case")
        for reason, rule in rules.items():
            with pytest.raises(AssertionError, match=reason):
                l03.judge_wait(rule(p99, target), p99, target, want, "case")


# ---- 03.oom-sweep ----------------------------------------------------------------------------------------------
def frees_inside_except(model, make_input, batch_sizes, measure):  # the lesson's old loop
    rows = []
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                ms = measure(lambda x=x: model(x))
            except torch.OutOfMemoryError:
                x = None
                gc.collect()
                torch.cuda.empty_cache()
                break
            rows.append({"batch_size": b, "ms": ms})
    return rows


def keeps_x(model, make_input, batch_sizes, measure):  # frees outside, but its own x still holds the batch
    rows, oom = [], False
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                ms = measure(lambda x=x: model(x))
            except torch.OutOfMemoryError:
                oom = True
                break
            rows.append({"batch_size": b, "ms": ms})
    if oom:
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def keeps_exception(model, make_input, batch_sizes, measure):  # the exception (and its traceback) kept
    rows, err = [], None
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                ms = measure(lambda x=x: model(x))
            except torch.OutOfMemoryError as exc:
                err = exc
                break
            rows.append({"batch_size": b, "ms": ms})
    if err is not None:
        x = None
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def no_grad_instead(model, make_input, batch_sizes, measure):
    rows, oom, x = [], False, None
    with torch.no_grad():
        for b in batch_sizes:
            try:
                x = make_input(b)
                ms = measure(lambda x=x: model(x))
            except torch.OutOfMemoryError:
                oom = True
            if oom:
                break
            rows.append({"batch_size": b, "ms": ms})
    if oom:
        x = None
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def crashes(model, make_input, batch_sizes, measure):  # no try at all
    with torch.inference_mode():
        return [{"batch_size": b, "ms": measure(lambda b=b: model(make_input(b)))} for b in batch_sizes]


def drops_rows(model, make_input, batch_sizes, measure):  # an OOM returns nothing: minutes of rows lost
    try:
        return crashes(model, make_input, batch_sizes, measure)
    except torch.OutOfMemoryError:
        gc.collect()
        torch.cuda.empty_cache()
        return []


def goes_on(model, make_input, batch_sizes, measure):  # skips the failed batch and tries larger ones
    rows, x = [], None
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                rows.append({"batch_size": b, "ms": measure(lambda x=x: model(x))})
            except torch.OutOfMemoryError:
                continue
    x = None
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def never_frees(model, make_input, batch_sizes, measure):
    rows = []
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                ms = measure(lambda x=x: model(x))
            except torch.OutOfMemoryError:
                break
            rows.append({"batch_size": b, "ms": ms})
    return rows


def own_clock(model, make_input, batch_sizes, measure):  # times with its own clock instead of measure()
    import time

    rows, oom, x = [], False, None
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                t0 = time.perf_counter()
                model(x)
                ms = (time.perf_counter() - t0) * 1000
            except torch.OutOfMemoryError:
                oom = True
            if oom:
                break
            rows.append({"batch_size": b, "ms": ms})
    x = None
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def catches_everything(model, make_input, batch_sizes, measure):  # except Exception: a bug taken for an OOM
    rows, x, stopped = [], None, False
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                ms = measure(lambda x=x: model(x))
            except Exception:
                stopped = True
            if stopped:
                break
            rows.append({"batch_size": b, "ms": ms})
    if stopped:
        x = None
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def catches_runtime_error(model, make_input, batch_sizes, measure):  # OutOfMemoryError is a RuntimeError...
    rows, x, stopped = [], None, False
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                ms = measure(lambda x=x: model(x))
            except RuntimeError:
                stopped = True
            if stopped:
                break
            rows.append({"batch_size": b, "ms": ms})
    if stopped:
        x = None
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def guarded_empty_cache(model, make_input, batch_sizes, measure):  # right: empty_cache only where CUDA exists
    rows, x, oom = [], None, False
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                ms = measure(lambda x=x: model(x))
            except torch.OutOfMemoryError:
                oom = True
            if oom:
                break
            rows.append({"batch_size": b, "ms": ms})
    if oom:
        x = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def imported_empty_cache(model, make_input, batch_sizes, measure):  # right: `from torch.cuda import empty_cache`
    rows, x, oom = [], None, False
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                ms = measure(lambda x=x: model(x))
            except torch.OutOfMemoryError:
                oom = True
            if oom:
                break
            rows.append({"batch_size": b, "ms": ms})
    if oom:
        x = None
        gc.collect()
        empty_cache()
    return rows


def measures_a_result(model, make_input, batch_sizes, measure):  # measure(model(x)): the model ran before timing
    rows, x, oom = [], None, False
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                x = make_input(b)
                ms = measure(model(x))
            except torch.OutOfMemoryError:
                oom = True
            if oom:
                break
            rows.append({"batch_size": b, "ms": ms})
    if oom:
        x = None
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def builds_inside_the_timed_call(model, make_input, batch_sizes, measure):  # times make_input(b) with the model
    rows, oom = [], False
    with torch.inference_mode():
        for b in batch_sizes:
            try:
                ms = measure(lambda b=b: model(make_input(b)))
            except torch.OutOfMemoryError:
                oom = True
            if oom:
                break
            rows.append({"batch_size": b, "ms": ms})
    if oom:
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def other_keys(model, make_input, batch_sizes, measure):  # rows keyed "batch"/"time", not batch_size/ms
    rows = imported_empty_cache(model, make_input, batch_sizes, measure)
    return [{"batch": r["batch_size"], "time": r["ms"]} for r in rows]


WRONG_SWEEPS = [
    (frees_inside_except, "ran inside the except block"),
    (keeps_x, "still referenced"),
    (keeps_exception, "still referenced"),
    (no_grad_instead, "outside torch.inference_mode()"),
    (crashes, "escaped your sweep|was built inside the timed call"),  # builds inside too: which shows first is drawn
    (drops_rows, "your rows are for batches []|ran inside the except block|was built inside the timed call"),
    (goes_on, "went on to"),
    (never_frees, "nothing called torch.cuda.empty_cache()"),
    (own_clock, "but measure() reported|perf_counter"),
    (catches_everything, "caught the RuntimeError"),
    (catches_runtime_error, "caught the RuntimeError"),
    (measures_a_result, "not a function: the model already ran before measure"),
    (other_keys, "these two keys"),
    (
        builds_inside_the_timed_call,
        "was built inside the timed call (make_input(b) inside the function given to "
        "measure), so its ms include making the batch",
    ),
]


def test_oom_sweep_reference_and_alternatives_pass():
    for fn in (exercises.get("03.oom-sweep").solution, guarded_empty_cache):
        for seed in (1, 2):
            assert exercises.verdict("03.oom-sweep", fn, seed=seed) == "accepted", fn.__name__
    assert (
        torch.cuda.is_available() is False
        or not __import__("fakegpu.standins.rehearsal", fromlist=["no_real_gpu"]).no_real_gpu()
    ), "the stand-in GPU is switched off after the check"


def test_every_check_plants_each_kind_of_failure_over_200_seeds():
    from course_checks.lesson_exercises import l03
    from course_checks.lesson_exercises.observe import Cases

    for seed in range(200):
        runs = l03.draw_sweeps(Cases(seed))
        kinds = sorted((idx is None, idx == 0, bug) for _, idx, bug in runs)
        assert kinds == sorted([(False, False, False), (False, True, False), (True, False, False),
                                (False, False, True)]), (seed, runs)  # fmt: skip
        assert all(idx is None or idx < len(sizes) for sizes, idx, _ in runs)


@pytest.mark.parametrize("wrong, message", WRONG_SWEEPS)
def test_oom_sweep_rejects(wrong, message):

    reason = exercises.verdict("03.oom-sweep", wrong)
    assert any(m in reason for m in message.split("|")), reason
    assert "random case seed" in reason, reason
    assert torch.cuda.empty_cache.__module__.startswith("torch"), "the checker restores torch.cuda.empty_cache"


@pytest.fixture(scope="module")
def frozen_gc():
    """The objects alive before these tests kept out of the garbage collector's scans (``gc.freeze``): the sweeps'
    ``gc.collect()`` then costs a millisecond, not a tenth of a second, and still collects everything a check
    makes (the failed batch, its exception and traceback are all newer)."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def sweeps(fn, seed, device="cpu"):
    """The check's core on seed ``seed``: its four drawn sweeps run and judged on ``device``, without the check's
    set-up per call (a twentieth of its cost on the CPU, half on the stand-in): "accepted" or the reason."""
    from course_checks.lesson_exercises import l03
    from course_checks.lesson_exercises.observe import Cases

    before = torch.cuda.empty_cache
    try:
        l03.run_sweeps(fn, Cases(seed), device)
    except AssertionError as exc:
        return str(exc)
    finally:
        assert torch.cuda.empty_cache is before, "the core restores torch.cuda.empty_cache"
    return "accepted"


@pytest.mark.parametrize("wrong, message", WRONG_SWEEPS)
def test_oom_sweep_rejects_over_200_seeds(frozen_gc, wrong, message):
    """Seeds 0-199, on the CPU (none of these mistakes depends on CUDA being visible): each wrong sweep gets its
    reason on every draw of batch sizes, failing batch, model and planted bug. A sweep that breaks a CUDA rule of
    the stand-in GPU is caught only in the full check (none here)."""
    for seed in range(200):
        reason = sweeps(wrong, seed)
        assert any(m in reason for m in message.split("|")), (seed, reason)


def test_oom_sweep_accepts_the_reference_and_alternatives_over_200_seeds(frozen_gc):
    """Seeds 0-199 on the check's device (the stand-in GPU here: guarded_empty_cache frees only where CUDA is
    visible), then the full check on five more seeds."""
    from course_checks.lesson_exercises.observe import gpu

    with gpu() as device:
        for seed in range(200):
            for fn in (exercises.get("03.oom-sweep").solution, guarded_empty_cache, imported_empty_cache):
                assert sweeps(fn, seed, device) == "accepted", (seed, fn.__name__)
    assert empty_cache is torch.cuda.memory.empty_cache, "the check gives the sweep's module its name back"
    for seed in range(3, 8):  # and the full check on five more seeds (1 and 2 run above)
        for fn in (exercises.get("03.oom-sweep").solution, guarded_empty_cache):
            assert exercises.verdict("03.oom-sweep", fn, seed=seed) == "accepted", (seed, fn.__name__)


def test_a_batch_built_inside_the_timed_call_is_named(frozen_gc):
    """measure(lambda: model(make_input(b))) times making the batch too: named on every seed (the check counts
    make_input's calls during each timed call); the reference, which builds x first, is accepted."""
    for seed in range(50):
        reason = sweeps(builds_inside_the_timed_call, seed)
        assert "the input of batch" in reason and "was built inside the timed call" in reason, (seed, reason)
        assert sweeps(exercises.get("03.oom-sweep").solution, seed) == "accepted", seed
