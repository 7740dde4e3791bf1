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
# **Goals.** Build the three ideas inside every LLM server yourself, on SmolLM2-135M, and measure each one:
# * **continuous (iteration-level) batching**: a scheduler that admits and retires sequences at *every*
#   decode step, against **static (request-level) batching**, which waits for a whole batch to finish, both
#   streaming tokens as they are made, under open-loop Poisson arrivals with mixed prompt and output lengths:
#   throughput, time to first token (TTFT) and inter-token latency (ITL), p50 and p99;
# * a **paged KV cache**: fixed-size blocks from one pool, a block table per sequence, a free list; the KV
#   memory in use against a contiguous cache reserved to the maximum length, at the same load;
# * **speculative decoding**: draft k tokens cheaply, verify them in *one* pass of the model, keep the longest
#   matching prefix plus the model's own next token; the output stays identical to greedy decoding;
# * and, on a GPU, the same ideas at scale in vLLM (`vllm serve`, `vllm bench serve`).
#
# Every served output is checked identical to that prompt's greedy `model.generate` before any speed figure.
#
# **The bottleneck it attacks** (*01 · Measuring inference*, the taxonomy; *15 · LLM decoding*): a decode step
# is **memory-bound**: it reads every weight to make one token per sequence, so a step for 8 sequences costs
# far less than 8 steps for one (measured below). A server gains by keeping the batch full (continuous batching), by not
# wasting the memory that holds the batch (paged KV cache), and by making more than one token per weight read
# (speculative decoding).

# %%
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from IPython.display import display
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import course_utils as cu

device = cu.lesson.start("16", "Serving LLMs")

# %%
if cu.llm.has_smollm2():
    model, tok = cu.llm.load_smollm2()  # SmolLM2-135M-Instruct: the Q4_1 GGUF's weights, dequantized to FP32
    MODEL_NAME, EOS = "SmolLM2-135M-Instruct", tok.eos_token_id
else:  # a machine without the model file: SmolLM2's shape, random weights (speed does not depend on them)
    model, tok = cu.llm.tiny_llama(), None
    MODEL_NAME, EOS = "random SmolLM2-shaped Llama", None
    print("The SmolLM2 file is not installed here (make setup installs it): random weights, token-id prompts.")
cfg = model.config
n_params = sum(p.numel() for p in model.parameters())
print(
    f"{MODEL_NAME}: {n_params / 1e6:.1f}M parameters, {cfg.num_hidden_layers} layers, "
    f"{cfg.num_key_value_heads} KV heads x {cfg.head_dim} dims; {torch.get_num_threads()} threads"
)

# %% [markdown]
# ## The engine: one forward pass over a paged KV cache
# A server must run one decode step for sequences of *different* lengths together, and add or drop a sequence
# between steps. We write the model's forward pass ourselves on top of the model's own layers (the attention
# is the part that changes), with the KV cache in a **paged** store:
# * one pool of `num_blocks` blocks of `block_size` token slots, for every layer's keys and values;
# * a **block table** per sequence: the list of blocks holding its tokens, in order (token `p` lives in
#   block `table[p // block_size]`, slot `p % block_size`);
# * a **free list** of blocks: a sequence takes a block when its last one is full and gives all back when
#   it ends. Nothing is reserved ahead: memory in use follows the tokens actually stored.
#
# `forward` takes `T` new tokens for each of `B` sequences, writes their keys and values into the slots the
# block tables give, gathers each sequence's keys and values back (padded to the longest, the padding masked
# out) and attends. `T > 1` with one sequence is a prefill (or a speculative verification); `T = 1` with many
# sequences is a batched decode step. It returns logits for every new token (or only the last).


