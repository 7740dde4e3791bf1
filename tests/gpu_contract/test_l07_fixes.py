"""Lesson 07's fixes (issue 20), on the CPU; each test fails on the code before the fix.

* the "Q/DQ nodes" line counted op types containing "Quant", which drops every ``DequantizeLinear``;
* one ORT session with ``enable_cuda_graph`` was reused at batch 1 and 16 (ORT replays the captured graph
  without looking at the new shapes): a CUDA-graph session must be created per batch size;
* in-place ``model.half()`` / ``model.float()`` (checked for 05, 07, 08 in ``test_l08_fixes``).
"""

from __future__ import annotations

import ast

import numpy as np
import pytest
import torch
from torch import nn

from course_utils.techniques import onnx_runtime

from .lesson_code import lesson_namespace, lesson_path


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("07", np=np, torch=torch, onnx_runtime=onnx_runtime)


def test_qdq_counts_sees_both_node_kinds(ns, tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()
    path = onnx_runtime.export_onnx(model, torch.randn(2, 3, 6, 6), tmp_path / "m.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(
                [{"input": np.random.default_rng(i).standard_normal((2, 3, 6, 6), np.float32)} for i in range(2)]
            )

        def get_next(self):
            return next(self.it, None)

    q = tmp_path / "q.onnx"
    quantize_static(str(path), str(q), Reader(), quant_format=QuantFormat.QDQ)
    counts = ns["qdq_counts"](q)
    assert set(counts) == {"QuantizeLinear", "DequantizeLinear"}
    assert counts["DequantizeLinear"] > 0, f"DequantizeLinear nodes dropped: {counts}"
    assert counts["DequantizeLinear"] >= counts["QuantizeLinear"] > 0, counts
    assert ns["qdq_counts"](path) == {"QuantizeLinear": 0, "DequantizeLinear": 0}


def _section_body(lesson: str, section: str) -> ast.If:
    tree = ast.parse(lesson_path(lesson).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "gpu_section" in ast.unparse(node.test) and section in ast.unparse(node.test):
            return node
    raise LookupError(f'no `if cu.gpu_section("{section}")` in lesson {lesson}')


def test_cuda_graph_session_is_made_per_batch_size():
    body = _section_body("07", "07.cuda-provider")
    graph_calls = [
        n
        for n in ast.walk(body)
        if isinstance(n, ast.Call) and "cuda_graph=True" in ast.unparse(n) and ast.unparse(n.func) == "cuda_session"
    ]
    assert graph_calls, "the section no longer builds a CUDA-graph session"
    loops = [n for n in ast.walk(body) if isinstance(n, ast.For)]
    inside = {id(c) for loop in loops for stmt in loop.body for c in ast.walk(stmt)}
    outside = [c.lineno for c in graph_calls if id(c) not in inside]
    assert not outside, (
        f"line(s) {outside}: a CUDA-graph session built once and reused for several batch sizes replays the "
        "first shape's graph: build one per batch size (inside the loop) or use gpu_graph_id run options"
    )


def test_int8_agreement_is_not_judged_by_top1():
    src = lesson_path("07").read_text()
    assert '"top-1": cmp.top1' not in src, "random-weight ResNets tie top-1: report cosine / max error instead"
