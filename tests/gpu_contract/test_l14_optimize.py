"""optimize()'s CUDA path for ONNX Runtime, run on CPU: the session is bound with IOBinding (no host copies).

On a CUDA machine ``optimize()`` asks for the CUDA provider and runs the session through
``backends.ort_iobinding_runner`` with torch tensors bound by address; ``run()`` with numpy arrays would copy
every input to the host and back. Here the provider request is answered with a CPU session, so the very same
branch runs on CPU tensors (IOBinding with ``device_type="cpu"``), and ``session.run`` must never be called.
The TensorRT step (``14.optimize-tensorrt``) is run against the fake TensorRT in ``test_l08_tensorrt.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from course_utils import backends
from course_utils.compare import compare_outputs
from course_utils.optimizing import techniques

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
    real_session = backends.ort_session

    def fake_session(path, *, providers=None, **kw):
        asked["providers"] = providers
        return _NoCopySession(real_session(path, **kw))

    monkeypatch.setattr(backends, "ort_session", fake_session)
    (variant,) = techniques.onnxruntime(model, example, ref, torch.device("cuda"))
    assert asked["providers"][0] == "CUDAExecutionProvider"
    assert "IOBinding" in variant.note
    for n in (4, 1, 9):
        x = torch.randn(n, 3, 6, 6)
        with torch.no_grad():
            cmp = compare_outputs(variant.run(x).clone(), model(x), "fp32")
        assert cmp.within, f"batch {n}: {cmp}"
