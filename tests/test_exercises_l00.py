"""Lesson 00's precision exercise rejects wrong capability rules."""

import pytest

from course_utils import exercises

CHECK = exercises.get("00.precisions").checker


def major_only(cap):  # compares the major version only: misses FP8 on Ada (8.9)
    if cap is None:
        return set()
    return {"tf32", "bf16"} | ({"fp8"} if cap[0] >= 9 else set())


def fp8_from_ampere(cap):
    return set() if cap is None else ({"tf32", "bf16", "fp8"} if cap >= (8, 0) else set())


def bf16_on_turing(cap):
    return set() if cap is None else ({"tf32", "bf16"} | ({"fp8"} if cap >= (8, 9) else set()))


def crashes_without_gpu(cap):
    return ({"tf32", "bf16"} if cap >= (8, 0) else set()) | ({"fp8"} if cap >= (8, 9) else set())


def returns_list(cap):
    return [] if cap is None or cap < (8, 0) else ["tf32", "bf16"] + (["fp8"] if cap >= (8, 9) else [])


def test_reference_passes(capsys):
    CHECK(exercises.get("00.precisions").solution)
    assert "On this machine" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", [major_only, fp8_from_ampere, bf16_on_turing, returns_list])
def test_wrong_rules_rejected(wrong):
    with pytest.raises(AssertionError):
        CHECK(wrong)


def test_no_gpu_case_is_checked():
    with pytest.raises(AssertionError, match="None means no GPU"):
        CHECK(crashes_without_gpu)
