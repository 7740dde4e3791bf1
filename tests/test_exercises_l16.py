"""Lesson 16's exercises: the checkers accept the reference and equivalent answers, and reject the usual mistakes
with a reason naming them (continuous-batching admission; speculative verification)."""

from __future__ import annotations

from collections import deque

import pytest
import torch

from course_checks import exercises
from course_checks.lesson_exercises import l16

SEEDS = range(200)  # every wrong answer is rejected, and every right one accepted, on each of these seeds


def admit_verdict(fn, seed=None) -> str:
    return exercises.verdict("16.admit", fn, seed=seed)


def verify_verdict(fn, seed=None) -> str:
    return exercises.verdict("16.verify", fn, seed=seed)


# ---------------------------------------------------------------- 16.admit
def admit_in_place(running, waiting, max_slots):  # equivalent: mutates the list it was given
    running[:] = [s for s in running if not s.done]
    for _ in range(min(max_slots - len(running), len(waiting))):
        running.append(waiting.popleft())
    return running


def static_batching(running, waiting, max_slots):  # admits only once the whole batch has finished
    kept = [s for s in running if not s.done]
    if not kept:
        while waiting and len(kept) < max_slots:
            kept.append(waiting.popleft())
    return kept


def beyond_capacity(running, waiting, max_slots):
    kept = [s for s in running if not s.done]
    while waiting:
        kept.append(waiting.popleft())
    return kept


def newest_first(running, waiting, max_slots):  # LIFO: the oldest requests starve
    kept = [s for s in running if not s.done]
    while waiting and len(kept) < max_slots:
        kept.append(waiting.pop())
    return kept


def no_retire(running, waiting, max_slots):  # finished sequences keep their slots
    kept = list(running)
    while waiting and len(kept) < max_slots:
        kept.append(waiting.popleft())
    return kept


def one_per_step(running, waiting, max_slots):
    kept = [s for s in running if not s.done]
    if waiting and len(kept) < max_slots:
        kept.append(waiting.popleft())
    return kept


def peek_without_pop(running, waiting, max_slots):  # admits but leaves the requests in the queue
    kept = [s for s in running if not s.done]
    for s in list(waiting)[: max_slots - len(kept)]:
        kept.append(s)
    return kept


def preempts(running, waiting, max_slots):  # drops a running sequence to make room for newcomers
    kept = [s for s in running if not s.done][: max_slots // 2]
    while waiting and len(kept) < max_slots:
        kept.append(waiting.popleft())
    return kept


def admit_deque_rotation(running, waiting, max_slots):  # equivalent: counts the free slots first
    kept = [s for s in running if not s.done]
    free = max_slots - len(kept)
    kept += [waiting.popleft() for _ in range(min(free, len(waiting)))]
    return kept


def admit_before_retire(running, waiting, max_slots):  # admits into the slots of the running list, then retires
    kept = list(running)
    while waiting and len(kept) < max_slots:
        kept.append(waiting.popleft())
    return [s for s in kept if not s.done]


def off_by_one_capacity(running, waiting, max_slots):
    kept = [s for s in running if not s.done]
    while waiting and len(kept) <= max_slots:
        kept.append(waiting.popleft())
    return kept


def admit_no_empty_check(running, waiting, max_slots):  # pops until full, even from an empty queue
    kept = [s for s in running if not s.done]
    while len(kept) < max_slots:
        kept.append(waiting.popleft())
    return kept


def free_slots_before_retiring(running, waiting, max_slots):  # the retired sequences' slots stay idle a step
    free = max_slots - len(running)
    kept = [s for s in running if not s.done]
    kept += [waiting.popleft() for _ in range(min(free, len(waiting)))]
    return kept


def remove_while_iterating(running, waiting, max_slots):  # list.remove inside `for s in running`: skips the next
    for s in running:
        if s.done:
            running.remove(s)
    while len(running) < max_slots and waiting:
        running.append(waiting.popleft())
    return running


def test_admit_reference_and_equivalents_are_accepted_on_every_seed():
    for fn in (l16.admit_step, admit_in_place, admit_deque_rotation):
        bad = {s: v for s in SEEDS if (v := admit_verdict(fn, s)) != "accepted"}
        assert not bad, f"{fn.__name__}: {bad}"


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (static_batching, "static batching"),
        (beyond_capacity, "max_slots"),
        (newest_first, "first come, first served"),
        (no_retire, "retire every sequence"),
        (one_per_step, "keep admitting while a slot is free"),
        (peek_without_pop, "popleft"),
        (preempts, "keep every sequence not done"),
        (admit_before_retire, "slot(s) idle while"),
        (off_by_one_capacity, "max_slots"),
        (lambda running, waiting, max_slots: None, "return the new running list"),
        (admit_no_empty_check, "AND the queue is not empty"),
        (free_slots_before_retiring, "count them after removing the finished sequences"),
        (remove_while_iterating, "removing from a list while iterating over it skips"),
    ],
)
def test_wrong_admission_is_rejected_with_its_reason_on_every_seed(answer, reason):
    for seed in SEEDS:
        verdict = admit_verdict(answer, seed)
        assert reason in verdict and f"seed {seed}" in verdict, (seed, verdict)


