"""Lesson 13's server, probed as a careless learner, a workshop and a hostile local client would (issue 12).

A tiny LitAPI (doubles a number, batched) keeps server starts to seconds; each probe must get a clear 4xx/5xx
*response*, lose nothing (the next good request on the same connection is answered) and leave no process or
port behind.

The load generator and the server guard pinned on known answers: percentiles of a known list, open-loop latency
(and the streaming load's line times) counted from each request's due time (a client that falls behind a bunched
burst against a server with a known delay), closed-loop latencies that fit in the wall time, the body-size limit
over many small chunks, and the exact nesting and integer-size boundaries."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from course_utils.serve import load_generator, server_process, stream_load
from course_utils.serve import server_guard as g

API = textwrap.dedent(
    """
    import litserve as ls
    from pydantic import BaseModel, Field


    class Req(BaseModel):
        x: float = Field(ge=-1e6, le=1e6)


    class Double(ls.LitAPI):
        def setup(self, device):
            self.k = 2.0

        def decode_request(self, request: Req):
            return request.x

        def batch(self, xs):
            return list(xs)

        def predict(self, x):
            return [self.k * v for v in x] if isinstance(x, list) else self.k * x

        def unbatch(self, y):
            return list(y)

        def encode_response(self, y):
            return {"y": y}
    """
)


@pytest.fixture(scope="module")
def api_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("srv") / "double_api.py"
    path.write_text(API)
    return path


@pytest.fixture(scope="module")
def server(api_file):
    with server_process.serve(
        f"{api_file}:Double",
        max_batch_size=8,
        batch_timeout=0.02,
        header_timeout=2.0,
        max_connections=64,
        limit_concurrency=96,
    ) as srv:
        yield srv
    assert server_process.group_pids(srv.pgid) == [] and not server_process.port_open(srv.port)


# ---- pure functions ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"", 400, "empty"),
        (b"  \n", 400, "empty"),
        (b'{"x": 1', 400, "not valid JSON"),
        (b'{"x": ' + b"9" * 400 + b"}", 422, "400 digits"),
        (b"[" * 950 + b"]" * 950, 400, "nested too deeply"),
        (b"[" * 5000 + b"]" * 5000, 400, "nested too deeply"),
        (b'{"x": 1e999}', 422, "out of range"),
        (b'{"x": NaN}', 422, "not a JSON number"),
        (b'{"x": "\x80"}', 400, "UTF-8"),
    ],
)
def test_check_json_rejects(body, status, words):
    with pytest.raises(g._Reject) as info:
        g.check_json(body)
    assert info.value.status == status and words in info.value.message


def test_check_json_accepts_ordinary_json():
    assert g.check_json(b'{"a": [1, 2.5, {"b": "c"}], "n": -123456789012345678}')["n"] == -123456789012345678


def test_loopback_only():
    load_generator.check_loopback("http://127.0.0.1:8000/predict")
    load_generator.check_loopback("http://localhost:1/x")
    load_generator.check_loopback("http://[::1]:1/x")
    for url in ("http://10.0.0.1:8000/predict", "http://example.com/p", "http://169.254.169.254/"):
        with pytest.raises(load_generator.LoopbackOnlyError):
            load_generator.closed_loop(url, [b"{}"], n_requests=1, concurrency=1)
        with pytest.raises(load_generator.LoopbackOnlyError):
            load_generator.open_loop(url, [b"{}"], rate=1.0, n_requests=1)


def test_load_result_percentiles():
    r = load_generator.LoadResult("closed", 4, float("nan"), 100, 0, 2.0, [float(i) for i in range(1, 101)])
    assert r.throughput == 50.0 and r.p50_ms == pytest.approx(50.5) and r.p99_ms == pytest.approx(99.01)


def test_serve_rejects_a_bad_target(tmp_path):
    with pytest.raises(server_process.ServingError, match="file.py:name"):
        with server_process.serve(tmp_path / "missing.py"):
            pass


# ---- a real server ----------------------------------------------------------------------------------------


def test_answers_and_batches(server):
    answers = load_generator.post_many(server.predict_url, [{"x": i} for i in range(20)], concurrency=20)
    assert [a["y"] for _, a in answers] == [2.0 * i for i in range(20)]
    assert len(server.calls()) < 20  # batches were formed


def test_probes_get_4xx_and_the_connection_stays_usable(server):
    probes = {
        b"": (400, "empty"),
        b'{"x": ' + b"9" * 400 + b"}": (422, "400 digits"),
        b"[" * 950 + b"]" * 950: (400, "nested too deeply"),
        json.dumps({"x": "a" * 30_000}).encode(): (422, "x: "),
        json.dumps({"dtype": "z" * 200_000}).encode(): (413, "exceeds the limit"),
        b'{"y": 1}': (422, "x: Field required"),
        b"{not json": (400, "not valid JSON"),
    }
    with httpx.Client(trust_env=False, timeout=30) as client:  # one keep-alive connection for everything
        for body, (status, words) in probes.items():
            r = client.post(server.predict_url, content=body, headers=load_generator.HEADERS)
            assert r.status_code == status, (body[:30], r.status_code, r.text[:200])
            detail = r.json()["detail"]
            assert words in detail and len(detail) < 1000, detail[:300]  # huge values are not echoed back
            if status != 413:  # 413 closes the connection (the rest of the body is not read)
                good = client.post(server.predict_url, json={"x": 3})
                assert good.status_code == 200 and good.json() == {"y": 6.0}


def test_mixed_load_500_requests_half_bad(server):
    bad = [b"", b'{"x": ' + b"9" * 400 + b"}", b"[" * 950 + b"]" * 950, b'{"x": "nan"}', b"{oops", b'{"x": 1e7}']
    bodies, expect = [], []
    for i in range(500):
        if i % 2:
            bodies.append(bad[i % len(bad)])
            expect.append(None)
        else:
            bodies.append(json.dumps({"x": i}).encode())
            expect.append(2.0 * i)
    answers = load_generator.post_many(server.predict_url, bodies, concurrency=50)
    for (code, ans), want in zip(answers, expect, strict=True):
        if want is None:
            assert 400 <= code < 500, (code, ans)
        else:
            assert code == 200 and ans == {"y": want}, (code, ans)


def test_load_generators(server):
    r = load_generator.closed_loop(server.predict_url, [{"x": 1}], n_requests=30, concurrency=4, max_seconds=30)
    assert r.n_ok == 30 and r.n_failed == 0 and r.p50_ms <= r.p99_ms
    r = load_generator.closed_loop(server.predict_url, [{"x": 1}], n_requests=10**6, concurrency=2, max_seconds=0.5)
    assert r.n_ok < 10**6 and r.wall_s < 30
    o = load_generator.open_loop(server.predict_url, [{"x": 1}], rate=200.0, n_requests=60, max_seconds=10)
    assert o.n_ok + o.n_failed + o.n_not_sent == 60 and o.n_ok > 0 and o.mode == "open"
    o = load_generator.open_loop(server.predict_url, [{"x": 1}], rate=50.0, n_requests=10**6, max_seconds=0.5)
    assert o.n_ok < 100  # arrivals due after max_seconds are never sent


def test_slow_client_times_out_and_idle_connections_are_capped(server):
    slow = socket.create_connection(("127.0.0.1", server.port))
    slow.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    slow.settimeout(10)
    t0 = time.monotonic()
    data = slow.recv(4096)
    assert data.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 8
    slow.close()
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(80)]  # above max_connections=64
    try:
        time.sleep(0.3)
        refused = 0
        for s in idle[64:]:
            s.settimeout(5)
            refused += s.recv(4096).startswith(b"HTTP/1.1 503")
        assert refused == 16, f"{refused} of the 16 connections above the limit of 64 got 503"
        answered, _, _ = select.select(idle[:64], [], [], 0.2)  # (a 408 after header_timeout=2 s would be fair)
        early = [idle.index(s) for s in answered if s.recv(4096).startswith(b"HTTP/1.1 503")]
        assert not early, f"connections {early}, within the limit of 64, were refused"
    finally:
        for s in idle:
            s.close()
    assert load_generator.post(server.predict_url, {"x": 2}) == (200, {"y": 4.0})  # still serving


def test_overload_gives_503_not_resets(api_file):
    """More connections than uvicorn's limit_concurrency: each extra request gets a 503 answer, none a reset."""
    with server_process.serve(f"{api_file}:Double", max_batch_size=1, limit_concurrency=4) as srv:
        answers = load_generator.post_many(srv.predict_url, [{"x": 1}] * 60, concurrency=30)
        after = load_generator.post(srv.predict_url, {"x": 5})
    codes = {c for c, _ in answers}
    assert codes <= {200, 503} and 503 in codes, codes
    assert after == (200, {"y": 10.0})  # the overload passed, the server answers again


