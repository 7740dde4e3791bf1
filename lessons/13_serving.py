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
# **Goals.** Serve a model over HTTP on a real server (LitServe), put it under load, and measure what
# server-side *dynamic batching* does to throughput and tail latency: requests from independent clients
# are held for a few milliseconds and run through the model together. You will
# * start and stop a server safely (its own process group, loopback only, always shut down),
# * check that served answers equal the model's direct output, and that bad requests get a clear 4xx
#   without hurting the requests batched with them,
# * measure throughput and p50/p90/p99 latency with and without batching across client concurrency, and
#   find where batching starts to pay, from this run's data,
# * compare with the model's own in-process batch curve (lesson 03) to see what HTTP costs,
# * write a Triton Inference Server model repository for cluster scale, and see Ray Serve's batching.
#
# **The bottleneck it attacks.** Small batches (see *01 · Measuring inference*, the taxonomy: launch- and
# framework-overhead-bound work). One request is one image: run alone, the model is mostly fixed cost per
# call. Batching shares that cost, but on a server it can only batch what is *waiting*, so it helps only
# when requests queue up, and only if the model (not HTTP) is the slow part.

# %%
import course_utils as cu

device = cu.lesson.start("13", "Serving with dynamic batching")

# %%
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from course_utils import serving as sv
from course_utils import triton as tr

MODEL = "cnn"  # the digits CNN; "resnet18" (3x32x32, random weights) is a heavier choice
SHAPE = sv.expected_shape(MODEL)
THREADS = 1  # torch threads in the server's model worker (the HTTP process and the load generator share the CPU)
CONCURRENCY = cu.pick(full=[1, 2, 4, 8, 16, 32, 64], smoke=[1, 8])
N_REQUESTS = cu.pick(full=400, smoke=40)  # per concurrency level (bounded by MAX_SECONDS too)
MAX_SECONDS = cu.pick(full=10.0, smoke=4.0)
SETTINGS = cu.pick(
    full=[("no batching", 1, 0.0), ("batch<=32, wait 5 ms", 32, 0.005), ("batch<=32, wait 20 ms", 32, 0.020)],
    smoke=[("no batching", 1, 0.0), ("batch<=32, wait 5 ms", 32, 0.005)],
)
rng = np.random.default_rng(0)
bodies = [sv.make_payload(rng.random(SHAPE, dtype=np.float32)) for _ in range(16)]
print(f"Model {MODEL}, input {SHAPE}; concurrency levels {CONCURRENCY}; settings {[s[0] for s in SETTINGS]}")

# %% [markdown]
# ## Baseline: the model in-process
# First the model alone, no server: latency and throughput against batch size with `cu.sweep.batch_sweep`,
# using the same number of torch threads as the server's worker. This is the ceiling a server can approach
# if HTTP cost nothing, and it shows how much batching can give at most.

# %%
if MODEL == "cnn":
    model = cu.models.load_digits_model("cnn")
else:
    model, note = cu.models.resnet(MODEL)
    print(note)
threads_before = torch.get_num_threads()
torch.set_num_threads(THREADS)
try:
    inproc = cu.sweep.batch_sweep(
        model, lambda b: torch.rand(b, *SHAPE), [c for c in CONCURRENCY], device="cpu",
        min_time_s=cu.pick(full=0.5, smoke=0.05),
    )  # fmt: skip
finally:
    torch.set_num_threads(threads_before)
inproc[["batch_size", "median_ms", "ms_per_item", "throughput"]]

# %%
ms_item_1 = float(inproc.loc[inproc["batch_size"] == 1, "ms_per_item"].iloc[0])
best = inproc.loc[inproc["throughput"].idxmax()]
print(
    f"In-process: {ms_item_1:.3f} ms per item at batch 1, {best['ms_per_item']:.3f} ms per item at batch "
    f"{int(best['batch_size'])}: batching alone could give at most {ms_item_1 / best['ms_per_item']:.2f}x here."
)

