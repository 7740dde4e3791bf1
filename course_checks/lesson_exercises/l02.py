"""Lesson 02 exercises: remove per-item work found by the profiler; read the profiler's table yourself.

The checkers watch the work where it runs: the operators on the calling thread (``observe.OpLog``, a dispatch
mode), numpy calls on each image (images handed over as a counting ndarray subclass), threads started during the
call (refused: work moved to a worker thread is hidden from the profiler), and whether the workload really ran
under ``torch.profiler``. Inputs and workloads are drawn at random per call.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from course_checks.exercises import exercise, learner_frame, observed, untimed
from course_checks.lesson_exercises.observe import Cases, OpLog, cases


@contextlib.contextmanager
def _no_threads(what: str) -> Iterator[None]:
    """Refuse to start a thread while active: work moved to a worker thread escapes the profiler's view."""
    real = threading.Thread.start

    def refuse(self: threading.Thread, *a: Any, **k: Any) -> None:
        raise AssertionError(
            f"{what} started a thread: work moved to a worker thread is still done once per item, only hidden from "
            "the profiler of the calling thread. Do the work on this thread, with whole-batch torch operations"
        )

    threading.Thread.start = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        threading.Thread.start = real  # type: ignore[method-assign]


def python_calls(fn: Callable[[], object]) -> int:
    """Calls made from the learner's own code (functions and C functions it calls, its comprehensions' too) during
    one call of ``fn``: a loop over images or pixels makes more of them for more images, whatever it calls."""
    count = 0

    def profiler(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        caller = frame if event == "c_call" else frame.f_back if event == "call" else None
        if caller is not None and learner_frame(caller):
            count += 1

    previous = sys.getprofile()
    sys.setprofile(profiler)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return count


def _op_calls(fn: Callable[[], object]) -> int:
    """Operator calls made on this thread by one call of ``fn``."""
    with OpLog() as log:
        fn()
    return len(log.ops)


class _Img(np.ndarray):
    """An image that counts the numpy operations done on it alone (a per-image loop, in numpy), and the reads of
    its rows and pixels as a Python sequence (a per-pixel loop, in torch's C code: ``torch.tensor(list_of_arrays)``
    walks every image, row and pixel through ``__getitem__``; ``np.stack`` reads each image once)."""

    touched = 0
    read = 0

    def __getitem__(self, key: Any) -> Any:
        _Img.read += 1
        return super().__getitem__(key)

    def __iter__(self) -> Any:
        _Img.read += 1
        return super().__iter__()

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        _Img.touched += 1
        args = [np.asarray(i) if isinstance(i, _Img) else i for i in inputs]
        return getattr(ufunc, method)(*args, **kwargs)

    def astype(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        _Img.touched += 1
        return np.asarray(self).astype(*args, **kwargs)


def _images(c: Cases, n: int, counting: bool = False, low: int = 0, high: int = 16) -> list[np.ndarray]:
    batch = torch.randint(low, high + 1, (n, 8, 8), generator=c.torch_gen, dtype=torch.uint8).numpy()
    imgs = [batch[i].copy() for i in range(n)]
    return [im.view(_Img) for im in imgs] if counting else imgs


def _check_vectorize(fn: Callable[[list[np.ndarray]], torch.Tensor]) -> None:
    with cases("02.vectorize") as c:
        n = c.randint(9, 40)
        imgs = _images(c, n)
        with _no_threads("preprocess_vectorized"):
            out = fn(imgs)
        assert isinstance(out, torch.Tensor), "return a torch.Tensor"
        assert tuple(out.shape) == (n, 1, 8, 8), f"expected shape ({n}, 1, 8, 8), got {tuple(out.shape)}"
        assert out.dtype == torch.float32, f"expected float32, got {out.dtype}"
        expected = torch.from_numpy(np.stack(imgs).astype(np.float32) / 16.0).unsqueeze(1)
        assert torch.allclose(out, expected, atol=1e-6), "values differ: divide the 0-16 pixel values by 16"
        # a batch of faint images (no pixel at 0 or 16): scaling by the batch's own max or range differs here
        low, high = c.randint(1, 3), c.randint(9, 14)
        faint = _images(c, c.randint(9, 40), low=low, high=high)
        with _no_threads("preprocess_vectorized"):
            got = fn(faint)
        want = torch.from_numpy(np.stack(faint).astype(np.float32) / 16.0).unsqueeze(1)
        assert isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(want.shape), (
            f"for {len(faint)} images: expected a tensor of shape {tuple(want.shape)}"
        )
        assert torch.allclose(got.float(), want, atol=1e-6), (
            f"values differ on a batch whose pixels run from {low} to {high} only: you return "
            f"{float(got.min()):.4g} to {float(got.max()):.4g}, pixels / 16 is {low / 16:.4g} to {high / 16:.4g}. "
            "Divide by 16, the pixels' full scale, not by the batch's max or range: an image's values must not "
            "depend on the other images in its batch"
        )
        small_n, large_n = c.randint(4, 8), c.randint(48, 96)
        small_imgs, large_imgs = _images(c, small_n), _images(c, large_n)
        with _no_threads("preprocess_vectorized"):
            small, large = _op_calls(lambda: fn(small_imgs)), _op_calls(lambda: fn(large_imgs))
        assert large <= small, (
            f"{small} operator calls for {small_n} images but {large} for {large_n}: something still runs once per "
            "image (stack the images with numpy first, then convert once)"
        )
        with _no_threads("preprocess_vectorized"):
            calls = [python_calls(lambda imgs=imgs: fn(imgs)) for imgs in (small_imgs, large_imgs)]
        assert calls[1] - calls[0] <= 2, (
            f"your code made {calls[0]} Python calls for {small_n} images and {calls[1]} for {large_n}: a Python loop "
            "over the images (or their pixels: .tolist(), np.asarray per image, a comprehension) is still a loop. "
            "np.stack the list once, then convert and scale the whole batch"
        )
        for k in (small_n, large_n):
            _Img.touched = _Img.read = 0
            fn(_images(c, k, counting=True))
            assert _Img.read <= 2 * k, (
                f"your code read {k} images element by element ({_Img.read} reads of single rows and pixels, "
                f"{_Img.read / k:.0f} per image): torch.tensor (or torch.as_tensor) on a list of arrays walks every "
                "image, row and pixel as a Python sequence, one at a time: a loop over the pixels inside torch (it "
                "warns: 'Creating a tensor from a list of numpy.ndarrays is extremely slow'). np.stack the list into "
                "one array first, then torch.from_numpy converts it at once"
            )
            assert _Img.touched <= 2, (
                f"{_Img.touched} numpy operations on single images for {k} images: a Python loop over the images, "
                "in numpy instead of torch, is still a loop. np.stack the list, then convert and scale the whole "
                "batch at once"
            )
    observed(f"{n} images to a ({n}, 1, 8, 8) float32 tensor equal to pixels / 16; {small} operators for {small_n} "
             f"images and {large} for {large_n}; {calls[0]} and {calls[1]} Python calls; no thread, no numpy "
             "operation on a single image, no image read element by element")  # fmt: skip


@exercise(
    "02.vectorize",
    "Turn a list of uint8 8x8 images into a (N, 1, 8, 8) float tensor in [0, 1] with a fixed number of ops.",
    _check_vectorize,
    time_limit=30,
)
def preprocess_vectorized(images: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(images)).float().div_(16.0).unsqueeze(1)


def _reference_post(logits: torch.Tensor) -> list[tuple[int, float]]:
    probs = torch.softmax(logits, dim=1)
    return [(int(p.argmax()), float(p.max())) for p in probs]


_SOFTMAX = ("aten._softmax", "aten.softmax", "aten._log_softmax", "aten.exp")
_PICK = ("aten.max.dim", "aten.argmax", "aten.topk", "aten.max.default", "aten.sort")


def _sixteen_bit(out: list, logits: torch.Tensor) -> bool:
    """Whether every confidence returned is the top probability of a softmax computed in bfloat16 or float16."""
    try:
        conf = torch.tensor([float(pair[1]) for pair in out])
    except (TypeError, ValueError, IndexError):
        return False
    for dt in (torch.bfloat16, torch.float16):
        low = torch.softmax(logits.to(dt), dim=1).max(dim=1).values.float()
        if conf.shape == low.shape and bool(((conf - low).abs() < 1e-6).all()):
            return True
    return False


def _check_one_sync(fn: Callable[[torch.Tensor], list]) -> None:
    with cases("02.one-sync") as c:
        n, k = c.randint(20, 60), c.randint(3, 12)
        logits = c.randn(n, k) * c.choice([1.0, 3.0, 6.0])
        with _no_threads("postprocess_batched"), OpLog() as log:
            out = fn(logits)
        assert isinstance(out, list) and len(out) == n, f"return a list with one (label, confidence) per row ({n})"
        across = torch.softmax(logits, dim=0)  # the wrong axis, to name that mistake
        for i, (pair, (rlab, rconf)) in enumerate(zip(out, _reference_post(logits), strict=True)):
            assert isinstance(pair, tuple | list) and len(pair) == 2, (
                f"row {i}: {pair!r} is not a (label, confidence) pair"
            )
            lab, conf = pair
            for what, v in (("label", lab), ("confidence", conf)):
                if isinstance(v, torch.Tensor):
                    raise AssertionError(
                        f"row {i}: the {what} is a tensor ({v!r}): nothing was copied back, and int() or float() on "
                        "it later is one sync per row. Copy the whole batch's labels and confidences back once: "
                        ".tolist()"
                    )
                if not isinstance(v, numbers.Real) or isinstance(v, bool):
                    raise AssertionError(
                        f"row {i}: the {what} is {v!r}, not a number"
                        + (": topk(1) and keepdim=True keep a dimension of size 1; .max(dim=1) gives one value per "
                           "row" if isinstance(v, list | tuple) else "")
                    )  # fmt: skip
            if int(lab) != rlab and int(lab) == int(across[i].argmax()):
                raise AssertionError(
                    f"row {i}: label {lab}, expected {rlab}: that is the argmax of softmax over dim=0, which "
                    "normalizes each class over the batch; the probabilities of a row are softmax(logits, dim=1)"
                )
            assert int(lab) == rlab, f"row {i}: label {lab}, expected {rlab}: the label is the argmax of the logits"
            if abs(float(conf) - rconf) >= 1e-5 and abs(float(conf) - float(across[i, rlab])) < 1e-5:
                raise AssertionError(
                    f"row {i}: confidence {float(conf):.6f}, expected {rconf:.6f}: that is softmax over dim=0, which "
                    "normalizes each class over the batch; the probabilities of a row are softmax(logits, dim=1)"
                )
            if abs(float(conf) - rconf) >= 1e-5 and abs(float(conf) - math.log(rconf)) < 1e-4:
                raise AssertionError(
                    f"row {i}: confidence {float(conf):.6f}, expected {rconf:.6f}: that is the log of the probability "
                    "(log_softmax); the confidence is the softmax probability, torch.softmax(logits, dim=1)"
                )
            if abs(float(conf) - rconf) >= 1e-5 and _sixteen_bit(out, logits):
                raise AssertionError(
                    f"row {i}: confidence {float(conf):.6f}, expected {rconf:.6f}: close, but off by "
                    f"{abs(float(conf) - rconf):.1e}, what a softmax in a 16-bit dtype (bfloat16, float16) loses. "
                    "Compute the softmax in the logits' own dtype, float32"
                )
            assert abs(float(conf) - rconf) < 1e-5, (
                f"row {i}: confidence {float(conf):.6f}, expected {rconf:.6f}: use the softmax probability of the label"
            )
        small_n, large_n = c.randint(4, 8), c.randint(100, 160)
        small_x, large_x = c.randn(small_n, k), c.randn(large_n, k)
        with _no_threads("postprocess_batched"):
            small, large = _op_calls(lambda: fn(small_x)), _op_calls(lambda: fn(large_x))
        assert large <= small, (
            f"{small} operator calls for {small_n} rows but {large} for {large_n}: a per-row op (.item(), indexing) "
            "is left; compute softmax and max over dim=1 for the whole batch and copy back once with .tolist()"
        )
        full = [op for op in log.named(*_SOFTMAX) if (n, k) in op.in_shapes]
        assert full, (
            f"no softmax over the whole ({n}, {k}) batch ran in torch: the probabilities were computed row by row or "
            "outside torch (numpy, Python). torch.softmax(logits, dim=1) once for the batch"
        )
        picked = [op for op in log.named(*_PICK) if any(s[:1] == (n,) for s in op.in_shapes)]
        assert picked, (
            f"no max/argmax over the whole ({n}, {k}) batch ran in torch: the labels were picked row by row or outside "
            "torch. .max(dim=1) gives confidences and labels for every row at once"
        )


@exercise(
    "02.one-sync",
    "Return [(label, confidence), ...] for a batch of logits with one copy back, no per-row .item().",
    _check_one_sync,
    time_limit=30,
)
def postprocess_batched(logits: torch.Tensor) -> list[tuple[int, float]]:
    conf, label = torch.softmax(logits, dim=1).max(dim=1)
    return list(zip(label.cpu().tolist(), conf.cpu().tolist(), strict=True))


#: Every workload a seed can draw, as (kind, count of minor ops): the tests read each once.
TOP_OP_VARIANTS = [(k, m) for k in ("mm-in-range", "add", "mul", "cumsum") for m in range(4, 9)] + [
    (k, 1) for k in ("many-add", "many-mul")
]
#: In a ``many-*`` workload, the many small calls' self time in all, as a multiple of the one big call's.
MANY_TO_ONE = 5.0


def draw_top_op(c: Cases) -> list[tuple[str, int, str]]:
    """What a seed draws: three workloads in random order, ``mm-in-range``, one of add/mul/cumsum and one of
    many-add/many-mul (no fixed answer fits them all), each as (kind, count of cheap minor ops, random function
    name). In a ``many-*`` workload, thousands of small calls of one operator outweigh one long matrix multiply in
    self time, while the multiply has the longest call and the highest time per call: those readings differ there."""
    kinds = ["mm-in-range", c.choice(["add", "mul", "cumsum"]), c.choice(["many-add", "many-mul"])]
    c.rng.shuffle(kinds)
    drawn = []
    for kind, number in zip(kinds, c.rng.sample(range(1000, 10_000), len(kinds)), strict=True):  # distinct names
        minor = c.randint(4, 8) if not kind.startswith("many-") else 1  # few calls: pauses rarely land in them
        drawn.append((kind, minor, f"workload_{number}"))
    return drawn


def _seconds(fn: Callable[[], object], repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _many_small(op: Callable[..., Any], big: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(input, output, count) of small calls of ``op`` whose self time adds up to :data:`MANY_TO_ONE` times one
    ``big @ big`` on this machine now: each call about 1/400 of the big one (its size scaled to that), ~2,000 calls.
    Measured with the fastest of a few runs, so a pause of the machine does not shrink the margin."""

    def per_call(size: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        x, out = torch.ones(size), torch.empty(size)
        return x, out, _seconds(lambda: [op(x, x, out=out) for _ in range(10)], 3) / 10

    one, size = _seconds(lambda: big @ big, 2), 200_000
    for _ in range(4):  # the size that makes one call ~1/400 of the big one (a memory-bound op: time ~ size)
        x, out, t = per_call(size)
        resized = min(4_000_000, max(20_000, round(size * (one / 400) / t)))
        if 0.5 < resized / size < 2:
            break
        size = resized
    return x, out, min(4_000, max(200, math.ceil(MANY_TO_ONE * one / t)))


def workload(kind: str, minor: int, name: str) -> tuple[Callable[[], None], str, list[bool]]:
    """A drawn workload: one operator dominates its self CPU time by far (several times the others).

    Returns the workload (named ``name``), the dominant operator, and a list that records, per call, whether
    a profiler was recording (an answer must profile the call, not guess from the code or the name).
    """
    a, small = torch.full((320, 320), 0.5), torch.ones(8)
    x, out = torch.ones(200_000), torch.empty(200_000)
    seen: list[bool] = []
    if kind.startswith("many-"):
        big, op = torch.full((1024, 1024), 0.5), {"many-add": torch.add, "many-mul": torch.mul}[kind]
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with untimed():  # the checker's own measurement of this machine
                x, out, many = _many_small(op, big)
        finally:
            torch.set_num_threads(threads)

    def work() -> None:
        seen.append(bool(torch._C._autograd._profiler_enabled()))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one thread: OpenMP's spinning on a busy machine would swamp every timing
        try:
            _body()
        finally:
            torch.set_num_threads(threads)

    def _body() -> None:
        for _ in range(minor):  # cheap ops: they win by count in a range's workload, never by self time
            small.add(1.0)
        if kind == "mm":
            for _ in range(6):
                a @ a
        elif kind == "add":
            for _ in range(200):
                torch.add(x, x, out=out)
        elif kind == "mul":
            for _ in range(200):
                torch.mul(x, x, out=out)
        elif kind == "cumsum":
            for _ in range(40):
                torch.cumsum(x, 0, out=out)
        elif kind.startswith("many-"):
            big @ big  # one long call: the longest single call, the most time per call, not the most in all
            for _ in range(many):
                op(x, x, out=out)
        else:
            with torch.profiler.record_function("python loop"):
                sum(i * i for i in range(1_000_000))  # pure Python: time in the range, in no operator
                for _ in range(8):
                    a @ a  # the operator with the most self time, far less than the loop

    work.__name__ = work.__qualname__ = name
    want = {"mm": "aten::mm", "mm-in-range": "aten::mm", "add": "aten::add", "mul": "aten::mul",
            "cumsum": "aten::cumsum", "many-add": "aten::add", "many-mul": "aten::mul"}[kind]  # fmt: skip
    return work, want, seen


def run_top_op(fn: Callable[[Callable[[], object]], str], work: Callable[[], None]) -> str:
    """The answer's reading of one workload (no thread may start; the answer must be a string)."""
    with _no_threads("top_self_cpu_op"):
        got = fn(work)
    assert isinstance(got, str), f"return the operator's name as a string (got {type(got).__name__})"
    return got


def judge_top_op(runs: list[tuple[str, str, str, list[bool]]], one_long: frozenset[str] = frozenset()) -> None:
    """The judgment of the answer's readings: (workload name, dominant operator, answer, profiler seen) per run;
    ``one_long``: the workloads (``many-*``) whose one matrix multiply has the longest call, not the most time."""
    # the most telling mistake first, so the reason does not depend on the order the workloads came in
    assert all(any(seen) for *_, seen in runs), (
        "the workload never ran under the profiler: profile one call of fn() with torch.profiler.profile and "
        "read prof.key_averages(); the answer cannot be read from the function's name or code"
    )
    if any(got == "python loop" for _, _, got, _ in runs):
        raise AssertionError(
            "'python loop' is a record_function range, not an operator: its self time is Python time "
            "between operators. Skip ranges (event.is_user_annotation) and ProfilerStep rows"
        )
    for _name, want, got, _ in runs:
        if got in ("aten::matmul", "aten::linear") and want == "aten::mm":
            raise AssertionError(f"'{got}' has the most *total* CPU time (its child aten::mm does the work): "
                                 "sort by self_cpu_time_total")  # fmt: skip
    wrong = [(name, want, got) for name, want, got, _ in runs if got != want]
    if wrong and all(name in one_long and got == "aten::mm" for name, _, got in wrong):
        name, want, _ = wrong[0]  # right everywhere else: the time of one call was read, not the time in all
        raise AssertionError(
            f"{name}: you returned 'aten::mm', whose one call is the longest (and has the most time per call), "
            f"but the hundreds of short '{want}' calls add up to more self CPU time. Sum over all calls of an "
            "operator: self_cpu_time_total of prof.key_averages(), not an event's own time from prof.events() nor "
            "the time per call"
        )
    for name, want, got, _ in runs:
        assert got == want, (
            f"{name}: the operator with the most self CPU time is '{want}', you returned "
            f"'{got}'. Profile fn() and take the max of self_cpu_time_total over prof.key_averages()"
        )


#: Readings of one workload at most: the answer's reading is the one it gives twice (best of three).
TOP_OP_TRIES = 3


def read_top_op(
    fn: Callable[[Callable[[], object]], str], kind: str, minor: int, name: str
) -> tuple[str, str, list[bool]]:
    """(answer's reading, dominant operator, profiler seen) of one drawn workload: the reading the answer gives
    twice, best of :data:`TOP_OP_TRIES`. On a busy machine one profile can mislead either way: a pause of the
    process can land in a wrapper's own code (``aten::matmul`` around ``aten::mm``) and give a right rule a wrong
    reading, or land in one of the many small calls and make it longer than the one big call, which gives a wrong
    rule (the longest call) the right reading once. A majority of readings is what the rule reads, not what a
    pause did to one of them."""
    work, want, seen = workload(kind, minor, name)
    readings: list[str] = []
    while len(readings) < TOP_OP_TRIES:
        readings.append(run_top_op(fn, work))
        if len(readings) >= 2 and readings.count(readings[-1]) >= 2:
            break
    twice = [r for r in readings if readings.count(r) >= 2]
    return (twice[0] if twice else readings[-1]), want, seen


def _check_top_op(fn: Callable[[Callable[[], object]], str]) -> None:
    with cases("02.top-op") as c:
        runs, one_long = [], set()
        for kind, minor, name in draw_top_op(c):
            got, want, seen = read_top_op(fn, kind, minor, name)
            runs.append((name, want, got, seen))
            if kind.startswith("many-"):
                one_long.add(name)
        judge_top_op(runs, frozenset(one_long))


@exercise(
    "02.top-op",
    "Profile one call of fn() and return the name of the operator (not a record_function range) with the most "
    "self CPU time.",
    _check_top_op,
    time_limit=60,
)
def top_self_cpu_op(fn: Callable[[], object]) -> str:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = [e for e in prof.key_averages() if not e.is_user_annotation and not e.key.startswith("ProfilerStep")]
    return max(ops, key=lambda e: e.self_cpu_time_total).key
