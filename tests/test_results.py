import pytest

from course_utils import results
from course_utils.timing import Measurement


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


def test_latest_and_compare_machines():
    import pandas as pd

    df = pd.DataFrame(
        [
            {"machine": "a", "lesson": "01", "technique": "t", "model": "m", "dtype": "fp32", "batch_size": 1,
             "mode": "full", "median_ms": 2.0, "time": "2026-01-01"},
            {"machine": "a", "lesson": "01", "technique": "t", "model": "m", "dtype": "fp32", "batch_size": 1,
             "mode": "full", "median_ms": 1.0, "time": "2026-01-02"},
            {"machine": "b", "lesson": "01", "technique": "t", "model": "m", "dtype": "fp32", "batch_size": 1,
             "mode": "full", "median_ms": 5.0, "time": "2026-01-01"},
        ]
    )  # fmt: skip
    assert len(results.latest(df)) == 2
    wide = results.compare_machines(df)
    assert list(wide.columns) == ["a", "b"] and wide.iloc[0].tolist() == [1.0, 5.0]


def test_reference_results_and_show_reference(capsys):
    df = results.reference_results("01")
    shown = results.show_reference("01")
    out = capsys.readouterr().out
    if df.empty:
        assert shown is None and "unverified" in out
    else:
        assert "Reference results measured on" in out


def test_machine_id_is_file_safe():
    mid = results.machine_id()
    assert mid and all(c.isalnum() or c in "._-" for c in mid)
