"""Lesson 07 exercises: building a session (level, threads, spinning), reading fusion, choosing a thread count."""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable

from ..exercises import exercise


def _check_fusion(fn: Callable[[collections.Counter, collections.Counter], dict]) -> None:
    before = collections.Counter({"Conv": 4, "Relu": 4, "Add": 2, "Gemm": 1})
    after = collections.Counter({"FusedConv": 4, "Add": 2, "Gemm": 1})
    got = fn(before, after)
    assert got.get("removed") == 4, f"11 nodes before, 7 after: 4 removed, got {got.get('removed')}"
    assert got.get("gone") == ["Conv", "Relu"], "op types present before and absent after, sorted: ['Conv', 'Relu']"
    assert got.get("new") == ["FusedConv"], "op types absent before and present after: ['FusedConv']"
    same = fn(before, before)
    assert same == {"removed": 0, "gone": [], "new": []}, "identical graphs: nothing removed, gone or new"


@exercise(
    "07.fusion",
    "fusion_summary(before, after): from two op-type Counters return {'removed': node count difference, "
    "'gone': sorted op types only in before, 'new': sorted op types only in after}.",
    _check_fusion,
)
def fusion_summary(before: collections.Counter, after: collections.Counter) -> dict:
    return {
        "removed": sum(before.values()) - sum(after.values()),
        "gone": sorted(set(before) - set(after)),
        "new": sorted(set(after) - set(before)),
    }


def _check_threads(fn: Callable[[dict[int, float], float], int]) -> None:
    assert fn({1: 10.0, 2: 6.0, 4: 5.9}, 0.05) == 2, "4 threads are within 5% of 2 threads: take the fewer (2)"
    assert fn({1: 10.0, 2: 6.0, 4: 3.0}, 0.05) == 4, "4 threads are clearly fastest here"
    assert fn({1: 5.0, 2: 5.1}, 0.05) == 1, "1 thread is fastest: keep the other core free"
    assert fn({8: 2.0}, 0.0) == 8, "a single candidate wins"


@exercise(
    "07.threads",
    "pick_threads(medians, slack): medians maps thread count -> median ms; return the FEWEST threads whose "
    "median is within (1 + slack) x the best median (spare cores serve other requests).",
    _check_threads,
)
def pick_threads(medians: dict[int, float], slack: float = 0.05) -> int:
    best = min(medians.values())
    return min(t for t, ms in medians.items() if ms <= best * (1 + slack))


_LEVEL_NAMES = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


@functools.cache
def _tiny_onnx():
    """A small CNN exported to ONNX in a temporary folder (kept for the process), with a reference output."""
    import tempfile
    from pathlib import Path

    import torch
    from torch import nn

    from ..backends import export_onnx

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).eval()
    folder = Path(tempfile.mkdtemp(prefix="ex07_"))
    path = export_onnx(model, torch.randn(2, 1, 8, 8), folder / "tiny.onnx")
    x = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        ref = model(x)
    return path, x, ref


def _check_session(fn: Callable[[str, str, int], object]) -> None:
    import torch

    from ..backends import require_onnxruntime
    from ..compare import compare_outputs

    ort = require_onnxruntime()
    path, x, ref = _tiny_onnx()
    for level, threads in (("extended", 1), ("basic", 2), ("disable", 1), ("all", 2)):
        sess = fn(str(path), level, threads)
        assert isinstance(sess, ort.InferenceSession), f"return the onnxruntime.InferenceSession, got {type(sess)}"
        assert sess.get_providers()[0] == "CPUExecutionProvider", f"run on the CPU provider, got {sess.get_providers()}"
        (out,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
        cmp = compare_outputs(torch.from_numpy(out), ref, "fp32")
        assert cmp.within, f"level {level}: outputs differ from PyTorch ({cmp.reason}): load onnx_path itself"
        so = sess.get_session_options()
        want = getattr(ort.GraphOptimizationLevel, _LEVEL_NAMES[level])
        assert so.graph_optimization_level == want, (
            f"level '{level}': the session runs at {so.graph_optimization_level}, expected {want} "
            "(set SessionOptions.graph_optimization_level and pass the options to InferenceSession)"
        )
        assert so.intra_op_num_threads == threads, (
            f"threads={threads}: the session has intra_op_num_threads={so.intra_op_num_threads}"
        )
        try:
            spin = so.get_session_config_entry("session.intra_op.allow_spinning")
        except RuntimeError:  # ORT raises when the entry was never set
            spin = "not set"
        assert spin == "0", (
            f"thread spinning is '{spin}': add_session_config_entry('session.intra_op.allow_spinning', '0')"
        )


@exercise(
    "07.session",
    "build_session(onnx_path, level, threads): an onnxruntime.InferenceSession on the CPU provider at the "
    "graph optimization level named by level ('disable', 'basic', 'extended', 'all'), with intra_op_num_threads "
    "= threads and the session config entry 'session.intra_op.allow_spinning' = '0'.",
    _check_session,
)
def build_session(onnx_path: str, level: str, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVEL_NAMES[level])
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
