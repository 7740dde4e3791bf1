"""The course timer agrees with torch.utils.benchmark (COURSE.md target: medians within 10%).

It runs in the after-run stage of ``make test``, alone on the machine: with a parallel test worker or other
programs busy, a per-call median (ours) and a per-block mean (torch.utils.benchmark's blocks of many calls)
part ways, because preempted calls land in the tail of one and in every block of the other.
"""

import os
import warnings

import pytest
import torch

from course_utils import timing

pytestmark = pytest.mark.skipif(not os.environ.get("COURSE_AFTER_RUN"), reason="runs alone after the notebooks")


def test_measure_agrees_with_torch_benchmark():
    """The course timer's median is within 10% of torch.utils.benchmark on the same workload and threads.

    Kept stable by: running alone (after the parallel stage), one thread for both, a workload of a few
    milliseconds, alternating the two timers three times and comparing the lowest median of each
    (interference from other processes only ever adds time).
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(320, 320)
        fn = lambda: a @ a @ a  # noqa: E731
        ours, ref = [], []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", timing.HighSpreadWarning)
            for _ in range(3):
                ours.append(timing.measure(fn, device="cpu", min_time_s=0.4, min_repeats=50, warmup=10).median_ms)
                ref.append(timing.benchmark_median_ms(fn, num_threads=1, min_run_time=0.4))
        ratio = min(ours) / min(ref)
        assert 0.9 <= ratio <= 1.1, f"course timer {min(ours):.4f} ms vs torch.utils.benchmark {min(ref):.4f} ms"
    finally:
        torch.set_num_threads(old)