# %% [markdown]
# ## The server
# `cu.serving.serve(...)` starts `python -m course_utils.serving` as a subprocess **in its own process
# group**, bound to 127.0.0.1 on a free port, and waits (bounded) for `/health`. LitServe runs an HTTP
# process (FastAPI + uvicorn) and a separate model worker; the HTTP process puts requests on a queue and
# the worker takes up to `max_batch_size` of them, waiting at most `batch_timeout` seconds for the batch
# to fill. On exit, also after an error, `serve` sends SIGTERM (then SIGKILL) to the **whole group** and
# checks that no process and no listening port is left: signalling only the main process leaves its
# workers alive and the port taken. A server lives inside one cell's `with` block, so a failing cell
# cannot leave it running.
#
# The cell below checks three things on one server:
# * **correctness first**: served answers equal the model's direct output (fp32 tolerance from
#   `cu.compare`), for both request formats (a JSON nested list, or raw float32 bytes in base64);
# * **bad requests get a clear 4xx**: validation runs in the HTTP process, *before* the batch queue (a
#   pydantic request model whose validator checks shape, dtype, JSON and base64, and a size limit in front
#   of everything); each message names what to send instead;
# * **a bad request does not hurt its batch-mates**: eight concurrent requests, one of them bad.

# %%
x_check = torch.rand(8, *SHAPE)
with torch.inference_mode():
    ref = model(x_check)
bad = {
    "wrong shape": json.dumps({"inputs": [[1.0, 2.0]]}).encode(),
    "wrong dtype (strings)": json.dumps({"inputs": [[["a"] * SHAPE[-1]] * SHAPE[-2]] * SHAPE[0]}).encode(),
    "dtype float16": json.dumps({"b64": "AAAA", "dtype": "float16"}).encode(),
    "malformed JSON": b'{"inputs": [1, 2',
    "malformed base64": json.dumps({"b64": "@@@"}).encode(),
    "oversized payload": b"[" + b"0," * 200_000 + b"0]",
}
mixed = bodies[:4] + [bad["wrong shape"]] + bodies[4:7]
t0 = time.perf_counter()
with sv.serve(MODEL, max_batch_size=8, batch_timeout=0.2, threads=THREADS) as srv:
    start_s = time.perf_counter() - t0
    answers = sv.post_many(srv.predict_url, [sv.make_payload(x_check[i], fmt="json" if i % 2 else "b64")
                                             for i in range(len(x_check))])  # fmt: skip
    got = torch.tensor([a["logits"] for _, a in answers])
    print(cu.check_outputs(got, ref, "fp32", label="served vs direct"))
    print(
        f"Batches the server formed for these {len(x_check)} concurrent requests: "
        f"{srv.batch_stats()['batch_size'].tolist()}"
    )
    rows = []
    for name, body in bad.items():
        code, ans = sv.post(srv.predict_url, body)
        rows.append({"request": name, "status": code, "message": str(ans.get("detail", ans))[:120]})
    codes = [c for c, _ in sv.post_many(srv.predict_url, mixed)]
print(f"Server start to ready: {start_s:.1f} s (paid once, not per request).")
print(f"Eight concurrent requests, the fifth one bad: statuses {codes}")
assert sv.group_pids(srv.pgid) == [] and not sv.port_open(srv.port)
print(f"After the with-block: no process left in group {srv.pgid}, port {srv.port} closed.")
pd.DataFrame(rows)

# %% [markdown]
# ## Load: with and without dynamic batching
# The load generator (`cu.serving.run_load`, async httpx) runs `c` clients in a closed loop: each sends a
# request, waits for the answer, sends the next. It is bounded by a request count and by time, and refuses
# any host that is not this machine. For each batching setting we start a fresh server and sweep the
# concurrency. We also read the server's own log of model calls: how big the batches really were, and how
# much of the wall time the model was busy.

