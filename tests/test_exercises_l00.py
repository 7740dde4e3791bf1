"""Lesson 00's exercises reject wrong capability rules and answers that do not ask the machine."""

import functools
import subprocess

import onnxruntime
import pytest
import torch
from onnxruntime import get_available_providers
from torch.cuda import device_count, get_device_properties, is_available

from course_checks import exercises

verdict = exercises.verdict


# ---- 00.precisions ---------------------------------------------------------------------------------------------
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


REAL = {
    (6, 1): set(),
    (7, 0): set(),
    (7, 5): set(),
    (8, 0): {"tf32", "bf16"},
    (8, 6): {"tf32", "bf16"},
    (8, 7): {"tf32", "bf16"},
    (8, 9): {"tf32", "bf16", "fp8"},
    (9, 0): {"tf32", "bf16", "fp8"},
    (10, 0): {"tf32", "bf16", "fp8"},
    (12, 0): {"tf32", "bf16", "fp8"},
}


def table_of_real_gpus(cap):  # the checker's old fixed cases, typed in
    return set() if cap is None else REAL[tuple(cap)]


def table_with_default(cap):
    return set() if cap is None else REAL.get(tuple(cap), set())


def decimal_compare(cap):  # 8.9 as a float: (8, 10) would be 8.1
    return set() if cap is None else _by_float(float(f"{cap[0]}.{cap[1]}"))


def _by_float(v):
    return ({"tf32", "bf16"} if v >= 8.0 else set()) | ({"fp8"} if v >= 8.9 else set())


def none_returns_none(cap):  # a bare return for "no GPU"
    if cap is None:
        return None
    return ({"tf32", "bf16"} if cap >= (8, 0) else set()) | ({"fp8"} if cap >= (8, 9) else set())


def none_returns_list(cap):
    return (
        [] if cap is None else (({"tf32", "bf16"} if cap >= (8, 0) else set()) | ({"fp8"} if cap >= (8, 9) else set()))
    )


def minor_nine_any_major(cap):  # "8.9" remembered as "a minor of 9": (7, 9) gets FP8
    if cap is None:
        return set()
    major, minor = cap
    return ({"tf32", "bf16"} if major >= 8 else set()) | ({"fp8"} if major >= 9 or minor >= 9 else set())


def fp8_ada_and_hopper_only(cap):  # "FP8 with Ada and Hopper", read as an upper bound
    if cap is None:
        return set()
    return ({"tf32", "bf16"} if cap >= (8, 0) else set()) | ({"fp8"} if (8, 9) <= cap <= (9, 0) else set())


def known_majors(cap):  # the majors of GPUs sold today: a newer major gets nothing
    if cap is None:
        return set()
    return ({"tf32", "bf16"} if cap[0] in (8, 9, 10, 12) else set()) | ({"fp8"} if cap >= (8, 9) else set())


def fp16_too(cap):  # FP16 added to the set
    if cap is None:
        return set()
    out = {"fp16"} if cap >= (7, 0) else set()
    return out | ({"tf32", "bf16"} if cap >= (8, 0) else set()) | ({"fp8"} if cap >= (8, 9) else set())


def strictly_after_ampere(cap):  # "from (8, 0)" written as >: the A100 itself gets nothing
    if cap is None:
        return set()
    return ({"tf32", "bf16"} if cap > (8, 0) else set()) | ({"fp8"} if cap >= (8, 9) else set())


def strictly_after_ada(cap):  # "from (8, 9)" written as >: the L4 itself gets no FP8
    if cap is None:
        return set()
    return ({"tf32", "bf16"} if cap >= (8, 0) else set()) | ({"fp8"} if cap > (8, 9) else set())


def upper_case_frozen(cap):  # right: names in capitals, a frozenset
    if cap is None:
        return frozenset()
    return frozenset(({"TF32", "BF16"} if cap >= (8, 0) else set()) | ({"FP8"} if cap >= (8, 9) else set()))


def major_plus_minor_tenths(cap):  # right: a minor is one digit, so major + minor / 10 orders them
    if cap is None:
        return set()
    v = cap[0] + cap[1] / 10
    return ({"tf32", "bf16"} if v >= 8.0 else set()) | ({"fp8"} if v >= 8.9 else set())


@pytest.mark.parametrize("right", [upper_case_frozen, major_plus_minor_tenths])
def test_precisions_accepts_right_alternatives(right):
    for seed in range(200):
        assert exercises.verdict("00.precisions", right, seed=seed) == "accepted", seed


