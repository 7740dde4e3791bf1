"""cu.compare / compare_runs and Ratio pinned on cases with a known answer.

Most timings here come from a fake clock (each call advances ``time.perf_counter`` by a set cost), so ratios
are known exactly and nothing depends on this machine's load.
"""

import numpy as np
import pytest

import course_utils as cu
from course_utils.measuring import comparing, intervals, timing
from course_utils.measuring.intervals import NO_DIFFERENCE, Ratio, ratio_from_rounds


class FakeClock:
    """``perf_counter`` that moves only when a workload 'runs': ``work(ms)`` advances it by ms x load."""

    def __init__(self) -> None:
        self.now = 0.0
        self.load = 1.0
        self.calls: list[str] = []

    def __call__(self) -> float:
        return self.now

    def work(self, name: str, ms: float):
        def fn() -> None:
            self.calls.append(name)
            self.now += ms * self.load / 1000.0

        return fn


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", c)
    return c


def test_shortcut_is_the_comparison():
    assert cu.compare is comparing.compare
    assert cu.comparing.compare_runs is comparing.compare_runs
    assert cu.tolerance_table().loc["fp32", "max_rel"] == 1e-4  # the check room's table, still a shortcut


def test_exact_two_to_one(clock):
    cmp = cu.compare({"one": clock.work("one", 2.0), "half": clock.work("half", 1.0)}, baseline="one", device="cpu",
                     rounds=6, warmup=1, min_round_s=0.01)  # fmt: skip
    r = cmp.ratio("half")
    assert (r.estimate, r.low, r.high) == pytest.approx((2.0, 2.0, 2.0))
    assert r.rounds == pytest.approx([2.0] * 6) and r.verdict == "faster"
    assert str(r) == "2.00x (95% CI 2.00-2.00)"
    assert cmp.measurements["one"].median_ms == pytest.approx(2.0)
    assert cmp.measurements["half"].n == 6 * 10  # 10 calls of 1 ms fill each 0.01 s block
    assert r.judge(1.5) == "met" and r.judge(1.99) == "met" and r.judge(2.01) == "missed"
    t = cmp.table()
    assert list(t.columns) == ["variant", "median", "unit", "spread", "ratio", "low", "high", "verdict", "flags"]
    assert t.set_index("variant").loc["one", "verdict"] == "baseline"
    assert t.set_index("variant").loc["half", "ratio"] == pytest.approx(2.0)
    with pytest.raises(KeyError, match="baseline"):
        cmp.ratio("one")


def test_slower_variant_reads_below_one(clock):
    cmp = cu.compare({"a": clock.work("a", 1.0), "b": clock.work("b", 4.0)}, baseline="a", device="cpu", rounds=4,
                     warmup=0, min_round_s=0.0)  # fmt: skip
    r = cmp.ratio("b")
    assert r.estimate == pytest.approx(0.25) and r.verdict == "slower"
    assert r.says("b", "a") == "b is 0.25x (95% CI 0.25-0.25) vs a: slower"


def test_rounds_are_interleaved_in_a_fresh_order(clock):
    names = ["a", "b", "c"]
    cu.compare({n: clock.work(n, 1.0) for n in names}, baseline="a", device="cpu", rounds=30, warmup=0,
               min_round_s=0.0, min_calls=1, seed=3)  # fmt: skip
    rounds = [tuple(clock.calls[i : i + 3]) for i in range(0, 90, 3)]
    assert all(sorted(r) == names for r in rounds)  # every round runs every variant once
    assert len(set(rounds)) > 1  # and not always in the same order
    assert {r[0] for r in rounds} == set(names)


def test_load_change_between_rounds_cancels_in_the_ratio(clock):
    """Identical workloads; the load triples after round 5. Timed one after the other, the second would look
    3x slower; interleaved, every round's ratio is 1 and the baseline drift is flagged, not hidden."""
    calls = {"n": 0}

    def step(name):
        base = clock.work(name, 1.0)

        def fn():
            calls["n"] += 1
            clock.load = 1.0 if calls["n"] <= 10 else 3.0
            base()

        return fn

    cmp = cu.compare({"a": step("a"), "b": step("b")}, baseline="a", device="cpu", rounds=10, warmup=0,
                     min_round_s=0.0, min_calls=1, seed=1)  # fmt: skip
    r = cmp.ratio("b")
    assert r.estimate == pytest.approx(1.0) and r.verdict == NO_DIFFERENCE
    assert r.drifted and "baseline's rounds moved from 1 to 3" in r.drift_reason
    assert r.judge(1.0) == "not judged (drifted)"
    assert "drifted" in str(r)


