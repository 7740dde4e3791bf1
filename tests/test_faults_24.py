"""Issue 24, faults round two: each probe of the issue, as a test that failed on the code it was filed against.

Data loss (NUL bytes, long notes, cloned-VM install ids), spreadsheet formulas in notes, unusable
COURSE_RESULTS_DIR values, implausible leaderboard values, spreadsheet re-saves, shipped-data oddities (stray
JPEGs, FIFOs, /dev/zero) and the torch weights cache. The server probes are in ``test_serving.py``.
"""

from __future__ import annotations

import csv
import io
import os
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

from course_utils.show import leaderboard, machine_label, results
from course_utils.supply import data, models, paths
from course_utils.supply.errors import ChecksumError, SettingError, WeightsFileError

# ---- data loss ---------------------------------------------------------------------------------------------


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


# ---- spreadsheet formulas ----------------------------------------------------------------------------------

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


# ---- COURSE_RESULTS_DIR values that must not become folders in the checkout --------------------------------


@pytest.mark.parametrize(
    "value, words",
    [
        ("$SCRATCH_NOT_SET_24/results", "$SCRATCH_NOT_SET_24, which is not set"),
        ("${SCRATCH_NOT_SET_24}/results", "$SCRATCH_NOT_SET_24, which is not set"),
        ("~nosuchuser24/results", "'~nosuchuser24' names no user"),
        ("file:///tmp/course-results", "a URL, not a path: set a plain path such as '/tmp/course-results'"),
        ("'/tmp/course results'", "quote characters"),
        ('"/tmp/course results"', "quote characters"),
    ],
)
def test_unusable_results_dir_values_are_refused_before_any_folder_is_made(monkeypatch, value, words):
    monkeypatch.delenv("SCRATCH_NOT_SET_24", raising=False)
    before = set(paths.REPO_ROOT.iterdir())
    monkeypatch.setenv("COURSE_RESULTS_DIR", value)
    with pytest.raises(SettingError, match="COURSE_RESULTS_DIR") as info:
        results.record("99", "t", median_ms=1.0)
    assert words in str(info.value)
    assert set(paths.REPO_ROOT.iterdir()) == before, "a folder was created inside the checkout"


def test_the_error_for_an_unwritable_folder_does_not_suggest_that_folder(monkeypatch, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "course-results").write_text("a file where the folder should be")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("COURSE_RESULTS_DIR", "~/course-results")
    with pytest.raises(SettingError) as info:
        paths.results_dir()
    message = str(info.value)
    assert "=~/course-results`" not in message and "export COURSE_RESULTS_DIR=" in message


def test_reading_results_needs_no_write_access(monkeypatch, tmp_path):
    folder = tmp_path / "ro"
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(folder))
    results.record("14", "baseline", median_ms=1.0)
    paths._writable.clear()

    def no_write(path):
        raise SettingError(f"the results folder {path} cannot be written")

    monkeypatch.setattr(paths, "_ensure_writable", no_write)  # root writes through chmod: refuse every write
    assert len(leaderboard.load(include_reference=False)) == 1
    assert len(results.load_results()) == 1


# ---- leaderboard values that are not measurements ----------------------------------------------------------


def _board_file(tmp_path: Path, speedups: list[str]) -> Path:
    folder = tmp_path / "board"
    folder.mkdir()
    rows = []
    for i, s in enumerate(speedups):
        row = dict.fromkeys(results.COLUMNS, "")
        row.update(
            lesson="14",
            technique=f"t{i}",
            model="m",
            dtype="fp32",
            batch_size="1",
            median_ms="1.0",
            speedup_vs_baseline=s,
            machine=f"host_cpu_{i:06x}",
            cpu="cpu",
            time="2026-12-01T10:00",
        )
        rows.append(row)
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=results.COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    (folder / "a.csv").write_text(out.getvalue())
    return folder


def test_inf_huge_and_nan_speedups_do_not_top_the_leaderboard(tmp_path):
    folder = _board_file(tmp_path, ["inf", "1e308", "NaN", "2.5", "-3", "1.5"])
    with pytest.warns(UserWarning) as caught:
        df = leaderboard.load(folder, include_reference=False)
    text = " ".join(str(w.message) for w in caught)
    assert "dropped 3 speedup_vs_baseline value(s)" in text and "t0 = inf" in text and "t1 = 1e+308" in text
    assert "column 'speedup_vs_baseline' holds 'nan'" in text
    best = leaderboard.best_technique(df, "14")
    assert best["speedup_vs_baseline"].max() == 2.5 and len(df) == 6  # rows kept, the bad values dropped


# ---- spreadsheet re-saves ----------------------------------------------------------------------------------


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


# ---- shipped data: stray photos, FIFOs, /dev/zero ----------------------------------------------------------


@pytest.fixture
def data_copy(tmp_path, monkeypatch) -> Path:
    """A copy of data/images and SHA256SUMS, used by the data module in place of the shipped folder."""
    import shutil

    folder = tmp_path / "data"
    shutil.copytree(data.DATA_DIR / "images", folder / "images")
    shutil.copy(data.DATA_DIR / "SHA256SUMS", folder / "SHA256SUMS")
    monkeypatch.setattr(data, "DATA_DIR", folder)
    return folder


