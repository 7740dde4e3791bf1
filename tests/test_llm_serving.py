"""Lesson 16's serving engine, as exported to course_utils/from_lessons/l16_llm_serving.py, and its streaming server.

Pinned cases with known answers: the mask attention reads the blocks through, copy-on-write of a shared block,
least-recently-used eviction of cached blocks, admission by free blocks, decodes scheduled before prompt chunks;
then the lesson's LitServe server (its `%%writefile` cell) streaming over 127.0.0.1 to the course's streaming
load generator, every stream equal to greedy `generate`, a bad request ending only its own stream; the
request-rate sweep's knee rule on made-up rows; transformers' `generate_batch` beside the engine, and the reasons
it may not run.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

import course_utils as cu
from course_utils.from_lessons import l16_llm_serving as engine
from course_utils.serve import server_process, stream_load
from course_utils.serve.load_generator import LoopbackOnlyError

LESSON = Path(__file__).resolve().parent.parent / "lessons" / "16_llm_serving.py"


@pytest.fixture(scope="module")
def config():
    return cu.llm.smollm2_config(num_hidden_layers=1)


@pytest.fixture(scope="module")
def model():
    return cu.llm.tiny_llama(num_hidden_layers=2)


def test_the_mask_lets_each_token_see_its_own_sequence_up_to_its_position(config):
    kv = engine.PagedKV(config, num_blocks=6, block_size=2)
    for sid, n in ((0, 3), (1, 2)):
        kv.add(sid)
        kv.append(sid, list(range(n)))
    # sequence 0 holds blocks 0 and 1 (slots 0-2), sequence 1 block 2 (slots 4-5); 1 new token for 0, 2 for 1
    kv.append(0, [9])
    kv.append(1, [9, 9])
    index, mask = engine.visible(kv, [(0, 1), (1, 2)], "blocks")
    assert index == slice(0, 8)  # blocks 0..3: the slice the batch's blocks span (a view of the pool)
    want = torch.zeros(3, 8, dtype=torch.bool)
    want[0, [0, 1, 2, 3]] = True  # the decode token of sequence 0 (position 3) sees its 4 tokens
    want[1, [4, 5, 6]] = True  # sequence 1's token at position 2 sees positions 0-2 (slots 4, 5, 6)
    want[2, [4, 5, 6, 7]] = True  # ... and the one at position 3 sees one more
    assert torch.equal(mask, want)
    index, mask = engine.visible(kv, [(0, 1), (1, 2)], "copy")
    assert index.tolist() == [0, 1, 2, 3, 4, 5, 6, 7] and mask.shape == (3, 8)


def test_blocks_and_copy_attention_give_the_same_logits(model):
    outs = {}
    for attention in ("blocks", "copy"):
        kv = engine.PagedKV(model.config, 20, 4)
        for sid, n in ((0, 9), (1, 6), (2, 13)):
            kv.add(sid)
            engine.forward(model, kv, [(sid, list(range(10, 10 + n)))], attention=attention)
        outs[attention] = engine.forward(model, kv, [(0, [5]), (1, [6, 7, 8]), (2, [9])], attention=attention)
    torch.testing.assert_close(outs["blocks"], outs["copy"], atol=1e-5, rtol=1e-5)


def test_copy_on_write_keeps_the_shared_block_intact(config):
    kv = engine.PagedKV(config, num_blocks=8, block_size=4, prefix_caching="partial")
    kv.add(0)
    kv.append(0, [1, 2, 3, 4, 5, 6, 7, 8, 9])  # blocks 0, 1 full (cached), block 2 holds one token
    kv.k[:, :, 4:8] = 7.0  # mark block 1's keys
    kv.add(1)
    assert kv.match_prefix(1, [1, 2, 3, 4, 5, 6, 0, 0, 0]) == 6  # block 0 whole, the first 2 tokens of block 1
    assert kv.tables[1] == [0, 1] and kv.refs[1] == 2
    assert kv.blocks_needed(1, 1) == 1  # writing into the shared block takes one block for its copy
    kv.append(1, [0])
    assert kv.copies == 1 and kv.tables[1][1] not in (0, 1) and kv.refs[1] == 1
    new = kv.tables[1][1]
    assert torch.equal(kv.k[:, :, 4:8], torch.full_like(kv.k[:, :, 4:8], 7.0))  # the cached block is unchanged
    assert bool((kv.k[:, :, new * 4 : new * 4 + 2] == 7.0).all())  # the copy took the 2 shared slots
    kv.release(0)
    kv.release(1)
    assert kv.blocks_in_use() == 0 and len(kv.idle) == 2  # the cached blocks wait, idle, for a later prompt


def test_full_block_matching_shares_only_full_blocks(config):
    kv = engine.PagedKV(config, num_blocks=8, block_size=4, prefix_caching=True)  # vLLM v1's way
    kv.add(0)
    kv.append(0, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    kv.add(1)
    assert kv.match_prefix(1, [1, 2, 3, 4, 5, 6, 0, 0, 0]) == 4 and kv.tables[1] == [0]
    kv.append(1, [5, 6, 0, 0, 0])
    assert kv.copies == 0 and kv.blocks_needed(1, 1) == 0


def test_blocks_needed_and_truncate_count_a_partly_filled_block(config):
    kv = engine.PagedKV(config, num_blocks=8, block_size=4)
    kv.add(0)
    assert kv.blocks_needed(0, 1) == 1 and kv.blocks_needed(0, 4) == 1 and kv.blocks_needed(0, 5) == 2
    kv.append(0, [1, 2, 3, 4, 5, 6])  # block 0 full, block 1 holds two tokens
    assert kv.blocks_in_use() == 2
    assert kv.blocks_needed(0, 2) == 0 and kv.blocks_needed(0, 3) == 1 and kv.blocks_needed(0, 7) == 2
    kv.truncate(0, 5)  # token 5 still lives in block 1: it stays
    assert len(kv.tables[0]) == 2 and kv.tokens[0] == [1, 2, 3, 4, 5] and kv.blocks_in_use() == 2
    kv.truncate(0, 4)  # block 1 now holds nothing: freed
    assert len(kv.tables[0]) == 1 and kv.tokens[0] == [1, 2, 3, 4] and kv.blocks_in_use() == 1
    assert kv.blocks_needed(0, 1) == 1


def test_a_block_only_one_uncached_sequence_holds_is_written_in_place(config):
    kv = engine.PagedKV(config, num_blocks=8, block_size=4)  # no prefix caching: nothing is shared
    kv.add(0)
    kv.append(0, [1, 2])
    table = list(kv.tables[0])
    assert kv.blocks_needed(0, 1) == 0
    kv.append(0, [3])
    assert kv.copies == 0 and kv.tables[0] == table and kv.blocks_in_use() == 1


@pytest.mark.parametrize(("mode", "hit"), [(True, 4), ("partial", 7)])
def test_an_identical_prompt_leaves_its_last_token_to_compute(config, mode, hit):
    kv = engine.PagedKV(config, num_blocks=8, block_size=4, prefix_caching=mode)
    kv.add(0)
    kv.append(0, list(range(8)))
    kv.release(0)
    kv.add(1)
    # its logits give the next token: full blocks only (vLLM v1) recompute the whole last block, "partial" one token
    assert kv.match_prefix(1, list(range(8))) == hit


def test_idle_cached_blocks_are_evicted_tail_first(config):
    kv = engine.PagedKV(config, num_blocks=3, block_size=2, prefix_caching=True)
    kv.add(0)
    kv.append(0, [1, 2, 3, 4])  # blocks 0 and 1, both cached
    kv.release(0)
    assert kv.blocks_free() == 3 and list(kv.idle) == [1, 0]  # released tail first: the tail is the oldest
    kv.add(1)
    kv.append(1, [9, 9, 9, 9])  # block 2 from the free list, then the oldest idle block: the chain's tail (1)
    assert kv.tables[1] == [2, 1] and (1, 2) in kv.cache and (1, 2, 3, 4) not in kv.cache


def test_after_one_eviction_the_head_of_a_cached_prompt_still_matches(config):
    kv = engine.PagedKV(config, num_blocks=4, block_size=4, prefix_caching=True)
    prompt = list(range(10, 22))  # 12 tokens, 3 full blocks
    kv.add(0)
    kv.append(0, prompt)
    kv.release(0)
    kv.add(1)
    kv.append(1, [9] * 8)  # the free block, then one eviction
    kv.release(1)
    kv.add(2)
    assert kv.match_prefix(2, prompt + [1, 2, 3, 4]) == 8  # head-first eviction would leave 0


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_pool_sizes_are_checked_when_the_pool_is_made(config, bad):
    for kwargs in ({"num_blocks": bad}, {"num_blocks": 4, "block_size": bad}):
        with pytest.raises(ValueError, match=r"must be a whole number >= 1"):
            engine.PagedKV(config, **kwargs)
    with pytest.raises(ValueError, match="prefix_caching must be"):
        engine.PagedKV(config, 4, 4, prefix_caching="yes")
    assert engine.PagedKV(config, num_blocks=1, block_size=1).num_blocks == 1


def test_admission_waits_for_free_blocks(model):
    kv = engine.PagedKV(model.config, num_blocks=4, block_size=4)
    sched = engine.Scheduler(model, kv, max_slots=4, token_budget=64)
    a, b = engine.Request(0, list(range(3, 15)), 2), engine.Request(1, list(range(3, 10)), 2)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()  # a takes 3 of the 4 blocks; b's 7 tokens need 2: it waits
    assert [(r.rid, n) for r, n in batch] == [(0, 12)] and list(sched.waiting) == [b]
    kv = engine.PagedKV(model.config, num_blocks=4, block_size=4)
    sched = engine.Scheduler(model, kv, max_slots=4, token_budget=64)
    c = engine.Request(2, list(range(3, 7)), 2)
    for r in (engine.Request(0, list(range(3, 15)), 2), c):
        sched.add(r)
    batch = sched.schedule()  # 3 blocks and then c's 4 tokens in the last free one: the pool is used to the end
    assert [(r.rid, n) for r, n in batch] == [(0, 12), (2, 4)] and not sched.waiting


def test_no_more_running_requests_than_slots(model):
    kv = engine.PagedKV(model.config, num_blocks=32, block_size=4)
    sched = engine.Scheduler(model, kv, max_slots=2, token_budget=64)
    for i in range(3):
        sched.add(engine.Request(i, list(range(3, 6)), 4))
    batch = sched.schedule()
    assert [(r.rid, n) for r, n in batch] == [(0, 3), (1, 3)] and [r.rid for r in sched.waiting] == [2]


def test_running_requests_go_in_order_so_decodes_come_before_prompt_chunks(model):
    kv = engine.PagedKV(model.config, num_blocks=32, block_size=4)
    sched = engine.Scheduler(model, kv, max_slots=4, token_budget=6)
    first = [engine.Request(i, list(range(3, 6)), 8) for i in range(2)]
    for r in first:
        sched.add(r)
    sched.step()  # both short prompts in one step (3 + 3 tokens)
    late = engine.Request(2, list(range(3, 20)), 2)
    sched.add(late)
    batch = sched.schedule()
    assert [(r.rid, n) for r, n in batch] == [(0, 1), (1, 1), (2, 4)]  # 2 decodes, then 4 of the 17 prompt tokens


def test_stream_load_refuses_other_hosts_and_bad_arguments():
    with pytest.raises(LoopbackOnlyError):
        stream_load.open_loop_stream("http://10.0.0.1:8000/predict", [{}], rate=1.0, n_requests=1)
    with pytest.raises(ValueError, match="rate"):
        stream_load.open_loop_stream("http://127.0.0.1:9/predict", [{}], rate=0.0, n_requests=1)


def test_a_refused_connection_is_an_error_not_an_answer():
    (answer,) = stream_load.open_loop_stream("http://127.0.0.1:9/predict", [{"x": 1}], rate=1.0, n_requests=1,
                                             timeout=5)  # fmt: skip
    assert not answer.ok and answer.error and answer.lines == []


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The lesson's server file, started once for this module's server tests (stopped at the end, even on failure)."""
    folder = tmp_path_factory.mktemp("l16_server")
    server_file = server_process.writefile_fallback(folder / "llm_server.py", LESSON)
    events = folder / "events.jsonl"
    settings = {"token_budget": 16, "num_blocks": 300, "block_size": 8, "layers": 2, "prefix_caching": True}
    old = os.environ.get("COURSE_16_SERVER")
    os.environ["COURSE_16_SERVER"] = json.dumps({**settings, "events": str(events)})
    try:
        with server_process.serve(f"{server_file}:build_server", max_batch_size=3, start_timeout=300) as srv:
            yield srv, events
    finally:
        if old is None:
            os.environ.pop("COURSE_16_SERVER", None)
        else:
            os.environ["COURSE_16_SERVER"] = old