# %%
tables, batch_info = [], []
for label, max_bs, wait in SETTINGS:
    with sv.serve(MODEL, max_batch_size=max_bs, batch_timeout=wait, threads=THREADS) as srv:
        sv.run_load(srv.predict_url, bodies, n_requests=20, concurrency=4)  # warm-up, not counted
        for c in CONCURRENCY:
            seen = len(srv.batch_stats())
            res = sv.run_load(srv.predict_url, bodies, n_requests=max(N_REQUESTS, 4 * c), concurrency=c,
                              max_seconds=MAX_SECONDS)  # fmt: skip
            calls = srv.batch_stats(since=seen)
            tables.append({"server": label, **res.as_dict()})
            batch_info.append({"server": label, "concurrency": c, "mean_batch": calls["batch_size"].mean(),
                               "max_batch": calls["batch_size"].max(),
                               "model_busy_%": 100 * calls["predict_ms"].sum() / 1000 / res.wall_s})  # fmt: skip
load = pd.DataFrame(tables).merge(pd.DataFrame(batch_info), on=["server", "concurrency"])
load.round(2)

# %%
fig = sv.plot_latency_vs_throughput(load, inproc=inproc, title=f"{MODEL}: served with and without batching")

# %% [markdown]
# ## Where does batching start to pay?
# From the table: the smallest concurrency at which a batched setting beats the unbatched server, and the
# comparison at the highest concurrency (saturation). The course's target for this lesson is at least 2x
# the throughput with a lower p99 at saturation.

# %%
base_label = SETTINGS[0][0]
top = max(CONCURRENCY)
sat = load[load["concurrency"] == top].set_index("server")
summary = []
for label, _, _ in SETTINGS[1:]:
    pays = sv.batching_pays_at(load, batched=label, unbatched=base_label)
    ratio = sat.loc[label, "throughput"] / sat.loc[base_label, "throughput"]
    p99_ratio = sat.loc[label, "p99_ms"] / sat.loc[base_label, "p99_ms"]
    summary.append({"setting": label, "pays from concurrency": pays, f"throughput x at c={top}": ratio,
                    f"p99 x at c={top}": p99_ratio})  # fmt: skip
    where = f"from concurrency {pays} on" if pays is not None else "at no concurrency measured"
    print(
        f"'{label}' beats '{base_label}' {where}; at c={top} it gives {ratio:.2f}x the throughput "
        f"with {'a lower' if p99_ratio < 1 else 'a higher'} p99 ({p99_ratio:.2f}x)."
    )
summary = pd.DataFrame(summary)
peak = load.groupby("server", sort=False)["throughput"].max()
for label, _, _ in SETTINGS[1:]:
    print(
        f"Peak over all concurrencies: '{label}' {peak[label]:.0f} req/s vs '{base_label}' {peak[base_label]:.0f} "
        f"req/s ({peak[label] / peak[base_label]:.2f}x)."
    )
best_setting = summary.loc[summary[f"throughput x at c={top}"].idxmax()]
target_met = best_setting[f"throughput x at c={top}"] >= 2 and best_setting[f"p99 x at c={top}"] < 1
print(
    f"Target (>= 2x throughput, lower p99 at saturation): {'met' if target_met else 'missed'} "
    f"by '{best_setting['setting']}' with {best_setting[f'throughput x at c={top}']:.2f}x."
)
summary.round(2)

# %% [markdown]
# ## What HTTP costs: the server against the in-process curve
# At concurrency 1 nothing can be batched, so the time per request minus the model's own time (batch 1,
# in-process) is what the server, the JSON, the queues and the client add to every request. Compare it
# with the model time: batching can only shrink the model's share.

