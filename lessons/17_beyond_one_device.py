# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 17 · Beyond one device
#
# **Goals.** When a model or its traffic outgrows one GPU, servers split the work across devices. Write the
# three splits yourself on `torch.distributed`, with real processes on this machine, check each against the
# single-process model, and measure what it costs:
# * **tensor parallelism** (Megatron-style): column- and row-parallel linear layers, the attention heads and the
#   MLP split across ranks, one all-reduce per block; greedy output token-identical at 1, 2 and 3 ranks;
# * **what it costs**: all-reduce time against message size, compute against communication in a decode step, a
#   model of the step time (messages x latency + bytes / bandwidth) fitted here and checked against the
#   measured step time, then the same model for NVLink and PCIe with their datasheet numbers;
# * **pipeline parallelism**: layers split across ranks, micro-batches, the bubble measured against
#   `(p - 1) / (m + p - 1)`;
# * **data-parallel replicas** behind one router, round-robin against least-outstanding-requests, under the
#   course's load generator;
# * **across nodes**: two `torchrun` agents on this machine as two nodes, what each rank is told, every socket of
#   the launch checked while it runs, one node failing; and how `vllm serve --nnodes / --node-rank / --headless`
#   maps to it;
# * and the engines that do this at scale: `vllm serve --tensor-parallel-size / --pipeline-parallel-size /
#   --data-parallel-size`, a Ray Serve LLM deployment and Triton's vLLM backend, with a decision table.
#
# **The bottleneck it attacks** (*01 · Measuring inference*, the taxonomy; *15 · LLM decoding*): a decode step is
# memory-bound: it reads every weight once per token. Split the weights over `p` devices and each reads `1/p`
# of them, in parallel: more memory bandwidth, and room for a model that fits no single device. The price is
# **communication**: the partial results must be combined, twice per layer, on every step. Whether the split
# pays depends on the link between the devices; this lesson measures it.

# %%
import atexit
import contextlib
import datetime
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import psutil
import torch
import torch.distributed as dist
from IPython.display import display

import course_utils as cu
from course_utils.measuring.intervals import median_interval, ratio_from_rounds
from course_utils.serve import load_generator, server_process

device = cu.lesson.start("17", "Beyond one device")
WORK = Path(tempfile.mkdtemp(prefix="lesson17_"))  # weights for the ranks, server files: not in the course
atexit.register(shutil.rmtree, WORK, ignore_errors=True)  # removed when the kernel (or script) exits
CORES = len(os.sched_getaffinity(0))
print(
    f"This machine: {CORES} CPU cores for this process; torch {torch.__version__}, gloo available: "
    f"{dist.is_gloo_available()}, NCCL available: {dist.is_nccl_available()}"
)

# %% [markdown]
# ## The model, and why its heads decide the split
# Tensor parallelism gives each rank a whole number of attention heads. SmolLM2-135M has **9 query heads and 3
# key/value heads** (grouped-query attention: 3 query heads share one K/V head): it splits over 3 ranks (3
# query heads and 1 K/V head each) or 9, **not over 2**. vLLM applies the same rule to the query heads: they
# must divide by `--tensor-parallel-size`. For the K/V heads it is kinder: past their number each K/V head is
# **copied** to `p / kv_heads` ranks (9 ranks: 1 query head each, each K/V head on 3 ranks). That copy has a
# price measured below: the KV cache per rank stops shrinking.
#
# So the measurements use a **random-weight model of the same family with divisible heads**: SmolLM2's exact
# shape (30 layers, hidden 576, MLP 1536, vocabulary 49152, the same weight matrices, 134.5M parameters) with
# its 576 attention dimensions cut into **18 query heads and 6 K/V heads of 32** instead of 9 and 3 of 64. Every
# matrix has the same size, so the time per step is SmolLM2's; 18 and 6 divide by 1, 2 and 3. The real SmolLM2
# runs split over 3 ranks as well, and its answer is shown as text. Speed does not depend on the weights; each
# run is checked against that model's own `generate`.

# %%
LAYERS = cu.pick(full=30, smoke=2)  # SmolLM2 has 30; smoke runs use 2 so the tests stay fast
tp_model = cu.llm.tiny_llama(
    seed=17, num_attention_heads=18, num_key_value_heads=6, head_dim=32, num_hidden_layers=LAYERS
)
cfg = tp_model.config
n_params = sum(p.numel() for p in tp_model.parameters())
print(
    f"Split model: {n_params / 1e6:.1f}M parameters, {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} "
    f"query heads and {cfg.num_key_value_heads} K/V heads of {cfg.head_dim}"
)
REAL = cu.llm.has_smollm2()
if REAL:
    real_model, tok = cu.llm.load_smollm2()
    print(
        f"SmolLM2-135M-Instruct: {real_model.config.num_attention_heads} query heads, "
        f"{real_model.config.num_key_value_heads} K/V heads: it splits over 3 ranks"
    )
else:
    real_model, tok = None, None
    print("The SmolLM2 file is not installed here (make setup installs it): the real-model run is left out.")

# %% [markdown]
# ## Ranks: processes that talk through `torch.distributed`
# Each **rank** is its own process with its own copy of Python and torch. `torch.distributed` joins them into a
# **process group**: `init_process_group(backend, init_method, rank, world_size)`. On a CPU the backend is
# **gloo** (TCP between processes); on NVIDIA GPUs it is **NCCL** (NVLink or PCIe between GPUs). Then a
# collective such as `dist.all_reduce(t)` replaces `t`, on every rank, by the sum of all ranks' `t`.
#
# Two details matter on a shared machine. The rendezvous (how the ranks find each other) is often given as
# `init_method="tcp://127.0.0.1:PORT"`; torch's TCP store then binds its port itself, **on every network
# interface** (`::`), whatever address you name, until it closes. The fix vLLM uses (`create_tcp_store` in
# vllm/distributed/utils.py) is to bind the socket yourself, on 127.0.0.1, and hand it to the store
# (`master_listen_fd`); the next cell does that and lists what listens. The ranks below rendezvous through a
# file instead, and `GLOO_SOCKET_IFNAME=lo` keeps gloo's own sockets on the loopback interface.


# %% tags=["contract"]
import datetime  # noqa: E402, F811 - the contract cell carries its own imports
import socket  # noqa: E402, F811

import psutil  # noqa: E402, F811
import torch.distributed as dist  # noqa: E402, F811


def listening(pid):
    """The TCP addresses process `pid` listens on."""
    return sorted(
        f"{c.laddr.ip}:{c.laddr.port}"
        for c in psutil.Process(pid).net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    )


