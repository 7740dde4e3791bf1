# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 16 · Serving LLMs
#
# **Goals.** Build the engine inside every LLM server yourself, on SmolLM2-135M, and measure each of its parts:
# * a **paged KV cache** (one pool of fixed-size blocks, a block table per sequence, a free list) whose
#   **attention reads the blocks in place**, with no per-step copy of a sequence's keys and values;
# * a **scheduler** with **continuous (iteration-level) batching** and **chunked prefill**: every step has a
#   budget of tokens (vLLM's `max_num_batched_tokens`), filled with one decode token per running sequence and
#   chunks of new prompts; against **static (request-level) batching** and against one-at-a-time prefills,
#   under the same open-loop Poisson load: throughput, time to first token (TTFT), inter-token latency (ITL);
# * **admission by free blocks** and **pre-emption**: a request starts only when its blocks fit, and when
#   the pool runs out a running request gives its blocks back and is recomputed later, with the same output;
#   KV memory **measured**, beside the arithmetic;
# * **prefix caching**: the blocks of a shared prompt prefix (a system prompt) reused by later requests, with
#   reference counts: full blocks as vLLM v1 does, and partial blocks with copy-on-write beside it;
# * a **real streaming server**: this scheduler inside LitServe's continuous-batching loop, on 127.0.0.1,
#   under the course's load generator, TTFT and ITL measured at the client (the clock started when each request
#   was due), **goodput** at stated targets, and one bad or vanished client isolated from the others;
# * a **slots sweep** (vLLM's `max_num_seqs`): where throughput stops growing and the tail starts to;
# * a **request-rate sweep** (vLLM's `--request-rate`) with its knee computed from the numbers, and the engine
#   **side by side with transformers' own continuous batching** (`generate_batch`): the same requests, tokens
#   first, then throughput and p99 TTFT;
# * **speculative decoding**: draft k tokens cheaply, verify them in one pass, keep what the model agrees with;
# * and, on a GPU, the same engine at scale and vLLM (`vllm serve`, `vllm bench serve`).
#
# Every served answer is checked identical to that prompt's greedy `model.generate` before any speed figure,
# and every ratio comes with its 95% interval from rounds in which the variants take turns (`cu.comparing`).
#
# **The bottleneck it attacks** (*01 · Measuring inference*, the taxonomy; *15 · LLM decoding*): a decode step
# is **memory-bound**: it reads every weight to make one token per sequence, so a step for 8 sequences costs far
# less than 8 steps for one (measured below). A server gains by keeping that batch full (continuous batching),
# by putting prompt tokens into the same weight reads (chunked prefill), by not wasting the memory that holds
# the batch (paging), by not recomputing what it computed before (prefix caching), and by making more than one
# token per weight read (speculative decoding).

# %%
import random
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import display

import course_utils as cu

device = cu.lesson.start("16", "Serving LLMs")


# %% [markdown]
# The model: SmolLM2-135M-Instruct when its file is installed (`make setup`), otherwise a random-weight model
# of its shape (speed does not depend on the weights; every check compares that model with its own `generate`).
# At smoke sizes (the tests) only its first 4 layers run, so the whole lesson stays quick; at full size all 30.


# %% tags=["contract", "export"]
import copy  # noqa: E402 - each exported cell carries its own imports (course_utils/from_lessons/l16_llm_serving.py)

import course_utils as cu  # noqa: E402


def serving_model(layers=None):
    """(model, tokenizer or None): SmolLM2-135M-Instruct (FP32), or its random stand-in where the file is missing.

    `layers` keeps only the first n decoder layers (a smaller model of the same weights, for smoke runs)."""
    if cu.llm.has_smollm2():
        model, tok = cu.llm.load_smollm2()
    else:
        model, tok = cu.llm.tiny_llama(), None
    if layers is not None and layers < model.config.num_hidden_layers:
        model = copy.deepcopy(model)  # the loaded model is shared within the process: cut a copy
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
    return model, tok


# %%
LAYERS = cu.pick(full=None, smoke=4)
model, tok = serving_model(LAYERS)
cfg, EOS = model.config, (tok.eos_token_id if tok is not None else None)
MODEL_NAME = ("SmolLM2-135M-Instruct" if tok is not None else "random SmolLM2-shaped Llama") + (
    f", first {LAYERS} layers" if LAYERS else ""
)
if tok is None:
    print("The SmolLM2 file is not installed here (make setup installs it): random weights, token-id prompts.")
n_params = sum(p.numel() for p in model.parameters())
print(
    f"{MODEL_NAME}: {n_params / 1e6:.1f}M parameters, {cfg.num_hidden_layers} layers, "
    f"{cfg.num_key_value_heads} KV heads x {cfg.head_dim} dims; {torch.get_num_threads()} threads"
)

# %% [markdown]
# ## The engine: a paged KV cache
# A server runs one forward pass for sequences of *different* lengths together, and adds or drops a sequence
# between passes. Their keys and values live in a **paged** store (vLLM's PagedAttention):
# * one pool of `num_blocks` blocks of `block_size` token slots, for every layer's keys and values, allocated
#   once (a server takes most of the GPU's memory for it at start);
# * a **block table** per sequence: its blocks, in order (token `p` lives in block `table[p // block_size]`,
#   slot `p % block_size`);
# * a **free list**: a sequence takes a block when its last one is full and gives all back when it ends;
#   nothing is reserved ahead, so the memory in use follows the tokens actually stored;
# * **reference counts**: a block may belong to several sequences (prefix caching, below); a block with
#   more than one holder, or one kept in the prefix cache, is never written: a sequence about to write into
#   it first gets its own copy (**copy-on-write**);
# * `can_append` says whether a sequence's next tokens fit in the free blocks: the scheduler asks it before
#   it schedules anything.


# %% tags=["contract", "export"]
import heapq  # noqa: E402
from collections import OrderedDict  # noqa: E402

import torch  # noqa: E402

from course_utils.supply.errors import CourseError  # noqa: E402


