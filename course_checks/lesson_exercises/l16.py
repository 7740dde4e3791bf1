"""Lesson 16 exercises: the admission step of continuous batching, and speculative verification.

* ``16.admit``: ``admit_step(running, waiting, max_slots)`` is checked by simulating a server step by step with
  random arrivals, output lengths and slot counts (seeded per call, the seed printed on failure). After every
  call: no finished sequence still runs (retired the same step), every unfinished one still runs (no
  pre-emption), at most ``max_slots`` run, the admitted ones are the front of the queue in arrival order and have
  left the queue, and no slot is idle while requests wait.
  Every call draws a one-slot server, and requests that finish the step they are admitted.
* ``16.verify``: ``verify(target, context, draft)`` is run inside a speculative decoding loop on a small random
  causal language model with drafts drawn at random (always right, always wrong, partly right, and a wrong token
  followed by the model's own choice after it, which only a rule that goes on past a mismatch accepts). A wrong
  draft token is usually the model's **runner-up** there (its second or third choice), so a lenient acceptance
  rule (the top 2 or 3) is seen to accept it. Every call also decodes with empty drafts only (a draft source that
  found nothing: the model's next token must come back) and with right drafts on a flatter model, whose greedy
  token often has a probability under 0.5 (a probability threshold is seen to reject it). The checker counts
  the calls of ``target`` and records their
  inputs: one call per verification, on the context followed by the whole draft; the returned tokens must be the
  longest matching prefix plus the model's own next token, and the decoded output identical to greedy decoding.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from course_checks.exercises import exercise, observed
from course_checks.lesson_exercises.observe import cases


# ---------------------------------------------------------------- 16.admit
class _Seq:
    """A simulated sequence: done once it has made its tokens."""

    def __init__(self, rid: int, tokens: int) -> None:
        self.rid, self.left = rid, tokens

    @property
    def done(self) -> bool:
        return self.left <= 0

    def __repr__(self) -> str:
        return f"seq{self.rid}" + ("(done)" if self.done else "")


def _check_one_admit_case(fn: Callable[..., Any], rng: random.Random, max_slots: int) -> int:
    """One simulated server; returns the number of steps it ran."""
    n = rng.randint(4 * max_slots, 8 * max_slots)
    arrive = sorted(rng.randint(0, 2 * n // max_slots + 2) for _ in range(n))
    seqs = [_Seq(i, rng.choice([1, 1, 2, 3, 5, 9, 16])) for i in range(n)]  # 1: done the step it is admitted
    waiting: deque = deque()
    running: list = []
    step = 0
    while step <= arrive[-1] or waiting or running:
        waiting.extend(s for s, a in zip(seqs, arrive, strict=True) if a == step)
        before_run, before_wait = list(running), list(waiting)
        try:
            result = fn(running, waiting, max_slots)
        except IndexError as exc:
            raise AssertionError(
                f"step {step}: admit_step raised IndexError ({exc}) with {len(before_wait)} request(s) waiting and "
                f"{len(before_run)} running of {max_slots} slots: admit only while a slot is free AND the queue is "
                "not empty"
            ) from None
        assert isinstance(result, list), f"admit_step must return the new running list, got {type(result).__name__}"
        finished = [s for s in result if s.done]
        # each one left right after a retired one: list.remove inside `for s in running` skips the next element
        skipped = any(r is s for s in finished for r in before_run) and all(
            (i := next(j for j, r in enumerate(before_run) if r is s)) > 0
            and before_run[i - 1].done
            and before_run[i - 1] not in result
            for s in finished
            if any(r is s for r in before_run)
        )
        assert not finished, (
            f"step {step}: finished {finished} still in the running list: retire every sequence whose .done is True "
            "in the same step (before admitting), so its slot goes to a waiting request"
            + (
                f" ({finished[0]} came right after a sequence you retired: removing from a list while iterating "
                "over it skips the element after each removal; build a new list, [s for s in running if not s.done])"
                if skipped
                else ""
            )
        )
        dropped = [s for s in before_run if not s.done and s not in result]
        assert not dropped, f"step {step}: unfinished {dropped} left the running list: keep every sequence not done"
        assert len({id(s) for s in result}) == len(result), f"step {step}: a sequence appears twice in {result}"
        assert len(result) <= max_slots, (
            f"step {step}: {len(result)} sequences running with max_slots={max_slots}: admit only while "
            "len(running) < max_slots"
        )
        admitted = [s for s in result if s not in before_run]
        assert admitted == before_wait[: len(admitted)], (
            f"step {step}: admitted {admitted} but the front of the queue was {before_wait[: len(admitted)]}: "
            "admit first come, first served (waiting.popleft()), or the oldest requests starve"
        )
        assert list(waiting) == before_wait[len(admitted) :], (
            f"step {step}: the queue should hold {before_wait[len(admitted) :]} after admitting {admitted}, it "
            f"holds {list(waiting)}: take each admitted request off the queue with waiting.popleft()"
        )
        if waiting and len(result) < max_slots:
            static = admitted == [] and any(not s.done for s in before_run)
            retired = [s for s in before_run if s.done]
            stale = retired and len(admitted) == max(0, min(max_slots - len(before_run), len(before_wait)))
            raise AssertionError(
                f"step {step}: {max_slots - len(result)} slot(s) idle while {len(waiting)} request(s) wait"
                + (
                    ": that is static batching (admitting only once the whole batch has finished); admit into "
                    "every free slot at every step"
                    if static
                    else f": the {len(retired)} slot(s) retired this step were not filled (if you counted the free "
                    "slots before retiring, count them after removing the finished sequences); keep admitting while "
                    "a slot is free and the queue is not empty"
                    if stale
                    else ": keep admitting while a slot is free and the queue is not empty"
                )
            )
        for s in result:
            s.left -= 1  # one decode step
        running = result
        step += 1
        assert step < 50 * n, "the simulation did not finish: requests are never admitted or never retired"
    return step


def _check_admit(fn: Callable[..., Any]) -> None:
    with cases("16.admit") as c:
        slots = [1, c.randint(2, 3), c.randint(4, 6), c.randint(2, 6)]  # one slot: the smallest server
        steps = [_check_one_admit_case(fn, c.rng, s) for s in slots]
    observed(f"{len(slots)} simulated servers with {slots} slots ({sum(steps)} steps): after every step no finished "
             "sequence ran, none was pre-empted, admissions came first come first served, and no slot was idle "
             "while requests waited")  # fmt: skip


@exercise(
    "16.admit",
    "Keep the running sequences that are not .done, then admit with waiting.popleft() while "
    "len(running) < max_slots and the queue is not empty; return the new list.",
    _check_admit,
)
def admit_step(running: list, waiting: deque, max_slots: int) -> list:
    kept = [s for s in running if not s.done]  # retire finished sequences this step
    free = max_slots - len(kept)
    kept.extend(waiting.popleft() for _ in range(min(free, len(waiting))))  # first come, first served, every slot
    return kept


# ---------------------------------------------------------------- 16.verify
VOCAB = 48


class TinyCausalLM(torch.nn.Module):
    """A small random causal language model: the logits after token t depend on tokens t-2, t-1 and t (random
    tables, scaled so that greedy choices are far from ties). Cheap, so every check decodes several sequences."""

    def __init__(self, seed: int, vocab: int = VOCAB, scale: float = 4.0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.tables = torch.nn.Parameter(torch.randn(3, vocab, vocab, generator=g) * scale, requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = torch.nn.functional.pad(ids, (2, 0), value=0)
        n = ids.shape[-1]
        return self.tables[0][pad[..., 2:]] + self.tables[1][pad[..., 1 : n + 1]] + self.tables[2][pad[..., :n]]


class _Target:
    """The model as the learner sees it: ids (1, n) -> logits (1, n, vocab); calls and inputs recorded."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.calls, self.inputs = model, 0, []

    def __call__(self, ids: Any) -> torch.Tensor:
        self.calls += 1
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.dim() == 1:
            ids = ids[None]
        self.inputs.append(ids[0].tolist())
        with torch.inference_mode():
            return self.model(ids)


