"""Lesson 15's CPU techniques, run as the lesson's own cells (tagged "contract") on a 2-layer model of SmolLM2's shape.

The two loops timed side by side (paired_decode: every step, both loops, same token) and the KV cache stored in
INT8 by hand (forward_int8_kv: logits within INT8 error of the FP32 cache, the bytes it holds pinned, chunks causal);
its quality as agreement per position along the FP32 sequence, teacher-forced (teacher_forced_picks), judged from
the share's interval (agreement_verdict).
"""

from __future__ import annotations

import pytest
import torch

from course_utils.supply import llm
from tests.gpu_contract.lesson_code import lesson_namespace


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("15")


@pytest.fixture(scope="module")
def model():
    return llm.tiny_llama(num_hidden_layers=2, vocab_size=4096)


def _prompt(n=10, seed=0):
    return torch.randint(3, 4096, (1, n), generator=torch.Generator().manual_seed(seed))


def _generate(model, ids, n):
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[:, ids.shape[1] :]


def test_paired_decode_runs_both_loops_and_matches_generate(ns, model):
    ids = _prompt(8)
    new, t_none, t_kv, cache = ns["paired_decode"](model, ids, 6)
    assert torch.equal(new, _generate(model, ids, 6))
    assert len(t_none) == len(t_kv) == 6 and cache.get_seq_length() == 8 + 5


def test_int8_kv_forward_stays_close_to_fp32_and_holds_fewer_bytes(ns, model):
    ids = _prompt(12)
    kv32, kv8 = [None] * 2, [None] * 2
    with torch.inference_mode():
        a = ns["forward_with_cache"](model, ids, kv32, 0)
        b = ns["forward_int8_kv"](model, ids, kv8, 0)
        nxt = a.argmax(-1)
        a2, b2 = ns["forward_with_cache"](model, nxt, kv32, 12), ns["forward_int8_kv"](model, nxt, kv8, 12)
    for x, y in ((a, b), (a2, b2)):
        assert (x - y).abs().max() < 0.05 * x.abs().max()  # INT8 error, far below the logits' scale
    assert kv8[0][0][0].dtype == torch.int8 and kv8[0][0][0].shape == (1, 3, 13, 64)
    assert ns["kv_cache_bytes"](kv32) == 2 * 2 * 13 * 3 * 64 * 4  # layers x K,V x tokens x heads x dim x fp32
    assert ns["kv_cache_bytes"](kv8) == 2 * 2 * 13 * 3 * (64 + 4)  # INT8 values + one FP32 scale per vector


def test_int8_kv_chunks_are_causal(ns, model):
    """A prompt in two chunks gives the logits of one pass: the mask lets a chunk see the cache, not its future."""
    ids = _prompt(10)
    with torch.inference_mode():
        whole = ns["forward_int8_kv"](model, ids, [None] * 2, 0, all_logits=True)
        kv = [None] * 2
        ns["forward_int8_kv"](model, ids[:, :6], kv, 0)
        rest = ns["forward_int8_kv"](model, ids[:, 6:], kv, 6, all_logits=True)
    torch.testing.assert_close(rest, whole[:, 6:], atol=1e-4, rtol=1e-4)


def test_teacher_forced_picks_are_the_choice_after_each_prefix(ns, model):
    """Fed the INT8-KV loop's own free-running tokens, one teacher-forced pass picks exactly those tokens (entry j is
    the choice for token j, not j+1 nor j-1); the FP32 forward picks generate's tokens."""
    ids = _prompt(9, seed=3)
    own, _ = ns["greedy_int8_kv"](model, ids, 6)
    picks = ns["teacher_forced_picks"](ns["forward_int8_kv"], model, ids, own)
    assert picks.shape == (1, 6) and torch.equal(picks, own)
    ref = _generate(model, ids, 6)
    fp32 = ns["teacher_forced_picks"](lambda m, seq, kv, start, all_logits: m(seq).logits, model, ids, ref)
    assert torch.equal(fp32, ref)
    # Each position is judged on the FP32 prefix: a wrong token fed at j changes only what follows it
    wrong = ref.clone()
    wrong[0, 3] = (ref[0, 3] + 1) % 4096
    again = ns["teacher_forced_picks"](ns["forward_int8_kv"], model, ids, wrong)
    assert torch.equal(again[:, :4], ns["teacher_forced_picks"](ns["forward_int8_kv"], model, ids, ref)[:, :4])


@pytest.mark.parametrize(
    "same, total, verdict",
    [
        (8, 8, "not shown"),  # 8 positions cannot show 90% (95% CI 63-100%)
        (7, 8, "not shown"),  # one flip of 8 is not "missed" either
        (128, 128, "met"),
        (124, 128, "met"),  # 96.9%, CI low 92.2%
        (120, 128, "not shown"),  # 93.8%, CI low 88.1%
        (100, 128, "missed"),  # 78.1%, CI high 85.2%
        (0, 8, "missed"),
    ],
)
def test_agreement_verdict_reads_the_interval(ns, same, total, verdict):
    text, judged = ns["agreement_verdict"](same, total)
    assert judged == verdict
    assert text.startswith(f"{same} of {total} positions, {same / total:.1%} (95% CI ")