def test_noise_without_a_difference_is_no_difference():
    rng = np.random.default_rng(0)
    r = ratio_from_rounds("b", "a", rng.lognormal(0.0, 0.2, size=15))
    assert r.low < 1.0 < r.high and r.verdict == NO_DIFFERENCE
    assert str(r) == f"{NO_DIFFERENCE} ({intervals.fmt(r.low)}-{intervals.fmt(r.high)}x)"
    assert r.judge(1.2) in {"not shown", "missed"}
    assert r.says("b", "a").startswith("b vs a: no difference beyond this machine's noise (")


def test_interval_is_the_order_statistic_interval_of_the_median():
    """9 rounds: the 95% interval of the median is the 2nd smallest to the 2nd largest (binomial: P(B <= 1) =
    10/512 < 0.025 <= P(B <= 2)); the outlier round moves neither the estimate nor the interval."""
    per = np.array([1.5, 1.0, 1.2, 5.0, 1.3, 1.1, 1.4, 1.7, 1.6])
    r = ratio_from_rounds("v", "b", per)
    assert (r.estimate, r.low, r.high, r.confidence) == (1.4, 1.1, 1.7, 0.95)
    row = r.as_row()
    assert (row["speedup"], row["speedup_low"], row["speedup_high"]) == (1.4, 1.1, 1.7)
    assert intervals.median_interval(np.arange(1.0, 16.0)) == (4.0, 12.0, 0.95)  # 15 rounds: 4th to 12th
    few = ratio_from_rounds("v", "b", [1.2, 1.05, 1.4, 1.1, 1.3])  # 5 rounds: no 95% interval exists
    assert (few.low, few.high, few.confidence) == (1.05, 1.4, 1 - 2 / 32)
    assert str(few) == "1.20x (5 rounds: their range 1.05-1.40 covers the median 94% of the time; 6 rounds give 95%)"


@pytest.mark.parametrize(
    ("low", "high", "target", "expected"),
    [(1.6, 1.8, 1.5, "met"), (1.5, 1.8, 1.5, "met"), (1.3, 1.7, 1.5, "not shown"), (1.1, 1.4, 1.5, "missed"),
     (0.9, 1.3, 1.0, "not shown")],
)  # fmt: skip
def test_judge_uses_the_interval_not_the_estimate(low, high, target, expected):
    r = Ratio("v", "b", estimate=(low + high) / 2, low=low, high=high, rounds=[])
    assert r.judge(target) == expected
    assert r.against(target).endswith(f": {expected}")


def test_standin_and_drift_are_never_judged():
    r = Ratio("v", "b", estimate=3.0, low=2.9, high=3.1, rounds=[], standin=True)
    assert r.judge(1.5) == "not judged (stand-in timing)"
    assert str(r) == f"3.00x (95% CI 2.90-3.10) [{intervals.STANDIN_FLAG}]"
    d = Ratio("v", "b", estimate=3.0, low=2.9, high=3.1, rounds=[], drifted=True, drift_reason="why")
    assert d.judge(1.5) == "not judged (drifted)" and str(d).endswith("[drifted: why]")


def test_standin_flag_under_the_rehearsal(monkeypatch):
    monkeypatch.setenv("COURSE_REHEARSE", "1")
    cmp = cu.comparing.compare_runs({"a": lambda: 1.0, "b": lambda: 2.0}, baseline="a", rounds=3,
                                    higher_is_better=True, device="cuda")  # fmt: skip
    assert cmp.ratio("b").standin and cmp.ratio("b").judge(1.5) == "not judged (stand-in timing)"
    assert intervals.STANDIN_FLAG in cmp.table().set_index("variant").loc["a", "flags"]
    on_cpu = cu.comparing.compare_runs({"a": lambda: 1.0, "b": lambda: 2.0}, baseline="a", rounds=3,
                                       higher_is_better=True, device="cpu")  # fmt: skip
    assert not on_cpu.ratio("b").standin  # CPU sections of a rehearsed lesson time the real CPU