def test_stray_jpegs_are_ignored_with_a_note_naming_them(data_copy):
    shipped = [p.name for p in data.jpeg_paths()]
    (data_copy / "images" / "my_cat.jpg").write_bytes(b"\xff\xd8\xff my own photo")
    (data_copy / "images" / f"._{shipped[0]}").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    with pytest.warns(UserWarning, match=r"ignored 2 file\(s\) .*(\._|my_cat).*SHA256SUMS") as caught:
        again = [p.name for p in data.jpeg_paths()]
    assert again == shipped
    assert "my_cat.jpg" in str(caught[0].message) and f"._{shipped[0]}" in str(caught[0].message)


def test_a_changed_shipped_photo_still_fails_its_checksum(data_copy):
    victim = sorted((data_copy / "images").glob("*.jpg"))[0]
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(ChecksumError, match=victim.name):
        data.jpeg_paths()


def _finishes(fn, seconds: float = 10.0):
    """Run ``fn`` in a thread; (finished, exception or result)."""
    import threading

    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["value"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive(), box.get("value")


def _sums(folder: Path, name: str) -> None:
    (folder / "SHA256SUMS").write_text(f"{'0' * 64}  {name}\n")


def test_a_data_file_linked_to_dev_zero_stops_with_a_clear_error(tmp_path):
    _sums(tmp_path, "digits_cnn.pt")
    (tmp_path / "digits_cnn.pt").symlink_to("/dev/zero")
    done, out = _finishes(lambda: data.verified_path("digits_cnn.pt", data_dir=tmp_path))
    assert done, "the checksum read of a link to /dev/zero did not stop"
    assert isinstance(out, ChecksumError) and "a character device" in str(out) and "/dev/zero" in str(out)
    assert "git checkout -- " in str(out)


def test_a_data_file_that_is_a_fifo_stops_with_a_clear_error(tmp_path):
    _sums(tmp_path, "digits_cnn.pt")
    fifo = tmp_path / "digits_cnn.pt"
    os.mkfifo(fifo)
    try:
        done, out = _finishes(lambda: data.verified_path("digits_cnn.pt", data_dir=tmp_path))
    finally:
        try:  # unblock a reader left waiting by a broken implementation
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert done, "the checksum read of a FIFO did not stop"
    assert isinstance(out, ChecksumError) and "a FIFO" in str(out)


def test_the_checksums_script_names_a_fifo_instead_of_dropping_it(tmp_path):
    from scripts import checksums

    _sums(tmp_path, "a.txt")
    (tmp_path / "a.txt").write_text("x")
    os.mkfifo(tmp_path / "b.txt")
    try:
        done, out = _finishes(lambda: checksums.write_checksums(tmp_path))
    finally:
        try:
            os.close(os.open(tmp_path / "b.txt", os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    assert done and isinstance(out, ChecksumError) and "b.txt" in str(out) and "FIFO" in str(out)


# ---- the torch weights cache -------------------------------------------------------------------------------


def test_torch_cache_follows_torch_hub_get_dir(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.torch_cache_dir() == Path(torch.hub.get_dir()) / "checkpoints"
    assert models.torch_cache_dir() == tmp_path / "xdg" / "torch" / "hub" / "checkpoints"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCH_HOME", "~/th")
    assert models.torch_cache_dir() == tmp_path / "home" / "th" / "hub" / "checkpoints"


def test_unreadable_torch_home_falls_back_to_random_weights_with_a_note(monkeypatch, tmp_path):
    home = tmp_path / "th"
    (home / "hub" / "checkpoints").mkdir(parents=True)
    monkeypatch.setenv("TORCH_HOME", str(home))
    if os.geteuid() == 0:  # root reads through permissions: make the cache folder refuse like a locked one
        real = Path.is_file

        def locked(self):
            if str(self).startswith(str(home)):
                raise PermissionError(13, "Permission denied", str(self))
            return real(self)

        monkeypatch.setattr(Path, "is_file", locked)
    else:
        home.chmod(0)
    try:
        model, note = models.resnet("resnet18")
    finally:
        home.chmod(0o700)
    assert not model.training
    assert "random weights" in note and "cannot be read" in note and "PermissionError" in note


def test_an_unreadable_weights_file_is_called_unreadable_not_a_pickle(tmp_path):
    unreadable = tmp_path / "resnet18.pth"
    unreadable.mkdir()  # a folder where the file should be: unreadable for root too
    with pytest.raises(WeightsFileError) as info:
        models.load_weights(unreadable, fix="copy a good one there.")
    msg = str(info.value)
    assert "unreadable" in msg and "IsADirectoryError" in msg and "pickle" not in msg and "copy a good one" in msg
    if os.geteuid() != 0:
        locked = tmp_path / "locked.pth"
        torch.save({"w": torch.zeros(1)}, locked)
        locked.chmod(0)
        with pytest.raises(WeightsFileError, match="unreadable .*PermissionError"):
            models.load_weights(locked, fix="x")


def test_a_pickle_is_still_called_unsafe(tmp_path):
    bad = tmp_path / "evil.pth"
    torch.save({"w": torch.zeros(1), "f": print}, bad)
    with pytest.raises(WeightsFileError, match="safe loader refused"):
        models.load_weights(bad, fix="x")
