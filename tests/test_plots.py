"""The shared plots draw the data they are given: line and bar values, bands, labels and titles are asserted."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from course_utils.show import plots

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
    assert lat.get_xscale() == "log" and lat.get_xlabel() == "batch size"
    assert lat.get_ylabel().startswith("latency per batch (ms") and thr.get_ylabel() == "throughput (items/s)"
    assert [t.get_text() for t in thr.get_legend().get_texts()] == ["mlp"]
    assert fig._suptitle.get_text() == "T"


def test_batch_curve_one_line_per_variant():
    two = pd.concat([DF.assign(variant="a"), DF.assign(variant="b", median_ms=DF["median_ms"] * 2)])
    lat, thr = plots.batch_curve(two).axes
    assert [line.get_label() for line in lat.lines] == ["a", "b"]
    assert _xy(lat.lines[1])[1] == [2.0, 3.0, 5.0]
    assert [t.get_text() for t in thr.get_legend().get_texts()] == ["a", "b"]


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