def test_compare_runs_direction():
    higher = cu.comparing.compare_runs({"static": lambda: 100.0, "cont": lambda: 150.0}, baseline="static", rounds=5,
                                       higher_is_better=True, metric="tokens/s")  # fmt: skip
    assert higher.ratio("cont").estimate == 1.5 and higher.ratio("cont").verdict == "faster"
    lower = cu.comparing.compare_runs({"base": lambda: 10.0, "fast": lambda: 5.0}, baseline="base", rounds=5,
                                      higher_is_better=False, metric="s")  # fmt: skip
    assert lower.ratio("fast").estimate == 2.0
    assert lower.table().set_index("variant").loc["base", "unit"] == "s"


def test_shared_work_drift_is_flagged():
    """Lesson 16's case: the identical prefills took 20.3 s under static and 8.0 s under continuous."""
    rng = np.random.default_rng(1)
    static = lambda: {"value": 10.0 * rng.uniform(0.95, 1.05), "shared_s": 20.3}  # noqa: E731
    cont = lambda: {"value": 30.0 * rng.uniform(0.95, 1.05), "shared_s": 8.0}  # noqa: E731
    cmp = cu.comparing.compare_runs({"static": static, "continuous": cont}, baseline="static", rounds=8,
                                    higher_is_better=True)  # fmt: skip
    r = cmp.ratio("continuous")
    assert r.drifted and "20.3 s under static and 8 s under continuous" in r.drift_reason
    assert r.judge(1.5) == "not judged (drifted)"
    steady = lambda: {"value": 30.0 * rng.uniform(0.95, 1.05), "shared_s": 20.3}  # noqa: E731
    ok = cu.comparing.compare_runs({"static": static, "continuous": steady}, baseline="static", rounds=8,
                                   higher_is_better=True).ratio("continuous")  # fmt: skip
    assert not ok.drifted and ok.judge(2.5) == "met"


def test_high_spread_rows_are_flagged(clock):
    costs = iter(np.tile([1.0, 1.0, 5.0, 0.2], 1000))

    def jumpy():
        clock.now += next(costs) / 1000.0

    cmp = cu.compare({"steady": clock.work("s", 1.0), "jumpy": jumpy}, baseline="steady", device="cpu", rounds=4,
                     warmup=0, min_round_s=0.0, min_calls=8)  # fmt: skip
    flags = cmp.table().set_index("variant")["flags"]
    assert flags["jumpy"].startswith("high spread (IQR") and flags["steady"] == ""


def test_bad_input_names_the_fix(clock):
    with pytest.raises(ValueError, match="baseline 'x' is not one of the variants"):
        cu.compare({"a": clock.work("a", 1.0), "b": clock.work("b", 1.0)}, baseline="x")
    with pytest.raises(ValueError, match=r"at least one other variant, got only \['a'\]: when the measurements left "
                       "nothing else worth timing"):  # fmt: skip
        cu.compare({"a": clock.work("a", 1.0)}, baseline="a")
    with pytest.raises(TypeError, match="return a number"):
        cu.comparing.compare_runs({"a": lambda: "fast", "b": lambda: 1.0}, baseline="a", rounds=1,
                                  higher_is_better=True)  # fmt: skip


@pytest.mark.parametrize(("x", "text"), [(15.049, "15.0"), (1.449, "1.45"), (0.9, "0.90"), (0.0123, "0.0123")])
def test_format(x, text):
    assert intervals.fmt(x) == text


def test_record_keeps_the_interval_and_older_files_stay_readable():
    from course_utils.show import results

    r = Ratio("int8", "fp32", estimate=1.45, low=1.31, high=1.62, rounds=[], drifted=True, drift_reason="load")
    row = results.record("99", "int8", median_ms=1.0, speedup_vs_baseline=r, notes="batch 32")
    assert (row["speedup_vs_baseline"], row["speedup_low"], row["speedup_high"]) == (1.45, 1.31, 1.62)
    assert row["notes"] == "batch 32; faster; drifted: load"
    path = next(results.results_dir().glob("*.csv"))
    old = [c for c in results.COLUMNS if c not in ("speedup_low", "speedup_high")]
    path.write_text(",".join(old) + "\n")  # a file written before the interval columns existed
    results.record("99", "int8", median_ms=1.0, speedup_vs_baseline=r)
    results.record("99", "plain", median_ms=2.0, speedup_vs_baseline=2.0)
    df = results.load_results()
    assert list(df["technique"]) == ["int8", "plain"] and list(df["speedup_vs_baseline"]) == [1.45, 2.0]
    assert "speedup_low" not in df.columns  # the older file keeps its columns; nothing is torn


