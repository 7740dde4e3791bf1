"""Lesson 02's exercises reject wrong fixes and wrong profiler readings (and accept the reference solutions)."""

import re

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from course_checks import exercises
from course_checks.lesson_exercises import l02
from course_checks.lesson_exercises.observe import Cases


def checker(key):
    return exercises.get(key).checker


def _events(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return list(prof.key_averages())


def top_by_total(fn):
    return max(_events(fn), key=lambda e: e.cpu_time_total).key


def top_including_ranges(fn):
    return max(_events(fn), key=lambda e: e.self_cpu_time_total).key


def top_by_count(fn):
    return max(_events(fn), key=lambda e: e.count).key


def hard_coded(fn):
    fn()
    return "aten::mm"


def from_name(fn):  # answered from the function's name: the workloads used to be called mm_heavy, add_heavy...
    return "aten::add" if "add" in fn.__name__ else "aten::mm"


def no_profile(fn):  # reads the code instead of profiling it
    fn()
    names = fn.__code__.co_names
    return "aten::mm" if "mm" in str(fn.__code__.co_consts) or "matmul" in names else "aten::add"


def in_a_thread(fn):  # profiles a worker thread that runs fn
    import threading

    box = {}
    t = threading.Thread(target=lambda: box.setdefault("op", exercises.get("02.top-op").solution(fn)))
    t.start()
    t.join()
    return box["op"]


def self_time_with_cuda_key(fn):  # sorts by device time: zero on a CPU, so the first row wins
    return max(_events(fn), key=lambda e: e.self_device_time_total).key


def matmul_total(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = [e for e in prof.key_averages() if not e.is_user_annotation]
    return max(ops, key=lambda e: e.cpu_time_total).key


def profiles_then_guesses(fn):  # profiles (so the workload ran under the profiler), then answers from a table
    with profile(activities=[ProfilerActivity.CPU]):
        fn()
    return "aten::mm"


def longest_single_call(fn):  # the operator of the one longest call (prof.events(): one row per call)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return max((e for e in prof.events() if not e.is_user_annotation), key=lambda e: e.self_cpu_time_total).name


def highest_average(fn):  # the most self time per call
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    ops = [e for e in prof.key_averages() if not e.is_user_annotation and e.count]
    return max(ops, key=lambda e: e.self_cpu_time_total / e.count).key


WRONG_READINGS = [
    (longest_single_call, "whose one call is the longest"),
    (highest_average, "whose one call is the longest"),
    (top_by_total, "record_function range"),
    (top_including_ranges, "record_function range"),
    (top_by_count, "most self CPU time"),
    (hard_coded, "never ran under the profiler"),
    (from_name, "never ran under the profiler"),
    (no_profile, "never ran under the profiler"),
    (in_a_thread, "started a thread"),
    (self_time_with_cuda_key, "most self CPU time"),
    (matmul_total, "*total* CPU time"),
    (profiles_then_guesses, "the operator with the most self CPU time is"),
]


@pytest.mark.parametrize("wrong, message", WRONG_READINGS, ids=[f.__name__ for f, _ in WRONG_READINGS])
def test_top_op_rejects_wrong_readings(wrong, message):
    """The full checker, on one fresh seed per run."""
    reason = exercises.verdict("02.top-op", wrong)
    assert message in reason, reason


def _readings(answer):
    """The answer's reading of each workload a seed can draw: kind x count of minor ops (the name aside)."""
    readings = {}
    for kind, minor in l02.TOP_OP_VARIANTS:
        try:
            got, _, seen = l02.read_top_op(answer, kind, minor, f"workload_{minor}000")
            readings[kind, minor] = (got, seen)
        except AssertionError as exc:
            readings[kind, minor] = (exc, [])
    return readings


WANT = {"mm-in-range": "aten::mm", "add": "aten::add", "mul": "aten::mul", "cumsum": "aten::cumsum",
        "many-add": "aten::add", "many-mul": "aten::mul"}  # fmt: skip


def _judged(readings, seed):
    """The checker's judgment of seed ``seed``'s two workloads from the readings (what the answer returned)."""
    runs = []
    for kind, minor, name in l02.draw_top_op(Cases(seed)):
        got, seen = readings[kind, minor]
        if isinstance(got, AssertionError):
            return str(got)
        runs.append((name, WANT[kind], got, seen))
    try:
        l02.judge_top_op(runs, frozenset(name for kind, _, name in l02.draw_top_op(Cases(seed)) if "many" in kind))
    except AssertionError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.parametrize("wrong, message", WRONG_READINGS, ids=[f.__name__ for f, _ in WRONG_READINGS])
def test_top_op_rejects_wrong_readings_on_200_seeds(wrong, message):
    """Each seed's draw (the order, the second kind, the counts of minor ops, the names) judged by the checker's
    own judge_top_op. A full call costs ~70 ms (the workloads themselves), so the answer reads each of the 20
    workloads a seed can draw once, and each seed is judged from those readings; the answers that read the
    workload's name (from_name) or stop before running it (a thread) run the full checker on every seed."""
    if wrong in (from_name, in_a_thread):
        for seed in range(200):
            reason = exercises.verdict("02.top-op", wrong, seed=seed)
            assert message in reason and f"seed {seed}" in reason, (seed, reason)
        return
    readings = _readings(wrong)
    for seed in range(200):
        reason = _judged(readings, seed)
        assert message in reason, (seed, reason)


def top_of_sorted_events(fn):  # right too: sort the operators, skip ranges by hand
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return next(e.key for e in rows if not e.is_user_annotation and not e.key.startswith("ProfilerStep"))


def top_aten_by_prefix(fn):  # right too: operators are the aten:: rows
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return max((e for e in prof.key_averages() if e.key.startswith("aten::")), key=lambda e: e.self_cpu_time_total).key


def top_autograd_profiler(fn):  # right too: the older torch.autograd.profiler API, after one warm-up call
    fn()
    with torch.autograd.profiler.profile() as prof:
        fn()
    ops = [e for e in prof.key_averages() if not e.is_user_annotation]
    return max(ops, key=lambda e: e.self_cpu_time_total).key


@pytest.mark.parametrize("right", [top_aten_by_prefix, top_autograd_profiler])
def test_top_op_accepts_more_right_readings_on_200_seeds(right):
    readings = _readings(right)
    bad = {s: v for s in range(200) if (v := _judged(readings, s)) != "accepted"}
    assert not bad, bad
    assert exercises.verdict("02.top-op", right, seed=0) == "accepted"


def test_top_op_accepts_right_readings_on_200_seeds():
    """The reference and an alternative judged on each of 200 seeds' draws (from their readings of the 20
    workloads, as above), and the full checker on a few seeds."""
    for fn in (exercises.get("02.top-op").solution, top_of_sorted_events):
        readings = _readings(fn)
        bad = {s: v for s in range(200) if (v := _judged(readings, s)) != "accepted"}
        assert not bad, (fn.__name__, bad)
        bad = {s: v for s in range(3) if (v := exercises.verdict("02.top-op", fn, seed=s)) != "accepted"}
        assert not bad, (fn.__name__, bad)


def per_image_loop(images):
    return torch.stack([torch.from_numpy(im).float() / 16.0 for im in images]).unsqueeze(1)


def wrong_scale(images):
    return torch.from_numpy(np.stack(images)).float().div_(255.0).unsqueeze(1)


def numpy_loop(images):  # one torch op, but the loop is still there, in numpy
    return torch.from_numpy(np.stack([im.astype(np.float32) / 16.0 for im in images])).unsqueeze(1)


def worker_threads(images):  # the per-image work moved to a thread pool
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        parts = list(pool.map(lambda im: torch.from_numpy(im).float() / 16.0, images))
    return torch.stack(parts).unsqueeze(1)


def wrong_dtype(images):
    return torch.from_numpy(np.stack(images)).double().div_(16.0).unsqueeze(1)


def no_channel(images):
    return torch.from_numpy(np.stack(images)).float().div_(16.0)


def pixel_loop(images):  # a Python loop over every pixel, through .tolist(): no numpy or torch op per image
    return torch.tensor([[im.tolist()] for im in images], dtype=torch.float32) / 16.0


def asarray_loop(images):  # np.asarray per image strips any marking, then numpy per image
    return torch.from_numpy(np.stack([np.asarray(im).astype(np.float32) / 16.0 for im in images])).unsqueeze(1)


def tensor_of_list(images):  # torch.tensor walks each image, row and pixel in C: a per-pixel loop (torch warns)
    return (torch.tensor(images).float() / 16.0).unsqueeze(1)


def as_tensor_of_list_float(images):
    return torch.as_tensor(images, dtype=torch.float32).div(16.0).unsqueeze(1)


def np_array_once(images):  # right too: one np.array of the list, one conversion
    return torch.from_numpy(np.array(images, dtype=np.float32) / np.float32(16.0)).unsqueeze(1)


FIXED = {}


def cached_by_length(images):  # answers from a table filled by the checker's own earlier calls
    key = len(images)
    if key not in FIXED:
        FIXED[key] = torch.stack([torch.from_numpy(im).float() / 16.0 for im in images]).unsqueeze(1)
    return FIXED[key]


def scaled_by_batch_max(images):  # "into [0, 1]" by the batch's own max: right only when a pixel is 16
    x = torch.from_numpy(np.stack(images)).float().unsqueeze(1)
    return x / x.max()


def min_max_scaled(images):
    x = torch.from_numpy(np.stack(images)).float().unsqueeze(1)
    return (x - x.min()) / (x.max() - x.min())


def divided_by_15(images):  # the largest value taken as 15
    return torch.from_numpy(np.stack(images)).float().div(15.0).unsqueeze(1)


def channel_last(images):
    return torch.from_numpy(np.stack(images)).float().div(16.0).unsqueeze(-1)


def true_division_reshaped(images):  # right too: uint8 / 16 is a float32 tensor
    return (torch.from_numpy(np.stack(images)) / 16).reshape(-1, 1, 8, 8)


@pytest.mark.parametrize(
    "wrong, message",
    [
        (scaled_by_batch_max, "not by the batch's max or range"),
        (min_max_scaled, "not by the batch's max or range"),
        (divided_by_15, "divide the 0-16 pixel values by 16"),
        (channel_last, "expected shape"),
        (per_image_loop, "once per image"),
        (wrong_scale, "divide"),
        (numpy_loop, "Python loop over the images"),
        (worker_threads, "started a thread"),
        (wrong_dtype, "expected float32"),
        (no_channel, "expected shape"),
        (pixel_loop, "Python loop over the images"),
        (asarray_loop, "Python loop over the images"),
        (tensor_of_list, "torch.tensor (or torch.as_tensor) on a list of arrays walks every image, row and pixel"),
        (as_tensor_of_list_float, "read 4 images element by element|read [5-8] images element by element"),
    ],
)
@pytest.mark.filterwarnings("ignore:Creating a tensor from a list of numpy.ndarrays")
def test_vectorize_rejects(wrong, message):
    for seed in range(200):  # every draw of 9-40, 4-8 and 48-96 images
        reason = exercises.verdict("02.vectorize", wrong, seed=seed)
        assert re.search(message, reason) if "|" in message else message in reason, (seed, reason)


def test_vectorize_accepts_right_answers_on_200_seeds():
    for fn, seeds in (
        (exercises.get("02.vectorize").solution, range(200)),
        (np_array_once, range(200)),
        (true_division_reshaped, range(200)),
    ):
        bad = {s: v for s in seeds if (v := exercises.verdict("02.vectorize", fn, seed=s)) != "accepted"}
        assert not bad, bad


def per_row_item(logits):
    probs = torch.softmax(logits, dim=1)
    return [(int(p.argmax().item()), float(p.max().item())) for p in probs]


def logits_not_probs(logits):
    conf, label = logits.max(dim=1)
    return list(zip(label.tolist(), conf.tolist(), strict=True))


def numpy_rows(logits):  # one copy back, then the softmax row by row in numpy
    out = []
    for row in logits.numpy():
        p = np.exp(row - row.max())
        p /= p.sum()
        out.append((int(p.argmax()), float(p.max())))
    return out


def softmax_torch_pick_python(logits):  # softmax in torch, the labels picked by a Python loop
    probs = torch.softmax(logits, dim=1).tolist()
    return [(max(range(len(p)), key=p.__getitem__), max(p)) for p in probs]


def per_row_softmax(logits):
    return [(int(torch.softmax(r, 0).argmax()), float(torch.softmax(r, 0).max())) for r in logits]


def threaded_rows(logits):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda r: (int(r.argmax()), float(torch.softmax(r, 0).max())), logits))