# %% tags=["contract"]
class PagedKV:
    """A paged KV cache: one pool of fixed-size blocks for all sequences, a block table per sequence."""

    def __init__(self, config, num_blocks, block_size=16, device="cpu", dtype=torch.float32):
        shape = (config.num_hidden_layers, num_blocks * block_size, config.num_key_value_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # [layer, slot, kv head, dim]
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.block_size, self.num_blocks = block_size, num_blocks
        self.bytes_per_token = 2 * shape[0] * shape[2] * shape[3] * self.k.element_size()  # K and V, all layers
        self.free = list(range(num_blocks))  # the free list
        self.tables: dict[int, list[int]] = {}  # sequence id -> its blocks, in token order
        self.lengths: dict[int, int] = {}  # sequence id -> tokens stored

    def add(self, sid):
        self.tables[sid], self.lengths[sid] = [], 0

    def slots(self, sid, start, stop):
        """Pool slots of tokens start..stop-1 of sequence sid, through its block table."""
        pos = torch.arange(start, stop)
        table = torch.tensor(self.tables[sid], dtype=torch.long)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def grow(self, sid, n):
        """Make room for n more tokens (taking blocks from the free list); return their slots."""
        table, start = self.tables[sid], self.lengths[sid]
        while len(table) * self.block_size < start + n:
            if not self.free:
                raise cu.errors.CourseError("the KV pool is out of blocks: give PagedKV more num_blocks")
            table.append(self.free.pop())
        self.lengths[sid] = start + n
        return self.slots(sid, start, start + n)

    def truncate(self, sid, n):
        """Keep only the first n tokens (speculative decoding drops rejected ones); free the blocks beyond."""
        self.lengths[sid] = n
        keep = -(-n // self.block_size)
        self.free.extend(self.tables[sid][keep:])
        del self.tables[sid][keep:]

    def release(self, sid):
        self.free.extend(self.tables.pop(sid))
        del self.lengths[sid]

    def blocks_in_use(self):
        return self.num_blocks - len(self.free)


@torch.inference_mode()
def forward(model, kv, sids, tokens, last_only=False):
    """Logits for `tokens` (B, T): T new tokens for each sequence in `sids`, attending to its cached ones."""
    m, dev, d = model.model, kv.k.device, kv.k.shape[-1]
    B, T = tokens.shape
    starts = torch.tensor([kv.lengths[s] for s in sids])
    pos = (starts[:, None] + torch.arange(T)).to(dev)  # each sequence's own positions (no padding shift)
    write = torch.stack([kv.grow(s, T) for s in sids]).to(dev)  # (B, T) slots for the new keys/values
    L = max(kv.lengths[s] for s in sids)
    read = torch.zeros(B, L, dtype=torch.long)  # (B, L) slots of every cached token, padded with slot 0
    for b, s in enumerate(sids):
        read[b, : kv.lengths[s]] = kv.slots(s, 0, kv.lengths[s])
    read = read.to(dev)
    # key j is visible to the query at position p iff j <= p: causal, and the padding (j >= length) is hidden
    mask = (torch.arange(L, device=dev)[None, None, :] <= pos[:, :, None])[:, None]  # (B, 1, T, L)
    h = m.embed_tokens(tokens.to(dev))
    cos, sin = m.rotary_emb(h, pos)
    for i, layer in enumerate(m.layers):
        att = layer.self_attn
        x = layer.input_layernorm(h)
        q = att.q_proj(x).view(B, T, -1, d).transpose(1, 2)
        k = att.k_proj(x).view(B, T, -1, d).transpose(1, 2)
        v = att.v_proj(x).view(B, T, -1, d)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        kv.k[i, write] = k.transpose(1, 2)  # into the pool, through the block tables
        kv.v[i, write] = v
        keys, values = kv.k[i, read].transpose(1, 2), kv.v[i, read].transpose(1, 2)  # (B, kv heads, L, d)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        h = h + att.o_proj(o.transpose(1, 2).reshape(B, T, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(m.norm(h[:, -1:] if last_only else h))


# %% [markdown]
# Correct before fast: greedy decoding with this engine (prefill the prompt, then one token per step) must
# give exactly the tokens of the model's own greedy `generate`.


# %% tags=["contract"]
def greedy(model, kv, prompt, max_new, eos=None, sid=0):
    """Greedy decoding with the paged engine: a list of up to max_new token ids (stops after eos)."""
    kv.add(sid)
    out = [int(forward(model, kv, [sid], torch.tensor([prompt]), last_only=True)[0, -1].argmax())]
    while len(out) < max_new and out[-1] != eos:
        out.append(int(forward(model, kv, [sid], torch.tensor([[out[-1]]]))[0, -1].argmax()))
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
def prompt_ids(text):
    if tok is not None:
        return cu.llm.chat_ids(tok, text)[0].tolist()
    gen = torch.Generator().manual_seed(len(text))  # no tokenizer: token ids, one length per text
    return torch.randint(3, cfg.vocab_size, (len(text) // 4 + 8,), generator=gen).tolist()


def show(ids):
    return tok.decode(ids) if tok is not None else str(ids[:12])


CHECK_NEW = cu.pick(full=24, smoke=6)
p0 = prompt_ids("What is the capital of France? Answer in one sentence.")
kv = PagedKV(cfg, num_blocks=32, block_size=16)
t0 = time.perf_counter()
mine = greedy(model, kv, p0, CHECK_NEW, EOS)
t_mine = time.perf_counter() - t0
t0 = time.perf_counter()
ref0 = reference(model, p0, CHECK_NEW, EOS)
t_ref = time.perf_counter() - t0
assert mine == ref0, f"the paged engine's greedy tokens differ from generate: {mine} vs {ref0}"
print(f"Paged engine == generate, {len(mine)} tokens: {show(mine)!r}")
print(f"({len(mine) / t_mine:.1f} tokens/s with the paged engine, {len(ref0) / t_ref:.1f} with generate, batch 1)")

# %% [markdown]
# ## Requests, arrivals and two schedulers
# A request is a prompt, a cap on new tokens, and an arrival time. The workload mixes short and long
# answers (most requests want a few tokens, some want many) and prompts of different lengths, like a chat
# service. Requests arrive **open loop**: Poisson arrivals at a fixed rate, whatever the server is doing
# (lesson 13), so a slow server builds a queue and its users wait.
#
# The server loop below is the whole scheduler. At every step it (1) moves arrived requests into the waiting
# list, (2) **retires** finished sequences and frees their blocks, (3) **admits** waiting requests into free
# slots (prefilling each one: that makes its first token), (4) runs **one decode step** for every running
# sequence. It is a generator: it *streams* each token the moment it is made, with its time.
#
# The two policies differ in one line, step (3): **continuous** batching admits whenever a slot is free;
# **static** batching admits only when the whole batch has finished, so a batch lasts as long as its longest
# answer while the slots of finished ones stay empty. (Our static batch at least stops computing finished
# sequences: a fair baseline.)


# %% tags=["contract"]
@dataclass
class Request:
    rid: int
    prompt: list
    max_new: int
    arrival: float  # seconds after the start of the run
    out: list = field(default_factory=list)
    times: list = field(default_factory=list)  # when each token was made

    @property
    def done(self):
        return len(self.out) >= self.max_new or (len(self.out) > 0 and self.out[-1] == EOS)


def serve(model, kv, requests, *, policy, max_slots, trace=None, clock=None):
    """Serve `requests` (open loop, by arrival time); yield (request, token, time) as each token is made.

    `trace`: a list that gets one row per decode step; `clock`: a dict that sums the seconds spent in
    prefills and in decode steps."""
    assert policy in ("static", "continuous")
    pending = sorted(requests, key=lambda r: r.arrival)
    waiting, running, t0 = [], [], time.perf_counter()
    while pending or waiting or running:
        now = time.perf_counter() - t0
        while pending and pending[0].arrival <= now:  # 1. arrivals join the queue
            waiting.append(pending.pop(0))
        for r in [r for r in running if r.done]:  # 2. retire: finished sequences leave, blocks go back
            running.remove(r)
            kv.release(r.rid)
        if policy == "continuous" or not running:  # 3. admit (static: only once the whole batch is done)
            while waiting and len(running) < max_slots:
                r = waiting.pop(0)  # first come, first served
                kv.add(r.rid)
                t_pre = time.perf_counter()
                token = int(forward(model, kv, [r.rid], torch.tensor([r.prompt]), last_only=True)[0, -1].argmax())
                if clock is not None:
                    clock["prefill"] = clock.get("prefill", 0.0) + time.perf_counter() - t_pre
                r.out.append(token)
                yield r, token, time.perf_counter() - t0
                running.append(r)
        active = [r for r in running if not r.done]
        if not active:
            if pending and not waiting:
                time.sleep(max(0.0, min(0.05, pending[0].arrival - (time.perf_counter() - t0))))
            continue
        if trace is not None:  # what each decode step runs with, and the KV memory it holds
            stored = sum(kv.lengths[r.rid] for r in running)
            trace.append(
                {
                    "t": now,
                    "running": len(active),
                    "waiting": len(waiting),
                    "stored_tokens": stored,
                    "paged_blocks": kv.blocks_in_use(),
                    "sequences": len(running),
                }
            )
        # 4. one decode step for every running sequence: one new token each
        t_dec = time.perf_counter()
        logits = forward(model, kv, [r.rid for r in active], torch.tensor([[r.out[-1]] for r in active]))
        if clock is not None:
            clock["decode"] = clock.get("decode", 0.0) + time.perf_counter() - t_dec
        for r, row in zip(active, logits[:, -1], strict=True):
            token = int(row.argmax())
            r.out.append(token)
            yield r, token, time.perf_counter() - t0


# %% [markdown]
# Streaming, shown on three requests that arrive together: each line is a chunk of text the moment its token
# was made, as a server would send it (server-sent events in vLLM's HTTP API).

# %%
demo = [
    Request(i, prompt_ids(q), cu.pick(full=12, smoke=4), 0.0)
    for i, q in enumerate(["Name a fruit.", "What is 2 + 3?", "Say hello in French."])
]
kv = PagedKV(cfg, num_blocks=16, block_size=16)
for r, token, t in serve(model, kv, demo, policy="continuous", max_slots=3):
    print(f"[{t:6.2f} s] request {r.rid}: {show([token])!r}")
for r in demo:
    assert r.out == reference(model, r.prompt, r.max_new, EOS), f"request {r.rid} differs from generate"
print("All three streamed answers == generate.")

# %% [markdown]
# ### The load
# A pool of prompts of different lengths; each request picks one and a cap on new tokens (most short, a
# quarter long). The arrival rate is set from this machine's own speed: we time a decode step at batch 1 and
# at the full batch, and send requests at about what a full batch could serve, so the queue matters.

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
N_REQUESTS = cu.pick(full=32, smoke=6)
SHORT, LONG = cu.pick(full=(8, 48), smoke=(2, 6))
BLOCK = 16
pool = [prompt_ids(q) for q in QUESTIONS]
MAX_LEN = max(map(len, pool)) + LONG  # the longest any request can get: a contiguous cache reserves this
NUM_BLOCKS = MAX_SLOTS * -(-MAX_LEN // BLOCK) + 4  # room for a full batch of the longest requests


STEP_REPS = cu.pick(full=3, smoke=1)


def step_ms(batch, reps=STEP_REPS):
    kv = PagedKV(cfg, NUM_BLOCKS, BLOCK)
    for s in range(batch):
        kv.add(s)
        forward(model, kv, [s], torch.tensor([pool[s % len(pool)]]), last_only=True)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        forward(model, kv, list(range(batch)), torch.full((batch, 1), 5))
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


ms1, msB = step_ms(1), step_ms(MAX_SLOTS)
kv = PagedKV(cfg, NUM_BLOCKS, BLOCK)
kv.add(0)
t0 = time.perf_counter()
forward(model, kv, [0], torch.tensor([pool[len(pool) // 2]]), last_only=True)
prefill_ms = 1000 * (time.perf_counter() - t0)
mean_new = 0.75 * SHORT + 0.25 * LONG
RATE = MAX_SLOTS / (mean_new * msB / 1000)  # requests/s a full batch could serve, prefills not counted
rng = random.Random(16)
arrivals = np.cumsum([rng.expovariate(RATE) for _ in range(N_REQUESTS)])
work = [(rng.randrange(len(pool)), LONG if rng.random() < 0.25 else SHORT) for _ in range(N_REQUESTS)]
print(
    f"Decode step: {ms1:.0f} ms at batch 1, {msB:.0f} ms at batch {MAX_SLOTS} "
    f"({MAX_SLOTS * ms1 / msB:.1f}x the tokens per second, for {MAX_SLOTS}x the sequences)."
)
print(
    f"{N_REQUESTS} requests, Poisson arrivals at {RATE:.2f} requests/s, caps {SHORT} or {LONG} new tokens, "
    f"prompts of {min(map(len, pool))}-{max(map(len, pool))} tokens, {MAX_SLOTS} slots."
)

# %% [markdown]
# The expected answers first: greedy `generate` for every prompt in use, once, at the longest cap. A
# greedy answer with a smaller cap is a prefix of it, so each served request is compared with the first
# tokens of its prompt's answer.

# %%
expected = {p: reference(model, pool[p], LONG, EOS) for p in sorted({p for p, _ in work})}  # the prompts in use

# %% [markdown]
# ### Static and continuous batching under the same load
# Both runs get the same requests at the same (relative) times. The consumer of the stream records when each
# token arrived. Every served answer is then checked against `generate` before any figure is shown.


# %%
def run(policy):
    requests = [Request(i, pool[p], cap, float(a)) for i, ((p, cap), a) in enumerate(zip(work, arrivals, strict=True))]
    kv, trace, clock = PagedKV(cfg, NUM_BLOCKS, BLOCK), [], {}
    for r, _token, t in serve(model, kv, requests, policy=policy, max_slots=MAX_SLOTS, trace=trace, clock=clock):
        r.times.append(t)  # the client side of the stream: when each token arrived
    for r, (p, cap) in zip(requests, work, strict=True):
        want = expected[p][:cap]
        assert r.out == want, f"{policy}: request {r.rid} (prompt {p}) differs from generate: {r.out} vs {want}"
    return requests, pd.DataFrame(trace), clock


served = {policy: run(policy) for policy in ("static", "continuous")}
print(f"Every served answer of both runs == greedy generate ({N_REQUESTS} requests each).")


def metrics(requests):
    ttft = [1000 * (r.times[0] - r.arrival) for r in requests]
    itl = [1000 * d for r in requests for d in np.diff(r.times)]
    tokens = sum(len(r.out) for r in requests)
    span = max(r.times[-1] for r in requests) - min(r.arrival for r in requests)
    return {
        "tokens": tokens,
        "seconds": span,
        "tokens_per_s": tokens / span,
        "ttft_p50_ms": np.percentile(ttft, 50),
        "ttft_p99_ms": np.percentile(ttft, 99),
        "itl_p50_ms": np.percentile(itl, 50) if itl else float("nan"),
        "itl_p99_ms": np.percentile(itl, 99) if itl else float("nan"),
    }


table = pd.DataFrame({policy: metrics(reqs) for policy, (reqs, _, _) in served.items()}).T
display(table.round(2))
st, co = table.loc["static"], table.loc["continuous"]
speedup = co["tokens_per_s"] / st["tokens_per_s"]
print(
    f"Continuous vs static: {speedup:.2f}x the throughput, p99 TTFT {co['ttft_p99_ms']:.0f} vs "
    f"{st['ttft_p99_ms']:.0f} ms, p99 ITL {co['itl_p99_ms']:.0f} vs {st['itl_p99_ms']:.0f} ms."
)
print(
    f"Target (>= 1.5x throughput at equal or lower p99 TTFT): "
    f"{'met' if speedup >= 1.5 and co['ttft_p99_ms'] <= st['ttft_p99_ms'] else 'missed'}."
)
busy = {p: tr["running"].mean() for p, (_, tr, _) in served.items()}
steps = {p: len(tr) for p, (_, tr, _) in served.items()}
print(
    f"Decode steps: static {steps['static']} with {busy['static']:.1f} sequences on average, continuous "
    f"{steps['continuous']} with {busy['continuous']:.1f} (of {MAX_SLOTS} slots)."
)
clocks = {p: c for p, (_, _, c) in served.items()}
print(
    f"Where the time went: static {clocks['static']['prefill']:.2f} s of prefills + "
    f"{clocks['static']['decode']:.2f} s of decode steps, continuous {clocks['continuous']['prefill']:.2f} s + "
    f"{clocks['continuous']['decode']:.2f} s: the decode steps alone ran "
    f"{clocks['static']['decode'] / clocks['continuous']['decode']:.2f}x faster under continuous batching."
)
if speedup < 1.5:
    print(
        f"Why the gain is {speedup:.2f}x: fuller batches pay only as much as a bigger batch is cheaper per token "
        f"(here a step of {MAX_SLOTS} gives {MAX_SLOTS * ms1 / msB:.1f}x the tokens of a step of 1), and both "
        f"policies pay the same prefills, one prompt at a time ({prefill_ms:.0f} ms each), which no scheduling "
        "shortens: batching the prefills too (vLLM's chunked prefill) is the next step."
    )

# %% [markdown]
# Compare the ITL columns: under continuous batching each admission runs the newcomer's prefill *between* two
# decode steps of everyone else, so every running sequence waits for it (a static batch admits only at its
# start). vLLM's **chunked prefill** cuts prompts into pieces that ride along with decode steps, bounding
# that stall.

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
for i, (policy, (reqs, tr, _)) in enumerate(served.items()):
    axes[0].step(tr["t"], tr["running"], where="post", color=f"C{i}", label=f"{policy}: running")
    axes[0].plot(tr["t"], tr["waiting"], ls=":", color=f"C{i}", label=f"{policy}: waiting")
    ttft = np.sort([1000 * (r.times[0] - r.arrival) for r in reqs])
    axes[1].plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), color=f"C{i}", label=policy)
axes[0].axhline(MAX_SLOTS, color="gray", lw=0.8)
axes[0].set(xlabel="seconds since the first arrival", ylabel="sequences", title="slots in use and the queue")
axes[1].set(xscale="log", xlabel="time to first token (ms)", ylabel="share of requests", title="TTFT, CDF")
for ax in axes:
    ax.legend(fontsize=7)
fig.tight_layout()

# %% [markdown]
# ## Paged vs contiguous KV memory, at the same load
# The scheduler recorded, at every step, the tokens stored and the blocks in use. A **contiguous** cache
# gives each running sequence one array reserved up front for the longest it may get (`MAX_LEN` tokens: the
# longest prompt plus the longest cap), because it cannot grow in place. A paged cache holds
# `ceil(tokens / block_size)` blocks per sequence: its only waste is the unused tail of each last block
# (*internal fragmentation*, under one block per sequence). The contiguous cache wastes what it reserved
# and never filled, and cannot lend it to another request: that fragmentation is what limits its batch.

# %%
tr = served["continuous"][1]
per_token = PagedKV(cfg, 1, BLOCK).bytes_per_token
mem = (
    pd.DataFrame(
        {
            "stored (tokens x bytes)": tr["stored_tokens"] * per_token,
            "paged (blocks in use)": tr["paged_blocks"] * BLOCK * per_token,
            "contiguous (MAX_LEN per sequence)": tr["sequences"] * MAX_LEN * per_token,
        }
    )
    / 2**20
)
summary = mem[tr["sequences"] > 0].agg(["mean", "max"]).T.rename(columns={"mean": "mean_MiB", "max": "peak_MiB"})
display(summary.round(2))
stored_mib, contiguous_mib = summary["mean_MiB"].iloc[0], summary["mean_MiB"].iloc[2]
paged_mib = summary["mean_MiB"].iloc[1]
kv_ratio, frag, waste = contiguous_mib / paged_mib, 1 - stored_mib / paged_mib, 1 - stored_mib / contiguous_mib
print(
    f"KV bytes per token: {per_token / 1024:.1f} KiB ({cfg.num_hidden_layers} layers x 2 x "
    f"{cfg.num_key_value_heads} KV heads x {cfg.head_dim} x 4 bytes)."
)
print(
    f"Contiguous-max needs {kv_ratio:.1f}x the KV memory of the paged cache at this load (target >= 2x: "
    f"{'met' if kv_ratio >= 2 else 'missed'}); {100 * frag:.0f}% of the paged blocks are unused slots of last "
    f"blocks, {100 * waste:.0f}% of the contiguous reservation is never filled."
)
prompt_share = np.mean([len(pool[i]) for i, _ in work]) / MAX_LEN
at_2048 = (tr["sequences"] * 2048 * per_token / 2**20)[tr["sequences"] > 0].mean() / paged_mib
print(
    f"A prompt fills on average {100 * prompt_share:.0f}% of MAX_LEN here: the contiguous cache wastes only the "
    f"answer room it reserved. A server reserving a max_model_len of 2048 tokens would need {at_2048:.0f}x the "
    f"paged cache's memory at this load."
)
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(tr["t"], mem.iloc[:, 2], label="contiguous (MAX_LEN)")
ax.plot(tr["t"], mem.iloc[:, 1], label="paged (blocks)")
ax.plot(tr["t"], mem.iloc[:, 0], ls=":", label="tokens stored")
ax.set(xlabel="seconds", ylabel="KV memory (MiB)", title="KV memory in use, continuous batching")
ax.legend(fontsize=8)
fig.tight_layout()

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
    out = [int(forward(model, kv, [sid], torch.tensor([prompt]), last_only=True)[0, -1].argmax())]
    steps = []
    while len(out) < max_new and out[-1] != eos:
        draft = lookup_draft(prompt + out, k)[: max_new - len(out) - 1] if k else []
        logits = forward(model, kv, [sid], torch.tensor([[out[-1]] + draft]))  # verify: ONE pass, k+1 tokens
        target = logits[0].argmax(-1).tolist()  # the model's greedy choice after each prefix
        n = 0
        while n < len(draft) and draft[n] == target[n]:
            n += 1  # the longest matching prefix
        kv.truncate(sid, kv.lengths[sid] - (len(draft) - n))  # forget the rejected draft tokens
        new = draft[:n] + [target[n]]  # accepted + the model's own next token
        out += new[: new.index(eos) + 1] if eos in new else new
        steps.append((len(draft), n))
    kv.release(sid)
    return out[:max_new], steps


# %%
PASSAGE = (
    "The old lighthouse stood on the rocky cliff above the harbor. Every night its keeper climbed the "
    "ninety steps to light the lamp, and every morning he wrote the weather in a small blue notebook."
)
CASES = {
    "copy (draft fits)": prompt_ids(f"Copy this text exactly, word for word:\n\n{PASSAGE}"),
    "story (draft misses)": prompt_ids("Tell me a short story about a dragon."),
}
SPEC_NEW = cu.pick(full=48, smoke=8)
KS = cu.pick(full=[1, 2, 4, 8], smoke=[3])
spec_rows = []
for case, prompt in CASES.items():
    want = reference(model, prompt, SPEC_NEW, EOS)
    for k in [0, *KS]:  # k = 0: plain decoding with the same engine, the baseline
        kv = PagedKV(cfg, -(-(len(prompt) + SPEC_NEW + max(KS)) // BLOCK) + 1, BLOCK)
        t0 = time.perf_counter()
        got, steps = speculative(model, kv, prompt, SPEC_NEW, k, EOS)
        seconds = time.perf_counter() - t0
        assert got == want, f"{case}, k={k}: speculative output differs from greedy generate"
        drafted, accepted = sum(s[0] for s in steps), sum(s[1] for s in steps)
        reached = sum(min(n + 1, d) for d, n in steps)  # draft positions examined (all before them accepted)
        spec_rows.append(
            {
                "case": case,
                "k": k,
                "tokens": len(got),
                "tokens_per_s": len(got) / seconds,
                "verify_passes": len(steps),
                "tokens_per_pass": (len(got) - 1) / max(len(steps), 1),
                "drafted": drafted,
                "accepted": accepted,
                "acceptance": accepted / reached if reached else float("nan"),
                "steps_with_draft_%": 100 * sum(d > 0 for d, _ in steps) / max(len(steps), 1),
            }
        )
spec = pd.DataFrame(spec_rows)
base = spec[spec["k"] == 0].set_index("case")["tokens_per_s"]
spec["speedup"] = spec["tokens_per_s"] / spec["case"].map(base)
a = spec["acceptance"].clip(upper=0.999)
spec["formula_tokens_per_pass"] = np.where(spec["k"] > 0, (1 - a ** (spec["k"] + 1)) / (1 - a), 1.0)
print(f"Every run == greedy generate ({SPEC_NEW} new tokens, both prompts, k = 0 and {KS}).")
spec.round(2)

# %% [markdown]
# Read the table: `acceptance` is the share of examined draft tokens the model accepted; the formula's
# tokens per pass uses it (a draft position counts as examined only if every earlier one was accepted).
# The formula assumes every pass has a full draft of k tokens; prompt lookup sometimes finds nothing
# (`steps_with_draft_%` below 100), and those passes make one token.

# %%
win = spec[spec["case"] == "copy (draft fits)"].iloc[1:]
lose = spec[spec["case"] == "story (draft misses)"].iloc[1:]
best = win.loc[win["speedup"].idxmax()]
worst = lose.loc[lose["speedup"].idxmin()]
print(
    f"Draft fits: best k={int(best['k'])}, {best['speedup']:.2f}x tokens/s, acceptance {best['acceptance']:.2f}, "
    f"{best['tokens_per_pass']:.1f} tokens per verify pass (target >= 1.3x: "
    f"{'met' if best['speedup'] >= 1.3 else 'missed'})."
)
print(
    f"Draft misses: at k={int(worst['k'])} {worst['speedup']:.2f}x (acceptance {worst['acceptance']:.2f}): a pass "
    f"pays for up to {int(worst['k']) + 1} positions, keeps {worst['tokens_per_pass']:.1f} tokens."
)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
for i, (case, g) in enumerate(spec[spec["k"] > 0].groupby("case", sort=False)):
    ax1.plot(g["k"], g["tokens_per_pass"], marker="o", color=f"C{i}", label=f"{case}: measured")
    ax1.plot(g["k"], g["formula_tokens_per_pass"], ls="--", color=f"C{i}", label=f"{case}: formula")
    ax2.plot(g["k"], g["speedup"], marker="o", color=f"C{i}", label=case)
ax2.axhline(1, color="gray", lw=0.8)
ax1.set(xlabel="draft length k", ylabel="tokens per verify pass", title="accepted tokens vs the formula")
ax2.set(xlabel="draft length k", ylabel="tokens/s vs plain decoding", title="speed-up")
for ax in (ax1, ax2):
    ax.legend(fontsize=7)
fig.tight_layout()

# %% [markdown]
# ## On a GPU: the same scheduler with more slots
# On a GPU a decode step for 32 sequences costs little more than a step for one, so keeping the batch
# full matters more.
# The same `serve` runs on CUDA (the model file cannot travel to every GPU machine: without it the section
# uses `cu.llm.tiny_llama()`, SmolLM2's shape with random weights, and says so), every answer checked against
# that model's own greedy `generate` first.

# %%
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
    g_rows = {}
    for policy in ("static", "continuous"):
        g_rng = random.Random(1)
        g_reqs = [
            Request(i, pool[i % len(pool)], g_cap if g_rng.random() < 0.25 else max(1, g_cap // 8), 0.0)
            for i in range(g_n)
        ]
        g_kv = PagedKV(gmodel.config, g_slots * -(-g_len // BLOCK) + 4, BLOCK, device="cuda")
        for r, _token, t in serve(gmodel, g_kv, g_reqs, policy=policy, max_slots=g_slots):
            r.times.append(t)
        torch.cuda.synchronize()
        for r in g_reqs:
            assert r.out == g_expected[r.rid % len(pool)][: r.max_new], f"GPU {policy}: request {r.rid} differs"
        g_rows[policy] = metrics(g_reqs)
    g_table = pd.DataFrame(g_rows).T
    display(g_table.round(2))
    for policy, r in g_table.iterrows():
        cu.record(
            "16",
            f"{policy} batching (GPU)",
            model=gname,
            device="cuda",
            dtype="fp32",
            batch_size=g_slots,
            throughput=r["tokens_per_s"],
            median_ms=r["itl_p50_ms"],
            speedup_vs_baseline=r["tokens_per_s"] / g_table.loc["static", "tokens_per_s"],
            notes=f"{g_n} requests at once, p99 TTFT {r['ttft_p99_ms']:.0f} ms",
        )
else:
    cu.results.show_reference("16", "GPU")

# %% [markdown]
# ## At scale: vLLM
# vLLM is this lesson's engine grown up: continuous batching, a paged KV cache (PagedAttention), CUDA graphs
# and fused kernels. Two features go further than our scheduler: **prefix caching**
# (`--enable-prefix-caching`: blocks of a shared prompt prefix, such as a system prompt, are hashed and
# reused instead of recomputed) and **chunked prefill** (`--enable-chunked-prefill`: long prompts are split
# so decode steps are not stalled, the ITL spike we measured). `vllm bench serve` is its open-loop load
# generator (`--request-rate` Poisson arrivals) and reports TTFT, TPOT and ITL percentiles.
#
# The command lines below were checked against vLLM 0.33.0's own argument parsers (built from its wheel;
# `tests/gpu_contract/test_l16_vllm_flags.py` holds the flags it accepts and checks every flag used here).
# The section runs only where vLLM is installed and a GPU exists; vLLM does not install on CPU machines.


# %% tags=["contract"]
def vllm_commands(model_dir, port, *, prefix_caching, num_prompts, rate, result_dir):
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
        "--gpu-memory-utilization",
        "0.5",
        "--enable-chunked-prefill",
        "--enable-prefix-caching" if prefix_caching else "--disable-prefix-caching",
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
    f"{MAX_SLOTS * ms1 / msB:.1f}x the tokens for the same weight reads."
)
print(
    f"* Continuous batching: {speedup:.2f}x static's throughput, p99 TTFT {co['ttft_p99_ms']:.0f} ms vs "
    f"{st['ttft_p99_ms']:.0f} ms, p99 ITL {co['itl_p99_ms']:.0f} ms vs {st['itl_p99_ms']:.0f} ms"
    + (" (newcomers' prefills stall the batch)." if co["itl_p99_ms"] > st["itl_p99_ms"] else ".")
)
print(
    f"* Reserving {MAX_LEN} tokens per sequence took {kv_ratio:.1f}x the KV memory of 16-token blocks; the "
    f"blocks' own waste was {100 * frag:.0f}%."
)
print(
    f"* Prompt lookup made the copying answer {best['speedup']:.2f}x faster at k={int(best['k'])}, the story "
    f"{worst['speedup']:.2f}x at k={int(worst['k'])}: same code, identical output, "
    f"{'opposite results' if worst['speedup'] < 1 else 'no gain where the draft misses'}."
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
#    token after it. The check decodes with your function and random drafts (always right, always wrong,
#    partly right), demands output identical to greedy decoding and counts the calls of `target`.


# %%
def verify(target, context, draft):
    raise NotImplementedError  # your code here


cu.exercises.check("16.verify", verify)

# %% [markdown]
# ## Summary
# Rows for this machine's results: both schedulers under the same load, the paged cache, the best speculative
# setting where the draft fits and the losing one.

# %%
for policy, r in table.iterrows():
    cu.record(
        "16",
        f"{policy} batching",
        model=MODEL_NAME,
        device="cpu",
        dtype="fp32",
        batch_size=MAX_SLOTS,
        median_ms=r["itl_p50_ms"],
        throughput=r["tokens_per_s"],
        speedup_vs_baseline=r["tokens_per_s"] / st["tokens_per_s"],
        notes=f"{N_REQUESTS} Poisson requests at {RATE:.2f}/s, p99 TTFT {r['ttft_p99_ms']:.0f} ms, "
        f"p99 ITL {r['itl_p99_ms']:.0f} ms",
    )
cu.record(
    "16",
    "paged KV cache vs contiguous-max",
    model=MODEL_NAME,
    device="cpu",
    dtype="fp32",
    speedup_vs_baseline=kv_ratio,
    notes=f"KV memory ratio (mean), block {BLOCK}, MAX_LEN {MAX_LEN}, {100 * frag:.0f}% of block slots unused",
)
for label, r in (("draft fits", best), ("draft misses", worst)):
    cu.record(
        "16",
        f"speculative decoding, prompt lookup, {label}",
        model=MODEL_NAME,
        device="cpu",
        dtype="fp32",
        batch_size=1,
        throughput=r["tokens_per_s"],
        speedup_vs_baseline=r["speedup"],
        notes=f"k={int(r['k'])}, acceptance {r['acceptance']:.2f}, identical to greedy",
    )
print("Recorded. This is the last lesson: compare your machine's rows with `cu.leaderboard`.")