def test_time_slices_bias_the_median_not_the_mean(clock):
    """An oversubscribed CPU: every 3 ms of our work, other processes hold the core for 9 ms. A 2 ms call is
    caught by a switch twice as often as a 1 ms one, so its median call is 11 ms (1 ms: 1 ms); the block means,
    wall time over calls, keep the true 2x."""
    done = {"work": 0.0}

    def work(ms):
        def fn():
            before = done["work"]
            done["work"] += ms
            clock.now += (ms + 9.0 * (int(done["work"] // 3.0) - int(before // 3.0))) / 1000.0

        return fn

    kw = dict(baseline="two", device="cpu", rounds=9, warmup=0, min_round_s=0.3, seed=0)
    mean = cu.compare({"two": work(2.0), "one": work(1.0)}, **kw).ratio("one")
    median = cu.compare({"two": work(2.0), "one": work(1.0)}, statistic="median", **kw).ratio("one")
    assert 1.9 <= mean.low <= mean.estimate <= mean.high <= 2.1
    assert median.estimate > 5


@pytest.mark.parametrize(
    ("low", "high", "expected"), [(0.95, 1.05, "met"), (0.85, 1.05, "not shown"), (1.12, 1.3, "missed"),
                                  (0.5, 0.89, "missed"), (0.9, 1.1, "met")],
)  # fmt: skip
def test_judge_within_a_band(low, high, expected):
    assert Ratio("v", "b", estimate=(low + high) / 2, low=low, high=high, rounds=[]).judge_within(0.9, 1.1) == expected


def test_speedup_bars_draw_the_interval():
    from course_utils.show import plots

    bars = {"faster": Ratio("faster", "b", 1.5, 1.3, 1.7, []), "noise": Ratio("noise", "b", 1.1, 0.9, 1.3, []),
            "plain": 0.8}  # fmt: skip
    ax = plots.speedup_bars(bars).axes[0]
    assert [p.get_width() for p in ax.patches] == [1.5, 1.1, 0.8]
    grey = ax.patches[1].get_facecolor()
    assert grey[0] == grey[1] == grey[2], "an interval containing 1 is grey: no difference beyond the noise"
    assert [t.get_text() for t in ax.texts] == [" 1.50x (1.30-1.70)", " 1.10x (0.90-1.30)", " 0.80x"]
    whiskers = [c for c in ax.collections if len(c.get_segments()) == 1]
    spans = [tuple(np.round(c.get_segments()[0][:, 0], 6)) for c in whiskers]
    assert spans == [(1.3, 1.7), (0.9, 1.3)], "each whisker spans its interval, low to high"
    assert "95% interval" in ax.get_xlabel()


def test_items_make_the_ratio_per_item(clock):
    """Batch 1 in 1 ms, batch 8 in 2 ms: the batch of 8 has 4x the throughput, though each call is 2x slower."""
    cmp = cu.compare({"batch 1": clock.work("b1", 1.0), "batch 8": clock.work("b8", 2.0)}, baseline="batch 1",
                     device="cpu", rounds=6, warmup=0, min_round_s=0.0, items={"batch 1": 1, "batch 8": 8})  # fmt: skip
    assert cmp.ratio("batch 8").estimate == pytest.approx(4.0)
    assert cmp.measurements["batch 8"].throughput == pytest.approx(4000.0)  # 8 items per 2 ms


def test_ratio_between_two_variants(clock):
    cmp = cu.compare({"eager": clock.work("e", 4.0), "compiled": clock.work("c", 2.0), "int8": clock.work("q", 1.0)},
                     baseline="eager", device="cpu", rounds=6, warmup=0, min_round_s=0.0)  # fmt: skip
    r = cmp.ratio("int8", vs="compiled")
    assert r.estimate == pytest.approx(2.0) and r.baseline == "compiled"
    assert cmp.ratio("int8", vs="eager") is cmp.ratio("int8")
    with pytest.raises(KeyError, match="name another variant"):
        cmp.ratio("int8", vs="int8")


def test_a_difference_below_the_printed_precision_is_not_claimed():
    r = Ratio("v", "b", estimate=0.9999, low=0.9998, high=0.9999, rounds=[])
    assert r.verdict == NO_DIFFERENCE and str(r) == f"{NO_DIFFERENCE} (1.00-1.00x)"
    assert Ratio("v", "b", estimate=1.01, low=1.006, high=1.02, rounds=[]).verdict == "faster"
    assert Ratio("v", "b", estimate=1.0002, low=1.0001, high=1.0003, rounds=[]).verdict == NO_DIFFERENCE
    assert Ratio("v", "b", estimate=0.99, low=0.98, high=0.994, rounds=[]).verdict == "slower"


def test_judge_at_the_exact_target_ends():
    """The low end exactly at the target is "met"; the high end exactly at it is not "missed" (it reaches it)."""
    assert Ratio("v", "b", estimate=1.45, low=1.4, high=1.5, rounds=[]).judge(1.5) == "not shown"
    assert Ratio("v", "b", estimate=1.45, low=1.4, high=1.4999, rounds=[]).judge(1.5) == "missed"


def test_a_band_is_never_judged_on_stand_in_or_drifted_numbers():
    inside = dict(estimate=1.0, low=0.95, high=1.05, rounds=[])
    assert Ratio("v", "b", **inside).judge_within(0.9, 1.1) == "met"
    assert Ratio("v", "b", **inside, drifted=True, drift_reason="x").judge_within(0.9, 1.1) == "not judged (drifted)"
    assert Ratio("v", "b", **inside, standin=True).judge_within(0.9, 1.1) == "not judged (stand-in timing)"


def test_half_width_is_half_the_interval_relative_to_the_estimate():
    assert Ratio("v", "b", estimate=2.0, low=1.8, high=2.2, rounds=[]).half_width == pytest.approx(0.1)
    assert Ratio("v", "b", estimate=0.0, low=0.0, high=0.0, rounds=[]).half_width == float("inf")


@pytest.mark.parametrize(("x", "text"), [(10.0, "10.0"), (9.996, "10.00"), (0.1, "0.10"), (0.0999, "0.0999")])
def test_format_at_the_switch_points(x, text):
    assert intervals.fmt(x) == text


def test_rounds_that_are_not_finite_are_left_out():
    r = ratio_from_rounds("v", "b", [2.0, float("nan"), 2.0, float("inf"), 2.0])
    assert r.rounds == [2.0, 2.0, 2.0] and (r.estimate, r.low, r.high) == (2.0, 2.0, 2.0)
    with pytest.raises(ValueError, match="no finite per-round ratio"):
        ratio_from_rounds("v", "b", [float("inf"), float("nan")])


def test_says_phrases_each_verdict():
    slower = Ratio("v", "b", estimate=0.8, low=0.7, high=0.9, rounds=[])
    assert slower.says("int8", "fp32") == "int8 is 0.80x (95% CI 0.70-0.90) vs fp32: slower"
    faster = Ratio("v", "b", estimate=1.5, low=1.4, high=1.6, rounds=[], drifted=True, drift_reason="load")
    assert faster.says("int8", "fp32", better="the throughput of") == (
        "int8 is 1.50x (95% CI 1.40-1.60) the throughput of fp32 [drifted: load]"
    )


def test_baseline_drift_is_flagged_only_beyond_twice():
    assert comparing._baseline_drift([1.0, 1.0, 2.0, 2.0]) == ""  # exactly 2x: the limit, not beyond it
    assert "moved from 1 to 2.01" in comparing._baseline_drift([1.0, 1.0, 2.01, 2.01])
    assert "moved from 3 to 1" in comparing._baseline_drift([3.0, 3.0, 1.0, 1.0])  # faster later counts too
    assert comparing._baseline_drift([1.0, 3.0, 3.0]) == ""  # under 4 rounds: no halves to compare


def _comparison(per_round, ratios=None):
    from course_utils.measuring.timing import Measurement

    return comparing.Comparison(baseline="a", label="", kind="time", per_round=per_round,
                                measurements={n: Measurement(times_ms=v) for n, v in per_round.items()},
                                ratios=ratios or {})  # fmt: skip


def test_ratio_vs_a_variant_checks_that_variant_for_drift():
    cmp = _comparison({"a": [1.0] * 8, "b": [1.0] * 4 + [3.0] * 4, "c": [0.5] * 8})
    against_b = cmp.ratio("c", vs="b")
    assert against_b.drifted and "moved from 1 to 3" in against_b.drift_reason
    against_c = cmp.ratio("b", vs="c")
    assert not against_c.drifted and against_c.rounds == [0.5] * 4 + [1 / 6] * 4


def test_ratio_vs_a_variant_keeps_the_stand_in_label():
    standin = Ratio("b", "a", estimate=1.0, low=1.0, high=1.0, rounds=[1.0], standin=True)
    r = _comparison({"a": [1.0] * 6, "b": [1.0] * 6, "c": [0.5] * 6}, {"b": standin}).ratio("c", vs="b")
    assert r.standin and r.judge(1.5) == "not judged (stand-in timing)"


def test_warmup_rounds_and_calls_are_counted(clock):
    cu.compare({"a": clock.work("a", 1.0), "b": clock.work("b", 2.0)}, baseline="a", device="cpu", rounds=3,
               warmup=4, min_round_s=0.0, min_calls=5)  # fmt: skip
    assert clock.calls.count("a") == clock.calls.count("b") == 4 + 3 * 5
    assert clock.calls[:4] in (["a"] * 4, ["b"] * 4), "each variant's warm-up calls run before any round"


@pytest.mark.parametrize(("smoke", "rounds", "warmup", "block"), [("1", 7, 2, 5), ("0", 15, 5, 50)])
def test_default_rounds_warmup_and_block_length(clock, monkeypatch, smoke, rounds, warmup, block):
    monkeypatch.setenv("COURSE_SMOKE", smoke)
    cmp = cu.compare({"a": clock.work("a", 1.0), "b": clock.work("b", 1.0)}, baseline="a", device="cpu")
    timed = cmp.measurements["a"].n
    assert len(cmp.per_round["a"]) == rounds and clock.calls.count("a") - timed == warmup
    assert rounds * block <= timed <= rounds * (block + 1)  # 1 ms calls fill each 5 (smoke) or 50 ms block


def test_zero_rounds_is_refused():
    with pytest.raises(ValueError, match="at least 1 round"):
        cu.compare({"a": lambda: None, "b": lambda: None}, baseline="a", device="cpu", rounds=0)
    with pytest.raises(ValueError, match="at least 1 round"):
        cu.comparing.compare_runs({"a": lambda: 1.0, "b": lambda: 1.0}, baseline="a", rounds=0,
                                  higher_is_better=True)  # fmt: skip


def test_compare_runs_table_median_and_no_shared_work():
    values = {"a": iter([1.0, 1.0, 10.0, 1.0, 1.0]), "b": iter([2.0, 2.0, 2.0, 20.0, 2.0])}
    runs = {n: (lambda n=n: {"value": next(values[n])}) for n in values}  # a mapping without shared_s
    cmp = cu.comparing.compare_runs(runs, baseline="a", rounds=5, higher_is_better=True, seed=0)
    t = cmp.table().set_index("variant")
    assert (t.loc["a", "median"], t.loc["b", "median"]) == (1.0, 2.0)  # medians, not the means 2.8 and 5.6
    r = cmp.ratio("b")
    assert r.estimate == 2.0 and not r.drifted and cmp.shared_s == {}, "no shared_s returned: no shared work"


def test_compare_runs_flags_a_drifting_baseline():
    calls = {"a": 0, "b": 0}

    def run(name, value):
        def fn():
            calls[name] += 1
            return value * (1.0 if calls[name] <= 4 else 3.0)

        return fn

    r = cu.comparing.compare_runs({"a": run("a", 10.0), "b": run("b", 20.0)}, baseline="a", rounds=8,
                                  higher_is_better=True, seed=0).ratio("b")  # fmt: skip
    assert r.estimate == 2.0 and r.drifted and "baseline's rounds moved from 10 to 30" in r.drift_reason
