"""Lesson 06's exercise checkers reject wrong submissions, with the reason (and accept the references)."""

from __future__ import annotations

import re

import pytest
import torch

from course_utils.check import exercises
from course_utils.check.exercises import verdict


@pytest.mark.parametrize("key", ["06.mark-dynamic", "06.pad-batch", "06.export"])
def test_reference_passes(key):
    assert verdict(key, exercises.get(key).solution) == "accepted"


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
]


@pytest.mark.parametrize("fn, reason", MARK_DYNAMIC_WRONG, ids=[f.__name__ for f, _ in MARK_DYNAMIC_WRONG])
def test_mark_dynamic_rejects(fn, reason):
    msg = verdict("06.mark-dynamic", fn)
    assert reason in msg, msg
    assert "random case seed" in msg


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


PAD_WRONG = [
    (no_padding, "compiled a new graph"),
    (padded_rows_returned, "slice off the padding"),
    (refuses_large, "split it into chunks"),
    (remainder_eager, "pad to|compiled call"),  # which request comes first is random
    (padded_throwaway_then_eager, "differs from what the compiled model returns"),
    (row_by_row, "compiled call"),
]


@pytest.mark.parametrize("fn, reason", PAD_WRONG, ids=[f.__name__ for f, _ in PAD_WRONG])
def test_pad_batch_rejects(fn, reason):
    msg = verdict("06.pad-batch", fn)
    assert re.search(reason, msg), msg


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


EXPORT_WRONG = [
    (traced, "torch.jit.trace is legacy"),
    (static_export, "specialized"),
    (separate_dims, "must always be equal"),
    (range_too_small, "must cover"),
    (module_returned, "return the torch.export.ExportedProgram"),
    (compiled_returned, "torch.compile is not an export"),
]


@pytest.mark.parametrize("fn, reason", EXPORT_WRONG, ids=[f.__name__ for f, _ in EXPORT_WRONG])
def test_export_rejects(fn, reason):
    msg = verdict("06.export", fn)
    assert reason in msg, msg
