"""Lesson 16's engine, schedulers and speculative decoding: the lesson's own cells, run on CPU on a small model.

The GPU section `16.gpu-serve` runs the same `PagedKV`, `forward`, `serve` and `reference` (the cells tagged
`contract`) with the model and the KV pool on CUDA; here they run on CPU with a 2-layer random model of
SmolLM2's shape. Known answers are pinned: block counts of the paged pool, the scheduler's slot use under each
policy, prompt lookup on a known sequence, and every output against the model's own greedy `generate`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import course_utils as cu
from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "16.gpu-serve": "the lesson's PagedKV/forward/serve cells on CPU: static and continuous batching, every answer "
    "== greedy generate, slot use per policy, block accounting",
}


@pytest.fixture(scope="module")
def ns():
    # __name__: a module in sys.modules, which @dataclass looks up (the cells are compiled with this file's
    # `from __future__ import annotations` inherited by lesson_code, so their annotations are strings)
    preset = dict(torch=torch, F=F, apply_rotary_pos_emb=apply_rotary_pos_emb, cu=cu, time=time, EOS=None)
    return lesson_namespace("16", dataclass=dataclass, field=field, **preset, **{"__name__": __name__})


@pytest.fixture(scope="module")
def model():
    return cu.llm.tiny_llama(num_hidden_layers=2)


def prompts(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, 49152, (int(torch.randint(5, 40, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


def test_paged_pool_accounting(ns, model):
    kv = ns["PagedKV"](model.config, num_blocks=8, block_size=16)
    kv.add(0)
    kv.add(1)
    assert kv.grow(0, 17).tolist() == [7 * 16 + i for i in range(16)] + [6 * 16]  # blocks 7 then 6, from the free list
    assert kv.tables[0] == [7, 6] and kv.blocks_in_use() == 2
    kv.grow(1, 3)
    assert kv.tables[1] == [5] and kv.blocks_in_use() == 3
    kv.truncate(0, 16)
    assert kv.tables[0] == [7] and kv.blocks_in_use() == 2 and kv.lengths[0] == 16
    kv.release(0)
    kv.release(1)
    assert kv.blocks_in_use() == 0
    assert kv.bytes_per_token == 2 * 2 * 3 * 64 * 4  # 2 layers x K,V x 3 KV heads x 64 dims x fp32
    kv.add(2)
    with pytest.raises(cu.errors.CourseError, match="num_blocks"):
        kv.grow(2, 8 * 16 + 1)


def test_greedy_with_the_paged_engine_equals_generate(ns, model):
    kv = ns["PagedKV"](model.config, num_blocks=16, block_size=4)  # small blocks: many block boundaries
    for p in prompts(3, seed=1):
        assert ns["greedy"](model, kv, p, 9) == ns["reference"](model, p, 9)
    assert kv.blocks_in_use() == 0  # every sequence gave its blocks back


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_served_answers_equal_generate_and_slots_follow_the_policy(ns, model, policy):
    Request, pool = ns["Request"], prompts(4, seed=2)
    caps = [2, 9, 3, 2, 7, 2, 2, 5]
    requests = [Request(i, pool[i % 4], caps[i], 0.0) for i in range(8)]
    kv, trace, streamed = ns["PagedKV"](model.config, 64, 8), [], []
    for r, token, t in ns["serve"](model, kv, requests, policy=policy, max_slots=3, trace=trace):
        streamed.append((r.rid, token, t))
    for r in requests:
        assert r.out == ns["reference"](model, r.prompt, r.max_new), f"request {r.rid}"
        assert [tok for rid, tok, _ in streamed if rid == r.rid] == r.out  # every token was streamed, in order
    assert kv.blocks_in_use() == 0
    running = [row["sequences"] for row in trace]
    assert max(running) <= 3
    if policy == "static":  # a new batch only once the previous one is empty: admissions start from zero
        starts = [running[0]] + [b for a, b in zip(running, running[1:], strict=False) if b > a]
        assert starts == [3, 3, 2], running
    else:  # slots refilled as soon as a sequence finishes while requests wait
        assert all(n == 3 for n, row in zip(running, trace, strict=True) if row["waiting"] > 0)
    tokens = sum(len(r.out) for r in requests)
    assert tokens == sum(caps)


def test_open_loop_arrivals_wait_for_their_time(ns, model):
    Request = ns["Request"]
    reqs = [Request(0, prompts(1, 3)[0], 2, 0.0), Request(1, prompts(1, 4)[0], 2, 0.3)]
    kv = ns["PagedKV"](model.config, 16, 8)
    firsts = {}
    for r, _tok, t in ns["serve"](model, kv, reqs, policy="continuous", max_slots=2):
        firsts.setdefault(r.rid, t)
    assert firsts[1] >= 0.3  # not served before it arrived


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