def _generate(prompt, max_new):
    model, tok = engine.serving_model(2)
    eos = tok.eos_token_id if tok is not None else None
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False)
    want = out[0, len(prompt) :].tolist()
    return want[: want.index(eos) + 1] if eos in want else want


def test_the_lessons_server_streams_answers_equal_to_generate(served):
    srv, _ = served
    prompts = [list(range(100, 100 + n)) for n in (11, 19, 11)]
    bodies = [{"prompt": p, "max_new": 5} for p in prompts] + [{"prompt": "not ids", "max_new": 2}]
    answers = stream_load.open_loop_stream(srv.predict_url, bodies, rate=20.0, n_requests=4, timeout=120)
    for a, p in zip(answers[:3], prompts, strict=True):
        assert a.ok, a.error
        got = [line["token"] for line in a.lines]
        assert got == _generate(p, 5)
        assert len(a.times_s) == len(got) and a.times_s == sorted(a.times_s)
    bad = answers[3]
    assert bad.status == 422 and not bad.ok and "the prompt must be a non-empty list of token ids" in bad.error


VOCAB = cu.llm.smollm2_config().vocab_size
BAD_BODIES = [
    ({"prompt": [], "max_new": 3}, "the prompt must be a non-empty list of token ids"),
    ({"prompt": [5, VOCAB], "max_new": 3}, f"prompt token 1 is {VOCAB}: token ids are whole numbers from 0"),
    ({"prompt": [-1], "max_new": 3}, "prompt token 0 is -1"),
    ({"prompt": [5], "max_new": 0}, "max_new must be a whole number >= 1, not 0"),
    ({"prompt": [5], "max_new": -5}, "max_new must be a whole number >= 1, not -5"),
    ({"prompt": [5] * 8000, "max_new": 500}, "exceeds the model's context of 8192 tokens"),
    ({"prompt": [5] * 2000, "max_new": 500}, "needs up to 313 KV blocks and the whole pool has 300"),
    ({"max_new": 3}, "the prompt must be a non-empty list"),
    ([1, 2], "the body must be a JSON object, not list"),
    ({"prompt": [5], "max_new": 3, "temperature": -1}, "need temperature >= 0 and 0 < top_p <= 1, not -1 and 1.0"),
    ({"prompt": [5], "max_new": 3, "seed": "7"}, "seed must be a whole number from 0 to 2**64 - 1"),
]


