"""The sentences a lesson prints about accuracy, tails, memory, predictions and simulated gains
(``course_utils.measuring.intervals``: ``accuracy_says``, ``tail_says``, ``memory_says``, ``prediction_says``,
``ratio_from_bounds``): every branch, both sides of each boundary, the exact English."""

import numpy as np
import pytest

from course_utils.measuring import intervals as iv


def test_accuracy_higher_lower_and_no_difference_from_the_t_interval():
    # two seeds, +12 and +14: mean 13, se 1, t(1) 97.5% = 12.706 -> 95% CI +0.29 to +25.71: higher
    f = iv.accuracy_says("distilled", "labels only", [12.0, 14.0])
    assert f.verdict == "higher"
    assert str(f) == (
        "distilled raised accuracy by +13.00 points over labels only (95% CI +0.29 to +25.71, 2 seeds, standard "
        "error 1.00)"
    )
    # the case: +12.44 with standard error 11.11 is no difference, and the sentence says so
    f = iv.accuracy_says("distilled", "labels only", [12.44 - 11.11, 12.44 + 11.11])
    assert f.verdict == iv.NO_ACCURACY_DIFFERENCE
    assert str(f).startswith("distilled vs labels only: no accuracy difference beyond the seed-to-seed spread "
                             "(+12.44 points, 95% CI -128.73 to +153.61, 2 seeds, standard error 11.11)")  # fmt: skip
    f = iv.accuracy_says("int8", "fp32", [-2.0, -2.5, -2.2])
    assert f.verdict == "lower"
    assert (
        str(f) == "int8 lowered accuracy by 2.23 points vs fp32 (95% CI -2.86 to -1.61, 3 seeds, standard error 0.15)"
    )


def test_accuracy_boundary_is_the_interval_end_at_zero():
    # mean m, se s over 2 seeds: low end m - 12.706 s; just above and just below 0
    s = 1.0
    t = 12.706204736174707
    just_above = iv.accuracy_says("a", "b", [t * s + 1e-6 - s, t * s + 1e-6 + s])
    just_below = iv.accuracy_says("a", "b", [t * s - 1e-6 - s, t * s - 1e-6 + s])
    assert (just_above.verdict, just_below.verdict) == ("higher", iv.NO_ACCURACY_DIFFERENCE)
    neg_above = iv.accuracy_says("a", "b", [-t * s - 1e-6 - s, -t * s - 1e-6 + s])
    neg_below = iv.accuracy_says("a", "b", [-t * s + 1e-6 - s, -t * s + 1e-6 + s])
    assert (neg_above.verdict, neg_below.verdict) == ("lower", iv.NO_ACCURACY_DIFFERENCE)


def test_accuracy_one_seed_judges_nothing_and_no_seed_is_an_error():
    f = iv.accuracy_says("a", "b", [3.0])
    assert (f.verdict, f.text) == (
        "one seed",
        "a vs b: +3.00 points from one seed: no seed-to-seed error to judge it by (run more seeds)",
    )
    with pytest.raises(ValueError, match="pass one per seed, in points"):
        iv.accuracy_says("a", "b", [float("nan")])


def test_quantile_interval_is_the_order_statistic_interval():
    from scipy import stats

    x = np.arange(1.0, 1001.0)
    assert iv.quantile_interval(x, 0.99) == (pytest.approx(990.01), 983.0, 997.0)
    for n in (368, 400, 1000):
        y = np.random.default_rng(n).exponential(1.0, n)
        ref = stats.quantile_test(y, q=np.percentile(y, 99), p=0.99).confidence_interval(0.95)
        _, low, high = iv.quantile_interval(y, 0.99)
        assert (low, high) == (ref.low, ref.high)
    # 367 samples cannot bound a p99 from above at 95%; 368 can
    assert iv.quantile_interval(np.arange(367.0), 0.99)[2] == float("inf")
    assert np.isfinite(iv.quantile_interval(np.arange(368.0), 0.99)[2])
    assert iv._min_n(0.99) == 368
    with pytest.raises(ValueError, match="between 0 and 1"):
        iv.quantile_interval(x, 99)


