import pytest

from course_utils.measuring.timing import Measurement
from course_utils.show import machine_label, results


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
