"""results.record, load_results and machine_label: the rows written, read back and labelled.

results.record and paths.append_text pinned: each timing column comes from the right statistic, and a planted
race (many processes appending at once, each slow between looking at the file and writing) gives one header and
intact lines only because of the file lock.

Odd results files lose nothing they need not (issue 24): a NUL byte, a zeroed tail left by a crash, a note over
the csv field limit, spreadsheet re-saves (cp1252, semicolons, a BOM), spreadsheet formulas in notes (neutralized on
disk, shown unchanged), and machine labels (install ids of cloned VMs, the machine fingerprint)."""

from __future__ import annotations

import csv
import io
import multiprocessing as mp
import os
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest

from course_utils.measuring import timing
from course_utils.measuring.timing import Measurement
from course_utils.show import leaderboard, machine_label, results
from course_utils.supply import paths


def test_record_appends_rows_with_machine_fields():
    m = Measurement(times_ms=[1.0, 2.0, 3.0], device="cpu", batch_size=8)
    row = results.record("99", "baseline", model="m", dtype="fp32", measurement=m, notes="x")
    results.record("99", "faster", model="m", dtype="fp32", median_ms=1.0, speedup_vs_baseline=2.0)
    assert row["median_ms"] == 2.0 and row["batch_size"] == 8 and row["throughput"] == pytest.approx(4000)
    files = list(results.results_dir().glob("*.csv"))
    assert len(files) == 1
    df = results.load_results()
    assert list(df["technique"]) == ["baseline", "faster"]
    assert set(results.COLUMNS) <= set(df.columns)
    assert df["lesson"].iloc[0] == "99"  # lesson ids stay strings


def test_load_results_skips_malformed_file(tmp_path):
    good = tmp_path / "good.csv"
    results.record("99", "t", median_ms=1.0)
    good.write_text(next(results.results_dir().glob("*.csv")).read_text())
    bad = tmp_path / "bad.csv"
    bad.write_text("not,a,results\nfile,at,all\n")
    with pytest.warns(UserWarning, match="bad.csv"):
        df = results.load_results([good, bad])
    assert len(df) == 1 and df["source"].iloc[0] == "good.csv"


def test_reference_results_and_show_reference(capsys):
    df = results.reference_results("01")
    shown = results.show_reference("01")
    out = capsys.readouterr().out
    if df.empty:
        assert shown is None and "not been executed on a GPU" in out
    else:
        assert "Reference results measured on" in out


def test_machine_id_is_file_safe():
    mid = machine_label.machine_id()
    assert mid and all(c.isalnum() or c in "._-" for c in mid)


def _first_rows_at_once(barrier, lesson: str) -> None:
    barrier.wait()
    results.record(lesson, "concurrent", median_ms=1.0)


