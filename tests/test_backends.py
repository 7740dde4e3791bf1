"""Unit tests for course_utils.techniques.onnx_runtime (ONNX export, ORT helpers) and the TensorRT cache logic."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from course_utils.supply.errors import CourseError
from course_utils.techniques import onnx_runtime as B
from course_utils.techniques import tensorrt_engines as E


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    torch.manual_seed(0)
    model = Tiny().eval()
    path = B.export_onnx(model, torch.randn(1, 8), tmp_path_factory.mktemp("onnx") / "tiny.onnx")
    return model, path


def test_export_is_one_file_with_dynamic_batch(tiny_onnx):
    import onnx

    _, path = tiny_onnx
    assert path.exists() and not list(path.parent.glob("*.data"))
    dims = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and dims[1].dim_value == 8


def test_count_nodes(tiny_onnx):
    counts = B.count_nodes(tiny_onnx[1])
    assert sum(counts.values()) >= 3 and counts.get("Relu") == 1


def test_count_nodes_names_standard_ops_plainly_and_others_with_their_domain(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),  # the default domain ""
        helper.make_node("Relu", ["a"], ["b"], domain="ai.onnx"),  # the same domain, spelled out
        helper.make_node("Gelu", ["b"], ["y"], domain="com.microsoft"),
    ]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]))
    onnx.save(model, tmp_path / "m.onnx")
    assert B.count_nodes(tmp_path / "m.onnx") == {"Relu": 2, "com.microsoft:Gelu": 1}


def test_session_runner_parity_and_levels(tiny_onnx, tmp_path):
    model, path = tiny_onnx
    for level in B.LEVELS:
        sess = B.ort_session(path, level=level, threads=1, optimized_path=tmp_path / f"{level}.onnx")
        assert (tmp_path / f"{level}.onnx").exists()
    run = B.ort_runner(sess)
    x = torch.randn(5, 8)
    torch.testing.assert_close(run(x), model(x).detach(), atol=1e-5, rtol=1e-5)
    assert run({"input": x}).shape == (5, 4)
    with pytest.raises(ValueError):
        B.ort_session(path, level="max")


def test_sessions_do_not_spin_idle_threads(tiny_onnx):
    """ORT's idle threads spin by default and hold the cores of whatever runs next (eager PyTorch taking turns in
    a comparison): the bench's sessions turn it off, as ORT's session records."""
    sess = B.ort_session(tiny_onnx[1], threads=2)
    assert sess.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_runner_bad_inputs_name_the_expected(tiny_onnx):
    run = B.ort_runner(B.ort_session(tiny_onnx[1], threads=1))
    with pytest.raises(B.BadInputError, match="expected one of \\['input'\\]"):
        run({"x": torch.randn(2, 8)})
    with pytest.raises(B.BadInputError, match="torch.float32"):
        run(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(B.BadInputError, match="rank 2"):
        run(torch.randn(8))
    with pytest.raises(B.BadInputError, match="dimension 1 must be 8"):
        run(torch.randn(2, 7))
    with pytest.raises(B.BadInputError, match="dimension 1 must be 8"):
        run(torch.randn(2, 9))  # larger than the model's fixed dimension: refused too
    assert isinstance(B.BadInputError("x"), CourseError)


def test_provider_fallback_is_reported(tiny_onnx):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers() and torch.cuda.is_available():
        pytest.skip("CUDA provider really loads here")
    with pytest.raises(B.ProviderFallbackError, match="fell back"):
        B.ort_session(tiny_onnx[1], providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    sess = B.ort_session(tiny_onnx[1], providers=["CUDAExecutionProvider", "CPUExecutionProvider"], strict=False)
    assert sess.get_providers() == ["CPUExecutionProvider"]


def test_quantize_dynamic(tiny_onnx, tmp_path):
    model, path = tiny_onnx
    q = B.ort_quantize_dynamic(path, tmp_path / "q.onnx")
    assert any("Integer" in k or "Quant" in k for k in B.count_nodes(q))
    out = B.ort_runner(B.ort_session(q, threads=1))(torch.randn(3, 8))
    assert out.shape == (3, 4)


# ----------------------------------------------------------------------------- TensorRT cache, no GPU

BASE = dict(
    gpu_name="NVIDIA H200",
    compute_capability=(9, 0),
    trt_version="11.1.0",
    precision="fp16",
    profile=E.Profile.for_batch("input", (3, 224, 224), 1, 8, 32),
    onnx_sha256="ab" * 32,
)


def test_cache_key_is_stable_and_sensitive_to_every_field():
    key = E.engine_cache_key(**BASE)
    assert key == E.engine_cache_key(**dict(BASE))
    changes = {
        "gpu_name": "NVIDIA L4",
        "compute_capability": (8, 9),
        "trt_version": "10.13.0",
        "precision": "int8",
        "profile": E.Profile.for_batch("input", (3, 224, 224), 1, 16, 32),
        "onnx_sha256": "cd" * 32,
        "build": {"tf32": False},
    }
    for field, value in changes.items():
        assert E.engine_cache_key(**{**BASE, field: value}) != key, field
    assert E.engine_cache_key(**{**BASE, "compute_capability": "9.0"}) == key
    # every engine-defining build setting changes the key; TensorRT's defaults are the key without settings
    for setting, value in {
        "workspace_bytes": 2 << 30,
        "tf32": False,
        "opt_level": 5,
        "hardware_compat": "AMPERE_PLUS",
        "version_compatible": True,
    }.items():
        assert E.engine_cache_key(**{**BASE, "build": {setting: value}}) != key, setting
    assert E.engine_cache_key(**{**BASE, "build": dict(E.BUILD_DEFAULTS)}) == key
    # a timing cache makes builds faster, not another engine: not part of the key
    assert E.engine_cache_key(**{**BASE, "build": {"timing_cache": "/tmp/t.cache"}}) == key


def test_build_settings_store_enum_names():
    class Level:  # stands in for a pybind11 enum member: it has .name
        name = "AMPERE_PLUS"

    assert E.build_settings(hardware_compat=Level())["hardware_compat"] == "AMPERE_PLUS"
    assert E.build_settings(hardware_compat=None)["hardware_compat"] == "NONE"


def test_staleness_reasons():
    meta = E.engine_metadata(**BASE)
    assert E.engine_staleness(meta, meta) == []
    assert "no metadata" in E.engine_staleness(None, meta)[0]
    foreign = E.engine_metadata(**{**BASE, "trt_version": "10.13.0", "gpu_name": "NVIDIA L4"})
    reasons = E.engine_staleness(foreign, meta)
    assert len(reasons) == 2 and any("trt_version" in r and "10.13.0" in r for r in reasons)
    # JSON round trip (as stored beside the engine) keeps it usable
    assert E.engine_staleness(json.loads(json.dumps(meta)), meta) == []


def test_unreadable_metadata_file(tmp_path):
    meta = tmp_path / "model-fp16.json"
    assert E.read_metadata(meta) is None
    meta.write_text("{broken")
    assert E.read_metadata(meta) is None


def test_profile_validation():
    with pytest.raises(ValueError, match="min <= opt <= max"):
        E.Profile.for_batch("input", (3,), 8, 4, 16)
    with pytest.raises(ValueError, match="precision"):
        E.engine_metadata(**{**BASE, "precision": "fp64"})


def test_calibration_and_modelopt_command(tmp_path):
    import numpy as np

    p = E.write_calibration(torch.randn(10, 3), tmp_path / "calib.npy", 4)
    assert np.load(p).shape == (4, 3)
    with pytest.raises(ValueError):
        E.write_calibration(torch.randn(10, 3), tmp_path / "c.npy", 11)
    cmd = E.modelopt_int8_command("m.onnx", p, "m.int8.onnx")
    assert cmd[1:3] == ["-m", "modelopt.onnx.quantization"] and "int8" in cmd
    # every flag spelled out (no argparse abbreviation), the silent defaults stated
    assert "--calibration_data_path" in cmd and "--calibration_data" not in cmd
    eps = cmd[cmd.index("--calibration_eps") + 1 : cmd.index("--high_precision_dtype")]
    assert eps[0] == "cuda:0", eps
    assert cmd[cmd.index("--high_precision_dtype") + 1] == "fp16"


def test_build_plan(tiny_onnx):
    prof = E.Profile.for_batch("input", (8,), 1, 4, 16)
    plat = {"gpu_name": "NVIDIA H200", "compute_capability": (9, 0), "trt_version": "11.1.0"}
    df = E.build_plan({"fp32": tiny_onnx[1], "tf32": tiny_onnx[1], "int8": None}, prof, plat, {"fp32": {"tf32": False}})
    assert list(df["engine"]) == ["fp32", "tf32", "int8"] and len(df.loc[0, "cache key"]) == 20
    assert list(df["TF32"]) == [False, True, True]
    assert df.loc[0, "cache key"] != df.loc[1, "cache key"]  # same file, TF32 off vs on: two engines
    assert df.loc[2, "cache key"].startswith("(")


def test_optimizer_fuses_nodes_between_lowest_and_highest_level(tmp_path):
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for c_in in (1, 32, 32, 32):  # 32 channels: a multiple of ORT's NCHWc block on AVX2 and AVX-512
        layers += [nn.Conv2d(c_in, 32, 3, padding=1), nn.ReLU()]
    cnn = nn.Sequential(*layers).eval()
    path = B.export_onnx(cnn, torch.randn(1, 1, 8, 8), tmp_path / "cnn.onnx")
    totals = {}
    for level in ("disable", "all"):
        B.ort_session(path, level=level, threads=1, optimized_path=tmp_path / f"{level}.onnx")
        totals[level] = sum(B.count_nodes(tmp_path / f"{level}.onnx").values())
    assert totals["all"] < totals["disable"], totals
