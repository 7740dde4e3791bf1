"""Lesson 15's decode loops and GPU-section helpers, run on CPU: the cells the learner reads (tagged "contract").

The GPU sections run `greedy_cache` (batch 1 and left-padded batch 8), `attention_ops` (the profiler proof of the
attention kernel), a decode step compiled through `greedy_cache` on a `StaticCache`, and torchao's INT4 config.
Here each runs on a 2-layer random model of SmolLM2's shape (BF16 where the GPU section uses BF16) against the
real transformers/torch/torchao APIs, and every loop is compared with greedy `generate`, so a planted bug in
the loops (positions, cache, causal mask) fails.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import DynamicCache, StaticCache

from course_utils.supply import llm
from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "15.gpu-sdpa": "attention_ops names the kernel that ran from the profiler: the math kernel under "
    "SDPBackend.MATH, the flash kernel under FLASH_ATTENTION (CPU versions), on the model's own forward",
    "15.gpu-bf16-decode": "greedy_cache in BF16 matches greedy generate token for token at batch 1 and at a "
    "left-padded batch of 8 (attention_mask, positions from the mask, pad = EOS); weights_bytes counts a tied "
    "embedding and LM head once, also when a copy unties them",
    "15.gpu-cuda-graphs": "a decode step compiled through greedy_cache on a StaticCache traces one graph for every "
    "step (a DynamicCache recompiles) and matches generate; decode_step_fn (the timed step) keeps the cache's length; "
    "mode='reduce-overhead' itself needs a GPU",
    "15.gpu-gqa": "gqa_variants/gqa_table on CPU in FP32 and BF16: enable_gqa=True equals expanded K/V, the profiler "
    "names the kernel each ran, the times come from cu.compare",
    "15.gpu-int4": "Int4WeightOnlyConfig(group_size=128, int4_packing_format='tile_packed_to_4d') is accepted by "
    "the installed torchao; the INT4 kernels themselves need a GPU",
}


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("15")


@pytest.fixture(scope="module")
def model():
    return llm.tiny_llama(num_hidden_layers=2, vocab_size=4096)


def _prompt(n=10, seed=0):
    return torch.randint(3, 4096, (1, n), generator=torch.Generator().manual_seed(seed))


def _generate(model, ids, n, mask=None):
    mask = torch.ones_like(ids) if mask is None else mask
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False)
    return out[:, ids.shape[1] :]


def test_every_loop_matches_generate(ns, model):
    ids = _prompt()
    ref = _generate(model, ids, 7)
    assert ref.shape == (1, 7)
    for name, (new, times) in {
        "no cache": ns["greedy_no_cache"](model, ids, 7),
        "hand-written cache": ns["greedy_hand_cache"](model, ids, 7),
        "DynamicCache": ns["greedy_cache"](model, ids, 7, DynamicCache(config=model.config)),
        "StaticCache": ns["greedy_cache"](model, ids, 7, StaticCache(config=model.config, max_cache_len=20)),
    }.items():
        assert torch.equal(new, ref), name
        assert len(times) == 7 and all(t > 0 for t in times), name


def test_hand_cache_holds_grouped_kv_heads(ns, model):
    kv = [None] * model.config.num_hidden_layers
    ns["forward_with_cache"](model, _prompt(6), kv, 0)
    assert kv[0][0].shape == (1, model.config.num_key_value_heads, 6, model.config.head_dim)  # 3 heads, not 9
    ns["forward_with_cache"](model, torch.tensor([[5]]), kv, 6)
    assert kv[1][1].shape[2] == 7


def test_bf16_batch_with_left_padding_matches_batched_generate(ns):
    model = llm.tiny_llama(num_hidden_layers=2, vocab_size=4096, dtype=torch.bfloat16)
    lengths = [9, 7, 5, 8]
    ids = torch.full((4, 9), 2, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, -n:], mask[i, -n:] = _prompt(n, seed=i)[0], 1
    ref = _generate(model, ids, 5, mask)
    new, times = ns["greedy_cache"](model, ids, 5, DynamicCache(config=model.config), mask=mask)
    assert torch.equal(new, ref)
    one, _ = ns["greedy_cache"](model, ids[1:2, -7:], 5, DynamicCache(config=model.config))
    assert torch.equal(one, _generate(model, ids[1:2, -7:], 5))


def test_attention_ops_names_the_kernel(ns, model):
    ids = _prompt(12)
    with torch.inference_mode():
        with sdpa_kernel(SDPBackend.MATH):
            math_ops = ns["attention_ops"](lambda: model(ids))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash_ops = ns["attention_ops"](lambda: model(ids))
    assert "aten::_scaled_dot_product_attention_math" in math_ops
    assert not any("flash" in o for o in math_ops)
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in flash_ops
    assert not any(o.endswith("_math") for o in flash_ops)


def test_static_cache_compiles_one_graph(ns, model):
    ids = _prompt(8)
    assert ns["count_compiles"](model, StaticCache(config=model.config, max_cache_len=24), ids, 5) == 1
    assert ns["count_compiles"](model, DynamicCache(config=model.config), ids, 5) >= 2


def test_int4_config_is_accepted():
    from torchao.quantization import Int4WeightOnlyConfig

    cfg = Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")
    assert cfg.group_size == 128 and "tile_packed_to_4d" in str(cfg.int4_packing_format).lower()


def test_hand_forward_logits_match_the_model(ns, model):
    """Token parity on a random model is weak evidence (its argmax barely depends on context): compare logits."""
    ids = _prompt(9)
    kv = [None] * model.config.num_hidden_layers
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        mine = ns["forward_with_cache"](model, ids, kv, 0)[:, -1]
        theirs = model(ids, **llm.cache_arg(model, cache)).logits[:, -1]
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)
        nxt = theirs.argmax(-1, keepdim=True)
        mine = ns["forward_with_cache"](model, nxt, kv, 9)[:, -1]
        theirs = model(nxt, **llm.cache_arg(model, cache)).logits[:, -1]
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-4)


def test_gqa_ways_agree_and_the_profiler_names_their_kernels(ns, model):
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(1, 9, 16, 64).to(dtype)
        k, v = torch.randn(1, 3, 16, 64).to(dtype), torch.randn(1, 3, 16, 64).to(dtype)
        fns = ns["gqa_variants"](q, k, v)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(fns["enable_gqa=True"](), fns["expanded K/V"](), atol=tol, rtol=tol)
    table = ns["gqa_table"]("cpu", [torch.float32], 16, model.config, rounds=2)
    assert list(table["way"]) == ["enable_gqa=True", "expanded K/V"]
    assert all(k for k in table["kernel (profiler)"]) and (table["ms"] > 0).all()


def test_weights_bytes_counts_a_tied_head_once(ns, model):
    once = sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() deduplicates tied weights
    assert ns["weights_bytes"](model) == once
    untied = copy.deepcopy(model)
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())  # what an untying copy does
    assert ns["weights_bytes"](untied) == once


def test_decode_step_fn_decodes_at_the_same_position(ns, model):
    ids = _prompt(7)
    for cache in (DynamicCache(config=model.config), StaticCache(config=model.config, max_cache_len=9)):
        step = ns["decode_step_fn"](model, ids, cache=cache)
        for _ in range(3):
            step()
        assert cache.get_seq_length() == 7  # each call appended one token and cropped it again
