"""Lesson 01 exercises: arithmetic intensity and the bottleneck taxonomy."""

from __future__ import annotations

from collections.abc import Callable

from ..exercises import exercise


def _check_intensity(fn: Callable[[int, int], float]) -> None:
    for n, b in [(1024, 4), (64, 2), (4096, 1)]:
        expected = 2 * n**3 / (3 * n * n * b)
        got = fn(n, b)
        assert abs(got - expected) <= 1e-6 * expected, (
            f"for n={n}, {b} bytes per element expected {expected:.4g} FLOP/byte, got {got}: "
            "FLOPs are 2n³ (a multiply and an add per term); bytes are three n×n matrices."
        )


@exercise("01.intensity", "FLOPs = 2n³; bytes = 3 · n² · bytes_per_element; return their ratio.", _check_intensity)
def matmul_intensity(n: int, bytes_per_element: int) -> float:
    return 2 * n**3 / (3 * n * n * bytes_per_element)


def _check_classify(fn: Callable[[float, float, float, float], str]) -> None:
    peak_flops, peak_bw = 1e12, 1e11  # ridge at 10 FLOP/byte
    cases = [
        (100.0, 8e11, "compute-bound"),
        (0.1, 8e9, "memory-bound"),
        (0.1, 1e8, "overhead-bound"),
        (100.0, 5e10, "overhead-bound"),
    ]
    for intensity, achieved, want in cases:
        got = fn(intensity, achieved, peak_flops, peak_bw)
        assert got == want, f"intensity {intensity}, achieved {achieved:.0e} FLOP/s: expected '{want}', got '{got}'"


@exercise(
    "01.classify",
    "Roof = min(peak_flops, intensity * peak_bw); under 10% of it is overhead-bound; else compare with the ridge.",
    _check_classify,
)
def classify(intensity: float, achieved: float, peak_flops: float, peak_bw: float) -> str:
    roof = min(peak_flops, intensity * peak_bw)
    if achieved < 0.1 * roof:
        return "overhead-bound"
    return "compute-bound" if intensity >= peak_flops / peak_bw else "memory-bound"