# %%
c1 = load[(load["server"] == base_label) & (load["concurrency"] == 1)].iloc[0]
per_request_ms = 1000 / c1["throughput"]
overhead = per_request_ms - ms_item_1
busy = load[load["server"] == base_label].set_index("concurrency")["model_busy_%"]
print(
    f"Unbatched, one client: {per_request_ms:.2f} ms per request, of which the model is {ms_item_1:.3f} ms; "
    f"{overhead:.2f} ms ({100 * overhead / per_request_ms:.0f}%) is HTTP, JSON, queues and the client."
)
print(
    f"At c={top} the unbatched model worker was busy {busy[top]:.0f}% of the time: "
    + (
        "the model is the bottleneck, so batching can help."
        if busy[top] > 60
        else "the model is NOT the bottleneck; the HTTP process and the client are, and batching cannot fix that."
    )
)
served_best = load["throughput"].max()
print(
    f"Best served throughput {served_best:.0f} req/s vs {best['throughput']:.0f} items/s in-process: "
    f"HTTP serving reaches {100 * served_best / best['throughput']:.0f}% of the model's own ceiling here."
)

# %% [markdown]
# ## What not to do: validate inside the batch
# LitServe calls `decode_request` inside the batch loop. If it raises for one request, LitServe fails
# **every request in that batch** with the same error. The naive server below validates there; eight
# concurrent requests with one bad one arrive as one batch. (Ray Serve's `@serve.batch` has the same
# property: validate before the batch.)

# %%
naive_codes: list[int] = []
if cu.pick(full=True, smoke=False):  # one more server start: full mode only
    with sv.serve(MODEL, max_batch_size=8, batch_timeout=0.2, threads=THREADS, validate="worker") as naive:
        naive_codes = [c for c, _ in sv.post_many(naive.predict_url, mixed)]
    print(
        f"Naive server, same eight requests: statuses {naive_codes}; "
        f"{sum(c != 200 for c in naive_codes) - 1} good requests failed because of one bad one."
    )
    print(f"Validated before the queue (above): statuses {codes}.")
else:
    print(
        "The naive server is started in full mode only (a server start costs seconds); tests/test_serving.py "
        "checks the validated server's behaviour."
    )

# %% [markdown]
# ## A heavier model
# Batching pays when the model's per-call cost is large against the per-request HTTP cost. In full mode we
# repeat the saturation measurement with ResNet-18 on 3x32x32 inputs (random weights: speed only).

# %%
HEAVY = cu.pick(full=["resnet18"], smoke=[])
heavy_rows = []
for heavy in HEAVY:
    hshape = sv.expected_shape(heavy)
    hbodies = [sv.make_payload(rng.random(hshape, dtype=np.float32)) for _ in range(8)]
    for label, max_bs, wait in [("no batching", 1, 0.0), ("batch<=32, wait 20 ms", 32, 0.020)]:
        with sv.serve(heavy, max_batch_size=max_bs, batch_timeout=wait, threads=THREADS) as hsrv:
            sv.run_load(hsrv.predict_url, hbodies, n_requests=8, concurrency=4)
            seen = len(hsrv.batch_stats())
            res = sv.run_load(hsrv.predict_url, hbodies, n_requests=200, concurrency=32, max_seconds=20)
            calls = hsrv.batch_stats(since=seen)
        heavy_rows.append({"model": heavy, "server": label, **res.as_dict(), "mean_batch": calls["batch_size"].mean(),
                           "model_busy_%": 100 * calls["predict_ms"].sum() / 1000 / res.wall_s})  # fmt: skip
heavy_df = pd.DataFrame(heavy_rows)
if len(heavy_df):
    h = heavy_df.set_index("server")
    hr = h.loc["batch<=32, wait 20 ms", "throughput"] / h.loc["no batching", "throughput"]
    hp = h.loc["batch<=32, wait 20 ms", "p99_ms"] / h.loc["no batching", "p99_ms"]
    print(
        f"ResNet-18 at c=32: batching gives {hr:.2f}x the throughput, p99 {hp:.2f}x "
        f"({'lower' if hp < 1 else 'higher'}); mean batch {h.loc['batch<=32, wait 20 ms', 'mean_batch']:.1f}."
    )