def test_precisions_reference_passes(capsys):
    for seed in range(200):
        assert exercises.verdict("00.precisions", exercises.get("00.precisions").solution, seed=seed) == "accepted"
    assert "On this machine" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, message",
    [
        (major_only, "Compare the capability as a (major, minor) tuple"),
        (fp8_from_ampere, "expected ['bf16', 'tf32']"),
        (bf16_on_turing, "expected nothing"),
        (returns_list, "return a set"),
        (crashes_without_gpu, "None means no GPU"),
        (table_of_real_gpus, "in no table of GPUs"),
        (table_with_default, "Compare the capability as a (major, minor) tuple"),
        (none_returns_none, "return a set, here an empty one, set()"),
        (none_returns_list, "return a set, here an empty one, set()"),
        (minor_nine_any_major, "expected nothing, got ['fp8']"),
        (fp8_ada_and_hopper_only, "expected ['bf16', 'fp8', 'tf32'], got ['bf16', 'tf32']"),
        (known_majors, "expected ['bf16', 'fp8', 'tf32'], got ['fp8']"),
        (fp16_too, "your set holds ['fp16']"),
        (strictly_after_ampere, "TF32 and BF16 run from (8, 0) itself on (the A100): compare with >=, not >"),
        (strictly_after_ada, "capability (8, 9): expected ['bf16', 'fp8', 'tf32'], got ['bf16', 'tf32']"),
    ],
)
def test_precisions_rejects(wrong, message):
    for seed in range(200):
        reason = exercises.verdict("00.precisions", wrong, seed=seed)
        assert message in reason, (seed, reason)
    reason = verdict("00.precisions", wrong)
    assert message in reason, reason
    assert "random case seed" in reason


# ---- 00.inventory ----------------------------------------------------------------------------------------------
def _gpu(i):
    p = torch.cuda.get_device_properties(i)
    return {
        "name": p.name,
        "capability": (p.major, p.minor),
        "memory_gib": p.total_memory / 2**30,
        "multiprocessors": p.multi_processor_count,
    }


def _rest():
    import onnxruntime

    return {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "ort_providers": onnxruntime.get_available_providers(),
    }


MINE = {"cuda": False, "gpus": [], "cpu_capability": "AVX512", "ort_providers": ["CPUExecutionProvider"]}


def hard_coded():  # this machine's answers, typed in
    return dict(MINE)


def gpu_from_ort():  # "CUDA is in ORT's providers, so there is a GPU"
    import onnxruntime

    cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"cuda": cuda, "gpus": [_gpu(i) for i in range(n)], **_rest()}


def always_gpu0():
    cuda = torch.cuda.is_available()
    return {"cuda": cuda, "gpus": [_gpu(0) for _ in range(torch.cuda.device_count() if cuda else 0)], **_rest()}


def memory_in_bytes():
    cuda = torch.cuda.is_available()
    gpus = [
        {**_gpu(i), "memory_gib": torch.cuda.get_device_properties(i).total_memory}
        for i in range(torch.cuda.device_count() if cuda else 0)
    ]
    return {"cuda": cuda, "gpus": gpus, **_rest()}


def first_gpu_only():
    cuda = torch.cuda.is_available()
    return {"cuda": cuda, "gpus": [_gpu(0)] if cuda else [], **_rest()}


def no_is_available_check():  # asks device 0's properties on a machine without CUDA
    return {"cuda": True, "gpus": [_gpu(0)], **_rest()}


@functools.cache
def cached():  # answers the first machine forever
    cuda = torch.cuda.is_available()
    return {"cuda": cuda, "gpus": [_gpu(i) for i in range(torch.cuda.device_count() if cuda else 0)], **_rest()}


def from_nvidia_smi():
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return {"cuda": bool(out.stdout), "gpus": [], **_rest()}


def capability_as_string():
    cuda = torch.cuda.is_available()
    gpus = [
        {**_gpu(i), "capability": "{}.{}".format(*torch.cuda.get_device_capability(i))}
        for i in range(torch.cuda.device_count() if cuda else 0)
    ]
    return {"cuda": cuda, "gpus": gpus, **_rest()}


def _inventory(**change):  # the reference, one field of each GPU computed as ``change`` says
    cuda = torch.cuda.is_available()
    gpus = [{**_gpu(i), **{k: f(torch.cuda.get_device_properties(i)) for k, f in change.items()}}
            for i in range(torch.cuda.device_count() if cuda else 0)]  # fmt: skip
    return {"cuda": cuda, "gpus": gpus, **_rest()}


def memory_in_gb():  # 10**9 bytes, the unit on the box
    return _inventory(memory_gib=lambda p: p.total_memory / 1e9)


def memory_in_mib():
    return _inventory(memory_gib=lambda p: p.total_memory / 2**20)