def test_admit_unsolved_counts_as_not_attempted(capsys):
    def stub(running, waiting, max_slots):
        raise NotImplementedError

    exercises.check("16.admit", stub)
    assert "not solved yet" in capsys.readouterr().out


def test_admit_checker_pins_one_simulated_step():
    """A known case: 2 slots, one finished and one running sequence, three waiting: exactly one is admitted."""
    done, busy = l16._Seq(0, 0), l16._Seq(1, 3)
    queue = deque([l16._Seq(2, 1), l16._Seq(3, 1), l16._Seq(4, 1)])
    out = l16.admit_step([done, busy], queue, 2)
    assert [s.rid for s in out] == [1, 2] and [s.rid for s in queue] == [3, 4]


# ---------------------------------------------------------------- 16.verify
def scores(target, context, draft):
    logits = target(torch.tensor([context + draft]))
    return logits[0, len(context) - 1 :].argmax(-1).tolist()


def verify_tensor_answer(target, context, draft):  # equivalent: returns a tensor, vectorized prefix
    choice = target(torch.tensor([context + draft]))[0, len(context) - 1 :].argmax(-1)
    match = (torch.tensor(draft, dtype=torch.long) == choice[: len(draft)]).long().cumprod(0)
    n = int(match.sum())
    return torch.tensor(draft[:n] + [int(choice[n])])


def accept_whole_draft(target, context, draft):
    choice = scores(target, context, draft)
    return draft + [choice[len(draft)]]


def drop_bonus(target, context, draft):
    choice = scores(target, context, draft)
    n = 0
    while n < len(draft) and draft[n] == choice[n]:
        n += 1
    return draft[:n]


def off_by_one(target, context, draft):  # compares draft[i] with the choice AFTER it
    logits = target(torch.tensor([context + draft]))
    choice = logits[0, len(context) :].argmax(-1).tolist() + [0]
    n = 0
    while n < len(draft) and draft[n] == choice[n]:
        n += 1
    return draft[:n] + [choice[n]]


def token_by_token(target, context, draft):  # plain decoding: k target calls
    out = []
    for d in draft:
        t = int(target(torch.tensor([context + out]))[0, -1].argmax())
        out.append(t)
        if t != d:
            return out
    return out + [int(target(torch.tensor([context + out]))[0, -1].argmax())]


def ignore_draft(target, context, draft):  # one call, one token: correct but no speculation
    return [int(target(torch.tensor([context]))[0, -1].argmax())]


def keep_rejected_token(target, context, draft):  # appends the draft's token at the mismatch
    choice = scores(target, context, draft)
    n = 0
    while n < len(draft) and draft[n] == choice[n]:
        n += 1
    return draft[: n + 1] if n < len(draft) else draft + [choice[n]]


def verify_numpy_answer(target, context, draft):  # equivalent: numpy int64 tokens
    import numpy as np

    choice = target(torch.tensor([context + draft]))[0, len(context) - 1 :].argmax(-1).numpy()
    n = 0
    while n < len(draft) and draft[n] == choice[n]:
        n += 1
    return np.array([*draft[:n], choice[n]], dtype=np.int64)


def count_every_match(target, context, draft):  # counts matches past the first mismatch as if a prefix
    choice = scores(target, context, draft)
    n = sum(d == c for d, c in zip(draft, choice, strict=False))
    return draft[:n] + [choice[n]]


def skip_mismatches(target, context, draft):  # keeps every matching draft token, skipping the wrong ones
    choice = scores(target, context, draft)
    kept = [d for d, c in zip(draft, choice, strict=False) if d == c]
    return kept + [choice[len(kept)]]


def logits_without_last(target, context, draft):  # drops the last position: no bonus after a full acceptance
    choice = target(torch.tensor([context + draft]))[0, len(context) - 1 : -1].argmax(-1).tolist()
    n = 0
    while n < len(draft) and draft[n] == choice[n]:
        n += 1
    return draft[:n] + choice[n : n + 1]


def lenient_top2(target, context, draft):  # accepts a draft token the model ranks first or second
    top = target(torch.tensor([context + draft]))[0, len(context) - 1 :].topk(2, dim=-1).indices.tolist()
    n = 0
    while n < len(draft) and draft[n] in top[n]:
        n += 1
    return draft[:n] + [top[n][0]]