def test_a_bad_request_gets_422_and_its_reason_while_the_others_stream_on(served):
    import httpx

    srv, _ = served
    good = [{"prompt": list(range(200, 213)), "max_new": 6}, {"prompt": list(range(300, 309)), "max_new": 6}]
    bodies = [good[0]] + [b for b, _ in BAD_BODIES] + [good[1]]
    answers = stream_load.open_loop_stream(srv.predict_url, bodies, rate=1e6, n_requests=len(bodies), timeout=120)
    for a, body in zip((answers[0], answers[-1]), good, strict=True):
        assert a.ok, a.error
        assert [line["token"] for line in a.lines] == _generate(body["prompt"], 6)
    for a, (_, message) in zip(answers[1:-1], BAD_BODIES, strict=True):
        assert a.status == 422 and message in a.error, (a.status, a.error)
    with httpx.Client(trust_env=False, timeout=30) as client:
        r = client.post(srv.predict_url, content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["detail"]  # the course's RequestGuard, outside


def test_a_request_id_still_streaming_gets_409(served):
    import httpx

    srv, _ = served
    body = {"prompt": list(range(400, 410)), "max_new": 400, "request_id": "same"}
    with httpx.Client(trust_env=False, timeout=60) as client:
        with client.stream("POST", srv.predict_url, json=body) as first:
            lines = first.iter_lines()
            assert "token" in json.loads(next(lines))  # the first one streams
            second = client.post(srv.predict_url, json={**body, "max_new": 2})
            assert second.status_code == 409 and "request_id 'same' is still streaming" in second.json()["error"]


def test_served_sampling_settings_reach_the_engine_and_the_same_seed_gives_the_same_tokens(served):
    srv, _ = served
    prompt, sampled = list(range(600, 612)), {"max_new": 6, "temperature": 0.9, "top_p": 0.95, "seed": 11}
    bodies = [{"prompt": prompt, **sampled}, {"prompt": prompt, **sampled}, {"prompt": prompt, "max_new": 6}]
    answers = stream_load.open_loop_stream(srv.predict_url, bodies, rate=1e6, n_requests=3, timeout=120)
    assert all(a.ok for a in answers), [a.error for a in answers]
    first, second, greedy = ([line["token"] for line in a.lines] for a in answers)
    model, _ = engine.serving_model(2)
    alone = engine.Request(0, prompt, 6, temperature=0.9, top_p=0.95, seed=11)  # the same settings, in-process
    sched = engine.Scheduler(model, engine.PagedKV(model.config, 16, 8), max_slots=1, token_budget=16)
    sched.add(alone)
    while sched.has_work():
        sched.step()
    assert first == second == alone.out, "the same seed and settings must give the same tokens"
    assert greedy == _generate(prompt, 6) and first != greedy, "the sampling settings never reached the engine"


def test_a_client_that_leaves_is_cancelled_and_its_blocks_freed(served):
    import time

    import httpx

    srv, events = served
    body = {"prompt": list(range(500, 530)), "max_new": 2000}  # minutes of tokens, unless cancelled
    with httpx.Client(trust_env=False, timeout=60) as client:
        with client.stream("POST", srv.predict_url, json=body) as r:
            got = [json.loads(line) for _, line in zip(range(3), r.iter_lines(), strict=False)]
    assert [("token" in g) for g in got] == [True] * 3  # then the connection closed, 3 tokens in
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        cancelled = [json.loads(x) for x in events.read_text().splitlines()] if events.exists() else []
        cancelled = [e for e in cancelled if e["event"] == "cancelled"]
        if cancelled:
            break
        time.sleep(0.2)
    assert len(cancelled) == 1, "the engine never dropped the request of the client that left"
    assert cancelled[0]["made"] < 2000 and cancelled[0]["blocks_in_use"] == 0, cancelled
    after = stream_load.open_loop_stream(srv.predict_url, [{"prompt": [7, 8, 9], "max_new": 4}], rate=1.0,
                                         n_requests=1, timeout=60)  # fmt: skip
    assert after[0].ok and [x["token"] for x in after[0].lines] == _generate([7, 8, 9], 4)


# ---------------------------------------------------------------- one request cannot break the engine
def _check(prompt, max_new, **kw):
    args = {"vocab_size": 100, "context": 64, "num_blocks": 8, "block_size": 4, **kw}
    engine.check_request(prompt, max_new, **args)


@pytest.mark.parametrize(
    ("prompt", "max_new", "message"),
    [
        ([], 1, "the prompt must be a non-empty list of token ids"),
        ("not ids", 1, "the prompt must be a non-empty list of token ids"),
        ([5, 100], 1, r"prompt token 1 is 100: token ids are whole numbers from 0 to 99"),
        ([-1], 1, r"prompt token 0 is -1: token ids are whole numbers from 0 to 99"),
        ([5, True], 1, r"prompt token 1 is True"),
        ([5, 1.0], 1, r"prompt token 1 is 1.0"),
        ([5], 0, r"max_new must be a whole number >= 1, not 0"),
        ([5], -5, r"max_new must be a whole number >= 1, not -5"),
        ([5], "3", r"max_new must be a whole number >= 1, not '3'"),
        ([5] * 60, 5, r"prompt \(60 tokens\) \+ max_new \(5\) exceeds the model's context of 64 tokens"),
        ([5] * 30, 3, r"needs up to 9 KV blocks and the whole pool has 8: it could never run"),
    ],
)
def test_a_request_that_could_never_run_is_refused_with_its_reason(prompt, max_new, message):
    with pytest.raises(engine.BadRequest, match=message):
        _check(prompt, max_new)


def test_the_boundaries_of_a_valid_request_are_accepted():
    _check([0, 99], 1)  # the vocabulary's both ends, one new token
    _check([5] * 30, 2)  # exactly the whole pool: 32 tokens in 8 blocks of 4
    _check([5] * 60, 4, num_blocks=16)  # exactly the context


@pytest.fixture(scope="module")
def check_body(tmp_path_factory):
    """The server file's `check_body` (the lesson's %%writefile cell, imported), bound as `build_server` binds it."""
    import functools
    import importlib.util

    path = server_process.writefile_fallback(tmp_path_factory.mktemp("l16_check") / "llm_server.py", LESSON)
    spec = importlib.util.spec_from_file_location("l16_llm_server_for_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return functools.partial(module.check_body, check=engine.check_request, check_sampling=engine.check_sampling,
                             vocab_size=100, context=64, num_blocks=8, block_size=4)  # fmt: skip


@pytest.mark.parametrize(
    "sampling",
    [{}, {"temperature": 0}, {"temperature": 0.7, "top_p": 0.9, "seed": 3}, {"temperature": 2, "top_p": 1},
     {"top_p": 1e-9}, {"seed": 0}, {"seed": 2**64 - 1}, {"seed": None}],
)  # fmt: skip
def test_check_body_accepts_good_sampling_settings(check_body, sampling):
    check_body({"prompt": [5, 6], "max_new": 2, **sampling})


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"temperature": -0.5}, "need temperature >= 0 and 0 < top_p <= 1, not -0.5 and 1.0: temperature 0 is greedy"),
        ({"top_p": 0}, r"not 0.0 and 0: temperature 0 is greedy, top_p 1 keeps every token"),
        ({"top_p": 1.5}, r"0 < top_p <= 1, not 0.0 and 1.5"),
        ({"top_p": -0.1}, r"0 < top_p <= 1, not 0.0 and -0.1"),
        ({"temperature": "0.7"}, r"temperature must be a finite number, not '0.7': e.g. temperature 0.7, top_p 0.9"),
        ({"temperature": True}, r"temperature must be a finite number, not True"),
        ({"top_p": None}, r"top_p must be a finite number, not None"),
        ({"top_p": [0.9]}, r"top_p must be a finite number, not \[0.9\]"),
        ({"temperature": float("nan")}, r"temperature must be a finite number, not nan"),
        ({"temperature": float("inf")}, r"temperature must be a finite number, not inf"),
        ({"seed": 1.5}, r"seed must be a whole number from 0 to 2\*\*64 - 1 \(or left out\), not 1.5"),
        ({"seed": "3"}, r"seed must be a whole number .*, not '3'"),
        ({"seed": True}, r"seed must be a whole number .*, not True"),
        ({"seed": -1}, r"seed must be a whole number .*, not -1"),
        ({"seed": 2**64}, r"seed must be a whole number .*, not 18446744073709551616"),
    ],
)
def test_check_body_refuses_bad_sampling_settings_naming_the_fix(check_body, sampling, message):
    with pytest.raises(engine.BadRequest, match=message):
        check_body({"prompt": [5, 6], "max_new": 2, **sampling})