def memory_whole_gib():  # floor division drops the fraction
    return _inventory(memory_gib=lambda p: p.total_memory // 2**30)


def capability_as_float():  # 8.9 as a number
    return _inventory(capability=lambda p: float(f"{p.major}.{p.minor}"))


def gpus_none_without_cuda():
    out = _inventory()
    return {**out, "gpus": out["gpus"] or None}


def providers_as_set():  # the order (ORT's priority) lost; a set's order changes from run to run
    return {**_inventory(), "ort_providers": set(onnxruntime.get_available_providers())}


def cuda_from_device_count():
    n = torch.cuda.device_count()
    return {"cuda": n > 0, "gpus": [_gpu(i) for i in range(n)], **_rest()}


def imported_by_name():  # right: the queries imported with from ... import at the top of the notebook
    cuda = is_available()
    gpus = []
    for i in range(device_count() if cuda else 0):
        p = get_device_properties(i)
        gpus.append({"name": p.name, "capability": (p.major, p.minor), "memory_gib": p.total_memory / 2**30,
                     "multiprocessors": p.multi_processor_count})  # fmt: skip
    return {"cuda": cuda, "gpus": gpus, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "ort_providers": get_available_providers()}  # fmt: skip


def rounded_list_capability():  # right: memory rounded to 0.1 GiB, capability as a list
    return _inventory(memory_gib=lambda p: round(p.total_memory / 2**30, 1), capability=lambda p: [p.major, p.minor])


def total_from_mem_get_info():  # right: the total of torch.cuda.mem_get_info(i); numpy numbers
    import numpy as np

    cuda = torch.cuda.is_available()
    gpus = []
    for i in range(torch.cuda.device_count() if cuda else 0):
        p = torch.cuda.get_device_properties(i)
        _free, total = torch.cuda.mem_get_info(i)
        gpus.append({"name": p.name, "capability": (p.major, p.minor), "memory_gib": np.float64(total / 2**30),
                     "multiprocessors": np.int64(p.multi_processor_count)})  # fmt: skip
    return {"cuda": cuda, "gpus": gpus, **_rest()}


@pytest.mark.parametrize("right", [imported_by_name, rounded_list_capability, total_from_mem_get_info])
def test_inventory_accepts_right_alternatives(right):
    for seed in range(200):
        assert exercises.verdict("00.inventory", right, seed=seed) == "accepted", seed
    # the names imported here are the real queries again
    assert (is_available, device_count) == (torch.cuda.is_available, torch.cuda.device_count)
    assert get_available_providers is onnxruntime.get_available_providers


def test_inventory_reference_passes(capsys):
    for seed in range(200):
        assert exercises.verdict("00.inventory", exercises.get("00.inventory").solution, seed=seed) == "accepted"
    assert "On this machine: CUDA" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, message",
    [
        (hard_coded, "asked PyTorch nothing"),
        (gpu_from_ort, "decide 'GPU present' with torch.cuda.is_available()"),
        (always_gpu0, "ask about device i, not always 0"),
        (memory_in_bytes, "looks like bytes"),
        (first_gpu_only, "one entry per index in range(torch.cuda.device_count())"),
        (no_is_available_check, "check is_available() first"),
        (from_nvidia_smi, "ask PyTorch instead"),
        (capability_as_string, "as a tuple"),
        (memory_in_gb, "looks like GB (10**9 bytes)"),
        (memory_in_mib, "looks like MiB"),
        (memory_whole_gib, "(total_memory / 2**30)"),
        (capability_as_float, "is a float: give it as a tuple (props.major, props.minor)"),
        (gpus_none_without_cuda, "an empty list [] when CUDA is not available"),
        (providers_as_set, "ort_providers is a set"),
        (cuda_from_device_count, "you never asked torch.cuda.is_available()"),
    ],
)
def test_inventory_rejects(wrong, message):
    for seed in range(200):
        reason = exercises.verdict("00.inventory", wrong, seed=seed)
        assert message in reason, (seed, reason)
    reason = verdict("00.inventory", wrong)
    assert message in reason, reason


def test_inventory_rejects_a_cached_answer():
    cached.cache_clear()
    reason = verdict("00.inventory", cached)
    assert "cached from an earlier call" in reason, reason


def test_inventory_restores_the_real_queries():
    import onnxruntime

    real = (
        torch.cuda.is_available,
        torch.cuda.get_device_properties,
        onnxruntime.get_available_providers,
        torch.backends.cpu.get_cpu_capability,
        subprocess.run,
    )
    verdict("00.inventory", hard_coded)
    assert real == (
        torch.cuda.is_available,
        torch.cuda.get_device_properties,
        onnxruntime.get_available_providers,
        torch.backends.cpu.get_cpu_capability,
        subprocess.run,
    )