@pytest.fixture
def impostor():
    """Another program listening on a loopback port, answering the course's routes with a foreign id."""
    import threading

    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()
    app.get("/course/instance")(lambda: {"id": "someone-else"})
    app.get("/health")(lambda: "ok")
    app.post("/predict")(lambda: {"y": "not yours"})
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.05)
    yield sock.getsockname()[1]
    server.should_exit = True
    th.join(5)


def test_readiness_checks_the_instance_not_the_port(impostor, tmp_path):
    """A port answered by another program is never taken for our server: its id does not match."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (tmp_path / "port").write_text(str(impostor))
        srv = server_process.Server("127.0.0.1", 0, proc.pid, tmp_path, {}, proc)
        with pytest.raises(server_process.ServingError, match="answered by another program"):
            server_process._wait_ready(srv, "our-id", 30.0)  # the impostor answers at once; 30 s for a busy machine
    finally:
        proc.kill()
        proc.wait()


def test_bind_failure_is_reported(api_file, impostor):
    """A port already taken: serve() reports the bind failure (never 'ready' on the other program's answers)."""
    with pytest.raises(server_process.ServingError, match="could not bind"):
        with server_process.serve(f"{api_file}:Double", port=impostor, start_timeout=120):
            pass


def test_server_dies_with_its_parent(api_file, tmp_path):
    """SIGKILL of the process that started the server: the server group and its run folder go too."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, time
        from course_utils.serve import server_process
        with server_process.serve("{api_file}:Double") as srv:
            print(srv.pgid, srv.port, srv.run_dir, flush=True)
            time.sleep(600)
    """)
    )
    env = dict(os.environ, PYTHONPATH=str(server_process.REPO_ROOT))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pgid, port, run_dir = parent.stdout.readline().split()
        pgid, port = int(pgid), int(port)
        assert server_process.group_pids(pgid) and server_process.port_open(port)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        end = time.monotonic() + 20
        while (server_process.group_pids(pgid) or server_process.port_open(port)) and time.monotonic() < end:
            time.sleep(0.2)
        assert (
            server_process.group_pids(pgid) == [] and not server_process.port_open(port) and not Path(run_dir).exists()
        )
    finally:
        if parent.poll() is None:
            parent.kill()