def test_two_requests_with_the_same_seed_in_one_batch_make_the_same_tokens(model):
    sched = engine.Scheduler(model, engine.PagedKV(model.config, 32, 4), max_slots=3, token_budget=32)
    prompt, settings = list(range(3, 14)), {"temperature": 1.0, "top_p": 0.95}
    reqs = [engine.Request(0, prompt, 8, seed=21, **settings), engine.Request(1, prompt, 8, seed=21, **settings),
            engine.Request(2, prompt, 8, seed=22, **settings)]  # fmt: skip
    for r in reqs:
        sched.add(r)
    while sched.has_work():
        made = sched.step()
        assert len({r.rid for r, _ in made}) == len(made)
    assert reqs[0].out == reqs[1].out and len(reqs[0].out) == 8  # one batch, the same seed: the same draws
    assert reqs[2].out != reqs[0].out  # another seed, other draws (fixed seeds: the same outcome every run)
    assert reqs[0].out != reference(model, prompt, 8), "temperature 1 must sample, not take the argmax"


def test_the_scheduler_refuses_bad_requests_and_duplicate_ids_before_admission(model):
    sched = engine.Scheduler(model, engine.PagedKV(model.config, 8, 4), max_slots=2, token_budget=16)
    vocab = model.config.vocab_size
    for r in (engine.Request(0, [], 2), engine.Request(0, [vocab], 2), engine.Request(0, [5], 0)):
        with pytest.raises(engine.BadRequest):
            sched.add(r)
    sched.add(engine.Request(7, [5, 6], 2))
    with pytest.raises(engine.BadRequest, match="request id 7 is already waiting or running"):
        sched.add(engine.Request(7, [8], 2))
    sched.step()  # 7 runs now: its id is still taken
    with pytest.raises(engine.BadRequest, match="request id 7 is already waiting or running"):
        sched.add(engine.Request(7, [8], 2))
    assert [r.rid for r in sched.running] == [7] and not sched.waiting


