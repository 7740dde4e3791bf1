"""Lesson 17's exercise: the row-parallel checker accepts the reference and correct alternatives and rejects the
honest mistakes with a message naming them, over 200 seeds.

The rank processes start once per module (one 3-rank gloo world); every seed's cases run inside it, so 200 seeds
cost seconds, not minutes. One test goes through ``exercises.verdict`` (its own world, as a learner's call does).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_checks import exercises
from course_checks.lesson_exercises import l17
from course_utils.from_lessons.l17_beyond_one_device import World

SEEDS = range(200)


@pytest.fixture(scope="module")
def world():
    with World(3, timeout_s=60.0) as w:
        yield w


def verdicts(world, fn, seeds=SEEDS):
    return [l17.check_in_world(world, fn, s) for s in seeds]


# ---------------------------------------------------------------- correct answers
def bias_on_rank_zero(x, linear, group):  # correct: the bias added by one rank before the sum
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    y = x[..., rank * k : (rank + 1) * k] @ linear.weight[:, rank * k : (rank + 1) * k].T
    if rank == 0 and linear.bias is not None:
        y = y + linear.bias
    dist.all_reduce(y, group=group)
    return y


def chunked(x, linear, group):  # correct: tensor.chunk along the input dimension
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    xs = x.chunk(p, dim=-1)[rank]
    ws = linear.weight.chunk(p, dim=1)[rank]
    y = torch.matmul(xs, ws.t())
    torch.distributed.all_reduce(y, op=torch.distributed.ReduceOp.SUM, group=group)
    if linear.bias is not None:
        y += linear.bias
    return y


# ---------------------------------------------------------------- honest mistakes
def no_all_reduce(x, linear, group):
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    y = F.linear(x[..., rank * k : (rank + 1) * k], linear.weight[:, rank * k : (rank + 1) * k])
    return y if linear.bias is None else y + linear.bias


def reduces_a_copy(x, linear, group):  # all_reduce is in place: the copy is summed, the returned y is not
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    y = F.linear(x[..., rank * k : (rank + 1) * k], linear.weight[:, rank * k : (rank + 1) * k])
    dist.all_reduce(y.clone(), group=group)
    return y if linear.bias is None else y + linear.bias


def reduces_the_input(x, linear, group):  # the all-reduce on the input slice instead of the output
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    xs = x[..., rank * k : (rank + 1) * k].contiguous()
    dist.all_reduce(xs, group=group)
    y = F.linear(xs, linear.weight[:, rank * k : (rank + 1) * k])
    return y if linear.bias is None else y + linear.bias


def bias_every_rank(x, linear, group):
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    y = F.linear(x[..., rank * k : (rank + 1) * k], linear.weight[:, rank * k : (rank + 1) * k], linear.bias)
    dist.all_reduce(y, group=group)
    return y


def wrong_dim(x, linear, group):  # the weight's rows (output features) instead of its columns
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    w = linear.weight.chunk(p, dim=0)[rank]
    y = x[..., rank * k : (rank + 1) * k] @ w
    dist.all_reduce(y, group=group)
    return y if linear.bias is None else y + linear.bias


def whole_layer(x, linear, group):  # right values, nothing split
    return linear(x)


def averages(x, linear, group):
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    y = F.linear(x[..., rank * k : (rank + 1) * k], linear.weight[:, rank * k : (rank + 1) * k])
    dist.all_reduce(y, op=dist.ReduceOp.AVG, group=group)
    return y if linear.bias is None else y + linear.bias


def default_group(x, linear, group):  # the collective over every process, not the layer's group
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    y = F.linear(x[..., rank * k : (rank + 1) * k], linear.weight[:, rank * k : (rank + 1) * k])
    dist.all_reduce(y)
    return y if linear.bias is None else y + linear.bias


def global_world_size(x, linear, group):  # dist.get_world_size() of every process, not of the layer's group
    rank, p = dist.get_rank(group), dist.get_world_size()
    k = linear.in_features // p
    y = F.linear(x[..., rank * k : (rank + 1) * k], linear.weight[:, rank * k : (rank + 1) * k])
    dist.all_reduce(y, group=group)
    return y if linear.bias is None else y + linear.bias


def global_rank(x, linear, group):  # dist.get_rank(): the process's rank, not its rank within the group
    rank, p = dist.get_rank(), dist.get_world_size(group)
    k = linear.in_features // p
    y = F.linear(x[..., rank * k : (rank + 1) * k], linear.weight[:, rank * k : (rank + 1) * k])
    dist.all_reduce(y, group=group)
    return y if linear.bias is None else y + linear.bias


def async_without_wait(x, linear, group):  # async_op=True, the Work handle never waited on
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    y = F.linear(x[..., rank * k : (rank + 1) * k], linear.weight[:, rank * k : (rank + 1) * k])
    dist.all_reduce(y, group=group, async_op=True)
    return y if linear.bias is None else y + linear.bias


def sum_then_divide(x, linear, group):  # summed (right op), then divided by the number of ranks
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    y = F.linear(x[..., rank * k : (rank + 1) * k], linear.weight[:, rank * k : (rank + 1) * k])
    dist.all_reduce(y, group=group)
    y = y / p
    return y if linear.bias is None else y + linear.bias


def doubled(x, linear, group):  # a numeric mistake with no named cause: the sum counted twice
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    y = F.linear(x[..., rank * k : (rank + 1) * k], linear.weight[:, rank * k : (rank + 1) * k])
    dist.all_reduce(y, group=group)
    return 2 * y if linear.bias is None else 2 * y + linear.bias


def skips_on_the_last_rank(x, linear, group):  # the last rank of the group never calls the collective: deadlock
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    y = F.linear(x[..., rank * k : (rank + 1) * k], linear.weight[:, rank * k : (rank + 1) * k])
    if rank != p - 1:
        dist.all_reduce(y, group=group)
    return y if linear.bias is None else y + linear.bias


def async_then_wait(x, linear, group):  # correct: async_op=True, waited on before the result is used
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // p
    y = F.linear(x[..., rank * k : (rank + 1) * k], linear.weight[:, rank * k : (rank + 1) * k])
    dist.all_reduce(y, group=group, async_op=True).wait()
    return y if linear.bias is None else y + linear.bias


def test_reference_accepted_on_every_seed(world):
    bad = [(s, v) for s, v in zip(SEEDS, verdicts(world, l17.row_parallel_linear), strict=True) if v != "accepted"]
    assert not bad, f"the reference was rejected: {bad[:2]}"


@pytest.mark.parametrize("answer", [bias_on_rank_zero, chunked, async_then_wait])
def test_correct_alternatives_accepted(world, answer):
    seeds = range(0, 200, 5)  # 40 seeds: each call draws every boundary case
    bad = [(s, v) for s, v in zip(seeds, verdicts(world, answer, seeds), strict=True) if v != "accepted"]
    assert not bad, f"{answer.__name__} rejected: {bad[:2]}"


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (no_all_reduce, "no all_reduce"),
        (reduces_a_copy, "ran on another tensor"),
        (reduces_the_input, "not on the partial output"),
        (bias_every_rank, "bias was added on every rank"),
        (wrong_dim, "wrong dimension"),
        (whole_layer, "nothing was split"),
        (averages, "your all_reduce used dist.ReduceOp.AVG, the partial outputs must be added: dist.ReduceOp.SUM"),
        (sum_then_divide, "the summed output was divided by the number of ranks"),
        (default_group, "pass group=group"),
        (global_world_size, "dist.get_world_size() without the group"),
        (async_without_wait, "never waited on"),
    ],
)
def test_honest_mistakes_rejected_with_their_reason(world, answer, reason):
    for seed, verdict in zip(SEEDS, verdicts(world, answer), strict=True):
        assert reason in verdict, f"seed {seed}: {verdict}"


def test_the_global_rank_is_rejected_with_its_reason(world):
    """40 seeds: only the last case of a call (the group of ranks 1 and 2) shows this mistake, so every seed runs
    all of its cases (as long as the reference's)."""
    seeds = range(0, 200, 5)
    for seed, verdict in zip(seeds, verdicts(world, global_rank, seeds), strict=True):
        assert "dist.get_rank() without the group" in verdict, f"seed {seed}: {verdict}"


def test_a_learner_call_goes_through_verdict_and_check(capsys):
    assert exercises.verdict("17.row-parallel", l17.row_parallel_linear, seed=5) == "accepted"
    assert "no all_reduce" in exercises.verdict("17.row-parallel", no_all_reduce, seed=5)

    def stub(x, linear, group):
        raise NotImplementedError

    exercises.check("17.row-parallel", stub)
    assert "not solved yet" in capsys.readouterr().out


def test_the_cases_hold_the_boundaries():
    import random

    for seed in range(50):
        cs = l17._case_list(random.Random(seed))
        for p in (2, 3):
            mine = [c for c in cs if c["p"] == p]
            assert any(c["in"] == c["out"] for c in mine), "a square layer in every call"
            assert any(c["in"] == p for c in mine), "one-feature shards in every call"
            assert any(not c["bias"] for c in mine) and any(len(c["lead"]) == 2 for c in mine)
            assert all(c["in"] % p == 0 for c in mine)
        assert any(c.get("ranks", [0]) != list(range(c["p"])) for c in cs), "a group that does not start at rank 0"


def test_a_numeric_mismatch_with_no_named_cause_does_not_guess_one(world):
    for seed, verdict in zip(range(0, 200, 10), verdicts(world, doubled, range(0, 200, 10)), strict=True):
        assert "every rank must return linear(x); the largest difference was" in verdict, f"seed {seed}: {verdict}"
        assert "wrong dimension" not in verdict, f"seed {seed}: {verdict}"


def test_a_rank_that_skips_the_collective_is_named_and_no_rank_is_left(capsys):
    """A deadlock: the other ranks wait in all_reduce until the checker stops them all; the verdict says why."""
    import psutil

    before = {c.pid for c in psutil.Process().children(recursive=True)}
    verdict = exercises.verdict("17.row-parallel", skips_on_the_last_rank, seed=3)
    assert "ranks [0] waited in dist.all_reduce while rank(s) [1] returned from your function without calling it" in (
        verdict
    ), verdict
    assert "EVERY rank of the group calls it" in verdict and "The ranks were stopped" in verdict
    left = [
        c
        for c in psutil.Process().children(recursive=True)
        if c.pid not in before and c.status() != psutil.STATUS_ZOMBIE
    ]
    assert not left, f"rank processes left after the verdict: {left}"
