"""The shared plots draw the data they are given: line and bar values, bands, labels and titles are asserted."""

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from course_utils.show import plots

ROOT = Path(__file__).resolve().parent.parent

DF = pd.DataFrame(
    {
        "batch_size": [4, 1, 2],
        "median_ms": [2.5, 1.0, 1.5],
        "p10_ms": [2.2, 0.9, 1.4],
        "p90_ms": [2.9, 1.2, 1.7],
        "throughput": [1600.0, 1000.0, 1333.0],
    }
)


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _xy(line):
    return list(map(float, line.get_xdata())), list(map(float, line.get_ydata()))


def test_batch_curve_plots_sorted_medians_band_and_throughput():
    fig = plots.batch_curve(DF, label="mlp", title="T")
    lat, thr = fig.axes
    assert _xy(lat.lines[0]) == ([1.0, 2.0, 4.0], [1.0, 1.5, 2.5]), "median latency against batch size, sorted"
    assert _xy(thr.lines[0]) == ([1.0, 2.0, 4.0], [1000.0, 1333.0, 1600.0])
    band = lat.collections[0].get_paths()[0].vertices
    assert band[:, 1].min() == pytest.approx(0.9) and band[:, 1].max() == pytest.approx(2.9), "the p10-p90 band"
    for ax in (lat, thr):
        assert (ax.get_xscale(), ax.get_yscale(), ax.get_xlabel()) == ("log", "log", "batch size")
    assert lat.get_ylabel() == "ms per batch" and thr.get_ylabel() == "items/s"
    assert lat.get_title() == "mlp: latency (median, 95% CI; band p10-p90)" and thr.get_title() == "mlp: throughput"
    assert fig._suptitle.get_text() == "T"


def test_batch_curve_one_row_of_panels_per_model():
    two = pd.concat([DF.assign(variant="a"), DF.assign(variant="b", median_ms=DF["median_ms"] * 200)])
    axes = plots.batch_curve(two).axes
    assert len(axes) == 4, "a model 200x slower gets its own panels, not a flat line on a shared axis"
    assert [ax.get_title() for ax in axes[::2]] == [f"{v}: latency (median, 95% CI; band p10-p90)" for v in "ab"]
    assert _xy(axes[2].lines[0])[1] == [200.0, 300.0, 500.0]


def _with_ci(low, high):
    return DF.sort_values("batch_size").assign(median_low_ms=low, median_high_ms=high).drop(columns="throughput")


def test_batch_curve_whiskers_and_the_points_within_noise():
    # medians 1.0, 1.5, 2.5 ms at batches 1, 2, 4; throughput 1000, 1333, 1600 items/s
    df = _with_ci([0.9, 1.4, 2.1], [1.1, 1.6, 2.4])  # batch 4: 1667-1905/s overlaps batch 2's 1250-1429/s? no
    data = plots.batch_curve(df, label="m").course_data
    assert data["within_noise"].tolist() == [False, False, False]
    assert data["throughput_low"].tolist() == pytest.approx([1000 / 1.1, 2000 / 1.6, 4000 / 2.4])
    assert data["throughput_high"].tolist() == pytest.approx([1000 / 0.9, 2000 / 1.4, 4000 / 2.1])
    # batch 4's interval now reaches down to 1333/s (4000/3.0): it overlaps batch 2's (1250-1429/s)
    data = plots.batch_curve(_with_ci([0.9, 1.4, 2.1], [1.1, 1.6, 3.0]), label="m").course_data
    assert data["within_noise"].tolist() == [False, False, True]
    # touching ends count as overlapping; a gap of a hair does not
    assert plots.within_noise_of_previous([1.0, 2.0], [2.0, 3.0]).tolist() == [False, True]
    assert plots.within_noise_of_previous([1.0, 2.0001], [2.0, 3.0]).tolist() == [False, False]
    fig = plots.batch_curve(_with_ci([0.9, 1.4, 2.1], [1.1, 1.6, 3.0]), label="m")
    lat = fig.axes[0]
    segments = [seg for c in lat.collections if hasattr(c, "get_segments") for seg in c.get_segments()]
    spans = sorted((round(float(s[0][1]), 6), round(float(s[1][1]), 6)) for s in segments if s[0][0] == s[1][0])
    assert spans == [(0.9, 1.1), (1.4, 1.6), (2.1, 3.0)], "each median's 95% interval drawn as a whisker"
    hollow = [c for c in fig.axes[1].collections if c.get_label() == "within noise of the previous size"]
    assert len(hollow) == 1 and hollow[0].get_offsets().tolist() == [[4.0, pytest.approx(1600.0)]]