def test_concurrent_first_writes_give_one_header_per_file(tmp_path, monkeypatch):
    """4 processes writing their first row at the same instant (as under `make test -n 2`), 6 times."""
    import multiprocessing

    machine_label.machine_id()  # import torch & co. before forking, so the children start level
    ctx = multiprocessing.get_context("fork")
    for trial in range(6):
        folder = tmp_path / f"trial{trial}"
        monkeypatch.setenv("COURSE_RESULTS_DIR", str(folder))
        barrier = ctx.Barrier(4)
        procs = [ctx.Process(target=_first_rows_at_once, args=(barrier, f"9{i}")) for i in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert all(p.exitcode == 0 for p in procs)
        files = list(folder.glob("*.csv"))
        assert len(files) == 1, f"trial {trial}: the four processes disagreed on the machine: {files}"
        lines = files[0].read_text().splitlines()
        assert sum(line.startswith("lesson,") for line in lines) == 1, f"trial {trial}: {lines}"
        assert len(lines) == 5 and len(results.load_results()) == 4


def test_malformed_line_is_warned_and_skipped_not_the_whole_file(tmp_path):
    for i in range(50):
        results.record("99", f"t{i}", median_ms=float(i + 1), notes='a, "quoted" note')
    path = next(results.results_dir().glob("*.csv"))
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    broken = lines[:7] + [lines[7].rstrip("\n") + ",extra\n"] + lines[8:]  # one row with an extra comma
    broken.append("99,torn row")  # a row cut short by a killed process
    path.write_text("".join(broken))
    with pytest.warns(UserWarning, match=rf"skipped 2 malformed row\(s\) of results file .*{path.name}.*line 8"):
        df = results.load_results()
    assert len(df) == 49 and 7.0 not in set(df["median_ms"]) and df["median_ms"].max() == 50.0
    assert df["notes"].iloc[0] == 'a, "quoted" note'


def test_non_number_row_skipped_and_repeated_header_dropped(tmp_path):
    header = ",".join(results.COLUMNS)
    row = dict.fromkeys(results.COLUMNS, "")
    row.update(lesson="01", technique="t", median_ms="2.5", machine="m")
    good = ",".join(row[c] for c in results.COLUMNS)
    bad = good.replace("2.5", "fast!")
    f = tmp_path / "old.csv"
    f.write_text("\n".join([header, good, header, good, bad]) + "\n")
    with pytest.warns(UserWarning, match="line 5: column 'median_ms' holds 'fast!'"):
        df = results.read_rows(f)
    assert len(df) == 2 and df["median_ms"].tolist() == [2.5, 2.5]


def test_identical_machine_images_keep_distinct_machines_and_labels(tmp_path, monkeypatch):
    """Two attendees: same host name and CPU (a cloned image), each with their own results folder."""
    from course_utils.show import leaderboard as lb

    pooled = tmp_path / "pooled"
    pooled.mkdir()
    for who, ms in (("alice", 2.0), ("bob", 3.0)):
        monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path / who))
        row = results.record("14", "baseline", model="m", dtype="fp32", batch_size=1, median_ms=ms)
        src = next((tmp_path / who).glob("*.csv"))
        assert src.name == f"{row['machine']}.csv"
        (pooled / f"{who}-{src.name}").write_bytes(src.read_bytes())
    machines = {p.name.split("-", 1)[1] for p in pooled.glob("*.csv")}
    assert len(machines) == 2, "the two installs got the same machine name (and file name)"
    assert machine_label.install_id(tmp_path / "alice") == machine_label.install_id(tmp_path / "alice")
    df = lb.load(pooled, include_reference=False)
    table = lb.leaderboard(df, lesson="14")
    assert len(table.columns) == 2 and sorted(table.iloc[0].tolist()) == [2.0, 3.0]


def _sample_reference(folder):
    import pandas as pd

    row = dict.fromkeys(results.COLUMNS)
    row.update(
        lesson="01",
        technique="H2D copy pinned",
        model="digits-cnn",
        dtype="fp32",
        batch_size=64,
        median_ms=0.123,
        gpu="NVIDIA H200",
        torch="2.14.1",
        time="2026-11-30T10:00",
        machine="lab",
    )
    folder.mkdir()
    pd.DataFrame([row], columns=results.COLUMNS).to_csv(folder / "H200.csv", index=False)
    return folder


def test_show_reference_prints_its_table_in_a_plain_script(tmp_path):
    import subprocess
    import sys

    ref = _sample_reference(tmp_path / "ref")
    code = (
        f"from pathlib import Path\nfrom course_utils.show import results\nresults.REFERENCE_DIR = Path({str(ref)!r})\n"
        "if False:\n    pass\nelse:\n    results.show_reference('01', 'H2D')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "Reference results measured on NVIDIA H200" in out
    assert "H2D copy pinned" in out and "0.123" in out, out


def test_show_reference_displays_its_table_in_a_notebook(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    ref = _sample_reference(tmp_path / "ref")
    src = (
        f"from pathlib import Path\nfrom course_utils.show import results\nresults.REFERENCE_DIR = Path({str(ref)!r})\n"
        "if False:\n    pass\nelse:\n    results.show_reference('01')"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src)])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[0].outputs
    html = [o["data"]["text/html"] for o in outputs if o.get("output_type") == "display_data"]
    assert len(html) == 1 and "H2D copy pinned" in html[0] and "<table" in html[0], outputs


def test_show_reference_without_rows_says_not_executed(tmp_path, capsys):
    ref = _sample_reference(tmp_path / "ref")
    assert results.show_reference("07", folder=ref) is None
    assert "not been executed on a GPU" in capsys.readouterr().out
    shown = results.show_reference("1", folder=ref)
    assert list(shown["technique"]) == ["H2D copy pinned"]