def max_of_logits_label_of_probs(logits):  # the confidence is the top logit, not a probability
    conf, label = logits.max(dim=1)
    return list(zip(label.tolist(), conf.tolist(), strict=True))


def softmax_over_batch(logits):  # dim=0: each class normalized over the batch
    conf, label = torch.softmax(logits, dim=0).max(dim=1)
    return list(zip(label.tolist(), conf.tolist(), strict=True))


def tensors_returned(logits):  # nothing copied back: each caller's int()/float() is a sync per row
    conf, label = torch.softmax(logits, dim=1).max(dim=1)
    return list(zip(label, conf, strict=True))


def topk_one(logits):  # topk(1) keeps a dimension of 1: [label], [confidence]
    conf, label = torch.softmax(logits, dim=1).topk(1, dim=1)
    return list(zip(label.tolist(), conf.tolist(), strict=True))


def sigmoid_confidence(logits):
    conf, label = torch.sigmoid(logits).max(dim=1)
    return list(zip(label.tolist(), conf.tolist(), strict=True))


def bf16_softmax(logits):  # the softmax in bfloat16 "to save bandwidth": probabilities off by ~1e-3
    conf, label = torch.softmax(logits.bfloat16(), dim=1).max(dim=1)
    return list(zip(label.tolist(), conf.float().tolist(), strict=True))