def _greedy(model: TinyCausalLM, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding: the ``n`` new tokens, and the tokens ranked by the model at each of their positions.

    Each step reads only the last three tokens (the same sums the full forward computes, in the same order)."""
    ids = [0, 0, *prompt]
    t0, t1, t2 = model.tables.detach()
    for _ in range(n):
        ids.append(int((t0[ids[-1]] + t1[ids[-2]] + t2[ids[-3]]).argmax()))
    with torch.inference_mode():
        ranked = model(torch.tensor([ids[2:]]))[0, len(prompt) - 1 : -1].argsort(-1, descending=True)
    return ids[2 + len(prompt) :], ranked


def _accepted(draft: list[int], order: torch.Tensor, top: int = 1, shift: int = 0) -> int:
    """How many draft tokens a rule accepts: draft[i] while it is among the model's ``top`` choices at position
    i + shift (``order``: the tokens ranked per position, from len(context) - 1 on)."""
    n = 0
    while n < len(draft) and 0 <= n + shift < len(order) and draft[n] in order[n + shift, :top].tolist():
        n += 1
    return n


def _bonus(order: torch.Tensor, n: int, shift: int = 0) -> int:
    return int(order[min(max(n + shift, 0), len(order) - 1), 0])


# Wrong verification rules a learner writes: what each returns, whether its last token is its own business (a
# shifted rule runs past the logits), and what it gets wrong.
_OFF_BY_ONE = (
    "off by one in the accepted prefix: draft[i] is checked against the model's choice at position "
    "len(context) - 1 + i (the logits of the token before it)"
)
_AFTER_MISMATCH = (
    "accepted a draft token after the first mismatch: the tokens after it were drafted from a wrong prefix, so "
    "stop at the first draft token that differs from the model's choice (a matching PREFIX, not every match)"
)


def _count_matches(d: list[int], o: torch.Tensor) -> list[int]:
    """Counts every matching draft token, as if they were a prefix."""
    n = sum(x == int(o[i, 0]) for i, x in enumerate(d))
    return d[:n] + [_bonus(o, n)]


def _keep_matches(d: list[int], o: torch.Tensor) -> list[int]:
    """Keeps every matching draft token, skipping the mismatches."""
    kept = [x for i, x in enumerate(d) if x == int(o[i, 0])]
    return kept + [_bonus(o, len(kept))]


_RULES: list[tuple[Callable[[list[int], torch.Tensor], list[int]], bool, str]] = [
    (lambda d, o: d + [_bonus(o, len(d))], False, "accepted the whole draft, even where the model disagreed: keep "
     "only the matching prefix"),
    (lambda d, o: d[: (n := _accepted(d, o, shift=1))] + [_bonus(o, n, 1)], True, _OFF_BY_ONE),
    (lambda d, o: d[: (n := _accepted(d, o, shift=-1))] + [_bonus(o, n, -1)], True, _OFF_BY_ONE),
    *[(lambda d, o, t=top: d[: (n := _accepted(d, o, top=t))] + [_bonus(o, n)], False, f"accepted a draft token "
       f"that is among the model's top {top} choices but not its first: greedy verification accepts a draft token "
       "only when it IS the argmax, not when it is among the top few") for top in (2, 3, 5)],
    (lambda d, o: d[: _accepted(d, o)], False, "dropped the model's own token after the accepted prefix (the "
     "correction or bonus token)"),
    (lambda d, o: d[: n + 1] if (n := _accepted(d, o)) < len(d) else d + [_bonus(o, n)], False, "returned the "
     "rejected draft token: after the matching prefix append the MODEL's token, not the draft's"),
    (lambda d, o: [_bonus(o, 0)], False, "accepted nothing of the draft: compare each draft token with the model's "
     "choice"),
    (lambda d, o: d if (n := _accepted(d, o)) == len(d) else d[:n] + [_bonus(o, n)], False, "no token after a "
     "wholly accepted draft: the logits at the last position (len(context) + len(draft) - 1) give the model's "
     "next token (the bonus): return draft + [that token]"),
    (_count_matches, False, _AFTER_MISMATCH),
    (_keep_matches, False, _AFTER_MISMATCH),
]  # fmt: skip


def _threshold(d: list[int], o: torch.Tensor, p: torch.Tensor, t: float) -> list[int]:
    """Accepts draft[i] while its probability is above t, then the model's own token."""
    n = 0
    while n < len(d) and float(p[n, d[n]]) > t:
        n += 1
    return d[:n] + [_bonus(o, n)]


_THRESHOLDS = (0.5, 0.9, 0.75, 0.25, 0.1)


def _diagnose(fn: Callable[..., Any], model: torch.nn.Module, context: list[int], drafts: list[list[int]]) -> str:
    """The known wrong rule that gives exactly what ``fn`` returns on every one of ``drafts`` (the failing one and
    probes built around it, each verified once more): the learner's rule, seen, not guessed from one answer."""
    seen = []
    for draft in drafts:
        with torch.inference_mode():
            logits = model(torch.tensor([context + draft]))[0, len(context) - 1 :]
        order, probs = logits.argsort(-1, descending=True), logits.softmax(-1)
        try:
            got = _token_list(fn(_Target(model), list(context), list(draft)))
        except Exception:  # noqa: BLE001 - a probe the learner's code cannot handle says nothing about its rule
            continue
        seen.append((draft, order, probs, got))

    def fits(rule: Callable[..., list[int]], own_last: bool) -> bool:
        return bool(seen) and all(_same(rule(d, o), got, own_last) for d, o, _, got in seen)

    # the exact rules first; then the thresholds; then "nothing accepted" (which a threshold above every probe's
    # probabilities also gives) and the shifted rules, whose free last token would fit an early rejection too
    for rule, own_last, why in _RULES:
        if not own_last and not why.startswith(_NOTHING) and fits(rule, own_last):
            return why
    for t in _THRESHOLDS:
        if seen and all(_threshold(d, o, p, t) == got for d, o, p, got in seen):
            return (f"accepted a draft token only when its probability was above a threshold (your answers match "
                    f"'p > {t}' on every probe): greedy verification accepts a draft token exactly when it IS the "
                    "model's argmax, however low its probability, and never another token")  # fmt: skip
    for rule, own_last, why in _RULES:
        if (own_last or why.startswith(_NOTHING)) and fits(rule, own_last):
            return why
    return _NO_RULE


_NOTHING = "accepted nothing of the draft"
_NO_RULE = "not the longest matching prefix plus the model's next token"


def _same(want: list[int], got: list[int], own_last: bool) -> bool:
    return got[:-1] == want[:-1] and len(got) == len(want) if own_last else got == want


def _probes(draft: list[int], right: list[int], ranked: torch.Tensor) -> list[list[int]]:
    """The failing draft and drafts around it: all right (3, 1 and 2 tokens), the runner-up first, the runner-up
    after 1 and 2 right tokens, the third choice first, the least likely token first."""
    second = [int(ranked[i, 1]) for i in range(3)]
    return [draft, right[:3], right[:1], right[:2], [second[0], *right[1:3]], [right[0], second[1], right[2]],
            [*right[:2], second[2]], [int(ranked[0, 2]), right[1]], [int(ranked[0, -1]), right[1]]]  # fmt: skip


def _calls_target(fn: Callable[..., Any], model: torch.nn.Module, context: list[int], draft: list[int]) -> bool:
    """Whether ``fn`` calls the model for a non-empty draft (then an empty draft's wrong answer is its own mistake,
    not a verify that never runs the model)."""
    probe = _Target(model)
    try:
        fn(probe, list(context), list(draft))
    except Exception:  # noqa: BLE001 - only the calls matter here
        pass
    return probe.calls > 0


def _safe_list(got: Any) -> list[int] | None:
    try:
        return _token_list(got)
    except (TypeError, ValueError):
        return None


def _token_list(got: Any) -> list[int]:
    """The returned tokens as Python ints (a list, a tuple, a tensor or an array of any integer type)."""
    if got is None:
        return []
    if isinstance(got, torch.Tensor):
        return [int(t) for t in got.flatten().tolist()]
    if hasattr(got, "tolist") and not isinstance(got, (list, tuple)):
        got = got.tolist()
    return [int(t) for t in got]


def draw_drafts(rng: random.Random, mode: str, right: list[int], ranked: torch.Tensor) -> list[int]:
    """A draft of 1-5 tokens: ``right`` (greedy's own) up to a random point, then wrong tokens. The first wrong
    token is the model's runner-up there (2 times in 3), its third choice, or a random other token."""
    k = min(rng.randint(1, 5), len(right))
    keep = {"right": k, "wrong": 0}.get(mode, rng.randint(0, k - 1 if mode == "near" else k))
    draft = list(right[:keep])
    for i in range(keep, k):
        if i == keep:
            rank = rng.choice([1, 1, 2]) if mode != "near" else 1
            draft.append(int(ranked[i, rank]) if rng.random() < 0.9 or mode == "near" else int(ranked[i, -1]))
        else:
            draft.append(rng.randrange(VOCAB))
    return draft


def _check_one_verify_case(fn: Callable[..., Any], rng: random.Random, mode: str) -> dict[str, int]:
    # flat: a model whose greedy token often has a probability under 0.5 (caught: a probability threshold)
    model = TinyCausalLM(rng.randrange(1 << 16), scale=1.0 if mode == "flat" else 4.0)
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 7))]
    n = rng.randint(6, 12)
    ref, ranked = _greedy(model, prompt, n + 6)
    target, out, seen = _Target(model), [], {"verifications": 0, "runner-up rejected": 0, "empty": 0}
    while len(out) < n:
        right, here = ref[len(out) :], ranked[len(out) :]
        draft = draw_drafts(rng, "right" if mode == "flat" else mode, right, here) if mode != "empty" else []
        if mode == "resume":  # a wrong token, then the token the model picks after it: right only after a mismatch
            keep = rng.randint(0, 3)
            draft = [*right[:keep], int(here[keep, 1])]
            with torch.inference_mode():
                draft.append(int(model(torch.tensor([prompt + out + draft]))[0, -1].argmax()))
        k = len(draft)
        m = next((i for i, (d, r) in enumerate(zip(draft, right, strict=False)) if d != r), k)
        want = draft[:m] + [ref[len(out) + m]]
        context = prompt + out
        calls = target.calls
        got = fn(target, list(context), list(draft))
        used = target.calls - calls
        if (not draft and _safe_list(got) != want and (used or _calls_target(fn, model, context, right[:1]))
                and _diagnose(fn, model, context, _probes(draft, right, here)) == _NO_RULE):  # fmt: skip
            raise AssertionError(
                f"an empty draft (a draft source that found nothing, as prompt lookup often does): verify returned "
                f"{got!r}, greedy decoding needs {want}: with no draft, return the model's own next token, the argmax "
                "of the logits at position len(context) - 1 (returning nothing makes a decoding loop spin forever)"
            )
        assert used >= 1, "verify never called target: run the model on the context followed by the draft"
        assert used == 1, (
            f"verify called target {used} times for a draft of {k}: verify the whole draft in ONE forward pass "
            "(calling the model token by token is plain decoding, with none of the speed-up)"
        )
        assert target.inputs[-1] == context + draft, (
            f"target was called on {len(target.inputs[-1])} tokens; call it once on context + draft "
            f"({len(context)} + {k} tokens), so that one pass scores every draft position (not token by token)"
        )
        try:
            got = _token_list(got)
        except (TypeError, ValueError):
            raise AssertionError(f"return a list of token ids, got {type(got).__name__}") from None
        if got != want:
            why = _diagnose(fn, model, context, _probes(draft, right, here))
            raise AssertionError(
                f"{mode} draft of {k} (first {m} matching): verify returned {got}, greedy decoding needs {want}: {why}"
            )
        seen["verifications"] += 1
        seen["empty"] += int(not draft)
        seen["runner-up rejected"] += int(m < k and draft[m] == int(here[m, 1]))
        out += got
    assert out[:n] == ref[:n], f"the decoded tokens {out[:n]} differ from greedy decoding {ref[:n]}"
    return seen