else:
    print("The heavier-model comparison runs in full mode only (it needs a few minutes of CPU).")
heavy_df.round(2)

# %% [markdown]
# ## On a GPU
# On a GPU the model call is cheap per item only in large batches, and a single request leaves the GPU
# mostly idle, so dynamic batching matters more there. The section serves the same model on CUDA with and
# without batching at a high concurrency. It has not yet been run on a GPU by the course unless reference
# results are shown below.

# %%
if cu.gpu_section("13.serve-gpu"):
    gpu_rows = []
    for label, max_bs, wait in [("no batching", 1, 0.0), ("batch<=64, wait 2 ms", 64, 0.002)]:
        with sv.serve("resnet18", max_batch_size=max_bs, batch_timeout=wait, device="cuda") as gsrv:
            gb = [sv.make_payload(rng.random(sv.expected_shape("resnet18"), dtype=np.float32)) for _ in range(8)]
            sv.run_load(gsrv.predict_url, gb, n_requests=50, concurrency=8)
            res = sv.run_load(gsrv.predict_url, gb, n_requests=2000, concurrency=64, max_seconds=30)
        gpu_rows.append({"server": label, **res.as_dict()})
        cu.record("13", f"served resnet18 {label}", model="resnet18", device="cuda", dtype="fp32",
                  median_ms=res.p50_ms, p90_ms=res.p90_ms, throughput=res.throughput,
                  notes=f"LitServe, concurrency 64, p99 {res.p99_ms:.2f} ms")  # fmt: skip
    gpu_df = pd.DataFrame(gpu_rows)
    print(f"GPU: batching gives {gpu_df['throughput'].iloc[1] / gpu_df['throughput'].iloc[0]:.2f}x the throughput.")
    display(gpu_df.round(2))
else:
    cu.results.show_reference("13", "served")

# %% [markdown]
# ## Cluster scale: a Triton Inference Server model repository
# NVIDIA Triton does the same server-side dynamic batching, in C++, for many models and GPUs. A model is a
# folder with `config.pbtxt` and a versioned model file. The config's `dynamic_batching` block holds the
# preferred batch sizes and the longest a request may wait in the queue (`max_queue_delay_microseconds`);
# `instance_group` sets how many copies of the model run, on CPU or GPU. We export the CNN to ONNX (dynamic
# batch), write the repository and validate the config with Triton's own protobuf classes.

# %%
repo = Path(tempfile.mkdtemp(prefix="triton_repo_"))
digits = cu.models.load_digits_model("cnn")
folder = tr.write_model_repository(repo, digits, torch.rand(4, 1, 8, 8), name="digits_cnn", max_batch_size=32,
                                   preferred_batch_sizes=(8, 16, 32), max_queue_delay_us=500,
                                   instance_count=1, kind="KIND_CPU")  # fmt: skip
print((folder / "config.pbtxt").read_text())
cfg = tr.validate_config(folder / "config.pbtxt")
print(
    f"Parsed by Triton's ModelConfig: max_batch_size={cfg.max_batch_size}, "
    f"preferred={list(cfg.dynamic_batching.preferred_batch_size)}, files: "
    f"{sorted(str(p.relative_to(repo)) for p in repo.rglob('*') if p.is_file())}"
)

# %% [markdown]
# The exported model must give the same answers as PyTorch before anyone serves it (fp32 tolerance), at a
# batch size other than the export's, since the batch dimension is dynamic:

# %%
import onnxruntime as ort

