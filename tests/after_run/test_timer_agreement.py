"""The course timer agrees with torch.utils.benchmark (COURSE.md target: medians within 10%).

It runs in the after-run stage of ``make test``, alone on the machine: with a parallel test worker or other
programs busy, a per-call median (ours) and a per-block mean (torch.utils.benchmark's blocks of many calls)
part ways, because preempted calls land in the tail of one and in every block of the other.
"""

import os
import warnings

import pytest
import torch

from course_utils.measuring import timing

pytestmark = pytest.mark.skipif(not os.environ.get("COURSE_AFTER_RUN"), reason="runs alone after the notebooks")


def benchmark_median_ms(fn, *, num_threads: int, min_run_time: float) -> float:
    """Median per-call time (ms) of ``fn`` by ``torch.utils.benchmark`` (the reference), at ``num_threads``."""
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=num_threads)
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1000.0


def _lowest_medians(fn, rounds: int) -> tuple[float, float]:
    ours, ref = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", timing.HighSpreadWarning)
        for _ in range(rounds):
            ours.append(timing.measure(fn, device="cpu", min_time_s=0.3, min_repeats=50, warmup=10).median_ms)
            ref.append(benchmark_median_ms(fn, num_threads=1, min_run_time=0.3))
    return min(ours), min(ref)


def test_measure_agrees_with_torch_benchmark():
    """The course timer's median is within 10% of torch.utils.benchmark on the same workload and threads.

    Kept stable by: running alone (after the parallel stage), one thread for both, a workload of about a
    millisecond, alternating the two timers five times and comparing the lowest median of each (interference
    from other programs or a noisy virtual machine only ever adds time). A shared VM can still be disturbed for
    a whole comparison, so a failed comparison is repeated up to twice before the test fails; the 10% bound
    itself is never widened.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(320, 320)
        fn = lambda: a @ a @ a  # noqa: E731
        tries = []
        for _ in range(3):
            ours, ref = _lowest_medians(fn, rounds=5)
            tries.append(f"{ours:.4f} vs {ref:.4f} ms")
            if 0.9 <= ours / ref <= 1.1:
                return
        raise AssertionError(f"course timer vs torch.utils.benchmark outside 10% in every try: {tries}")
    finally:
        torch.set_num_threads(old)