def test_a_cancelled_request_leaves_at_once_and_frees_its_blocks(model):
    kv = engine.PagedKV(model.config, 16, 4)
    sched = engine.Scheduler(model, kv, max_slots=1, token_budget=32)
    a, b = engine.Request(0, list(range(3, 12)), 50), engine.Request(1, list(range(3, 8)), 3)
    sched.add(a)
    sched.add(b)
    sched.step()
    sched.step()
    assert kv.blocks_in_use() == 3 and list(sched.waiting) == [b]
    assert sched.cancel(0) is a and a.error == "cancelled" and kv.blocks_in_use() == 0 and 0 not in kv.tables
    assert sched.cancel(0) is None  # twice, or an unknown id: nothing happens
    made = sched.step()  # the very next step: b runs in the freed slot, a makes nothing more
    assert [r.rid for r, _ in made] == [1] and len(a.out) == 2
    assert sched.cancel(1) is b and not sched.has_work() and kv.blocks_in_use() == 0
    c = engine.Request(2, [5, 6], 2)
    sched.add(c)
    assert sched.cancel(2) is c and not sched.waiting  # a waiting request leaves the queue


class Poisoned(torch.nn.Module):
    """The model's embedding, raising when it meets POISON (an engine fault one request triggers)."""

    POISON = 777

    def __init__(self, embed):
        super().__init__()
        self.embed = embed

    def forward(self, ids):
        if bool((ids == self.POISON).any()):
            raise RuntimeError("poisoned token")
        return self.embed(ids)


@pytest.mark.parametrize(("budget", "caching"), [(64, True), (None, False), (5, "partial")])
def test_an_exception_in_a_step_fails_only_the_request_that_caused_it(model, budget, caching):
    import copy

    bad_model = copy.deepcopy(model)
    bad_model.model.embed_tokens = Poisoned(bad_model.model.embed_tokens)
    kv = engine.PagedKV(model.config, 32, 4, prefix_caching=caching)
    sched = engine.Scheduler(bad_model, kv, max_slots=3, token_budget=budget)
    head = list(range(40, 48))  # a shared head: the bad request's blocks must not stay in the prefix cache
    good = [engine.Request(0, head + [9, 10, 11], 6), engine.Request(2, head + [12, 13], 6)]
    bad = engine.Request(1, head + [Poisoned.POISON, 14, 15, 16, 17], 6)
    for r in (good[0], bad, good[1]):
        sched.add(r)
    while sched.has_work():
        sched.step()
    assert sched.failed == [bad] and bad.error == "RuntimeError: poisoned token" and bad.out == []
    for r in good:
        assert r.out == reference(model, r.prompt, 6) and not r.error
    assert kv.blocks_in_use() == 0
    assert all(Poisoned.POISON not in key for key in kv.cache), "a failed step left its blocks in the prefix cache"
    again = engine.Request(3, list(good[0].prompt), 6)  # the cache still gives right answers
    sched.add(again)
    while sched.has_work():
        sched.step()
    assert again.out == good[0].out


def reference(model, prompt, max_new):
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("caching", [True, "partial"])
def test_a_request_needing_exactly_the_whole_pool_runs_after_a_partial_hit(model, caching):
    kv = engine.PagedKV(model.config, 5, 4, prefix_caching=caching)
    sched = engine.Scheduler(model, kv, max_slots=2, token_budget=64)
    first = engine.Request(0, list(range(20, 32)), 1)  # 3 full cached blocks
    sched.add(first)
    while sched.has_work():
        sched.step()
    exact = engine.Request(1, list(range(20, 30)) + list(range(60, 69)), 1)  # 19 + 1 tokens: all 5 blocks
    sched.add(exact)
    for _ in range(40):  # it runs: no livelock on the copy-on-write block it would need first
        if not sched.has_work():
            break
        sched.step()
    assert not sched.has_work() and exact.out == reference(model, exact.prompt, 1)
    assert exact.cached == 8 and kv.blocks_in_use() == 0  # two full blocks from the cache


def test_rollback_forgets_the_tokens_and_the_cache_entries_of_a_failed_step(config):
    kv = engine.PagedKV(config, 8, 4, prefix_caching=True)
    kv.add(0)
    kv.append(0, [1, 2, 3, 4, 5, 6])
    kv.append(0, [7, 8, 9])  # the step that fails: it filled block 1 (indexed) and took block 2
    kv.rollback(0, 6)
    assert kv.tokens[0] == [1, 2, 3, 4, 5, 6] and len(kv.tables[0]) == 2 and kv.blocks_in_use() == 2
    assert (1, 2, 3, 4) in kv.cache and (1, 2, 3, 4, 5, 6, 7, 8) not in kv.cache


