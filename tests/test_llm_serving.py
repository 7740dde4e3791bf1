"""Lesson 16's serving engine, as exported to course_utils/from_lessons/l16_llm_serving.py, and its streaming server.

Pinned cases with known answers: the mask attention reads the blocks through, copy-on-write of a shared block,
least-recently-used eviction of cached blocks, admission by free blocks, decodes scheduled before prompt chunks;
then the lesson's LitServe server (its `%%writefile` cell) streaming over 127.0.0.1 to the course's streaming
load generator, every stream equal to greedy `generate`, a bad request ending only its own stream.
"""

from __future__ import annotations

import json
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
    kv = engine.PagedKV(config, num_blocks=8, block_size=4, prefix_caching=True)
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


def test_an_identical_prompt_leaves_its_last_token_to_compute(config):
    kv = engine.PagedKV(config, num_blocks=8, block_size=4, prefix_caching=True)
    kv.add(0)
    kv.append(0, list(range(8)))
    kv.release(0)
    kv.add(1)
    assert kv.match_prefix(1, list(range(8))) == 7  # its logits give the next token: it is computed again


def test_idle_cached_blocks_are_evicted_least_recently_used_first(config):
    kv = engine.PagedKV(config, num_blocks=3, block_size=2, prefix_caching=True)
    kv.add(0)
    kv.append(0, [1, 2, 3, 4])  # blocks 0 and 1, both cached
    kv.release(0)
    assert kv.blocks_free() == 3 and list(kv.idle) == [0, 1]
    kv.add(1)
    kv.append(1, [9, 9, 9, 9])  # block 2 from the free list, then the oldest idle block (0)
    assert kv.tables[1] == [2, 0] and (1, 2) not in kv.cache and (1, 2, 3, 4) in kv.cache


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


def test_decodes_are_scheduled_before_prompt_chunks(model):
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


def test_the_lessons_server_streams_answers_equal_to_generate(tmp_path, monkeypatch):
    server_file = server_process.writefile_fallback(tmp_path / "llm_server.py", LESSON)
    settings = {"token_budget": 16, "num_blocks": 32, "block_size": 8, "layers": 2, "prefix_caching": True}
    monkeypatch.setenv("COURSE_16_SERVER", json.dumps(settings))
    model, tok = engine.serving_model(2)
    eos = tok.eos_token_id if tok is not None else None
    prompts = [list(range(100, 100 + n)) for n in (11, 19, 11)]
    bodies = [{"prompt": p, "max_new": 5} for p in prompts] + [{"prompt": "not ids", "max_new": 2}]
    with server_process.serve(f"{server_file}:build_server", max_batch_size=3, start_timeout=300) as srv:
        answers = stream_load.open_loop_stream(srv.predict_url, bodies, rate=20.0, n_requests=4, timeout=120)
    for a, p in zip(answers[:3], prompts, strict=True):
        assert a.ok, a.error
        got = [line["token"] for line in a.lines]
        ids = torch.tensor([p])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
        want = out[0, len(p) :].tolist()
        want = want[: want.index(eos) + 1] if eos in want else want
        assert got == want
        assert len(a.times_s) == len(got) and a.times_s == sorted(a.times_s)
    bad = answers[3]
    assert bad.status == 200 and "error" in bad.lines[0] and "ValueError" in bad.lines[0]["error"]