def test_tail_says_each_verdict():
    slow, fast = np.arange(1000.0, 2000.0), np.arange(0.0, 1000.0)
    higher = iv.tail_says("closed-loop", slow, "open-loop", fast)
    assert higher.verdict == "higher"
    assert higher.text == "closed-loop p99 1989 ms (95% CI 1982-1996) is higher than open-loop 989 ms (982-996)"
    assert iv.tail_says("open-loop", fast, "closed-loop", slow).verdict == "lower"
    same = iv.tail_says("a", fast, "b", fast + 10)  # intervals 982-996 and 992-1006 overlap
    assert same.verdict == iv.SAME_TAIL
    assert (
        same.text == "a p99 989 ms (95% CI 982-996) vs b 999 ms (992-1006): no difference beyond this machine's noise"
    )
    # touching intervals: not a difference; one ms apart: a difference
    assert iv.tail_says("a", fast + 14, "b", fast).verdict == iv.SAME_TAIL  # 996-1010 touches 982-996
    assert iv.tail_says("a", fast + 14.5, "b", fast).verdict == "higher"


def test_tail_says_too_few_requests_is_unbounded_and_said():
    few = iv.tail_says("a", np.arange(100.0), "b", np.arange(100.0) * 2)
    assert few.verdict == iv.TOO_FEW  # not told apart is not "the same": never "no difference" from too few
    assert few.text == (
        "a p99 98 ms (95% CI above 96) vs b 196 ms (above 192): not told apart, too few requests to bound a p99 "
        "(95% needs 368)"
    )
    # b's p99 may lie anywhere above its slowest request: even a far slower a is not shown higher
    assert iv.tail_says("a", np.arange(100.0) + 1000, "b", np.arange(100.0)).verdict == iv.TOO_FEW
    # told apart although one end is missing: the verdict stands and the sentence still says what is missing
    assert iv.tail_says("a", np.arange(100.0) + 1000, "b", np.arange(400.0) / 4).text.endswith(
        "; too few requests to bound a p99 (95% needs 368)"
    )
    # both bounded and overlapping: the same, with no note
    assert not iv.tail_says("a", np.arange(400.0), "b", np.arange(400.0) + 1).text.endswith("(95% needs 368)")
    assert iv.tail_says("a", np.arange(100.0) + 1000, "b", np.arange(400.0) / 4).verdict == "higher"


def test_memory_says_each_branch_and_its_boundaries():
    assert str(iv.memory_says("inference", 11, "training", 10)) == (
        "inference vs training: about the same memory (11 vs 10 MiB; within 10% or 1 MiB, what a peak varies by)"
    )
    assert iv.memory_says("a", 4, "b", 10).text == "a needs 2.50x less memory than b (4 vs 10 MiB)"
    assert iv.memory_says("a", 30, "b", 10).text == "a needs 3.00x more memory than b (30 vs 10 MiB)"
    # 10% boundary: 100 vs 90 is within (10 <= 10), 100 vs 89.9 is not
    assert iv.memory_says("a", 90, "b", 100).verdict == iv.SAME_MEMORY
    assert iv.memory_says("a", 89.9, "b", 100).verdict == "less"
    # the resolution: 2 vs 3 MiB is 33% but only 1 MiB apart
    assert iv.memory_says("a", 2, "b", 3).verdict == iv.SAME_MEMORY
    assert iv.memory_says("a", 2, "b", 3.01).verdict == "less"
    with pytest.raises(ValueError, match="finite and >= 0 MiB"):
        iv.memory_says("a", -1, "b", 3)


def test_prediction_says_a_5x_miss_is_never_a_fit():
    assert str(iv.prediction_says("largest batch", 512, 100)) == (
        "largest batch: predicted 512, measured 100: the prediction was 5.12x too high"
    )
    assert iv.prediction_says("largest batch", 100, 512).text.endswith("the prediction was 5.12x too low")
    assert iv.prediction_says("KV cache", 100, 110, unit="MiB").text == (
        "KV cache: predicted 100 MiB, measured 110 MiB: the prediction held (within 25%)"
    )
    assert iv.prediction_says("x", 100, 125).verdict == "held"  # 1.25x: at the tolerance
    assert iv.prediction_says("x", 100, 125.1).verdict == "too low"
    assert iv.prediction_says("x", 125.1, 100).verdict == "too high"
    assert iv.prediction_says("x", 0, 100).verdict == "not judged"