class PagedKV:
    """A paged KV cache: one pool of fixed-size blocks, a block table per sequence, reference-counted blocks.

    With `prefix_caching`, every full block is indexed by its tokens and all the tokens before it, so a later
    sequence that starts with the same tokens reuses the block instead of recomputing it: full blocks only
    (`True`, as vLLM v1), or also the first tokens of one more block, copied on write (`"partial"`, the
    token-granular sharing of SGLang's radix tree and vLLM v0's copy-on-write)."""

    def __init__(self, config, num_blocks, block_size=16, *, prefix_caching=False, device="cpu", dtype=torch.float32):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, not {value!r}: size the pool in blocks")
        if prefix_caching not in (False, True, "partial"):
            raise ValueError(f"prefix_caching must be False, True (full blocks) or 'partial', not {prefix_caching!r}")
        shape = (config.num_hidden_layers, config.num_key_value_heads, num_blocks * block_size, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # [layer, kv head, slot, dim]: the whole pool
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.block_size, self.num_blocks, self.prefix_caching = block_size, num_blocks, prefix_caching
        self.bytes_per_token = 2 * shape[0] * shape[1] * shape[3] * self.k.element_size()  # K and V, all layers
        self.free = list(range(num_blocks))  # the free list, a heap: the lowest free block first
        self.refs = [0] * num_blocks  # how many sequences hold each block
        self.tables: dict[int, list[int]] = {}  # sequence id -> its blocks, in token order
        self.tokens: dict[int, list[int]] = {}  # sequence id -> the token ids whose K/V it stores
        self.cache: dict[tuple, int] = {}  # prefix cache: (every token up to a full block's end) -> that block
        self.key_of: dict[int, tuple] = {}  # cached block -> its key
        self.children: dict[tuple, list[int]] = {}  # the tokens before a cached block -> cached blocks after them
        self.idle: OrderedDict[int, None] = OrderedDict()  # cached blocks no sequence holds, oldest first
        self.copies = 0  # copy-on-write copies made

    def add(self, sid):
        self.tables[sid], self.tokens[sid] = [], []

    def blocks_free(self):
        return len(self.free) + len(self.idle)  # idle cached blocks are taken back when nothing else is free

    def blocks_in_use(self):
        return self.num_blocks - self.blocks_free()

    def _take(self):
        if self.free:
            return heapq.heappop(self.free)
        if self.idle:  # evict the least recently used cached block
            block, _ = self.idle.popitem(last=False)
            key = self.key_of.pop(block)
            del self.cache[key]
            self.children[key[: len(key) - self.block_size]].remove(block)
            return block
        raise CourseError("the KV pool is out of blocks: schedule by free blocks (can_append) or add num_blocks")

    def _drop(self, block):
        self.refs[block] -= 1
        if self.refs[block] == 0:
            if block in self.key_of:
                self.idle[block] = None  # keep its K/V: a later prompt may start with the same tokens
            else:
                heapq.heappush(self.free, block)

    def _shared(self, block):
        return self.refs[block] > 1 or block in self.key_of

    def blocks_needed(self, sid, n):
        """Free blocks sequence sid must take to store n more tokens (a copy-on-write counts as one)."""
        have, table, bs = len(self.tokens[sid]), self.tables[sid], self.block_size
        cow = have % bs != 0 and self._shared(table[-1])
        return max(0, -(-(have + n) // bs) - len(table)) + cow

    def can_append(self, sid, n, claimed=0):
        """True when sid can store n more tokens while `claimed` free blocks are promised to others."""
        return self.blocks_needed(sid, n) + claimed <= self.blocks_free()

    def slots(self, sid, start, stop):
        """Pool slots of tokens start..stop-1 of sequence sid, through its block table."""
        pos = torch.arange(start, stop)
        table = torch.tensor(self.tables[sid], dtype=torch.long)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def append(self, sid, new_tokens):
        """Make room for new_tokens (blocks from the free list, copy-on-write); return the slots they go to."""
        table, have, bs = self.tables[sid], len(self.tokens[sid]), self.block_size
        if have % bs and self._shared(table[-1]):  # copy-on-write: copy our part of a shared block first
            old, new = table[-1], self._take()
            self.refs[new], n = 1, have % bs
            self.k[:, :, new * bs : new * bs + n] = self.k[:, :, old * bs : old * bs + n]
            self.v[:, :, new * bs : new * bs + n] = self.v[:, :, old * bs : old * bs + n]
            table[-1] = new
            self._drop(old)
            self.copies += 1
        while len(table) * bs < have + len(new_tokens):
            block = self._take()
            self.refs[block] = 1
            table.append(block)
        self.tokens[sid] += list(new_tokens)
        if self.prefix_caching:  # index the blocks these tokens filled
            for j in range(have // bs, (have + len(new_tokens)) // bs):
                self._index(sid, j)
        return self.slots(sid, have, have + len(new_tokens))

    def _index(self, sid, j):
        """Put block j of sid in the prefix cache, keyed by its tokens and every token before it."""
        bs, block, tokens = self.block_size, self.tables[sid][j], self.tokens[sid]
        key = tuple(tokens[: (j + 1) * bs])
        if key not in self.cache and block not in self.key_of:
            self.cache[key], self.key_of[block] = block, key
            self.children.setdefault(key[: j * bs], []).append(block)

    def match_prefix(self, sid, tokens, partial=None):
        """Reuse cached blocks for the longest cached prefix of `tokens` (sid still empty); return its length.

        Full blocks are shared as they are, and at least one token is left to compute (its logits give the next
        token): a prompt found whole recomputes its last block, as vLLM v1 does (`max_cache_hit_length =
        num_tokens - 1`, full blocks only: vllm/v1/core/kv_cache_manager.py, `get_computed_blocks`). With
        `partial` (default: `prefix_caching == "partial"`) the first tokens of one more cached block are shared
        too, and the next write copies that block (copy-on-write)."""
        bs, table = self.block_size, self.tables[sid]
        if not self.prefix_caching:
            return 0
        partial = self.prefix_caching == "partial" if partial is None else partial
        limit = len(tokens) - 1
        while (len(table) + 1) * bs <= limit and tuple(tokens[: (len(table) + 1) * bs]) in self.cache:
            table.append(self.cache[tuple(tokens[: (len(table) + 1) * bs])])
        done, best, shared = len(table) * bs, None, 0
        for block in self.children.get(tuple(tokens[:done]), []) if partial else []:  # cached blocks after it
            ahead = self.key_of[block][done:]
            same = next((i for i, (a, b) in enumerate(zip(ahead, tokens[done:limit], strict=False)) if a != b), None)
            same = min(len(ahead), limit - done) if same is None else same
            if same > shared:
                best, shared = block, same
        if best is not None:
            table.append(best)
            done += shared
        for block in table:
            self.refs[block] += 1
            self.idle.pop(block, None)
        self.tokens[sid] = list(tokens[:done])
        return done

    def truncate(self, sid, n):
        """Keep only the first n tokens (speculative decoding drops rejected ones); free the blocks beyond."""
        keep = -(-n // self.block_size)
        for block in self.tables[sid][keep:]:
            self._drop(block)
        del self.tables[sid][keep:]
        del self.tokens[sid][n:]

    def rollback(self, sid, n):
        """Undo a failed step of sid: keep its first n tokens; blocks it filled beyond them leave the prefix cache
        (their K/V may never have been written)."""
        bs = self.block_size
        for j, block in enumerate(self.tables[sid]):
            if (j + 1) * bs > n and block in self.key_of and self.refs[block] == 1:
                key = self.key_of.pop(block)
                del self.cache[key]
                self.children[key[: len(key) - bs]].remove(block)
        self.truncate(sid, n)

    def release(self, sid):
        # Tail first: a chain's last block becomes the least recently used, so eviction eats a cached prompt from
        # its end and its head still matches. vLLM v1 frees "in reverse order so that the tail blocks are evicted
        # first" (vllm/v1/core/kv_cache_manager.py, `free`); nano-vllm's `BlockManager.deallocate` walks
        # `reversed(seq.block_table)` (nanovllm/engine/block_manager.py).
        for block in reversed(self.tables.pop(sid)):
            self._drop(block)
        del self.tokens[sid]


# %% [markdown]
# ## The forward pass: packed tokens, attention that reads the blocks
# `forward` takes a **packed** batch: for each sequence, its new tokens (one for a decode step, a chunk of a
# prompt for a prefill), all of them one flat row with no padding (as vLLM does). Their keys and values go
# into the pool through the block tables. Then attention, two ways:
# * `attention="copy"` gathers every sequence's cached keys and values out of the pool into one contiguous
#   tensor, in every layer, at every step, and attends to that copy (the simple way, and the copy
#   PagedAttention exists to avoid);
# * `attention="blocks"` attends to the **pool itself**: a slice of it spanning the blocks this batch uses (a
#   view: nothing is copied), with the block tables turned into a mask that lets each token see exactly its own
#   sequence's slots up to its position.
#
# Both compute the same attention, and both pay in arithmetic: each new token is scored against the keys of
# *every* sequence of the batch (then masked out), the copy against all their stored tokens, the view against
# every slot of the slice (the same, plus the unused tails of last blocks and any block between them that
# another sequence holds). The copying version pays the copy on top. Real kernels pay neither: vLLM's
# PagedAttention, FlashInfer's paged decode/prefill kernels and FlexAttention with a `BlockMask` walk each
# sequence's block table *inside* the kernel, loading one block at a time and keeping a running (online)
# softmax, so their work follows each sequence's own length. PyTorch has no such kernel outside a compiler
# (FlexAttention compiles one), so this lesson uses the mask; it measures both versions below.


# %% tags=["contract", "export"]
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: E402


def visible(kv, batch, attention="blocks"):
    """(key index, mask): which keys each new token of `batch` ((sequence id, new tokens) pairs) may attend to.

    "blocks": the keys are the pool's slice spanning the batch's blocks (a view); "copy": every sequence's keys
    gathered into one contiguous tensor. The mask (new tokens x keys) allows a token its own sequence, up to its
    position."""
    bs = kv.block_size
    reads = [kv.slots(sid, 0, len(kv.tokens[sid])) for sid, _ in batch]  # every stored token's slot, per sequence
    if attention == "blocks":
        blocks = [b for sid, _ in batch for b in kv.tables[sid]]
        lo, hi = min(blocks) * bs, (max(blocks) + 1) * bs
        index, cols, width = slice(lo, hi), [r - lo for r in reads], hi - lo
    elif attention == "copy":
        index = torch.cat(reads)
        ends = torch.tensor([len(r) for r in reads]).cumsum(0).tolist()
        cols, width = [torch.arange(e - len(r), e) for r, e in zip(reads, ends, strict=True)], ends[-1]
    else:
        raise ValueError(f"attention must be 'blocks' or 'copy', not {attention!r}")
    mask = torch.zeros(sum(n for _, n in batch), width, dtype=torch.bool)
    row = 0
    for (sid, n), c in zip(batch, cols, strict=True):
        length = len(kv.tokens[sid])
        new_positions = torch.arange(length - n, length)
        mask[row : row + n, c] = torch.arange(length)[None, :] <= new_positions[:, None]  # causal, own sequence
        row += n
    return index, mask


@torch.inference_mode()
def forward(model, kv, batch, *, attention="blocks", all_logits=False):
    """One engine pass over a packed batch of (sequence id, new token ids) pairs.

    Returns the logits after each sequence's last new token (B, vocab), or after every new token (N, vocab)."""
    m, dev, d = model.model, kv.k.device, kv.k.shape[-1]
    starts = [len(kv.tokens[sid]) for sid, _ in batch]
    write = torch.cat([kv.append(sid, toks) for sid, toks in batch]).to(dev)  # the new tokens' slots
    ids = torch.tensor([t for _, toks in batch for t in toks], device=dev)[None]  # (1, N): packed, no padding
    pos = torch.cat([torch.arange(s, s + len(t)) for s, (_, t) in zip(starts, batch, strict=True)])[None].to(dev)
    index, mask = visible(kv, [(sid, len(toks)) for sid, toks in batch], attention)
    index, mask = (index if isinstance(index, slice) else index.to(dev)), mask.to(dev)[None, None]
    n = ids.shape[1]
    h = m.embed_tokens(ids)
    cos, sin = m.rotary_emb(h, pos)
    for i, layer in enumerate(m.layers):
        att = layer.self_attn
        x = layer.input_layernorm(h)
        q = att.q_proj(x).view(1, n, -1, d).transpose(1, 2)  # (1, heads, N, d)
        k = att.k_proj(x).view(1, n, -1, d).transpose(1, 2)  # (1, kv heads, N, d)
        v = att.v_proj(x).view(1, n, -1, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        kv.k[i][:, write], kv.v[i][:, write] = k[0], v[0]  # into the pool, through the block tables
        keys, values = kv.k[i][:, index], kv.v[i][:, index]  # "blocks": a view of the pool; "copy": a gathered copy
        o = F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=mask, enable_gqa=True)
        h = h + att.o_proj(o.transpose(1, 2).reshape(1, n, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    if not all_logits:
        h = h[:, torch.tensor([len(t) for _, t in batch]).cumsum(0).to(dev) - 1]  # each sequence's last token
    return model.lm_head(m.norm(h))[0]


# %% [markdown]
# Correct before fast: greedy decoding with this engine (the prompt in chunks, then one token per step) must
# give exactly the tokens of the model's own greedy `generate`, with either attention.


# %% tags=["contract"]
def greedy(model, kv, prompt, max_new, eos=None, sid=0, chunk=None, attention="blocks"):
    """Greedy decoding with the paged engine (the prompt in chunks of `chunk` tokens); up to max_new token ids."""
    kv.add(sid)
    done = kv.match_prefix(sid, prompt)
    while done < len(prompt):  # prefill, chunk by chunk: only the last chunk's logits are used
        piece = prompt[done : done + (chunk or len(prompt))]
        logits = forward(model, kv, [(sid, piece)], attention=attention)
        done += len(piece)
    out = [int(logits[-1].argmax())]
    while len(out) < max_new and out[-1] != eos:
        out.append(int(forward(model, kv, [(sid, [out[-1]])], attention=attention)[-1].argmax()))
    kv.release(sid)
    return out


def reference(model, prompt, max_new, eos=None):
    """The model's own greedy generate (batch 1), cut after the first eos."""
    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False)
    new = out[0, len(prompt) :].tolist()
    return new[: new.index(eos) + 1] if eos in new else new


# %%
def prompt_ids(text, system=None):
    """A chat prompt's token ids (without a tokenizer: token ids drawn from the text, one length per text)."""
    if tok is not None:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)
        return list(enc["input_ids"])
    gen = torch.Generator().manual_seed(len(text))
    head = prompt_ids(system) if system else []
    return head + torch.randint(3, cfg.vocab_size, (len(text) // 4 + 8,), generator=gen).tolist()


def show(ids):
    return tok.decode(ids) if tok is not None else str(ids[:12])


BLOCK = 16
CHECK_NEW = cu.pick(full=24, smoke=6)
p0 = prompt_ids("What is the capital of France? Answer in one sentence.")
ref0 = reference(model, p0, CHECK_NEW, EOS)
for attention in ("blocks", "copy"):
    kv = PagedKV(cfg, num_blocks=32, block_size=BLOCK)
    mine = greedy(model, kv, p0, CHECK_NEW, EOS, chunk=BLOCK, attention=attention)
    assert mine == ref0, f"the paged engine ({attention}) differs from generate: {mine} vs {ref0}"
    assert kv.blocks_in_use() == 0, "every block goes back to the free list"
print(f"Paged engine == generate, both attentions, prompt in chunks of {BLOCK}: {show(ref0)!r}")

# %% [markdown]
# ### What reading the blocks in place saves, and what it costs
# A decode step for a batch of sequences, timed both ways with `cu.compare` (the two versions take turns
# in rounds, each ratio with its 95% interval). The bytes the copying version gathers per step are
# layers × 2 (K and V) × the tokens stored × KV heads × head_dim × 4 bytes; we also time that copy alone.
# At batch 1 the slice holds only the sequence itself; at a full batch each token is scored against every
# sequence's keys in both versions (the table's "keys per token" columns; a paged kernel would score each token
# against its own sequence only). The pools here are fresh, so each slice spans just the batch's blocks; how far
# a slice spans on a pool that has served a while (freed blocks handed out again, idle cached blocks between the
# batch's) is measured after the prefix-caching section, on a churn load.


# %%
def decode_bench(batch, length, attention):
    """A timed decode step for `batch` sequences of `length` tokens (the pool is reset after each call)."""
    kv = PagedKV(cfg, batch * -(-(length + 1) // BLOCK) + 1, BLOCK)
    gen = torch.Generator().manual_seed(batch)
    for s in range(batch):
        kv.add(s)
        kv.append(s, torch.randint(3, cfg.vocab_size, (length,), generator=gen).tolist())  # K/V of zeros: timing only
    sids = list(range(batch))

    def step():
        forward(model, kv, [(s, [5]) for s in sids], attention=attention)
        for s in sids:
            kv.truncate(s, length)

    return step, kv


BENCH_LEN = cu.pick(full=96, smoke=24)
BATCHES = cu.pick(full=[1, 8], smoke=[1, 3])
attn_rows = []
for b in BATCHES:
    steps = {a: decode_bench(b, BENCH_LEN, a) for a in ("copy", "blocks")}
    cmp = cu.compare(
        {a: s for a, (s, _) in steps.items()}, baseline="copy", rounds=cu.pick(full=8, smoke=3), label=f"batch {b}"
    )
    kv_b = steps["copy"][1]
    index, _ = visible(kv_b, [(s, 1) for s in range(b)], "copy")
    copy_only = cu.measure(
        lambda kv_b=kv_b, index=index: [
            (kv_b.k[i][:, index], kv_b.v[i][:, index]) for i in range(cfg.num_hidden_layers)
        ],
        label="the copy alone",
        warmup=1,
        min_time_s=cu.pick(full=0.2, smoke=0.02),
        warn_spread=False,
    )
    r = cmp.ratio("blocks")
    slice_slots = visible(steps["blocks"][1], [(s, 1) for s in range(b)], "blocks")[1].shape[1]
    attn_rows.append(
        {
            "batch": b,
            "copy ms/step": cmp.measurements["copy"].median_ms,
            "blocks ms/step": cmp.measurements["blocks"].median_ms,
            "blocks vs copy (speed)": str(r),
            "MiB copied per step": cfg.num_hidden_layers * 2 * len(index) * kv_b.k.shape[1] * cfg.head_dim * 4 / 2**20,
            "the copy alone, ms": copy_only.median_ms,
            "keys per token, copy": len(index),  # every sequence's stored tokens, gathered
            "keys per token, blocks": slice_slots,  # the slice: the same, plus the last blocks' unused slots
            "keys per token, a paged kernel": len(index) // b,  # its own sequence only
        }
    )
    attn_ratio = r  # the last batch: the serving batch
attn_table = pd.DataFrame(attn_rows)
display(attn_table.round(2))
print(
    f"At batch {BATCHES[-1]}: {attn_ratio.says('reading the blocks in place', 'copying them')}; target "
    "'no worse than the copying version, within the interval': "
    + (
        "not judged (stand-in or drifted timing)"
        if attn_ratio.flags
        else "met"
        if attn_ratio.verdict != "slower"
        else "missed"
    )  # fmt: skip
    + "."
)

# %% [markdown]
# Which attention kernel did that step run? `forward` calls `F.scaled_dot_product_attention` with a boolean mask
# (the block tables) and `enable_gqa=True` (9 query heads share each of 3 KV heads). SDPA picks its kernel per
# call, and an arbitrary mask or GQA can rule out the fused ones; as in *15 · LLM decoding*, the profiler's
# operator names say which one ran.

# %%
from torch.profiler import profile

step_fn, _ = decode_bench(BATCHES[-1], BENCH_LEN, "blocks")
with profile() as prof:
    step_fn()
marks = ("scaled_dot_product", "flash", "efficient_attention", "cudnn_attention", "fmha", "math")
sdpa_ops = sorted({e.key for e in prof.key_averages() if any(m in e.key.lower() for m in marks)})
chosen = [o for o in sdpa_ops if o != "aten::scaled_dot_product_attention"]
print(
    f"SDPA with a boolean mask and enable_gqa=True, batch {BATCHES[-1]} on {device}: the profiler lists "
    + (", ".join(chosen) if chosen else "no kernel beneath aten::scaled_dot_product_attention")
    + (": the math kernel (matmul, softmax, matmul), no fused one." if any("math" in o for o in chosen) else ".")
)


# %% [markdown]
# ### Sampling, and the acceptance rule that keeps it exact
# A server also samples: `temperature` divides the logits before the softmax (0 means greedy), and `top_p`
# keeps the smallest set of most likely tokens whose probabilities reach `top_p` (nucleus sampling), then
# renormalizes. Speculative decoding with sampling cannot compare a draft token with "the model's choice";
# instead a draft token x drawn from the draft's distribution q is kept with probability min(1, p(x)/q(x)) (p the
# target model's distribution), and on a rejection a token is drawn from max(0, p - q), normalized. Every token
# that comes out is then distributed exactly as p (Leviathan et al. 2023; vLLM's rejection sampler,
# `vllm/v1/sample/rejection_sampler.py`). The tests check it with a chi-square test over many draws.


# %% tags=["contract", "export"]
import torch  # noqa: E402, F811


def sampling_probs(logits, temperature=1.0, top_p=1.0):
    """The distribution a token is drawn from: softmax(logits / temperature) cut to the nucleus top_p, renormalized
    (temperature 0: all mass on the argmax)."""
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, not {temperature} and {top_p}")
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).float()
    probs = torch.softmax(logits.float() / temperature, -1)
    if top_p < 1:
        sorted_p, order = probs.sort(descending=True)
        keep = sorted_p.cumsum(0) - sorted_p < top_p  # a token stays while the mass before it is under top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_p[keep])
        probs = probs / probs.sum()
    return probs


def sample_token(logits, temperature=1.0, top_p=1.0, generator=None):
    """One token id drawn from `sampling_probs` (the argmax at temperature 0)."""
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial(sampling_probs(logits, temperature, top_p), 1, generator=generator))


def accept_or_resample(p, q, token, generator=None):
    """Speculative sampling for one draft token drawn from q: (token kept, True) with probability
    min(1, p[token] / q[token]); else (a token drawn from max(0, p - q) normalized, False). Output ~ p exactly."""
    u = float(torch.rand((), generator=generator))
    if u * float(q[token]) < float(p[token]):  # u < p/q without dividing by a zero q
        return token, True
    residual = (p - q).clamp_min(0)
    return int(torch.multinomial(residual / residual.sum(), 1, generator=generator)), False


# %%
# The rule at work on a toy vocabulary of five tokens: drafts drawn from q, each kept or resampled; what comes out
# should be distributed as p, and a draft should be kept with probability sum(min(p, q)).
g_toy = torch.Generator().manual_seed(0)
p_toy = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
q_toy = torch.tensor([0.1, 0.4, 0.1, 0.3, 0.1])
n_toy = cu.pick(full=20_000, smoke=4_000)
toy_counts, toy_kept = torch.zeros(5), 0
for _ in range(n_toy):
    x_toy = int(torch.multinomial(q_toy, 1, generator=g_toy))
    tok_toy, ok_toy = accept_or_resample(p_toy, q_toy, x_toy, g_toy)
    toy_counts[tok_toy] += 1
    toy_kept += ok_toy
toy_freq = toy_counts / n_toy
toy_se = (p_toy * (1 - p_toy) / n_toy).sqrt()  # each frequency's standard error if the output follows p
toy_worst = float(((toy_freq - p_toy).abs() / toy_se).max())
print(
    f"{n_toy} draws: output frequencies {[round(v, 3) for v in toy_freq.tolist()]} against p "
    f"{[round(v, 3) for v in p_toy.tolist()]}; the "
    f"largest gap is {toy_worst:.1f} standard errors, "
    + ("within sampling noise (under 4)" if toy_worst < 4 else "more than sampling noise explains (4 or more)")
    + f". Drafts kept: {toy_kept / n_toy:.1%}, expected sum(min(p, q)) = "
    f"{float(torch.minimum(p_toy, q_toy).sum()):.1%}."
)


# %% [markdown]
# ## Requests and the scheduler
# A request is a prompt, a cap on new tokens, and an arrival time. Its K/V state is one number, `computed`:
# how many of its tokens (prompt, then the tokens made so far) have their keys and values in the cache. At
# every step each running request gets its next tokens: the rest of its prompt, or a chunk of it, or the one
# token it made last (a decode). When its last token has gone through, the logits give its next one. That one
# rule covers prefill, chunked prefill, decode and recomputation after pre-emption (vLLM V1's scheduler has
# the same shape).
#
# `Scheduler.step()`:
# 1. **retire** finished requests (their blocks go back);
# 2. **schedule the running ones** within the step's token budget, in the order they were admitted, then
#    (3.) the waiting ones: vLLM v1's order (`vllm/v1/core/sched/scheduler.py`, `schedule`: the running list,
#    then the waiting list). Only the newest running request can be partway through its prompt (admission
#    stops when a chunk uses the rest of the budget; the scheduler asserts it), so this order puts every decode
#    before the one prompt chunk: a decode is never held back by a prompt. A request whose next tokens need a
#    block when none is free **pre-empts** the newest running request (*recompute*, the only kind vLLM v1 has:
#    it gives all its blocks back, waits at the front of the queue, and later prefills its prompt plus the tokens
#    it already made, then continues: the same tokens, since decoding is greedy). The victim is the last of
#    `running`, which by the invariant above is never already in this step's batch;
# 3. **admit** waiting requests, first come first served, while a slot, budget and **free blocks** allow
#    (a request whose first chunk does not fit waits);
# 4. run it all as **one** forward pass and append the new tokens.
#
# Serving many clients adds three rules. `add` refuses, before admission, a request that could never run
# (`check_request`: an empty prompt, a token id outside the vocabulary, `max_new` < 1, prompt + `max_new`
# beyond the model's context or beyond the whole pool), whose sampling settings are out of range (`check_sampling`:
# temperature >= 0, 0 < top_p <= 1, a whole-number seed) or whose id is taken (`BadRequest`, which a server
# answers with HTTP 4xx). A sampled request (temperature > 0) draws from a random generator of its own, seeded
# by its `seed` (its id when it has none), so the same seed and settings give the same draws, whatever else is in
# the batch. `cancel(rid)` drops a request whose client went away, its blocks freed at once. And a pass that
# raises is undone (`PagedKV.rollback`) and retried request by request: only a request that fails alone fails
# (`failed`), the others go on with the same tokens.
#
# `token_budget=None` turns chunking off: each admitted prompt is prefilled whole and alone, before the decode
# pass of the others (one-at-a-time prefills). `policy="static"` admits only into an empty batch.


# %% tags=["contract", "export"]
import math  # noqa: E402
import numbers  # noqa: E402
import time  # noqa: E402, F811
from collections import deque  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import torch  # noqa: E402, F811

from course_utils.supply.errors import CourseError  # noqa: E402, F811


class BadRequest(ValueError):
    """A request the engine refuses before admission (a server answers it with HTTP 4xx and this message)."""


def check_request(prompt, max_new, *, vocab_size, context, num_blocks, block_size):
    """Raise BadRequest naming the fix unless the request can run: token ids in the vocabulary, max_new >= 1,
    prompt + max_new within the model's context and within the whole KV pool (else it could never fit)."""
    if not isinstance(prompt, list | tuple) or not prompt:
        raise BadRequest(f"the prompt must be a non-empty list of token ids, not {str(prompt)[:40]!r}")
    for i, t in enumerate(prompt):
        if not isinstance(t, numbers.Integral) or isinstance(t, bool) or not 0 <= t < vocab_size:
            raise BadRequest(f"prompt token {i} is {t!r}: token ids are whole numbers from 0 to {vocab_size - 1}")
    if not isinstance(max_new, numbers.Integral) or isinstance(max_new, bool) or max_new < 1:
        raise BadRequest(f"max_new must be a whole number >= 1, not {max_new!r}")
    if len(prompt) + max_new > context:
        raise BadRequest(f"prompt ({len(prompt)} tokens) + max_new ({max_new}) exceeds the model's context of "
                         f"{context} tokens: shorten the prompt or lower max_new")  # fmt: skip
    need = -(-(len(prompt) + max_new) // block_size)
    if need > num_blocks:
        raise BadRequest(f"the request needs up to {need} KV blocks and the whole pool has {num_blocks}: it could "
                         "never run; shorten the prompt or lower max_new")  # fmt: skip


def check_sampling(temperature=0.0, top_p=1.0, seed=None):
    """Raise BadRequest naming the fix unless the sampling settings can run: temperature and top_p finite numbers (not
    true/false) within `sampling_probs`' own ranges, seed None or a whole number from 0 to 2**64 - 1."""
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
            raise BadRequest(f"{name} must be a finite number, not {repr(value)[:40]}: e.g. temperature 0.7, top_p 0.9")
    try:
        sampling_probs(torch.zeros(2), temperature, top_p)  # the ranges, checked where the sampling happens
    except ValueError as exc:
        raise BadRequest(f"{exc}: temperature 0 is greedy, top_p 1 keeps every token") from None
    if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool) or not 0 <= seed < 2**64):
        raise BadRequest(f"seed must be a whole number from 0 to 2**64 - 1 (or left out), not {repr(seed)[:40]}")


@dataclass
class Request:
    rid: int
    prompt: list
    max_new: int
    arrival: float = 0.0  # seconds after the start of the run
    eos: int | None = None
    out: list = field(default_factory=list)  # the tokens made so far
    times: list = field(default_factory=list)  # when each token reached the client
    computed: int = 0  # tokens whose K/V are in the cache
    cached: int = 0  # of them, tokens the prefix cache gave at admission
    preempted: int = 0  # times it lost its blocks and was recomputed
    error: str = ""  # why it failed (an exception in its step), or "cancelled"
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = None  # the seed of its own random generator (sampling only)
    generator: object = None

    @property
    def tokens(self):
        return self.prompt + self.out

    @property
    def done(self):
        return len(self.out) >= self.max_new or (bool(self.out) and self.out[-1] == self.eos)


class Scheduler:
    """Continuous batching over a paged KV cache, one engine step at a time (see the text above)."""

    def __init__(self, model, kv, *, max_slots, token_budget=None, policy="continuous", attention="blocks",
                 watermark=0.0):  # fmt: skip
        if policy not in ("static", "continuous"):
            raise ValueError(f"policy must be 'static' or 'continuous', not {policy!r}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark is the fraction of the pool kept free at admission, 0 <= it < 1: {watermark}")
        # Admission keeps `spare` blocks free for the running requests to grow into, as vLLM's block manager does
        # (`num_free_blocks - num_required_blocks >= watermark_blocks`, watermark 1% of the pool:
        # vllm/core/block_manager.py, `can_allocate`). Alone in the engine a request is admitted anyway.
        self.spare = int(watermark * kv.num_blocks)
        self.model, self.kv, self.max_slots = model, kv, max_slots
        self.token_budget, self.policy, self.attention = token_budget, policy, attention
        self.waiting, self.running = deque(), []
        self.preemptions, self.steps, self.prefill_s = 0, 0, 0.0
        self.failed = []  # requests that failed (an exception in their step) since the caller last emptied it

    def add(self, r):
        """Queue r, or raise BadRequest (nothing queued) when it could never run or its id is taken."""
        c = self.model.config
        check_request(r.prompt, r.max_new, vocab_size=c.vocab_size, context=c.max_position_embeddings,
                      num_blocks=self.kv.num_blocks, block_size=self.kv.block_size)  # fmt: skip
        if any(q.rid == r.rid for q in (*self.waiting, *self.running)):
            raise BadRequest(f"request id {r.rid} is already waiting or running: give each request its own id")
        check_sampling(r.temperature, r.top_p, r.seed)
        if r.temperature > 0 and r.generator is None:
            r.generator = torch.Generator().manual_seed(r.seed if r.seed is not None else r.rid)
        self.waiting.append(r)

    def cancel(self, rid):
        """Drop request rid now (its client went away): out of the queue or the batch, its blocks freed. Returns
        the request, or None when no request rid waits or runs (finished, failed or never seen)."""
        for q in (self.waiting, self.running):
            for r in q:
                if r.rid == rid:
                    q.remove(r)
                    if r.rid in self.kv.tables:
                        self.kv.release(r.rid)
                    r.error = "cancelled"
                    return r
        return None

    def fail(self, r, exc):
        """r's step raised: r leaves the batch, its blocks go back, and it is reported in `failed`."""
        self.kv.rollback(r.rid, r.computed)
        self.running.remove(r)
        self.kv.release(r.rid)
        r.error = f"{type(exc).__name__}: {exc}"
        self.failed.append(r)

    def has_work(self):
        return bool(self.waiting or self.running)

    def preempt(self, r):
        """Take r's blocks back; it waits at the front of the queue and is recomputed (prompt + its tokens)."""
        self.running.remove(r)
        self.kv.release(r.rid)
        r.computed, r.preempted, self.preemptions = 0, r.preempted + 1, self.preemptions + 1
        self.waiting.appendleft(r)

    def schedule(self):
        """The (request, number of new tokens) pairs of the next step."""
        for r in [r for r in self.running if r.done]:  # 1. retire: finished requests leave, blocks go back
            self.running.remove(r)
            self.kv.release(r.rid)
        budget = self.token_budget or float("inf")
        batch, preempted, claimed = [], False, 0  # claimed: free blocks this step's batch will take
        # The invariant that makes pre-empting running[-1] safe: only the newest running request may be partway
        # through its prompt (admission stops when a chunk uses up the budget). So walking `running` in order
        # schedules every decode before it, and a victim taken from the end was never put in this step's batch.
        mid_prefill = [r for r in self.running if r.computed < len(r.tokens) - 1]
        assert mid_prefill in ([], self.running[-1:]), f"mid-prefill requests {[r.rid for r in mid_prefill]}"
        for r in list(self.running):  # 2. the running requests in order (vLLM v1: running, then waiting)
            if r not in self.running or budget <= 0:
                continue
            n = int(min(len(r.tokens) - r.computed, budget))
            while not self.kv.can_append(r.rid, n, claimed):  # out of blocks: pre-empt the newest running one
                victim = self.running[-1]  # vLLM v1: `self.running.pop()` (vllm/v1/core/sched/scheduler.py)
                self.preempt(victim)
                preempted = True
                if victim is r:
                    break
            if r in self.running:
                batch.append((r, n))
                budget, claimed = budget - n, claimed + self.kv.blocks_needed(r.rid, n)
        if self.policy == "continuous" or not self.running:  # 3. admit (static: only into an empty batch)
            while self.waiting and len(self.running) < self.max_slots and budget > 0 and not preempted:
                r = self.waiting[0]
                self.kv.add(r.rid)
                r.computed = r.cached = self.kv.match_prefix(r.rid, r.tokens)  # a prefix cache hit (0 without)
                n = int(min(len(r.tokens) - r.computed, budget))
                if r.cached % self.kv.block_size and not self.kv.can_append(r.rid, n, claimed):
                    self.kv.release(r.rid)  # a partial block's copy would not fit: share full blocks only
                    self.kv.add(r.rid)
                    r.computed = r.cached = self.kv.match_prefix(r.rid, r.tokens, partial=False)
                    n = int(min(len(r.tokens) - r.computed, budget))
                spare = self.spare if self.running else 0  # those already running will need blocks to grow
                if not self.kv.can_append(r.rid, n, claimed + spare):  # admission by free blocks: it waits
                    self.kv.release(r.rid)
                    break
                self.running.append(self.waiting.popleft())
                batch.append((r, n))
                budget, claimed = budget - n, claimed + self.kv.blocks_needed(r.rid, n)
        return batch

    def step(self):
        """Schedule and run one step (4.); return (request, token) for every token made."""
        batch = self.schedule()
        if self.token_budget is None:  # one-at-a-time prefills, then one decode pass for the others
            decode = [(r, n) for r, n in batch if n == 1 and r.computed == len(r.tokens) - 1]
            groups = [[b] for b in batch if b not in decode] + [decode]
        else:  # chunked prefill: decode tokens and prompt chunks in the same pass
            groups = [batch]
        made = []
        for group in [g for g in groups if g]:
            t0, prefill = time.perf_counter(), self.token_budget is None and group is not groups[-1]
            group, logits = self._forward(group)
            if prefill:
                self.prefill_s += time.perf_counter() - t0  # the prefills alone: the same work in every policy
            for (r, n), row in zip(group, logits, strict=True):
                r.computed += n
                if r.computed == len(r.tokens):  # its last token went through: the logits give the next one
                    token = sample_token(row, r.temperature, r.top_p, r.generator)  # the argmax at temperature 0
                    r.out.append(token)
                    made.append((r, token))
        self.steps += 1
        return made

    def _forward(self, group):
        """(group, logits) of one pass. A pass that raises is undone and each request runs alone: one that fails
        alone fails (`fail`), the others go on with their logits, so one bad request never harms another."""
        try:
            return group, self._pass(group)
        except Exception:
            for r, _ in group:
                self.kv.rollback(r.rid, r.computed)
        kept, rows = [], []
        for r, n in group:
            try:
                rows.append(self._pass([(r, n)])[0])
                kept.append((r, n))
            except Exception as exc:
                self.fail(r, exc)
        return kept, (torch.stack(rows) if rows else [])

    def _pass(self, group):
        batch = [(r.rid, r.tokens[r.computed : r.computed + n]) for r, n in group]
        return forward(self.model, self.kv, batch, attention=self.attention)


def serve(scheduler, requests, trace=None):
    """Feed `requests` to the scheduler at their arrival times (open loop); yield (request, token, seconds since
    the start) for every token the moment its step ends: a stream. `trace` gets one row per step."""
    pending, t0 = sorted(requests, key=lambda r: r.arrival), time.perf_counter()
    while pending or scheduler.has_work():
        now = time.perf_counter() - t0
        while pending and pending[0].arrival <= now:  # arrivals join the queue, whatever the server is doing
            scheduler.add(pending.pop(0))
        if not scheduler.has_work():
            time.sleep(max(0.0, min(0.05, pending[0].arrival - now)))
            continue
        made = scheduler.step()
        t = time.perf_counter() - t0
        if trace is not None:
            kv = scheduler.kv
            trace.append({"t": t, "running": len(scheduler.running), "waiting": len(scheduler.waiting),
                          "blocks_in_use": kv.blocks_in_use(), "stored_tokens": sum(map(len, kv.tokens.values())),
                          "tokens_made": len(made), "preemptions": scheduler.preemptions})  # fmt: skip
        for r, token in made:
            yield r, token, t


# %% [markdown]
# Streaming, shown on three requests that arrive together: each line is a token the moment its step ended, as
# a server would send it (server-sent events in vLLM's HTTP API). The prompts go in chunks of 16 tokens.

# %%
demo = [
    Request(i, prompt_ids(q), cu.pick(full=12, smoke=4), 0.0, EOS)
    for i, q in enumerate(["Name a fruit.", "What is 2 + 3?", "Say hello in French."])
]
sched = Scheduler(model, PagedKV(cfg, num_blocks=16, block_size=BLOCK), max_slots=3, token_budget=16)
for r, token, t in serve(sched, demo):
    print(f"[{t:6.2f} s] request {r.rid}: {show([token])!r}")
for r in demo:
    assert r.out == reference(model, r.prompt, r.max_new, EOS), f"request {r.rid} differs from generate"
print(f"All three streamed answers == generate ({sched.steps} steps).")

# %% [markdown]
# ## The load
# A pool of chat prompts of different lengths; each request picks one and a cap on new tokens (most short, a
# quarter long), like a chat service. Requests arrive **open loop**: Poisson arrivals at a fixed rate,
# whatever the server is doing (lesson 13), so a slow server builds a queue and its users wait. The rate is
# set from this machine's own speed: a decode step at batch 1 and at the full batch are timed (taking turns,
# `cu.compare`), and requests are sent at about what a full batch could serve.

# %%
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three uses of copper.",
    "Explain in two sentences why the sky is blue.",
    "Translate 'good morning' into Spanish.",
    "Give me one tip for learning to program, with a short reason.",
    "Summarize in one sentence: The old lighthouse stood on the rocky cliff above the harbor. Every night "
    "its keeper climbed the ninety steps to light the lamp, and every morning he wrote the weather in a "
    "small blue notebook that he kept in his coat.",
    "What is 12 plus 30?",
]
MAX_SLOTS = cu.pick(full=8, smoke=3)
N_REQUESTS = cu.pick(full=16, smoke=5)
SHORT, LONG = cu.pick(full=(8, 24), smoke=(2, 5))
TOKEN_BUDGET = cu.pick(full=64, smoke=24)  # tokens per step: vLLM's max_num_batched_tokens
ROUNDS = cu.pick(full=3, smoke=2)  # rounds in which the variants of a comparison take turns
pool = [prompt_ids(q) for q in QUESTIONS]
MAX_LEN = max(map(len, pool)) + LONG  # the longest any request can get: a contiguous cache reserves this
NUM_BLOCKS = MAX_SLOTS * -(-MAX_LEN // BLOCK) + 4  # room for a full batch of the longest requests

mean_prompt = int(np.mean([len(p) for p in pool]))
bench = {b: decode_bench(b, mean_prompt, "blocks")[0] for b in (1, MAX_SLOTS)}
steps_cmp = cu.compare(
    {f"batch {b}": s for b, s in bench.items()},
    baseline="batch 1",
    rounds=cu.pick(full=8, smoke=3),
    items={f"batch {b}": b for b in bench},  # per token: the throughput of a full step against a batch-1 step
)
ms1, msB = steps_cmp.measurements["batch 1"].median_ms, steps_cmp.measurements[f"batch {MAX_SLOTS}"].median_ms
per_token = steps_cmp.ratio(f"batch {MAX_SLOTS}")  # tokens/s of a batch-B step / tokens/s of a batch-1 step
mean_new = 0.75 * SHORT + 0.25 * LONG
RATE = MAX_SLOTS / (mean_new * msB / 1000)  # requests/s a full batch could serve, prefills not counted
rng = random.Random(16)
arrivals = np.cumsum([rng.expovariate(RATE) for _ in range(N_REQUESTS)])
work = [(rng.randrange(len(pool)), LONG if rng.random() < 0.25 else SHORT) for _ in range(N_REQUESTS)]
print(
    f"Decode step: {ms1:.0f} ms at batch 1, {msB:.0f} ms at batch {MAX_SLOTS}; per token, "
    f"{per_token.says(f'a batch-{MAX_SLOTS} step', 'a batch-1 step', 'the tokens per second of')}."
)
print(
    f"{N_REQUESTS} requests, Poisson arrivals at {RATE:.2f} requests/s, caps {SHORT} or {LONG} new tokens, "
    f"prompts of {min(map(len, pool))}-{max(map(len, pool))} tokens, {MAX_SLOTS} slots, budget {TOKEN_BUDGET} "
    "tokens per step."
)

# %% [markdown]
# The expected answers first: greedy `generate` for every prompt in use, once, at the longest cap. A greedy
# answer with a smaller cap is a prefix of it, so each served request is compared with the first tokens of
# its prompt's answer.

# %%
expected = {}


def expected_answer(p):
    """Greedy generate for prompt p of the pool at the longest cap (computed once, before any run uses it)."""
    if p not in expected:
        expected[p] = reference(model, pool[p], LONG, EOS)
    return expected[p]


for p, _ in work:
    expected_answer(p)


def run_load(policy, budget, *, num_blocks=NUM_BLOCKS, slots=MAX_SLOTS, prefix_caching=False, load=None, watermark=0.0):
    """Serve the load once; check every answer against generate; return (requests, trace, scheduler)."""
    load = (work, arrivals) if load is None else load
    requests = [Request(i, pool[p], cap, float(a), EOS) for i, ((p, cap), a) in enumerate(zip(*load, strict=True))]
    kv = PagedKV(cfg, num_blocks, BLOCK, prefix_caching=prefix_caching)
    sched = Scheduler(model, kv, max_slots=slots, token_budget=budget, policy=policy, watermark=watermark)
    trace = []
    for r, _token, t in serve(sched, requests, trace):
        r.times.append(t)  # the client side of the stream: when each token arrived
    for r, (p, cap) in zip(requests, load[0], strict=True):
        want = expected_answer(p)[:cap]
        assert r.out == want, f"{policy}: request {r.rid} (prompt {p}) differs from generate: {r.out} vs {want}"
    assert kv.blocks_in_use() == 0, "every block went back"
    return requests, pd.DataFrame(trace), sched


# Service-level targets for goodput, stated from this machine's own decode step: a first token within ten
# full-batch decode steps of the request's arrival, then on average a token at least every two.
TTFT_SLO_MS, TPOT_SLO_MS = 10 * msB, 2 * msB


def metrics(requests):
    """Throughput and the latencies vLLM's benchmark reports: TTFT (arrival to first token, queueing included),
    ITL (every gap between two streamed tokens), TPOT ((last - first token) / (tokens - 1): one mean per
    request), and goodput: requests per second that met both targets (vLLM's `--goodput ttft:MS tpot:MS`,
    `vllm/benchmarks/serve.py`; a one-token answer has no TPOT and is judged on TTFT alone)."""
    ttft = [1000 * (r.times[0] - r.arrival) for r in requests]
    itl = [1000 * d for r in requests for d in np.diff(r.times)]
    per_request = [1000 * (r.times[-1] - r.times[0]) / (len(r.times) - 1) if len(r.times) > 1 else 0.0
                   for r in requests]  # fmt: skip
    tpot = [t for t, r in zip(per_request, requests, strict=True) if len(r.times) > 1]
    good = sum(a <= TTFT_SLO_MS and b <= TPOT_SLO_MS for a, b in zip(ttft, per_request, strict=True))
    tokens = sum(len(r.out) for r in requests)
    span = max(r.times[-1] for r in requests) - min(r.arrival for r in requests)
    nan = float("nan")
    return {
        "goodput_rps": good / span,
        "met_targets": good,
        "tpot_p99_ms": np.percentile(tpot, 99) if tpot else nan,
        "tokens": tokens,
        "seconds": span,
        "tokens_per_s": tokens / span,
        "ttft_p50_ms": np.percentile(ttft, 50),
        "ttft_p99_ms": np.percentile(ttft, 99),
        "itl_p50_ms": np.percentile(itl, 50) if itl else nan,
        "itl_p99_ms": np.percentile(itl, 99) if itl else nan,
        "tpot_p50_ms": np.percentile(tpot, 50) if tpot else nan,
    }


# %% [markdown]
# ## Static, continuous, and continuous with chunked prefill, under the same load
# Three schedulers serve the same requests at the same (relative) times, taking turns in `ROUNDS` rounds
# (`cu.comparing.compare_runs`: the order changes each round, so a change in the machine's load hits all of
# them alike):
# * **static**: a batch is admitted only once the previous one has finished; prefills one at a time;
# * **continuous**: a free slot is refilled at the next step; each newcomer's prompt is prefilled whole and
#   alone *between* two decode steps of everyone else;
# * **continuous + chunked prefill**: each step carries at most `TOKEN_BUDGET` tokens, one decode token per
#   running request and the rest filled with prompt chunks, so prompts ride along in the decode steps' weight
#   reads and no decode step waits for a whole prompt.
#
# Every served answer of every run is checked against `generate` inside the run, before any figure. The time
# spent in the one-at-a-time prefills is the same work under static and continuous; the comparison checks
# that it did not drift between them.

# %%
POLICIES = {"static": ("static", None), "continuous": ("continuous", None),
            "continuous + chunked prefill": ("continuous", TOKEN_BUDGET)}  # fmt: skip
runs = {name: [] for name in POLICIES}


def policy_run(name):
    def run():
        requests, trace, sched = run_load(*POLICIES[name])
        m = metrics(requests)
        runs[name].append({**m, "trace": trace, "steps": sched.steps, "prefill_s": sched.prefill_s})
        return m["tokens_per_s"] if POLICIES[name][1] else {"value": m["tokens_per_s"], "shared_s": sched.prefill_s}

    return run


policy_cmp = cu.comparing.compare_runs(
    {name: policy_run(name) for name in POLICIES},
    baseline="static",
    rounds=ROUNDS,
    higher_is_better=True,
    label="throughput",
    metric="tokens/s",
)
print(f"Every served answer of every run == greedy generate ({N_REQUESTS} requests x {ROUNDS} rounds x 3).")


def paired(name, base, key, higher_is_better):
    """`name` against `base` on one metric, from the same rounds (the interval from cu.intervals)."""
    a, b = np.array([r[key] for r in runs[name]]), np.array([r[key] for r in runs[base]])
    drift = policy_cmp.ratio(name if name != "static" else base)
    return cu.intervals.ratio_from_rounds(
        name, base, a / b if higher_is_better else b / a, drifted=drift.drifted, drift_reason=drift.drift_reason
    )


def goodput_vs(name, base):
    """`name`'s goodput against `base`'s, from the same rounds; said plainly when `base` met no target."""
    try:
        return paired(name, base, "goodput_rps", True)
    except ValueError:  # every round's ratio was x/0 or 0/0
        return f"not a ratio: {base} had no request meeting the targets in any round"


keys = [
    "tokens_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "goodput_rps",
    "met_targets",
]
table = pd.DataFrame({name: {k: float(np.median([r[k] for r in runs[name]])) for k in keys} for name in POLICIES}).T
display(table.round(1))
chunked = "continuous + chunked prefill"
verdicts = pd.DataFrame(
    [
        {
            "comparison": f"{name} vs {base}",
            "throughput": str(paired(name, base, "tokens_per_s", True)),
            "p99 TTFT (lower is better)": str(paired(name, base, "ttft_p99_ms", False)),
            "p99 ITL (lower is better)": str(paired(name, base, "itl_p99_ms", False)),
            "goodput": goodput_vs(name, base),
        }
        for name, base in (("continuous", "static"), (chunked, "static"), (chunked, "continuous"))
    ]
)
display(verdicts)
thr, ttft99 = policy_cmp.ratio(chunked), paired(chunked, "static", "ttft_p99_ms", False)
print(
    f"Chunked prefill vs static: throughput {thr.against(1.5)}; p99 TTFT: "
    f"{ttft99.says('chunked prefill', 'static', 'lower than')}."
)
target_met = thr.judge(1.5) == "met" and ttft99.verdict != "slower"
good = goodput_vs(chunked, "static")
good = good if isinstance(good, str) else good.says("chunked prefill", "static", "the goodput of")
print(
    f"Goodput (requests per second with TTFT <= {TTFT_SLO_MS:.0f} ms and TPOT <= {TPOT_SLO_MS:.0f} ms): {good}"
    + "; requests meeting both targets, median over rounds: "
    + ", ".join(f"{n} {table.loc[n, 'met_targets']:.0f} of {N_REQUESTS}" for n in POLICIES)
    + "."
)
c = table.loc[chunked]
print(
    f"ITL is every gap between two tokens of a stream, TPOT one mean per request. With chunked prefill, median ITL "
    f"{c['itl_p50_ms']:.0f} ms and median TPOT {c['tpot_p50_ms']:.0f} ms, but p99 ITL {c['itl_p99_ms']:.0f} ms "
    f"against p99 TPOT {c['tpot_p99_ms']:.0f} ms: "
    + ("a step that carries a prompt chunk delays one token of every stream in it (one long gap each), which a "
       "request's mean over all its tokens spreads thin." if c["itl_p99_ms"] > 1.2 * c["tpot_p99_ms"] else
       "in this run the single gaps have no longer tail than the per-request means (within 20%).")
)  # fmt: skip
print(
    "Target (>= 1.5x throughput at equal or lower p99 TTFT): "
    + ("met" if target_met else thr.judge(1.5) if thr.judge(1.5) != "met" else "missed (p99 TTFT higher)")
    + "."
)
steps = {name: int(np.median([r["steps"] for r in runs[name]])) for name in POLICIES}
busy = {name: float(np.median([r["trace"]["running"].mean() for r in runs[name]])) for name in POLICIES}
print(
    "Engine steps per run: "
    + ", ".join(f"{n} {steps[n]} ({busy[n]:.1f} sequences running on average)" for n in POLICIES)
    + f" of {MAX_SLOTS} slots."
)

# %% [markdown]
# Read the ITL columns: under plain continuous batching each newcomer's prefill runs *between* two decode
# steps of everyone else, so every running sequence waits for a whole prompt (a static batch admits only at
# its start). Chunked prefill bounds that stall to one step of at most `TOKEN_BUDGET` tokens, and the prompt's
# tokens share the weight reads of the decode tokens in the same step.

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
for i, name in enumerate(POLICIES):
    tr = runs[name][0]["trace"]
    axes[0].step(tr["t"], tr["running"], where="post", color=f"C{i}", label=f"{name}: running")
    axes[0].plot(tr["t"], tr["waiting"], ls=":", color=f"C{i}", label=f"{name}: waiting")
    axes[1].plot(tr["t"].diff().iloc[1:] * 1000, color=f"C{i}", lw=0.8, label=name)
axes[0].axhline(MAX_SLOTS, color="gray", lw=0.8)
axes[0].set(xlabel="seconds since the first arrival", ylabel="sequences", title="slots in use and the queue (round 1)")
axes[1].set(xlabel="engine step", ylabel="ms", yscale="log", title="time of each step (round 1)")
for ax in axes:
    ax.legend(fontsize=7)
fig.tight_layout()
_ = cu.plots.save(fig, "16", "slots_and_steps")

# %% [markdown]
# ## How many slots? A sweep of `max_num_seqs`
# The most asked vLLM tuning question: how many sequences may run at once (`--max-num-seqs`)? More slots fill
# each weight read with more tokens (throughput) but make every step longer (ITL). The sweep serves the same
# Poisson load, at a rate above what a few slots can serve, with chunked prefill and 1 to many slots; the
# slot counts take turns in rounds. The **knee** is the smallest slot count whose throughput is not below
# the best one's beyond this machine's noise: past it, more slots buy latency, not throughput.

# %%
SWEEP = cu.pick(full=[1, 4, 8], smoke=[1, 3])
N_SWEEP = cu.pick(full=12, smoke=4)
sweep_rng = random.Random(8)
sweep_rate = 1.5 * RATE
sweep_load = (
    [(sweep_rng.randrange(len(pool)), SHORT) for _ in range(N_SWEEP)],
    np.cumsum([sweep_rng.expovariate(sweep_rate) for _ in range(N_SWEEP)]),
)
sweep_runs = {s: [] for s in SWEEP}
for p, _ in sweep_load[0]:
    expected_answer(p)


def sweep_run(slots):
    def run():
        blocks = slots * -(-MAX_LEN // BLOCK) + 4
        requests, _, _ = run_load("continuous", TOKEN_BUDGET, num_blocks=blocks, slots=slots, load=sweep_load)
        sweep_runs[slots].append(metrics(requests))
        return sweep_runs[slots][-1]["tokens_per_s"]

    return run


best = max(SWEEP)
sweep_cmp = cu.comparing.compare_runs(
    {f"{s} slots": sweep_run(s) for s in SWEEP}, baseline=f"{best} slots", rounds=2,
    higher_is_better=True, label="slots sweep", metric="tokens/s",
)  # fmt: skip
sweep = pd.DataFrame(
    [
        {
            "slots": s,
            "tokens/s": np.median([m["tokens_per_s"] for m in sweep_runs[s]]),
            "ITL p99 ms": np.median([m["itl_p99_ms"] for m in sweep_runs[s]]),
            "TTFT p99 ms": np.median([m["ttft_p99_ms"] for m in sweep_runs[s]]),
            f"throughput vs {best} slots": "baseline" if s == best else str(sweep_cmp.ratio(f"{s} slots")),
        }
        for s in SWEEP
    ]
)
display(sweep.round(1))
knee = next(s for s in SWEEP if s == best or sweep_cmp.ratio(f"{s} slots").verdict != "slower")
print(
    f"{N_SWEEP} requests at {sweep_rate:.2f}/s: the knee is at {knee} slots (the fewest whose throughput is not "
    f"below {best} slots' beyond the noise); ITL p99 there {sweep.set_index('slots').loc[knee, 'ITL p99 ms']:.0f} ms "
    f"vs {sweep['ITL p99 ms'].iloc[-1]:.0f} ms at {best}."
)
fig, ax1 = plt.subplots(figsize=(7, 3.6))
ax1.plot(sweep["slots"], sweep["tokens/s"], marker="o", color="C0", label="tokens/s")
ax2 = ax1.twinx()
ax2.plot(sweep["slots"], sweep["ITL p99 ms"], marker="s", color="C3", label="ITL p99")
ax1.axvline(knee, color="gray", ls=":")
ax1.set(xlabel="slots (max_num_seqs)", ylabel="tokens/s", title="throughput and tail ITL vs slots, same load")
ax2.set_ylabel("ITL p99 (ms)")
fig.legend(fontsize=8, loc="upper left")
fig.tight_layout()
_ = cu.plots.save(fig, "16", "slots_sweep")

# %% [markdown]
# ## How many requests per second? A request-rate sweep and its knee
# The slots sweep kept the load and changed the server. vLLM's benchmark does the converse
# (`vllm bench serve --request-rate`): one server, the same requests sent faster and faster, and at each rate the
# throughput and the tail TTFT. While the server keeps up, throughput follows the offered rate and TTFT is mostly
# the prefill; past its capacity a queue builds, throughput stops growing and TTFT grows with the queue.
#
# Here: the policy comparison's requests (`work`), served with chunked prefill, at the same relative times
# compressed or stretched (arrivals at `RATE` scaled by `RATE / rate`), so only the rate changes; the rates take
# turns in rounds (`compare_runs`). The **knee** is computed from the numbers by `rate_knee`: walking up the
# rates, the last rate before the first one that either takes the p99 TTFT over the goodput target above
# (`TTFT_SLO_MS`) or does not raise the throughput beyond this machine's noise (the interval of its throughput
# against the rate before it).


# %% tags=["export"]
def rate_knee(rows, ttft_target_ms):
    """The knee of a request-rate sweep. `rows`, in rising rate order: {"rate": requests/s, "ttft_p99_ms": ...,
    "grew": throughput above the previous rate's beyond the noise (None for the first row)}.

    Walking up the rates, the knee is the last rate before the first one whose p99 TTFT is over `ttft_target_ms`
    or whose throughput did not grow. Returns (the knee's rate, or None when the lowest rate already breaks the
    target; why the walk stopped)."""
    knee = None
    for row in rows:
        if row["ttft_p99_ms"] > ttft_target_ms:
            return knee, (f"at {row['rate']:.3g} requests/s the p99 TTFT ({row['ttft_p99_ms']:.0f} ms) is over the "
                          f"target of {ttft_target_ms:.0f} ms")  # fmt: skip
        if row["grew"] is False:
            return knee, f"at {row['rate']:.3g} requests/s the throughput did not grow beyond the noise"
        knee = row["rate"]
    return (
        knee,
        "every rate tried kept the p99 TTFT within the target and raised the throughput: the knee is at the highest "
        "rate tried or above it",
    )


# %%
RATE_STEPS = cu.pick(full=[0.25, 0.5, 1, 2], smoke=[0.25, 0.5, 1])  # multiples of RATE
rate_name = {m: f"{m * RATE:.3g} requests/s" for m in RATE_STEPS}
rate_runs = {m: [] for m in RATE_STEPS}


def rate_run(m):
    def run():
        requests, _, _ = run_load("continuous", TOKEN_BUDGET, load=(work, arrivals / m))  # checked against generate
        rate_runs[m].append(metrics(requests))
        return rate_runs[m][-1]["tokens_per_s"]

    return run


rate_cmp = cu.comparing.compare_runs(
    {rate_name[m]: rate_run(m) for m in RATE_STEPS}, baseline=rate_name[RATE_STEPS[0]], rounds=ROUNDS,
    higher_is_better=True, label="request-rate sweep", metric="tokens/s",
)  # fmt: skip
rate_rows = []
for i, m in enumerate(RATE_STEPS):
    grew = rate_cmp.ratio(rate_name[m], vs=rate_name[RATE_STEPS[i - 1]]) if i else None  # vs the rate before
    rate_rows.append(
        {
            "rate": m * RATE,
            "tokens_per_s": float(np.median([r["tokens_per_s"] for r in rate_runs[m]])),
            "ttft_p99_ms": float(np.median([r["ttft_p99_ms"] for r in rate_runs[m]])),
            "throughput vs the rate before": str(grew) if grew else "",
            "grew": grew.verdict == "faster" if grew else None,
        }
    )
rate_table = pd.DataFrame(rate_rows)
display(rate_table.drop(columns="grew").round(1))
knee_rate, knee_why = rate_knee(rate_rows, TTFT_SLO_MS)
print(
    f"{N_REQUESTS} requests at {len(RATE_STEPS)} rates, {ROUNDS} rounds, every answer == generate; p99 TTFT target "
    f"{TTFT_SLO_MS:.0f} ms. The knee: "
    + (f"{knee_rate:.3g} requests/s" if knee_rate is not None else "below the lowest rate tried")
    + f" ({knee_why})."
)
fig, ax1 = plt.subplots(figsize=(7, 3.6))
ax1.plot(rate_table["rate"], rate_table["tokens_per_s"], marker="o", color="C0", label="tokens/s")
ax2 = ax1.twinx()
ax2.plot(rate_table["rate"], rate_table["ttft_p99_ms"], marker="s", color="C3", label="TTFT p99")
ax2.axhline(TTFT_SLO_MS, color="C3", ls="--", lw=0.8, label="TTFT target")
if knee_rate is not None:
    ax1.axvline(knee_rate, color="gray", ls=":")
ax1.set(xlabel="requests/s offered", ylabel="tokens/s", xscale="log", title="throughput and tail TTFT vs request rate")
ax2.set_ylabel("TTFT p99 (ms)")
fig.legend(fontsize=8, loc="upper left")
fig.tight_layout()
_ = cu.plots.save(fig, "16", "rate_sweep")

# %% [markdown]
# ## Side by side: transformers' own continuous batching
# transformers ships a continuous-batching engine of its own: `model.generate_batch(prompts, ...)`
# (`ContinuousMixin.generate_batch`, `transformers/generation/continuous_batching/continuous_api.py`), with a
# paged KV cache (`PagedAttentionCache`, `cache.py` there), a scheduler that puts decodes before prompt chunks
# within a token budget (`FIFOScheduler`, `scheduler.py`) and a loop on a thread of its own. It needs an attention
# that works on its packed batches: `"sdpa"`, `"paged|eager"` or a flash kernel (`switch_to_cb_friendly_attn`
# switches `"eager"` to `"paged|eager"`; this FP32 model keeps `"sdpa"`). With SDPA its cache is read with an
# index gather each step (`PagedAttentionCache.update`, the "index-based update"), like `attention="copy"` above.
#
# The same model, the same torch threads (its loop is a thread of this process), greedy, with this lesson's
# settings: pages of `BLOCK` tokens, a pool of `NUM_BLOCKS`, `TOKEN_BUDGET` tokens and `MAX_SLOTS` requests per
# step, no prefix sharing. `generate_batch` takes a list of prompts and one cap, not a stream of arrivals, so the
# load is the first `N_PEER` prompts of `pool`, all at once, each with the `LONG` cap, and both engines serve
# exactly that. The two take turns in rounds. The tokens come first: in every run each answer is compared with
# generate's (this engine's inside `run_load`, generate_batch's with `first_difference`), and if one differs no
# speed is compared, since other tokens are other work. Then throughput (tokens over the time from the first
# request queued to the last token, on each engine's own clock: `record_timestamps=True` gives the peer's token
# times, so its manager's start and shut-down are left out) and p99 TTFT (first token after the request was
# queued), each a ratio with its interval.


# %% tags=["export"]
class PeerUnavailable(RuntimeError):
    """transformers' continuous batching cannot run here; the message says why."""


def peer_generate_batch(model, prompts, max_new, *, eos, slots, token_budget, block_size, num_blocks):
    """transformers' continuous batching (`model.generate_batch`) on `prompts`, all queued at once, greedy, with this
    engine's settings: pages of `block_size` tokens, a pool of `num_blocks`, at most `token_budget` tokens and
    `slots` requests per step, no prefix sharing.

    Returns {"answers": the token lists, in prompt order; "ttft_s": each request's first token after it was queued;
    "tokens": tokens made; "seconds": the first request queued to the last token}. Raises PeerUnavailable with the
    reason when this transformers has no `generate_batch`, or it fails or returns fewer answers."""
    import transformers

    if not callable(getattr(model, "generate_batch", None)):
        raise PeerUnavailable(f"this model has no generate_batch (transformers {transformers.__version__})")
    try:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        gen = GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=-1 if eos is None else eos)
        paged = ContinuousBatchingConfig(page_size=block_size, num_blocks=num_blocks, max_batch_tokens=token_budget,
                                         max_requests_per_batch=slots, allow_block_sharing=False)  # fmt: skip
        # ContinuousMixin.generate_batch, transformers/generation/continuous_batching/continuous_api.py (5.25);
        # record_timestamps: each GenerationOutput gets `timestamps`, one per token, beside its `created_time`
        # (requests.py there), so TTFT and throughput come from its own clock
        out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=paged,
                                   record_timestamps=True)  # fmt: skip
    except Exception as exc:  # an older transformers (no such config or argument), or a failure inside its loop
        raise PeerUnavailable(f"{type(exc).__name__}: {exc} (transformers {transformers.__version__})") from None
    results = list(out.values())  # generate_batch returns them in the order of the prompts
    bad = [r.error or "no token" for r in results if r.error is not None or not r.timestamps]
    if len(results) != len(prompts) or bad:
        raise PeerUnavailable(f"generate_batch returned {len(results) - len(bad)} good answers of {len(prompts)}"
                              + (f": {bad[0]}" if bad else ""))  # fmt: skip
    return {
        "answers": [list(r.generated_tokens) for r in results],
        "ttft_s": [r.timestamps[0] - r.created_time for r in results],
        "tokens": sum(len(r.generated_tokens) for r in results),
        "seconds": max(r.timestamps[-1] for r in results) - min(r.created_time for r in results),
    }


def first_difference(answers, reference):
    """None when both lists of token lists are equal; else (request, position, its token, the reference's), a token
    None where one answer is shorter."""
    for i, (a, b) in enumerate(zip(answers, reference, strict=True)):
        for j in range(max(len(a), len(b))):
            x, y = (a[j] if j < len(a) else None), (b[j] if j < len(b) else None)
            if x != y:
                return i, j, x, y
    return None


# %%
import transformers

PEER, OURS = "transformers generate_batch", "this lesson's engine"
N_PEER = cu.pick(full=len(pool), smoke=4)
peer_load = ([(p, LONG) for p in range(N_PEER)], np.zeros(N_PEER))  # N_PEER prompts at once, the longest cap
peer_prompts = [pool[p] for p, _ in peer_load[0]]
peer_expected = [expected_answer(p)[:cap] for p, cap in peer_load[0]]  # generate's answers
peer_settings = dict(eos=EOS, slots=MAX_SLOTS, token_budget=TOKEN_BUDGET, block_size=BLOCK, num_blocks=NUM_BLOCKS)
peer_runs, peer_diffs = {PEER: [], OURS: []}, []  # peer_diffs: per run, where its answers differ from generate's


def peer_run():
    res = peer_generate_batch(model, peer_prompts, LONG, **peer_settings)
    peer_diffs.append(first_difference(res["answers"], peer_expected))
    peer_runs[PEER].append({"tokens_per_s": res["tokens"] / res["seconds"],
                            "ttft_p99_ms": 1000 * np.percentile(res["ttft_s"], 99)})  # fmt: skip
    return peer_runs[PEER][-1]["tokens_per_s"]


def ours_run():
    requests, _, _ = run_load("continuous", TOKEN_BUDGET, load=peer_load)  # every answer checked against generate
    peer_runs[OURS].append(metrics(requests))
    return peer_runs[OURS][-1]["tokens_per_s"]


PEER_ROUNDS = cu.pick(full=6, smoke=2)  # 6: the fewest rounds whose median has a 95% interval
try:
    peer_cmp = cu.comparing.compare_runs(
        {PEER: peer_run, OURS: ours_run}, baseline=PEER, rounds=PEER_ROUNDS, higher_is_better=True,
        label="side by side", metric="tokens/s",
    )  # fmt: skip
except PeerUnavailable as exc:  # no generate_batch in this transformers, or it cannot run here
    peer_cmp, peer_why = None, str(exc)
peer_diff = next((d for d in peer_diffs if d is not None), None)
if peer_cmp is None:
    print(f"transformers' continuous batching cannot run here, so no side-by-side: {peer_why}.")
elif peer_diff is not None:  # the tokens first: a run with other tokens did other work, its timing compares nothing
    i, j, theirs, want = peer_diff
    print(
        f"generate_batch's answers differ from generate's (this lesson's engine gives generate's): request {i}, token "
        f"{j}: {theirs} instead of {want}. Different tokens are different work: no speed comparison."
    )
else:
    peer_thr = peer_cmp.ratio(OURS)  # tokens/s of this lesson's engine / tokens/s of generate_batch
    p99 = {n: np.array([r["ttft_p99_ms"] for r in peer_runs[n]]) for n in peer_runs}
    peer_ttft = cu.intervals.ratio_from_rounds(
        OURS, PEER, p99[PEER] / p99[OURS], drifted=peer_thr.drifted, drift_reason=peer_thr.drift_reason
    )  # above 1: this lesson's engine has the lower p99 TTFT
    peer_table = pd.DataFrame(
        {n: {k: float(np.median([r[k] for r in peer_runs[n]])) for k in ("tokens_per_s", "ttft_p99_ms")}
         for n in peer_runs}
    )  # fmt: skip
    display(peer_table.T.round(1))
    print(
        f"transformers {transformers.__version__}, {N_PEER} requests at once, {LONG} new tokens each, "
        f"{torch.get_num_threads()} threads, greedy: in every run, every answer of both engines == generate. "
        f"{PEER_ROUNDS} rounds, taking turns. Throughput: {peer_thr.says(OURS, PEER, 'the throughput of')}. "
        f"p99 TTFT: {peer_ttft.says(f'the p99 TTFT of {OURS}', f'that of {PEER}', 'lower than')}."
    )

# %% [markdown]
# ### Where each engine spends its time: one profiled run of each
# The intervals above say how the two engines compare on this load; a profile says where each spends its time.
# Each serves the same requests once more under `torch.profiler` (CPU activity; `profile_all_threads`, because
# `generate_batch` runs its loop on a thread of its own). `prof.key_averages()` gives every operator's **self**
# CPU time (the time inside it, not inside the operators it calls), so the operators' times add up without
# counting anything twice. `profile_groups` sorts them into what a learner could change: the matmuls of the linear
# layers, the attention kernel (SDPA, in both engines), indexing and copies (the KV cache's reads and writes are
# among them, and so are other gathers, concatenations and conversions), and every other tensor operator. What is
# left of the serving span (the first request queued to the last token, each engine's own clock, as for the
# throughput above) is **Python and waiting**: the schedulers' Python, the building of each step's inputs, and
# any wait. The forward passes are counted from the profile too: one `aten::embedding` call per pass, in both.
#
# What `generate_batch` does each step (transformers 5.25, `continuous_batching/`):
# `ContinuousBatchingManager._generation_loop_body` (continuous_api.py) calls
# `ContinuousBatchProcessor.prepare_next_batch`: its scheduler picks the step's requests (`schedule_batch`,
# scheduler.py) and `prepare_batch_tensors` (input_outputs.py) builds, in Python, the packed token ids and positions,
# the cache's read and write indices and the attention mask. Then `ModelRunner.compute_batch` (model_runner.py)
# runs the model's own forward: in every layer `PagedAttentionCache.update` (cache.py) writes the new keys and
# values with `index_copy_` and reads every sequence's keys and values back with `index_select`
# (cache_allocators/full_attention.py, `update`), then SDPA; the logits are kept for each sequence's last token
# only, and `_sample` takes the argmax of all of them in one call. `update_batch` then appends the new tokens.
# This lesson's step: `Scheduler.schedule` in Python, then `forward` above (pool writes through the block tables,
# SDPA on a view of the pool, logits for each sequence's last token), one argmax per sequence.
#
# One profiled run is one sample, and the profiler adds its own cost to every operator call: the table says where
# the time went in this run, not which engine is ahead (that is the interval comparison above).


# %% tags=["export"]
PROFILE_GROUPS = {  # category -> does it take this operator (an aten name without "aten::")?
    "matmul (linear layers)": lambda op: op in ("mm", "addmm", "bmm", "matmul", "linear"),
    "attention (SDPA)": lambda op: "scaled_dot_product" in op or "softmax" in op,
    "index, copy, cat (KV reads/writes among them)": lambda op: (
        op == "cat" or any(part in op for part in ("index", "gather", "scatter", "copy", "clone"))
    ),
}
PYTHON_AND_WAITING = "Python and waiting (span - operators)"


def profile_group(key):
    """The category of one profiled operator name (e.g. "aten::index_select"): "other tensor ops" when no category
    of PROFILE_GROUPS takes it, or when it is not an aten operator."""
    if not key.startswith("aten::"):
        return "other tensor ops"
    return next((g for g, takes in PROFILE_GROUPS.items() if takes(key.removeprefix("aten::"))), "other tensor ops")


def profile_groups(averages, span_ms):
    """A profile's self CPU time by category, in ms: `averages` is `prof.key_averages()` (entries with `key` and
    `self_cpu_time_total` in microseconds), `span_ms` the wall time the profiled work took.

    Every operator goes to one category of PROFILE_GROUPS or to "other tensor ops"; PYTHON_AND_WAITING is the span
    minus all operator time, never below 0 (the operators of several threads can add up to more than the span).
    User annotations (`record_function` ranges) are not operators: their time is left in the Python share. The
    categories add up to the span, or to the operator time where that is larger."""
    groups = dict.fromkeys([*PROFILE_GROUPS, "other tensor ops"], 0.0)
    for e in averages:
        if not getattr(e, "is_user_annotation", False):
            groups[profile_group(e.key)] += e.self_cpu_time_total / 1000
    groups[PYTHON_AND_WAITING] = max(0.0, span_ms - sum(groups.values()))
    return groups


# %%
from torch.profiler import ProfilerActivity


def profiled(run):
    """(run's result, prof.key_averages()) of one call of `run` under the profiler, every thread of this process."""
    # generate_batch's loop thread too: a plain profile records only this thread and those it starts. The switch is
    # the profiler's experimental config (`profile_all_threads`, pytorch PR #143659, torch 2.7 and later)
    every_thread = torch.profiler._ExperimentalConfig(profile_all_threads=True)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU], experimental_config=every_thread) as prof:
        result = run()
    return result, prof.key_averages()


if peer_cmp is None or peer_diff is not None:
    print(
        "No profile side by side: "
        + ("transformers' continuous batching cannot run here (see above)." if peer_cmp is None else
           "generate_batch's tokens differ from generate's (see above), and other tokens are other work.")
    )  # fmt: skip
else:
    ours_requests, ours_avg = profiled(lambda: run_load("continuous", TOKEN_BUDGET, load=peer_load)[0])
    peer_res, peer_avg = profiled(lambda: peer_generate_batch(model, peer_prompts, LONG, **peer_settings))
    assert first_difference(peer_res["answers"], peer_expected) is None, "generate_batch's tokens changed"
    ours_m = metrics(ours_requests)  # this engine's answers were checked against generate inside run_load
    prof_span_ms = {OURS: 1000 * ours_m["seconds"], PEER: 1000 * peer_res["seconds"]}
    prof_tokens = {OURS: ours_m["tokens"], PEER: peer_res["tokens"]}
    prof_avg = {OURS: ours_avg, PEER: peer_avg}
    prof_passes = {n: sum(e.count for e in prof_avg[n] if e.key == "aten::embedding") for n in prof_avg}  # 1 a pass
    if not prof_passes[PEER]:
        print("The profiler saw no forward pass of generate_batch (its loop thread was not recorded): no profile.")
    else:
        prof_ms = {n: profile_groups(prof_avg[n], prof_span_ms[n]) for n in prof_avg}
        prof_per_token = {n: {cat: ms / prof_tokens[n] for cat, ms in prof_ms[n].items()} for n in prof_avg}
        prof_rows = []
        for cat in prof_ms[OURS]:
            row = {"category": cat}
            for n in prof_avg:
                row[f"{n}: ms"] = prof_ms[n][cat]
                row[f"{n}: share %"] = 100 * prof_ms[n][cat] / sum(prof_ms[n].values())
                row[f"{n}: ms per token"] = prof_per_token[n][cat]
            prof_rows.append(row)
        display(pd.DataFrame(prof_rows).set_index("category").round(2))
        print(
            "; ".join(
                f"{n}: {prof_tokens[n]} tokens in {prof_span_ms[n]:.0f} ms, {prof_passes[n]} forward passes, "
                f"{prof_tokens[n] / prof_passes[n]:.2f} tokens made per pass"
                for n in prof_avg
            )
            + "."
        )
        gap = {cat: prof_per_token[OURS][cat] - prof_per_token[PEER][cat] for cat in prof_ms[OURS]}  # ours - peer
        widest = max(gap, key=lambda cat: abs(gap[cat]))
        per_token_all = {n: sum(prof_per_token[n].values()) for n in prof_avg}
        to_lose = per_token_all[OURS] - per_token_all[PEER]  # ms per token this engine would need to lose
        print(
            f"One profiled run of each (one sample, the profiler's cost included): the largest difference per token "
            f"is {widest}: {prof_per_token[OURS][widest]:.2f} ms per token in {OURS} against "
            f"{prof_per_token[PEER][widest]:.2f} ms in {PEER}. In all, {per_token_all[OURS]:.2f} ms per token "
            f"against {per_token_all[PEER]:.2f} ms"
            + (
                f": to take as little per token in this run, {OURS} would need {to_lose:.2f} ms per token less; it "
                f"takes more than {PEER} in "
                + ", ".join(f"{cat} (+{gap[cat]:.2f} ms)" for cat in sorted(gap, key=gap.get, reverse=True)
                            if gap[cat] > 0)
                if to_lose > 0
                else f": {OURS} took no more per token in this run than {PEER}"
            )
            + "."
        )  # fmt: skip


# %% [markdown]
# ## Admission by free blocks, and pre-emption
# The pool so far had room for a full batch of the longest requests. A server sizes its pool from the memory
# it has, not from the worst case; under load the blocks then run out. The scheduler above already handles
# it: a request is admitted only when its first chunk's blocks are free, and when a running request needs a
# block that is not there, the newest running request is **pre-empted**: it gives all its blocks back and is
# recomputed later from its prompt and the tokens it had made (*recompute*, the only kind in vLLM v1; vLLM v0
# could also *swap* the blocks to host memory and back).
#
# The load that shows it: `N_PRE` requests on the longest prompts, all arriving at once and all wanting `LONG`
# tokens. It runs on an ample pool, to measure its peak demand (the most blocks it holds at once), then on a
# pool of **half** that, twice: admitting whenever the first chunk fits, and with a **watermark**: admission
# keeps a share of the pool free for the running requests to grow into (vLLM's block manager keeps 1% of
# its blocks; here, with a pool of a few dozen blocks, `WATERMARK` of them). Every answer must still equal
# `generate`.

# %%
N_PRE = cu.pick(full=8, smoke=5)
longest = sorted(range(len(pool)), key=lambda p: -len(pool[p]))[:4]  # the longest prompts: the most blocks
pre_load = ([(longest[i % 4], LONG) for i in range(N_PRE)], np.zeros(N_PRE))
_, trace_ample, _ = run_load("continuous", TOKEN_BUDGET, load=pre_load)
peak_blocks = int(trace_ample["blocks_in_use"].max())
small_pool = max(peak_blocks // 2, -(-MAX_LEN // BLOCK))  # at least one longest request must fit
requests_pre, trace_pre, sched_pre = run_load("continuous", TOKEN_BUDGET, num_blocks=small_pool, load=pre_load)
assert len(requests_pre) == N_PRE and sched_pre.preemptions > 0, "the half-size pool should force pre-emptions"
print(
    f"Peak demand {peak_blocks} blocks; on a pool of {small_pool}: {sched_pre.preemptions} pre-emptions "
    f"({sum(r.preempted > 0 for r in requests_pre)} of {N_PRE} requests recomputed at least once), and all {N_PRE} "
    "answers identical to generate: nothing lost or changed."
)
WATERMARK = 0.2  # the share of the pool admission keeps free
_, _, sched_wm = run_load("continuous", TOKEN_BUDGET, num_blocks=small_pool, load=pre_load, watermark=WATERMARK)
fewer = sched_pre.preemptions - sched_wm.preemptions
print(
    f"With a watermark of {sched_wm.spare} spare block{'s' * (sched_wm.spare != 1)} at admission: "
    f"{sched_wm.preemptions} pre-emption{'s' * (sched_wm.preemptions != 1)} against {sched_pre.preemptions} without ("
    + (f"{fewer} fewer recomputations" if fewer > 0 else "no fewer" if fewer == 0 else f"{-fewer} more")
    + f"), in {sched_wm.steps} engine steps against {sched_pre.steps}; the same {N_PRE} answers."
)

# %% [markdown]
# ### KV memory, measured
# Three numbers describe a pool: the bytes **reserved** (the pool tensors, allocated once), the bytes **in use**
# (blocks held × bytes per block) and what the process really got from the operating system for it (its
# resident memory before and after allocating the pool, with glibc told to map large blocks on their own:
# `cu.memory.rss_follows_tensors`). Then paged against a **contiguous** cache, which gives each running sequence
# one array reserved for the longest it may get (`MAX_LEN` tokens), because it cannot grow in place: at the
# busiest step of the chunked run, both are allocated for real and the process's memory is measured.

# %%
block_bytes = BLOCK * PagedKV(cfg, 1, BLOCK).bytes_per_token


def allocated_mib(make):
    """Resident MiB the process gains while `make()`'s tensors are alive (allocated, touched, then freed)."""
    with cu.memory.rss_follows_tensors():
        cu.memory.malloc_trim()
        before = cu.memory.rss_mb()
        held = make()
        grown = cu.memory.rss_mb() - before
        del held
    return grown


kv_small = PagedKV(cfg, small_pool, BLOCK)
pool_bytes = kv_small.k.nbytes + kv_small.v.nbytes
del kv_small
pool_rss = allocated_mib(lambda: PagedKV(cfg, small_pool, BLOCK))
print(
    f"The pre-emption run's pool: {pool_bytes / 2**20:.1f} MiB reserved ({small_pool} blocks x "
    f"{block_bytes / 2**10:.0f} KiB), {pool_rss:.1f} MiB of the process's memory when allocated; in use: up to "
    f"{trace_pre['blocks_in_use'].max() * block_bytes / 2**20:.1f} MiB, on average "
    f"{trace_pre['blocks_in_use'].mean() * block_bytes / 2**20:.1f} MiB."
)

tr = runs[chunked][0]["trace"]
busiest = tr.loc[tr["blocks_in_use"].idxmax()]
n_seq, n_blocks = int(busiest["running"]), int(busiest["blocks_in_use"])
shape = (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, MAX_LEN, cfg.head_dim)
memory_runs = {
    "paged (blocks in use)": lambda: allocated_mib(lambda: torch.zeros(n_blocks * block_bytes // 4)),
    "contiguous (MAX_LEN per sequence)": lambda: allocated_mib(lambda: [torch.zeros(shape) for _ in range(n_seq)]),
}
mem_cmp = cu.comparing.compare_runs(
    memory_runs, baseline="contiguous (MAX_LEN per sequence)", rounds=3, higher_is_better=False,
    label="KV memory at the busiest step", metric="MiB",
)  # fmt: skip
kv_ratio = mem_cmp.ratio("paged (blocks in use)")  # contiguous MiB / paged MiB
mem_table = pd.DataFrame(
    [
        {"cache": "tokens stored (arithmetic)", "MiB": busiest["stored_tokens"] * block_bytes / BLOCK / 2**20},
        {"cache": "paged: blocks in use (arithmetic)", "MiB": n_blocks * block_bytes / 2**20},
        {"cache": "paged: measured", "MiB": mem_cmp.measurements["paged (blocks in use)"].median_ms},
        {
            "cache": "contiguous: MAX_LEN per sequence (arithmetic)",
            "MiB": n_seq * MAX_LEN * block_bytes / BLOCK / 2**20,
        },
        {"cache": "contiguous: measured", "MiB": mem_cmp.measurements["contiguous (MAX_LEN per sequence)"].median_ms},
    ]
)
display(mem_table.round(2))
frag = 1 - busiest["stored_tokens"] / (n_blocks * BLOCK)
print(
    f"At the busiest step ({n_seq} sequences, {int(busiest['stored_tokens'])} tokens), measured: the paged cache "
    f"needs {kv_ratio} less memory than the contiguous one (target >= 2x: {kv_ratio.judge(2.0)}); "
    f"{100 * frag:.0f}% of the paged blocks' slots are the unused tails of last blocks."
)
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(trace_pre["t"], trace_pre["blocks_in_use"] * block_bytes / 2**20, label="in use (blocks)")
ax.axhline(pool_bytes / 2**20, color="C3", ls="--", label="reserved (the pool)")
pre_t = trace_pre["t"][trace_pre["preemptions"].diff().fillna(trace_pre["preemptions"]) > 0]
ax.plot(pre_t, [pool_bytes / 2**20] * len(pre_t), "v", color="k", label="a pre-emption")
ax.set(xlabel="seconds", ylabel="KV memory (MiB)", title="a pool of half the peak demand")
ax.legend(fontsize=8)
fig.tight_layout()
_ = cu.plots.save(fig, "16", "half_size_pool")

# %% [markdown]
# ## Prefix caching
# Many requests start the same way: a system prompt, a few-shot preamble, a long document asked about twice.
# With `prefix_caching=True` every full block is indexed by its tokens *and every token before it* (so the
# same block text at another position is another key); a new prompt looks its blocks up in order and shares
# those found (reference counts go up), and only the rest is prefilled. A block nobody holds stays cached
# until its memory is needed, least recently used first; a finished request's blocks are released tail first,
# so a cached prompt is evicted from its end and its head keeps matching. This is vLLM v1's automatic prefix
# caching (on by default), with a hash of the same key: it shares **full blocks only**, and a prompt found
# whole recomputes its last block, since the logits of its last token are needed
# (`vllm/v1/core/kv_cache_manager.py`, `get_computed_blocks` and `free`).
#
# The alternative, `prefix_caching="partial"`, also shares the first tokens of one more cached block: the
# request copies that block before writing its own tokens into it (**copy-on-write**, as vLLM v0 did;
# SGLang's radix tree shares prefixes token by token). It saves up to `block_size - 1` more prompt tokens
# per request, for a copy of a block and a reference count on a block another request may be writing beside.
#
# The load: one system prompt of at least 64 tokens before every question, arrivals slow enough that TTFT is
# mostly the prefill; median TTFT with no cache, full blocks, and partial blocks, taking turns in rounds, and
# the prompt tokens each took from the cache.

# %%
SYSTEM = (
    "You are the assistant of a harbor museum. Answer visitors briefly and kindly, in plain words. If a question "
    "is about the lighthouse, mention that its lamp was lit every night by a keeper who climbed ninety steps, and "
    "that the keeper's weather notebooks are on show in the second room."
)
with_system = [prompt_ids(q, system=SYSTEM) for q in QUESTIONS]
shared = next(i for i, col in enumerate(zip(*with_system, strict=False)) if len(set(col)) > 1)
assert shared >= 64, f"the shared prefix has {shared} tokens: lengthen SYSTEM to 64 or more"
N_PREFIX = cu.pick(full=6, smoke=4)
prefix_rng = random.Random(64)
kv_t = PagedKV(cfg, NUM_BLOCKS, BLOCK)
kv_t.add(0)
t0 = time.perf_counter()
forward(model, kv_t, [(0, with_system[0])])
prefill_sys_ms = 1000 * (time.perf_counter() - t0)
prefix_rate = 1000 / (prefill_sys_ms + SHORT * ms1)  # about one request at a time: TTFT is mostly the prefill
prefix_load = (
    [(prefix_rng.randrange(len(QUESTIONS)), SHORT) for _ in range(N_PREFIX)],
    np.cumsum([prefix_rng.expovariate(prefix_rate) for _ in range(N_PREFIX)]),
)
expected_sys = {p: reference(model, with_system[p], SHORT, EOS) for p in sorted({p for p, _ in prefix_load[0]})}
PREFIX_MODES = {"no prefix caching": False, "full blocks (vLLM v1)": True,
                "partial blocks, copy-on-write (vLLM v0, SGLang)": "partial"}  # fmt: skip
prefix_runs = {name: [] for name in PREFIX_MODES}


def prefix_run(name):
    def run():
        requests = [Request(i, with_system[p], cap, float(a), EOS)
                    for i, ((p, cap), a) in enumerate(zip(*prefix_load, strict=True))]  # fmt: skip
        kv = PagedKV(cfg, NUM_BLOCKS, BLOCK, prefix_caching=PREFIX_MODES[name])
        sched = Scheduler(model, kv, max_slots=MAX_SLOTS, token_budget=TOKEN_BUDGET)
        for r, _token, t in serve(sched, requests):
            r.times.append(t)
        for r, (p, cap) in zip(requests, prefix_load[0], strict=True):
            assert r.out == expected_sys[p][:cap], f"{name}: request {r.rid} differs from generate"
        ttft = [1000 * (r.times[0] - r.arrival) for r in requests]
        prefix_runs[name].append({"ttft_p50_ms": float(np.median(ttft)), "cached": sum(r.cached for r in requests),
                                  "prompt": sum(len(r.prompt) for r in requests), "copies": kv.copies})  # fmt: skip
        return prefix_runs[name][-1]["ttft_p50_ms"]

    return run


prefix_cmp = cu.comparing.compare_runs(
    {name: prefix_run(name) for name in prefix_runs}, baseline="no prefix caching", rounds=max(2, ROUNDS - 1),
    higher_is_better=False, label="median TTFT", metric="ms",
)  # fmt: skip
FULL, PARTIAL = list(PREFIX_MODES)[1:]
display(pd.DataFrame([
    {"prefix caching": name, "median TTFT ms": prefix_cmp.measurements[name].median_ms,
     "prompt tokens from the cache": prefix_runs[name][0]["cached"], "of": prefix_runs[name][0]["prompt"],
     "blocks copied on write": prefix_runs[name][0]["copies"],
     "TTFT vs no cache (lower is better above 1)": "baseline" if not mode else str(prefix_cmp.ratio(name))}
    for name, mode in PREFIX_MODES.items()
]).round(1))  # fmt: skip
prefix_ratio = prefix_cmp.ratio(FULL)  # TTFT without / TTFT with full-block caching (vLLM v1's way)
full_hit, part_hit = prefix_runs[FULL][0]["cached"], prefix_runs[PARTIAL][0]["cached"]
print(
    f"Shared prefix: {shared} tokens; every answer == generate in all three. Full blocks (vLLM v1), median TTFT: "
    f"{prefix_ratio.says('the cached run', 'the uncached one', 'lower than')} (target >= 2x lower median TTFT: "
    f"{prefix_ratio.judge(2.0)}). Partial blocks took {part_hit - full_hit} more prompt tokens from the cache "
    f"({part_hit} against {full_hit}); their median TTFT: "
    f"{prefix_cmp.ratio(PARTIAL).says('the partial-block run', 'the uncached one', 'lower than')}."
)

# %% [markdown]
# ### The slice of the pool that `attention="blocks"` reads, on a pool that has served a while
# `attention="blocks"` attends to one slice of the pool, from the batch's lowest block to its highest
# (`visible`), and scores every slot of it. On a fresh pool the blocks are handed out lowest first, so the slice
# holds the batch's blocks and little else. Once requests finish, their blocks go back and are handed out again,
# and with prefix caching a finished prompt's blocks stay in the pool, idle, until their memory is needed: a
# batch's blocks then lie among blocks it does not use, and its slice spans those too. The copying version reads
# only the blocks in use, and so does a paged kernel.
#
# Measured: a churn load (the load's prompts and caps, `N_CHURN` requests arriving at random, about as fast as a
# full batch finishes them, on the pool of the policy comparison, chunked prefill), with prefix caching (the
# streaming server's default) and without. Arrivals are counted in engine steps, not seconds, so the layout does
# not depend on this machine's speed. Every pass notes the blocks its slice spans (highest - lowest + 1) and the
# blocks the batch uses: span / used is 1 when the slice holds nothing else, 2 when it is twice the batch's own
# blocks. "Fresh": the passes before any request finished; "after churn": the passes once half the requests had
# finished. Every answer is checked against `generate`.


# %%
class SpanScheduler(Scheduler):
    """The Scheduler, noting for every pass the blocks its "blocks" slice spans and the blocks the batch uses."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.finished, self.spans = 0, []  # spans: (blocks spanned, blocks used, requests finished before the pass)

    def _pass(self, group):
        logits = super()._pass(group)  # the new tokens' blocks are in the tables now, as `visible` saw them
        blocks = [b for r, _ in group for b in self.kv.tables[r.rid]]
        self.spans.append((max(blocks) - min(blocks) + 1, len(set(blocks)), self.finished))
        return logits


N_CHURN = cu.pick(full=24, smoke=16)
churn_rng = random.Random(2)
churn_work = [(churn_rng.randrange(len(pool)), LONG if churn_rng.random() < 0.25 else SHORT) for _ in range(N_CHURN)]
churn_arrivals = np.cumsum([churn_rng.expovariate(MAX_SLOTS / mean_new) for _ in range(N_CHURN)])  # in steps
for p, _ in churn_work:
    expected_answer(p)


def churn_spans(prefix_caching):
    """Serve the churn load step by step; check every answer; return one row per pass (spanned, used, finished)."""
    requests = [Request(i, pool[p], cap, eos=EOS) for i, (p, cap) in enumerate(churn_work)]
    kv = PagedKV(cfg, NUM_BLOCKS, BLOCK, prefix_caching=prefix_caching)
    sched = SpanScheduler(model, kv, max_slots=MAX_SLOTS, token_budget=TOKEN_BUDGET)
    pending, step = list(zip(churn_arrivals, requests, strict=True)), 0
    while pending or sched.has_work():
        while pending and pending[0][0] <= step:  # the requests due by this step join the queue
            sched.add(pending.pop(0)[1])
        sched.step()  # an empty step when nothing is queued: time passes
        sched.finished, step = sum(r.done for r in requests), step + 1
    for r, (p, cap) in zip(requests, churn_work, strict=True):
        assert r.out == expected_answer(p)[:cap], f"churn: request {r.rid} differs from generate"
    assert kv.blocks_in_use() == 0, "every block went back (idle cached blocks count as free)"
    spans = pd.DataFrame(sched.spans, columns=["spanned", "used", "finished"])
    return spans.assign(ratio=spans["spanned"] / spans["used"])


churn_rows = []
for name, mode in (("prefix caching", True), ("no prefix caching", False)):
    spans = churn_spans(mode)
    phases = {"fresh": spans[spans["finished"] == 0], "after churn": spans[spans["finished"] >= N_CHURN // 2]}
    for phase, rows in phases.items():
        churn_rows.append({"pool": name, "passes": phase, "n": len(rows),
                           "span / used, median": rows["ratio"].median(),
                           "span / used, p90": rows["ratio"].quantile(0.9),
                           "span, % of the pool (median)": 100 * rows["spanned"].median() / NUM_BLOCKS})  # fmt: skip
churn_table = pd.DataFrame(churn_rows).set_index(["pool", "passes"])
display(churn_table.round(2))
ch = churn_table["span / used, median"]
ch90 = churn_table["span / used, p90"]


def span_pair(pool, when):
    """The slice's span over the blocks the batch uses, median and p90 of the passes: counts of blocks."""
    return f"{ch[pool, when]:.2f}x, {ch90[pool, when]:.2f}x"


print(
    f"{N_CHURN} requests, a pool of {NUM_BLOCKS} blocks, every answer == generate. The slice that "
    f"attention='blocks' reads, against the blocks the batch uses (median, p90): on the fresh pool "
    f"{span_pair('prefix caching', 'fresh')} with prefix caching and {span_pair('no prefix caching', 'fresh')} "
    f"without; after {N_CHURN // 2} requests had finished, with prefix caching "
    f"{span_pair('prefix caching', 'after churn')} (a median "
    f"{churn_table.loc[('prefix caching', 'after churn'), 'span, % of the pool (median)']:.0f}% of the pool), "
    f"without {span_pair('no prefix caching', 'after churn')}. "
    "The attention scores every slot of the slice: that many times the keys of the batch's own blocks."
)


# %% [markdown]
# ## A real streaming server
# So far the scheduler ran inside this notebook. A server adds HTTP, a process of its own, and clients that
# read tokens as they stream. LitServe 0.2.19 ships a **continuous-batching loop**
# (`litserve.loops.ContinuousBatchingLoop`): it hands each arriving request to the `LitAPI`'s `add_request`,
# calls its `step` again and again while `has_active_requests()` is true, and streams every `Output` of a
# step to its client as soon as the step returns (`FINISH_STREAMING` ends a stream). Our `Scheduler` fits
# that shape: `add_request` only queues the request (it runs on the loop's event-loop thread), `step` adds the
# queued ones and runs one engine step (on a worker thread). Two details of LitServe 0.2.19: the loop calls
# `run` again at once when there is nothing to do, spinning a core, so ours rests 2 ms when idle; and a step
# that makes no token (a prompt chunk) makes the loop sleep 10 ms, so `step` runs engine steps until one does.
#
# A request's body is JSON: `{"prompt": [token ids], "max_new": n}`, and optionally the sampling settings the
# engine takes, `"temperature"` (default 0: greedy), `"top_p"` (default 1) and `"seed"` (the same seed, the same
# tokens; by default the request's number in this server). The load below sends greedy requests only, so every
# answer can be checked against `generate`.
#
# The server is a file of its own (`%%writefile`): it runs as its own process. It imports this lesson's engine
# from `course_utils/from_lessons/l16_llm_serving.py` (generated from the cells tagged `export`: the code you
# read above). The process binds
# 127.0.0.1 only and is always stopped, also when a cell fails (`server_process.serve`, lesson 13). The
# engine's settings travel in an environment variable; the model worker gets one thread (the HTTP process and
# the load generator need the other core of a 2-core machine).
#
# One client must not break the others. A streamed answer starts with HTTP 200 before its first token, so a
# request is judged *before* it reaches the engine: `AdmissionGuard` (`course_utils/serve/stream_guard.py`, in
# the HTTP process) runs the engine's own `check_request` and `check_sampling` on each body and answers a request
# that could never run, or whose sampling settings are out of range, with **HTTP 422** and the reason (a second
# stream under a `request_id` still streaming gets 409). It also notices a client that leaves mid-stream and
# sends its connection id to the model worker, which `cancel`s the request before its next step: its blocks go
# back at once instead of after its last token. A request whose step raises ends with one `{"error": ...}` line;
# the others stream on, token for token.

# %%
import atexit
import json
import os
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

from course_utils.serve import server_process, stream_load

WORK = Path(tempfile.mkdtemp(prefix="lesson16_"))  # the server file goes here, not into the course's folders
atexit.register(shutil.rmtree, WORK, ignore_errors=True)

# %%
# %%writefile "{WORK}/llm_server.py"
import asyncio
import functools
import json  # noqa: F811 - the server file needs its own imports
import multiprocessing
import os  # noqa: F811
import queue

import litserve as ls
from litserve.loops import ContinuousBatchingLoop, Output
from litserve.utils import LitAPIStatus

from course_utils.serve.stream_guard import AdmissionGuard


class RestingContinuousLoop(ContinuousBatchingLoop):
    """LitServe's continuous-batching loop, resting 2 ms when there is no work (0.2.19 spins a core otherwise)."""

    async def run(self, lit_api, *args):
        if not lit_api.has_active_requests():
            await asyncio.sleep(0.002)
            return
        await super().run(lit_api, *args)


class StreamingLLM(ls.LitAPI):
    """Lesson 16's Scheduler behind LitServe: requests join at any step, every token streams as it is made.

    A request is JSON {"prompt": [token ids], "max_new": n}, optionally with "temperature" (default 0: greedy),
    "top_p" (default 1) and "seed" (default: the request's number in this server; the same seed, the same tokens);
    the answer streams one line per token: {"token": id}, or one line {"error": why} when its step failed. A request
    the engine could never run, or with sampling settings out of range, was refused before, with HTTP 422
    (AdmissionGuard); a client that leaves is cancelled (its connection id arrives on `cancelled`)."""

    def __init__(self, *, slots, token_budget, num_blocks, block_size=16, layers=None, prefix_caching=True,
                 cancelled=None, events=None):  # fmt: skip
        super().__init__(max_batch_size=slots, stream=True, loop=RestingContinuousLoop())
        self.settings = dict(slots=slots, token_budget=token_budget, num_blocks=num_blocks, block_size=block_size,
                             layers=layers, prefix_caching=prefix_caching)  # fmt: skip
        self.cancelled, self.events = cancelled, events  # events: a file for one JSON line per cancel or failure

    def setup(self, device):
        import torch

        from course_utils.from_lessons import l16_llm_serving as engine  # the lesson's exported cells

        torch.set_num_threads(max(1, torch.get_num_threads() - 1))
        s, self.engine = self.settings, engine
        model, tok = engine.serving_model(s["layers"])
        kv = engine.PagedKV(model.config, s["num_blocks"], s["block_size"], prefix_caching=s["prefix_caching"])
        self.scheduler = engine.Scheduler(model, kv, max_slots=s["slots"], token_budget=s["token_budget"])
        self.eos = tok.eos_token_id if tok is not None else None
        self.inbox, self.uids, self.count = queue.SimpleQueue(), {}, 0
        self.rid_of, self.gone = {}, set()  # connection id -> request id; connections gone before they arrived

    def add_request(self, uid, request):  # LitServe's event-loop thread: only queue it
        self.inbox.put((uid, request))

    def has_capacity(self):  # the scheduler admits by slots and free blocks: LitServe may hand over every request
        return True

    def has_active_requests(self):
        return not self.inbox.empty() or self.scheduler.has_work() or self._cancels_waiting()

    def _cancels_waiting(self):
        return self.cancelled is not None and not self.cancelled.empty()

    def _log(self, event, r):
        if self.events:
            with open(self.events, "a") as f:
                f.write(json.dumps({"event": event, "rid": r.rid, "made": len(r.out), "error": r.error,
                                    "blocks_in_use": self.scheduler.kv.blocks_in_use()}) + "\n")  # fmt: skip

    def _end(self, r, outputs, error=None):
        uid = self.uids.pop(r.rid)
        self.rid_of = {c: rid for c, rid in self.rid_of.items() if rid != r.rid}
        if error:
            outputs.append(Output(uid, {"error": error}, LitAPIStatus.OK))
        outputs.append(Output(uid, "", LitAPIStatus.FINISH_STREAMING))

    def step(self, prev_outputs):  # a worker thread: engine steps until one makes a token
        outputs = []
        while self._cancels_waiting():  # clients gone since the last step: their requests leave now
            conn = self.cancelled.get()
            r = self.scheduler.cancel(self.rid_of.get(conn))
            if r is None:
                self.gone.add(conn)  # not here yet (or finished): drop it if it arrives
                continue
            self._log("cancelled", r)
            self._end(r, outputs)
        while not self.inbox.empty():
            uid, body = self.inbox.get()
            body = body if isinstance(body, dict) else {}
            r = self.engine.Request(self.count, body.get("prompt"), body.get("max_new"), eos=self.eos,
                                    temperature=body.get("temperature", 0.0), top_p=body.get("top_p", 1.0),
                                    seed=body.get("seed"))  # fmt: skip
            if body.get("conn") in self.gone:
                self.gone.discard(body["conn"])
                outputs.append(Output(uid, "", LitAPIStatus.FINISH_STREAMING))
                continue
            try:
                self.scheduler.add(r)  # AdmissionGuard refused the bad ones; this is the engine's own check
            except self.engine.BadRequest as exc:  # ends only its own stream
                outputs += [Output(uid, {"error": f"BadRequest: {exc}"}, LitAPIStatus.OK),
                            Output(uid, "", LitAPIStatus.FINISH_STREAMING)]  # fmt: skip
                continue
            self.uids[r.rid], self.rid_of[body.get("conn")], self.count = uid, r.rid, self.count + 1
        while self.scheduler.has_work() and not outputs:
            made = self.scheduler.step()
            for r in self.scheduler.failed:  # its step raised: it alone ends, with the reason
                self._log("failed", r)
                self._end(r, outputs, error=r.error)
            self.scheduler.failed.clear()
            for r, token in made:
                outputs.append(Output(self.uids[r.rid], {"token": token}, LitAPIStatus.OK))
                if r.done:
                    self._end(r, outputs)
        return outputs

    def encode_response(self, output):
        return output


def check_body(body, *, check, check_sampling, vocab_size, context, num_blocks, block_size):
    """AdmissionGuard's check, in the HTTP process: the engine's own `check_request` and `check_sampling` (their
    BadRequest is a ValueError -> HTTP 422); the sampling fields are optional, with the engine's defaults."""
    check(body.get("prompt"), body.get("max_new"), vocab_size=vocab_size, context=context, num_blocks=num_blocks,
          block_size=block_size)  # fmt: skip
    check_sampling(body.get("temperature", 0.0), body.get("top_p", 1.0), body.get("seed"))


def build_server(max_batch_size=8, batch_timeout=0.0, workers_per_device=1, accelerator="cpu"):
    """The LitServer that `server_process.serve(...)` starts; engine settings as JSON in COURSE_16_SERVER."""
    import course_utils as cu
    from course_utils.from_lessons.l16_llm_serving import check_request, check_sampling

    settings = {"slots": max_batch_size, "token_budget": 64, "num_blocks": 128, "block_size": 16,
                **json.loads(os.environ.get("COURSE_16_SERVER", "{}"))}  # fmt: skip
    cancelled = multiprocessing.get_context("spawn").SimpleQueue()  # HTTP process -> model worker
    api = StreamingLLM(**settings, cancelled=cancelled)
    shape = cu.llm.smollm2_config()  # SmolLM2's vocabulary and context (the stand-in has the same shape)
    check = functools.partial(check_body, check=check_request, check_sampling=check_sampling,
                              vocab_size=shape.vocab_size, context=shape.max_position_embeddings,
                              num_blocks=settings["num_blocks"], block_size=settings["block_size"])  # fmt: skip
    guard = (AdmissionGuard, {"check": check, "cancelled": cancelled})
    return ls.LitServer(api, accelerator=accelerator, workers_per_device=workers_per_device, timeout=60,
                        middlewares=[guard])  # fmt: skip


# %% [markdown]
# The load: the prompts of the policy comparison (as token ids: the client and the server agree on the
# tokenizer), Poisson arrivals from the course's streaming client (`stream_load.open_loop_stream`), which
# reads every answer line by line and notes when each line arrived, counted from the moment its request was
# due. From those times, the metrics vLLM's benchmark reports: **TTFT** to the first token (queueing and the
# prefill that makes that token included), **ITL** every gap between two streamed tokens (a distribution),
# **TPOT** one mean per request, (end to end minus TTFT) / (tokens - 1). Their means agree when every step
# emits one token per stream; their tails do not (a long step is one long ITL gap, spread thin in TPOT), and
# they differ more when a step emits several tokens of one stream (speculative decoding).
#
# One difference from vLLM's benchmark: its clock starts when the request is *sent* (`st = time.perf_counter()`
# just before the POST, `vllm/benchmarks/lib/endpoint_request_func.py`), ours when the request was *due* by
# the Poisson schedule. A client that falls behind its schedule sends late, and a clock started at the send
# does not see that wait (*coordinated omission*); counted from the due time, every wait is in TTFT.

# %%
SERVER_FILE = WORK / "llm_server.py"
if not SERVER_FILE.exists():  # running as a plain script: %%writefile above was a comment
    server_process.writefile_fallback(SERVER_FILE, __file__)

bodies = [{"prompt": pool[p], "max_new": cap} for p, cap in work]  # the policy comparison's requests
settings = {"token_budget": TOKEN_BUDGET, "num_blocks": NUM_BLOCKS, "block_size": BLOCK, "layers": LAYERS,
            "prefix_caching": False}  # fmt: skip
os.environ["COURSE_16_SERVER"] = json.dumps(settings)  # read by build_server in the server process
with server_process.serve(f"{SERVER_FILE}:build_server", max_batch_size=MAX_SLOTS, start_timeout=300) as srv:
    stream_load.open_loop_stream(srv.predict_url, bodies[:1], rate=1.0, n_requests=1)  # warm-up, not counted
    answers = stream_load.open_loop_stream(
        srv.predict_url, bodies, rate=RATE, n_requests=N_REQUESTS, max_seconds=120, timeout=300, seed=16
    )
for a, (p, cap) in zip(answers, work, strict=True):
    tokens = [line["token"] for line in a.lines if isinstance(line, dict) and "token" in line]
    assert a.ok, f"served request {a.index}: status {a.status}, {a.error or a.lines[:3]}"
    assert tokens == expected_answer(p)[:cap], f"served request {a.index} differs from generate: {tokens}"
# The served answers in `metrics`' terms, so both rows are the same definitions: each request arrives when it was
# due (the client's clock starts there, see above) and each token counts when its line reached the client.
# (out: one entry per token, which is all `metrics` counts of it)
served = metrics(
    [SimpleNamespace(arrival=a.due_s, times=[a.due_s + t for t in a.times_s], out=a.times_s) for a in answers]
)
print(
    f"Served over HTTP on 127.0.0.1 ({MAX_SLOTS} slots, chunked prefill, one model thread): all {len(answers)} "
    "streams == generate. Beside it, the in-process chunked runs above (this notebook's threads, no HTTP):"
)
display(pd.DataFrame({"served over HTTP": served, "in-process (chunked prefill)": table.loc[chunked]}).T.round(1))

# %% [markdown]
# ## Speculative decoding
# A decode step reads all the weights to make one token. Checking k *proposed* tokens costs one pass over
# k + 1 positions, about the same weight reads. So: a cheap **draft** proposes k tokens; the model
# **verifies** them in one forward pass; we keep the longest prefix where the draft equals the model's own
# greedy choice, plus the model's token at the first mismatch (or after the last draft token: the *bonus*
# token). Every kept token is one the model would have chosen: the output is identical to greedy decoding.
# The rejected tokens' keys and values are dropped from the cache (`truncate`).
#
# The draft here is **prompt lookup** (n-gram drafting): find the last few tokens earlier in the text and
# propose what followed them there. It costs no model at all and fits answers that copy from the prompt
# (quoting, editing, extraction); elsewhere it guesses wrong.
#
# If each draft token is accepted with probability `a`, one verification makes on average
# `(1 - a^(k+1)) / (1 - a)` tokens (geometric series: token i+1 counts only if the first i were accepted).
#
# Two limits of what is written here. It is **greedy only**: with sampling (temperature > 0) "equal to the
# model's choice" has no meaning; speculative *sampling* accepts a draft token x with probability
# min(1, p(x)/q(x)) (p the model's distribution, q the draft's) and on a rejection samples from the
# normalized max(0, p - q), which gives exactly the model's distribution (Leviathan et al. 2023, Chen et al.
# 2023; vLLM implements this rejection sampler). And it pays at **low to medium load**: a verification pass
# over k + 1 positions per sequence is cheap only while the step is memory-bound; in a full batch the rejected
# positions are work taken from other sequences, and vLLM's own measurements show speculative decoding slowing
# a busy server down (its documentation advises it for low to medium load).


# %% tags=["contract"]
def lookup_draft(tokens, k, max_ngram=3):
    """Prompt lookup: the k tokens that followed the latest earlier occurrence of the last n tokens."""
    for n in range(max_ngram, 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + k]
    return []


def speculative(model, kv, prompt, max_new, k, eos=None, sid=0):
    """Greedy decoding with draft-and-verify; returns (tokens, per-step (drafted, accepted) counts)."""
    kv.add(sid)
    out = [int(forward(model, kv, [(sid, prompt)])[-1].argmax())]
    steps = []
    while len(out) < max_new and out[-1] != eos:
        draft = lookup_draft(prompt + out, k)[: max_new - len(out) - 1] if k else []
        logits = forward(model, kv, [(sid, [out[-1]] + draft)], all_logits=True)  # verify: ONE pass, k+1 tokens
        target = logits.argmax(-1).tolist()  # the model's greedy choice after each prefix
        n = 0
        while n < len(draft) and draft[n] == target[n]:
            n += 1  # the longest matching prefix
        kv.truncate(sid, len(kv.tokens[sid]) - (len(draft) - n))  # forget the rejected draft tokens
        new = draft[:n] + [target[n]]  # accepted + the model's own next token
        out += new[: new.index(eos) + 1] if eos in new else new
        steps.append((len(draft), n))
    kv.release(sid)
    return out[:max_new], steps


# %% [markdown]
# Two prompts: one whose answer copies the prompt (the draft fits) and one that does not. For each draft
# length k the runs take turns with plain decoding (k = 0, the same engine) in rounds; every run must equal
# greedy `generate`.

# %%
PASSAGE = (
    "The old lighthouse stood on the rocky cliff above the harbor. Every night its keeper climbed the "
    "ninety steps to light the lamp, and every morning he wrote the weather in a small blue notebook."
)
CASES = {
    "copy (draft fits)": prompt_ids(f"Copy this text exactly, word for word:\n\n{PASSAGE}"),
    "story (draft misses)": prompt_ids("Tell me a short story about a dragon."),
}
SPEC_NEW = cu.pick(full=32, smoke=8)
KS = cu.pick(full=[2, 8], smoke=[3])
spec_rows, spec_ratio = [], {}
for case, prompt in CASES.items():
    want = reference(model, prompt, SPEC_NEW, EOS)
    stats = {}

    def spec_run(k, case=case, prompt=prompt, want=want, stats=stats):
        def run():
            kv = PagedKV(cfg, -(-(len(prompt) + SPEC_NEW + max(KS)) // BLOCK) + 1, BLOCK)
            t0 = time.perf_counter()
            got, steps = speculative(model, kv, prompt, SPEC_NEW, k, EOS)
            seconds = time.perf_counter() - t0
            assert got == want, f"{case}, k={k}: speculative output differs from greedy generate"
            stats[k] = (len(got), steps)
            return len(got) / seconds

        return run

    cmp = cu.comparing.compare_runs(
        {f"k={k}": spec_run(k) for k in [0, *KS]}, baseline="k=0", rounds=ROUNDS, higher_is_better=True,
        label=case, metric="tokens/s",
    )  # fmt: skip
    for k in [0, *KS]:
        n_tokens, steps = stats[k]
        accepted = sum(n for _, n in steps)
        reached = sum(min(n + 1, d) for d, n in steps)  # draft positions examined (all before them accepted)
        spec_rows.append(
            {
                "case": case,
                "k": k,
                "tokens/s": cmp.measurements[f"k={k}"].median_ms,
                "vs k=0": "baseline" if k == 0 else str(cmp.ratio(f"k={k}")),
                "verify passes": len(steps),
                "tokens per pass": (n_tokens - 1) / max(len(steps), 1),
                "acceptance": accepted / reached if reached else float("nan"),
                "passes with a draft %": 100 * sum(d > 0 for d, _ in steps) / max(len(steps), 1),
            }
        )
        if k:
            spec_ratio[(case, k)] = cmp.ratio(f"k={k}")
spec = pd.DataFrame(spec_rows)
a = spec["acceptance"].clip(upper=0.999)
spec["formula tokens per pass"] = np.where(spec["k"] > 0, (1 - a ** (spec["k"] + 1)) / (1 - a), 1.0)
print(f"Every run == greedy generate ({SPEC_NEW} new tokens, both prompts, k = 0 and {KS}, {ROUNDS} rounds).")
spec.round(2)

# %% [markdown]
# Read the table: `acceptance` is the share of examined draft tokens the model accepted; the formula's
# tokens per pass uses it (a draft position counts as examined only if every earlier one was accepted). The
# formula assumes every pass has a full draft of k tokens; prompt lookup sometimes finds nothing (`passes with
# a draft %` below 100), and those passes make one token.

# %%
fits = {k: spec_ratio[("copy (draft fits)", k)] for k in KS}
misses = {k: spec_ratio[("story (draft misses)", k)] for k in KS}
best_k = max(fits, key=lambda k: fits[k].estimate)
worst_k = min(misses, key=lambda k: misses[k].estimate)
best, worst = fits[best_k], misses[worst_k]
rows_k = spec.set_index(["case", "k"])
print(
    f"Draft fits, k={best_k}: {best.says('speculative', 'plain decoding')} "
    f"(acceptance {rows_k.loc[('copy (draft fits)', best_k), 'acceptance']:.2f}, "
    f"{rows_k.loc[('copy (draft fits)', best_k), 'tokens per pass']:.1f} tokens per verify pass); target >= 1.3x: "
    f"{best.judge(1.3)}."
)
print(
    f"Draft misses, k={worst_k}: {worst.says('speculative', 'plain decoding')} "
    f"(acceptance {rows_k.loc[('story (draft misses)', worst_k), 'acceptance']:.2f}): a pass pays for up to "
    f"{worst_k + 1} positions and keeps {rows_k.loc[('story (draft misses)', worst_k), 'tokens per pass']:.1f} tokens."
)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
for i, (case, g) in enumerate(spec[spec["k"] > 0].groupby("case", sort=False)):
    ax1.plot(g["k"], g["tokens per pass"], marker="o", color=f"C{i}", label=f"{case}: measured")
    ax1.plot(g["k"], g["formula tokens per pass"], ls="--", color=f"C{i}", label=f"{case}: formula")
    r = [spec_ratio[(case, k)] for k in g["k"]]
    err = [[x.estimate - x.low for x in r], [x.high - x.estimate for x in r]]
    ax2.errorbar(g["k"], [x.estimate for x in r], yerr=err,
                 marker="o", color=f"C{i}", capsize=3, label=case)  # fmt: skip
ax2.axhline(1, color="gray", lw=0.8)
ax1.set(xlabel="draft length k", ylabel="tokens per verify pass", title="accepted tokens vs the formula")
ax2.set(xlabel="draft length k", ylabel="tokens/s vs plain decoding", title="speed-up, 95% interval")
for ax in (ax1, ax2):
    ax.legend(fontsize=7)
fig.tight_layout()
_ = cu.plots.save(fig, "16", "speculative")

# %% [markdown]
# ## On a GPU: the same engine with more slots
# On a GPU a decode step for 32 sequences costs little more than a step for one, so keeping the batch full
# matters more. The same `Scheduler` runs on CUDA with chunked prefill (the model file cannot travel to every
# GPU machine: without it the section uses `cu.llm.tiny_llama()`, SmolLM2's shape with random weights, and says
# so). Batched GPU kernels need not reproduce batch-1 results bit for bit (other tile shapes, other summation
# orders, TF32), and one flipped near-tie sends greedy decoding down another path, so the check here is
# **token agreement** with that model's own greedy `generate`: position by position, at least
# `GPU_AGREEMENT` of all tokens, and every request's first token.

# %%
GPU_AGREEMENT = 0.9
if cu.gpu_section("16.gpu-serve"):
    if tok is not None and not cu.is_smoke():
        gmodel, gname = cu.llm.load_smollm2(device="cuda")[0], MODEL_NAME
    else:  # no model file here, or smoke sizes: SmolLM2's shape, random weights (2 layers in smoke mode)
        gmodel = cu.llm.tiny_llama(device="cuda", **({"num_hidden_layers": 2} if cu.is_smoke() else {}))
        gname = f"random SmolLM2-shaped Llama, {gmodel.config.num_hidden_layers} layers"
    print(f"Model on the GPU: {gname}")
    g_slots, g_n, g_cap = cu.pick(full=32, smoke=4), cu.pick(full=96, smoke=6), cu.pick(full=64, smoke=4)
    g_len = max(map(len, pool)) + g_cap
    g_expected = [reference(gmodel, p, g_cap, EOS) for p in pool]
    g_rng = random.Random(1)
    g_caps = [g_cap if g_rng.random() < 0.25 else max(1, g_cap // 8) for _ in range(g_n)]
    g_runs = {}

    def gpu_run(policy, budget):
        def run():
            reqs = [Request(i, pool[i % len(pool)], g_caps[i], 0.0, EOS) for i in range(g_n)]
            g_kv = PagedKV(gmodel.config, g_slots * -(-g_len // BLOCK) + 4, BLOCK, device="cuda")
            sched = Scheduler(gmodel, g_kv, max_slots=g_slots, token_budget=budget, policy=policy)
            for r, _token, t in serve(sched, reqs):
                r.times.append(t)
            torch.cuda.synchronize()
            same = [sum(a == b for a, b in zip(r.out, g_expected[r.rid % len(pool)], strict=False)) for r in reqs]
            agreement = sum(same) / sum(len(r.out) for r in reqs)
            assert agreement >= GPU_AGREEMENT and all(s > 0 for s in same), (
                f"GPU {policy}: {agreement:.1%} of tokens agree with generate (tolerance {GPU_AGREEMENT:.0%}), "
                f"{sum(s == 0 for s in same)} first tokens differ"
            )
            g_runs.setdefault(policy, []).append({**metrics(reqs), "agreement": agreement})
            return g_runs[policy][-1]["tokens_per_s"]

        return run

    g_cmp = cu.comparing.compare_runs(
        {"static": gpu_run("static", None), "continuous + chunked prefill": gpu_run("continuous", 256)},
        baseline="static", rounds=ROUNDS, higher_is_better=True, label="GPU throughput", device="cuda",
    )  # fmt: skip
    g_table = pd.DataFrame({p: {k: float(np.median([r[k] for r in v])) for k in v[0]} for p, v in g_runs.items()}).T
    display(g_table.round(3))
    g_ratio = g_cmp.ratio("continuous + chunked prefill")
    print(
        f"{g_n} requests at once, {g_slots} slots: "
        f"{g_ratio.says('continuous + chunked', 'static', 'the throughput of')}"
    )
    cu.record(
        "16",
        "continuous + chunked prefill vs static (GPU)",
        model=gname,
        device="cuda",
        dtype="fp32",
        batch_size=g_slots,
        throughput=g_table.loc["continuous", "tokens_per_s"],
        median_ms=g_table.loc["continuous", "itl_p50_ms"],
        speedup_vs_baseline=g_ratio,
        notes=f"{g_n} requests at once; token agreement with generate {g_table.loc['continuous', 'agreement']:.1%}",
    )
else:
    cu.results.show_reference("16", "GPU")

# %% [markdown]
# ## At scale: vLLM
# vLLM is this lesson's engine grown up: the same scheduler (continuous batching, token budget, decodes first,
# pre-emption by recompute), PagedAttention kernels that read the blocks in place, CUDA graphs and fused
# kernels. In vLLM's V1 engine **chunked prefill and prefix caching are on by default**: there is nothing to
# enable, `--max-num-batched-tokens` sets the per-step token budget (smaller: better ITL; larger: better TTFT
# and throughput), `--max-num-seqs` the slots, `--disable-prefix-caching` turns caching off to compare.
# `vllm bench serve` is its open-loop load generator (`--request-rate`: Poisson arrivals) and reports TTFT,
# TPOT and ITL as defined above, each separately.
#
# The command lines below were checked against vLLM 0.33.0's own argument parsers (built from its wheel;
# `tests/gpu_contract/test_l16_vllm_flags.py` holds the flags it accepts and checks every flag used here).
# The section runs only where vLLM is installed and a GPU exists; vLLM does not install on CPU machines.


# %% tags=["contract"]
def vllm_commands(model_dir, port, *, prefix_caching, num_prompts, rate, result_dir, max_num_batched_tokens=2048):
    """`vllm serve` and `vllm bench serve` command lines (argument lists) for one measured configuration."""
    serve_cmd = [
        "vllm",
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-num-seqs",
        "64",
        "--max-num-batched-tokens",  # the token budget per step: chunked prefill is on by default
        str(max_num_batched_tokens),
        "--gpu-memory-utilization",
        "0.5",
        *([] if prefix_caching else ["--disable-prefix-caching"]),  # prefix caching is on by default
    ]
    bench_cmd = [
        "vllm",
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--model",
        str(model_dir),
        "--dataset-name",
        "prefix_repetition",
        "--prefix-repetition-prefix-len",
        "256",
        "--prefix-repetition-suffix-len",
        "64",
        "--prefix-repetition-num-prefixes",
        "4",
        "--prefix-repetition-output-len",
        "64",
        "--num-prompts",
        str(num_prompts),
        "--request-rate",
        str(rate),
        "--seed",
        "16",
        "--percentile-metrics",
        "ttft,tpot,itl",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        str(result_dir),
    ]
    return serve_cmd, bench_cmd


# %%
for line in vllm_commands("<model folder>", 8016, prefix_caching=True, num_prompts=200, rate=16, result_dir="out"):
    print(" ".join(line))

# %%
if cu.gpu_section("16.vllm", needs=("vllm",), why="vLLM needs a CUDA GPU and its own install (pip install vllm)."):
    import json
    import subprocess
    import tempfile
    import urllib.request
    from pathlib import Path

    if tok is None:
        print("vLLM needs the model with its tokenizer: run `make setup` so the SmolLM2 file is here.")
    else:
        cu.llm.load_smollm2()  # makes sure the converted folder exists
        out_dir = tempfile.mkdtemp(prefix="lesson16_vllm_")
        vllm_rows = []
        for caching in (False, True):
            serve_cmd, bench_cmd = vllm_commands(
                cu.llm.cache_dir(), 8016, prefix_caching=caching, num_prompts=200, rate=16, result_dir=out_dir
            )
            server = subprocess.Popen(serve_cmd, start_new_session=True)
            try:
                for _ in range(600):  # up to 10 minutes for the engine to start
                    try:
                        urllib.request.urlopen("http://127.0.0.1:8016/health", timeout=1)
                        break
                    except OSError:
                        assert server.poll() is None, "vllm serve exited: see its log above"
                        time.sleep(1)
                subprocess.run(bench_cmd, check=True, timeout=600)
            finally:
                server.terminate()
                server.wait(timeout=60)
            latest = max(Path(out_dir).glob("*.json"), key=lambda p: p.stat().st_mtime)
            res = json.loads(latest.read_text())
            vllm_rows.append(
                {
                    "prefix caching": caching,
                    **{
                        k: res.get(k)
                        for k in ("output_throughput", "p50_ttft_ms", "p99_ttft_ms", "p50_itl_ms", "p99_itl_ms")
                    },
                }
            )
        display(pd.DataFrame(vllm_rows))

# %% [markdown]
# **The alternatives.** **SGLang** (`python -m sglang.launch_server`) has the same core (continuous
# batching, paged KV) and caches prefixes in a radix tree, which pays for chat histories and agents that share
# long prefixes; **TensorRT-LLM** (NVIDIA; `trtllm-serve`) compiles the model into TensorRT engines with
# in-flight batching, paged KV and FP8/INT4 kernels, fastest on NVIDIA GPUs at the price of a build step per
# model and GPU. All three speak the OpenAI HTTP API, so `vllm bench serve` can load any of them.

# %% [markdown]
# ## What surprised us
# Printed from this run:

# %%
print(
    f"* A decode step for {MAX_SLOTS} sequences took {msB:.0f} ms, for one {ms1:.0f} ms: "
    f"{per_token.interval_text} the tokens per second for the same weight reads."
)
co = paired("continuous", "static", "tokens_per_s", True)
print(
    f"* Continuous batching alone: {co.says('continuous', 'static', 'the throughput of')}; with chunked prefill: "
    f"{thr.says('chunked', 'static', 'the throughput of')}; "
    + paired(chunked, "continuous", "itl_p99_ms", False).says(
        "the p99 ITL with chunked prefill", "with one-at-a-time prefills", "lower than"
    )
    + "."
)
last = attn_table.iloc[-1]
print(
    f"* Reading the blocks in place instead of copying them, at batch {BATCHES[-1]}: "
    f"{attn_ratio.says('in place', 'the copy')}; at batch 1: {attn_table['blocks vs copy (speed)'].iloc[0]}. "
    f"At batch {BATCHES[-1]} each new token is scored against {last['keys per token, copy']} keys (copy) or "
    f"{last['keys per token, blocks']} slots (in place), where a paged kernel reads "
    f"{last['keys per token, a paged kernel']}: both versions pay for the batch's other sequences. On a pool that "
    f"had served {N_CHURN // 2} requests, with prefix caching, the slice spanned (median, p90) "
    f"{span_pair('prefix caching', 'after churn')} the batch's own blocks "
    f"(fresh: {span_pair('prefix caching', 'fresh')})."
)
print(
    f"* A pool of half the peak demand: {sched_pre.preemptions} pre-emptions and the same {N_PRE} answers; the "
    f"contiguous cache needed {kv_ratio} the paged cache's memory at the busiest step."
)
print(
    f"* Prefix caching of a {shared}-token system prompt: "
    f"{prefix_ratio.says('the cache', 'no cache', 'lower median TTFT than')}."
)
print(
    "* The request-rate sweep's knee: "
    + (f"{knee_rate:.3g} requests/s" if knee_rate is not None else "below the lowest rate tried")
    + f" ({knee_why}). Beside transformers' generate_batch: "
    + (peer_thr.says(OURS, PEER, "the throughput of") if peer_cmp is not None and peer_diff is None else
       "no speed comparison (see its section)")
    + "."
)  # fmt: skip
print(
    f"* The slots sweep's knee: {knee} slots. Prompt lookup: k={best_k} {best} where the draft fits, "
    f"k={worst_k} {worst} where it misses: same code, identical output."
)

# %% [markdown]
# ## Exercises
# 1. **The admission step of continuous batching.** Write `admit_step(running, waiting, max_slots)`: called
#    once per decode step, it returns the new list of running sequences. Each sequence has a `.done`
#    attribute. Retire every finished sequence at once; keep every unfinished one (no pre-emption); then
#    admit from the **front** of `waiting` (a `collections.deque`: take them with `popleft()`) while there are
#    free slots, never more than `max_slots` running. The check simulates a server with random arrivals and
#    lengths, step by step, and watches for idle slots while requests wait, order, capacity and retirement.


# %%
def admit_step(running, waiting, max_slots):
    raise NotImplementedError  # your code here


cu.exercises.check("16.admit", admit_step)

# %% [markdown]
# 2. **Speculative verification.** Write `verify(target, context, draft)`: `target(ids)` runs the model on a
#    `(1, n)` tensor of token ids and returns logits `(1, n, vocab)` (no cache here); `context` is the list of
#    tokens so far, `draft` a list of proposed next tokens. With **one** call to `target`, return the tokens to
#    append: the longest prefix of `draft` that equals the model's greedy choices, plus the model's own next
#    token after it. A draft may be empty (prompt lookup often finds nothing): then return the model's own next
#    token. The check decodes with your function and random drafts (always right, always wrong, partly right,
#    empty; a wrong token is often the model's second choice, which a "top 2" rule would accept; on a flatter
#    model the greedy token often has a probability under 0.5), demands output identical to greedy decoding and
#    counts the calls of `target`.


# %%
def verify(target, context, draft):
    raise NotImplementedError  # your code here


cu.exercises.check("16.verify", verify)

# %% [markdown]
# ## Summary
# Rows for this machine's results: the three schedulers under the same load, reading the blocks in place,
# paged vs contiguous memory, prefix caching, and the best speculative setting where the draft fits and the
# losing one. Each ratio is recorded with its interval.
# Next: **17 · Beyond one device**: tensor, pipeline and data parallelism.

# %%
for name in POLICIES:
    r = table.loc[name]
    cu.record(
        "16",
        f"{name} batching",
        model=MODEL_NAME,
        device="cpu",
        dtype="fp32",
        batch_size=MAX_SLOTS,
        median_ms=r["itl_p50_ms"],
        throughput=r["tokens_per_s"],
        speedup_vs_baseline=policy_cmp.ratio(name) if name != "static" else None,
        notes=f"{N_REQUESTS} Poisson requests at {RATE:.2f}/s, p99 TTFT {r['ttft_p99_ms']:.0f} ms, "
        f"p99 ITL {r['itl_p99_ms']:.0f} ms, {ROUNDS} rounds",
    )
cu.record(
    "16", "attention reading the blocks vs copying them", model=MODEL_NAME, device="cpu", dtype="fp32",
    batch_size=BATCHES[-1], speedup_vs_baseline=attn_ratio, notes=f"decode step, {BENCH_LEN} tokens per sequence",
)  # fmt: skip
cu.record(
    "16", "paged KV cache vs contiguous-max", model=MODEL_NAME, device="cpu", dtype="fp32",
    speedup_vs_baseline=kv_ratio, notes=f"KV memory measured (RSS), busiest step, block {BLOCK}, MAX_LEN {MAX_LEN}",
)  # fmt: skip
cu.record(
    "16", "prefix caching, median TTFT", model=MODEL_NAME, device="cpu", dtype="fp32",
    speedup_vs_baseline=prefix_ratio, notes=f"{shared}-token shared prefix, {N_PREFIX} requests",
)  # fmt: skip
for label, k, r in (("draft fits", best_k, best), ("draft misses", worst_k, worst)):
    cu.record(
        "16",
        f"speculative decoding, prompt lookup, {label}",
        model=MODEL_NAME,
        device="cpu",
        dtype="fp32",
        batch_size=1,
        speedup_vs_baseline=r,
        notes=f"k={k}, identical to greedy",
    )
print("Recorded. Next: 17 · Beyond one device, the same model split over several ranks.")
