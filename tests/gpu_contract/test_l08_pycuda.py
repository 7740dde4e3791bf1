"""Lesson 08's pycuda runner (issue 20 item 5), run on the CPU against the fake TensorRT and a fake pycuda.

The fake pycuda (``fake_pycuda``) is built from pycuda 2026.1's own source: only its names and argument
names pass; host buffers must be page-locked, device buffers must come from ``mem_alloc``, async copies
need a stream, and a device-to-host copy lands only at ``stream.synchronize()``. The runner is the
lesson's own ``PycudaRunner`` (a cell tagged ``contract``); each classic mistake planted into it fails.
"""

from __future__ import annotations

import ast
import json
import re

import numpy as np
import pytest
import torch

from course_utils.measuring.outputs import compare_outputs
from course_utils.techniques import onnx_runtime, tensorrt_engines
from fakegpu.standins.pycuda import SNAPSHOT, FakePycuda, FakePycudaError
from fakegpu.standins.tensorrt import fake_from_snapshot

from . import lesson_code

COVERS = {
    "08.pycuda": "PycudaRunner against the fake TensorRT and a fake pycuda 2026.1 (names from its C++ wrapper): "
    "pinned host buffers, mem_alloc device pointers, one stream for copies and engine, synchronize before "
    "reading; autoprimaryctx, not autoinit",
}

PLANTS = [
    (
        "no synchronize before reading the host output",
        "        self.stream.synchronize()  # the copies",
        "        pass  # the copies",
    ),
    ("pageable host buffers (np.empty)", "cuda.pagelocked_empty(shape,", "np.empty(shape,"),
    (
        "host pointer given to TensorRT",
        "self.context.set_tensor_address(t, int(self.device[t]))",
        "self.context.set_tensor_address(t, self.host[t].ctypes.data)",
    ),
    ("copy on the default stream", "self.host[self.input], self.stream)", "self.host[self.input])"),
    ("engine on another stream than the copies", "execute_async_v3(self.stream.handle)", "execute_async_v3(0x5EED)"),
]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from course_utils.supply.models import load_digits_model

    model = load_digits_model("cnn")
    path = onnx_runtime.export_onnx(model, torch.zeros(2, 1, 8, 8), tmp_path_factory.mktemp("onnx") / "digits.onnx")
    return model, path


def scenario(ns, trt, pyc: FakePycuda, model, onnx_path) -> None:
    """Build an FP32 engine with the lesson's builder, run it with the lesson's PycudaRunner, check everything."""
    profile = tensorrt_engines.Profile.for_batch("input", (1, 8, 8), 1, 4, 8)
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(
        ns["build_engine"](trt, onnx_path, profile, tf32=False)
    )
    runner = ns["PycudaRunner"](trt, engine, pyc.driver, 4)
    for seed in (0, 1):
        x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(seed))
        out = runner(x.numpy())
        assert isinstance(out, np.ndarray) and out.shape == (4, 10), f"expected a (4, 10) host array, got {out!r}"
        with torch.inference_mode():
            cmp = compare_outputs(torch.from_numpy(np.array(out)), model(x), "fp32")
        assert cmp.within, f"pycuda runner output differs from PyTorch (read before synchronize?): {cmp}"
    addresses = [a[1] for a in trt.called("IExecutionContext.set_tensor_address")]
    host = [hex(p) for p in addresses if not pyc.is_device_pointer(p)]
    assert not host, f"TensorRT was given non-device pointers {host}: use int(cuda.mem_alloc(...))"
    handles = {a[0] for a in trt.called("IExecutionContext.execute_async_v3")}
    copy_streams = {e[1] for e in pyc.log if e[0].startswith("memcpy")}
    assert handles == copy_streams == {runner.stream.handle}, (
        f"engine on stream(s) {handles}, copies on {copy_streams}: one stream orders them"
    )
    kinds = [e[0] for e in pyc.log if e[0] in ("memcpy_htod_async", "memcpy_dtoh_async", "synchronize")]
    assert kinds[-3:] == ["memcpy_htod_async", "memcpy_dtoh_async", "synchronize"], kinds


def test_lesson_pycuda_runner(digits, monkeypatch):
    model, onnx_path = digits
    pyc, trt = FakePycuda(), fake_from_snapshot()
    pyc.install(monkeypatch)
    scenario(lesson_code.lesson_namespace("08"), trt, pyc, model, onnx_path)


@pytest.mark.parametrize("label, shipped, planted", PLANTS, ids=[p[0] for p in PLANTS])
def test_planted_pycuda_mistakes_fail(label, shipped, planted, digits, monkeypatch):
    model, onnx_path = digits
    source = "\n".join(lesson_code.tagged_cells("08"))
    assert source.count(shipped) == 1, f"the lesson's code changed: '{shipped}' should occur once"
    ns = {"__name__": "planted"}
    exec(compile(source.replace(shipped, planted), "lessons/08_tensorrt.py (planted)", "exec"), ns)  # noqa: S102
    pyc, trt = FakePycuda(), fake_from_snapshot()
    pyc.install(monkeypatch)
    with pytest.raises((AssertionError, FakePycudaError, RuntimeError)) as err:
        scenario(ns, trt, pyc, model, onnx_path)
    print(f"planted {label}: {type(err.value).__name__}: {str(err.value).splitlines()[0][:200]}")


def _section_source() -> str:
    """The whole code cell holding ``if cu.gpu_section("08.pycuda", ...)``."""
    text = lesson_code.lesson_path("08").read_text()
    at = text.index('cu.gpu_section("08.pycuda"')
    start = text.rindex("# %%", 0, at)
    return text[text.index("\n", start) + 1 : text.index("# %%", at)]


def test_section_shares_pytorchs_context():
    src = _section_source()
    assert "import pycuda.autoprimaryctx" in src, "retain PyTorch's primary context: import pycuda.autoprimaryctx"
    assert "pycuda.autoinit" not in src, "autoinit makes a second context"


def test_lesson_uses_only_pycuda_names_that_exist():
    spec = json.loads(SNAPSHOT.read_text())
    known = set(spec["driver_functions"]) | set(spec["driver_python_functions"]) | set(spec["classes"])
    cell = next(c for c in lesson_code.tagged_cells("08") if "class PycudaRunner" in c)
    used = set()
    for node in ast.walk(ast.parse(cell + "\n" + _section_source())):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) in ("cuda", "self.cuda"):
            used.add(node.attr)
    assert used >= {"pagelocked_empty", "mem_alloc", "memcpy_htod_async", "memcpy_dtoh_async", "Stream"}, used
    assert used <= known, f"not in pycuda 2026.1: {sorted(used - known)}"
    stream_attrs = set(re.findall(r"self\.stream\.(\w+)", cell))
    assert stream_attrs <= set(spec["classes"]["Stream"]), (
        f"Stream has no {stream_attrs - set(spec['classes']['Stream'])}"
    )


def test_fake_refuses_unknown_names_and_arguments():
    pyc = FakePycuda()
    with pytest.raises(AttributeError, match="pycuda 2026.1"):
        pyc.driver.memcpy_htod_async_v2  # noqa: B018
    with pytest.raises(TypeError, match="takes"):
        pyc.driver.pagelocked_empty((2,), np.float32, pinned=True)
    with pytest.raises(AttributeError, match="Stream has no attribute"):
        pyc.driver.Stream().cuda_stream  # noqa: B018 - torch's spelling, not pycuda's
