"""Lesson 17's rank code (course_utils.from_lessons.l17_beyond_one_device, exported from the lesson's cells):
tensor- and pipeline-parallel results equal the single-process model, the collectives are counted, and a rank
killed mid-step stops the whole world with no process and no listening port left."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time

import psutil
import pytest
import torch

import course_utils as cu
from course_utils.from_lessons import l17_beyond_one_device as l17

LAYERS = 2


@pytest.fixture(scope="module")
def model():
    return cu.llm.tiny_llama(
        seed=17, num_attention_heads=18, num_key_value_heads=6, head_dim=32, num_hidden_layers=LAYERS
    )


@pytest.fixture(scope="module")
def mqa():
    """One K/V head for 6 query heads, an odd vocabulary (1003: uneven slices over 2 and 3 ranks), 3 layers."""
    return cu.llm.tiny_llama(
        seed=4,
        num_attention_heads=6,
        num_key_value_heads=1,
        head_dim=32,
        hidden_size=192,
        intermediate_size=96,
        vocab_size=1003,
        num_hidden_layers=3,
    )


@pytest.fixture(scope="module")
def world(model, mqa, tmp_path_factory):
    path = tmp_path_factory.mktemp("l17") / "model.pt"
    torch.save(model.state_dict(), path)
    mqa_path = path.with_name("mqa.pt")
    torch.save(mqa.state_dict(), mqa_path)
    with l17.World(3, timeout_s=120.0) as w:
        w.run(l17.load_shards, path=str(mqa_path), shape=l17.shape_of(mqa.config), sizes=[1, 2, 3], name="mqa")
        w.run(
            l17.load_shards,
            path=str(mqa_path),
            shape=l17.shape_of(mqa.config),
            sizes=[1],
            name="mqa whole",
            whole_on_every_rank=True,
        )
        w.run(l17.load_shards, path=str(path), shape=l17.shape_of(model.config), sizes=[1, 2, 3], name="m")
        w.run(
            l17.load_shards,
            path=str(path),
            shape=l17.shape_of(model.config),
            sizes=[1],
            name="whole",
            whole_on_every_rank=True,
        )
        yield w


def greedy(model, prompt, n):
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


def test_slices_pinned():
    w = torch.arange(12.0).view(3, 4)  # (out_features=3, in_features=4)
    assert torch.equal(l17.row_parallel(w, 1, 2), torch.tensor([[2.0, 3.0], [6.0, 7.0], [10.0, 11.0]]))
    assert torch.equal(
        l17.column_parallel(torch.arange(12.0).view(4, 3), 1, 2), torch.tensor([[6.0, 7, 8], [9, 10, 11]])
    )


def test_head_split_is_vllms_rule():
    assert [l17.head_split(18, 6, p) for p in (1, 2, 3, 6)] == [
        {"q": 18, "kv": 6, "replicas": 1},
        {"q": 9, "kv": 3, "replicas": 1},
        {"q": 6, "kv": 2, "replicas": 1},
        {"q": 3, "kv": 1, "replicas": 1},  # p == K/V heads: one each, no copy yet
    ]
    assert l17.head_split(6, 1, 2) == {"q": 3, "kv": 1, "replicas": 2}  # past the K/V heads: replicated
    assert l17.head_split(8, 2, 4) == {"q": 2, "kv": 1, "replicas": 2}
    assert l17.head_split(8, 2, 8) == {"q": 1, "kv": 1, "replicas": 4}


@pytest.mark.parametrize(
    ("heads", "kv", "p", "message"),
    [
        (9, 3, 2, "9 query heads do not divide by 2 ranks (each rank holds whole heads); tensor-parallel sizes "
         "that work for 9 query and 3 K/V heads: [1, 3, 9]"),
        (18, 6, 4, "18 query heads do not divide by 4 ranks"),
        (18, 6, 9, "9 ranks is not a multiple of 6 K/V heads"),
        (24, 8, 12, "12 ranks is not a multiple of 8 K/V heads"),
        (24, 6, 4, "6 K/V heads do not divide by 4 ranks; tensor-parallel sizes that work for 24 query and 6 K/V "
         "heads: [1, 2, 3, 6, 12, 24]"),
    ],
)  # fmt: skip
def test_head_splits_vllm_refuses_are_refused_with_the_sizes_that_work(heads, kv, p, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        l17.head_split(heads, kv, p)


def test_features_that_do_not_divide_are_refused_not_dropped():
    w = torch.zeros(100, 8)
    with pytest.raises(ValueError, match=re.escape("100 MLP features do not divide by 3 ranks (100 = 3 x 33 + 1): the "
                                                   "last 1 would be dropped. Use a number of ranks that divides 100 "
                                                   "([1, 2, 4, 5, 10, 20, 25, 50, 100])")):  # fmt: skip
        l17.column_parallel(w, 0, 3, "MLP features")
    with pytest.raises(ValueError, match="100 input features do not divide by 3"):
        l17.row_parallel(w.T, 2, 3)
    assert l17.column_parallel(w, 1, 4).shape == (25, 8) and l17.row_parallel(w.T, 1, 2).shape == (8, 50)


def test_uneven_vocabulary_blocks_cover_every_row_once():
    assert [l17.uneven_block(1003, r, 3) for r in range(3)] == [(0, 335), (335, 670), (670, 1003)]
    assert [l17.uneven_block(5, r, 4) for r in range(4)] == [(0, 2), (2, 4), (4, 5), (5, 5)]
    for n in range(1, 40):
        for p in range(1, 6):
            rows = [i for r in range(p) for i in range(*l17.uneven_block(n, r, p))]
            assert rows == list(range(n)), (n, p)


def test_stage_layers_split_like_vllm_and_refuse_empty_stages():
    assert l17.stage_layers(3, 2) == [(0, 2), (2, 3)]
    assert l17.stage_layers(30, 3) == [(0, 10), (10, 20), (20, 30)]
    sizes = [b - a for a, b in l17.stage_layers(61, 4)]
    assert sizes == [15, 15, 16, 15]  # vLLM's documented example: the extra layer before the last stage
    assert l17.stage_layers(2, 2) == [(0, 1), (1, 2)]
    with pytest.raises(ValueError, match=re.escape("2 layers cannot fill 3 pipeline stages: a stage would hold no "
                                                   "layer. Use at most 2 stages")):  # fmt: skip
        l17.stage_layers(2, 3)


def test_best_token_takes_the_highest_score_and_on_a_tie_the_lowest_id(monkeypatch):
    """Two ranks' vocabulary slices, the other rank's (score, id) gathered by a stand-in for torch.distributed."""

    class TwoRanks:
        def __init__(self, other):
            self.other = other

        def get_world_size(self, group):
            return 2

        def all_gather(self, every, mine, group):
            every[0].copy_(mine)
            every[1].copy_(torch.tensor(self.other))

    logits = torch.tensor([1.0, 5.0, 2.0])  # this rank's best: score 5 at index 1, token id 10 + 1
    comm = l17.Comm(group=None)
    monkeypatch.setattr(l17, "dist", TwoRanks([5.0, 7.0]))
    assert comm.best_token(logits, vocab_start=10) == 7, "a tie goes to the lowest token id, as argmax does"
    monkeypatch.setattr(l17, "dist", TwoRanks([5.0, 13.0]))
    assert comm.best_token(logits, vocab_start=10) == 11
    monkeypatch.setattr(l17, "dist", TwoRanks([6.0, 13.0]))
    assert comm.best_token(logits, vocab_start=10) == 13 and comm.calls == 3
    assert l17.Comm(group=None, enabled=False).best_token(logits, vocab_start=10) == 11


def test_rms_norm_scales_each_position_by_its_own_features():
    x = torch.tensor([[[3.0, 4.0], [1.0, 1.0], [0.0, 2.0]]])  # (batch 1, 3 positions, 2 features)
    w = torch.tensor([1.0, 2.0])
    want = torch.tensor([[[3.0, 8.0], [1.0, 2.0], [0.0, 4.0]]]) / torch.tensor([12.5, 1.0, 2.0]).sqrt()[None, :, None]
    torch.testing.assert_close(l17.rms_norm(x, w, 0.0), want)
    torch.testing.assert_close(l17.rms_norm(x, w, 1.0)[0, 1], torch.tensor([1.0, 2.0]) / 2**0.5)


def test_tensor_parallel_tokens_equal_generate_at_every_rank_count(world, model):
    prompt = list(range(5, 17))
    want = greedy(model, prompt, 6)
    for p in (1, 2, 3):
        runs = world.run(l17.tp_generate, ranks=range(p), name="m", p=p, prompt=prompt, n_new=6)
        assert all(r["tokens"][: len(want)] == want for r in runs), (p, [r["tokens"] for r in runs], want)
        assert runs[0]["calls_per_step"] == 2 * LAYERS + 1  # two all-reduces per layer, one gather for the token
        assert len(runs[0]["step_ms"]) == len(runs[0]["comm_ms"]) == 6


def test_one_kv_head_is_replicated_and_tokens_equal_generate(world, mqa):
    """6 query heads and 1 K/V head: at 2 and 3 ranks every rank holds a copy of the K/V head (vLLM's rule), the
    vocabulary of 1003 is split unevenly, and the greedy tokens are generate's."""
    prompt = list(range(7, 19))
    want = greedy(mqa, prompt, 6)
    kv = {}
    for p in (1, 2, 3):
        runs = world.run(l17.tp_generate, ranks=range(p), name="mqa", p=p, prompt=prompt, n_new=6)
        assert all(r["tokens"][: len(want)] == want for r in runs), (p, [r["tokens"] for r in runs], want)
        kv[p] = {r["kv_bytes"] for r in runs}
        assert {r["kv_positions"] for r in runs} == {len(prompt) + 5}
    per_position = 2 * 3 * 1 * 32 * 4  # K and V, 3 layers, 1 head of 32, fp32
    assert kv == {p: {per_position * (len(prompt) + 5)} for p in (1, 2, 3)}, "the K/V cache per rank stops shrinking"


def test_the_kv_cache_per_rank_shrinks_while_kv_heads_divide(world):
    got = {p: world.run(l17.tp_generate, ranks=range(p), name="m", p=p, prompt=[5, 6, 7], n_new=2) for p in (1, 2, 3)}
    per_position = {p: 2 * LAYERS * (6 // p) * 32 * 4 for p in (1, 2, 3)}
    assert {p: {r["kv_bytes"] for r in runs} for p, runs in got.items()} == {
        p: {4 * n} for p, n in per_position.items()
    }


def test_held_bytes_count_the_slices(world, mqa):
    held = world.run(l17.held_bytes, ranks=range(2), name="mqa", p=2)
    d, h, f = 32, 192, 96
    layer = 2 * h + 3 * d * h + 2 * d * h + 3 * d * h + 3 * h * f // 2  # norms, q (3 heads), k+v (1 head), o, MLP
    assert [x["layers"] for x in held] == [4 * 3 * layer] * 2
    vocab = [502, 501]
    assert [x["all"] - x["layers"] for x in held] == [4 * (1003 * h + h + v * h) for v in vocab]


def test_sizes_that_do_not_divide_are_refused_in_the_ranks(world, model, tmp_path):
    odd = cu.llm.tiny_llama(seed=1, num_attention_heads=6, num_key_value_heads=3, head_dim=32, hidden_size=192,
                            intermediate_size=100, num_hidden_layers=1)  # fmt: skip
    path = tmp_path / "odd.pt"
    torch.save(odd.state_dict(), path)
    with pytest.raises(l17.RankError, match=re.escape("100 MLP features do not divide by 3 ranks")):
        world.run(l17.load_shards, path=str(path), shape=l17.shape_of(odd.config), sizes=[3], name="odd")
    with pytest.raises(l17.RankError, match=re.escape("3 K/V heads do not divide by 2 ranks")):
        world.run(l17.load_shards, path=str(path), shape=l17.shape_of(odd.config), sizes=[2], name="odd")
    assert world.run(l17.held_bytes, ranks=[0], name="m", p=1)[0]["layers"] > 0  # the world still answers


def test_compute_only_runs_skip_every_collective(world):
    (res,) = world.run(l17.tp_generate, ranks=[0], name="m", p=1, prompt=[5, 6, 7], n_new=3, communicate=False)
    assert res["calls_per_step"] == 0 and res["comm_ms"] == [0.0, 0.0, 0.0]


def test_pipeline_logits_equal_the_model(world, model):
    tokens = torch.randint(3, 1000, (4, 5), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        want = model(tokens).logits[:, -1]
    for m in (1, 2, 4):
        stages = world.run(l17.pp_forward, ranks=range(2), name="whole", p=2, tokens=tokens, m=m)
        assert stages[0]["logits"] is None and len(stages[0]["busy"]) == len(stages[1]["busy"]) == m
        torch.testing.assert_close(stages[1]["logits"], want, atol=1e-4, rtol=1e-4)
        assert stages[1]["busy"][0][0] >= stages[0]["busy"][0][1]  # stage 1 starts after stage 0 sent


def test_three_layers_on_two_stages_give_the_models_logits(world, mqa):
    tokens = torch.randint(3, 1000, (4, 5), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = mqa(tokens).logits[:, -1]
    for handoff in ("send", "isend"):
        stages = world.run(l17.pp_forward, ranks=range(2), name="mqa whole", p=2, tokens=tokens, m=2, handoff=handoff)
        assert [s["layers"] for s in stages] == [(0, 2), (2, 3)]
        torch.testing.assert_close(stages[1]["logits"], want, atol=1e-4, rtol=1e-4)
        assert stages[0]["blocked_s"]["recv"] == 0.0 and stages[1]["blocked_s"]["send"] == 0.0


def test_a_batch_that_does_not_split_into_micro_batches_is_refused(world):
    tokens = torch.zeros(5, 3, dtype=torch.long)
    with pytest.raises(
        l17.RankError, match=re.escape("5 prompts (the batch) do not divide by 2 micro-batches (5 = 2 x 2 + 1)")
    ):
        world.run(l17.pp_forward, ranks=range(2), name="whole", p=2, tokens=tokens, m=2)


def test_allreduce_sweep_shape(world):
    times = world.run(l17.allreduce_sweep, ranks=range(2), p=2, sizes=[1, 1024], reps=3)
    assert len(times) == 2 and all(len(t) == 2 and min(t) > 0 for t in times)


def test_a_failing_task_is_reported_and_the_world_stops(tmp_path):
    with pytest.raises(l17.RankError, match="KeyError"), l17.World(2, timeout_s=60.0) as w:
        pids = list(w.pids)
        w.run(l17.tp_generate, name="missing", p=2, prompt=[1], n_new=1)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def listening_ports(pids):
    ports = set()
    for pid in pids:
        try:
            ports |= {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == "LISTEN"}
        except psutil.NoSuchProcess:
            pass
    return ports


def test_a_rank_killed_mid_step_leaves_no_process_and_no_port(model, tmp_path):
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    with (
        pytest.raises(l17.RankError, match="stopped|failed"),
        l17.World(3, timeout_s=120.0) as w,
    ):  # the dead rank, or a peer it cut off
        pids = list(w.pids)
        w.run(l17.load_shards, path=str(path), shape=l17.shape_of(model.config), sizes=[3], name="m")
        ports = listening_ports(pids)
        assert ports and all(
            c.laddr.ip == "127.0.0.1"
            for pid in pids
            for c in psutil.Process(pid).net_connections("tcp")
            if c.status == "LISTEN"
        ), "every rank socket is on the loopback interface"
        killer = threading.Timer(1.0, os.kill, (pids[1], signal.SIGKILL))  # mid-way through the decode steps
        killer.start()
        try:
            w.run(l17.tp_generate, name="m", p=3, prompt=[5, 6, 7], n_new=100000)
        finally:
            killer.cancel()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.1)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"rank processes left: {alive}"
    for port in ports:
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still listening"


STARTER = """
import multiprocessing, os, threading, time
from course_utils.from_lessons import l17_beyond_one_device as l17
os.environ["L17_TEST_SLOW_TORCH"] = "300"  # the ranks' import of torch takes 5 minutes (see SLOW_TORCH)
threading.Thread(target=lambda: l17.World(2, timeout_s=600.0).__enter__(), daemon=True).start()
while len(multiprocessing.active_children()) < 2:
    time.sleep(0.01)
print(*[p.pid for p in multiprocessing.active_children()], flush=True)
time.sleep(600)
"""
# Read by every Python started with this folder on its path: with the variable set, importing torch takes that long
# (as on a machine much busier than this one), so a rank is sure to be killed while it imports.
SLOW_TORCH = """
import os, sys, time
class _SlowTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and os.environ.get("L17_TEST_SLOW_TORCH"):
            time.sleep(float(os.environ["L17_TEST_SLOW_TORCH"]))
        return None
sys.meta_path.insert(0, _SlowTorch())
"""


def test_ranks_leave_when_their_starter_is_killed_even_while_they_import_torch(tmp_path):
    """A notebook killed (SIGKILL: no clean-up runs) while its ranks still import torch leaves no rank behind: their
    target watches the starter from its first moment (``cu.children.run_watched``), not after the import."""
    import subprocess
    import sys

    (tmp_path / "sitecustomize.py").write_text(SLOW_TORCH)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pids = [int(p) for p in starter.stdout.readline().split()]
        assert len(pids) == 2, pids
        time.sleep(1.0)  # the ranks are in their (5-minute) import of torch now
    finally:
        starter.kill()
        starter.wait()
    deadline = time.monotonic() + 30  # the watchdog looks every 0.2 s; a busy machine may be slow to schedule it
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in pids):
        time.sleep(0.1)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    for p in alive:  # do not leave them to the next test
        psutil.Process(p).kill()
    assert not alive, f"rank processes outlived their starter while importing torch: {alive}"


# ------------------------------------------------------------------ the lesson's cells tagged "contract"
@pytest.fixture(scope="module")
def cells():
    from tests.gpu_contract.lesson_code import lesson_namespace

    return lesson_namespace("17")


def test_the_rendezvous_store_listens_on_loopback_only(cells):
    import gc

    store, port = cells["loopback_store"]()
    try:
        store.set("k", "v")
        assert store.get("k") == b"v"
        mine = [a for a in cells["listening"](os.getpid()) if a.endswith(f":{port}")]
        assert mine == [f"127.0.0.1:{port}"], f"the store listens beyond loopback: {mine}"
    finally:
        del store
        gc.collect()
    assert not [a for a in cells["listening"](os.getpid()) if a.endswith(f":{port}")], "the store's port stays open"


NBYTES = [4, 2304, 147456]


def test_a_sound_allreduce_fit_is_read_and_not_flagged(cells):
    fit = cells["fit_allreduce"](NBYTES, [0.1, 0.12, 0.11 + 0.147456], 2, small_bytes=2304)  # latency: the median
    assert fit["flags"] == [] and fit["latency_ms"] == pytest.approx(0.11) and fit["GB_per_s"] == pytest.approx(1.0)
    assert cells["allreduce_ms"](2, 1e6, fit) == pytest.approx(0.11 + 1.0)  # 1 MB at 1 GB/s: 1 ms
    fit3 = cells["fit_allreduce"](NBYTES, [0.1, 0.1, 0.2], 3, small_bytes=2304)  # ring: 4/3 of the bytes sent
    assert fit3["GB_per_s"] == pytest.approx(4 / 3 * 147456 / 0.1 / 1e6)


@pytest.mark.parametrize(
    ("ms", "flag"),
    [
        ([0.2, 0.2, 0.15], "took no longer than the small ones (0.15 vs 0.2 ms): this sweep shows no bandwidth"),
        ([0.2, 0.2, 0.2], "this sweep shows no bandwidth"),
        ([0.1, 0.1, 0.1 + 147456 / 8100e6], "is above any memory's (8000 GB/s): noise"),
        ([-0.1, -0.1, 0.5], "latency -0.1 ms is below zero"),
    ],
)
def test_an_impossible_allreduce_fit_is_flagged_and_not_used(cells, ms, flag):
    fit = cells["fit_allreduce"](NBYTES, ms, 2, small_bytes=2304)
    assert any(flag in f for f in fit["flags"]), fit["flags"]
    assert cells["allreduce_ms"](2, 1e9, fit) == fit["latency_ms"], "a flagged fit: the model uses the latency alone"


def test_a_bandwidth_just_below_the_fastest_memory_is_not_flagged(cells):
    fit = cells["fit_allreduce"](NBYTES, [0.1, 0.1, 0.1 + 147456 / 7900e6], 2, small_bytes=2304)
    assert fit["flags"] == [] and fit["GB_per_s"] == pytest.approx(7900)


def test_predicted_memory_equals_what_the_ranks_hold(cells, world, model, mqa):
    for name, m in (("m", model), ("mqa", mqa)):
        shape = l17.shape_of(m.config)
        for p in (1, 2, 3):
            predicted = cells["tp_memory"](shape, p, 4)
            assert world.run(l17.held_bytes, ranks=[0], name=name, p=p)[0]["all"] == predicted["weights"], (name, p)
            (run,) = world.run(l17.tp_generate, ranks=range(p), name=name, p=p, prompt=[5, 6], n_new=2)[:1]
            assert run["kv_bytes"] == predicted["kv_per_token"] * run["kv_positions"], (name, p)
    assert cells["tp_memory"](l17.shape_of(mqa.config), 3, 4)["kv_copies"] == 3


def test_tokens_that_fit_and_the_70b_rule(cells):
    assert cells["tokens_that_fit"](1000, 400, 6) == 100 and cells["tokens_that_fit"](300, 400, 6) == 0
    shape = cells["LLAMA_70B"]
    kv = {p: cells["tp_memory"](shape, p, 2, split_embedding=True)["kv_per_token"] for p in (4, 8, 16)}
    assert kv == {4: 2 * 80 * 2 * 128 * 2, 8: 2 * 80 * 1 * 128 * 2, 16: 2 * 80 * 1 * 128 * 2}  # copied past 8


def test_the_bubble_models(cells):
    bubble, staged = cells["bubble"], cells["stage_time_bubble"]
    for p in (2, 3, 4):
        for m in (1, 4, 8):
            assert staged([0.01] * p, m) == pytest.approx((p - 1) / (m + p - 1))  # equal stages: the formula
    assert staged([1.0, 2.0], 4) == pytest.approx(1 / 3)  # wall 3 + 3 x 2 = 9, busy 4 x 3 = 12 of 18
    stages = [{"busy": [(0.0, 1.0), (1.0, 2.0)]}, {"busy": [(1.0, 2.0), (2.0, 3.0)]}]
    assert bubble(stages) == pytest.approx(1 - 4 / 6)


# ------------------------------------------------------------------ collectives on a GPU are asynchronous
@pytest.mark.skipif(torch.cuda.is_available(), reason="the rehearsal stands in for a missing GPU")
def test_comm_times_a_gpu_collective_with_events_and_the_rehearsal_catches_the_host_clock(gpu, monkeypatch):
    """Comm's device path (CUDA events, read after a synchronize) passes the rehearsal's rule for asynchronous
    collectives; the host-clock path it uses on gloo, planted on a GPU tensor, is stopped by it."""
    from fakegpu.standins import collectives
    from fakegpu.standins.rehearsal import RehearsalError

    x = torch.ones(4096, device="cuda")
    collectives.install(monkeypatch.setattr)  # undone when the test ends
    right = l17.Comm(group=None, device=torch.device("cuda"))
    assert right.cuda
    for _ in range(3):
        right.all_reduce(x)
    assert len(right.pending) == 3 and right.seconds == 0.0  # not read before the device has run
    gpu.synchronize()
    right.settle()
    assert right.seconds > 0 and right.pending == [] and right.calls == 3
    torch.testing.assert_close(x.cpu(), torch.ones(4096))  # one rank's sum: itself

    planted = l17.Comm(group=None, device=torch.device("cuda"))
    planted.cuda = False  # the gloo path on a GPU tensor: perf_counter around a call that only queues
    with pytest.raises(RehearsalError, match="a wall-clock timer around GPU work measures only the launch"):
        planted.all_reduce(x)
    gpu.synchronize()


def test_expert_parallel_moe_equals_the_unsplit_layer(world):
    cfg = {"hidden": 16, "ffn": 24, "experts": 6, "seed": 3, "top_k": 2}
    x = torch.randn(11, 16, generator=torch.Generator().manual_seed(0))  # 11 tokens: uneven shares over 2 and 3
    want, chosen = l17.moe_layer(x, l17.moe_weights(16, 24, 6, 3), 2)
    for p in (1, 2, 3):
        parts = world.run(l17.ep_moe, ranks=range(p), x_all=x, p=p, **cfg)
        assert torch.equal(torch.cat([r["chosen"] for r in parts]), chosen), p
        torch.testing.assert_close(torch.cat([r["out"] for r in parts]), want, atol=1e-5, rtol=1e-5)
        assert {r["expert_bytes"] for r in parts} == {4 * 3 * 16 * 24 * 6 // p}  # its experts only
        assert sum(sum(r["sent"]) for r in parts) == 2 * 11  # every (token, expert) pair sent once
    with pytest.raises(l17.RankError, match=re.escape("4 experts do not divide by 3 ranks")):
        world.run(l17.ep_moe, ranks=range(3), x_all=x, p=3, **cfg | {"experts": 4})
