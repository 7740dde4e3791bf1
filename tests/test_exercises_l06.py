"""Lesson 06's exercise checkers reject wrong submissions, with the reason (and accept the references)."""

from __future__ import annotations

import re

import pytest
import torch

from course_checks import exercises
from course_checks.exercises import verdict

# ------------------------------------------------------------------ 06.mark-dynamic


def _marked(xs):
    for x in xs:
        torch._dynamo.mark_dynamic(x, 0)
    return xs


def plain_loop(compiled, xs):
    return [compiled(x) for x in xs]


def eager_only(compiled, xs):
    return [compiled._orig_mod(x) for x in xs]


def recompile_limit_one(compiled, xs):
    torch._dynamo.config.recompile_limit = 1  # later sizes silently run eager
    return [compiled(x) for x in xs]


def one_compiled_then_eager(compiled, xs):
    first = compiled(_marked(xs[:1])[0])
    return [first] + [compiled._orig_mod(x) for x in xs[1:]]


def concat_and_split(compiled, xs):
    big = torch.cat(xs)
    torch._dynamo.mark_dynamic(big, 0)
    return list(compiled(big).split([len(x) for x in xs]))


def pad_to_max(compiled, xs):
    top = max(len(x) for x in xs)
    return [compiled(torch.cat([x, x.new_zeros(top - len(x), x.shape[1])]))[: len(x)] for x in xs]


def throwaway_then_eager(compiled, xs):
    compiled(_marked([xs[0].clone()])[0])  # the technique on a throwaway input...
    return [compiled._orig_mod(x) for x in xs]  # ...then the eager answers


def compiled_but_eager_returned(compiled, xs):
    for x in _marked(xs):
        compiled(x)
    return [compiled._orig_mod(x) for x in xs]


def reordered(compiled, xs):
    return [compiled(x) for x in reversed(_marked(xs))]


def bounded_at_32(compiled, xs):
    """A dynamic range bounded at a guessed power of two: the batch above 32 is refused."""
    outs = []
    for x in xs:
        torch._dynamo.mark_dynamic(x, 0, min=2, max=32)
        outs.append(compiled(x))
    return outs


def min_only(compiled, xs):
    """min=1 without max (batch 1 is a valid request): Dynamo cannot build that range."""
    outs = []
    for x in xs:
        torch._dynamo.mark_dynamic(x, 0, min=1)
        outs.append(compiled(x))
    return outs


def clone_after_mark(compiled, xs):
    """Marks x, then calls with x.clone(): the copy carries no mark, so each size compiles its own graph."""
    outs = []
    for x in xs:
        torch._dynamo.mark_dynamic(x, 0)
        outs.append(compiled(x.clone()))
    return outs


def features_marked(compiled, xs):
    """Marks dimension 1 (the features) instead of 0: the Linear layer fixes it, Dynamo refuses."""
    outs = []
    for x in xs:
        torch._dynamo.mark_dynamic(x, 1)
        outs.append(compiled(x))
    return outs


MARK_DYNAMIC_WRONG = [
    (plain_loop, "graphs were compiled"),
    (eager_only, "never ran"),
    (recompile_limit_one, "ran eagerly"),
    (one_compiled_then_eager, "ran eagerly"),
    (concat_and_split, "concatenated"),
    (pad_to_max, "largest batch"),
    (throwaway_then_eager, "ran eagerly"),
    (compiled_but_eager_returned, "differs from what the compiled model returns"),
    (reordered, "expected an output of shape"),
    (bounded_at_32, "outside the range marked dynamic"),
    (min_only, "only min= or only max="),
    (clone_after_mark, "graphs were compiled"),
    (features_marked, "not the batch, the model fixes its size"),
]


def test_mark_dynamic_undoes_the_learners_recompile_limit():
    before = torch._dynamo.config.recompile_limit
    verdict("06.mark-dynamic", recompile_limit_one)
    assert torch._dynamo.config.recompile_limit == before


# ------------------------------------------------------------------ 06.pad-batch


def no_padding(compiled, x, size):
    return compiled(x)


def padded_rows_returned(compiled, x, size):
    outs = []
    for chunk in x.split(size):
        outs.append(compiled(torch.cat([chunk, chunk.new_zeros(size - len(chunk), *chunk.shape[1:])])))
    return torch.cat(outs)


def refuses_large(compiled, x, size):
    if len(x) > size:
        raise ValueError("batch too large")
    return compiled(torch.cat([x, x.new_zeros(size - len(x), *x.shape[1:])]))[: len(x)]


