"""Lesson 17's rank code (course_utils.from_lessons.l17_beyond_one_device, exported from the lesson's cells):
tensor- and pipeline-parallel results equal the single-process model, the collectives are counted, and a rank
killed mid-step stops the whole world with no process and no listening port left."""

from __future__ import annotations

import os
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
def world(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("l17") / "model.pt"
    torch.save(model.state_dict(), path)
    with l17.World(3, timeout_s=120.0) as w:
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