def _check_verify(fn: Callable[..., Any]) -> None:
    with cases("16.verify") as c:
        # near: the first wrong token is always the runner-up; resume: the draft token after the first wrong one
        # is the model's own choice there (accepted only by a rule that does not stop at the first mismatch)
        # empty: every draft is []; flat: right drafts on a model whose greedy tokens often have p < 0.5
        modes = ["right", "wrong", "mixed", "near", "resume", "empty", "flat"]
        c.rng.shuffle(modes)
        seen = [_check_one_verify_case(fn, c.rng, mode) for mode in modes]
    total = sum(s["verifications"] for s in seen)
    runner_up = sum(s["runner-up rejected"] for s in seen)
    empty = sum(s["empty"] for s in seen)
    observed(f"{total} verifications in {len(modes)} decoded sequences ({', '.join(modes)} drafts), one target call "
             f"each on context + draft; {runner_up} drafts whose first wrong token was the model's runner-up were cut "
             f"there; {empty} empty drafts each gave the model's next token; every sequence equal to greedy "
             "decoding")  # fmt: skip


@exercise(
    "16.verify",
    "logits = target(torch.tensor([context + draft])); the model's choice for draft[i] is "
    "logits[0, len(context) - 1 + i].argmax(); count the matching prefix n, return draft[:n] + [choice n].",
    _check_verify,
)
def verify_draft(target: Callable[[torch.Tensor], torch.Tensor], context: list, draft: list) -> list:
    logits = target(torch.tensor([context + draft]))  # one pass scores every draft position
    choice = logits[0, len(context) - 1 :].argmax(-1).tolist()  # the model's greedy token after each prefix
    n = 0
    while n < len(draft) and draft[n] == choice[n]:
        n += 1
    return draft[:n] + [choice[n]]
