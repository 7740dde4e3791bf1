import pandas as pd

from course_utils import plots


def test_every_plot_returns_a_figure():
    df = pd.DataFrame({"batch_size": [1, 2, 4], "median_ms": [1.0, 1.5, 2.5], "p10_ms": [0.9, 1.4, 2.2],
                       "p90_ms": [1.2, 1.7, 2.9], "throughput": [1000, 1333, 1600]})  # fmt: skip
    assert plots.batch_curve(df, label="mlp").axes
    assert plots.batch_curve(df.assign(variant="a")).axes
    assert plots.speedup_bars({"a": 1.5, "b": 0.8}).axes
    assert plots.latency_distribution({"x": [1, 2, 3, 2], "y": [2, 3, 4]}).axes
    pts = pd.DataFrame({"name": ["mm", "add"], "intensity": [50, 0.08], "flops_per_s": [1e11, 1e9]})
    assert plots.roofline(pts, peak_flops=2e11, peak_bytes_per_s=2e10).axes
    pareto = pd.DataFrame({"variant": ["a", "b"], "median_ms": [1, 2], "accuracy": [0.9, 0.95]})
    assert plots.pareto(pareto).axes
