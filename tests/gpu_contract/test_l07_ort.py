"""Lesson 07's GPU section, run on CPU against the real ONNX Runtime API.

``bind_and_run`` (the lesson's IOBinding cell) runs with ``device_type="cpu"`` and torch buffers: the output
must be written in place and equal ``session.run``'s. ``cuda_session`` (the CUDA provider with its options)
is built against the real ``InferenceSession``: on a machine without the CUDA provider ORT falls back, and the
lesson's code must report that instead of running on the CPU silently.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from course_utils.techniques import onnx_runtime

from .lesson_code import lesson_namespace

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
