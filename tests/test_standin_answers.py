"""Known answers of the stand-ins' smaller rules: the fake TensorRT's builder and surface, the dispatch's
placement rule, the "cuda" function mode, the package stand-ins, ORT's IOBinding runner and server_main's target
loader (scripts/mutate.py's round 4 plants a bug in each and names the test here that catches it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from fakegpu.standins.tensor import RehearsalError
from tests.test_rehearsal import _onnx

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the rehearsal stands in for a missing GPU")


def _trt():
    from fakegpu.standins.tensorrt import fake_from_snapshot

    return fake_from_snapshot(device_pointers=True)


def _parsed(trt, path):
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, trt.Logger(trt.Logger.WARNING))
    assert parser.parse_from_file(str(path))
    return builder, network


def test_trt_set_shape_needs_opt_between_min_and_max(tmp_path):
    trt = _trt()
    profile = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_optimization_profile()
    profile.set_shape("x", (1, 4), (4, 4), (4, 4))  # opt == max is allowed
    with pytest.raises(ValueError, match=r"set_shape\('x'\): need equal ranks and min <= opt <= max"):
        profile.set_shape("x", (1, 4), (8, 4), (4, 4))  # opt above max
    with pytest.raises(ValueError, match="min <= opt <= max"):
        profile.set_shape("x", (2, 4), (1, 4), (4, 4))  # opt below min


def test_trt_profiles_are_numbered_from_zero_and_a_dynamic_input_needs_one(tmp_path):
    trt = _trt()
    _, path = _onnx(tmp_path)
    builder, network = _parsed(trt, path)
    config = builder.create_builder_config()
    assert builder.build_serialized_network(network, config) is None  # dynamic batch, no profile
    for expected in (0, 1):
        profile = builder.create_optimization_profile()
        profile.set_shape("x", (1, 4), (2, 4), (4, 4))
        assert config.add_optimization_profile(profile) == expected
    assert config.num_optimization_profiles == 2
    assert builder.build_serialized_network(network, config) is not None


@pytest.mark.parametrize("width", [3, 5])
def test_trt_a_profile_disagreeing_with_a_fixed_dim_fails_the_build(tmp_path, width):
    trt = _trt()
    _, path = _onnx(tmp_path)  # x: (batch, 4)
    builder, network = _parsed(trt, path)
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, width), (2, width), (4, width))
    config.add_optimization_profile(profile)
    assert builder.build_serialized_network(network, config) is None


def test_trt_parser_errors_are_indexed_within_their_count(tmp_path):
    trt = _trt()
    network = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_network(0)
    parser = trt.OnnxParser(network, trt.Logger(trt.Logger.WARNING))
    assert not parser.parse_from_file(str(tmp_path / "missing.onnx"))
    assert parser.num_errors == 1 and "cannot read ONNX file" in parser.get_error(0).desc()
    with pytest.raises(IndexError, match=r"parser error index 1 out of range \(1 errors\)"):
        parser.get_error(1)


def test_trt_tf32_is_on_by_default_and_set_clear_flags():
    trt = _trt()
    config = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_builder_config()
    assert config.get_flag(trt.BuilderFlag.TF32)
    config.clear_flag(trt.BuilderFlag.TF32)
    assert not config.get_flag(trt.BuilderFlag.TF32)
    config.set_flag(trt.BuilderFlag.TF32)
    assert config.get_flag(trt.BuilderFlag.TF32)


def test_trt_enum_members_of_different_enums_differ_and_removed_names_say_so():
    from fakegpu.standins.tensorrt_surface import Enum

    a, b = Enum("trt.A", {"X": 1}), Enum("trt.B", {"X": 1})
    assert a.X == a(1) and a.X != b.X and len({a.X, b.X}) == 2
    with pytest.raises(ValueError, match="trt.A: no member with value 2"):
        a(2)
    trt = _trt()
    with pytest.raises(AttributeError, match="FP16.*removed in TensorRT 11"):
        _ = trt.BuilderFlag.FP16


def test_a_0dim_cpu_scalar_meets_cuda_but_a_cuda_index_into_cpu_does_not(gpu):
    x = torch.arange(4.0, device="cuda")
    assert (x * torch.tensor(2.0)).cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    assert x[torch.tensor([1, 3])].cpu().tolist() == [1.0, 3.0]  # a CPU index into a CUDA tensor is allowed
    with pytest.raises(RehearsalError, match="indices should be either on cpu or on the same device"):
        torch.arange(4.0)[torch.tensor([1, 3], device="cuda")]


def test_an_int_device_is_cuda_and_pin_batch_pins_nested_tensors(gpu):
    from fakegpu.standins.mode import pin_batch

    assert torch.zeros(2, device=0).is_cuda
    batch = pin_batch({"a": torch.ones(2), "b": [torch.ones(3)], "c": (torch.ones(1), 7)})
    assert batch["a"].is_pinned() and batch["b"][0].is_pinned() and batch["c"][0].is_pinned()
    assert batch["c"][1] == 7


def test_ort_cuda_provider_given_as_a_tuple_is_the_stand_in(gpu, tmp_path):
    import onnxruntime as ort

    _, path = _onnx(tmp_path)
    sess = ort.InferenceSession(str(path), providers=[("CUDAExecutionProvider", {}), "CPUExecutionProvider"])
    assert sess.get_providers()[0] == "CUDAExecutionProvider"
    assert ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_providers()[0] == (
        "CPUExecutionProvider"
    )


def test_the_profiler_stands_in_only_for_the_cuda_activity(gpu):
    from torch.profiler import ProfilerActivity, profile

    from fakegpu.standins import rehearsal

    key = "profiler CUDA activity (stand-in device events)"
    before = rehearsal.checks().get(key, 0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(2, device="cuda") + 1
    assert rehearsal.checks().get(key, 0) == before
    assert not [e for e in prof.events() if e.device_type.name == "CUDA"]  # CPU activity only: no device events
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.ones(2) + 1
    assert rehearsal.checks().get(key, 0) == before + 1 and prof.key_averages()


def test_iobinding_runner_synchronizes_before_ort_reads_and_reuses_the_output(gpu, tmp_path):
    import onnxruntime as ort

    from course_utils.techniques import onnx_runtime

    model, path = _onnx(tmp_path)
    sess = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    run = onnx_runtime.ort_iobinding_runner(sess, lambda s: (s[0], 3))
    x = torch.randn(2, 4, device="cuda") * 3  # written by torch's stream just now: no synchronize here
    y = run(x)
    with torch.inference_mode():
        torch.testing.assert_close(y.cpu(), model(x.cpu()))
    assert run(torch.randn(2, 4, device="cuda")) is y  # one output buffer per shape
    assert run(torch.randn(3, 4, device="cuda")).shape == (3, 3)


def test_server_main_loads_a_litapi_class_and_refuses_a_target_that_is_not_a_server(tmp_path, monkeypatch):
    import argparse
    import sys

    import litserve as ls

    from course_utils.serve import server_main

    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "r4_api.py").write_text(
        "import litserve as ls\n\n"
        "class Api(ls.LitAPI):\n"
        "    def setup(self, device):\n        pass\n\n"
        "    def predict(self, x):\n        return x\n\n"
        "def not_a_server(**kwargs):\n    return kwargs\n"
    )
    a = argparse.Namespace(max_batch_size=4, batch_timeout=0.01, workers_per_device=1, accelerator="cpu")
    try:
        server = server_main._load_target(f"{tmp_path / 'r4_api.py'}:Api", a)
        api = list(server.litapi_connector)[0]
        assert isinstance(server, ls.LitServer) and (api.max_batch_size, api.batch_timeout) == (4, 0.01)
        assert server.workers_per_device == 1
        with pytest.raises(SystemExit, match=r"r4_api.py:not_a_server returned dict, expected a litserve.LitServer"):
            server_main._load_target(f"{tmp_path / 'r4_api.py'}:not_a_server", a)
    finally:
        sys.modules.pop("r4_api", None)


def test_tf32_state_follows_the_new_fp32_precision_api_once_the_legacy_switches_refuse():
    """torch refuses legacy TF32 reads (``allow_tf32``) after its newer ``fp32_precision`` API was mixed in: the
    stand-in's precision record then reads the new API. In a child process: the mixed state lasts for the process."""
    import subprocess
    import sys

    code = """
import torch
from fakegpu.standins import clock, kernels, switches
assert clock.tf32_state() == (False, True), clock.tf32_state()  # torch defaults: cuDNN convolutions in TF32
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cuda.matmul.fp32_precision = "ieee"
torch.backends.cudnn.conv.fp32_precision = "tf32"
try:
    torch.backends.cuda.matmul.allow_tf32
    raise SystemExit("torch answered a legacy read after a mix: the fallback is untested")
except RuntimeError:
    pass
assert clock.tf32_state() == (False, True), clock.tf32_state()
assert kernels.precision_of("mm", torch.float32) == "fp32" and kernels.precision_of("conv2d", torch.float32) == "tf32"
assert "fp32_precision matmul='ieee'" in str(switches.snapshot()["torch.backends.cuda.matmul.allow_tf32"])
torch.backends.cuda.matmul.fp32_precision = "tf32"
assert clock.tf32_state()[0] and kernels.precision_of("mm", torch.float32) == "tf32"
print("ok")
"""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("COURSE_REHEARSE", None)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr[-2000:]
