"""Lesson 09's GPU code, run on the CPU: the functions of its ``contract`` cells, as the learner reads them.

``images_per_s`` (the end-to-end loop the pin-memory and uint8 sections time) runs with a ``pin_memory`` loader
and the recording device module; ``normalize_on_device`` and ``gpu_decode`` run with ``device="cpu"`` (TorchCodec
decodes a list on the CPU too) against the data set's own preprocessing; ``DevicePrefetcher`` runs against
:class:`fakegpu.streamcheck.RecordingDevice`, which flags unordered stream accesses and missing
``record_stream``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torchvision.transforms.v2.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchcodec.decoders import decode_jpeg

import course_utils as cu
from course_utils.from_lessons.l09_data_pipeline import PhotoDataset
from course_utils.supply import data
from course_utils.techniques import pipeline
from fakegpu.streamcheck import RecordingDevice, describe
from tests.gpu_contract.lesson_code import lesson_namespace, tagged_cells

COVERS = {
    "09.pin-memory": "images_per_s (the timed loop: non_blocking copies, final synchronize) with a pin_memory "
    "loader; host_memory_stats and the pinned cache need CUDA",
    "09.uint8-transfer": "normalize_on_device against the float32 data set, images_per_s with prepare=",
    "09.prefetch": "DevicePrefetcher: batches in order, side-stream copies ordered by wait_stream, record_stream",
    "09.gpu-decode": "gpu_decode with device='cpu' (same TorchCodec list call) against the CPU loader; uint8_levels "
    "accepts CUDA's float32 resize rounding and rejects a real difference",
}
NOT_TESTABLE: dict[str, str] = {}

PRESET = dict(
    torch=torch, time=time, Path=Path, F=F, decode_jpeg=decode_jpeg, DataLoader=DataLoader, Dataset=Dataset, cu=cu
)
PRESET["MEAN"], PRESET["STD"] = list(pipeline.IMAGENET_MEAN), list(pipeline.IMAGENET_STD)


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("09", **PRESET)


def test_images_per_s_synchronizes_and_counts(ns):
    loader = DataLoader(TensorDataset(torch.randn(10, 3, 8, 8), torch.zeros(10)), batch_size=4, pin_memory=False)
    seen = []
    dev = RecordingDevice()
    with dev.run("cpu"):
        ips = ns["images_per_s"](loader, lambda x: seen.append(x.shape[0]), "cpu")
    assert ips > 0 and seen == [4, 4, 2]
    syncs = []
    dev.synchronize = lambda device=None: syncs.append(device)  # the loop must wait for the device before timing
    with dev.run("cpu"):
        ns["images_per_s"](loader, lambda x: None, "cpu", prepare=lambda x: x * 2)
    assert syncs, "images_per_s must synchronize the device before it reads the clock"


def test_normalize_on_device_matches_the_dataset(ns):
    u8 = PhotoDataset(data.jpeg_paths(), 2, 16, normalize=False)
    f32 = PhotoDataset(data.jpeg_paths(), 2, 16)
    x = torch.stack([u8[i][0] for i in range(2)])
    out = ns["normalize_on_device"](x)
    assert out.dtype == torch.float32 and out.device == x.device
    assert torch.allclose(out, torch.stack([f32[i][0] for i in range(2)]), atol=1e-5)


def test_gpu_decode_on_cpu_matches_the_loader(ns):
    paths = data.jpeg_paths()[:3]
    raws = [torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8) for p in paths]
    out = ns["gpu_decode"](raws, 24, "cpu")
    ref = torch.stack([PhotoDataset([p], 1, 24)[0][0] for p in paths])
    assert out.shape == (3, 3, 24, 24) and torch.allclose(out, ref, atol=1e-5)


def prefetch_run(cls):
    batches = [(torch.randn(2, 3, 8, 8), torch.arange(2) + i) for i in range(4)]  # made before: host memory
    conv = torch.nn.Conv2d(3, 4, 3).eval()
    dev = RecordingDevice()
    got = []
    with torch.inference_mode(), dev.run("cpu"):
        for xb, yb in cls(batches, "cpu"):
            got.append((conv(xb), yb.clone()))
    with torch.inference_mode():
        for (out, y), (xb, yb) in zip(got, batches, strict=True):
            assert torch.equal(out, conv(xb)) and torch.equal(y, yb)
    return dev


def test_prefetcher_orders_copies_and_records_streams(ns):
    dev = prefetch_run(ns["DevicePrefetcher"])
    races = dev.races()
    assert not races, describe(races[0])
    assert not dev.missing_record_stream()
    assert dev.streams_used("to").isdisjoint(dev.streams_used("conv2d")), "copies must run on the side stream"


@pytest.mark.parametrize(
    ("line", "check"),
    [("main.wait_stream(self.stream)", "races"), ("t.record_stream(main)", "missing_record_stream")],
)
def test_prefetcher_plants_fail(line, check):
    cells = tagged_cells("09")
    assert sum(c.count(line) for c in cells) == 1
    planted = dict(PRESET)
    for src in cells:
        exec(src.replace(line, "pass"), planted)  # noqa: S102 - the lesson's code with one line removed
    assert getattr(prefetch_run(planted["DevicePrefetcher"]), check)(), f"removing {line} must be caught"


def _cuda_like_resize(img, size, antialias=True):
    """torchvision's CUDA path for uint8: resize in float32, then round back to uint8 (what a GPU does)."""
    return F.resize(img.float(), size, antialias=antialias).round().clamp(0, 255).to(torch.uint8)


