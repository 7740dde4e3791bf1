"""Lesson 16 exercises: the admission step of continuous batching, and speculative verification.

* ``16.admit``: ``admit_step(running, waiting, max_slots)`` is checked by simulating a server step by step with
  random arrivals, output lengths and slot counts (seeded per call, the seed printed on failure). After every
  call: no finished sequence still runs (retired the same step), every unfinished one still runs (no
  pre-emption), at most ``max_slots`` run, the admitted ones are the front of the queue in arrival order and have
  left the queue, and no slot is idle while requests wait.
* ``16.verify``: ``verify(target, context, draft)`` is run inside a speculative decoding loop on a small random
  Llama with drafts drawn at random (always right, always wrong, partly right). The checker counts the calls of
  ``target`` and records their inputs: one call per verification, on the context followed by the whole draft; the
  returned tokens must be the longest matching prefix plus the model's own next token, and the decoded output
  identical to greedy decoding.
"""

from __future__ import annotations

import functools
import random
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from course_utils.check.exercises import exercise


def _with_seed(check: Callable[..., None]) -> Callable[..., None]:
    """Draw a seed per call (or take ``seed=``) and name it in any failure message."""

    @functools.wraps(check)
    def run(fn: Callable[..., Any], seed: int | None = None) -> None:
        seed = random.randrange(2**31) if seed is None else seed
        try:
            check(fn, seed)
        except AssertionError as exc:
            raise AssertionError(f"{exc} [random case seed {seed}]") from None

    return run


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


def _check_one_admit_case(fn: Callable[..., Any], rng: random.Random) -> None:
    max_slots = rng.randint(2, 6)
    n = rng.randint(4 * max_slots, 8 * max_slots)
    arrive = sorted(rng.randint(0, 2 * n // max_slots + 2) for _ in range(n))
    seqs = [_Seq(i, rng.choice([1, 2, 3, 5, 9, 16])) for i in range(n)]
    waiting: deque = deque()
    running: list = []
    step = 0
    while step <= arrive[-1] or waiting or running:
        waiting.extend(s for s, a in zip(seqs, arrive, strict=True) if a == step)
        before_run, before_wait = list(running), list(waiting)
        result = fn(running, waiting, max_slots)
        assert isinstance(result, list), f"admit_step must return the new running list, got {type(result).__name__}"
        finished = [s for s in result if s.done]
        assert not finished, (
            f"step {step}: finished {finished} still in the running list: retire every sequence whose .done is True "
            "in the same step (before admitting), so its slot goes to a waiting request"
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
            raise AssertionError(
                f"step {step}: {max_slots - len(result)} slot(s) idle while {len(waiting)} request(s) wait"
                + (
                    ": that is static batching (admitting only once the whole batch has finished); admit into "
                    "every free slot at every step"
                    if static
                    else ": keep admitting while a slot is free and the queue is not empty"
                )
            )
        for s in result:
            s.left -= 1  # one decode step
        running = result
        step += 1
        assert step < 50 * n, "the simulation did not finish: requests are never admitted or never retired"


@_with_seed
def _check_admit(fn: Callable[..., Any], seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(4):
        _check_one_admit_case(fn, rng)


@exercise(
    "16.admit",
    "Keep the running sequences that are not .done, then admit with waiting.popleft() while "
    "len(running) < max_slots and the queue is not empty; return the new list.",
    _check_admit,
)
def admit_step(running: list, waiting: deque, max_slots: int) -> list:
    kept = [s for s in running if not s.done]  # retire finished sequences this step
    while waiting and len(kept) < max_slots:
        kept.append(waiting.popleft())  # first come, first served, into every free slot
    return kept


# ---------------------------------------------------------------- 16.verify
@functools.lru_cache(maxsize=1)
def _tiny_target() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(16)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():  # larger logits: greedy choices far from ties
            model.lm_head.weight.mul_(8)
    return model.eval()


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
            return self.model(ids).logits


def _greedy(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def _diagnose(got: list[int], draft: list[int], m: int, choice: list[int]) -> str:
    k, j = len(draft), len(got) - 1
    if m < k and got[:k] == draft:
        return f"accepted the whole draft, but the model disagreed at draft position {m}: keep only the matching prefix"
    if got == draft[:m]:
        return "dropped the model's own token after the accepted prefix (the correction or bonus token)"
    if got == draft[: m + 1] and m < k:
        return "returned the rejected draft token: after the matching prefix append the MODEL's token, not the draft's"
    shifted = j >= 0 and got[j] != choice[j] and got[j] in choice[max(j - 1, 0) : j] + choice[j + 1 : j + 2]
    if shifted or len(got) in (m, m + 2):
        return (
            "off by one in the accepted prefix: draft[i] is checked against the model's choice at position "
            "len(context) - 1 + i (the logits of the token before it)"
        )
    if len(got) == 1 and m > 0:
        return f"accepted nothing of a draft whose first {m} token(s) matched the model: compare the draft"
    return "not the longest matching prefix plus the model's next token"


def _check_one_verify_case(fn: Callable[..., Any], rng: random.Random, mode: str) -> None:
    model = _tiny_target()
    vocab = model.config.vocab_size
    prompt = [rng.randrange(vocab) for _ in range(rng.randint(2, 7))]
    n = rng.randint(8, 14)
    ref = _greedy(model, prompt, n + 8)
    target, out = _Target(model), []
    while len(out) < n:
        k = rng.randint(1, 5)
        right = ref[len(out) : len(out) + k]
        if mode == "right":
            keep = k
        elif mode == "wrong":
            keep = 0
        else:
            keep = rng.randint(0, k)
        draft = right[:keep] + [(t + 1 + rng.randrange(vocab - 1)) % vocab for t in right[keep:]]
        m = next((i for i, (d, r) in enumerate(zip(draft, right, strict=True)) if d != r), k)
        want = draft[:m] + [ref[len(out) + m]]
        context = prompt + out
        calls = target.calls
        got = fn(target, list(context), list(draft))
        used = target.calls - calls
        assert used >= 1, "verify never called target: run the model on the context followed by the draft"
        assert used == 1, (
            f"verify called target {used} times for a draft of {k}: verify the whole draft in ONE forward pass "
            "(calling the model token by token is plain decoding, with none of the speed-up)"
        )
        assert target.inputs[-1] == context + draft, (
            f"target was called on {len(target.inputs[-1])} tokens; call it once on context + draft "
            f"({len(context)} + {k} tokens), so that one pass scores every draft position (not token by token)"
        )
        got = [int(t) for t in got] if got is not None else []
        if got != want:
            with torch.inference_mode():
                choice = model(torch.tensor([context + draft])).logits[0, len(context) - 1 :].argmax(-1).tolist()
            raise AssertionError(
                f"{mode} draft of {k} (first {m} matching): verify returned {got}, greedy decoding needs {want}: "
                + _diagnose(got, draft, m, choice)
            )
        out += got
    assert out[:n] == ref[:n], f"the decoded tokens {out[:n]} differ from greedy decoding {ref[:n]}"


@_with_seed
def _check_verify(fn: Callable[..., Any], seed: int) -> None:
    rng = random.Random(seed)
    modes = ["right", "wrong", "mixed", "mixed"]
    rng.shuffle(modes)
    for mode in modes:
        _check_one_verify_case(fn, rng, mode)


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