def test_save_writes_a_png_whose_data_reads_back(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    fig = plots.batch_curve(_with_ci([0.9, 1.4, 2.1], [1.1, 1.6, 3.0]), label="m")
    path = plots.save(fig, "03", "batch_curves")
    assert path.parent.parent == tmp_path / "figures" and path.name == "03_batch_curves.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    back = plots.figure_data(path)
    assert back["median_ms"].tolist() == [1.0, 1.5, 2.5] and back["within_noise"].tolist() == [False, False, True]
    assert back["median_high_ms"].tolist() == [1.1, 1.6, 3.0]
    # a figure without course_data: every line's points
    fig2, ax = plt.subplots()
    ax.plot([1, 2], [3, 4], label="line")
    back2 = plots.figure_data(plots.save(fig2, "01", "roofline"))
    assert back2[["line", "x", "y"]].values.tolist() == [["line", 1.0, 3.0], ["line", 2.0, 4.0]]
    with pytest.raises(ValueError, match="letters, digits"):
        plots.save(fig2, "01", "../escape")
    other = tmp_path / "plain.png"
    fig2.savefig(other)
    with pytest.raises(ValueError, match="not written by course_utils.show.plots.save"):
        plots.figure_data(other)


def test_speedup_bars_values_colours_and_baseline():
    fig = plots.speedup_bars({"fast": 1.5, "slow": 0.8}, title="S")
    ax = fig.axes[0]
    widths = [p.get_width() for p in ax.patches]
    assert widths == [1.5, 0.8]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fast", "slow"]
    green, red = (p.get_facecolor() for p in ax.patches)
    assert green[1] > green[0] and red[0] > red[1], "faster than the baseline green, slower red"
    assert [t.get_text() for t in ax.texts] == [" 1.50x", " 0.80x"]
    assert list(ax.lines[0].get_xdata()) == [1.0, 1.0], "the baseline at 1.0x"
    assert ax.get_title() == "S" and ax.get_xlabel().startswith("speed-up")


def test_latency_distribution_marks_each_median():
    fig = plots.latency_distribution({"x": [1, 2, 3, 2], "y": [2, 3, 4]})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["x (median 2 ms)", "y (median 3 ms)"]
    medians = [float(line.get_xdata()[0]) for line in ax.lines]
    assert medians == [2.0, 3.0]
    counts = sum(p.get_height() for p in ax.patches)
    assert counts == 6, "the bins end at the 99.5th percentile of all samples: only the largest (4 ms) is cut"
    assert ax.get_xlabel() == "latency per call (ms)"


def test_pareto_points_labels_and_front():
    df = pd.DataFrame({"variant": ["a", "b", "c"], "median_ms": [1.0, 2.0, 3.0], "accuracy": [0.9, 0.95, 0.93]})
    ax = plots.pareto(df).axes[0]
    assert np.allclose(ax.collections[0].get_offsets(), [[1.0, 0.9], [2.0, 0.95], [3.0, 0.93]])
    assert [t.get_text() for t in ax.texts] == ["a", "b", "c"]
    front = ax.lines[0]
    assert _xy(front) == ([1.0, 2.0], [0.9, 0.95]), "c is slower and less accurate than b: off the front"
    assert ax.get_xlabel() == "median ms" and ax.get_ylabel() == "accuracy"


def test_pareto_front_of_rows_in_any_order():
    df = pd.DataFrame({"variant": ["c", "a", "d", "b"], "median_ms": [3.0, 1.0, 4.0, 2.0],
                       "accuracy": [0.93, 0.9, 0.97, 0.95]})  # fmt: skip
    front = plots.pareto(df).axes[0].lines[0]
    assert _xy(front) == ([1.0, 2.0, 4.0], [0.9, 0.95, 0.97]), "by latency: a, b, then d (c is dominated by b)"


def test_speedup_bars_and_pareto_keep_what_they_draw(tmp_path, monkeypatch):
    from course_utils.measuring.intervals import Ratio

    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    bars = plots.speedup_bars({"a": Ratio("a", "b", 1.5, 1.2, 1.8, rounds=[]), "b": Ratio("b", "b", 1.1, 0.9, 1.3,
                                                                                           rounds=[])})  # fmt: skip
    back = plots.figure_data(plots.save(bars, "07", "bars"))
    assert back.to_dict(orient="records") == [
        {"bar": "a", "speedup": 1.5, "low": 1.2, "high": 1.8, "within_noise": False},
        {"bar": "b", "speedup": 1.1, "low": 0.9, "high": 1.3, "within_noise": True},
    ]
    df = pd.DataFrame({"variant": ["big", "small", "bad"], "median_ms": [2.0, 1.0, 3.0], "accuracy": [99, 97, 90]})
    back = plots.figure_data(plots.save(plots.pareto(df), "12", "pareto"))
    assert back.set_index("variant")["on_front"].to_dict() == {"big": True, "small": True, "bad": False}


_FIGURE = re.compile(
    r"plt\.subplots\(|plt\.figure\(|cu\.plots\.(?:batch_curve|speedup_bars|latency_distribution|pareto)\("
)


def _figures_and_saves(text: str) -> tuple[int, int]:
    """(figures a lesson's code makes, PNGs it saves): a plot helper drawn into an existing ``ax=`` makes none;
    comment lines (and markdown cells) are not code."""
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    made = 0
    for m in _FIGURE.finditer(text):
        depth, i = 1, m.end()
        while depth and i < len(text):  # the call's own arguments
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        made += "ax=" not in text[m.end() : i]
    return made, text.count("cu.plots.save(")


@pytest.mark.parametrize("lesson", sorted(p.name for p in (ROOT / "lessons").glob("[0-9][0-9]_*.py")))
def test_every_figure_of_a_lesson_is_saved_beside_its_results(lesson):
    """A workshop shows a lesson's pictures without running it again: each figure goes to cu.plots.save."""
    made, saved = _figures_and_saves((ROOT / "lessons" / lesson).read_text(encoding="utf-8"))
    assert saved >= made, f"{lesson} makes {made} figure(s) and saves {saved}: add cu.plots.save(fig, 'NN', 'name')"


def test_the_figure_count_reads_calls_not_mentions():
    text = "fig, ax = plt.subplots()\ncu.plots.speedup_bars(r, ax=ax)\nfig2 = cu.plots.pareto(df)\n# plt.figure(\n"
    assert _figures_and_saves(text) == (2, 0)
    assert _figures_and_saves("cu.plots.speedup_bars(r, ax=ax)\ncu.plots.save(fig, '01', 'x')") == (0, 1)