def test_a_row_torn_by_a_killed_process_does_not_swallow_the_next_row():
    results.record("99", "before", median_ms=1.0)
    path = next(results.results_dir().glob("*.csv"))
    with open(path, "a") as fh:
        fh.write("99,killed-mid-li")  # no newline: the writer died here
    with pytest.warns(UserWarning, match=r"the last 16 bytes of .* were a row cut short .*kept in .*\.csv\.torn"):
        results.record("99", "after", median_ms=2.0)  # the torn tail is cut first, its bytes kept beside the file
    df = results.load_results()
    assert list(df["technique"]) == ["before", "after"]
    assert path.with_name(path.name + ".torn").read_text() == "99,killed-mid-li"


# ---- rows torn by a killed writer, inside a quoted note ------------------------------------------------------


def _line_of(technique: str, note: str) -> str:
    """The CSV line ``record`` writes for a row (recorded in a scratch folder of its own, read back)."""
    import os
    import secrets

    saved = os.environ["COURSE_RESULTS_DIR"]
    os.environ["COURSE_RESULTS_DIR"] = f"{saved}-scratch-{secrets.token_hex(4)}"
    try:
        results.record("99", technique, median_ms=3.0, notes=note)
        path = next(results.results_dir().glob("*.csv"))
        return path.read_text(encoding="utf-8").split("\n", 1)[1]
    finally:
        os.environ["COURSE_RESULTS_DIR"] = saved


def test_a_row_torn_inside_a_quoted_note_does_not_swallow_the_rows_after_it():
    """A writer killed inside a quoted note: the rows recorded after it all load (3 of 8 did)."""
    for i in range(3):
        results.record("99", f"before{i}", median_ms=1.0, notes=f'note {i}, with "quotes"')
    path = next(results.results_dir().glob("*.csv"))
    line = _line_of("killed", 'a long note, with "quotes",\nand a second line')
    torn = line[: line.index("second")]  # cut inside the open quote, after the note's own newline
    with open(path, "a", encoding="utf-8", newline="") as fh:
        fh.write(torn)
    with pytest.warns(UserWarning, match="were a row cut short"):
        results.record("99", "after0", median_ms=2.0, notes="after, 0")
    for i in range(1, 5):
        results.record("99", f"after{i}", median_ms=2.0, notes=f"after, {i}")
    df = results.load_results()
    assert list(df["technique"]) == [f"before{i}" for i in range(3)] + [f"after{i}" for i in range(5)]
    assert df["notes"].iloc[0] == 'note 0, with "quotes"' and df["notes"].iloc[-1] == "after, 4"


def test_the_reader_resynchronises_on_the_next_whole_row_after_a_torn_one(tmp_path):
    """A file torn by an older writer (the torn line ended with a newline, rows appended after it)."""
    header = ",".join(results.COLUMNS) + "\n"
    good = [_line_of(f"t{i}", f'row {i}, "quoted"\nsecond line') for i in range(6)]
    torn = _line_of("torn", 'killed, "here"\nand more')
    torn = torn[: torn.index("and more")]  # the newline inside the note is the last byte written
    f = tmp_path / "old.csv"
    f.write_text(header + good[0] + good[1] + torn + "".join(good[2:]), encoding="utf-8")
    with pytest.warns(UserWarning, match=r"skipped 1 malformed row\(s\).*line 6"):
        df = results.read_rows(f)
    assert list(df["technique"]) == [f"t{i}" for i in range(6)]
    assert df["notes"].iloc[5] == 'row 5, "quoted"\nsecond line'


def test_a_note_holding_text_that_looks_like_a_row_stays_one_row():
    """Re-synchronising must not split a note whose own line parses as a whole row."""
    lookalike = _line_of("inner", "x").rstrip("\n")
    results.record("99", "outer", median_ms=1.0, notes="first line\n" + lookalike + "\nlast line")
    results.record("99", "next", median_ms=2.0)
    df = results.load_results()
    assert list(df["technique"]) == ["outer", "next"]
    assert df["notes"].iloc[0] == "first line\n" + lookalike + "\nlast line"


def test_a_torn_multibyte_character_at_the_end_does_not_make_the_file_unreadable():
    results.record("99", "kept", median_ms=1.0, notes="✓ fine")
    path = next(results.results_dir().glob("*.csv"))
    with open(path, "ab") as fh:
        fh.write(_line_of("torn", "a note ending in ✓").encode()[:-30])
        fh.write("✓".encode()[:2])  # killed between the bytes of one character
    with pytest.warns(UserWarning, match="skipped 1 malformed row"):
        df = results.load_results()
    assert list(df["technique"]) == ["kept"]


# ---- the install id file, damaged ------------------------------------------------------------------------------