def _u8_batches(size=32):
    paths = data.jpeg_paths()[:3]
    raws = [torch.frombuffer(bytearray(Path(p).read_bytes()), dtype=torch.uint8) for p in paths]
    imgs = [decode_jpeg(r, mode="RGB") for r in raws]
    cpu = torch.stack([F.resize(i, [size, size], antialias=True) for i in imgs])
    cuda_like = torch.stack([_cuda_like_resize(i, [size, size]) for i in imgs])
    return cpu, cuda_like


def test_gpu_rounding_fails_fp32_but_passes_the_uint8_check(ns):
    """The GPU's resize rounds through float32: a correct GPU pipeline is outside FP32's tolerance, inside uint8's."""
    cpu, cuda_like = _u8_batches()
    assert not torch.equal(cpu, cuda_like)  # the rounding really differs
    norm = ns["normalize_on_device"]
    assert not cu.compare_outputs(norm(cuda_like), norm(cpu), "fp32").within
    got = ns["uint8_levels"](cuda_like, cpu)
    assert got["mean"] < 1.0 and got["max"] >= 1


@pytest.mark.parametrize(
    ("bug", "message"),
    [
        (lambda x: x.flip(1), "beyond"),  # BGR instead of RGB
        (lambda x: x.flip(-1), "beyond"),  # mirrored
        (lambda x: x.float(), "uint8 batches"),  # compared after a dtype change
    ],
)
def test_uint8_check_rejects_real_differences(ns, bug, message):
    cpu, _ = _u8_batches()
    with pytest.raises((cu.errors.ToleranceError, ValueError), match=message):
        ns["uint8_levels"](bug(cpu), cpu)


def test_gpu_decode_outside_the_gpu_gate_runs_on_the_cpu():
    """Issue 20: the FP32 comparison of gpu_decode ran with `device` outside the gate, so it failed on CUDA."""
    from tests.gpu_contract.lesson_code import lesson_path

    top = [ln for ln in lesson_path("09").read_text().splitlines() if "gpu_decode" in ln and not ln[:1].isspace()]
    top = [ln for ln in top if not ln.startswith(("def ", "#"))]  # top-level statements, outside any gate
    assert top, "the lesson should check gpu_decode on the CPU outside the GPU gate"
    wrong = [ln for ln in top if '"cpu"' not in ln]
    assert not wrong, f"outside the GPU gate gpu_decode must run on 'cpu' (FP32 tolerance holds only there): {wrong}"
