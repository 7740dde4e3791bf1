"""Lesson 03's exercises: the OOM-surviving sweep rejects sweeps that crash, lose rows, free memory where the
traceback still holds the failed batch or run outside inference_mode; max_wait_ms rejects wrong tuning rules."""

import gc

import pytest
import torch

from course_utils.check import exercises
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


@pytest.mark.parametrize(
    "wrong, message",
    [
        (always_zero, "larger wait|over the target"),  # 0 ms may already miss the target
        (always_largest, "over the target"),
        (smallest_that_meets, "larger wait"),
        (lowest_p99, "larger wait"),
        (never_none, "return None"),
        (returns_p99, "one of the candidates"),
    ],
)
def test_wrong_rules_rejected(wrong, message):
    with pytest.raises(AssertionError, match=message) as err:
        CHECK(wrong)
    assert "random case seed" in str(err.value)


def test_reference_passes():
    CHECK(exercises.get("03.max-wait").solution)


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


def test_oom_sweep_reference_passes():
    assert exercises.verdict("03.oom-sweep", exercises.get("03.oom-sweep").solution) == "accepted"


@pytest.mark.parametrize(
    "wrong, message",
    [
        (frees_inside_except, "ran inside the except block"),
        (keeps_x, "still referenced"),
        (keeps_exception, "still referenced"),
        (no_grad_instead, "outside torch.inference_mode()"),
        (crashes, "escaped your sweep"),
        (drops_rows, "your rows are for batches []"),
        (goes_on, "went on to"),
        (never_frees, "nothing called torch.cuda.empty_cache()"),
        (own_clock, "but measure() reported"),
    ],
)
def test_oom_sweep_rejects(wrong, message):
    reason = exercises.verdict("03.oom-sweep", wrong)
    assert message in reason and "random case seed" in reason, reason
    assert torch.cuda.empty_cache.__module__.startswith("torch"), "the checker restores torch.cuda.empty_cache"