sess = ort.InferenceSession(str(folder / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
xb = torch.rand(13, 1, 8, 8)
with torch.inference_mode():
    print(cu.check_outputs(torch.from_numpy(sess.run(None, {cfg.input[0].name: xb.numpy()})[0]), digits(xb), "fp32",
                           label="ONNX (Triton repo) vs torch"))  # fmt: skip

# %% [markdown]
# Two mistakes the check catches: a misspelled field (the protobuf parser rejects it) and a preferred
# batch size above `max_batch_size` (the parser accepts it; Triton would refuse to load the model).

# %%
good_text = (folder / "config.pbtxt").read_text()
for name, text in {
    "misspelled field": good_text.replace("max_queue_delay_microseconds", "max_queue_delay_us"),
    "preferred size 64 > max 32": good_text.replace("preferred_batch_size: [ 8, 16, 32 ]",
                                                    "preferred_batch_size: [ 8, 16, 64 ]"),
}.items():  # fmt: skip
    try:
        tr.validate_config(text)
        print(f"{name}: not caught (unexpected)")
    except tr.TritonConfigError as exc:
        print(f"{name}: caught -> {str(exc)[:160]}")

# %% [markdown]
# To serve the repository, run Triton's container (Docker with the NVIDIA container toolkit; not run here,
# and it downloads a large image the first time), then query it with `tritonclient`. The code is shown,
# not executed; it has not been run by the course.

# %%
print(tr.docker_run_line(repo, gpus=True))
print()
ins, outs = tr.onnx_io(folder / "1" / "model.onnx")
print(tr.client_code("digits_cnn", ins, outs))

# %% [markdown]
# ## Ray Serve (opt-in)
# Ray Serve is the Python-native way to spread replicas over a cluster; `@serve.batch` gives the same
# dynamic batching on an async method. It is opt-in and never runs in the tests, for a reason you should
# know before you start it: **Ray's head process starts a usage-stats process that sends requests to cloud
# metadata addresses (169.254.169.254) on every start**, whatever `RAY_USAGE_STATS_ENABLED` says, and its
# internal ports listen on all interfaces. Starting Ray also takes tens of seconds and gigabytes of memory.
# Set `COURSE_RAY=1` (and `pip install "ray[serve]"`) to run it. Two settings matter: `max_ongoing_requests`
# (its default caps a batch at 5) and validating before the batch (an exception inside a `@serve.batch`
# method fails every request in that batch).

# %%
if cu.modes.opt_in_section(
    "13.ray-serve", "COURSE_RAY",
    why="Ray's head probes cloud metadata addresses (169.254.169.254) on every start and opens ports on all "
        "interfaces; the course does not do that on your machine without your say-so.",
):  # fmt: skip
    import ray
    from ray import serve

    @serve.deployment(max_ongoing_requests=64)
    class RayDigits:
        def __init__(self) -> None:
            torch.set_num_threads(THREADS)
            self.net = cu.models.load_digits_model("cnn")

        @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
        async def run(self, xs: list[np.ndarray]) -> list[dict]:
            with torch.inference_mode():
                out = self.net(torch.from_numpy(np.stack(xs)))
            return [{"label": int(o.argmax())} for o in out]

        async def __call__(self, request) -> dict:
            try:  # validate before the batch
                x = sv.validate_payload(await request.json(), SHAPE)
            except ValueError as exc:
                from starlette.responses import JSONResponse

                return JSONResponse({"detail": str(exc)}, status_code=422)
            return await self.run(x)

    ray_port = sv.free_port()
    ray.init(include_dashboard=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": ray_port})
        serve.run(RayDigits.bind(), route_prefix="/predict")
        ray_res = sv.run_load(f"http://127.0.0.1:{ray_port}/predict", bodies, n_requests=N_REQUESTS,
                              concurrency=32, max_seconds=MAX_SECONDS)  # fmt: skip
        print(f"Ray Serve, batched, c=32: {ray_res.throughput:.0f} req/s, p99 {ray_res.p99_ms:.1f} ms")
    finally:
        serve.shutdown()
        ray.shutdown()

# %% [markdown]
# ## What surprised us
# Printed from this run:

# %%
sat_base = sat.loc[base_label]
sat_best = sat.loc[best_setting["setting"]]
print(
    f"* In-process, batching makes the model {ms_item_1 / best['ms_per_item']:.2f}x cheaper per item; served "
    f"over HTTP the best batched setting reached {best_setting[f'throughput x at c={top}']:.2f}x the unbatched "
    f"throughput at c={top}."
)
print(
    f"* The server formed batches of mean size {sat_best['mean_batch']:.1f} at c={top} "
    f"(max_batch_size {[s for s in SETTINGS if s[0] == best_setting['setting']][0][1]}): batches are only as big as "
    "the queue is long, and the queue only grows when the model worker is the slowest stage."
)
print(
    f"* Unbatched at c={top}, the model worker was busy {sat_base['model_busy_%']:.0f}% of the wall time; the rest "
    f"of the {1000 / sat_base['throughput']:.2f} ms per request went to HTTP, JSON, validation, queues and the "
    "load generator, which share this machine's CPU cores with the server."
)
low = load[load["concurrency"] == 1].set_index("server")["p50_ms"]
print(
    f"* At one client, waiting for a batch that never fills costs latency: p50 {low[best_setting['setting']]:.2f} ms "
    f"batched vs {low[base_label]:.2f} ms unbatched."
)
print(f"* Server start to ready took {start_s:.1f} s on this machine.")
if naive_codes:
    print(f"* One bad request in a naively validated batch failed {sum(c != 200 for c in naive_codes) - 1} good ones.")
if not target_met:
    print(
        "* The 2x target was missed here: the served model's per-request cost is dominated by HTTP and the "
        "client, not the model (numbers above). Batching pays where the model dominates: a heavier model, "
        "a GPU, or a client on another machine."
    )

# %% [markdown]
# ## Exercises
# 1. From a load table, find the smallest concurrency where the batched server beats the unbatched one.


# %%
def batching_pays_at(df: pd.DataFrame) -> int | None:
    raise NotImplementedError  # your code here


cu.exercises.check("13.pays-at", batching_pays_at)

# %% [markdown]
# 2. The HTTP overhead per request: one client got `throughput` requests per second, the model alone needs
#    `model_ms` per item. How many milliseconds per request are spent outside the model?


# %%
def overhead_ms(throughput: float, model_ms: float) -> float:
    raise NotImplementedError  # your code here


cu.exercises.check("13.overhead", overhead_ms)

# %% [markdown]
# 3. Triton's `preferred_batch_size` must not exceed `max_batch_size`: return the (up to) three largest
#    powers of two not above the maximum.


# %%
def preferred_sizes(max_batch_size: int) -> list[int]:
    raise NotImplementedError  # your code here


cu.exercises.check("13.preferred", preferred_sizes)

# %% [markdown]
# ## Summary
# Rows for this machine's results: the unbatched and the best batched server at saturation, and the
# heavier model when it ran.

# %%
for label in (base_label, best_setting["setting"]):
    r = sat.loc[label]
    cu.record("13", f"served {label}", model=MODEL, device="cpu", dtype="fp32", median_ms=r["p50_ms"],
              p90_ms=r["p90_ms"], throughput=r["throughput"],
              speedup_vs_baseline=r["throughput"] / sat_base["throughput"],
              notes=f"LitServe, concurrency {top}, p99 {r['p99_ms']:.2f} ms, mean batch {r['mean_batch']:.1f}")  # fmt: skip
for _, r in heavy_df.iterrows():
    cu.record("13", f"served {r['server']}", model=r["model"], device="cpu", dtype="fp32", median_ms=r["p50_ms"],
              p90_ms=r["p90_ms"], throughput=r["throughput"],
              notes=f"LitServe, concurrency 32, p99 {r['p99_ms']:.2f} ms, mean batch {r['mean_batch']:.1f}")  # fmt: skip
print("Recorded. Next: 14 · Capstone.")
