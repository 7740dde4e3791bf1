"""Lesson 04's GPU section, run on CPU: the cells the learner reads (tagged "contract"), executed as written.

`precision_grid` is the whole body of the GPU section (`04.gpu-precisions`): on CUDA it adds TF32 rows and
records peak memory; here it runs on CPU with tf32=True forced, so the TF32 bookkeeping (one row per
distinct variant, the baseline is plain FP32 with TF32 off, both switches restored) is exercised with the
real torch.backends API.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "04.gpu-precisions": "precision_grid + set_tf32 run on CPU with TF32 rows forced: one row per distinct "
    "variant and batch, each checked against true FP32 before timing; the TF32 switches (matmul and cuDNN, "
    "legacy setters only) leave torch.get_float32_matmul_precision() readable",
}


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("04")


@pytest.fixture(autouse=True)
def restore_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 5),
    ).eval()


def test_set_tf32_toggles_both_switches_in_one_family(ns):
    ns["set_tf32"](True)
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "high"  # raises if the two API families were mixed
    ns["set_tf32"](False)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest"
    assert torch.backends.cudnn.conv.fp32_precision != "tf32"  # the new-style view agrees: no TF32 convolutions


def test_precision_grid_rows(ns):
    df = ns["precision_grid"](
        _tiny(), "cpu", (1, 3), image_size=8, tf32=True, warmup=0, min_calls=2, min_round_s=0, rounds=2
    )
    names = [
        "fp32",
        "fp32 channels_last",
        "tf32",
        "tf32 channels_last",
        "bf16 autocast",
        "bf16 cast",
        "bf16 autocast channels_last",
        "fp16 autocast",
        "fp16 cast",
        "fp16 autocast channels_last",
    ]
    for b in (1, 3):
        rows = df[df.batch == b]
        assert rows.variant.tolist() == names, "one row per distinct variant, baseline first"
        assert rows.set_index("variant").loc["fp32", "speedup"] == pytest.approx(1.0)
    assert set(df[df.variant.str.startswith("tf32")].precision) == {"tf32"}
    assert set(df[df.variant.str.startswith("bf16")].precision) == {"bf16"}
    assert (df.max_rel_err[df.precision == "fp32"] < 1e-5).all()
    assert (df.max_rel_err[df.precision == "bf16"] > 0).all(), "a BF16 row that equals FP32 exactly did not run BF16"
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32, "TF32 left on"
    assert df.peak_MiB.isna().all() and (df.median_ms > 0).all()


def test_make_variants_apply_what_they_say(ns):
    model, x = _tiny(), torch.rand(2, 3, 8, 8)
    variants = ns["make_variants"](model, (torch.bfloat16,))
    from course_checks.lesson_exercises.observe import CONV_OPS, OpLog

    with torch.inference_mode():
        for name, run in variants.items():
            assert run(x).dtype == torch.float32, name
        with OpLog(watch=model) as log:
            variants["bf16 autocast"](x)
    convs = log.named(*CONV_OPS)
    assert convs and convs[0].out_dtypes == (torch.bfloat16,)
    assert next(model.parameters()).dtype == torch.float32, "autocast variant must not cast the shared model"


class FakeMemory:
    """torch.cuda's memory counters for a device on which RESIDENT bytes (every model copy of the grid) stay
    allocated and each timed run allocates RUN bytes more at its peak."""

    RESIDENT, RUN = 512 * 2**20, 3 * 2**20

    def __init__(self):
        self.resets = 0

    def synchronize(self):
        pass

    def memory_allocated(self):
        return self.RESIDENT

    def reset_peak_memory_stats(self):
        self.resets += 1

    def max_memory_allocated(self):
        return self.RESIDENT + self.RUN


def test_peak_memory_is_the_variant_alone(ns):
    """The old grid reported max_memory_allocated(): every resident model copy counted in every row."""
    model, mem = _tiny(), FakeMemory()
    df = ns["precision_grid"](
        model, "cpu", (2,), image_size=8, tf32=False, memory=mem, warmup=0, min_calls=2, min_round_s=0, rounds=2
    )
    fp32_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    x_bytes = 2 * 3 * 8 * 8 * 4
    rows = df.set_index("variant")
    assert mem.resets == len(df), "peak statistics reset before each variant is timed"
    assert rows.loc["fp32", "peak_MiB"] == pytest.approx((FakeMemory.RUN + fp32_bytes + x_bytes) / 2**20)
    assert (rows["peak_MiB"] < FakeMemory.RESIDENT / 2**20).all(), "resident copies of other variants counted"
    bf16 = model.to(torch.bfloat16)
    bf16_bytes = sum(t.numel() * t.element_size() for t in (*bf16.parameters(), *bf16.buffers()))
    assert bf16_bytes < fp32_bytes
    assert rows.loc["bf16 cast", "peak_MiB"] == pytest.approx((FakeMemory.RUN + bf16_bytes + x_bytes) / 2**20)
