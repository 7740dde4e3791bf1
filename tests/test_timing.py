import time

import pytest
import torch

from course_utils.measuring import timing


def test_measure_summary_fields():
    m = timing.measure(lambda: time.sleep(0.002), device="cpu", batch_size=4, min_repeats=5, min_time_s=0.02)
    assert m.n >= 5
    assert 1.5 <= m.median_ms <= 50
    assert m.p10_ms <= m.median_ms <= m.p90_ms
    assert m.iqr_ms >= 0 and m.mean_ms > 0
    assert m.throughput == pytest.approx(4 / (m.median_ms / 1000))
    assert set(m.as_dict()) >= {"median_ms", "p90_ms", "throughput", "n"}
    assert "median" in str(m)


def test_measure_without_batch_has_no_throughput():
    m = timing.measure(lambda: None, device="cpu", min_repeats=3, min_time_s=0.0, warmup=0)
    assert m.throughput is None and m.n == 3


def test_high_spread_warns():
    calls = iter(range(1000))

    def jumpy():
        time.sleep(0.02 if next(calls) % 2 else 0.0005)

    with pytest.warns(timing.HighSpreadWarning):
        timing.measure(jumpy, device="cpu", min_repeats=8, min_time_s=0.0, warmup=0)


def test_measure_cuda_without_gpu_is_one_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from course_utils.supply.errors import DeviceUnavailableError

    with pytest.raises(DeviceUnavailableError, match="no usable NVIDIA GPU"):
        timing.measure(lambda: None, device="cuda")