def log_probabilities(logits):  # log_softmax: the log of the confidence
    conf, label = torch.log_softmax(logits, dim=1).max(dim=1)
    return list(zip(label.tolist(), conf.tolist(), strict=True))


def numpy_copy_back(logits):  # right too: one copy back with .numpy(), numpy numbers
    conf, label = torch.softmax(logits, dim=1).max(dim=1)
    return list(zip(label.numpy(), conf.numpy(), strict=True))


def argmax_then_gather(logits):  # right too
    p = torch.softmax(logits, dim=1)
    label = p.argmax(dim=1)
    return [tuple(r) for r in torch.stack([label.float(), p.gather(1, label[:, None]).squeeze(1)], 1).tolist()]


@pytest.mark.parametrize("right", [numpy_copy_back, argmax_then_gather])
def test_one_sync_accepts_right_answers_on_200_seeds(right):
    bad = {s: v for s in range(200) if (v := exercises.verdict("02.one-sync", right, seed=s)) != "accepted"}
    assert not bad, bad


@pytest.mark.parametrize(
    "wrong, message",
    [
        (softmax_over_batch, "softmax over dim=0, which normalizes each class over the batch"),
        (tensors_returned, "is a tensor"),
        (topk_one, "topk(1) and keepdim=True keep a dimension of size 1"),
        (sigmoid_confidence, "use the softmax probability of the label"),
        (per_row_item, "per-row"),
        (logits_not_probs, "softmax probability"),
        (numpy_rows, "no softmax over the whole"),
        (softmax_torch_pick_python, "no max/argmax over the whole"),
        (per_row_softmax, "per-row"),
        (threaded_rows, "started a thread"),
        (max_of_logits_label_of_probs, "softmax probability"),
        (bf16_softmax, "what a softmax in a 16-bit dtype (bfloat16, float16) loses"),
        (log_probabilities, "that is the log of the probability (log_softmax)"),
    ],
)
def test_one_sync_rejects(wrong, message):
    for seed in range(200):
        reason = exercises.verdict("02.one-sync", wrong, seed=seed)
        assert message in reason, (seed, reason)


def test_reference_solutions_pass():
    for key in ("02.vectorize", "02.one-sync", "02.top-op"):
        assert exercises.verdict(key, exercises.get(key).solution) == "accepted", key
    for seed in range(200):
        assert exercises.verdict("02.one-sync", exercises.get("02.one-sync").solution, seed=seed) == "accepted"
