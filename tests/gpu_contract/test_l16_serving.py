"""Lesson 16's engine, scheduler and speculative decoding: the lesson's own cells, run on CPU on a small model.

The GPU section `16.gpu-serve` runs the same `PagedKV`, `forward`, `Scheduler`, `serve` and `reference` (the cells
tagged `contract`) with the model and the KV pool on CUDA; here they run on CPU with a 2-layer random model of
SmolLM2's shape. Known answers are pinned: which blocks the free list hands out, the scheduler's slot use under
each policy, the token budget of every step, prompt lookup on a known sequence, and every output against the
model's own greedy `generate` (with chunked prefill, pre-emption and prefix caching on).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

import course_utils as cu
from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "16.gpu-serve": "the lesson's PagedKV/forward/Scheduler/serve cells on CPU: static, continuous and chunked-prefill "
    "scheduling, every answer == greedy generate (also under pre-emption and prefix caching), slot use per policy, "
    "the token budget of every step, block accounting",
}


@pytest.fixture(scope="module")
def ns():
    # __name__: a module in sys.modules, which @dataclass looks up (the cells are compiled with this file's
    # `from __future__ import annotations` inherited by lesson_code, so their annotations are strings)
    return lesson_namespace("16", dataclass=dataclass, field=field, **{"__name__": __name__})


@pytest.fixture(scope="module")
def model():
    return cu.llm.tiny_llama(num_hidden_layers=2)


def prompts(n, seed=0, low=5, high=40):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, 49152, (int(torch.randint(low, high, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def test_paged_pool_accounting(ns, model):
    kv = ns["PagedKV"](model.config, num_blocks=8, block_size=16)
    kv.add(0)
    kv.add(1)
    assert kv.append(0, list(range(17))).tolist() == list(range(17))  # blocks 0 then 1: the lowest free first
    assert kv.tables[0] == [0, 1] and kv.blocks_in_use() == 2
    kv.append(1, [5, 6, 7])
    assert kv.tables[1] == [2] and kv.blocks_in_use() == 3
    assert kv.blocks_needed(1, 13) == 0 and kv.blocks_needed(1, 14) == 1
    kv.truncate(0, 16)
    assert kv.tables[0] == [0] and kv.blocks_in_use() == 2 and len(kv.tokens[0]) == 16
    kv.release(0)
    kv.release(1)
    assert kv.blocks_in_use() == 0
    assert kv.bytes_per_token == 2 * 2 * 3 * 64 * 4  # 2 layers x K,V x 3 KV heads x 64 dims x fp32
    assert kv.k.shape == (2, 3, 8 * 16, 64)  # [layer, kv head, slot, dim]
    kv.add(2)
    assert not kv.can_append(2, 8 * 16 + 1)
    with pytest.raises(cu.errors.CourseError, match="num_blocks"):
        kv.append(2, [1] * (8 * 16 + 1))


@pytest.mark.parametrize("attention", ["blocks", "copy"])
def test_greedy_with_the_paged_engine_equals_generate(ns, model, attention):
    kv = ns["PagedKV"](model.config, num_blocks=24, block_size=4)  # small blocks: many block boundaries
    for p in prompts(3, seed=1):
        assert ns["greedy"](model, kv, p, 9, chunk=5, attention=attention) == ns["reference"](model, p, 9)
    assert kv.blocks_in_use() == 0  # every sequence gave its blocks back


def test_forward_logits_match_the_model(ns, model):
    """Token parity on a random model is weak evidence: the packed forward's logits against the model's own."""
    a, b = prompts(2, seed=7, low=9, high=20)
    kv = ns["PagedKV"](model.config, num_blocks=16, block_size=4)
    kv.add(0)
    kv.add(1)
    ns["forward"](model, kv, [(0, a[:-1]), (1, b[:4])])
    mine = ns["forward"](model, kv, [(0, a[-1:]), (1, b[4:])], all_logits=True)  # a decode and a chunk, packed
    with torch.inference_mode():
        ref_a = model(torch.tensor([a])).logits[0, -1:]
        ref_b = model(torch.tensor([b])).logits[0, 4:]
    torch.testing.assert_close(mine, torch.cat([ref_a, ref_b]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("policy", "budget"), [("static", None), ("continuous", None), ("continuous", 8)], ids=["static", "cont", "chunked"]
)
def test_served_answers_equal_generate_and_slots_follow_the_policy(ns, model, policy, budget):
    Request, pool = ns["Request"], prompts(4, seed=2)
    caps = [2, 9, 3, 2, 7, 2, 2, 5]
    requests = [Request(i, pool[i % 4], caps[i], 0.0) for i in range(8)]
    kv, trace, streamed = ns["PagedKV"](model.config, 64, 8), [], []
    sched = ns["Scheduler"](model, kv, max_slots=3, token_budget=budget, policy=policy)
    sizes = []
    step = sched.schedule

    def counted():
        batch = step()
        sizes.append(sum(n for _, n in batch))
        return batch

    sched.schedule = counted
    for r, token, t in ns["serve"](sched, requests, trace):
        streamed.append((r.rid, token, t))
    for r in requests:
        assert r.out == ns["reference"](model, r.prompt, r.max_new), f"request {r.rid}"
        assert [tok for rid, tok, _ in streamed if rid == r.rid] == r.out  # every token was streamed, in order
    assert kv.blocks_in_use() == 0
    running = [row["running"] for row in trace]
    assert max(running) <= 3
    if budget is not None:
        assert max(sizes) <= budget and max(sizes) == budget  # the budget is filled, never exceeded
    if policy == "static":  # a new batch only once the previous one is empty: admissions start from zero
        starts = [running[0]] + [b for a, b in zip(running, running[1:], strict=False) if b > a]
        assert starts == [3, 3, 2], running
    assert sum(len(r.out) for r in requests) == sum(caps)


def test_preemption_changes_no_answer(ns, model):
    Request, pool = ns["Request"], prompts(3, seed=3, low=20, high=30)
    requests = [Request(i, pool[i % 3], 12, 0.0) for i in range(6)]
    sched = ns["Scheduler"](model, ns["PagedKV"](model.config, 6, 8), max_slots=3, token_budget=16)
    for _ in ns["serve"](sched, requests):
        pass
    assert sched.preemptions > 0 and any(r.preempted for r in requests)
    for r in requests:
        assert r.out == ns["reference"](model, r.prompt, 12), f"request {r.rid} changed after pre-emption"
    assert sched.kv.blocks_in_use() == 0


@pytest.mark.parametrize(("mode", "hit"), [(True, 16), ("partial", 22)])
def test_prefix_caching_reuses_blocks_and_changes_no_answer(ns, model, mode, hit):
    Request = ns["Request"]
    system = prompts(1, seed=4, low=22, high=23)[0]  # 22 shared tokens: 2 full blocks of 8 and 6 more
    tails = prompts(3, seed=5, low=4, high=9)
    requests = [Request(i, system + tails[i % 3], 5) for i in range(6)]
    kv = ns["PagedKV"](model.config, 40, 8, prefix_caching=mode)
    sched = ns["Scheduler"](model, kv, max_slots=2, token_budget=16)
    sched.add(requests[0])
    while not requests[0].out:  # the first request's prompt is in the cache before the others arrive
        sched.step()
    for r in requests[1:]:
        sched.add(r)
    while sched.has_work():
        sched.step()
    for r in requests:
        assert r.out == ns["reference"](model, r.prompt, 5), f"request {r.rid}"
    assert requests[0].cached == 0 and all(r.cached >= hit for r in requests[1:])
    # "partial": the partly shared third block was copied before the first write into it; full blocks: never
    assert kv.copies >= 1 if mode == "partial" else kv.copies == 0


def test_open_loop_arrivals_wait_for_their_time(ns, model):
    Request = ns["Request"]
    reqs = [Request(0, prompts(1, 3)[0], 2, 0.0), Request(1, prompts(1, 4)[0], 2, 0.3)]
    sched = ns["Scheduler"](model, ns["PagedKV"](model.config, 16, 8), max_slots=2, token_budget=32)
    firsts = {}
    for r, _tok, t in ns["serve"](sched, reqs):
        firsts.setdefault(r.rid, t)
    assert firsts[1] >= 0.3  # not served before it arrived


def test_a_request_larger_than_the_pool_is_refused(ns, model):
    sched = ns["Scheduler"](model, ns["PagedKV"](model.config, 2, 8), max_slots=2)
    with pytest.raises(ns["BadRequest"], match="needs up to 3 KV blocks and the whole pool has 2"):
        sched.add(ns["Request"](0, list(range(3, 20)), 4))


def test_lookup_draft_known_sequence(ns):
    draft = ns["lookup_draft"]
    assert draft([1, 2, 3, 4, 1, 2, 3], 2) == [4, 1]  # trigram "1 2 3" seen before, followed by 4, 1
    assert draft([5, 6, 7, 8, 6], 3) == [7, 8, 6]  # falls back to the unigram "6"
    assert draft([1, 2, 3], 4) == []  # nothing repeats: no draft


@pytest.mark.parametrize("k", [0, 1, 3, 6])
def test_speculative_output_equals_greedy(ns, model, k):
    base = prompts(1, seed=5)[0]
    prompt = base + base  # a repeating prompt: prompt lookup proposes drafts
    kv = ns["PagedKV"](model.config, 32, 4)
    got, steps = ns["speculative"](model, kv, prompt, 12, k)
    assert got == ns["reference"](model, prompt, 12)
    assert kv.blocks_in_use() == 0
    assert all(n <= d <= k for d, n in steps)
    assert len(got) == 12 and len(steps) <= 11  # each verify pass makes at least one token