def test_server_stopped_at_interpreter_exit(api_file, tmp_path):
    """A server left running (the with-block never closed) is stopped by atexit when Python exits."""
    script = tmp_path / "leaky.py"
    script.write_text(
        textwrap.dedent(f"""
        from course_utils.serve import server_process
        cm = server_process.serve("{api_file}:Double")
        srv = cm.__enter__()
        print(srv.pgid, srv.port, flush=True)
    """)
    )
    env = dict(os.environ, PYTHONPATH=str(server_process.REPO_ROOT))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    pgid, port = map(int, out.stdout.split())
    assert server_process.group_pids(pgid) == [] and not server_process.port_open(port)


def test_stopped_even_when_the_body_raises(api_file):
    with pytest.raises(RuntimeError, match="boom"):
        with server_process.serve(f"{api_file}:Double") as srv:
            assert server_process.group_pids(srv.pgid)
            raise RuntimeError("boom")
    assert server_process.group_pids(srv.pgid) == [] and not server_process.port_open(srv.port)


def test_listens_on_loopback_only(server):
    import psutil

    listening = [
        c
        for c in psutil.net_connections("tcp")
        if c.laddr and c.laddr.port == server.port and c.status == psutil.CONN_LISTEN
    ]
    assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening)
    asyncio.run(asyncio.sleep(0))


def test_writefile_fallback_writes_the_cell_body(tmp_path):
    lesson = tmp_path / "lesson.py"
    cells = '# %%\nx = 1\n\n# %%\n# %%writefile {WORK}/a.py\nimport os\nprint("hi")\n\n\n# %% [markdown]\n# text\n'
    lesson.write_text(cells)
    out = server_process.writefile_fallback(tmp_path / "a.py", lesson)
    assert out.read_text() == 'import os\nprint("hi")\n'
    with pytest.raises(server_process.ServingError, match="b.py"):
        server_process.writefile_fallback(tmp_path / "b.py", lesson)