def test_an_install_id_that_is_not_text_is_renewed_saying_so():
    """Bytes that are not UTF-8 in .install_id: every record() raised a bare UnicodeDecodeError naming no file."""
    path = results.results_dir() / machine_label.INSTALL_ID_FILE
    path.write_bytes(b"\xff\xfe\x80 not an id \xc3")
    with pytest.warns(UserWarning, match=r"\.install_id .*not text.*new install id"):
        row = results.record("99", "t", median_ms=1.0)
    assert row["machine"].endswith("_" + machine_label.install_id())
    assert len(results.load_results()) == 1


def test_an_install_id_path_that_is_a_folder_names_the_file():
    from course_utils.supply.errors import CourseError

    path = results.results_dir() / machine_label.INSTALL_ID_FILE
    path.mkdir()
    with pytest.raises(CourseError, match=r"\.install_id.*Remove it"):
        results.record("99", "t", median_ms=1.0)


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


def _eight_rows() -> Path:
    for i in range(8):
        results.record("99", f"t{i}", model="m", dtype="fp32", batch_size=1, median_ms=1.0 + i, notes=f"row {i}")
    return next(results.results_dir().glob("*.csv"))


def test_a_nul_byte_in_a_note_loses_one_line_not_the_file():
    path = _eight_rows()
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace("row 2", "row\x00 2")  # line 4 of the file: the third row
    path.write_text("".join(lines))
    with pytest.warns(UserWarning, match=r"skipped 1 malformed row.*line 4: NUL bytes"):
        df = results.load_results()
    assert sorted(df["technique"]) == [f"t{i}" for i in range(8) if i != 2]


def test_a_zeroed_tail_left_by_a_crash_keeps_earlier_and_later_rows():
    path = _eight_rows()
    with open(path, "ab") as fh:  # a crash left a block of zeros where the next row should be
        fh.write(b"\x00" * 4096)
    with pytest.warns(UserWarning, match=r"the last 4096 bytes of .* were a row cut short"):  # cut before appending
        results.record("99", "after-the-crash", median_ms=9.0)
    results.record("99", "later-still", median_ms=9.5, notes="also \x00 kept (NUL stripped on write)")
    df = results.load_results()
    assert len(df) == 10
    assert list(df["technique"])[-2:] == ["after-the-crash", "later-still"]
    assert df["notes"].iloc[-1] == "also  kept (NUL stripped on write)"


