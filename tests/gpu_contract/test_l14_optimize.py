"""optimize()'s CUDA path for ONNX Runtime, run on CPU: the session is bound with IOBinding (no host copies).

On a CUDA machine ``optimize()`` asks for the CUDA provider and runs the session through
``onnx_runtime.ort_iobinding_runner`` with torch tensors bound by address; ``run()`` with numpy arrays would copy
every input to the host and back. Here the provider request is answered with a CPU session, so the very same
branch runs on CPU tensors (IOBinding with ``device_type="cpu"``), and ``session.run`` must never be called.
The TensorRT step (``14.optimize-tensorrt``) is run against the fake TensorRT in ``test_l08_tensorrt.py``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_utils.capstone.optimizing import techniques
from course_utils.measuring.outputs import compare_outputs
from course_utils.techniques import onnx_runtime
from tests.gpu_contract.lesson_code import lesson_namespace, lesson_path

COVERS: dict[str, str] = {}  # lesson 14's only GPU section, 14.optimize-tensorrt, is covered in test_l08_tensorrt.py
NOT_TESTABLE: dict[str, str] = {}


class _NoCopySession:
    """A real CPU session whose ``run`` (the numpy path with host copies) is forbidden."""

    def __init__(self, session) -> None:
        self._s = session

    def __getattr__(self, name):
        return getattr(self._s, name)

    def run(self, *a, **k):
        raise AssertionError("optimize() on CUDA must not use session.run (host copies each call): use IOBinding")


def test_optimize_onnxruntime_on_cuda_uses_iobinding(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10)).eval()
    example = torch.randn(4, 3, 6, 6)
    with torch.no_grad():
        ref = model(example)
    asked = {}
    real_session = onnx_runtime.ort_session

    def fake_session(path, *, providers=None, **kw):
        asked["providers"] = providers
        return _NoCopySession(real_session(path, **kw))

    monkeypatch.setattr(onnx_runtime, "ort_session", fake_session)
    (variant,) = techniques.onnxruntime(model, example, ref, torch.device("cuda"))
    assert asked["providers"][0] == "CUDAExecutionProvider"
    assert "IOBinding" in variant.note
    for n in (4, 1, 9):
        x = torch.randn(n, 3, 6, 6)
        with torch.no_grad():
            cmp = compare_outputs(variant.run(x).clone(), model(x), "fp32")
        assert cmp.within, f"batch {n}: {cmp}"


def test_fp32_steps_on_cuda_are_judged_at_the_tf32_tolerance():
    """Issue 20: channels_last and compile were judged at FP32's 1e-4 while cuDNN runs FP32 convolutions in TF32."""
    ns = lesson_namespace("14", torch=torch)
    tol = ns["fp32_tolerance"]
    assert tol(torch.device("cpu")) == "fp32"
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        assert tol(torch.device("cuda")) == "tf32"
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        assert tol(torch.device("cuda")) == "fp32"  # a true FP32 run keeps FP32's tolerance
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
    text = lesson_path("14").read_text()
    for step in ('try_step("channels_last"', 'try_step("+ torch.compile"'):
        line = next(ln for ln in text.splitlines() if ln.startswith(step))
        assert '"fp32"' not in line and "fp32_tolerance(device)" in line, line


def test_gpu_accuracy_is_output_fidelity_not_top1_on_random_weights():
    """A random-weight CNN maps every input to one class: top-1 agreement passes a broken variant, cosine does not."""
    ns = lesson_namespace("14", torch=torch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    with torch.no_grad():
        model[-1].bias.copy_(torch.arange(10.0))  # the last class always wins, as with random ResNet weights
    model.eval()
    probe = torch.randn(16, 3, 12, 12)
    with torch.inference_mode():
        ref = model(probe)

    def broken(x):  # the convolution's output thrown away: wrong logits, same argmax
        return model[-1](torch.zeros(x.shape[0], 8))

    with torch.inference_mode():
        assert torch.equal(broken(probe).argmax(-1), ref.argmax(-1))  # top-1 agreement: 100%, proves nothing
    assert ns["output_fidelity"](model, probe, ref) == pytest.approx(1.0)
    assert ns["output_fidelity"](lambda x: ref.clone(), probe, ref) == pytest.approx(1.0)
    assert ns["output_fidelity"](broken, probe, ref) < 0.5
    assert "probe_labels" not in lesson_path("14").read_text()