def lenient_top3(target, context, draft):
    top = target(torch.tensor([context + draft]))[0, len(context) - 1 :].topk(3, dim=-1).indices.tolist()
    n = 0
    while n < len(draft) and draft[n] in top[n]:
        n += 1
    return draft[:n] + [top[n][0]]


def test_verify_reference_and_equivalents_are_accepted_on_every_seed():
    for fn, seeds in ((l16.verify_draft, SEEDS), (verify_tensor_answer, range(50)), (verify_numpy_answer, range(50))):
        bad = {s: v for s in seeds if (v := verify_verdict(fn, s)) != "accepted"}
        assert not bad, f"{fn.__name__}: {bad}"


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (accept_whole_draft, "accepted the whole draft"),
        (drop_bonus, "dropped the model's own token"),
        (off_by_one, "off by one"),
        (token_by_token, "token by token"),
        (ignore_draft, "call it once on context + draft"),
        (keep_rejected_token, "MODEL's token"),
        (lenient_top2, "among the model's top 2 choices"),
        (lenient_top3, "among the model's top 3 choices"),
        (lambda target, context, draft: draft, "verify never called target"),
        (count_every_match, "accepted a draft token after the first mismatch"),
        (skip_mismatches, "accepted a draft token after the first mismatch"),
        (logits_without_last, "no token after a wholly accepted draft"),
    ],
)
def test_wrong_verification_is_rejected_with_its_reason_on_every_seed(answer, reason):
    for seed in SEEDS:
        verdict = verify_verdict(answer, seed)
        assert reason in verdict and f"seed {seed}" in verdict, (seed, verdict)


def test_verify_checker_pins_a_known_case():
    """On the checker's own model: a right draft of 3 gives 4 tokens, the runner-up as first token gives 1."""
    model = l16.TinyCausalLM(7)
    prompt = [3, 1, 4, 1, 5]
    ref, ranked = l16._greedy(model, prompt, 5)
    assert ranked[:, 0].tolist() == ref, "rank 0 is greedy's own token"
    target = l16._Target(model)
    assert l16.verify_draft(target, prompt, ref[:3]) == ref[:4]
    wrong = [int(ranked[0, 1]), ref[1]]
    assert l16.verify_draft(target, prompt, wrong) == ref[:1]
    assert target.calls == 2
    assert lenient_top2(target, prompt, wrong) != ref[:1], "the runner-up is what a top-2 rule wrongly accepts"


def test_every_call_draws_a_runner_up_as_a_wrong_draft():
    """The drawing core, over the seeds: each call has a 'near' case, whose every draft's first wrong token is the
    model's second choice (so a top-2 or top-3 rule is caught on every seed)."""
    import random

    for seed in SEEDS:
        rng = random.Random(seed)
        ranked = torch.stack([torch.randperm(48, generator=torch.Generator().manual_seed(seed + i)) for i in range(9)])
        right = ranked[:, 0].tolist()
        draft = l16.draw_drafts(rng, "near", right, ranked)
        m = next(i for i, (d, r) in enumerate(zip(draft, right, strict=False)) if d != r)
        assert draft[m] == int(ranked[m, 1])


def empty_draft_nothing(target, context, draft):  # nothing back for an empty draft: the lesson's loop would spin
    if not draft:
        return []
    return l16.verify_draft(target, context, draft)


def threshold_half(target, context, draft):  # accepts a draft token only when p > 0.5 (not: when it is the argmax)
    logits = target(torch.tensor([context + draft]))[0, len(context) - 1 :]
    p, choice = logits.softmax(-1), logits.argmax(-1).tolist()
    n = 0
    while n < len(draft) and float(p[n, draft[n]]) > 0.5:
        n += 1
    return draft[:n] + [choice[n]]


def threshold_09(target, context, draft):
    logits = target(torch.tensor([context + draft]))[0, len(context) - 1 :]
    p, choice = logits.softmax(-1), logits.argmax(-1).tolist()
    n = 0
    while n < len(draft) and float(p[n, draft[n]]) > 0.9:
        n += 1
    return draft[:n] + [choice[n]]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (empty_draft_nothing, "an empty draft"),
        (threshold_half, "accepted a draft token only when its probability was above a threshold"),
        (threshold_09, "accepted a draft token only when its probability was above a threshold"),
    ],
)
def test_empty_drafts_and_probability_thresholds_are_caught_with_their_reason(answer, reason):
    for seed in range(100):
        verdict = verify_verdict(answer, seed)
        assert reason in verdict and f"seed {seed}" in verdict, (seed, verdict)


def test_the_flat_model_puts_greedy_tokens_under_probability_one_half():
    model = l16.TinyCausalLM(3, scale=1.0)
    with torch.inference_mode():
        p = model(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]]))[0].softmax(-1).max(-1).values
    assert float(p.min()) < 0.5
