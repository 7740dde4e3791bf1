"""The leaderboard pools several machines' result files; a malformed file is skipped, nothing else lost.

Implausible values (inf, huge and NaN speedups) do not top the leaderboard (issue 24)."""

from __future__ import annotations

import csv
import io
import json
import warnings
from pathlib import Path

import pandas as pd
import pytest

from course_utils.show import leaderboard, results
from course_utils.show import leaderboard as lb
from course_utils.show.results import COLUMNS
from course_utils.supply.errors import BadArgumentError


def _rows(machine: str, gpu: str, cpu: str, speeds: dict[str, float], time: str = "2026-11-01T10:00:00"):
    rows = []
    for tech, ms in speeds.items():
        row = {c: None for c in COLUMNS}
        row.update(
            lesson="14",
            technique=tech,
            model="digits-cnn",
            dtype="fp32",
            batch_size=1,
            median_ms=ms,
            speedup_vs_baseline=speeds["baseline"] / ms,
            machine=machine,
            gpu=gpu,
            cpu=cpu,
            torch="2.14.1",
            mode="full",
            time=time,
        )
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


@pytest.fixture
def attendee_files(tmp_path):
    a = tmp_path / "alice_laptop.csv"
    _rows("alice_Intel-i7", "", "Intel i7", {"baseline": 2.0, "onnxruntime": 1.0}).to_csv(a, index=False)
    b = tmp_path / "bob_gpu.csv"
    _rows("bob_L4", "NVIDIA L4", "AMD EPYC", {"baseline": 0.5, "onnxruntime": 0.4, "tensorrt fp16": 0.1}).to_csv(
        b, index=False
    )
    garbage = tmp_path / "carol_broken.csv"
    garbage.write_bytes(b"\x00\x01PK\x03\x04 not a csv \xff\xfe")
    missing = tmp_path / "dave_wrong_columns.csv"
    missing.write_text("foo,bar\n1,2\n")
    bad_numbers = tmp_path / "erin_bad_numbers.csv"
    bad = _rows("erin_M2", "", "Apple M2", {"baseline": 3.0})
    bad["median_ms"] = ["fast!"]
    bad.to_csv(bad_numbers, index=False)
    empty = tmp_path / "frank_empty.csv"
    empty.write_text("")
    return tmp_path, [a, b, garbage, missing, bad_numbers, empty]


def test_pool_keeps_good_files_and_names_each_bad_one(attendee_files):
    _, files = attendee_files
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = lb.pool(files)
    messages = " | ".join(str(w.message) for w in caught)
    for name in ["carol_broken.csv", "dave_wrong_columns.csv", "erin_bad_numbers.csv", "frank_empty.csv"]:
        assert name in messages, f"no warning names {name}: {messages}"
    assert "alice_laptop.csv" not in messages and "bob_gpu.csv" not in messages
    assert len(df) == 5 and set(df["source"]) == {"alice_laptop.csv", "bob_gpu.csv"}
    assert df["median_ms"].dtype.kind == "f"


def test_leaderboard_puts_machines_side_by_side(attendee_files, tmp_path):
    folder, _ = attendee_files
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = lb.load(folder, include_reference=False)
    table = lb.leaderboard(df, lesson="14")
    assert len(table.columns) == 2
    assert any("L4" in c for c in table.columns) and any("Intel i7" in c for c in table.columns)
    onnx = table.xs("onnxruntime", level="technique").iloc[0]
    assert sorted(onnx.dropna().tolist()) == [0.4, 1.0]
    best = lb.best_technique(df, "14")
    assert set(best["technique"]) == {"onnxruntime", "tensorrt fp16"}
    who = lb.machines(df)
    assert len(who) == 2 and who["rows"].sum() == 5
    assert len(lb.plot(lb.leaderboard(df, lesson="14", value="speedup_vs_baseline")).axes) >= 1