def test_post_many_reuses_connections_under_a_low_descriptor_limit(server, tmp_path):
    """600 bodies with a 128-descriptor limit: only possible when one client reuses a bounded pool."""
    script = tmp_path / "many.py"
    script.write_text(
        textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        from course_utils.serve import load_generator
        answers = load_generator.post_many("{server.predict_url}", [{{"x": i}} for i in range(600)], concurrency=32)
        assert [a["y"] for _, a in answers] == [2.0 * i for i in range(600)], answers[:3]
        print("ok")
    """)
    )
    env = dict(os.environ, PYTHONPATH=str(server_process.REPO_ROOT))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


# ---- issue 24: header floods, orphaned workers, dead and hung models, working folder, TMPDIR ---------------

FAULTY_API = textwrap.dedent(
    """
    import os
    import time
    from pathlib import Path

    import litserve as ls
    from pydantic import BaseModel


    class Req(BaseModel):
        x: float


    class Faulty(ls.LitAPI):
        def setup(self, device):
            self.k = float(Path("factor.txt").read_text())  # relative: the lesson's (caller's) folder

        def decode_request(self, request: Req):
            return request.x

        def predict(self, x):
            if x == 13:
                time.sleep(120)  # a hung model
            if x == 666:
                time.sleep(1.0)  # busy long enough for a second request to queue behind it
                os._exit(3)  # a model worker that dies (a segfault, the OOM killer)
            return self.k * x

        def encode_response(self, y):
            return {"y": y}
    """
)


@pytest.fixture
def faulty(tmp_path, monkeypatch):
    """A server whose model hangs on x=13 and dies on x=666, started from a folder holding factor.txt."""
    (tmp_path / "faulty_api.py").write_text(FAULTY_API)
    (tmp_path / "factor.txt").write_text("3\n")
    monkeypatch.chdir(tmp_path)
    return f"{tmp_path / 'faulty_api.py'}:Faulty"


def _rss_peak_kb(pgid: int) -> int:
    total = 0
    for pid in server_process.group_pids(pgid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
    return total


def test_a_header_flood_gets_431_and_memory_stays_bounded(server):
    """The issue's 60 MB of 5-byte headers took the server from 204 MB to 1.5 GB; 6 MB here, same shape."""
    before = _rss_peak_kb(server.pgid)
    flood = b"a:b\r\n" * (6 * 1024 * 1024 // 5)
    answer, errors = b"", []

    def attack() -> None:
        nonlocal answer
        with socket.create_connection((server.host, server.port), timeout=20) as s:
            s.sendall(b"POST /predict HTTP/1.1\r\nhost: 127.0.0.1\r\n")
            try:
                s.sendall(flood)
            except OSError as exc:  # the server closed the connection after its 431: expected
                errors.append(exc)
            with contextlib.suppress(OSError):
                while chunk := s.recv(65536):
                    answer += chunk

    import threading

    t = threading.Thread(target=attack)
    t.start()
    t0 = time.perf_counter()
    status, out = load_generator.post(server.predict_url, {"x": 2.0}, timeout=10)  # a normal request meanwhile
    normal_s = time.perf_counter() - t0
    t.join(30)
    assert not t.is_alive()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"too large" in answer and b"at most 100 fields" in answer
    grown_mb = (_rss_peak_kb(server.pgid) - before) / 1024
    assert grown_mb < 40, f"the server's peak memory grew by {grown_mb:.0f} MB for 6 MB of headers"
    assert status == 200 and out == {"y": 4.0} and normal_s < 5.0, (status, out, normal_s)
    many = "".join(f"x-h{i}: v\r\n" for i in range(101)).encode()
    with socket.create_connection((server.host, server.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n" + many + b"\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 431 ")
    with socket.create_connection((server.host, server.port), timeout=10) as s:  # one huge field: 431 too
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"v" * 100_000 + b"\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 431 ")
    assert load_generator.post(server.predict_url, {"x": 1.0}) == (200, {"y": 2.0})


def test_workers_die_when_the_server_main_process_is_killed(api_file):
    """SIGKILL of the server's main process alone (then the kernel dies too): no worker keeps the port."""
    with pytest.warns(UserWarning, match="stopped on its own"), server_process.serve(f"{api_file}:Double") as srv:
        workers = [p for p in server_process.group_pids(srv.pgid) if p != srv.process.pid]
        assert workers and server_process.port_open(srv.port)
        os.kill(srv.process.pid, signal.SIGKILL)
        end = time.monotonic() + 20
        while (server_process.group_pids(srv.pgid) or server_process.port_open(srv.port)) and time.monotonic() < end:
            time.sleep(0.2)
        assert server_process.group_pids(srv.pgid) == [], "worker processes outlived the server's main process"
        assert not server_process.port_open(srv.port)
    import shutil

    shutil.rmtree(srv.run_dir, ignore_errors=True)  # kept for the learner after an unexpected stop


def test_a_dead_model_worker_fails_requests_fast_naming_the_log(faulty):
    with pytest.warns(UserWarning, match=r"stopped on its own while in use; its log is kept at .*server.log"):
        with server_process.serve(faulty, max_batch_size=1) as srv:
            assert load_generator.post(srv.predict_url, {"x": 2.0}) == (200, {"y": 6.0})
            # The dying request first; the second one is sent while the worker is busy with it, so it is queued
            # (in flight) when the worker dies. Sent together, either could reach the worker first.
            from concurrent.futures import ThreadPoolExecutor

            t0 = time.perf_counter()
            with ThreadPoolExecutor(2) as pool:
                dying = pool.submit(load_generator.post, srv.predict_url, {"x": 666}, timeout=25)
                time.sleep(0.3)
                queued = pool.submit(load_generator.post, srv.predict_url, {"x": 1.0}, timeout=25)
                results = [dying.result(), queued.result()]
            waited = time.perf_counter() - t0
            log = srv.run_dir / "server.log"
            assert waited < 10, f"in-flight requests waited {waited:.0f} s for a dead worker"
            for status, out in results:
                assert status == 503 and "model worker process" in str(out) and str(log) in str(out), results
        assert log.exists()
    import shutil

    shutil.rmtree(srv.run_dir, ignore_errors=True)


def test_load_generators_keep_their_time_bound_against_a_hung_model(faulty):
    with server_process.serve(faulty, max_batch_size=1) as srv:
        for gen in (
            lambda: load_generator.closed_loop(
                srv.predict_url, [{"x": 13}], n_requests=50, concurrency=4, max_seconds=2
            ),
            lambda: load_generator.open_loop(srv.predict_url, [{"x": 13}], rate=5, n_requests=50, max_seconds=2),
        ):
            t0 = time.perf_counter()
            res = gen()
            took = time.perf_counter() - t0
            assert took < 2 + load_generator.DRAIN_S + 3, f"max_seconds=2 returned after {took:.0f} s"
            assert res.n_ok == 0 and res.n_cancelled + res.n_failed >= 1


def test_setup_with_a_relative_path_runs_in_the_callers_folder(faulty, tmp_path, monkeypatch):
    with server_process.serve(faulty) as srv:
        assert load_generator.post(srv.predict_url, {"x": 2.0}) == (200, {"y": 6.0})
        assert srv.settings["cwd"] == str(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no factor.txt here: the error says where relative paths are looked up
    with pytest.raises(server_process.ServingError, match=rf"runs in the folder {elsewhere}.*relative"):
        with server_process.serve(faulty, start_timeout=120):
            pass


def test_lesson_13_writefile_cells_work_with_a_space_in_tmpdir(tmp_path):
    """TMPDIR with a space: every `%%writefile {WORK}/...` line of lesson 13 must still write its file."""
    from IPython.testing.globalipapp import start_ipython

    lesson = server_process.REPO_ROOT / "lessons" / "13_serving.py"
    lines = [ln[2:] for ln in lesson.read_text().splitlines() if ln.startswith("# %%writefile")]
    assert len(lines) >= 2
    work = tmp_path / "my temp dir" / "lesson13_x"
    work.mkdir(parents=True)
    ip = start_ipython()
    ip.user_ns["WORK"] = work
    for line in lines:
        magic, _, arg = line.partition(" ")
        ip.run_cell_magic(magic.lstrip("%"), arg, "x = 1\n")
    assert sorted(p.name for p in work.iterdir()) == ["embed_server.py", "my_api.py"]
    for name in ("embed_server.py", "my_api.py"):  # and a plain-script run finds the same cells
        out = server_process.writefile_fallback(tmp_path / name, lesson)
        assert out.read_text().startswith("import litserve as ls")


# ---- run folders left by a server and then its kernel dying ---------------------------------------------------


@pytest.fixture
def short_tmpdir():
    """A TMPDIR with a short path: the server's multiprocessing puts AF_UNIX sockets there (at most 107 bytes; a
    pytest tmp_path under xdist with a long test name is longer)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="cs"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_run_folder_left_by_dead_server_and_kernel_is_removed_at_the_next_start(api_file, tmp_path, monkeypatch,
                                                                                  short_tmpdir):  # fmt: skip
    """The server's main process is killed, then the kernel dies: no process is left to remove the run folder;
    the next serve() removes it (its owner is gone), and keeps the folders of live owners."""
    import tempfile

    tmp = short_tmpdir
    script = tmp_path / "kernel.py"
    script.write_text(
        textwrap.dedent(f"""
        import time
        from course_utils.serve import server_process
        with server_process.serve("{api_file}:Double") as srv:
            print(srv.pgid, srv.process.pid, srv.run_dir, flush=True)
            time.sleep(600)
    """)
    )
    env = dict(os.environ, PYTHONPATH=str(server_process.REPO_ROOT), TMPDIR=str(tmp))
    kernel = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        pgid, main_pid, run_dir = kernel.stdout.readline().split()
        os.kill(int(main_pid), signal.SIGKILL)
        end = time.monotonic() + 20
        while server_process.group_pids(int(pgid)) and time.monotonic() < end:
            time.sleep(0.2)
        kernel.send_signal(signal.SIGKILL)
        kernel.wait(10)
    finally:
        if kernel.poll() is None:
            kernel.kill()
    assert server_process.group_pids(int(pgid)) == [] and Path(run_dir).is_dir()
    live = tmp / "course_serve_live"  # a folder another notebook of ours still uses: kept
    live.mkdir()
    (live / "server.log").write_text("")
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    with server_process.serve(f"{api_file}:Double") as srv:
        assert srv.run_dir.parent == tmp
        assert not Path(run_dir).exists(), "the stale run folder was not removed"
        (live / "owner").write_text((srv.run_dir / "owner").read_text())  # owned by this live process
    with server_process.serve(f"{api_file}:Double"):
        pass
    assert live.is_dir(), "a live owner's run folder was removed"


def test_load_result_percentiles_of_a_known_list():
    lat = [float(x) for x in range(101)]
    r = load_generator.LoadResult("open", 8, 5.0, 101, 3, 4.0, lat, {200: 101, 500: 3}, n_not_sent=2)
    assert (r.p50_ms, r.p90_ms, r.p99_ms) == (50.0, 90.0, 99.0)
    assert r.percentile(10) == 10.0 and r.percentile(75) == 75.0
    assert r.throughput == pytest.approx(101 / 4.0)
    d = r.as_dict()
    assert (d["p50_ms"], d["p90_ms"], d["p99_ms"], d["n_ok"], d["n_failed"], d["n_not_sent"]) == (
        50.0,
        90.0,
        99.0,
        101,
        3,
        2,
    )
    empty = load_generator.LoadResult("closed", 1, float("nan"), 0, 0, 0.0, [])
    assert empty.throughput == 0.0 and empty.p50_ms != empty.p50_ms  # nan, not an error


DELAY_S = 0.02  # the server's known answer time

BLOCK_S = 0.03  # the client's known lag per request (encoding a body blocks the event loop)

N = 8


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("content-length", 0)))
        time.sleep(DELAY_S)
        body = b'{"ok": 1}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/predict"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class SlowBody(dict):
    """A JSON body whose encoding takes BLOCK_S: the client falls behind its schedule by a known amount."""

    def items(self):
        time.sleep(BLOCK_S)
        return super().items()


def test_open_loop_latency_counts_from_the_due_time(slow_server):
    # N arrivals bunched into microseconds, so all are due at once. The client falls behind: starting request k
    # (encoding its body) blocks the event loop for BLOCK_S, so no answer can be read before all N have started,
    # N * BLOCK_S after they were due. Counted from the due time, every latency is at least that; counted from
    # the moment each request was started or sent, the backlog would vanish (request k would lose k * BLOCK_S).
    r = load_generator.open_loop(slow_server, [SlowBody(x=1)], rate=1e6, n_requests=N, max_in_flight=64, seed=3)
    assert r.n_ok == N and r.n_failed == 0 and r.n_not_sent == 0
    lat = sorted(r.latencies_ms)
    assert lat[0] >= N * BLOCK_S * 1000 * 0.9, (
        f"all {N} requests were due at once and none could be sent before ~{N * BLOCK_S * 1000:.0f} ms, yet the "
        f"shortest latency is {lat[0]:.0f} ms: latency must count from the due time, not from the send"
    )
    assert lat[-1] < 5000, lat


def test_open_loop_refuses_beyond_max_in_flight(slow_server):
    # six arrivals at once, at most two outstanding: exactly two are sent, four are counted as not sent
    r = load_generator.open_loop(slow_server, [b'{"x": 1}'], rate=1e6, n_requests=6, max_in_flight=2, seed=0)
    assert (r.n_ok, r.n_not_sent, r.n_failed) == (2, 4, 0), r.as_dict()
    assert r.concurrency == 2 and r.rate == 1e6 and r.mode == "open"


def test_closed_loop_counts_every_answer(slow_server):
    r = load_generator.closed_loop(slow_server, [b'{"x": 1}'], n_requests=6, concurrency=2)
    assert r.n_ok == 6 and r.statuses == {200: 6} and len(r.latencies_ms) == 6
    assert min(r.latencies_ms) >= DELAY_S * 1000 * 0.9
    # each of the 2 clients waits for one answer at a time: its latencies are disjoint parts of the run, so all 6
    # together fit in 2 x the wall time (counted from the run's start instead, they would add up to ~4 x)
    assert sum(r.latencies_ms) <= 2 * r.wall_s * 1000 * 1.01, (sum(r.latencies_ms), r.wall_s)


def test_streamed_line_times_count_from_the_due_time(slow_server):
    # as in the open-loop test: all N due at once, each body's encoding blocks the loop BLOCK_S, so no line can be
    # read before N * BLOCK_S after the due time; counted from each send, the backlog would vanish
    answers = stream_load.open_loop_stream(slow_server, [SlowBody(x=1)], rate=1e6, n_requests=N, timeout=30)
    assert len(answers) == N and all(a.ok for a in answers), [a.error for a in answers]
    assert all(a.lines == [{"ok": 1}] and len(a.times_s) == 1 for a in answers)
    first = min(a.times_s[0] for a in answers)
    assert first >= N * BLOCK_S * 0.9, f"the earliest line came {first * 1000:.0f} ms after it was due"


def _call_guard(chunks: list[bytes], headers: tuple = (), **limits) -> tuple[int, dict, bool]:
    """Send ``chunks`` as one POST body through RequestGuard (no content-length); return status, JSON, app ran."""
    ran = []

    async def app(scope, receive, send):
        msg = await receive()
        ran.append(msg["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "headers": [(b"content-type", b"application/json"), *headers]}
    asyncio.run(g.RequestGuard(app, **limits)(scope, receive, send))
    status = sent[0]["status"]
    body = json.loads(sent[1]["body"])
    return status, body, bool(ran)


def test_body_limit_is_on_the_total_over_many_small_chunks():
    payload = json.dumps({"x": "a" * 3000}).encode()  # 3,009 bytes
    chunks = [payload[i : i + 100] for i in range(0, len(payload), 100)]  # 31 chunks of at most 100 bytes
    status, body, ran = _call_guard(chunks, max_bytes=3008)
    assert status == 413 and not ran, "3,009 bytes in 100-byte chunks exceed a 3,008-byte limit in total"
    assert body["detail"] == "the body exceeds the limit of 3008 bytes"
    status, _, ran = _call_guard(chunks, max_bytes=3009)
    assert status == 200 and ran, "exactly the limit is allowed"


def test_declared_length_is_refused_before_reading_only_above_the_limit():
    body = b'{"x": "' + b"a" * 91 + b'"}'  # 100 bytes
    status, detail, ran = _call_guard([body], headers=((b"content-length", b"100"),), max_bytes=100)
    assert status == 200 and ran
    status, detail, ran = _call_guard([body], headers=((b"content-length", b"101"),), max_bytes=100)
    assert status == 413 and not ran
    assert detail["detail"] == "a body of 101 bytes exceeds the limit of 100 bytes"


def test_nesting_limit_exact_boundary():
    def objects(k: int) -> bytes:  # k nested objects, the innermost empty: depth k
        return b'{"a": ' * (k - 1) + b"{}" + b"}" * (k - 1)

    for n in (1, 5, 32):
        g.check_json(b"[" * n + b"]" * n, max_depth=n)  # depth n is allowed
        g.check_json(objects(n), max_depth=n)
        g.check_json(b"[" * (n - 1) + b"[7]" + b"]" * (n - 1), max_depth=n + 1)  # a number is one level more
        for body in (b"[" * (n + 1) + b"]" * (n + 1), objects(n + 1), b"[" * (n - 1) + b"[7]" + b"]" * (n - 1)):
            with pytest.raises(g._Reject) as info:
                g.check_json(body, max_depth=n)
            assert info.value.status == 400
            assert info.value.message == f"the JSON is nested too deeply (more than {n} levels)"
    assert g.DEFAULT_MAX_DEPTH == 32
    g.check_json(b"[" * 32 + b"]" * 32)
    with pytest.raises(g._Reject):
        g.check_json(b"[" * 33 + b"]" * 33)


def test_integer_digits_exact_boundary():
    assert g.check_json(b'{"n": ' + b"9" * 18 + b"}")["n"] == int("9" * 18)
    assert g.check_json(b'{"n": -' + b"9" * 18 + b"}")["n"] == -int("9" * 18)
    with pytest.raises(g._Reject) as info:
        g.check_json(b'{"n": ' + b"9" * 19 + b"}")
    assert info.value.status == 422 and "19 digits" in info.value.message
    assert g.check_json(b"[1234]", max_int_digits=4) == [1234]
    with pytest.raises(g._Reject):
        g.check_json(b"[12345]", max_int_digits=4)


def test_pid_alive_counts_a_zombie_as_dead():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end:  # exited, not yet reaped by us: a zombie
            stat = Path(f"/proc/{proc.pid}/stat").read_text()
            if stat[stat.rfind(")") + 2 :][:1] == "Z":
                break
            time.sleep(0.02)
        assert stat[stat.rfind(")") + 2 :][:1] == "Z"
        assert server_process.pid_alive(proc.pid) is False
        assert server_process.pid_alive(os.getpid()) is True
    finally:
        proc.wait()
    assert server_process.pid_alive(proc.pid) is False  # reaped: gone


def test_stop_kills_a_group_that_ignores_sigterm(tmp_path):
    code = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout.readline() == b"ready\n"  # SIGTERM is ignored from here on
        srv = server_process.Server("127.0.0.1", 0, proc.pid, tmp_path, {}, proc)
        t0 = time.monotonic()
        server_process.stop(srv, grace=0.3)
        assert proc.poll() == -signal.SIGKILL and server_process.group_pids(proc.pid) == []
        assert time.monotonic() - t0 >= 0.3  # SIGTERM had its grace period first
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


class _EchoHandler(BaseHTTPRequestHandler):
    """``/status/NNN`` answers NNN; ``/echo`` streams a blank line, then the body; both count requests and the
    most in flight at once (``/slow`` first waits 0.2 s)."""

    lock = threading.Lock()
    seen = {"requests": 0, "now": 0, "peak": 0}

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        with self.lock:
            self.seen["requests"] += 1
            self.seen["now"] += 1
            self.seen["peak"] = max(self.seen["peak"], self.seen["now"])
        try:
            if self.path == "/slow":
                time.sleep(0.2)
            status = int(self.path.rsplit("/", 1)[1]) if self.path.startswith("/status/") else 200
            out = b"\n" + body + b"\n" if self.path == "/echo" else b'{"ok": 1}'
            self.send_response(status)
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
        finally:
            with self.lock:
                self.seen["now"] -= 1

    def log_message(self, *args):
        pass


@pytest.fixture
def echo_server():
    _EchoHandler.seen.update(requests=0, now=0, peak=0)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _EchoHandler.seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_every_2xx_is_good_and_other_answers_are_failed(echo_server):
    url, _ = echo_server
    created = load_generator.closed_loop(f"{url}/status/201", [b"{}"], n_requests=4, concurrency=2)
    assert (created.n_ok, created.n_failed, created.statuses, len(created.latencies_ms)) == (4, 0, {201: 4}, 4)
    bad = load_generator.closed_loop(f"{url}/status/500", [b"{}"], n_requests=4, concurrency=2)
    assert (bad.n_ok, bad.n_failed, bad.statuses, bad.latencies_ms) == (0, 4, {500: 4}, [])
    opened = load_generator.open_loop(f"{url}/status/204", [b"{}"], rate=1e6, n_requests=3, seed=0)
    assert (opened.n_ok, opened.n_failed, opened.statuses) == (3, 0, {204: 3})


def test_closed_loop_sends_its_warmup_first_and_keeps_its_clients_busy(echo_server):
    url, seen = echo_server
    r = load_generator.closed_loop(f"{url}/slow", [b"{}"], n_requests=8, concurrency=4, warmup=2)
    assert r.n_ok == 8 and seen["requests"] == 2 + 8, "the 2 warm-up requests are sent, not counted"
    assert seen["peak"] >= 2, "4 clients: more than one request in flight at a time"


def test_the_first_open_loop_arrival_goes_at_once(echo_server):
    url, seen = echo_server
    # at 0.01 requests/s the second arrival is due ~80 s later (seed 0), beyond max_seconds: only the first goes
    r = load_generator.open_loop(f"{url}/echo", [b"{}"], rate=0.01, n_requests=2, max_seconds=1.0, seed=0)
    assert (r.n_ok, seen["requests"]) == (1, 1)
    answers = stream_load.open_loop_stream(f"{url}/echo", [b"{}"], rate=0.01, n_requests=2, max_seconds=1.0, seed=0)
    assert [a.due_s for a in answers] == [0.0] and answers[0].ok


def test_a_load_of_zero_seconds_is_refused(echo_server):
    url, seen = echo_server
    with pytest.raises(ValueError, match="max_seconds > 0"):
        load_generator.closed_loop(url, [b"{}"], n_requests=1, concurrency=1, max_seconds=0)
    with pytest.raises(ValueError, match="max_seconds > 0"):
        load_generator.open_loop(url, [b"{}"], rate=1.0, n_requests=1, max_seconds=0)
    assert seen["requests"] == 0


def test_post_many_gives_status_0_to_a_request_without_answer():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    [(status, text)] = load_generator.post_many(f"http://127.0.0.1:{port}/p", [{"x": 1}], timeout=5)
    assert status == 0 and text.startswith("ConnectError"), (status, text)


def test_streamed_lines_skip_blanks_and_each_request_sends_its_own_body(echo_server):
    url, _ = echo_server
    bodies = [{"i": 0}, {"i": 1}, {"i": 2}]
    answers = stream_load.open_loop_stream(f"{url}/echo", bodies, rate=1e6, n_requests=5, timeout=30)
    assert [a.lines for a in answers] == [[{"i": i % 3}] for i in range(5)], "blank lines are no lines"
    assert all(a.ok and len(a.times_s) == 1 for a in answers)
    assert not stream_load.StreamedAnswer(0, 0.0, status=200, error="ReadTimeout: cut").ok


def test_the_model_call_record_writes_milliseconds_under_its_ms_label(tmp_path, monkeypatch):
    """CallRecorder's line is '<start s> <predict ms>': a call from t=100.000 s to 100.250 s is written
    "100.000000 250.000" and read back by Server.calls as predict_ms 250 (not 0.25: seconds under an ms label),
    a 2 ms call as 2.0; a line that is not two numbers is skipped."""
    from course_utils.serve import server_watch

    clock = iter([100.0, 100.25, 101.0, 101.002])
    monkeypatch.setattr(server_watch, "time", __import__("types").SimpleNamespace(time=lambda: next(clock)))
    rec = server_watch.CallRecorder(str(tmp_path / "calls.txt"))
    for _ in range(2):
        rec.on_before_predict()
        rec.on_after_predict()
    assert (tmp_path / "calls.txt").read_text().splitlines() == ["100.000000 250.000", "101.000000 2.000"]
    with open(tmp_path / "calls.txt", "a") as fh:
        fh.write("torn\n")
    server = server_process.Server("127.0.0.1", 0, 0, tmp_path, {}, process=None)
    calls = server.calls()
    assert list(calls.columns) == ["start_s", "predict_ms"]
    assert calls["predict_ms"].tolist() == pytest.approx([250.0, 2.0]) and calls["start_s"].tolist() == [100.0, 101.0]
    assert server.calls(since=1)["predict_ms"].tolist() == pytest.approx([2.0])
