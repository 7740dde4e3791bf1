"""results.record and paths.append_text pinned: each timing column comes from the right statistic, and a planted
race (many processes appending at once, each slow between looking at the file and writing) gives one header and
intact lines only because of the file lock."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from pathlib import Path

import pandas as pd
import pytest

from course_utils.measuring import timing
from course_utils.show import results
from course_utils.supply import paths


def test_record_fills_each_timing_column_from_its_statistic():
    m = timing.Measurement(times_ms=[float(x) for x in range(101)], device="cpu", batch_size=4)
    row = results.record("01", "known", model="m", measurement=m)
    assert (row["median_ms"], row["p90_ms"], row["batch_size"], row["device"]) == (50.0, 90.0, 4, "cpu")
    assert row["throughput"] == pytest.approx(80.0)
    df = pd.read_csv(results.results_dir() / f"{row['machine']}.csv")
    assert list(df.columns) == results.COLUMNS
    got = df.iloc[0]
    assert (got["median_ms"], got["p90_ms"], got["batch_size"], got["throughput"]) == (50.0, 90.0, 4, 80.0)
    assert (got["lesson"], got["technique"], got["model"]) == (1, "known", "m")


def test_explicit_values_win_over_the_measurement():
    m = timing.Measurement(times_ms=[1.0, 2.0, 3.0], device="cpu", batch_size=2)
    row = results.record(
        "01",
        "x",
        measurement=m,
        median_ms=7.0,
        p90_ms=9.0,
        throughput=5.0,
        batch_size=3,
        device="cuda",
        speedup_vs_baseline=1.5,
        error_vs_baseline=0.01,
    )
    assert (row["median_ms"], row["p90_ms"], row["throughput"], row["batch_size"], row["device"]) == (
        7.0,
        9.0,
        5.0,
        3,
        "cuda",
    )
    assert (row["speedup_vs_baseline"], row["error_vs_baseline"]) == (1.5, 0.01)
    row = results.record("01", "y", median_ms=2.0)
    assert row["p90_ms"] is None and row["throughput"] is None and row["batch_size"] is None


# ------------------------------------------------------------------------------- the planted race on a lock

N_PROCS, N_LINES, LINE_LEN = 6, 12, 20_000


def _writer(path: str, who: int, barrier) -> None:
    barrier.wait()
    for k in range(N_LINES):
        body = f"{who:02d}-{k:03d}:" + chr(ord("a") + who) * LINE_LEN + "\n"

        def text(empty: bool, body: str = body) -> str:
            time.sleep(0.01)  # slow between looking at the file and writing: a race shows without the lock
            return ("HEADER\n" + body) if empty else body

        paths.append_text(Path(path), text)


def test_append_text_lock_survives_a_planted_race(tmp_path):
    target = tmp_path / "shared.csv"
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    barrier = ctx.Barrier(N_PROCS)
    procs = [ctx.Process(target=_writer, args=(str(target), i, barrier)) for i in range(N_PROCS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    lines = target.read_text().split("\n")
    assert lines[-1] == "", "the file ends with a newline"
    lines = lines[:-1]
    assert lines.count("HEADER") == 1 and lines[0] == "HEADER", (
        f"{lines.count('HEADER')} header lines: the empty-file check and the write must happen under one lock"
    )
    body = lines[1:]
    assert len(body) == N_PROCS * N_LINES
    for line in body:
        who = int(line[:2])
        assert line[7:] == chr(ord("a") + who) * LINE_LEN, f"a torn or interleaved line: {line[:30]}..."
    assert sorted(body) == sorted(
        f"{w:02d}-{k:03d}:" + chr(ord("a") + w) * LINE_LEN for w in range(N_PROCS) for k in range(N_LINES)
    )


def test_append_text_holds_an_exclusive_lock_while_writing(tmp_path, monkeypatch):
    fcntl = pytest.importorskip("fcntl")
    target = tmp_path / "f.txt"
    seen = []

    def text(empty: bool) -> str:
        # another descriptor on the same file cannot take the lock while append_text writes
        fd = os.open(target, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append("free")
            except BlockingIOError:
                seen.append("held")
        finally:
            os.close(fd)
        return "x\n"

    paths.append_text(target, text)
    assert seen == ["held"]
    fd = os.open(target, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released afterwards
    finally:
        os.close(fd)


# ------------------------------------------------------------------------ writers killed at random, mid-row


def test_writers_killed_at_random_lose_no_complete_row(tmp_path):
    """4 writers appending rows with long quoted notes, killed at random moments (in 1 round of 3 one of them
    mid-row, holding the lock), 100 rounds into one file (tests/results_writers.py): every row whose record()
    returned loads, exactly as recorded, once."""
    import subprocess
    import sys
    import warnings

    from tests.results_writers import note

    folder, done = tmp_path / "results", tmp_path / "done.txt"
    done.write_text("")
    env = dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "tests.results_writers", str(folder), str(done), "100", "20261201"]
    subprocess.run(cmd, cwd=paths.REPO_ROOT, env=env, check=True, timeout=300)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a row torn by the last round's kills is reported; what matters is what loads
        df = results.load_results(sorted(folder.glob("*.csv")))
    names = list(df["technique"])
    assert len(names) == len(set(names)), "a row was loaded twice"
    damaged = [name for name, text in zip(df["technique"], df["notes"], strict=True) if text != note(name)]
    assert not damaged, f"rows loaded with a damaged note: {damaged[:3]}"
    lost = sorted(set(done.read_text().split()) - set(names))
    assert not lost, f"{len(lost)} complete row(s) lost, e.g. {lost[:3]}"
    assert len(names) > 100 and (folder / "killed-writers.csv.torn").stat().st_size > 0  # rows were torn, and cut