def test_a_note_over_the_csv_field_limit_loses_nothing():
    big = "x" * 200_000  # the csv module's default field limit is 131,072 characters
    results.record("99", "before", median_ms=1.0)
    with pytest.warns(UserWarning, match="recorded its first 32000"):
        row = results.record("99", "long-note", median_ms=2.0, notes=big)
    assert len(row["notes"]) < 32_100
    results.record("99", "after", median_ms=3.0)
    path = next(results.results_dir().glob("*.csv"))
    with open(path, "a") as fh:  # a file written by an older course version, with the whole note
        fh.write(path.read_text().splitlines()[2].replace(row["notes"], big) + "\n")
    results.record("99", "after-the-old-row", median_ms=4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = results.load_results()
    assert list(df["technique"]) == ["before", "long-note", "after", "long-note", "after-the-old-row"]
    assert len(df["notes"].iloc[3]) == 200_000
    assert csv.field_size_limit() == 131_072  # the global limit is restored


def test_cloned_vms_with_the_same_install_id_file_get_distinct_labels(tmp_path, monkeypatch):
    image = tmp_path / "image-results"
    image.mkdir()
    (image / ".install_id").write_text("abc123\n")  # an older course's file, baked into the VM image
    pooled = tmp_path / "pooled"
    pooled.mkdir()
    for n, who in enumerate(("vm1", "vm2", "vm3")):
        folder = tmp_path / who
        folder.mkdir()
        (folder / ".install_id").write_bytes((image / ".install_id").read_bytes())  # the clone's copy
        monkeypatch.setattr(machine_label, "machine_fingerprint", lambda who=who: f"machine-id-of-{who}")
        monkeypatch.setenv("COURSE_RESULTS_DIR", str(folder))
        row = results.record("14", "baseline", model="m", dtype="fp32", batch_size=1, median_ms=1.0 + n)
        assert machine_label.install_id(folder) == machine_label.install_id(folder)  # stable on its own machine
        for f in folder.glob("*.csv"):
            (pooled / f.name).write_bytes(f.read_bytes())
        assert row["machine"].endswith(machine_label.install_id(folder))
    df = leaderboard.load(pooled, include_reference=False)
    assert df["label"].nunique() == 3
    assert len(leaderboard.leaderboard(df, lesson="14").columns) == 3


def test_install_id_is_renewed_when_the_machine_changes_and_kept_otherwise(tmp_path, monkeypatch):
    monkeypatch.setattr(machine_label, "machine_fingerprint", lambda: "one")
    first = machine_label.install_id(tmp_path)
    assert machine_label.install_id(tmp_path) == first
    assert (tmp_path / ".install_id").read_text().split() == [first, "one"]
    monkeypatch.setattr(machine_label, "machine_fingerprint", lambda: "a-clone")
    second = machine_label.install_id(tmp_path)
    assert second != first and machine_label.install_id(tmp_path) == second


def test_machine_fingerprint_is_stable_and_file_safe():
    fp = machine_label.machine_fingerprint()
    assert fp == machine_label.machine_fingerprint() and len(fp) == 16 and fp.isalnum()


FORMULAS = ['=HYPERLINK("http://x","click")', "+1+2", "-2+3", "@SUM(A1)", "\t=1", "'=already", "\r\n=1"]


def test_formulas_are_neutralized_on_disk_and_shown_unchanged():
    for i, note in enumerate(FORMULAS):
        results.record("99", f"t{i}", model=note, median_ms=1.0, notes=note)
    path = next(results.results_dir().glob("*.csv"))
    rows = list(csv.DictReader(io.StringIO(path.read_bytes().decode(), newline="")))
    for row in rows:  # what a spreadsheet sees: no cell starts with a formula character
        for col in ("notes", "model"):
            assert not row[col].startswith(("=", "+", "-", "@", "\t", "\r")), row[col]
            assert row[col].startswith(("'", "\n"))  # a leading line end is no formula
    assert pd.read_csv(path)["median_ms"].tolist() == [1.0] * len(FORMULAS)  # still a plain CSV for pandas
    shown = [f.replace("\r\n", "\n") for f in FORMULAS]  # a lone CR would split the row: line ends become LF
    df = results.load_results()
    assert df["notes"].tolist() == shown and df["model"].tolist() == shown  # the course's views: unchanged
    board = leaderboard.load(include_reference=False)
    assert sorted(board["notes"]) == sorted(shown)


@pytest.mark.parametrize("text", ["plain", "", "'quoted", "a=b", "''=x", "-", "3-2"])
def test_neutralize_round_trips(text):
    assert results.unneutralize(results.neutralize(text)) == text


def _one_good_file(tmp_path: Path) -> Path:
    results.record("14", "baseline", model="m", median_ms=1.5, notes="café")
    return next(results.results_dir().glob("*.csv"))


def test_cp1252_file_is_skipped_naming_the_encoding(tmp_path):
    good = _one_good_file(tmp_path)
    bad = tmp_path / "ansi.csv"
    bad.write_bytes(good.read_text().encode("cp1252"))
    with pytest.warns(UserWarning, match=r"ansi.csv: cannot be read .*not UTF-8 .*cp1252.*CSV UTF-8"):
        df = results.load_results([good, bad])
    assert len(df) == 1


def test_semicolon_file_is_skipped_naming_the_separator(tmp_path):
    good = _one_good_file(tmp_path)
    bad = tmp_path / "semicolons.csv"
    pd.read_csv(good).to_csv(bad, sep=";", decimal=",", index=False)
    with pytest.warns(UserWarning, match=r"semicolons.csv: cannot be read .*separated by ';'"):
        df = results.load_results([good, bad])
    assert len(df) == 1


def test_a_spreadsheet_utf8_file_with_bom_loads(tmp_path):
    good = _one_good_file(tmp_path)
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + good.read_bytes())
    df = results.load_results([bom])
    assert df["lesson"].tolist() == ["14"] and df["notes"].tolist() == ["café"]


def test_nested_checks_mark_rows_with_the_inner_check_and_restore_the_outer():
    assert os.environ.get(results.INSIDE_CHECK_VAR) is None
    with results.inside_check("03.outer"):
        with results.inside_check("05.inner"):
            row = results.record("99", "t", median_ms=1.0)
            assert os.environ[results.INSIDE_CHECK_VAR] == "05.inner"
        assert os.environ[results.INSIDE_CHECK_VAR] == "03.outer", "the outer check's variable is back"
        outer = results.record("99", "u", median_ms=1.0)
    assert os.environ.get(results.INSIDE_CHECK_VAR) is None
    assert row["mode"].endswith(f"; {results.CHECK_MARK} 05.inner") and outer["mode"].endswith("check 03.outer")
    plain = results.record("99", "v", median_ms=1.0)
    assert list(results.recorded_in_check(results.load_results())) == [True, True, False]
    assert results.CHECK_MARK not in plain["mode"]