def test_ratio_from_bounds_phrases_a_simulated_gain():
    r = iv.ratio_from_bounds("dynamic", "none", 3.34, 3.02, 4.22)
    assert r.says("dynamic batching", "no batching", "the sustainable rate of") == (
        "dynamic batching is 3.34x (95% CI 3.02-4.22) the sustainable rate of no batching"
    )
    low = iv.ratio_from_bounds("dynamic", "none", 1.5, 0.9, 2.0, confidence=0.8)
    assert (
        low.says("d", "n")
        == "d vs n: no difference beyond this machine's noise (80% CI 0.90-2.00: too few timings for 95%)"
    )
    with pytest.raises(ValueError, match="low <= estimate <= high"):
        iv.ratio_from_bounds("a", "b", 1.0, 1.2, 1.5)
    with pytest.raises(ValueError):
        iv.ratio_from_bounds("a", "b", float("nan"), 1.0, 1.5)


def test_fewer_than_six_rounds_never_print_a_75_percent_ci():
    few = iv.ratio_from_rounds("v", "b", [1.2, 1.3, 1.25])
    assert few.confidence == 0.75
    assert str(few) == "1.25x (3 rounds: their range 1.20-1.30 covers the median 75% of the time; 6 rounds give 95%)"
    same = iv.ratio_from_rounds("v", "b", [0.9, 1.3, 1.0])
    assert str(same) == (
        "no difference beyond this machine's noise (3 rounds: their range 0.90-1.30 covers the median 75% of the "
        "time; 6 rounds give 95%)"
    )
    six = iv.ratio_from_rounds("v", "b", [1.2, 1.3, 1.25, 1.22, 1.28, 1.26])
    assert six.confidence == 0.95 and "95% CI" in str(six)


@pytest.mark.parametrize(
    ("x", "text"), [(0.41, "41%"), (0.1, "10%"), (0.0999, "9.99%"), (0.042, "4.2%"), (0.0019, "0.19%"), (0.0, "0%")]
)
def test_percent_never_prints_zero_for_a_share(x, text):
    assert iv.percent(x) == text


@pytest.mark.parametrize(
    ("fraction", "verdict"),
    [(1.06, "above the roof"), (1.05, "near the roof"), (0.5, "near the roof"), (0.49, "under the roof"),
     (0.1, "under the roof"), (0.0999, "far under the roof"), (0.0, "not judged"), (float("nan"), "not judged")],
)  # fmt: skip
def test_roof_says_each_side_of_each_boundary(fraction, verdict):
    assert iv.roof_says("matmul", fraction).verdict == verdict


def test_roof_says_the_english():
    assert str(iv.roof_says("the matmul", 0.84)) == "the matmul reached 84% of the spec-sheet roof"
    assert str(iv.roof_says("tiny adds", 0.0019, "measured")) == "tiny adds reached 0.19% of the measured roof"
    assert str(iv.roof_says("the matmul", 1.2)) == (
        "the matmul reached 120% of the spec-sheet roof: above it, which is impossible, so the roof is wrong for this "
        "machine (a datasheet figure that is not this machine's, or a measured peak the machine's load held down) "
        "and nothing is concluded from it"
    )


def test_tail_says_compares_medians_of_rates_with_their_own_words():
    loader, model = [12.0, 13.0, 14.0, 12.5, 13.5, 13.2], [17.0, 16.5, 17.5, 16.8, 17.2, 17.1]
    f = iv.tail_says("the loader", loader, "the model", model, q=0.5, what="median", unit="img/s", samples="passes")
    assert f.verdict == "lower"
    assert f.text == "the loader median 13.1 img/s (95% CI 12-14) is lower than the model 17.1 img/s (16.5-17.5)"
    three = iv.tail_says("the loader", loader[:3], "the model", model[:3], q=0.5, what="median", unit="img/s",
                         samples="passes")  # fmt: skip
    assert three.verdict == iv.TOO_FEW
    assert three.text.startswith("the loader median 13 img/s (no 95% CI) vs the model 17 img/s (no 95% CI): ")
    assert three.text.endswith(": not told apart, too few passes to bound a median (95% needs 6)")