def test_newest_row_wins_and_references_are_labelled(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    old = _rows("me_cpu", "", "Xeon", {"baseline": 4.0}, time="2026-11-01T10:00:00")
    new = _rows("me_cpu", "", "Xeon", {"baseline": 3.0}, time="2026-11-02T10:00:00")
    pd.concat([old, new]).to_csv(own / "me_cpu.csv", index=False)
    ref = tmp_path / "ref"
    ref.mkdir()
    _rows("lab_H100", "NVIDIA H100", "Xeon", {"baseline": 0.2}).to_csv(ref / "H100_2026-11-20.csv", index=False)
    (ref / "H100_2026-11-20.env.json").write_text(
        json.dumps({"gpu": "NVIDIA H100", "torch": "2.14.1", "tensorrt": "11.1", "date": "2026-11-20"})
    )
    refs = lb.references(ref)
    assert refs["label"].iloc[0].startswith("reference: NVIDIA H100") and "2026-11-20" in refs["label"].iloc[0]
    df = pd.concat([lb.load(own, include_reference=False), refs], ignore_index=True)
    table = lb.leaderboard(df, value="median_ms")
    mine = [c for c in table.columns if "Xeon" in c and not c.startswith("reference")][0]
    assert table[mine].iloc[0] == 3.0
    with pytest.raises(BadArgumentError, match="value must be"):
        lb.leaderboard(df, value="colour")


def test_empty_inputs():
    assert lb.pool([]).empty
    assert lb.leaderboard(pd.DataFrame()).empty
    assert lb.machines(lb.pool([])).empty


def test_one_bad_row_does_not_drop_the_good_rows_of_its_file(tmp_path):
    rows = _rows("gina_T4", "NVIDIA T4", "Xeon", {"baseline": 2.0, "compiled": 1.0, "onnxruntime": 0.8})
    rows["median_ms"] = rows["median_ms"].astype(object)
    rows.loc[1, "median_ms"] = "n/a"
    f = tmp_path / "gina.csv"
    rows.to_csv(f, index=False)
    with open(f, "a") as fh:
        fh.write("14,extra,comma,,\n")
    with pytest.warns(UserWarning, match=r"skipped 2 malformed row\(s\) of results file .*gina.csv"):
        df = lb.pool([f])
    assert sorted(df["technique"]) == ["baseline", "onnxruntime"] and df["median_ms"].dtype.kind == "f"


def test_labels_keep_identical_images_apart():
    a = pd.Series({"gpu": "", "cpu": "Xeon", "machine": "lab-01_Xeon_0a1b2c", "mode": "full"})
    b = pd.Series({"gpu": "", "cpu": "Xeon", "machine": "lab-01_Xeon_9f8e7d", "mode": "full"})
    old = pd.Series({"gpu": "", "cpu": "Xeon", "machine": "lab-01_Xeon", "mode": "smoke"})
    assert lb._label(a) != lb._label(b) and lb._label(a) == "Xeon [lab-01 #0a1b2c]"
    assert lb._label(old) == "Xeon [lab-01] (smoke)"


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


def test_a_lesson_asked_as_a_number_finds_its_two_digit_rows():
    df = lb._normalise(_rows("me_cpu", "", "Xeon", {"baseline": 2.0, "fast": 1.0}).assign(lesson="3"))
    df["label"] = "me"
    assert list(df["lesson"].unique()) == ["03"]
    for asked in (3, "3", "03"):
        assert list(lb.leaderboard(df, lesson=asked)["me"]) == [2.0, 1.0]
    assert lb.leaderboard(df, lesson="14").empty


def test_rows_recorded_inside_an_exercise_check_stay_off_the_board(tmp_path):
    rows = _rows("me_cpu", "", "Xeon", {"baseline": 2.0, "fast": 0.001})
    rows.loc[1, "mode"] = f"smoke; {results.CHECK_MARK} 03.knee"
    rows.to_csv(tmp_path / "me.csv", index=False)
    with pytest.warns(UserWarning, match=r"kept 1 row\(s\) of .*me.csv off the board: recorded inside an exercise"):
        df = lb.pool([tmp_path / "me.csv"])
    assert list(df["technique"]) == ["baseline"]


def test_attendee_name_is_its_first_printable_line_cut_at_forty(tmp_path):
    (tmp_path / lb.ATTENDEE_FILE).write_text("  A\x1b[31md\x07a " + "x" * 60 + "\nsecond\n")
    name = lb.attendee_name(tmp_path)
    assert name == ("A[31mda " + "x" * 60)[:40] and len(name) == lb.NAME_LIMIT
    assert lb.attendee_name(tmp_path / "nobody") == ""


def test_machines_lists_rows_lessons_and_the_newest_time():
    old = _rows("me_cpu", "", "Xeon", {"baseline": 2.0}, time="2026-11-01T10:00:00")
    new = _rows("me_cpu", "", "Xeon", {"baseline": 1.0, "fast": 0.5}, time="2026-11-03T10:00:00")
    df = pd.concat([old, new], ignore_index=True).assign(label="me", origin="this folder")
    me = lb.machines(df).set_index("label").loc["me"]
    assert (me["rows"], me["lessons"], me["newest"]) == (3, "14", "2026-11-03T10:00:00")


def test_speed_ups_past_ten_thousand_are_dropped_but_not_below():
    df = _rows("me_cpu", "", "Xeon", {"baseline": 1.0, "a": 1.0, "b": 1.0})
    df["speedup_vs_baseline"] = [1.0, 9_999.0, 20_000.0]
    with pytest.warns(UserWarning, match=r"dropped 1 speedup_vs_baseline value\(s\) .*b = 20000\.0.*0 to 10000"):
        out = lb._normalise(df, "f.csv")
    assert list(out["speedup_vs_baseline"].fillna(-1)) == [1.0, 9_999.0, -1]
    assert list(out["median_ms"]) == [1.0, 1.0, 1.0], "only the value is dropped, not the row"


def test_a_negative_change_against_the_baseline_is_kept_a_negative_time_is_not():
    """Lesson 12's accuracy change is negative when a variant beats its baseline: a measurement, kept. A negative
    time is not one: dropped with a warning naming the range."""
    df = _rows("me_cpu", "", "Xeon", {"baseline": 1.0, "a": 1.0, "b": 1.0})
    df["error_vs_baseline"] = [0.0, -12.5, 3.0]
    df["median_ms"] = [1.0, 1.0, -2.0]
    with pytest.warns(UserWarning, match=r"dropped 1 median_ms value\(s\) .*b = -2\.0.*0 to 1e\+12") as caught:
        out = lb._normalise(df, "f.csv")
    assert list(out["error_vs_baseline"]) == [0.0, -12.5, 3.0]
    assert list(out["median_ms"].fillna(-1)) == [1.0, 1.0, -1]
    assert not any("error_vs_baseline" in str(w.message) for w in caught)
    df["error_vs_baseline"] = [0.0, -2e12, 3.0]  # beyond any measurement on the negative side too
    with pytest.warns(UserWarning, match=r"dropped 1 error_vs_baseline value\(s\) .*-1e\+12 to 1e\+12"):
        assert lb._normalise(df, "f.csv")["error_vs_baseline"].isna().tolist() == [False, True, False]


def test_install_id_is_the_machine_name_s_last_six_hex_digits_else_the_folder_s(tmp_path):
    (tmp_path / ".install_id").write_text("123abc fingerprint\n")
    assert lb._install_id("lab-01_Xeon_0a1b2c", tmp_path) == "0a1b2c"
    assert lb._install_id("lab_0a1b2c_Xeon", tmp_path) == "123abc", "six hex digits inside the name are no id"
    assert lb._install_id("lab-01_Xeon_0a1b2c7", tmp_path) == "123abc"
    assert lb._install_id("lab", tmp_path / "none") == ""


def test_labels_show_only_a_six_digit_install_id_after_host_and_hardware():
    row = {"gpu": "", "cpu": "Xeon", "mode": "full"}
    assert lb._label(pd.Series({**row, "machine": "lab_abcdef"})) == "Xeon [lab]"  # two parts: host_hw, no id
    assert lb._label(pd.Series({**row, "machine": "lab_Xeon_0a1b2c7"})) == "Xeon [lab]"
    assert lb._label(pd.Series({**row, "machine": "lab_Xeon_abc"})) == "Xeon [lab]"
    assert lb._label(pd.Series({**row, "machine": "lab_Xeon_abc123", "gpu": "NVIDIA L4"})) == "NVIDIA L4 [lab #abc123]"


def test_a_reference_without_env_file_is_dated_by_its_newest_row(tmp_path):
    old = _rows("lab_H100", "NVIDIA H100", "Xeon", {"baseline": 0.2}, time="2026-11-01T10:00:00")
    new = _rows("lab_H100", "NVIDIA H100", "Xeon", {"fast": 0.1, "baseline": 0.2}, time="2026-11-05T10:00:00")
    pd.concat([old, new]).to_csv(tmp_path / "H100.csv", index=False)
    refs = lb.references(tmp_path)
    assert set(refs["label"]) == {"reference: NVIDIA H100 (torch 2.14.1; 2026-11-05)"}


def _two_days(first: dict[str, float], second: dict[str, float], **cols) -> pd.DataFrame:
    old = _rows("me_cpu", "", "Xeon", first, time="2026-11-01T14:00:00")
    new = _rows("me_cpu", "", "Xeon", second, time="2026-11-02T09:00:00")
    return pd.concat([new, old], ignore_index=True).assign(label="me", **cols)  # newest read first: order is no clue


def test_the_board_shows_each_machine_s_newest_row_not_its_best_ever():
    df = _two_days({"baseline": 2.0, "fast": 0.5}, {"baseline": 2.0, "fast": 1.0})  # fast: 4x then 2x
    assert lb.leaderboard(df, value="median_ms").xs("fast", level="technique")["me"].iloc[0] == 1.0
    assert lb.leaderboard(df, value="speedup_vs_baseline").xs("fast", level="technique")["me"].iloc[0] == 2.0
    best = lb.best_technique(df, "14")
    assert (best["technique"].iloc[0], best["speedup_vs_baseline"].iloc[0]) == ("fast", 2.0)
    slower = _two_days({"baseline": 2.0, "fast": 1.0}, {"baseline": 2.0, "fast": 4.0})  # newest is a slow-down
    assert list(lb.best_technique(slower, "14")["technique"]) == ["baseline"]


def test_rows_of_one_stamp_keep_their_read_order_and_a_row_without_a_stamp_is_the_oldest():
    same = _rows("me_cpu", "", "Xeon", {"baseline": 2.0}, time="2026-11-01T10:00:00")
    rows = pd.concat([same.assign(median_ms=5.0), same.assign(median_ms=3.0)] * 20, ignore_index=True)
    assert list(lb.latest_rows(rows.assign(label="me"))["median_ms"]) == [3.0], "the last row read wins a tie"
    unstamped = pd.concat([same.assign(median_ms=1.0, time=None), same], ignore_index=True).assign(label="me")
    assert list(lb.latest_rows(unstamped)["median_ms"]) == [2.0]


def test_the_speed_up_plot_draws_each_interval_as_whiskers_and_a_line_at_1x():
    import matplotlib

    matplotlib.use("agg")
    from matplotlib.container import ErrorbarContainer

    df = _rows("me_cpu", "", "Xeon", {"baseline": 2.0, "fast": 1.0, "same": 1.9}).assign(label="me")
    df["speedup_low"] = [None, 1.8, 0.9]
    df["speedup_high"] = [None, 2.3, 1.2]
    other = _rows("you_cpu", "", "Core", {"baseline": 1.0, "fast": 0.25, "same": 1.0}).assign(label="you")
    table = lb.leaderboard(pd.concat([df, other], ignore_index=True), value="speedup_vs_baseline")
    fig = lb.plot(table, title="t", xlabel="speed-up")
    ax = fig.axes[0]
    bars = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    width = {k: round(p.get_width(), 6) for k, p in bars.items()}
    assert (
        width["14 · fast · digits-cnn · fp32 · 1 | me"] == 2.0
        and width["14 · fast · digits-cnn · fp32 · 1 | you"] == 4.0
    )
    assert width["14 · same · digits-cnn · fp32 · 1 | me"] == round(2.0 / 1.9, 6)
    whiskers = [tuple(round(x, 6) for x in seg[:, 0]) for c in ax.containers if isinstance(c, ErrorbarContainer)
                for seg in c.lines[2][0].get_segments()]  # fmt: skip
    assert sorted(whiskers) == [(0.9, 1.2), (1.8, 2.3)], whiskers
    one = [ln for ln in ax.lines if ln.get_gid() == "1x"]
    assert len(one) == 1 and list(one[0].get_xdata()) == [1.0, 1.0]
    assert bars["14 · same · digits-cnn · fp32 · 1 | me"].get_hatch() == lb.NOISE_HATCH, "interval 0.9-1.2 holds 1x"
    assert (
        not bars["14 · fast · digits-cnn · fp32 · 1 | me"].get_hatch()
        and not bars["14 · same · digits-cnn · fp32 · 1 | you"].get_hatch()
    )
    ms = lb.plot(lb.leaderboard(df, value="median_ms"))
    assert not [ln for ln in ms.axes[0].lines if ln.get_gid() == "1x"], "no 1x line on a latency plot"
    matplotlib.pyplot.close("all")