def loopback_store(timeout_s=5.0):
    """A TCPStore (the rendezvous server) that listens on 127.0.0.1 only: we bind the socket, the store takes it
    over (`master_listen_fd`; detached, so Python no longer closes it) and closes it with the store. Returns
    (store, port)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    timeout = datetime.timedelta(seconds=timeout_s)
    return dist.TCPStore(
        "127.0.0.1", port, 1, is_master=True, timeout=timeout, master_listen_fd=listener.detach()
    ), port


# %%
store, free_port = loopback_store()
store.set("hello", "ranks")
store_addrs = [a for a in listening(os.getpid()) if a.endswith(f":{free_port}")]
print(f"TCPStore on our socket answers {store.get('hello')!r} and listens on: {store_addrs}")
assert store_addrs == [f"127.0.0.1:{free_port}"], f"the store listens beyond loopback: {store_addrs}"
del store
print(f"after closing it: {[a for a in listening(os.getpid()) if a.endswith(f':{free_port}')] or 'nothing'}")

# %% [markdown]
# The ranks are started with `torch.multiprocessing` (`spawn`: a fresh interpreter per rank; `torchrun` does
# the same from a shell). A rank joins the group, makes the sub-groups of the first 1, 2 and 3 ranks (so one set
# of processes can run every world size, interleaved), and then runs the tasks the notebook sends it, until it
# is told to stop. `World` is the notebook's side: it starts the ranks, sends tasks, collects answers, and
# stops **every** process when its `with` block ends, also after an error, a rank that died, or an interrupt
# (a test kills a rank mid-step and checks that no process and no listening port is left). A rank also exits
# by itself if the notebook's process disappears, from its first moment: its target is `run_watched`, from a light
# module that watches the notebook's process before the rank imports torch (minutes on a busy machine).
#
# A process started with `spawn` imports the code it runs: a function defined in a notebook cell cannot be found
# there. The cells tagged `export` below are also the module `course_utils.from_lessons.l17_beyond_one_device`
# (`make notebooks` writes it, the tests check that it is the same text), and the ranks import that.


# %% tags=["export"]
import contextlib  # noqa: E402, F811 - this cell is also the top of the exported module
import datetime  # noqa: E402, F811 - this cell is also the top of the exported module that the rank processes import
import importlib  # noqa: E402
import os  # noqa: E402, F811
import queue  # noqa: E402
import shutil  # noqa: E402, F811
import tempfile  # noqa: E402, F811
import threading  # noqa: E402, F811
import time  # noqa: E402, F811
import traceback  # noqa: E402

import torch  # noqa: E402, F811
import torch.distributed as dist  # noqa: E402, F811
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from course_utils.supply.children import run_watched  # noqa: E402 - a light module: the ranks' first import

STATE = {}  # inside a rank process: its rank, the process groups, the weights it holds


class RankError(RuntimeError):
    """A rank failed or died; the world was stopped."""


def rank_main(rank, world_size, init_method, backend, inbox, outbox, timeout_s=120.0):
    """One rank process: join the process group, then run the tasks the parent sends until told to stop."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's sockets on the loopback interface only
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)  # one core per rank
    if backend == "nccl":
        torch.cuda.set_device(rank)  # one GPU per rank
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        groups = {p: dist.new_group(list(range(p))) for p in range(1, world_size + 1)}  # every rank makes each
        STATE.update(
            rank=rank,
            world_size=world_size,
            groups=groups,
            backend=backend,
            device=torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu"),
        )
        outbox.put((rank, 0, "ok", os.getpid()))
        while (task := inbox.get()) is not None:
            seq, module, name, kwargs = task
            try:
                result = getattr(importlib.import_module(module), name)(**kwargs)
                outbox.put((rank, seq, "ok", result))
            except Exception:  # noqa: BLE001 - reported to the parent
                outbox.put((rank, seq, "error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _ranks_skip_main():
    """While starting ranks: `spawn` would re-run a plain script's top level (the whole lesson) in every rank;
    a rank needs only this module, so the script's name is hidden from it (a notebook has none)."""
    import sys

    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


class World:
    """`size` rank processes joined in one process group; `run(task, ...)` runs a module-level function on them.

    Use it as `with World(3) as world:`: on leaving the block, also by an error, every rank is stopped."""

    def __init__(self, size, backend="gloo", timeout_s=300.0):
        self.size, self.backend, self.timeout_s, self.procs, self.seq = size, backend, timeout_s, [], 0

    def __enter__(self):
        ctx = mp.get_context("spawn")
        self.folder = tempfile.mkdtemp(prefix="lesson17_world_")
        init_method = f"file://{self.folder}/rendezvous"  # no TCP store: nothing listens beyond loopback
        self.inboxes, self.outbox = [ctx.Queue() for _ in range(self.size)], ctx.Queue()
        try:
            with _ranks_skip_main():
                for r in range(self.size):
                    args = (r, self.size, init_method, self.backend, self.inboxes[r], self.outbox, self.timeout_s)
                    # The target leaves when this process is gone, from its first moment: before this module (and
                    # torch) is even imported there, which takes minutes on a busy machine.
                    watched = (os.getpid(), rank_main.__module__, "rank_main", *args)
                    rank = ctx.Process(target=run_watched, args=watched, name=f"rank {r}", daemon=True)
                    self.procs.append(rank)
                    rank.start()
            self.pids = self._collect(range(self.size))  # every rank joined the group
        except BaseException:
            self.close(graceful=False)
            raise
        return self

    def run(self, task, ranks=None, **kwargs):
        """Run `task(**kwargs)` on `ranks` (default: all); return their results in rank order."""
        ranks = list(range(self.size)) if ranks is None else list(ranks)
        self.seq += 1  # answers to an earlier task (after one rank's error, the others') are skipped
        for r in ranks:
            self.inboxes[r].put((self.seq, task.__module__, task.__name__, kwargs))
        return self._collect(ranks)

    def _collect(self, ranks):
        got, deadline = {}, time.monotonic() + self.timeout_s
        while len(got) < len(ranks):
            try:
                rank, seq, status, value = self.outbox.get(timeout=0.2)
            except queue.Empty:
                dead = [f"{p.name} (exit code {p.exitcode})" for p in self.procs if not p.is_alive()]
                if dead:
                    raise RankError(f"{', '.join(dead)} stopped: the other ranks are stopped too") from None
                if time.monotonic() > deadline:
                    missing = sorted(set(ranks) - set(got))
                    raise RankError(f"no answer from ranks {missing} in {self.timeout_s:.0f} s") from None
                continue
            if seq != self.seq:
                continue
            if status == "error":
                raise RankError(f"rank {rank} failed:\n{value}")
            got[rank] = value
        return [got[r] for r in ranks]

    def close(self, graceful=True):
        """Stop every rank: ask them to leave (graceful), then SIGTERM, then SIGKILL; remove the rendezvous."""
        if graceful:
            for inbox, p in zip(self.inboxes, self.procs, strict=False):
                if p.is_alive():
                    inbox.put(None)
            end = time.monotonic() + 10
            for p in self.procs:
                p.join(timeout=max(0.0, end - time.monotonic()))
        for p in self.procs:
            if p.pid is not None and p.is_alive():
                p.terminate()
        for p in self.procs:
            if p.pid is None:  # never started
                continue
            p.join(timeout=3)
            if p.is_alive():
                p.kill()
                p.join()
        for q in [*self.inboxes, self.outbox]:  # tasks a dead rank never read must not hold up our exit
            q.cancel_join_thread()
            q.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __exit__(self, kind, error, tb):
        self.close(graceful=kind is None)


# %% [markdown]
# ## Column- and row-parallel layers
# A linear layer computes `y = x W^T` with `W` of shape `(out_features, in_features)` (torch's layout). Megatron-LM
# names the two ways to split it after the matrix `A = W^T` of `y = x A`:
# * **column-parallel**: split `A`'s columns, i.e. the **output features** (rows of torch's `W`). Every rank
#   needs the whole input `x` and makes its own slice of `y`. No communication.
# * **row-parallel**: split `A`'s rows, i.e. the **input features** (columns of torch's `W`). Every rank holds
#   only its slice of `x` and makes a *partial sum* of the whole `y`; one `all_reduce` adds the partial sums.
#
# Put a column-parallel layer first and a row-parallel one after it, and the slice the first makes is exactly the
# slice the second needs: the pair costs **one** all-reduce. A transformer layer has two such pairs:
# * attention: `q_proj`, `k_proj`, `v_proj` column-parallel (each rank gets whole heads: 18/p query heads and
#   6/p K/V heads, its own KV cache), the attention itself per head, `o_proj` row-parallel -> all-reduce;
# * MLP: `gate_proj` and `up_proj` column-parallel (1536/p intermediate features each), `down_proj`
#   row-parallel -> all-reduce.
#
# Norms and the embedding are small and kept whole on every rank. The output layer (`lm_head`, 49152 x 576, a
# fifth of the weights) is split column-parallel over the vocabulary; greedy decoding then needs only each rank's
# best token and its score (an `all_gather` of two numbers).


# %% tags=["export"]
def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def even_share(n, p, what, into="ranks"):
    """`n // p`, or a ValueError naming the sizes and the fix when `n` does not divide by `p` (no silent remainder)."""
    if n % p:
        raise ValueError(
            f"{n} {what} do not divide by {p} {into} ({n} = {p} x {n // p} + {n % p}): the last {n % p} would be "
            f"dropped. Use a number of {into} that divides {n} ({divisors(n)})"
        )
    return n // p


def column_parallel(weight, rank, p, what="output features"):
    """This rank's slice of a column-parallel layer: its block of output features (rows of torch's weight)."""
    n = even_share(weight.shape[0], p, what)
    return weight[rank * n : (rank + 1) * n].clone()


def row_parallel(weight, rank, p, what="input features"):
    """This rank's slice of a row-parallel layer: its block of input features (columns of torch's weight)."""
    n = even_share(weight.shape[1], p, what)
    return weight[:, rank * n : (rank + 1) * n].contiguous()


def uneven_block(n, rank, p):
    """(start, stop) of this rank's block of n rows when n need not divide by p: ceil(n / p) each, the last
    rank the rest. (Megatron and vLLM pad the vocabulary to a multiple of p instead: the same idea.)"""
    per = -(-n // p)
    return min(rank * per, n), min((rank + 1) * per, n)


def head_split(heads, kv_heads, p):
    """vLLM's rule (`QKVParallelLinear.__init__`, vllm/model_executor/layers/linear.py): the query heads divide by
    p; the K/V heads divide by p too, or, when p reaches their number, each K/V head is *replicated* on
    p / kv_heads ranks (p a multiple of kv_heads). Returns query heads, K/V heads per rank and the replicas."""
    works = [s for s in divisors(heads) if kv_heads % s == 0 or s % kv_heads == 0]
    fix = f"tensor-parallel sizes that work for {heads} query and {kv_heads} K/V heads: {works}"
    if heads % p:
        raise ValueError(f"{heads} query heads do not divide by {p} ranks (each rank holds whole heads); {fix}")
    if p >= kv_heads:
        if p % kv_heads:
            raise ValueError(
                f"{p} ranks is not a multiple of {kv_heads} K/V heads: past the K/V head count each K/V head is "
                f"copied to p / kv_heads ranks, a whole number; {fix}"
            )
        return {"q": heads // p, "kv": 1, "replicas": p // kv_heads}
    if kv_heads % p:
        raise ValueError(f"{kv_heads} K/V heads do not divide by {p} ranks; {fix}")
    return {"q": heads // p, "kv": kv_heads // p, "replicas": 1}


def stage_layers(layers, p):
    """(start, stop) of each pipeline stage's block of layers. Uneven counts as vLLM's `get_pp_indices`
    (vllm/distributed/utils.py): the extra layers go to the stages before the last (it has the output layer)."""
    if layers < p:
        raise ValueError(
            f"{layers} layers cannot fill {p} pipeline stages: a stage would hold no layer. Use at most {layers} "
            f"stages, or a model with at least {p} layers"
        )
    sizes = [layers // p] * p
    for i in range(2, layers % p + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(p)]
    return [(s, s + n) for s, n in zip(starts, sizes, strict=True)]


def shape_of(config):
    """What the ranks need to know of a Llama config (plain numbers: no transformers import in the ranks)."""
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta}
    return {
        "layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "intermediate": config.intermediate_size,
        "vocab": config.vocab_size,
        "heads": config.num_attention_heads,
        "kv_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "eps": config.rms_norm_eps,
        "theta": rope["rope_theta"],
    }


def load_shards(path, shape, sizes, name, whole_on_every_rank=False):
    """Read the full weights (memory-mapped) and keep this rank's slices for every split size in `sizes`.

    `whole_on_every_rank=True` keeps whole layers on every rank (the pipeline's stages pick their blocks).
    Returns the bytes this rank holds for each size."""
    full = torch.load(path, mmap=True, weights_only=True)  # a checkpoint: weights only, no pickled code
    rank, dev, d = STATE["rank"], STATE["device"], shape["head_dim"]
    kept = STATE.setdefault("models", {}).setdefault(name, {})
    for p in sizes:
        if rank >= p and not whole_on_every_rank:
            continue
        r = 0 if whole_on_every_rank else rank
        heads = head_split(shape["heads"], shape["kv_heads"], p)  # refuses a split vLLM would refuse
        kv_r = r // heads["replicas"]  # the K/V head(s) this rank's query heads attend to
        layers = []
        for i in range(shape["layers"]):
            w = {k.split(f"layers.{i}.")[1]: v for k, v in full.items() if f".layers.{i}." in k}
            q, kv = heads["q"] * d, heads["kv"] * d  # rows of q_proj, of k_proj and v_proj, per rank
            layers.append(
                {
                    "ln1": w["input_layernorm.weight"].clone(),
                    "ln2": w["post_attention_layernorm.weight"].clone(),
                    "q": w["self_attn.q_proj.weight"][r * q : (r + 1) * q].clone(),  # whole query heads
                    "k": w["self_attn.k_proj.weight"][kv_r * kv : (kv_r + 1) * kv].clone(),  # their K/V heads
                    "v": w["self_attn.v_proj.weight"][kv_r * kv : (kv_r + 1) * kv].clone(),
                    "o": row_parallel(w["self_attn.o_proj.weight"], r, p, "attention features"),
                    "gate": column_parallel(w["mlp.gate_proj.weight"], r, p, "MLP features"),
                    "up": column_parallel(w["mlp.up_proj.weight"], r, p, "MLP features"),
                    "down": row_parallel(w["mlp.down_proj.weight"], r, p, "MLP features"),
                }
            )
        head = full.get("lm_head.weight", full["model.embed_tokens.weight"])  # tied embeddings in SmolLM2
        start, stop = uneven_block(head.shape[0], r, p)  # this rank's slice of the vocabulary, any size
        kept[p] = {
            "embed": full["model.embed_tokens.weight"].clone().to(dev),
            "norm": full["model.norm.weight"].clone().to(dev),
            "lm_head": head[start:stop].clone().to(dev),
            "vocab_start": start,
            "layers": [{k: v.to(dev) for k, v in layer.items()} for layer in layers],
            "inv_freq": 1.0 / (shape["theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)),
            "eps": shape["eps"],
            "head_dim": d,
        }
    return {p: held_bytes(name, p) for p in kept}


def held_bytes(name, p):
    """Bytes of weights this rank holds for the p-way split: its layer slices, and all it holds."""
    model = STATE["models"][name][p]
    layers = sum(t.numel() * t.element_size() for layer in model["layers"] for t in layer.values())
    other = sum(model[k].numel() * model[k].element_size() for k in ("embed", "norm", "lm_head"))
    return {"layers": layers, "all": layers + other}


# %% [markdown]
# The forward pass below is lesson 15's hand-written decoder (KV cache, rotary positions, grouped-query
# attention) on one rank's slices. The only new lines are the two `all_reduce` calls and the greedy pick over
# the vocabulary slices. `Comm` times every collective, so each step reports its compute and its
# communication; `Comm(group, enabled=False)` skips them (a "compute-only" run: its output is wrong, its compute
# is the same), which the cost model needs.


# %% tags=["export"]
class Comm:
    """The collectives of tensor parallelism over `group`, timed; `enabled=False` skips them (compute-only runs).

    On a CPU (gloo) a collective has finished when the call returns: the host clock times it. On a GPU (NCCL) the
    call only *queues* it on the GPU and returns: the host clock would time the launch. There each collective is
    bracketed by CUDA events on the current stream, read by `settle()` once the step has synchronized."""

    def __init__(self, group, enabled=True, device=None):
        self.group, self.enabled, self.seconds, self.calls = group, enabled, 0.0, 0
        self.cuda, self.pending = device is not None and device.type == "cuda", []

    def timed(self, collective, *args, **kwargs):
        if self.cuda:  # the device's clock: events queued on the stream before and after the collective
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            collective(*args, **kwargs)
            end.record()
            self.pending.append((start, end))
        else:
            start = time.perf_counter()
            collective(*args, **kwargs)
            self.seconds += time.perf_counter() - start
        self.calls += 1

    def settle(self):
        """Add the GPU-timed collectives to `seconds` (call after torch.cuda.synchronize())."""
        self.seconds += sum(start.elapsed_time(end) for start, end in self.pending) / 1000
        self.pending.clear()

    def all_reduce(self, t):
        if self.enabled:  # in place: the sum of every rank's t
            self.timed(dist.all_reduce, t, op=dist.ReduceOp.SUM, group=self.group)
        return t

    def best_token(self, logits, vocab_start):
        """Greedy pick over the vocabulary slices: each rank's best (score, token id), gathered, then the max."""
        score, index = logits.max(-1)
        mine = torch.stack([score, (index + vocab_start).to(score.dtype)])
        if not self.enabled:
            return int(mine[1])
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size(self.group))]
        self.timed(dist.all_gather, every, mine, group=self.group)
        best = max(every, key=lambda t: (float(t[0]), -float(t[1])))  # ties: the lowest id, as argmax does
        return int(best[1])


def rotary(inv_freq, positions, dev):
    """Llama's rotary position embedding (lesson 15): cos and sin of position x frequency, shape (1, T, head_dim)."""
    freqs = positions.float()[:, :, None] * inv_freq[None, None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dev), emb.sin().to(dev)


def apply_rotary(q, k, cos, sin):
    def rotate_half(x):
        return torch.cat([-x[..., x.shape[-1] // 2 :], x[..., : x.shape[-1] // 2]], dim=-1)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rms_norm(x, weight, eps):
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def tp_layer(h, w, cache, cos, sin, comm, eps, head_dim):
    """One decoder layer on this rank's slices: its heads, its MLP features; one all-reduce per block."""
    b, t, _ = h.shape
    x = rms_norm(h, w["ln1"], eps)
    q = F.linear(x, w["q"]).view(b, t, -1, head_dim).transpose(1, 2)  # column-parallel: this rank's heads
    k = F.linear(x, w["k"]).view(b, t, -1, head_dim).transpose(1, 2)
    v = F.linear(x, w["v"]).view(b, t, -1, head_dim).transpose(1, 2)
    q, k = apply_rotary(q, k, cos, sin)
    if cache is not None:
        if cache:  # this rank's KV cache holds only its own K/V heads
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        cache[:] = [k, v]
    a = F.scaled_dot_product_attention(q, k, v, is_causal=k.shape[2] == t and t > 1, enable_gqa=True)
    o = F.linear(a.transpose(1, 2).reshape(b, t, -1), w["o"])  # row-parallel: a partial sum of o_proj's output
    h = h + comm.all_reduce(o)  # block 1: the sum over ranks is the full attention output
    x = rms_norm(h, w["ln2"], eps)
    m = F.silu(F.linear(x, w["gate"])) * F.linear(x, w["up"])  # column-parallel: this rank's 1536/p features
    return h + comm.all_reduce(F.linear(m, w["down"]))  # row-parallel, block 2: one more all-reduce


def tp_generate(name, p, prompt, n_new, communicate=True):
    """Greedy decoding on this rank's slices of the p-way split: tokens, per step its ms and comm ms, and the bytes
    of this rank's KV cache at the end (its K/V heads only) with the number of positions it holds."""
    model = STATE["models"][name][p]
    dev = STATE["device"]
    comm = Comm(STATE["groups"][p], communicate, dev)
    caches = [[] for _ in model["layers"]]
    ids, start, out, step_ms, comm_ms = torch.tensor([prompt], device=dev), 0, [], [], []
    with torch.inference_mode():
        for _ in range(n_new):
            t0, c0 = time.perf_counter(), comm.seconds
            h = F.embedding(ids, model["embed"])
            cos, sin = rotary(model["inv_freq"], torch.arange(start, start + ids.shape[1]).unsqueeze(0), dev)
            for w, cache in zip(model["layers"], caches, strict=True):
                h = tp_layer(h, w, cache, cos, sin, comm, model["eps"], model["head_dim"])
            logits = F.linear(rms_norm(h[0, -1], model["norm"], model["eps"]), model["lm_head"])
            token = comm.best_token(logits, model["vocab_start"])  # int(): waits for the GPU's answer
            if dev.type == "cuda":
                torch.cuda.synchronize()  # the step has run on the GPU: now the host clock and the events agree
                comm.settle()
            step_ms.append(1000 * (time.perf_counter() - t0))
            comm_ms.append(1000 * (comm.seconds - c0))
            out.append(token)
            start += ids.shape[1]
            ids = torch.tensor([[token]], device=dev)
    kv_bytes = sum(t.numel() * t.element_size() for cache in caches for t in cache)
    return {
        "tokens": out,
        "step_ms": step_ms,
        "comm_ms": comm_ms,
        "calls_per_step": comm.calls / max(n_new, 1),
        "kv_bytes": kv_bytes,
        "kv_positions": start,
    }


def set_threads(n):
    torch.set_num_threads(n)
    return torch.get_num_threads()


def drop(name):
    STATE.get("models", {}).pop(name, None)


def allreduce_sweep(p, sizes, reps):
    """Median seconds of one all_reduce of `n` float32 values over the first p ranks, for each n in `sizes`.

    gloo: the host clock around the call (it returns when the sum has arrived). NCCL: CUDA events on the stream,
    read after a synchronize (the call returns once the collective is queued)."""
    group, dev, out = STATE["groups"][p], STATE["device"], []
    for n in sizes:
        t = torch.ones(n, device=dev)
        dist.barrier(group=group)
        comm = Comm(group, device=dev)
        times = []
        for _ in range(reps if n * 4 < 1_000_000 else max(3, reps // 4)):
            before = comm.seconds
            comm.timed(dist.all_reduce, t, group=group)
            if dev.type == "cuda":
                torch.cuda.synchronize()
                comm.settle()
            times.append(comm.seconds - before)
        out.append(sorted(times)[len(times) // 2])
    return out


def start_replica(name):
    """Serve greedy decoding with this rank's whole model over HTTP on 127.0.0.1 (a free port), in a thread.

    One request at a time, like a replica at batch 1; the others wait in the socket's queue. Returns the port."""
    import json
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            tokens = tp_generate(name, 1, body["prompt"], body["max_new"], communicate=False)["tokens"]
            data = json.dumps({"tokens": tokens, "replica": STATE["rank"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # no line per request
            pass

    HTTPServer.request_queue_size = 256  # waiting requests queue here
    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    STATE["replica"] = server
    return server.server_address[1]


def stop_replica():
    server = STATE.pop("replica")
    server.shutdown()
    server.server_close()


def pp_forward(name, p, tokens, m, handoff="isend"):
    """Stage `rank` of a p-stage pipeline: its block of whole layers, over `tokens` (B, T) in m micro-batches.

    Stage 0 embeds; each stage receives the activations of a micro-batch from the stage before (`dist.recv`),
    runs its layers and sends them on; the last stage returns the last position's logits. `handoff="send"`
    sends with the blocking `dist.send`, which on gloo returns only once the next stage has *received*: the
    sender waits while the receiver still computes the previous micro-batch. `"isend"` queues the send and
    goes on to the next micro-batch (the handles are waited on at the end).
    Returns the (start, end) of each micro-batch's compute on this stage, the seconds spent blocked in sends and
    in receives, and the logits (last stage)."""
    rank, model = STATE["rank"], STATE["models"][name][1]  # the 1-way split: whole layers
    first, last = stage_layers(len(model["layers"]), p)[rank]
    mine = model["layers"][first:last]
    b, t = tokens.shape
    mb, hidden = (
        even_share(b, m, "prompts (the batch)", "micro-batches"),
        model["embed"].shape[1],
    )  # equal micro-batches
    cos, sin = rotary(model["inv_freq"], torch.arange(t).unsqueeze(0), model["embed"].device)
    no_tp = Comm(None, enabled=False)  # whole layers: no tensor parallelism inside a stage
    busy, logits, queued, blocked = [], [], [], {"send": 0.0, "recv": 0.0}
    dist.barrier(group=STATE["groups"][p])
    with torch.inference_mode():
        for j in range(m):
            if rank > 0:
                h = torch.empty(mb, t, hidden)
                waited = time.perf_counter()
                dist.recv(h, src=rank - 1)  # this micro-batch's activations from the stage before
                blocked["recv"] += time.perf_counter() - waited
            start = time.perf_counter()
            if rank == 0:
                h = F.embedding(tokens[j * mb : (j + 1) * mb], model["embed"])
            for w in mine:
                h = tp_layer(h, w, None, cos, sin, no_tp, model["eps"], model["head_dim"])
            if rank == p - 1:
                logits.append(F.linear(rms_norm(h[:, -1], model["norm"], model["eps"]), model["lm_head"]))
            busy.append((start, time.perf_counter()))
            if rank < p - 1:
                waited = time.perf_counter()
                if handoff == "isend":
                    queued.append((dist.isend(h.contiguous(), dst=rank + 1), h))  # keep h alive until sent
                else:
                    dist.send(h.contiguous(), dst=rank + 1)  # on to the next stage, once it has received
                blocked["send"] += time.perf_counter() - waited
        if queued:  # the queued sends: done once the next stage has received them all
            waited = time.perf_counter()
            for work, _ in queued:
                work.wait()
            blocked["send"] += time.perf_counter() - waited
    return {
        "busy": busy,
        "blocked_s": blocked,
        "layers": (first, last),
        "logits": torch.cat(logits) if logits else None,
    }


# %%
import course_utils.from_lessons.l17_beyond_one_device as l17  # noqa: E402 - the ranks run this module's copy

WORLD = 3  # ranks: the sub-groups of 1, 2 and 3 of them run every split
tp_path = WORK / "split_model.pt"
torch.save(tp_model.state_dict(), tp_path)
world = contextlib.ExitStack()  # one set of ranks for the whole lesson, closed in its last cell
atexit.register(world.close)  # and when this kernel or script exits
with contextlib.suppress(ImportError):  # in Jupyter: a cell that fails stops the ranks at once
    from IPython import get_ipython

    if get_ipython() is not None:
        get_ipython().events.register("post_run_cell", lambda result: result.success or world.close())
t0 = time.perf_counter()
W = world.enter_context(l17.World(WORLD))
print(f"{WORLD} rank processes (pids {W.pids}) joined one gloo group in {time.perf_counter() - t0:.1f} s")
t0 = time.perf_counter()
held = W.run(l17.load_shards, path=str(tp_path), shape=l17.shape_of(cfg), sizes=[1, 2, 3], name="split")
print(
    f"Each rank holds its slices ({held[0][1]['layers'] / 2**20:.0f} MiB of layer weights for the 1-rank split on "
    "rank 0); "
    f"loaded in {time.perf_counter() - t0:.1f} s"
)

# %% [markdown]
# ## Tensor parallelism: correct first
# The reference is the model's own greedy `generate` in this process. Each split must give the same tokens, on
# every rank (each rank picks the token itself, from the same gathered scores).

# %%
PROMPT = torch.randint(3, cfg.vocab_size, (cu.pick(full=16, smoke=8),), generator=torch.Generator().manual_seed(1))
PROMPT = PROMPT.tolist()
N_CHECK = cu.pick(full=16, smoke=4)


def reference(model, prompt, n):
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
        logits = model(out).logits[0, len(prompt) - 1 : -1]
    top2 = logits.topk(2, dim=-1).values
    return out[0, len(prompt) :].tolist(), float((top2[:, 0] - top2[:, 1]).min())


ref, margin = reference(tp_model, PROMPT, N_CHECK)
parity = {}
for p in (1, 2, 3):
    runs = W.run(l17.tp_generate, ranks=range(p), name="split", p=p, prompt=PROMPT, n_new=N_CHECK)
    tokens = [r["tokens"][: len(ref)] for r in runs]
    assert all(t == ref for t in tokens), f"{p} ranks: tokens {tokens} differ from generate {ref}"
    parity[p] = runs[0]
    print(
        f"✓ {p} rank(s): {len(ref)} greedy tokens identical to generate on every rank "
        f"({runs[0]['calls_per_step']:.0f} collectives per step)"
    )
print(f"The closest call along the way: the top two logits {margin:.2g} apart (the sums' rounding differs by ~1e-6).")

# %% [markdown]
# The real SmolLM2-135M-Instruct, split over 3 ranks (its 9 query heads and 3 K/V heads: 3 and 1 per rank),
# answering a question: the same code, its real weights.

# %%
if REAL:
    real_path = WORK / "smollm2.pt"
    torch.save(real_model.state_dict(), real_path)
    W.run(l17.load_shards, path=str(real_path), shape=l17.shape_of(real_model.config), sizes=[3], name="smollm2")
    question = cu.llm.chat_ids(tok, "What is the capital of France?")[0].tolist()
    real_n = cu.pick(full=12, smoke=4)
    want, _ = reference(real_model, question, real_n)
    got = W.run(l17.tp_generate, name="smollm2", p=3, prompt=question, n_new=real_n)
    assert all(r["tokens"][: len(want)] == want for r in got), "SmolLM2 on 3 ranks differs from generate"
    print(f"✓ SmolLM2 on 3 ranks == generate: {tok.decode(want)!r}")
    W.run(l17.drop, name="smollm2")
    real_path.unlink()

# %% [markdown]
# ## Past the K/V heads: copied, and what fits in memory
# The same code with vLLM's rule: a model of the same shape with **one** K/V head for its 18 query heads
# (multi-query attention). At 2 and 3 ranks each rank gets its 9 or 6 query heads and a **copy** of the K/V head
# (`load_shards` picks K/V head `rank // copies`). Correct first: its tokens against its own `generate`.
#
# Then what a split buys in memory. Per rank: the weights it holds, and the KV cache per token (K and V, every
# layer, its K/V heads). The largest **batch x context** (tokens of KV cache, summed over the requests in flight)
# that fits is `(memory - weights) / KV bytes per token`. Predicted from the config (the function below),
# measured from the tensors the ranks actually hold after decoding (`held_bytes`, and the KV cache `tp_generate`
# built), for a rank with room for 1.25 times the whole model's weights.


# %% tags=["contract"]
from course_utils.from_lessons.l17_beyond_one_device import head_split, uneven_block  # noqa: E402, F811


def tp_memory(shape, p, bytes_per_value, split_embedding=False):
    """Predicted bytes on rank 0 of a p-way tensor-parallel split: weights, and KV cache per token.

    Our ranks keep the embedding whole; vLLM splits it too (`VocabParallelEmbedding`): `split_embedding=True`."""
    heads, d, h = head_split(shape["heads"], shape["kv_heads"], p), shape["head_dim"], shape["hidden"]
    per_layer = 2 * h + 2 * heads["q"] * d * h + 2 * heads["kv"] * d * h + 3 * h * shape["intermediate"] // p
    start, stop = uneven_block(shape["vocab"], 0, p)  # rank 0's slice of the vocabulary
    embedding = (stop - start) * h if split_embedding else shape["vocab"] * h
    weights = shape["layers"] * per_layer + embedding + h + (stop - start) * h  # + final norm, lm_head slice
    kv_per_token = 2 * shape["layers"] * heads["kv"] * d  # K and V of every layer, this rank's K/V heads
    return {
        "weights": weights * bytes_per_value,
        "kv_per_token": kv_per_token * bytes_per_value,
        "kv_copies": heads["replicas"],
    }


LLAMA_70B = {  # Llama-3-70B's config.json (meta-llama/Meta-Llama-3-70B)
    "layers": 80, "hidden": 8192, "intermediate": 28672, "vocab": 128256, "heads": 64, "kv_heads": 8, "head_dim": 128,
}  # fmt: skip


def tokens_that_fit(memory, weights, kv_per_token):
    """The largest batch x context (tokens of KV cache) that fits `memory` bytes beside the weights (0: none)."""
    return max(0, int((memory - weights) // kv_per_token))


# %%
mqa_model = cu.llm.tiny_llama(
    seed=17, num_attention_heads=18, num_key_value_heads=1, head_dim=32, num_hidden_layers=LAYERS
)
mqa_path = WORK / "mqa_model.pt"
torch.save(mqa_model.state_dict(), mqa_path)
W.run(l17.load_shards, path=str(mqa_path), shape=l17.shape_of(mqa_model.config), sizes=[1, 2, 3], name="mqa")
mqa_ref, _ = reference(mqa_model, PROMPT, N_CHECK)
MEMORY = 1.25 * tp_memory(l17.shape_of(cfg), 1, 4)["weights"]  # a rank's memory in this example, bytes
mem_rows = []
for heads_label, name, model in (("6 K/V heads", "split", tp_model), ("1 K/V head", "mqa", mqa_model)):
    shape = l17.shape_of(model.config)
    want = ref if name == "split" else mqa_ref
    for p in (1, 2, 3):
        runs = W.run(l17.tp_generate, ranks=range(p), name=name, p=p, prompt=PROMPT, n_new=N_CHECK)
        assert all(r["tokens"][: len(want)] == want for r in runs), f"{heads_label}, {p} ranks: tokens differ"
        predicted = tp_memory(shape, p, 4)
        held_now = W.run(l17.held_bytes, ranks=[0], name=name, p=p)[0]["all"]
        kv_now = runs[0]["kv_bytes"] / runs[0]["kv_positions"]
        mem_rows.append(
            {
                "model": heads_label,
                "ranks": p,
                "K/V copies": predicted["kv_copies"],
                "weights MiB, predicted": predicted["weights"] / 2**20,
                "weights MiB, measured": held_now / 2**20,
                "KV bytes/token, predicted": predicted["kv_per_token"],
                "KV bytes/token, measured": kv_now,
                "tokens that fit, predicted": tokens_that_fit(MEMORY, predicted["weights"], predicted["kv_per_token"]),
                "tokens that fit, measured": tokens_that_fit(MEMORY, held_now, kv_now),
            }
        )
W.run(l17.drop, name="mqa")
kv_table = pd.DataFrame(mem_rows).set_index(["model", "ranks"])
display(kv_table.round(1))
exact = (kv_table["tokens that fit, predicted"] == kv_table["tokens that fit, measured"]).all()
print(
    f"✓ 1 K/V head, 2 and 3 ranks (the head copied): tokens == generate. Predicted == measured in every row: {exact} "
    f"(memory per rank: {MEMORY / 2**20:.0f} MiB)"
)
for label in ("6 K/V heads", "1 K/V head"):
    kv1, kv3 = (kv_table.loc[(label, p), "KV bytes/token, measured"] for p in (1, 3))
    fit1, fit3 = (kv_table.loc[(label, p), "tokens that fit, measured"] for p in (1, 3))
    print(
        f"{label}: from 1 to 3 ranks the KV cache per token per rank went {kv1:.0f} -> {kv3:.0f} bytes "
        f"({kv1 / kv3:.1f}x smaller); tokens that fit {fit1} -> {fit3} ({fit3 / max(fit1, 1):.1f}x)"
    )

# %% [markdown]
# At scale the same arithmetic decides how many GPUs a model needs. Llama-3-70B's shape (80 layers, 64 query
# heads, **8 K/V heads**, BF16) on H200s (141 GB each, vLLM's default 90% of it), vLLM's split embedding: up to 8
# GPUs every rank's KV cache per token shrinks; at 16 it is copied, and only the weights still shrink.

# %%
H200_BYTES = 0.9 * 141e9  # NVIDIA H200 datasheet: 141 GB HBM3e; vLLM's --gpu-memory-utilization default 0.9
big_rows = []
for p in (2, 4, 8, 16):
    m70 = tp_memory(LLAMA_70B, p, 2, split_embedding=True)
    big_rows.append(
        {
            "GPUs": p,
            "K/V heads per GPU": head_split(64, 8, p)["kv"],
            "K/V copies": m70["kv_copies"],
            "weights GB per GPU": m70["weights"] / 1e9,
            "KV KiB per token per GPU": m70["kv_per_token"] / 2**10,
            "tokens of KV that fit per GPU": tokens_that_fit(H200_BYTES, m70["weights"], m70["kv_per_token"]),
        }
    )
display(pd.DataFrame(big_rows).set_index("GPUs").round(2))

# %% [markdown]
# ## What it costs: all-reduce time against message size
# A decode step at batch 1 all-reduces one vector of 576 floats (2.3 KB) twice per layer. How long does one
# all-reduce take? Measured on 2 and 3 ranks of gloo, from one float to megabytes. A ring all-reduce sends each
# rank's data around the ring twice (reduce-scatter, then all-gather): each rank sends `2 (p - 1) / p x S`
# bytes for a message of `S` bytes. So the model is `t(S) = latency + 2 (p - 1) / p x S / bandwidth`: the
# latency is the median time of the small messages (up to the decode step's 2.3 KB), the bandwidth what the
# largest message's bytes add to it. The sweep runs in rounds; each number is printed with the interval of its
# median over the rounds (95% from 6 rounds; fewer give their range, at the confidence printed). A fit can come
# out impossible on a loaded machine (the largest message no slower than the small ones, so "bandwidth" divides
# by noise): the check below flags a fit outside physical bounds
# (latency below zero, time not growing with size, a bandwidth above the fastest memory on any datasheet), and
# then the model uses the latency alone and no bandwidth is concluded.


# %% tags=["contract"]
import numpy as np  # noqa: E402, F811 - the contract cell carries its own imports

FASTEST_MEMORY_GB_S = 8000.0  # NVIDIA B200 datasheet: HBM3e, 8 TB/s, the fastest memory of any accelerator here


def fit_allreduce(nbytes, ms, p, small_bytes):
    """The all-reduce model from one sweep (median ms per message size): latency, bandwidth, and what is wrong."""
    nbytes, ms = np.asarray(nbytes, dtype=float), np.asarray(ms, dtype=float)
    sent = 2 * (p - 1) / p * nbytes  # bytes each rank sends in a ring all-reduce
    latency = float(np.median(ms[nbytes <= small_bytes]))
    extra = float(ms[-1] - latency)  # what the largest message's bytes added
    flags, gb_s = [], float("nan")
    if latency < 0:
        flags.append(f"latency {latency:.3g} ms is below zero")
    if extra <= 0:
        flags.append(
            f"the largest message ({nbytes[-1]:.0f} B) took no longer than the small ones ({ms[-1]:.3g} vs "
            f"{latency:.3g} ms): this sweep shows no bandwidth"
        )
    else:
        gb_s = sent[-1] / extra / 1e6
        if gb_s > FASTEST_MEMORY_GB_S:
            flags.append(f"bandwidth {gb_s:.0f} GB/s is above any memory's ({FASTEST_MEMORY_GB_S:.0f} GB/s): noise")
    return {"latency_ms": latency, "GB_per_s": gb_s, "flags": flags}


def allreduce_ms(p, nbytes, fit):
    """The model: milliseconds for one all-reduce of `nbytes` over p ranks (latency alone when no bandwidth)."""
    if fit["flags"] or not np.isfinite(fit["GB_per_s"]):
        return fit["latency_ms"]
    return fit["latency_ms"] + 2 * (p - 1) / p * nbytes / (fit["GB_per_s"] * 1e6)


# %%
SIZES = cu.pick(full=[1, 16, 144, 576, 2304, 9216, 36864, 147456, 589824, 2359296], smoke=[1, 576, 9216, 36864])
REPS = cu.pick(full=30, smoke=5)
SWEEP_ROUNDS = cu.pick(full=5, smoke=3)
sweep = {p: [] for p in (2, 3)}
for _ in range(SWEEP_ROUNDS):  # rounds, the two world sizes interleaved
    for p in (2, 3):
        sweep[p].append(W.run(l17.allreduce_sweep, ranks=range(p), p=p, sizes=SIZES, reps=REPS)[0])
NBYTES = 4 * np.array(SIZES)
sweep_ms = {p: 1000 * np.median(np.array(v), axis=0) for p, v in sweep.items()}
gloo_fit, fit_ci = {}, {}
for p, rounds in sweep.items():
    gloo_fit[p] = fit_allreduce(NBYTES, sweep_ms[p], p, small_bytes=4 * cfg.hidden_size)
    per_round = [fit_allreduce(NBYTES, 1000 * np.array(r), p, small_bytes=4 * cfg.hidden_size) for r in rounds]
    lat = median_interval(np.array([f["latency_ms"] for f in per_round]))
    bw = np.array([f["GB_per_s"] for f in per_round if not f["flags"]])
    fit_ci[p] = {"latency_ms": lat, "GB_per_s": median_interval(bw) if bw.size else None}
sweep_table = pd.DataFrame(
    {
        f"{p} ranks, ms (interval of the median, its confidence)": [
            f"{1000 * lo:.3f}-{1000 * hi:.3f} ({conf:.0%})"
            for lo, hi, conf in (median_interval(c) for c in np.array(v).T)
        ]
        for p, v in sweep.items()
    },
    index=pd.Index(SIZES, name="floats"),
)
for p, ms in sweep_ms.items():
    sweep_table[f"{p} ranks, median ms"] = ms
sweep_table["bytes"] = NBYTES
display(sweep_table.round(4))
for p, f in gloo_fit.items():
    lo, hi, conf = fit_ci[p]["latency_ms"]
    text = f"gloo, {p} ranks on this machine: latency {1000 * f['latency_ms']:.0f} µs ({conf:.0%} CI {1000 * lo:.0f}-"
    text += f"{1000 * hi:.0f} over {SWEEP_ROUNDS} rounds)"
    if f["flags"]:
        print(f"{text}; the fit is FLAGGED, no bandwidth concluded: {'; '.join(f['flags'])}")
    else:
        bw_lo, bw_hi, _ = fit_ci[p]["GB_per_s"] or (float("nan"),) * 3
        n_ok = len(
            [1 for r in sweep[p] if not fit_allreduce(NBYTES, 1000 * np.array(r), p, 4 * cfg.hidden_size)["flags"]]
        )
        print(
            f"{text}, bandwidth {f['GB_per_s']:.2f} GB/s per rank (the fit of the median sweep; fitted round by "
            f"round: {bw_lo:.2f}-{bw_hi:.2f} GB/s, {n_ok} of {SWEEP_ROUNDS} rounds physical)"
        )


fig, ax = plt.subplots(figsize=(6.5, 3.6))
for i, (p, ms) in enumerate(sweep_ms.items()):
    nbytes = 4 * np.array(SIZES)
    ax.loglog(nbytes, ms, "o", color=f"C{i}", label=f"{p} ranks measured")
    ax.loglog(nbytes, [allreduce_ms(p, b, gloo_fit[p]) for b in nbytes], "--", color=f"C{i}", label=f"{p} ranks model")
ax.axvline(4 * cfg.hidden_size, color="gray", lw=0.8, ls=":")
ax.set(xlabel="message (bytes)", ylabel="ms per all-reduce", title="gloo all-reduce on this machine")
ax.legend(fontsize=8)
fig.tight_layout()
_ = cu.plots.save(fig, "17", "allreduce_sweep")

# %% [markdown]
# ## Step time at 1, 2 and 3 ranks, and where it goes
# Each variant runs a few decode steps and returns the median step time; the comparison helper runs them in
# interleaved rounds. Besides the splits: one rank with **two** threads (the same two cores, used by
# intra-op threads instead of ranks), and the 2- and 3-rank splits with their collectives skipped (compute only:
# wrong tokens, right work), which the cost model needs. On a 2-core machine, 3 ranks share 2 cores.

# %%
STEPS = cu.pick(full=8, smoke=2)
step_runs = {}


def steps(p, communicate=True, threads=1):
    def run():
        if threads != 1:
            W.run(l17.set_threads, ranks=[0], n=threads)
        try:
            res = W.run(
                l17.tp_generate,
                ranks=range(p),
                name="split",
                p=p,
                prompt=PROMPT,
                n_new=STEPS + 1,
                communicate=communicate,
            )[0]
        finally:
            if threads != 1:
                W.run(l17.set_threads, ranks=[0], n=1)
        step_runs.setdefault((p, communicate, threads), []).append(res)
        return float(np.median(res["step_ms"][1:]))  # decode steps (the first is the prompt's prefill)

    return run


variants = {
    "1 rank": steps(1),
    "2 ranks": steps(2),
    "3 ranks": steps(3),
    "1 rank, 2 threads": steps(1, threads=2),
    "2 ranks, compute only": steps(2, communicate=False),
    "3 ranks, compute only": steps(3, communicate=False),
}
tp_cmp = cu.comparing.compare_runs(
    variants,
    baseline="1 rank",
    rounds=cu.pick(full=5, smoke=3),
    higher_is_better=False,
    label="decode step",
    metric="ms per decode step",
)
display(tp_cmp.table().round(3))
for name in ("2 ranks", "3 ranks", "1 rank, 2 threads"):
    print(tp_cmp.ratio(name).says(name, "1 rank"))

# %% [markdown]
# **Compute against communication.** Inside each step the ranks timed their collectives. And the model: the
# measured compute-only step plus, per collective, one fitted all-reduce of the message (`hidden x 4` bytes at
# batch 1; the token pick's gather of two numbers counted as one small all-reduce). The ratio predicted /
# measured is taken per round, so it has an interval too; the target is within 25%.

# %%
H_BYTES = 4 * cfg.hidden_size
calls = parity[2]["calls_per_step"]
split_rows, model_ratio = [], {}
for p in (1, 2, 3):
    runs = step_runs[(p, True, 1)]
    step = np.median([np.median(r["step_ms"][1:]) for r in runs])
    comm = np.median([np.median(r["comm_ms"][1:]) for r in runs])
    share = median_interval(np.array([100 * np.median(r["comm_ms"][1:]) / np.median(r["step_ms"][1:]) for r in runs]))
    row = {"ranks": p, "step_ms": step, "comm_ms": comm, "compute_ms": step - comm, "comm_%": 100 * comm / step}
    row["comm_% (interval of the rounds)"] = f"{share[0]:.0f}-{share[1]:.0f} ({share[2]:.0%})"
    if p > 1:
        model_comm = calls * allreduce_ms(p, H_BYTES, gloo_fit[p])
        predicted = np.array(tp_cmp.per_round[f"{p} ranks, compute only"]) + model_comm
        measured = np.array(tp_cmp.per_round[f"{p} ranks"])
        model_ratio[p] = ratio_from_rounds(f"predicted, {p} ranks", f"measured, {p} ranks", predicted / measured)
        row |= {"model_comm_ms": model_comm, "predicted_ms": float(np.median(predicted))}
    split_rows.append(row)
split = pd.DataFrame(split_rows).set_index("ranks")
display(split.round(2))


def within(r, tolerance):
    """'met' when the whole interval of predicted/measured lies within 1 ± tolerance, 'missed' when none of it."""
    return r.judge_within(1 - tolerance, 1 + tolerance)


for p, r in model_ratio.items():
    print(f"{p} ranks: predicted / measured step time {r} (target within 25%: {within(r, 0.25)})")

fig, ax = plt.subplots(figsize=(5.5, 3.4))
ax.bar(split.index, split["compute_ms"], label="compute")
ax.bar(split.index, split["comm_ms"], bottom=split["compute_ms"], label="collectives")
ax.plot(split.index[1:], split["predicted_ms"].dropna(), "k*", ms=12, label="model")
ax.set(xlabel="ranks", ylabel="ms per decode step", title="a decode step, split", xticks=[1, 2, 3])
ax.legend(fontsize=8)
fig.tight_layout()
_ = cu.plots.save(fig, "17", "decode_step_split")

# %% [markdown]
# ## The same model for NVLink and PCIe, memory included
# The model needs numbers per GPU and per link, each from its source:
# * **H200 SXM** (NVIDIA H200 datasheet): 141 GB of HBM3e at 4.8 TB/s, 989 dense BF16 TFLOP/s (the H100's
#   compute, more and faster memory). vLLM uses 90% of the memory by default (`--gpu-memory-utilization 0.9`).
# * **NVLink** 900 GB/s per GPU in total (450 GB/s each way), **PCIe Gen5 x16** 128 GB/s (64 GB/s each way)
#   (NVIDIA H100/H200 datasheets).
# * The latency of a small all-reduce is on no datasheet: NCCL's own tuning model (`src/graph/tuning.cc` in
#   NVIDIA/nccl, ring with the LL protocol: 3.6 µs base plus 0.47 µs per step over NVLink, 1.0 µs over PCIe; an
#   all-reduce takes `2 (p - 1)` steps). These are the values of NCCL 2.7's file; later releases retuned them per
#   GPU generation, so read them as the order of magnitude, not to the microsecond.
#
# A decode step is memory-bound: its time is the **bytes read** (this rank's weights, plus the KV cache of every
# request in flight: `batch x context x KV bytes per token`, from `tp_memory` above) over HBM bandwidth, or
# FLOPs over peak when that is larger (prefill). A case is computed only at the GPU counts where weights and KV
# cache fit in 90% of 141 GB; the baseline is the fewest GPUs that hold it (a 70B model in BF16, 141 GB of
# weights, never fits one).
#
# One more thing changes the picture at small messages: **vLLM does not send a decode step's all-reduce through
# NCCL first.** Within a node it tries its own custom all-reduce (`CustomAllreduce` in
# vllm/distributed/device_communicators/custom_all_reduce.py, picked before NCCL in `cuda_communicator.py`): one
# kernel that reads the peers' buffers directly over NVLink, for messages under its size limit (8 MiB by
# default). Its latency is below NCCL's ring, so the decode rows' communication below is an upper bound for vLLM.


# %%
H200 = {"memory_bytes": 0.9 * 141e9, "HBM_GB_s": 4800.0, "BF16_TFLOPS": 989.0}  # NVIDIA H200 datasheet
LINKS = {  # GB/s each way (datasheets); latency per ring step in µs (NCCL 2.7 tuning.cc); base latency 3.6 µs
    "NVLink (H200 SXM)": {"GB_per_s": 450.0, "hop_us": 0.47},
    "PCIe Gen5 x16": {"GB_per_s": 64.0, "hop_us": 1.0},
}
SMOL = l17.shape_of(cfg) | {"layers": 30}  # the split model at SmolLM2's full depth (smoke runs build fewer)


def gpu_step_ms(shape, batch, context, tokens, p, link, gpu=H200):
    """(fits, compute ms, communication ms) of one forward step over `tokens` tokens on p GPUs, BF16 weights."""
    mem = tp_memory(shape, p, 2, split_embedding=True)  # vLLM splits the embedding too
    kv = batch * context * mem["kv_per_token"]  # the KV cache this GPU reads every decode step
    fits = mem["weights"] + kv <= gpu["memory_bytes"]
    read_ms = (mem["weights"] + kv) / (gpu["HBM_GB_s"] * 1e6)
    flops_ms = 2 * (mem["weights"] / 2) * tokens / (gpu["BF16_TFLOPS"] * 1e9)  # 2 FLOPs per weight per token
    fit = {"latency_ms": (3.6 + 2 * (p - 1) * LINKS[link]["hop_us"]) / 1000, "GB_per_s": LINKS[link]["GB_per_s"]}
    fit["flags"] = []
    comm = (2 * shape["layers"] + 1) * allreduce_ms(p, 2 * shape["hidden"] * tokens, fit) if p > 1 else 0.0
    return fits, max(read_ms, flops_ms), comm


CASES = {  # name: (shape, batch, context per request, tokens per step)
    "SmolLM2-135M decode, batch 1": (SMOL, 1, 1024, 1),
    "70B (Llama-3 shape) decode, batch 1": (LLAMA_70B, 1, 4096, 1),
    "70B decode, batch 64": (LLAMA_70B, 64, 4096, 64),
    "70B prefill, 4096 tokens": (LLAMA_70B, 1, 4096, 4096),
}
gpu_rows = []
for case, (shape, batch, context, tokens) in CASES.items():
    for link in LINKS:
        steps_ms = {}
        for p in (1, 2, 4, 8):
            if shape["heads"] % p:  # the head rule refuses it (18 query heads on 4 or 8 GPUs)
                continue
            fits, compute, comm = gpu_step_ms(shape, batch, context, tokens, p, link)
            if fits:
                steps_ms[p] = (compute, comm)
        base = min(steps_ms)  # the fewest GPUs that hold weights and KV cache
        for p, (compute, comm) in steps_ms.items():
            gpu_rows.append(
                {
                    "case": case,
                    "link": link,
                    "GPUs": p,
                    "compute_ms": compute,
                    "comm_ms": comm,
                    "baseline GPUs": base,
                    "speedup_vs_baseline": sum(steps_ms[base]) / (compute + comm),
                }
            )
gpu_model = pd.DataFrame(gpu_rows)
display(gpu_model.round(3))
small = gpu_model[(gpu_model["case"].str.startswith("SmolLM2")) & (gpu_model["GPUs"] == 2)]
big = gpu_model[(gpu_model["case"] == "70B prefill, 4096 tokens") & (gpu_model["GPUs"] == 8)].set_index("link")
fewest_70b = int(gpu_model.loc[gpu_model["case"] == "70B decode, batch 64", "baseline GPUs"].min())
best_small = small["speedup_vs_baseline"].max()  # a prediction of the step-time model above, not a measurement
n_collectives = 2 * SMOL["layers"] + 1  # two all-reduces per layer, one for the logits
print(
    f"SmolLM2 on 2 GPUs, predicted: at best {best_small:.2f} times one GPU's speed"
    + (
        f": a 135M model's step is shorter than the latency of its {n_collectives} collectives, even on NVLink."
        if best_small < 1
        else "."
    )
)
print(
    f"70B, batch 64 x 4096 tokens of context: weights and KV cache need at least {fewest_70b} H200s. "
    f"70B prefill on 8 GPUs: communication {big.loc['NVLink (H200 SXM)', 'comm_ms']:.0f} ms beside "
    f"{big.loc['NVLink (H200 SXM)', 'compute_ms']:.0f} ms of compute on NVLink, "
    f"{big.loc['PCIe Gen5 x16', 'comm_ms']:.0f} ms on PCIe."
)

# %% [markdown]
# ## Pipeline parallelism: layers across ranks, micro-batches through them
# Instead of cutting every layer, give each rank a **block of whole layers** (a *stage*): rank 0 the first
# half, rank 1 the second. Activations go from stage to stage with point-to-point `dist.send`/`dist.recv`, once
# per stage boundary: far less communication than tensor parallelism's two all-reduces per layer. But stage 1
# waits while stage 0 works on the first input: the **bubble**. Cut the batch into `m` **micro-batches** and
# the stages work on different ones at once; with `p` equal stages the idle share is `(p - 1) / (m + p - 1)`.
# Two stages here (this machine has 2 cores: a third stage would share them). The work is a batch of prompts
# (a prefill); the last stage's logits must match the single-process model.

# %%
PP_BATCH, PP_LEN = cu.pick(full=(8, 32), smoke=(8, 4))
MICRO = [1, 4, 8]
P_STAGES = 2
pp_tokens = torch.randint(3, cfg.vocab_size, (PP_BATCH, PP_LEN), generator=torch.Generator().manual_seed(2))
with torch.inference_mode():
    pp_ref = tp_model(pp_tokens).logits[:, -1]


# %% [markdown]
# The formula assumes equal stages and free hand-offs. Two things in a real run break that, and both can be
# measured: the **stages differ** (the last one also runs the output layer, 49152 x 576 weights read once per
# micro-batch), and **each micro-batch costs more than its share** (a decode-sized matmul reads all of the
# stage's weights, whatever its batch). With per-micro-batch times `t_s` per stage, the first micro-batch passes
# every stage and then the slowest sets the pace: `wall = sum(t) + (m - 1) max(t)`, `busy = m sum(t)`. That is
# `stage_time_bubble` below; with equal `t_s` it is the formula. Stage 0 hands its activations on with
# `dist.isend`, so it starts the next micro-batch at once (a blocking `dist.send` on gloo returns only when the
# next stage has received: `pp_forward(..., handoff="send")`; the time each stage spends blocked is measured).


# %% tags=["contract"]
def bubble(stages):
    """The idle share of p stages over the whole run: 1 - busy time / (p x wall time)."""
    spans = [s for stage in stages for s in stage["busy"]]
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    return 1 - sum(e - s for s, e in spans) / (len(stages) * wall)


def stage_time_bubble(per_micro_batch, m):
    """The bubble of m micro-batches when stage s takes per_micro_batch[s]: sum(t) + (m - 1) max(t) of wall time."""
    total, slowest = sum(per_micro_batch), max(per_micro_batch)
    return 1 - m * total / (len(per_micro_batch) * (total + (m - 1) * slowest))


# %%
W.run(l17.load_shards, path=str(tp_path), shape=l17.shape_of(cfg), sizes=[1], name="whole", whole_on_every_rank=True)
pp_bubbles, pp_runs, pp_model, pp_blocked, pp_busy, pp_uneven = ({m: [] for m in MICRO} for _ in range(6))
pp_match = {}  # per m, the round whose logits were furthest from the reference
for _ in range(cu.pick(full=5, smoke=3)):  # rounds, the micro-batch counts interleaved
    for m in MICRO:
        stages = W.run(l17.pp_forward, ranks=range(P_STAGES), name="whole", p=P_STAGES, tokens=pp_tokens, m=m)
        match = cu.compare_outputs(stages[-1]["logits"], pp_ref, "fp32")  # every round; printed once, below
        if not match.within:  # prints why and raises: no bubble is measured on wrong logits
            cu.check_outputs(stages[-1]["logits"], pp_ref, "fp32", label=f"pipeline, m={m}")
        pp_match[m] = max(pp_match.get(m, match), match, key=lambda r: r.max_rel)
        pp_bubbles[m].append(bubble(stages))
        per_mb = [np.median([e - s for s, e in st["busy"]]) for st in stages]
        pp_model[m].append(stage_time_bubble(per_mb, m))
        pp_uneven[m].append(max(per_mb) / min(per_mb))
        spans = [x for st in stages for x in st["busy"]]
        wall = max(e for _, e in spans) - min(s for s, _ in spans)
        pp_blocked[m].append(stages[0]["blocked_s"]["send"] / wall)
        pp_busy[m].append(sum(e - s for st in stages for s, e in st["busy"]))
        pp_runs[m] = stages
for m in MICRO:
    print(f"pipeline, m={m}, the furthest of the rounds: {pp_match[m]}")
print(f"✓ The pipeline's last-position logits == the single-process model's (fp32 tolerance), m = {MICRO}")
pp_rows = []
for m in MICRO:
    formula = (P_STAGES - 1) / (m + P_STAGES - 1)
    r = ratio_from_rounds(f"measured bubble, m={m}", "formula", np.array(pp_bubbles[m]) / formula)
    r_model = ratio_from_rounds(f"measured bubble, m={m}", "stage times", np.array(pp_bubbles[m]) / pp_model[m])
    r_uneven = ratio_from_rounds("slowest stage", "fastest stage", np.array(pp_uneven[m]))
    r_compute = ratio_from_rounds(f"compute, m={m}", "m=1", np.array(pp_busy[m]) / np.array(pp_busy[MICRO[0]]))
    lo, hi, conf = median_interval(np.array(pp_bubbles[m]))
    pp_rows.append(
        {
            "micro-batches": m,
            "formula": formula,
            "measured": float(np.median(pp_bubbles[m])),
            "measured, interval": f"{lo:.0%}-{hi:.0%} ({conf:.0%} confidence)",
            "from stage times": float(np.median(pp_model[m])),
            "measured / formula": r.interval_text,
            "within 20%": within(r, 0.20),
            "measured / stage-time model": r_model.interval_text,
            "stage-time model within 20%": within(r_model, 0.20),
            "slowest / fastest stage": r_uneven.interval_text,
            "compute vs m=1": r_compute.interval_text,
            "stage 0 handing off, % of wall": 100 * float(np.median(pp_blocked[m])),
        }
    )
pp_table = pd.DataFrame(pp_rows).set_index("micro-batches")
with pd.option_context("display.max_columns", 20, "display.width", 200):
    display(pp_table.round(3))
for m in MICRO[1:]:
    row = pp_table.loc[m]
    print(
        f"m={m}: measured bubble {row['measured']:.0%} ({row['measured, interval']}), formula {row['formula']:.0%}, "
        f"with the stages' own times {row['from stage times']:.0%} (the slowest stage took "
        f"{row['slowest / fastest stage']} the fastest's time per micro-batch); the stages' compute is "
        f"{row['compute vs m=1']} that of m=1 (each micro-batch reads all the stage's weights), and stage 0 "
        f"spent {row['stage 0 handing off, % of wall']:.0f}% of the run waiting for its sends to be received."
    )

fig, axes = plt.subplots(1, len(MICRO), figsize=(12, 2.4), sharey=True)
for ax, m in zip(axes, MICRO, strict=True):
    stages = pp_runs[m]
    t_start = min(s for st in stages for s, _ in st["busy"])
    for rank, st in enumerate(stages):
        for j, (s, e) in enumerate(st["busy"]):
            ax.barh(rank, 1000 * (e - s), left=1000 * (s - t_start), color=f"C{j % 10}", edgecolor="k", lw=0.3)
    ax.set(title=f"m = {m}: bubble {pp_table.loc[m, 'measured']:.0%}", xlabel="ms", yticks=range(P_STAGES))
axes[0].set_ylabel("stage (rank)")
fig.tight_layout()
_ = cu.plots.save(fig, "17", "pipeline_timelines")

# %% [markdown]
# For inference this is a **throughput** technique: one sequence alone still passes through every stage in turn,
# so its latency does not drop; and on a busy machine a stage that loses its core for a while adds idle time to
# the other, which no formula predicts (the interval shows how much the rounds disagree).

# %% [markdown]
# ## Expert parallelism: a mixture of experts over ranks, with `all_to_all`
# A **mixture-of-experts** layer (Mixtral, DeepSeek, Qwen-MoE) replaces the MLP by `E` expert MLPs and a router
# that sends each token to its `top_k` best experts. The experts hold most of the weights but each token uses only
# `top_k` of them. **Expert parallelism** gives each rank `E / p` whole experts; the tokens travel to the rank of
# their experts and back: two `all_to_all` exchanges per layer (each rank sends a different slice to each other
# rank, of sizes only known after routing, so a first exchange of the counts). vLLM does this with
# `--enable-expert-parallel`, its exchanges in `vllm/distributed/device_communicators/all2all.py`.
#
# Below: 8 experts, top 2, on 1 and 2 of our 3 ranks (3 does not divide 8: refused, as any uneven split). Each
# rank starts with its own share of the tokens. Correct first: the same experts chosen for every token, and the
# output of the unsplit layer.


# %% tags=["export"]
def moe_weights(hidden, ffn, experts, seed):
    """A mixture-of-experts MLP: the router and every expert's SwiGLU weights (Mixtral's layout), seeded."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=g) / shape[-1] ** 0.5

    return {"router": w(experts, hidden), "gate": w(experts, ffn, hidden), "up": w(experts, ffn, hidden),
            "down": w(experts, hidden, ffn)}  # fmt: skip


def moe_route(x, router, top_k):
    """Each token's top_k experts and their weights (a softmax over the chosen scores, as Mixtral)."""
    scores, chosen = (x @ router.T).topk(top_k, dim=-1)
    return chosen, scores.softmax(-1)


def run_experts(x, experts, w, first):
    """Rows of x through their experts (`experts[i]` for row i); `w` holds experts first, first + 1, ..."""
    out = torch.empty_like(x)
    for e in experts.unique().tolist():
        rows = (experts == e).nonzero(as_tuple=True)[0]
        i = e - first
        out[rows] = F.linear(F.silu(F.linear(x[rows], w["gate"][i])) * F.linear(x[rows], w["up"][i]), w["down"][i])
    return out


def moe_layer(x, w, top_k):
    """The unsplit layer: every token through its top_k experts, their outputs weighted and summed."""
    chosen, weight = moe_route(x, w["router"], top_k)
    tok = torch.arange(len(x)).repeat_interleave(top_k)
    y = run_experts(x[tok], chosen.flatten(), w, 0) * weight.flatten()[:, None]
    return torch.zeros_like(x).index_add_(0, tok, y), chosen


def ep_moe(x_all, hidden, ffn, experts, seed, top_k, p):
    """Rank `rank` of p: its share of the tokens, its E / p experts, two all_to_all exchanges (and the counts)."""
    rank, group = STATE["rank"], STATE["groups"][p]
    per = even_share(experts, p, "experts")
    full = moe_weights(hidden, ffn, experts, seed)
    w = {k: v if k == "router" else v[rank * per : (rank + 1) * per].clone() for k, v in full.items()}
    del full  # this rank keeps its own experts only
    start, stop = uneven_block(len(x_all), rank, p)
    x = x_all[start:stop]
    chosen, weight = moe_route(x, w["router"], top_k)
    tok = torch.arange(len(x)).repeat_interleave(top_k)
    dest = chosen.flatten() // per  # the rank that holds each (token, expert) pair's expert
    order = dest.argsort(stable=True)
    send_counts = torch.bincount(dest, minlength=p)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)  # how many rows each rank will send me
    sends, recvs = send_counts.tolist(), recv_counts.tolist()
    rows = torch.empty(sum(recvs), x.shape[1])
    dist.all_to_all_single(rows, x[tok[order]].contiguous(), recvs, sends, group=group)  # tokens to their experts
    ids = torch.empty(sum(recvs), dtype=torch.long)
    dist.all_to_all_single(ids, chosen.flatten()[order].contiguous(), recvs, sends, group=group)
    done = run_experts(rows, ids, w, rank * per)
    back = torch.empty(len(order), x.shape[1])
    dist.all_to_all_single(back, done, sends, recvs, group=group)  # the results back to the tokens' ranks
    y = torch.empty_like(back)
    y[order] = back  # undo the sort by destination
    out = torch.zeros_like(x).index_add_(0, tok, y * weight.flatten()[:, None])
    return {"out": out, "chosen": chosen, "sent": sends, "expert_bytes": sum(
        v.numel() * v.element_size() for k, v in w.items() if k != "router")}  # fmt: skip


# %%
MOE = {"hidden": 64, "ffn": 128, "experts": 8, "seed": 5, "top_k": 2}
moe_x = torch.randn(cu.pick(full=64, smoke=24), MOE["hidden"], generator=torch.Generator().manual_seed(6))
with torch.inference_mode():
    moe_want, moe_chosen = l17.moe_layer(moe_x, l17.moe_weights(**{k: MOE[k] for k in MOE if k != "top_k"}), 2)
for p in (1, 2):
    parts = W.run(l17.ep_moe, ranks=range(p), x_all=moe_x, p=p, **MOE)
    got = torch.cat([r["out"] for r in parts])
    assert torch.equal(torch.cat([r["chosen"] for r in parts]), moe_chosen), f"{p} ranks: experts chosen differ"
    cu.check_outputs(got, moe_want, "fp32", label=f"expert parallel, {p} ranks")
    print(
        f"✓ {p} rank(s): every token's 2 experts == the unsplit layer's; expert weights per rank "
        f"{parts[0]['expert_bytes'] / 2**10:.0f} KiB; rows rank 0 sent to each rank: {parts[0]['sent']}"
    )

# %% [markdown]
# ## Data parallelism: replicas behind one router
# When the model fits one device, the simplest split is none: run **replicas**, whole copies of the model, and
# spread the requests. Nothing is communicated per token. What matters is which replica gets each request. A
# **router** (one HTTP entry point) picks:
# * **round-robin**: replica 0, 1, 0, 1, ...: blind to how busy each is;
# * **least outstanding requests**: the replica with the fewest requests in flight (ties: the next in turn).
#
# LLM requests differ in length by orders of magnitude (here most ask for one new token, a quarter for many),
# so round-robin can queue a short request behind a long one while the other replica idles. (Prefix-aware
# routing, sending a request where its prompt's prefix is already cached, needs a prefix cache in each replica;
# ours keep none, so it has nothing to win here.) The replicas are ranks 1 and 2 of the world above, each holding
# the whole model (loaded for the pipeline) and serving our greedy decoder over HTTP on 127.0.0.1, one request at a
# time, one core each; the router is written below; the load is the course's open-loop generator.

# %%
import httpx  # noqa: E402
import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.responses import Response  # noqa: E402
from starlette.routing import Route  # noqa: E402


class Router:
    """Picks a replica for each request: round-robin, or the one with the fewest requests in flight."""

    def __init__(self, urls):
        self.urls, self.outstanding, self.turn, self.sent = urls, [0] * len(urls), 0, [0] * len(urls)

    def pick(self, policy):
        n = len(self.urls)
        if policy == "round-robin":
            i = self.turn % n
        elif policy == "least-outstanding":
            i = min(range(n), key=lambda j: (self.outstanding[j], (j - self.turn) % n))
        else:
            raise ValueError(f"unknown policy {policy!r}: use round-robin or least-outstanding")
        self.turn += 1
        return i

    def app(self):
        state = {}

        async def forward(request):
            i = self.pick(request.path_params["policy"])
            self.outstanding[i] += 1
            self.sent[i] += 1
            try:
                r = await state["client"].post(
                    self.urls[i], content=await request.body(), headers={"content-type": "application/json"}
                )
            finally:
                self.outstanding[i] -= 1
            return Response(r.content, status_code=r.status_code, media_type="application/json")

        @contextlib.asynccontextmanager
        async def lifespan(app):
            limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
            async with httpx.AsyncClient(trust_env=False, timeout=120, limits=limits) as client:
                state["client"] = client
                yield

        return Starlette(routes=[Route("/{policy}/predict", forward, methods=["POST"])], lifespan=lifespan)


@contextlib.contextmanager
def serving(app):
    """Serve `app` on 127.0.0.1 (a free port) in a thread of this process; stop it when the block ends."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "the router did not start (see its log above)"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


# %% [markdown]
# Correct first: every answer through the router equals the model's greedy `generate` with the same
# settings. Then each replica's service time alone, and the load: Poisson arrivals at 70% of what the two
# replicas can serve, the same requests for both policies, in interleaved rounds; the metric is the mean
# latency of a request (lower is better).

# %%
SHORT, LONG = 1, cu.pick(full=8, smoke=4)
rng = np.random.default_rng(17)
bodies = [
    {
        "prompt": rng.integers(3, cfg.vocab_size, int(rng.integers(8, 24))).tolist(),
        "max_new": LONG if rng.random() < 0.25 else SHORT,
    }
    for _ in range(64)
]
dp = contextlib.ExitStack()  # the replicas and the router; a failing cell stops them too (as the ranks)
with contextlib.suppress(ImportError):
    from IPython import get_ipython

    if get_ipython() is not None:
        get_ipython().events.register("post_run_cell", lambda result: result.success or dp.close())
REPLICAS = [1, 2]  # ranks


def world_alive():
    return all(p.is_alive() for p in W.procs)


ports = W.run(l17.start_replica, ranks=REPLICAS, name="whole")
dp.callback(lambda: world_alive() and W.run(l17.stop_replica, ranks=REPLICAS))  # unless the ranks are gone
replica_urls = [f"http://127.0.0.1:{port}/" for port in ports]
router = Router(replica_urls)
ROUTER = dp.enter_context(serving(router.app()))
answers = load_generator.post_many(f"{ROUTER}/least-outstanding/predict", bodies[:8], concurrency=4)
for body, (code, answer) in zip(bodies[:8], answers, strict=True):
    want, _ = reference(tp_model, body["prompt"], body["max_new"])
    assert code == 200 and answer["tokens"][: len(want)] == want, f"router answer differs: {code} {answer}"
print(f"✓ 8 answers through the router == generate; served by replicas {sorted({a['replica'] for _, a in answers})}")
service = {}
for kind, n in (("short", SHORT), ("long", LONG)):
    body = next(b for b in bodies if b["max_new"] == n)
    t = []
    for _ in range(3):
        t0 = time.perf_counter()
        load_generator.post(replica_urls[0], body)
        t.append(time.perf_counter() - t0)
    service[kind] = float(np.median(t))
mean_service = 0.75 * service["short"] + 0.25 * service["long"]
RATE = 0.7 * 2 / mean_service
N_LOAD = cu.pick(full=30, smoke=8)
print(
    f"Service time alone: {1000 * service['short']:.0f} ms (1 token), {1000 * service['long']:.0f} ms "
    f"({LONG} tokens); load: {N_LOAD} requests at {RATE:.1f}/s (70% of 2 replicas)"
)

# %%
dp_runs = {}


def load(policy):
    def run():
        res = load_generator.open_loop(
            f"{ROUTER}/{policy}/predict",
            bodies,
            rate=RATE,
            n_requests=N_LOAD,
            max_seconds=cu.pick(full=60.0, smoke=30.0),
            seed=3,
        )
        assert res.n_failed == 0, f"{policy}: {res.n_failed} requests failed ({res.statuses})"
        assert res.n_ok + res.n_cancelled + res.n_not_sent == N_LOAD
        dp_runs.setdefault(policy, []).append(res)
        return float(np.mean(res.latencies_ms))

    return run


dp_cmp = cu.comparing.compare_runs(
    {p: load(p) for p in ("round-robin", "least-outstanding")},
    baseline="round-robin",
    rounds=cu.pick(full=3, smoke=2),
    higher_is_better=False,
    label="router",
    metric="mean latency, ms",
)
dp_table = pd.DataFrame(
    {
        p: {
            "mean_ms": np.mean([np.mean(r.latencies_ms) for r in runs]),
            "p50_ms": np.median([r.p50_ms for r in runs]),
            "p99_ms": np.median([r.p99_ms for r in runs]),
            "requests_per_s": np.median([r.throughput for r in runs]),
            "answered_%": 100 * np.median([r.n_ok / N_LOAD for r in runs]),
        }
        for p, runs in dp_runs.items()
    }
).T
display(dp_table.round(1))
dp_ratio = dp_cmp.ratio("least-outstanding")
print(dp_ratio.says("least-outstanding", "round-robin", better="lower mean latency than"))
print(f"Requests per replica over all runs: {router.sent}")

# %%
dp.close()  # the router and both replicas' HTTP servers stop here (the ranks stay for the rest of the lesson)
print(
    f"Router and replicas stopped; ports still listening: {[p for p in ports if server_process.port_open(p)] or 'none'}"
)

# %% [markdown]
# ## When a rank fails
# A collective waits until **every** rank of its group calls it. One rank that dies, raises before the call, or
# skips it (an `if rank == 0:` around it) leaves the others waiting; nothing on the waiting side knows why.
# * **Timeouts.** `init_process_group(timeout=...)` bounds every collective. On gloo the waiting call raises when
#   it expires; `World` above does not wait for that: it polls its ranks and stops all of them as soon as one has
#   exited or reported an error (a test kills a rank mid-step).
# * **NCCL's watchdog.** On NCCL the call returns at once (the work is queued), so the timeout is enforced by a
#   watchdog thread of torch's `ProcessGroupNCCL`, which checks the queued collectives. When one times out or
#   fails, `TORCH_NCCL_ASYNC_ERROR_HANDLING` decides what it does: abort the communicator and bring the process
#   down (rather than hang with the GPU busy). `TORCH_NCCL_BLOCKING_WAIT=1` makes the waiting call itself raise
#   instead. `TORCH_NCCL_DUMP_ON_TIMEOUT=1` with `TORCH_NCCL_TRACE_BUFFER_SIZE` keeps a record of the last
#   collectives of each rank (the flight recorder) to find which rank never arrived; `NCCL_DEBUG=INFO` logs what
#   NCCL set up, and `TORCH_DISTRIBUTED_DEBUG=DETAIL` checks that the ranks call the same collectives.
# * **Engines.** vLLM does not continue with a missing rank: a tensor-parallel group is one model, and a dead
#   worker takes the engine down. Recovery is a restart of the whole instance (by Kubernetes, Ray Serve or a
#   systemd unit), with the other replicas (data parallelism) serving meanwhile: another reason to run replicas.
# * **Across nodes** the same holds, with an agent per node: the next section launches two "nodes" with
#   `torchrun` and makes one of them fail.

# %% [markdown]
# ## Across nodes: `torchrun --nnodes=2`, two nodes on this machine
# A job on several machines starts one **agent** per node: the agent starts that node's workers, and the agents
# meet at a **rendezvous** to agree on who is who. `torchrun` (`python -m torch.distributed.run`) is that agent.
# Below, two agents on this machine play two nodes with `--nproc-per-node` workers each, and run a small script:
# join one gloo group, `all_reduce` each rank's `RANK + 1`, and write down what torchrun told the worker.
#
# A rendezvous is a TCP service, and torchrun's defaults listen on every interface. The course's rule (nothing
# listens beyond 127.0.0.1) takes four settings, each read in torch's code:
# * **The rendezvous store is the notebook's.** With `--rdzv-backend=c10d` an agent normally hosts a TCPStore at
#   `--rdzv-endpoint`. `--rdzv-conf is_host=false` makes both agents clients of it (`_create_tcp_store`,
#   torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py), and the notebook hosts it with
#   `loopback_store()` from above: on a socket it bound to 127.0.0.1.
# * **No second store in an agent.** Once the rendezvous is done, the agent of group rank 0 starts *another*
#   TCPStore for its workers to share (`DynamicRendezvousHandler.next_rendezvous` and `_create_tcp_store_server`,
#   dynamic_rendezvous.py): a plain `TCPStore(is_master=True)`, on every interface, with no way to hand it a socket.
#   `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1` turns it off: the agent then only picks a free port
#   (`RendezvousStoreInfo.build`, rendezvous/api.py) and passes it to the workers as `MASTER_PORT`.
# * **The workers' store on loopback too.** With `init_process_group(init_method="env://")` rank 0 would bind
#   `MASTER_PORT` on every interface (`_create_c10d_store`, torch/distributed/rendezvous.py). The script binds it on
#   `MASTER_ADDR` itself and hands the socket over (`master_listen_fd`), as `loopback_store()` does.
#   `--local-addr 127.0.0.1` makes `MASTER_ADDR` 127.0.0.1 instead of this machine's hostname (torch/distributed/
#   run.py, passed on to `RendezvousStoreInfo.build`).
# * **gloo on `lo`**: `GLOO_SOCKET_IFNAME=lo`, as for the ranks above.
#
# Then the check, not a promise: every 50 ms while the launch runs, the notebook lists every process of it (the
# agents and all below them: torchrun starts each worker in a session of its own, so a process group would miss
# them) and the TCP sockets each one listens on, and it stops the launch at once if one is beyond loopback. Each
# worker waits after its `all_reduce` until the notebook has looked with every rank alive. Every process of the
# launch is stopped at the end, also when the cell fails; if the notebook's process itself dies, the kernel
# stops the agents (`prctl(PR_SET_PDEATHSIG)`), and each worker dies with its agent the same way.


# %% tags=["contract"]
import contextlib  # noqa: E402, F811 - the contract cell carries its own imports
import ctypes  # noqa: E402
import ipaddress  # noqa: E402
import json  # noqa: E402, F811
import os  # noqa: E402, F811
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402, F811
from pathlib import Path  # noqa: E402, F811

import psutil  # noqa: E402, F811

PR_SET_PDEATHSIG = 1  # prctl's option (linux/prctl.h): a signal the kernel sends when our parent dies
LIBC = ctypes.CDLL(None)  # opened here: between fork and exec (below) the new process only calls into it

# The script each worker runs. The environment variables are what torchrun's agent sets for every worker
# (`LocalElasticAgent._start_workers`, torch/distributed/elastic/agent/server/local_elastic_agent.py).
NODE_SCRIPT = '''"""One worker of a torchrun launch: join the gloo group, all_reduce, write what this rank saw."""
import ctypes, datetime, json, os, signal, socket, sys, time
from pathlib import Path

ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the kernel kills this worker if its agent dies

import torch
import torch.distributed as dist

folder, timeout_s = Path(sys.argv[1]), float(sys.argv[2])
names = ("GROUP_RANK", "LOCAL_RANK", "RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
record = {"node": int(os.environ["L17_NODE"]), "pid": os.getpid(), **{k: os.environ[k] for k in names}}
rank, world = int(record["RANK"]), int(record["WORLD_SIZE"])
try:
    addr, port = record["MASTER_ADDR"], int(record["MASTER_PORT"])
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:  # env:// would bind MASTER_PORT on every interface: bind it on MASTER_ADDR (127.0.0.1) ourselves
        listener = socket.create_server((addr, port))
        store = dist.TCPStore(addr, port, world, is_master=True, timeout=timeout, master_listen_fd=listener.detach())
    else:
        store = dist.TCPStore(addr, port, world, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    if rank == int(os.environ["L17_FAIL_RANK"]):
        raise RuntimeError(f"rank {rank} fails on purpose, before its all_reduce")
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)  # 1 + 2 + ... + WORLD_SIZE, on every rank
    record["all_reduce"] = total.item()
except Exception as error:
    record.update(error=f"{type(error).__name__}: {error}", at=time.time())
    raise
finally:
    (folder / f"rank{rank}.json").write_text(json.dumps(record))
deadline = time.monotonic() + timeout_s  # every rank alive until the notebook has looked at their sockets
while not (folder / "release").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
dist.destroy_process_group()
'''


def on_loopback(ip):
    """127.0.0.0/8 and ::1 (also an IPv4 loopback address written as IPv6, ::ffff:127.0.0.1)."""
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


class LaunchWatch:
    """Every process of a launch, and the TCP addresses they listen on: the agents and all their descendants.
    torchrun starts each worker in a session of its own (`start_new_session=True`, `SubprocessHandler._popen`,
    torch/distributed/elastic/multiprocessing/subprocess_handler/subprocess_handler.py), so a process group would
    miss them; psutil's `children()` follows the parent links instead."""

    def __init__(self):
        self.agents, self.seen, self.listening, self.samples = [], {}, {}, 0  # seen: pid -> psutil.Process

    def processes(self):
        """The processes of the launch now (each is remembered, to be stopped at the end)."""
        now = []
        for agent in self.agents:
            with contextlib.suppress(psutil.NoSuchProcess):
                now += [agent, *agent.children(recursive=True)]
        self.seen.update((p.pid, p) for p in now)
        return now

    def sample(self):
        for p in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):  # exited meanwhile
                for c in p.net_connections("tcp"):
                    if c.status == psutil.CONN_LISTEN:
                        self.listening.setdefault((c.laddr.ip, c.laddr.port), set()).add(p.pid)
        self.samples += 1

    def beyond_loopback(self):
        return {f"{ip}:{port}": sorted(pids) for (ip, port), pids in self.listening.items() if not on_loopback(ip)}

    def stop(self, grace_s=3.0):
        """SIGTERM to every process of the launch still running, SIGKILL after `grace_s` (psutil checks that a pid
        still names the process it saw, not a new one that got the same number)."""
        self.processes()
        alive = [p for p in self.seen.values() if p.is_running()]
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.terminate()
        _, alive = psutil.wait_procs(alive, timeout=grace_s)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=grace_s)


def torchrun_nodes(folder, *, nodes=2, nproc=1, fail_rank=-1, timeout_s=60.0, grace_s=10.0, script=NODE_SCRIPT):
    """Start `nodes` torchrun agents on this machine, one per "node", that meet at a rendezvous store this process
    holds on 127.0.0.1, and run `script` (written to `folder`) in `nproc` workers each. Waits at most `timeout_s`,
    and at most `grace_s` for the other agents once one has failed; every process of the launch is stopped on the
    way out, whatever happened. `fail_rank`: that rank raises before its all_reduce.

    Returns what each rank wrote, each agent's exit code and exit time, and what the launch listened on."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "node_script.py").write_text(script)
    store, port = loopback_store(timeout_s)  # the rendezvous, in this process, on 127.0.0.1 only
    store_listens = [a for a in listening(os.getpid()) if a.endswith(f":{port}")]
    env = {
        **os.environ,
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # no TCPStore of the agent's own (see above)
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "L17_FAIL_RANK": str(fail_rank),
    }
    notebook = os.getpid()

    def die_with_notebook():  # runs in the new process, before torchrun: SIGTERM to it when this process dies
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != notebook:  # died already, before the prctl
            os._exit(1)

    watch, agents, exited, start = LaunchWatch(), [], {}, time.time()
    try:
        for node in range(nodes):
            command = [
                sys.executable, "-m", "torch.distributed.run",  # = torchrun
                f"--nnodes={nodes}", f"--node-rank={node}", f"--nproc-per-node={nproc}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-conf=is_host=false",
                "--local-addr=127.0.0.1", "--max-restarts=0",
                f"--log-dir={folder}/node{node}_workers", "--redirects=3",  # each worker's output to its own files
                str(folder / "node_script.py"), str(folder), str(timeout_s),
            ]  # fmt: skip
            with open(folder / f"node{node}.log", "w") as log:  # the agent's own output
                agent = subprocess.Popen(
                    command,
                    env={**env, "L17_NODE": str(node)},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_notebook,
                )
            agents.append(agent)
            watch.agents.append(psutil.Process(agent.pid))
        while len(exited) < nodes:
            failed = [exited[n] for n in exited if agents[n].returncode]
            if failed and time.time() - min(failed) > grace_s:
                break  # a node failed and the others still run: they are stopped below
            if time.time() - start > timeout_s:
                logs = sorted(folder.glob("node*.log"))
                tails = "".join(f"\n{log.name}: {log.read_text()[-800:]}" for log in logs)
                raise TimeoutError(f"the launch ran past {timeout_s:.0f} s; the agents' logs end:{tails}")
            everyone = len(list(folder.glob("rank*.json"))) == nodes * nproc  # every rank has reported and waits
            watch.sample()
            if beyond := watch.beyond_loopback():
                raise RuntimeError(f"a process of the launch listens beyond loopback: {beyond}; the launch is stopped")
            if everyone:
                (folder / "release").touch()  # the sample above saw every rank alive: they may finish
            for node, agent in enumerate(agents):
                if node not in exited and agent.poll() is not None:
                    exited[node] = time.time()
            time.sleep(0.05)
    finally:
        ended = time.time()
        watch.stop()
        del store  # the rendezvous store closes its socket
    ranks = sorted((json.loads(f.read_text()) for f in folder.glob("rank*.json")), key=lambda r: int(r["RANK"]))
    workers = {int(r["pid"]) for r in ranks}
    return {
        "world": nodes * nproc,
        "ranks": ranks,
        "agents": [
            {"node": n, "pid": a.pid, "exit_code": a.returncode if n in exited else None, "exited_at": exited.get(n)}
            for n, a in enumerate(agents)
        ],  # exit_code None: still running `grace_s` after another node failed, stopped by the notebook
        "grace_s": grace_s,
        "seconds": ended - start,
        "store": store_listens,
        "listening": sorted(f"{ip}:{port}" for ip, port in watch.listening),
        "beyond_loopback": watch.beyond_loopback(),
        "workers_seen_listening": workers <= set().union(*watch.listening.values()),
        "processes": len(watch.seen),
        "samples": watch.samples,
        "logs": {n: (folder / f"node{n}.log").read_text() for n in range(nodes)},
        "worker_logs": {
            n: "".join(f.read_text() for f in sorted(folder.glob(f"node{n}_workers/**/std*.log"))) for n in range(nodes)
        },  # fmt: skip
    }


def failure_report(run):
    """Which rank failed first and with what message, what the others saw, and when each agent stopped."""
    errors = sorted((r for r in run["ranks"] if "error" in r), key=lambda r: r["at"])
    lines = []
    for i, r in enumerate(errors):
        after = f", {r['at'] - errors[0]['at']:.2f} s later" if i else ""
        which = f"rank {r['RANK']} (GROUP_RANK {r['GROUP_RANK']}{after})"
        lines.append(f"{'first' if i == 0 else 'then'}: {which}: {r['error']}")
    silent = sorted(set(range(run["world"])) - {int(r["RANK"]) for r in run["ranks"]})
    if silent:
        lines.append(f"ranks {silent} wrote no record: stopped, or failed before they could")
    for a in run["agents"]:
        if a["exit_code"] is None:
            lines.append(f"agent started with --node-rank={a['node']}: still running {run['grace_s']:.0f} s after "
                         "another node failed: stopped by the notebook")  # fmt: skip
            continue
        since = f", {a['exited_at'] - errors[0]['at']:.2f} s after the first error" if errors else ""
        lines.append(f"agent started with --node-rank={a['node']}: exit code {a['exit_code']}{since}")
        if a["exit_code"] and not any(r["node"] == a["node"] for r in errors):  # a worker died without a record
            said = run["worker_logs"][a["node"]].splitlines() or run["logs"][a["node"]].splitlines()
            lines.append("  its workers' output ends: " + " | ".join(said[-3:]))
    return "\n".join(lines)


# %% [markdown]
# The launch: two agents, `--nproc-per-node` workers each, one script. Each row is what one worker was told.

# %%
NPROC = cu.pick(full=2, smoke=1)  # workers per node
mn = torchrun_nodes(WORK / "torchrun", nproc=NPROC)
if any("error" in r for r in mn["ranks"]) or any(a["exit_code"] for a in mn["agents"]):
    raise RuntimeError("the launch failed:\n" + failure_report(mn))
views = pd.DataFrame(mn["ranks"]).set_index("RANK").rename(columns={"node": "--node-rank given"})
display(views.drop(columns=["pid"]))
want = mn["world"] * (mn["world"] + 1) / 2
assert all(r["all_reduce"] == want for r in mn["ranks"]), f"all_reduce: {[r['all_reduce'] for r in mn['ranks']]}"
print(
    f"✓ {mn['world']} workers on {len(mn['agents'])} nodes: all_reduce of RANK + 1 gave {want:.0f} on every rank; "
    f"the launch took {mn['seconds']:.1f} s"
)
assert all(
    int(r["RANK"]) == int(r["GROUP_RANK"]) * int(r["LOCAL_WORLD_SIZE"]) + int(r["LOCAL_RANK"]) for r in mn["ranks"]
), "RANK != GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK"
print("✓ on every worker: RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK")
for a in mn["agents"]:
    got = sorted({int(r["GROUP_RANK"]) for r in mn["ranks"] if r["node"] == a["node"]})
    print(f"The agent started with --node-rank={a['node']} (pid {a['pid']}): its workers got GROUP_RANK {got}")
by_pid = [a["node"] for a in sorted(mn["agents"], key=lambda a: a["pid"])]
group_of = {r["node"]: int(r["GROUP_RANK"]) for r in mn["ranks"]}
print(f"Group ranks in the order of the agents' pids: {[group_of[n] for n in by_pid]}")
said = [line.split("] ")[-1] for log in mn["logs"].values() for line in log.splitlines() if "node_rank is" in line]
print(f"torchrun's log: {said[0] if said else '(nothing about --node-rank)'}")
print(
    f"{mn['processes']} processes of the launch, {mn['samples']} looks at their sockets. They listened on "
    f"{mn['listening']}; beyond loopback: {mn['beyond_loopback'] or 'nothing'}. The rendezvous store (this "
    f"process) listened on {mn['store']}."
)
assert not mn["beyond_loopback"] and mn["workers_seen_listening"], "a worker was never seen, or beyond loopback"
pids = [a["pid"] for a in mn["agents"]] + [r["pid"] for r in mn["ranks"]]
left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
print(f"Processes of the launch left running: {left or 'none'}")

# %% [markdown]
# The c10d rendezvous does not use `--node-rank` (torch warns, above): it numbers the nodes itself once they have
# all joined, in the order of their descriptions, sorted by address and then the agent's process id
# (`_mark_rendezvous_complete` and `_NodeDesc`, dynamic_rendezvous.py). Here both addresses are 127.0.0.1, so the
# agents' process ids decide (printed above). Then `RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK`, and every worker
# found rank 0's store at `MASTER_ADDR:MASTER_PORT`. A script that needs a fixed place per node reads
# `GROUP_RANK`, not the flag; `--rdzv-backend=static` is the launcher that obeys `--node-rank`, and there node
# 0's agent hosts the store itself, a `TCPStore` on every interface (torch/distributed/elastic/rendezvous/
# static_tcp_rendezvous.py).
#
# ### One node's worker fails
# The same launch with the last rank raising before its `all_reduce` (`--max-restarts=0`: torchrun does not start
# the group again). The other ranks wait in the `all_reduce`; gloo sees the failed rank's connections close.

# %%
failed = torchrun_nodes(WORK / "torchrun_fail", nproc=NPROC, fail_rank=2 * NPROC - 1)
print(failure_report(failed))
first = min((r for r in failed["ranks"] if "error" in r), key=lambda r: r["at"])
assert first["RANK"] == str(2 * NPROC - 1) and "on purpose" in first["error"], failure_report(failed)
assert all(a["exit_code"] != 0 for a in failed["agents"]), "an agent reported success"
assert not failed["beyond_loopback"], failed["beyond_loopback"]

# %% [markdown]
# **vLLM's multi-node flags, against this launch.** With `--distributed-executor-backend mp` the same `vllm serve`
# command runs on every node, with its own place in the job (`ParallelConfig.nnodes`, `node_rank`, `master_addr`,
# `master_port` in vllm/config/parallel.py, "for multi-node distributed inference when distributed_executor_backend
# is mp"; each flag below is in vLLM 0.33.0's parser, checked by tests/gpu_contract/test_l17_engines.py):
#
# * **how many nodes**: torchrun `--nnodes 2`; vLLM `--nnodes 2`.
# * **this node's place**: torchrun's `--node-rank` is ignored by the c10d rendezvous, which numbers the nodes
#   itself (`GROUP_RANK`), and obeyed by `--rdzv-backend=static`; vLLM's `--node-rank R` is obeyed, node 0 is the
#   head.
# * **where the nodes meet**: torchrun's `--rdzv-endpoint` (here the notebook's store), then rank 0's
#   `MASTER_ADDR:MASTER_PORT` for the process group; vLLM's `--master-addr` and `--master-port`, the head node's
#   address for torch.distributed's process group.
# * **what each node runs**: torchrun, an agent and its `--nproc-per-node` workers, the same script on every node;
#   vLLM, on node 0 the server with its API, on nodes R > 0 `--headless`: workers only, no API server
#   (`run_headless`, vllm/entrypoints/cli/serve.py).
#
# On a real cluster these addresses must be reachable from every node: they listen beyond loopback by design, and
# their ports belong behind the cluster's firewall. Here the check above watched them while the launch ran.

# %% [markdown]
# ## At scale: vLLM, Ray Serve LLM, Triton's vLLM backend
# **vLLM** does all three splits with one flag each: `--tensor-parallel-size` (our column/row-parallel layers,
# on NCCL, inside a node with NVLink), `--pipeline-parallel-size` (stages, across nodes or slow links),
# `--data-parallel-size` (replicas behind vLLM's own front end). `--distributed-executor-backend mp` starts the
# ranks as local processes (as we did), `ray` across machines. The command lines below were checked against
# vLLM 0.33.0's own argument parsers (`tests/gpu_contract/test_l17_engines.py`, with the flag list lesson 16 uses).


# %% tags=["contract"]
def vllm_parallel_command(model_dir, port, *, tp=1, pp=1, dp=1, backend="mp"):
    """`vllm serve` for one model split tp x pp ways, in dp replicas, on 127.0.0.1."""
    return [
        "vllm",
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(tp),
        "--pipeline-parallel-size",
        str(pp),
        "--data-parallel-size",
        str(dp),
        "--distributed-executor-backend",
        backend,
        "--gpu-memory-utilization",
        "0.9",
    ]


def ray_llm_config(model_dir, *, tp, pp, min_replicas, max_replicas, accelerator="H100"):
    """A Ray Serve LLM deployment (the `llm_configs` entry of `ray.serve.llm.build_openai_app`)."""
    return {
        "model_loading_config": {"model_id": "smollm2-135m", "model_source": str(model_dir)},
        "engine_kwargs": {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "max_num_seqs": 64},
        "deployment_config": {
            "autoscaling_config": {
                "min_replicas": min_replicas,
                "max_replicas": max_replicas,
                "target_ongoing_requests": 32,
            }
        },
        "accelerator_type": accelerator,
    }


def triton_vllm_model(model_dir, *, tp):
    """Triton's vLLM backend: a model folder's `config.pbtxt` and `1/model.json` (vLLM's engine arguments)."""
    config = 'backend: "vllm"\ninstance_group [\n  {\n    count: 1\n    kind: KIND_MODEL\n  }\n]\n'
    engine = {"model": str(model_dir), "tensor_parallel_size": tp, "gpu_memory_utilization": 0.9, "max_num_seqs": 64}
    return config, engine


# %%
from google.protobuf import text_format  # noqa: E402
from tritonclient.grpc import model_config_pb2  # noqa: E402

print(" ".join(vllm_parallel_command("<model folder>", 8017, tp=2)), "   # one replica over 2 NVLink GPUs")
print(" ".join(vllm_parallel_command("<model folder>", 8017, tp=8, pp=2, backend="ray")), "   # 2 nodes x 8 GPUs")
print(" ".join(vllm_parallel_command("<model folder>", 8017, dp=4)), "   # 4 replicas, one GPU each")
ray_app = {
    "applications": [
        {
            "name": "llm",
            "route_prefix": "/",
            "import_path": "ray.serve.llm:build_openai_app",
            "args": {"llm_configs": [ray_llm_config("<model folder>", tp=2, pp=1, min_replicas=1, max_replicas=4)]},
        }
    ]
}
print("Ray Serve (serve run config.yaml):\n" + json.dumps(ray_app, indent=1)[:600])
pbtxt, engine_args = triton_vllm_model("<model folder>", tp=2)
parsed = text_format.Parse(pbtxt, model_config_pb2.ModelConfig())  # Triton's own parser: a typo fails here
print(
    f"Triton's parser read backend={parsed.backend!r}, {len(parsed.instance_group)} instance group "
    f"(KIND_MODEL: vLLM places its own {engine_args['tensor_parallel_size']} GPUs); model.json: {engine_args}"
)

# %% [markdown]
# Ray (2.60) does not start in this course's tests: its head contacts cloud metadata addresses on every start.
# Its `LLMConfig` was validated offline against Ray's own pydantic model (field names in
# `tests/gpu_contract/ray_2_60_llm_config.json`, checked by the test); the engine arguments inside it and in
# Triton's `model.json` are vLLM's, checked against vLLM's parser.
#
# **Disaggregated prefill** (vLLM `--kv-transfer-config`, NVIDIA Dynamo, llm-d) runs prefill and decode in
# different instances and ships the KV cache between them. vLLM's own documentation says what it is for:
# tuning time-to-first-token and inter-token latency *separately* (a prefill no longer stalls the decode steps
# of other requests, lesson 16's ITL spike), and controlling tail ITL; and, in its words, it "DOES NOT improve
# throughput". It is a latency tool for long prompts under load, paid for with a KV transfer per request.

# %% [markdown]
# ## On a GPU: the same code on NCCL
# With CUDA GPUs the ranks use the **NCCL** backend and one GPU each (`torch.cuda.set_device(rank)`): the very
# functions above, their tensors on `cuda:rank`. NCCL puts one rank on one GPU (two ranks on one GPU fail with
# "Duplicate GPU detected"), so the section runs every split up to the number of GPUs present.

# %%
if cu.gpu_section("17.nccl-tp", why="Tensor parallelism on NCCL needs CUDA GPUs, one rank per GPU."):
    import copy

    n_gpu = torch.cuda.device_count()
    g_sizes = [p for p in (1, 2, 3) if p <= n_gpu]
    g_model = copy.deepcopy(tp_model).to("cuda")  # a copy: tp_model stays on the CPU for the rest
    ids = torch.tensor([PROMPT], device="cuda")
    with torch.inference_mode():
        g_ref = g_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N_CHECK, do_sample=False)
    g_ref = g_ref[0, len(PROMPT) :].tolist()
    with l17.World(max(g_sizes), backend="nccl") as G:
        G.run(l17.load_shards, path=str(tp_path), shape=l17.shape_of(cfg), sizes=g_sizes, name="split")
        for p in g_sizes:
            g_runs = G.run(l17.tp_generate, ranks=range(p), name="split", p=p, prompt=PROMPT, n_new=N_CHECK)
            assert all(r["tokens"][: len(g_ref)] == g_ref for r in g_runs), f"NCCL, {p} GPUs: tokens differ"
            r0 = g_runs[0]
            print(
                f"✓ NCCL, {p} GPU(s): tokens == generate on the GPU; decode step "
                f"{np.median(r0['step_ms'][1:]):.2f} ms, of which collectives {np.median(r0['comm_ms'][1:]):.2f} ms"
            )
    if n_gpu < 2:
        print(f"This machine has {n_gpu} GPU: the 2- and 3-way splits need as many GPUs.")
else:
    cu.results.show_reference("17", "NCCL")

# %% [markdown]
# ## Which split, when: a decision table from this run's numbers

# %%
tp2 = tp_cmp.ratio("2 ranks")
nv = gpu_model[(gpu_model["case"] == "70B prefill, 4096 tokens") & (gpu_model["GPUs"] == 8)].set_index("link")
decision = pd.DataFrame(
    [
        {
            "split": "replicas (data parallel)",
            "when": "the model fits one device; traffic grows",
            "communication": "none per token; a router per request",
            "measured here": f"least-outstanding vs round-robin: {dp_ratio.interval_text} (mean latency)",
        },
        {
            "split": "tensor parallel",
            "when": "the model does not fit one device, or one request's latency must drop; "
            "GPUs joined by NVLink (within a node)",
            "communication": f"{calls:.0f} collectives per step ({2 * cfg.num_hidden_layers} all-reduces + 1 gather)",
            "measured here": f"2 ranks vs 1: {tp2.interval_text}; collectives {split.loc[2, 'comm_%']:.0f}% of a step; "
            f"70B prefill on 8 GPUs (model): comm {nv.iloc[0]['comm_ms']:.0f} ms on NVLink, "
            f"{nv.iloc[1]['comm_ms']:.0f} ms on PCIe",
        },
        {
            "split": "pipeline parallel",
            "when": "the model spans nodes or slow links; throughput matters more than one request's latency",
            "communication": "one send per stage boundary per micro-batch",
            "measured here": ", ".join(
                f"m={m}: bubble {pp_table.loc[m, 'measured']:.0%} (formula {pp_table.loc[m, 'formula']:.0%})"
                for m in MICRO
            ),
        },
    ]
)
with pd.option_context("display.max_colwidth", 200):
    display(decision)

# %% [markdown]
# ## What surprised us
# Printed from this run:

# %%
print(f"* torch's TCP store, handed a socket bound to 127.0.0.1, listened on {store_addrs} only.")
print(
    f"* 2 ranks vs 1 rank: {tp2.interval_text}; 1 rank with 2 threads vs 1 rank: "
    f"{tp_cmp.ratio('1 rank, 2 threads').interval_text}. On one CPU, ranks and threads share the same cores."
)
print(
    f"* 3 ranks on {CORES} cores: {tp_cmp.ratio('3 ranks').interval_text} vs 1 rank; the collectives took "
    f"{split.loc[3, 'comm_%']:.0f}% of the step (2 ranks: {split.loc[2, 'comm_%']:.0f}%)."
)
print(
    f"* A 2.3 KB all-reduce cost {1000 * allreduce_ms(2, H_BYTES, gloo_fit[2]):.0f} µs on 2 gloo ranks: latency, "
    f"not bandwidth, sets the price of a decode step; {calls:.0f} of them per token."
)
pp_verdicts = ", ".join(f"m={m} {v}" for m, v in pp_table["within 20%"].items())
print(
    f"* The pipeline's bubble: {pp_table.loc[1, 'measured']:.0%} at m=1, {pp_table.loc[8, 'measured']:.0%} at m=8 "
    f"(the formula: {pp_table.loc[1, 'formula']:.0%} and {pp_table.loc[8, 'formula']:.0%}; within 20%: "
    f"{pp_verdicts})."
)

# %% [markdown]
# ## Exercises
# 1. **A row-parallel linear layer.** Write `row_parallel_linear(x, linear, group)`: `x` is the full input
#    `(..., in_features)` on every rank, `linear` an `nn.Linear` (every rank has all of it, with or without a
#    bias), `group` the process group of the ranks that share the layer. Compute `linear(x)` row-parallel: this
#    rank (`dist.get_rank(group)` of `dist.get_world_size(group)`) takes its contiguous block of
#    `in_features // world_size` input features (the same block of `x`'s last dimension and of the weight),
#    computes its partial output, combines the partial outputs with one collective over `group`, and
#    adds the bias exactly once. Return the full output on every rank. The check runs your function on 2 and
#    3 gloo ranks (fresh processes: write it self-contained, using `torch`, `dist` and `F` only) against the full
#    layer, with random shapes.


# %%
def row_parallel_linear(x, linear, group):
    raise NotImplementedError  # your code here


cu.exercises.check("17.row-parallel", row_parallel_linear)

# %% [markdown]
# 2. **Three stages.** Run `pp_forward` with `p=3` (the world has 3 ranks; 30 layers split 10/10/10 in full
#    mode) at m = 1, 4, 8 and compare the measured bubble with `(p - 1) / (m + p - 1)`. On a 2-core machine the
#    third stage shares a core: which way does the measurement move, and why?
#
# ## Summary
# Rows for this machine's results.

# %%
for p in (2, 3):
    r = tp_cmp.ratio(f"{p} ranks")
    cu.record(
        "17",
        f"tensor parallel, {p} gloo ranks",
        model="SmolLM2-shaped, 18/6 heads",
        device="cpu",
        dtype="fp32",
        batch_size=1,
        median_ms=split.loc[p, "step_ms"],
        speedup_vs_baseline=r.estimate,
        notes=f"vs 1 rank: {r.interval_text}; collectives {split.loc[p, 'comm_%']:.0f}% of a step; "
        f"model/measured {model_ratio[p].interval_text}",
    )
for m in MICRO:
    cu.record(
        "17",
        f"pipeline, {P_STAGES} stages, m={m}",
        model="SmolLM2-shaped",
        device="cpu",
        dtype="fp32",
        batch_size=PP_BATCH,
        notes=f"bubble {pp_table.loc[m, 'measured']:.3f}, formula {pp_table.loc[m, 'formula']:.3f}",
    )
cu.record(
    "17",
    "replicas: least-outstanding vs round-robin",
    model="SmolLM2-shaped, 18/6 heads",
    device="cpu",
    dtype="fp32",
    speedup_vs_baseline=dp_ratio.estimate,
    notes=f"mean latency, {N_LOAD} Poisson requests at {RATE:.1f}/s: {dp_ratio.interval_text}",
)

# %%
pids = list(W.pids)
world.close()  # every rank leaves the group and exits
shutil.rmtree(WORK, ignore_errors=True)
alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
print(f"Ranks stopped; processes left: {alive or 'none'}.")