def test_a_field_is_cut_only_beyond_the_text_limit():
    at_limit = "x" * results.TEXT_LIMIT
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert results._safe_text("notes", at_limit) == at_limit
    with pytest.warns(UserWarning, match=f"recorded its first {results.TEXT_LIMIT}"):
        assert results._safe_text("notes", at_limit + "y") == at_limit + " [cut]"


def test_a_file_without_the_machine_column_is_skipped_naming_it(tmp_path):
    f = tmp_path / "no_machine.csv"
    f.write_text("lesson,technique,median_ms\n03,baseline,1.0\n")
    with pytest.warns(UserWarning, match=r"skipped results file .*no_machine.csv: missing columns \['machine'\]"):
        assert results.load_results([f]).empty


def test_only_a_results_header_is_taken_as_a_file_s_own_columns(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("foo,bar\n1,2\n")
    assert results._existing_header(f) is None, "not a results file's header: the course's columns are used"
    f.write_text(",".join(results.COLUMNS) + "\n")
    assert results._existing_header(f) is None
    older = [c for c in results.COLUMNS if c != "speedup_low"]
    f.write_text(",".join(older) + "\n")
    assert results._existing_header(f) == older
    assert results._existing_header(tmp_path / "missing.csv") is None


def test_the_warning_counts_the_skipped_rows_beyond_the_five_it_names(tmp_path):
    f = tmp_path / "many.csv"
    f.write_text("lesson,technique,median_ms,machine\n03,ok,1.0,m\n" + "".join(f"03,bad{i},1.0\n" for i in range(7)))
    with pytest.warns(UserWarning, match=r"skipped 7 malformed row\(s\) .*line 7: .* and 2 more\); kept its 1 good"):
        df = results.read_rows(f)
    assert list(df["technique"]) == ["ok"]


@pytest.mark.parametrize("spelled", ["nan", "-nan", "+NaN"])
def test_nan_spelled_out_is_dropped_from_its_row_which_is_kept(spelled):
    header, good, bad = results.results_file.parse_rows(f"technique,median_ms\na,{spelled}\nb,2.0\n", ["median_ms"])
    assert good == [["a", ""], ["b", "2.0"]]
    assert bad == ["line 2: column 'median_ms' holds 'nan' (value dropped, row kept)"]


def test_blank_lines_are_neither_rows_nor_errors():
    header, good, bad = results.results_file.parse_rows("a,b\n1,2\n\n,\n3,4\n", ["b"])
    assert header == ["a", "b"] and good == [["1", "2"], ["3", "4"]] and bad == []


def test_the_stamp_record_writes_is_24_hour_so_the_afternoon_sorts_after_the_morning(monkeypatch):
    """The ``time`` column as record() writes it: ``YYYY-MM-DDTHH:MM:SS`` on a 24-hour clock, so that text order
    is time order and the leaderboard's newest row is the afternoon's (a 12-hour clock writes 14:05 as 02:05)."""
    clock = {"now": (2026, 12, 3, 9, 30, 0, 3, 337, -1)}
    real = time.strftime
    monkeypatch.setattr(results, "time", type("Clock", (), {"strftime": staticmethod(lambda f: real(f, clock["now"]))}))
    results.record("03", "batch 8", median_ms=1.0, speedup_vs_baseline=4.0)
    clock["now"] = (2026, 12, 3, 14, 5, 0, 3, 337, -1)
    results.record("03", "batch 8", median_ms=2.0, speedup_vs_baseline=2.0)
    path = next(results.results_dir().glob("*.csv"))
    with open(path, newline="") as f:
        stamps = [r["time"] for r in csv.DictReader(f)]
    assert stamps == ["2026-12-03T09:30:00", "2026-12-03T14:05:00"], "ISO-like, 24-hour, to the second"
    assert sorted(stamps) == stamps, "the afternoon sorts after the morning"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = leaderboard.load(include_reference=False)
    newest = leaderboard.latest_rows(df)
    assert list(newest["speedup_vs_baseline"]) == [2.0] and list(newest["time"]) == ["2026-12-03T14:05:00"]
