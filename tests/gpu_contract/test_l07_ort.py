"""Lesson 07's GPU section, run on CPU against the real ONNX Runtime API.

``bind_and_run`` (the lesson's IOBinding cell) runs with ``device_type="cpu"`` and torch buffers: the output
must be written in place and equal ``session.run``'s. ``cuda_session`` (the CUDA provider with its options)
is built against the real ``InferenceSession``: on a machine without the CUDA provider ORT falls back, and the
lesson's code must report that instead of running on the CPU silently.

The lesson's other traps (issue 20), on the CPU; each test fails on the code before the fix.

* the "Q/DQ nodes" line counted op types containing "Quant", which drops every ``DequantizeLinear``;
* one ORT session with ``enable_cuda_graph`` was reused at batch 1 and 16 (ORT replays the captured graph
  without looking at the new shapes): a CUDA-graph session must be created per batch size;
* in-place ``model.half()`` / ``model.float()`` (checked for 05, 07, 08 in ``test_l08_reference_and_targets``)."""

from __future__ import annotations

import ast

import numpy as np
import pytest
import torch
from torch import nn

from course_utils.techniques import onnx_runtime

from .lesson_code import lesson_namespace, lesson_path

COVERS = {
    "07.cuda-provider": "bind_and_run (IOBinding) with torch buffers and device_type='cpu', in-place output, parity "
    "with session.run; cuda_session's provider options accepted by the real InferenceSession and fallback reported",
}
NOT_TESTABLE: dict[str, str] = {}


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("07", np=np, torch=torch, onnx_runtime=onnx_runtime)  # the names the setup cell imports


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10)).eval()
    path = onnx_runtime.export_onnx(model, torch.randn(2, 3, 6, 6), tmp_path_factory.mktemp("l07") / "m.onnx")
    return model, path


def test_iobinding_on_cpu_writes_torch_buffer_in_place(ns, onnx_file):
    model, path = onnx_file
    session = onnx_runtime.ort_session(path, threads=1)
    x = torch.randn(4, 3, 6, 6)
    out = torch.full((4, 10), float("nan"))
    ptr = out.data_ptr()
    y = ns["bind_and_run"](session, x, out)
    assert y is out and y.data_ptr() == ptr, "the result must be the bound buffer, not a copy"
    expected = session.run(None, {"input": x.numpy()})[0]
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)


def test_iobinding_rejects_wrong_buffers(ns, onnx_file):
    session = onnx_runtime.ort_session(onnx_file[1], threads=1)
    with pytest.raises(onnx_runtime.BadInputError, match="float32"):
        ns["bind_and_run"](session, torch.randn(2, 3, 6, 6, dtype=torch.float64), torch.empty(2, 10))
    with pytest.raises(onnx_runtime.BadInputError, match="contiguous"):
        ns["bind_and_run"](session, torch.randn(3, 6, 6, 2).permute(3, 0, 1, 2), torch.empty(2, 10))


def test_iobinding_runner_in_backends_matches(onnx_file):
    session = onnx_runtime.ort_session(onnx_file[1], threads=1)
    run = onnx_runtime.ort_iobinding_runner(session, lambda s: (s[0], 10))
    x = torch.randn(3, 3, 6, 6)
    np.testing.assert_allclose(run(x).numpy(), session.run(None, {"input": x.numpy()})[0], rtol=0, atol=0)


def test_cuda_session_options_reach_ort_and_fallback_is_reported(ns, onnx_file):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the lesson's GPU section runs the real thing")
    with pytest.warns(UserWarning, match="CUDAExecutionProvider"), pytest.raises(onnx_runtime.ProviderFallbackError):
        ns["cuda_session"](onnx_file[1], tf32=False, cuda_graph=True, algo_search="HEURISTIC")


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