def remainder_eager(compiled, x, size):
    outs = []
    for chunk in x.split(size):
        outs.append(compiled(chunk) if len(chunk) == size else compiled._orig_mod(chunk))
    return torch.cat(outs)


def padded_throwaway_then_eager(compiled, x, size):
    for chunk in x.split(size):
        compiled(torch.cat([chunk, chunk.new_zeros(size - len(chunk), *chunk.shape[1:])]))
    return compiled._orig_mod(x)


def row_by_row(compiled, x, size):
    return torch.cat([compiled(torch.cat([r[None], r.new_zeros(size - 1, *r.shape)]))[:1] for r in x])


def full_chunks_only(compiled, x, size):
    """Pads only a request smaller than size; of a larger one, runs the full chunks and drops the remainder."""
    if len(x) < size:
        return compiled(torch.cat([x, x.new_zeros(size - len(x), *x.shape[1:])]))[: len(x)]
    return torch.cat([compiled(x[i * size : (i + 1) * size]) for i in range(len(x) // size)])


def pad_whole_to_next_multiple(compiled, x, size):
    """Pads by size - n % size: a request of exactly size (or a multiple) gets a whole chunk of zeros more."""
    n = len(x)
    padded = torch.cat([x, x.new_zeros(size - n % size, *x.shape[1:])])
    return torch.cat([compiled(chunk) for chunk in padded.split(size)])[:n]


def zeros_without_device(compiled, x, size):  # torch.zeros(...): a CPU float32 tensor, whatever x is
    outs = []
    for chunk in x.split(size):
        n = len(chunk)
        if n < size:
            chunk = torch.cat([chunk, torch.zeros(size - n, *chunk.shape[1:])])
        outs.append(compiled(chunk)[:n])
    return torch.cat(outs)


def zeros_without_dtype(compiled, x, size):  # device= given, dtype= not: torch.cat promotes the chunk to float32
    outs = []
    for chunk in x.split(size):
        n = len(chunk)
        if n < size:
            chunk = torch.cat([chunk, torch.zeros(size - n, *chunk.shape[1:], device=x.device)])
        outs.append(compiled(chunk)[:n])
    return torch.cat(outs)


def zeros_without_device_only(compiled, x, size):  # dtype= given, device= not
    outs = []
    for chunk in x.split(size):
        n = len(chunk)
        if n < size:
            chunk = torch.cat([chunk, torch.zeros(size - n, *chunk.shape[1:], dtype=x.dtype)])
        outs.append(compiled(chunk)[:n])
    return torch.cat(outs)


PAD_DEVICE_WRONG = [
    (
        zeros_without_device,
        r"on cuda in torch\.(float16|bfloat16): a request of \d+ rows on cuda failed: Expected all "
        r"tensors to be on the same device.*torch\.zeros\(\.\.\.\) without device=",
    ),
    (
        zeros_without_dtype,
        r"reached the compiled model as torch\.float32, the request was torch\.(float16|bfloat16): "
        r"torch\.zeros\(\.\.\.\) makes float32 unless given dtype=",
    ),
    (zeros_without_device_only, r"Expected all tensors to be on the same device.*without device="),
]


PAD_WRONG = [
    *PAD_DEVICE_WRONG,
    (no_padding, "compiled a new graph"),
    (padded_rows_returned, "slice off the padding"),
    (refuses_large, "split it into chunks"),
    (remainder_eager, "pad to|compiled call"),  # which request comes first is random
    (padded_throwaway_then_eager, "differs from what the compiled model returns"),
    (row_by_row, "compiled call"),
    (full_chunks_only, "every row needs its output"),
    (pad_whole_to_next_multiple, "compiled call"),
]


# ------------------------------------------------------------------ 06.export


def traced(model, example, max_batch):
    with pytest.warns(Warning):
        return torch.jit.trace(model, example)


def static_export(model, example, max_batch):
    return torch.export.export(model, example)


def separate_dims(model, example, max_batch):
    a, b = torch.export.Dim("a", min=1, max=max_batch), torch.export.Dim("b", min=1, max=max_batch)
    return torch.export.export(model, example, dynamic_shapes=({0: a}, {0: b}))


def range_too_small(model, example, max_batch):
    batch = torch.export.Dim("batch", min=1, max=16)
    return torch.export.export(model, example, dynamic_shapes=({0: batch}, {0: batch}))


def module_returned(model, example, max_batch):
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    return torch.export.export(model, example, dynamic_shapes=({0: batch}, {0: batch})).module()


def compiled_returned(model, example, max_batch):
    return torch.compile(model)


def min_two(model, example, max_batch):
    """min=2, as in examples that avoid the 0/1 specialization: batch 1 is outside the range."""
    batch = torch.export.Dim("batch", min=2, max=max_batch)
    return torch.export.export(model, example, dynamic_shapes=({0: batch}, {0: batch}))


def auto_dims(model, example, max_batch):
    """Dim.AUTO: one symbol (the broadcast ties them), but its range starts at 2."""
    return torch.export.export(model, example, dynamic_shapes=({0: torch.export.Dim.AUTO}, {0: torch.export.Dim.AUTO}))


def x_dynamic_only(model, example, max_batch):
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    return torch.export.export(model, example, dynamic_shapes=({0: batch}, None))


EXPORT_WRONG = [
    (traced, "torch.jit.trace is legacy"),
    (static_export, "specialized"),
    (separate_dims, "must always be equal"),
    (range_too_small, "must cover"),
    (module_returned, "return the torch.export.ExportedProgram"),
    (compiled_returned, "torch.compile is not an export"),
    (min_two, "must cover 1"),
    (auto_dims, "must cover 1"),
    (x_dynamic_only, "your export raised UserError: Constraints violated"),
]


# ------------------------------------------------------------------ every answer, many seeds
# Dynamo traces the graphs of every call (0.1-0.6 s a call here, most of it in Dynamo's tracer), so the full check
# of every answer runs FULL seeds, the references more; what each rejection needs from the drawn case (distinct
# sizes below the recompile limit, a request below, at and above the captured batch, the watermark beyond the FP32
# tolerance, a batch range wider than the usual small Dims) is checked on the cases of 200 seeds.
FULL = range(8)
SWEEP = range(200)


def marked_first(compiled, xs):  # right too: every batch marked before the loop
    for x in xs:
        torch._dynamo.mark_dynamic(x, 0)
    return [compiled(x) for x in xs]


def f_pad(compiled, x, size):  # right too: torch.nn.functional.pad on the last chunk
    outs = []
    for chunk in x.split(size):
        n = len(chunk)
        outs.append(compiled(torch.nn.functional.pad(chunk, (0, 0, 0, size - n)))[:n])
    return torch.cat(outs)


def named_shapes(model, example, max_batch):  # right too: dynamic_shapes keyed by argument name
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    return torch.export.export(model, example, dynamic_shapes={"x": {0: batch}, "mask": {0: batch}})


def bounded_by_the_batches(compiled, xs):  # right too: min and max covering every batch given
    top = max(len(x) for x in xs)
    for x in xs:
        torch._dynamo.mark_dynamic(x, 0, min=2, max=top)
    return [compiled(x) for x in xs]


def zeros_with_device_and_dtype(compiled, x, size):  # right too: torch.zeros with device= and dtype= of x
    outs = []
    for chunk in x.split(size):
        n = len(chunk)
        if n < size:
            chunk = torch.cat([chunk, torch.zeros(size - n, *chunk.shape[1:], device=x.device, dtype=x.dtype)])
        outs.append(compiled(chunk)[:n])
    return torch.cat(outs)


def chunked_evenly(compiled, x, size):  # right too: x.chunk into ceil(n / size) pieces, each padded to size
    outs = []
    for chunk in x.chunk(-(-len(x) // size)):
        outs.append(compiled(torch.nn.functional.pad(chunk, (0, 0, 0, size - len(chunk))))[: len(chunk)])
    return torch.cat(outs)


def maybe_marked(compiled, xs):  # right too: maybe_mark_dynamic (no batch of 1 to specialize here)
    for x in xs:
        torch._dynamo.maybe_mark_dynamic(x, 0)
    return [compiled(x) for x in xs]


def decomposed(model, example, max_batch):  # right too: an ExportedProgram after run_decompositions
    batch = torch.export.Dim("batch", max=max_batch)
    return torch.export.export(model, example, dynamic_shapes=({0: batch}, {0: batch})).run_decompositions()


RIGHT = {
    "06.mark-dynamic": [marked_first, bounded_by_the_batches, maybe_marked],
    "06.pad-batch": [f_pad, chunked_evenly, zeros_with_device_and_dtype],
    "06.export": [named_shapes, decomposed],
}
WRONG = {"06.mark-dynamic": MARK_DYNAMIC_WRONG, "06.pad-batch": PAD_WRONG, "06.export": EXPORT_WRONG}


@pytest.mark.parametrize("key", sorted(RIGHT))
def test_references_and_right_alternatives_accepted_on_many_seeds(key):
    for seed in range(30):
        assert verdict(key, exercises.get(key).solution, seed=seed) == "accepted", (key, seed)
    for fn in RIGHT[key]:
        for seed in FULL:
            assert verdict(key, fn, seed=seed) == "accepted", (key, fn.__name__, seed)


@pytest.mark.parametrize("key", sorted(WRONG))
def test_every_wrong_answer_rejected_with_its_reason_on_every_full_seed(key):
    for fn, reason in WRONG[key]:
        for seed in FULL:
            msg = verdict(key, fn, seed=seed)
            assert re.search(reason, msg) and f"random case seed {seed}" in msg, (fn.__name__, seed, msg)


def _watermark_seen(model, xs):
    """The compiled graphs' watermark is outside the FP32 tolerance on every input: eager answers are told apart."""
    from course_checks.lesson_exercises.l06 import WATERMARK
    from course_utils.measuring.outputs import compare_outputs

    with torch.no_grad():
        return all(not compare_outputs(model(*x), model(*x) * WATERMARK, "fp32").within for x in xs)


def test_every_drawn_case_holds_what_rejects_each_wrong_answer_on_200_seeds():
    from course_checks.lesson_exercises import l06
    from course_checks.lesson_exercises.observe import Cases

    limit = torch._dynamo.config.recompile_limit
    for seed in SWEEP:
        model, sizes, batches = l06.mark_dynamic_case(Cases(seed))
        assert [len(b) for b in batches] == sizes and len(set(sizes)) == len(sizes), seed  # reordered, pad_to_max
        assert 4 <= len(sizes) < limit, seed  # plain_loop: one graph per size, none left to eager by the limit
        assert sum(sizes) not in sizes, seed  # concat_and_split: the one call is told from a single batch
        assert max(sizes) > 32, seed  # bounded_at_32
        assert _watermark_seen(model, [(b,) for b in batches]), seed  # eager outputs returned

        model, size, capture, requests = l06.pad_case(Cases(seed))
        rows = sorted(len(x) for x in requests)
        assert capture.shape[0] == size >= 4 and rows[0] < size == rows[1] < rows[2] <= 3 * size, seed
        assert rows[0] % size and size > 1, seed  # padded rows returned, remainder eager, row by row
        assert rows[2] % size, seed  # full_chunks_only: the large request leaves a remainder
        assert _watermark_seen(model, [(x,) for x in requests]), seed

        model, features, example, max_batch = l06.export_case(Cases(seed))
        assert example[0].shape == (3, features) and example[1].shape == (3, 1), seed  # batch 3: not specialized
        assert 16 < max_batch and (example[1] > 0).all(), seed  # range_too_small (max 16); the mask is positive


def test_pad_batch_on_the_device_in_16_bits_over_200_seeds():
    """The check's device part (16-bit requests on the stand-in GPU through a graph captured for that device and
    dtype) on seeds 0-199: the reference and the right alternatives are accepted, padding made with torch.zeros
    without device= or dtype= is named on every seed; both dtypes and a remainder on every request are drawn."""
    from course_checks.lesson_exercises import l06
    from course_checks.lesson_exercises.observe import Cases, gpu

    dtypes = set()
    with gpu() as device:
        for seed in SWEEP:
            model, size, dtype, requests = l06.pad_device_case(Cases(seed))
            dtypes.add(dtype)
            assert dtype in (torch.float16, torch.bfloat16) and all(len(x) % size for x in requests), seed
            assert sorted(len(x) < size for x in requests) == [False, True], seed
            for fn in (exercises.get("06.pad-batch").solution, *RIGHT["06.pad-batch"]):
                assert "padded to" in l06.serve_on_device(fn, Cases(seed), device), (seed, fn.__name__)
            for fn, reason in PAD_DEVICE_WRONG:
                with pytest.raises(AssertionError) as err:
                    l06.serve_on_device(fn, Cases(seed), device)
                assert re.search(reason, str(err.value)), (seed, fn.__name__, str(err.value))
    assert dtypes == {torch.float16, torch.bfloat16}


def test_the_full_check_serves_16_bit_requests_on_the_gpu():
    """The check itself (not only its device part) names padding made with plain torch.zeros, on a few seeds."""
    for seed in (0, 1):
        for fn, reason in PAD_DEVICE_WRONG:
            msg = verdict("06.pad-batch", fn, seed=seed)
            assert re.search(reason, msg) and f"random case seed {seed}" in msg, (fn.__name__, seed, msg)
