"""Lesson 17's two-node launch (its cells tagged "contract"): two torchrun agents on this machine, one per "node",
meet at a rendezvous store the notebook holds on 127.0.0.1. Every rank gets its place and the all_reduce's sum; no
process of the launch listens beyond loopback (and the check that says so does flag a listener on 0.0.0.0 or ::);
nothing is left running afterwards: after success, after a rank's error, after a node that never joins, and after
the notebook's own process is killed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import psutil
import pytest

from tests.gpu_contract.lesson_code import lesson_namespace

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("17")


def running(pids):
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def launch_pids(run):
    return [a["pid"] for a in run["agents"]] + [r["pid"] for r in run["ranks"]]


def port_open(address):
    ip, port = address.rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((ip, int(port))) == 0


@pytest.mark.parametrize("nproc", [1, 2])
def test_two_nodes_give_every_rank_its_place_and_the_sum(ns, tmp_path, nproc):
    run = ns["torchrun_nodes"](tmp_path, nproc=nproc)
    assert [a["exit_code"] for a in run["agents"]] == [0, 0], ns["failure_report"](run)
    ranks, world = run["ranks"], 2 * nproc
    assert [int(r["RANK"]) for r in ranks] == list(range(world))
    assert all(int(r["WORLD_SIZE"]) == world and int(r["LOCAL_WORLD_SIZE"]) == nproc for r in ranks)
    assert sorted({int(r["GROUP_RANK"]) for r in ranks}) == [0, 1]
    for node in (0, 1):  # one agent's workers: one group rank, local ranks 0..nproc-1
        mine = [r for r in ranks if r["node"] == node]
        assert len({r["GROUP_RANK"] for r in mine}) == 1
        assert sorted(int(r["LOCAL_RANK"]) for r in mine) == list(range(nproc))
    assert all(int(r["RANK"]) == int(r["GROUP_RANK"]) * nproc + int(r["LOCAL_RANK"]) for r in ranks)
    assert all(r["all_reduce"] == world * (world + 1) / 2 for r in ranks)
    assert {r["MASTER_ADDR"] for r in ranks} == {"127.0.0.1"}  # --local-addr, not the hostname
    # c10d numbers the nodes by (address, agent pid), whatever --node-rank said
    by_pid = sorted(run["agents"], key=lambda a: a["pid"])
    group_of = {r["node"]: int(r["GROUP_RANK"]) for r in ranks}
    assert [group_of[a["node"]] for a in by_pid] == [0, 1]
    assert run["store"] and all(a.startswith("127.0.0.1:") for a in run["store"])
    assert run["listening"] and not run["beyond_loopback"]
    assert run["workers_seen_listening"], "the check never saw a worker's sockets: it proved nothing"
    assert run["processes"] >= 2 + world  # agents and workers (and any short-lived child of theirs)
    assert not running(launch_pids(run)), "processes of the launch left running"
    assert not any(port_open(a) for a in run["store"] + run["listening"]), "a port of the launch still listens"


Conn = namedtuple("Conn", "laddr status")
Addr = namedtuple("Addr", "ip port")


class FakeProcess:
    """Stands in for psutil.Process: a pid, its children, and the sockets it holds."""

    def __init__(self, pid, listens, children=()):
        self.pid, self.listens, self.kids = pid, listens, list(children)

    def children(self, recursive=False):
        return [k for child in self.kids for k in [child, *(child.children(True) if recursive else [])]]

    def net_connections(self, kind="inet"):
        return [Conn(Addr(ip, port), psutil.CONN_LISTEN) for ip, port in self.listens] + [
            Conn(Addr("0.0.0.0", 9), psutil.CONN_ESTABLISHED)  # not listening: not counted
        ]


def test_the_check_flags_every_listener_beyond_loopback_in_any_process_of_the_launch(ns):
    worker = FakeProcess(12, [("0.0.0.0", 5000), ("127.0.0.1", 5001)])
    grandchild = FakeProcess(13, [("::", 5003), ("::ffff:127.0.0.1", 5004)])
    agent = FakeProcess(10, [("::1", 5002)], children=[FakeProcess(11, [], children=[grandchild]), worker])
    watch = ns["LaunchWatch"]()
    watch.agents.append(agent)
    watch.sample()
    assert watch.beyond_loopback() == {"0.0.0.0:5000": [12], ":::5003": [13]}
    assert set(watch.seen) == {10, 11, 12, 13}


@pytest.mark.parametrize(
    ("ip", "loopback"),
    [("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
     ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("::ffff:10.1.2.3", False), ("fe80::1%eth0", False)],
)  # fmt: skip
def test_on_loopback(ns, ip, loopback):
    assert ns["on_loopback"](ip) is loopback


def test_the_launch_is_stopped_at_once_when_a_process_listens_beyond_loopback(ns, tmp_path, monkeypatch):
    """Every listening socket the check reads gets a twin on 0.0.0.0 (psutil answers for it: nothing listens there
    for real): the launch must stop with the address named and leave nothing running."""
    real = psutil.Process.net_connections

    def with_a_wildcard_twin(self, kind="inet"):
        conns = real(self, kind)
        return conns + [c._replace(laddr=c.laddr._replace(ip="0.0.0.0")) for c in conns if c.status == "LISTEN"]

    seen = []
    stop = ns["LaunchWatch"].stop

    def remember_and_stop(self, *args, **kwargs):
        seen.extend(self.seen)
        return stop(self, *args, **kwargs)

    monkeypatch.setattr(psutil.Process, "net_connections", with_a_wildcard_twin)
    monkeypatch.setattr(ns["LaunchWatch"], "stop", remember_and_stop)
    with pytest.raises(RuntimeError, match=r"listens beyond loopback: \{'0\.0\.0\.0:\d+"):
        ns["torchrun_nodes"](tmp_path)
    assert len(seen) >= 3, f"the launch stopped before a worker listened: {seen}"
    assert not running(seen), "processes of the launch left running"


def test_a_failing_rank_is_named_and_the_other_node_stops(ns, tmp_path):
    run = ns["torchrun_nodes"](tmp_path, nproc=1, fail_rank=1, grace_s=60.0)
    errors = sorted((r for r in run["ranks"] if "error" in r), key=lambda r: r["at"])
    assert errors and errors[0]["RANK"] == "1"
    assert errors[0]["error"] == "RuntimeError: rank 1 fails on purpose, before its all_reduce"
    # both agents stopped by themselves, within the grace (exit code None: stopped by the notebook after it); no
    # bound in seconds here, which a busy machine would turn into a verdict on its load
    assert all(a["exit_code"] not in (0, None) for a in run["agents"]), run["agents"]
    report = ns["failure_report"](run)
    assert report.startswith("first: rank 1 (GROUP_RANK 1): RuntimeError: rank 1 fails on purpose"), report
    assert "exit code 1" in report
    assert not running(launch_pids(run))
    assert not run["beyond_loopback"]


def test_a_node_that_never_joins_the_group_is_stopped_after_the_grace(ns, tmp_path):
    """The node of group rank 1 exits before its workers join: the other node's rank waits in init_process_group
    (for as long as the store's timeout) until the notebook stops it, `grace_s` after the failure."""
    script = 'import os, sys\nif os.environ["GROUP_RANK"] == "1":\n    sys.exit("this node cannot start")\n'
    # without the grace the waiting node would run into timeout_s (TimeoutError); no wall bound here, which a busy
    # machine's slow torch imports would decide
    run = ns["torchrun_nodes"](tmp_path, nproc=1, grace_s=2.0, timeout_s=120.0, script=script + ns["NODE_SCRIPT"])
    codes = sorted(a["exit_code"] for a in run["agents"] if a["exit_code"] is not None)
    assert codes == [1] and sum(a["exit_code"] is None for a in run["agents"]) == 1, run["agents"]
    report = ns["failure_report"](run)
    assert "stopped by the notebook" in report and "this node cannot start" in report, report
    assert not run["ranks"], "no rank got through init_process_group"
    pids = [a["pid"] for a in run["agents"]]
    assert not running(pids)
    children = [p for p in psutil.Process().children(recursive=True) if "node_script.py" in " ".join(p.cmdline())]
    assert not children, children


STARTER = """
import sys
sys.path.insert(0, {root!r})
from tests.gpu_contract.lesson_code import lesson_namespace
ns = lesson_namespace("17")
held = ns["NODE_SCRIPT"].replace('"release"', '"never released"')  # the ranks wait, in the group, till killed
assert held != ns["NODE_SCRIPT"]
ns["torchrun_nodes"](sys.argv[1], nproc=1, script=held, timeout_s=600.0)
"""


def test_nothing_outlives_an_agent_or_the_notebook_killed_mid_launch(tmp_path):
    """SIGKILL (no clean-up runs) to one agent: the kernel kills its worker (the script's PR_SET_PDEATHSIG). Then
    SIGKILL to the notebook's process: the other agent gets SIGTERM from the kernel (PR_SET_PDEATHSIG; it would also
    notice its rendezvous store is gone) and stops its worker."""
    starter = subprocess.Popen([sys.executable, "-c", STARTER.format(root=str(ROOT)), str(tmp_path)])
    agents, workers = [], []
    try:
        deadline = time.monotonic() + 180
        while len(list(tmp_path.glob("rank*.json"))) < 2:
            assert starter.poll() is None, f"the starter ended early ({starter.returncode})"
            assert time.monotonic() < deadline, "the ranks never reported"
            time.sleep(0.1)
        time.sleep(0.2)  # the files are complete
        workers = [json.loads(f.read_text())["pid"] for f in tmp_path.glob("rank*.json")]
        agents = [
            p.pid for p in psutil.Process(starter.pid).children() if "torch.distributed.run" in " ".join(p.cmdline())
        ]
        assert len(agents) == 2 and running(workers) == workers, (agents, workers)
        orphan = [w for w in workers if psutil.Process(w).ppid() == agents[0]]
        os.kill(agents[0], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and running(orphan):
            time.sleep(0.05)
        assert len(orphan) == 1 and not running(orphan), f"a worker outlived its agent: {orphan}"
    finally:
        starter.kill()
        starter.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and running(agents + workers):
            time.sleep(0.1)
        left = running(agents + workers)
        for p in left:  # do not leave them to the next test, whatever failed above
            os.kill(p, signal.SIGKILL)
    assert not left, f"processes of the launch outlived the notebook: {left}"


def test_agents_leave_with_a_notebook_killed_before_the_rendezvous(tmp_path):
    """Killed while its agents still import torch: nothing of theirs would notice the rendezvous store is gone for
    a minute (the store client's connect timeout); the kernel's SIGTERM (PR_SET_PDEATHSIG) stops them at once."""
    starter = subprocess.Popen([sys.executable, "-c", STARTER.format(root=str(ROOT)), str(tmp_path)])
    try:
        deadline, agents = time.monotonic() + 120, []
        while len(agents) < 2:
            assert starter.poll() is None and time.monotonic() < deadline, "the agents never started"
            with contextlib.suppress(psutil.NoSuchProcess):
                agents = [
                    p.pid
                    for p in psutil.Process(starter.pid).children()
                    if "torch.distributed.run" in " ".join(p.cmdline())
                ]
            time.sleep(0.01)
        assert not list(tmp_path.glob("rank*.json")), "too late: the ranks are up already"
    finally:
        starter.kill()
        starter.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and running(agents):
        time.sleep(0.05)
    left = running(agents)
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"agents outlived the notebook: {left}"
