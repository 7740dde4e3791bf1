"""Lesson 05's GPU section, on the CPU: the torchao configs it builds, and the device its timings carry.

The GPU section calls ``gpu_quant_configs(capability)`` from a cell tagged ``contract``; these tests run that
very cell. ``Int4WeightOnlyConfig()`` with its default packing needs the separate ``mslk`` package; the lesson's
tile-packed config must get past that import (on the CPU it then stops where CUDA is needed).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "05.gpu-fp8-int4": "INT4 config arguments (group 128, tile-packed, no mslk), applying it reaches CUDA, "
    "not an ImportError; FP8 config only at capability 8.9+; timing rows carry the input's device",
}


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("05")


def test_int4_config_needs_no_extra_package(ns):
    from torchao.quantization import Int4WeightOnlyConfig, quantize_

    cfg = ns["gpu_quant_configs"]((8, 0))["int4 weight-only"]
    assert isinstance(cfg, Int4WeightOnlyConfig)
    assert cfg.group_size == 128 and cfg.int4_packing_format == "tile_packed_to_4d"
    model = nn.Sequential(nn.Linear(256, 256)).to(torch.bfloat16)
    try:
        quantize_(model, cfg)  # on a CPU it must stop at CUDA, not at a missing package
    except ImportError as exc:
        pytest.fail(f"the lesson's INT4 config needs an extra package: {exc}")
    except RuntimeError as exc:
        assert "NVIDIA" in str(exc) or "CUDA" in str(exc), exc


def test_default_int4_packing_would_have_failed():
    """The check above can fail: the default config (the old lesson's) raises ImportError for mslk."""
    from torchao.quantization import Int4WeightOnlyConfig, quantize_

    pytest.importorskip("torchao")
    try:
        import mslk  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="mslk"):
            quantize_(nn.Sequential(nn.Linear(256, 256)).to(torch.bfloat16), Int4WeightOnlyConfig())
    else:
        pytest.skip("mslk is installed here")


def test_fp8_only_on_capable_gpus(ns):
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig

    assert set(ns["gpu_quant_configs"]((8, 0))) == {"int4 weight-only"}
    cfgs = ns["gpu_quant_configs"]((9, 0))
    assert isinstance(cfgs["fp8 dynamic"], Float8DynamicActivationFloat8WeightConfig)


def test_timing_carries_the_input_device_on_a_gpu_machine(ns, monkeypatch):
    """On a CUDA machine the lesson's CPU models are timed (and recorded) as cpu, not as the default cuda."""
    import course_utils as cu
    from course_utils.measuring import device as D

    monkeypatch.setattr(D, "pick_device", lambda: torch.device("cuda"))  # what a GPU machine's default is
    assert str(cu.device.pick_device()) == "cuda"
    model = nn.Linear(4, 2)
    m = ns["time_model"](model, torch.rand(3, 4), "cpu model", warmup=1, min_repeats=2, min_time_s=0.0)
    assert m.device == "cpu" and m.batch_size == 3
    row = cu.record("05", "t", model="m", dtype="fp32", measurement=m)
    assert row["device"] == "cpu"
    feats = {"input_ids": torch.zeros(5, 3, dtype=torch.long)}
    m2 = ns["time_model"](lambda f: f["input_ids"].sum(), feats, "dict", warmup=1, min_repeats=2, min_time_s=0.0)
    assert m2.device == "cpu" and m2.batch_size == 5


# ---- issue 20 fixes (each fails on the code before the fix)


def test_int4_bytes_are_phrased_from_the_measured_numbers(ns):
    phrase = ns["bytes_phrase"]
    mib = 2**20
    padded = phrase("int4 weight-only", 10 * mib, 10 * mib)  # MiniLM: 384-wide layers padded to 1024
    assert "no memory gain" in padded and "half" not in padded, padded
    assert "about half" in phrase("int4 weight-only", 5 * mib, 10 * mib)
    assert "MORE bytes" in phrase("int4 weight-only", 15 * mib, 10 * mib)
    assert "10.00 MiB" in padded


def test_lesson_no_longer_claims_int4_halves_int8():
    from tests.gpu_contract.lesson_code import lesson_path

    src = lesson_path("05").read_text()
    assert "halves INT8's weight bytes again" not in src, "false for MiniLM: the tile format pads 384 to 1024"
    assert "bytes_phrase(name, quantization.linear_weight_bytes(mg)" in src, "the GPU section prints the measured bytes"


def test_freezing_is_scoped_not_left_on():
    import ast

    from tests.gpu_contract.lesson_code import lesson_path

    tree = ast.parse(lesson_path("05").read_text())
    stores = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and any("config.freezing" in ast.unparse(t) for t in n.targets)
    ]
    assert not stores, f"line(s) {stores}: freezing set globally stays on for every later compile (GPU ones too)"
    patches = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.With)
        and any("config.patch(freezing=True)" in ast.unparse(i.context_expr) for i in n.items)
    ]
    assert len(patches) >= 2, "both compiled-with-freezing comparisons use `with torch._inductor.config.patch(...)`"


def test_config_patch_restores_freezing():
    import torch._inductor.config as inductor_config

    before = inductor_config.freezing
    with inductor_config.patch(freezing=True):
        assert inductor_config.freezing is True
    assert inductor_config.freezing == before
