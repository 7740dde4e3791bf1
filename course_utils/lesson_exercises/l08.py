"""Lesson 08 exercises: an optimization profile from observed traffic, and when an engine must be rebuilt."""

from __future__ import annotations

from collections.abc import Callable

from ..exercises import exercise


def _check_profile(fn: Callable[[list[int]], tuple[int, int, int]]) -> None:
    assert fn([1, 4, 4, 8, 4, 2]) == (1, 4, 8), "min 1, max 8, opt = the most frequent batch (4)"
    assert fn([16]) == (16, 16, 16), "one size seen: min = opt = max"
    assert fn([2, 2, 8, 8, 3]) == (2, 2, 8), "on a tie for most frequent, take the smaller batch"
    try:
        fn([])
    except ValueError:
        pass
    else:
        raise AssertionError("no traffic observed: raise ValueError")


@exercise(
    "08.profile",
    "profile_from_traffic(batches): (min, opt, max) batch for a TensorRT profile; opt is the most frequent "
    "batch (smallest on ties); ValueError on an empty list.",
    _check_profile,
)
def profile_from_traffic(batches: list[int]) -> tuple[int, int, int]:
    if not batches:
        raise ValueError("no batch sizes observed")
    counts = {b: batches.count(b) for b in set(batches)}
    opt = min(counts, key=lambda b: (-counts[b], b))
    return min(batches), opt, max(batches)


FIELDS = ("gpu_name", "compute_capability", "trt_version", "precision", "profile", "onnx_sha256")


def _check_rebuild(fn: Callable[[dict | None, dict], list[str]]) -> None:
    here = {"gpu_name": "NVIDIA L4", "compute_capability": "8.9", "trt_version": "11.1.0", "precision": "fp16",
            "profile": {"min": [1], "opt": [8], "max": [32]}, "onnx_sha256": "ab", "built": "2026-11-01"}  # fmt: skip
    assert fn(dict(here), here) == [], "identical metadata: nothing to rebuild for"
    assert fn({**here, "built": "yesterday"}, here) == [], "the build date does not make an engine stale"
    assert fn({**here, "trt_version": "10.13.0"}, here) == ["trt_version"], "another TensorRT version: stale"
    got = fn({**here, "gpu_name": "NVIDIA H200", "compute_capability": "9.0"}, here)
    assert got == ["gpu_name", "compute_capability"], "return the differing fields in FIELDS order"
    assert fn(None, here) == list(FIELDS), "no stored metadata: every field is unknown, all stale"


@exercise(
    "08.stale",
    "stale_fields(stored, here): the names in FIELDS (gpu_name, compute_capability, trt_version, precision, "
    "profile, onnx_sha256) whose values differ, in that order; all of them if stored is None.",
    _check_rebuild,
)
def stale_fields(stored: dict | None, here: dict) -> list[str]:
    if stored is None:
        return list(FIELDS)
    return [f for f in FIELDS if stored.get(f) != here.get(f)]