def test_random_scenarios_with_cancels_faults_and_bad_requests_leave_no_block_and_right_answers():
    import copy
    import random

    model = cu.llm.tiny_llama(
        num_hidden_layers=2,
        vocab_size=1024,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )  # small: 30 scenarios

    bad_model = copy.deepcopy(model)
    bad_model.model.embed_tokens = Poisoned(bad_model.model.embed_tokens)
    answers = {}

    def want(prompt, cap):
        key = tuple(prompt)
        if key not in answers:
            answers[key] = reference(model, list(prompt), 8)
        return answers[key][:cap]

    stats = {"cancelled": 0, "failed": 0, "refused": 0, "preemptions": 0}
    for seed in range(30):
        rng = random.Random(seed)
        bs, slots = rng.randint(2, 8), rng.randint(1, 5)
        heads = [[rng.randrange(3, 900) for _ in range(rng.randint(0, 10))] for _ in range(2)]
        reqs = []
        for i in range(rng.randint(3, 7)):
            prompt = rng.choice(heads) + [rng.randrange(3, 900) for _ in range(rng.randint(1, 9))]
            if rng.random() < 0.15:
                prompt.insert(rng.randrange(len(prompt) + 1), Poisoned.POISON)
            reqs.append(engine.Request(i, prompt, rng.randint(1, 8)))
        need = max(-(-(len(r.prompt) + r.max_new) // bs) for r in reqs)
        kv = engine.PagedKV(
            model.config, rng.randint(need, 3 * need), bs, prefix_caching=rng.choice([False, True, "partial"])
        )
        sched = engine.Scheduler(bad_model, kv, max_slots=slots, token_budget=rng.choice([None, 3, 8, 32]))
        arrive = {r.rid: rng.randint(0, 6) for r in reqs}
        cancel_at = {r.rid: rng.randint(0, 12) for r in reqs if rng.random() < 0.2}
        step = 0
        while step < 400 and (sched.has_work() or step <= 6):
            for r in reqs:
                if arrive[r.rid] == step:
                    sched.add(r)
            if rng.random() < 0.2:  # a bad request now and then: refused, nothing queued
                with pytest.raises(engine.BadRequest):
                    sched.add(rng.choice([engine.Request(99, [], 2), engine.Request(99, [5], 0),
                                          engine.Request(reqs[0].rid, [5], 2) if reqs[0] in sched.waiting else
                                          engine.Request(99, [model.config.vocab_size], 2)]))  # fmt: skip
                stats["refused"] += 1
            for rid, at in cancel_at.items():
                if at == step and sched.cancel(rid) is not None:
                    stats["cancelled"] += 1
            sched.step()
            step += 1
        assert not sched.has_work(), f"seed {seed}: no progress after {step} steps"
        assert kv.blocks_in_use() == 0, f"seed {seed}: {kv.blocks_in_use()} blocks still held"
        stats["failed"] += len(sched.failed)
        stats["preemptions"] += sched.preemptions
        for r in reqs:
            if r.error == "cancelled":
                assert r.out == want(r.prompt, 8)[: len(r.out)], f"seed {seed}: request {r.rid}"
            elif Poisoned.POISON in r.prompt:
                assert r in sched.failed and r.error == "RuntimeError: poisoned token", f"seed {seed}: {r.rid}"
            else:
                assert r.out == want(r.prompt, r.max_new) and not r.error, f"seed {seed}: request {r.rid}"
    assert min(stats.values()) > 0, stats  # every kind of trouble happened somewhere


@pytest.mark.parametrize(("watermark", "admitted"), [(0.0, [0, 1, 2]), (0.25, [0, 1])])
def test_a_watermark_keeps_spare_blocks_free_at_admission(model, watermark, admitted):
    kv = engine.PagedKV(model.config, num_blocks=8, block_size=4)
    sched = engine.Scheduler(model, kv, max_slots=4, token_budget=64, watermark=watermark)
    assert sched.spare == int(8 * watermark)
    for i, n in enumerate((12, 7, 12)):  # 3, 2 and 3 blocks: the last fits exactly, but not with 2 spare
        sched.add(engine.Request(i, list(range(3, 3 + n)), 2))
    assert [r.rid for r, _ in sched.schedule()] == admitted


def test_alone_a_request_is_admitted_despite_the_watermark(model):
    kv = engine.PagedKV(model.config, num_blocks=8, block_size=4)
    sched = engine.Scheduler(model, kv, max_slots=4, token_budget=64, watermark=0.5)
    sched.add(engine.Request(0, list(range(3, 33)), 2))  # all 8 blocks
    assert [r.rid for r, _ in sched.schedule()] == [0]
    with pytest.raises(ValueError, match="watermark is the fraction of the pool"):
        engine.Scheduler(model, kv, max_slots=4, watermark=1.0)


# ---------------------------------------------------------------- sampling and speculative sampling
def test_sampling_probs_pins_temperature_and_the_nucleus():
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert engine.sampling_probs(logits, 0.0).tolist() == [1.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(engine.sampling_probs(logits, 1.0), torch.tensor([0.5, 0.3, 0.15, 0.05]))
    torch.testing.assert_close(engine.sampling_probs(logits, 1.0, 0.8), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    torch.testing.assert_close(engine.sampling_probs(logits, 1.0, 0.81), torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)
    torch.testing.assert_close(engine.sampling_probs(logits, 1.0, 0.4), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    hot = engine.sampling_probs(logits, 0.5)  # a lower temperature sharpens: p^2, renormalized
    torch.testing.assert_close(hot, torch.tensor([0.25, 0.09, 0.0225, 0.0025]) / 0.365)
    for t, p in ((-1.0, 1.0), (1.0, 0.0), (1.0, 1.5)):
        with pytest.raises(ValueError, match="need temperature >= 0 and 0 < top_p <= 1"):
            engine.sampling_probs(logits, t, p)


def _spec_counts(p, q, n, rule, seed=0):
    g = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q, n, replacement=True, generator=g).tolist()
    counts = torch.zeros(len(p))
    for x in drafts:
        counts[rule(p, q, x, g)[0]] += 1
    return counts


def test_speculative_sampling_gives_the_target_distribution_chi_square():
    from scipy.stats import chisquare

    tiny = {"vocab_size": 12, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 16, "num_hidden_layers": 1}  # fmt: skip
    target, draft = cu.llm.tiny_llama(1, **tiny), cu.llm.tiny_llama(2, **tiny)
    ids = torch.tensor([[1, 5, 3, 7]])
    with torch.inference_mode():
        lp, lq = target(ids).logits[0, -1], draft(ids).logits[0, -1]
    p = engine.sampling_probs(lp / lp.std(), 1.0, 0.95)  # the target's distribution, nucleus-cut
    q = engine.sampling_probs(lq / lq.std(), 1.0)  # a different draft
    assert (p - q).abs().sum() > 0.3, "the draft must differ from the target for the test to mean something"
    n = 20000
    counts = _spec_counts(p, q, n, engine.accept_or_resample)
    support = p > 0
    assert counts[~support].sum() == 0, "a token outside the target's nucleus came out"
    fit = chisquare(counts[support].numpy(), (p[support] * n).numpy())
    assert fit.pvalue > 1e-4, (fit, counts, p * n)

    def wrong(p, q, x, g):  # resamples from p, not from the residual max(0, p - q): biased
        if float(torch.rand((), generator=g)) * float(q[x]) < float(p[x]):
            return x, True
        return int(torch.multinomial(p, 1, generator=g)), False

    bad = _spec_counts(p, q, n, wrong)
    assert chisquare(bad[support].numpy(), (p[support] * n).numpy()).pvalue < 1e-4, "the test has no power"


def test_sampled_requests_are_reproducible_and_temperature_zero_is_greedy(model):
    outs = []
    for _ in range(2):
        kv = engine.PagedKV(model.config, 32, 4)
        sched = engine.Scheduler(model, kv, max_slots=3, token_budget=16)
        reqs = [engine.Request(0, list(range(3, 12)), 6, temperature=0.8, top_p=0.9, seed=5),
                engine.Request(1, list(range(20, 27)), 6)]  # fmt: skip
        for r in reqs:
            sched.add(r)
        while sched.has_work():
            sched.step()
        outs.append([r.out for r in reqs])
        assert kv.blocks_in_use() == 0
    assert outs[0] == outs[1] and len(outs[0][0]) == 6
    assert outs[0][1] == reference(model, list(range(20, 27)), 6)
    sched = engine.Scheduler(model, engine.PagedKV(model.config, 8, 4), max_slots=1)
    for bad in ({"temperature": -0.5}, {"top_p": 0.0}, {"temperature": "hot"}):
        with pytest.raises(engine.BadRequest):
            sched.add(engine.Request(9, [5, 6], 2, **bad))


@pytest.mark.parametrize(
    ("body", "error"),
    [(b"", "an empty answer (status 200): no line streamed"),
     (b'{"token": 5}\n{"error": "RuntimeError: boom"}\n', "the server reported: RuntimeError: boom")],
)  # fmt: skip
def test_the_load_client_counts_an_empty_or_errored_stream_as_a_failure(body, error):
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server name
            self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/predict"
        (answer,) = stream_load.open_loop_stream(url, [{"prompt": [1]}], rate=1.0, n_requests=1, timeout=10)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert answer.status == 200 and not answer.ok and answer.error == error


# ---------------------------------------------------------------- the request-rate sweep's knee
TARGET = 100.0  # ms


def _rows(*points):
    """Made-up sweep rows: (rate, p99 TTFT ms, grew) each; the first row's `grew` is None, as the lesson makes it."""
    return [{"rate": r, "ttft_p99_ms": t, "grew": g} for r, t, g in points]


@pytest.mark.parametrize(("p99_at_4", "knee"), [(TARGET, 4.0), (TARGET + 0.01, 2.0)])
def test_the_knee_is_the_last_rate_whose_p99_ttft_is_within_the_target(p99_at_4, knee):
    rows = _rows((1.0, 20.0, None), (2.0, 40.0, True), (4.0, p99_at_4, True), (8.0, 900.0, True))
    got, why = engine.rate_knee(rows, TARGET)
    if knee == 4.0:  # exactly at the target is within it; the next rate breaks it
        assert got == 4.0 and "at 8 requests/s the p99 TTFT (900 ms) is over the target of 100 ms" in why
    else:  # just over the target at 4/s: the knee is the rate before
        assert got == 2.0 and "at 4 requests/s the p99 TTFT (100 ms) is over the target" in why


@pytest.mark.parametrize(("grew_at_4", "knee"), [(True, 8.0), (False, 2.0)])
def test_the_knee_stops_where_the_throughput_stops_growing(grew_at_4, knee):
    rows = _rows((1.0, 20.0, None), (2.0, 30.0, True), (4.0, 50.0, grew_at_4), (8.0, 80.0, True))
    got, why = engine.rate_knee(rows, TARGET)
    assert got == knee
    if grew_at_4:
        assert "every rate tried" in why and "or above it" in why  # no limit found: the knee is at least 8/s
    else:
        assert why == "at 4 requests/s the throughput did not grow beyond the noise"


def test_no_knee_when_the_lowest_rate_already_breaks_the_target():
    got, why = engine.rate_knee(_rows((1.0, 150.0, None), (2.0, 300.0, False)), TARGET)
    assert got is None and "at 1 requests/s the p99 TTFT (150 ms)" in why
    assert engine.rate_knee(_rows((1.0, 99.0, None)), TARGET)[0] == 1.0  # one row within: the knee is that rate


# ---------------------------------------------------------------- the peer engine: transformers' generate_batch
def test_first_difference_names_the_request_the_position_and_both_tokens():
    assert engine.first_difference([[1, 2], [3]], [[1, 2], [3]]) is None
    assert engine.first_difference([[1, 2], [3, 4, 5]], [[1, 2], [3, 9, 5]]) == (1, 1, 4, 9)
    assert engine.first_difference([[1, 2]], [[1, 2, 7]]) == (0, 2, None, 7)  # a shorter answer: None
    with pytest.raises(ValueError):  # a missing answer is not "no difference"
        engine.first_difference([[1]], [[1], [2]])


def test_the_peer_engine_gives_generates_tokens_with_a_time_for_each(model):
    prompts = [list(range(3, 3 + n)) for n in (5, 17, 9)]
    attn = model.config._attn_implementation
    res = engine.peer_generate_batch(model, prompts, 4, eos=None, slots=2, token_budget=16, block_size=4,
                                     num_blocks=24)  # fmt: skip
    assert set(res) == {"answers", "ttft_s", "tokens", "seconds"}
    assert res["answers"] == [reference(model, p, 4) for p in prompts]  # greedy, in the order of the prompts
    assert res["tokens"] == 12 and len(res["ttft_s"]) == 3
    assert all(0 < t <= res["seconds"] for t in res["ttft_s"])
    assert model.config._attn_implementation == attn, "generate_batch must leave the model's attention as it was"


class _Peer:
    """A stand-in for a model: `generate_batch` returns `results` (or raises `exc`)."""

    def __init__(self, results=None, exc=None):
        self.results, self.exc = results, exc

    def generate_batch(self, prompts, **kwargs):
        if self.exc is not None:
            raise self.exc
        return self.results


def _output(tokens, error=None):
    from types import SimpleNamespace

    return SimpleNamespace(generated_tokens=tokens, error=error, created_time=0.0,
                           timestamps=[0.1 * (i + 1) for i in range(len(tokens))] or None)  # fmt: skip


PEER_ARGS = {"eos": None, "slots": 2, "token_budget": 16, "block_size": 4, "num_blocks": 8}


@pytest.mark.parametrize(
    ("peer", "message"),
    [
        (torch.nn.Linear(2, 2), "this model has no generate_batch (transformers "),  # an older transformers
        (_Peer(exc=RuntimeError("no kernel for this device")), "RuntimeError: no kernel for this device"),
        (_Peer(exc=TypeError("unexpected keyword 'record_timestamps'")), "TypeError: unexpected keyword"),
        (_Peer(results={}), "generate_batch returned 0 good answers of 2"),
        (_Peer(results={"a": _output([5]), "b": _output([], error="out of blocks")}), "1 good answers of 2: out of"),
    ],
)
def test_a_peer_that_cannot_run_raises_peer_unavailable_with_the_reason(peer, message):
    with pytest.raises(engine.PeerUnavailable, match=re.escape(message)):
        engine.peer_generate_batch(peer, [[1, 2], [3]], 2, **PEER_ARGS)


def test_a_working_peer_stand_in_gives_the_shape_the_lesson_reads():
    peer = _Peer(results={"a": _output([5, 6]), "b": _output([7])})
    res = engine.peer_generate_batch(peer, [[1, 2], [3]], 2, **PEER_ARGS)
    assert res["answers"] == [[5, 6], [7]] and res["tokens"] == 3
    assert res["ttft_s"] == [0.1, 0.1] and res["seconds"] == pytest.approx(0.2)


# ---------------------------------------------------------------- the profile side by side: its categories
def _averages(*rows):
    """Made-up `prof.key_averages()` entries: (key, self CPU time in microseconds[, a user annotation])."""
    from types import SimpleNamespace

    return [SimpleNamespace(key=k, self_cpu_time_total=us, count=1, is_user_annotation=bool(rest))
            for k, us, *rest in rows]  # fmt: skip


def test_profile_groups_sort_operators_and_leave_the_rest_of_the_span_to_python():
    sdpa = "aten::_scaled_dot_product_flash_attention_for_cpu"
    avg = _averages(("aten::mm", 5000), ("aten::addmm", 1000), (sdpa, 700), ("aten::index_select", 300),
                    ("aten::index_copy_", 200), ("aten::cat", 100), ("aten::copy_", 50), ("aten::mul", 400),
                    ("aten::frobnicate", 250), ("detach_", 10), ("## a range ##", 9000, True))  # fmt: skip
    groups = engine.profile_groups(avg, span_ms=10.0)
    assert list(groups) == [*engine.PROFILE_GROUPS, "other tensor ops", engine.PYTHON_AND_WAITING]
    assert groups["matmul (linear layers)"] == pytest.approx(6.0)
    assert groups["attention (SDPA)"] == pytest.approx(0.7)
    assert groups["index, copy, cat (KV reads/writes among them)"] == pytest.approx(0.65)
    assert groups["other tensor ops"] == pytest.approx(0.66)  # mul, an operator no category names, a non-aten op
    assert groups[engine.PYTHON_AND_WAITING] == pytest.approx(10.0 - 8.01)  # the annotation is not an operator
    assert sum(groups.values()) == pytest.approx(10.0)  # the categories add up to the span


@pytest.mark.parametrize(
    ("key", "group"),
    [("aten::mm", "matmul (linear layers)"), ("aten::linear", "matmul (linear layers)"),
     ("aten::_safe_softmax", "attention (SDPA)"), ("aten::scaled_dot_product_attention", "attention (SDPA)"),
     ("aten::_index_put_impl_", "index, copy, cat (KV reads/writes among them)"),
     ("aten::_to_copy", "index, copy, cat (KV reads/writes among them)"),
     ("aten::mmx", "other tensor ops"), ("aten::concat", "other tensor ops"), ("index_select", "other tensor ops"),
     ("", "other tensor ops")],
)  # fmt: skip
def test_an_operator_no_category_names_lands_in_other(key, group):
    assert engine.profile_group(key) == group


def test_python_time_is_never_negative_when_the_operators_outlast_the_span():
    groups = engine.profile_groups(_averages(("aten::mm", 8000), ("aten::mul", 4000)), span_ms=10.0)  # two threads
    assert groups[engine.PYTHON_AND_WAITING] == 0.0
    assert sum(groups.values()) == pytest.approx(12.0)  # then they add up to the operator time
    assert engine.profile_groups([], span_ms=3.0)[engine.PYTHON_AND_WAITING] == 3.0
