"""Lesson 00's GPU queries, as the learner reads them, run on CPU: the device properties it reads exist on
torch's real ``_CudaDeviceProperties``; its nvidia-smi call is well formed and its CSV answer parsed."""

from __future__ import annotations

import shutil
import subprocess
import types

import pytest
import torch

from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "00.gpu-visible": "gpu_properties reads only attributes of torch's real _CudaDeviceProperties; nvidia_smi "
    "builds one --query-gpu command and parses its CSV (field names not checked against a real nvidia-smi)",
}


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("00", torch=torch, shutil=shutil, subprocess=subprocess)


def fake_props():
    """An object with exactly the attributes torch's real CUDA device properties have (values made up)."""
    names = [a for a in dir(torch._C._CudaDeviceProperties) if not a.startswith("_")]
    values = {a: 1 for a in names} | {
        "name": "NVIDIA H200",
        "major": 9,
        "minor": 0,
        "total_memory": 141 * 2**30,
        "L2_cache_size": 60 * 2**20,
        "clock_rate": 1980000,
        "uuid": "GPU-x",
    }
    return types.SimpleNamespace(**{k: v for k, v in values.items() if k in names})


def test_gpu_properties_reads_real_attributes(ns, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: fake_props())
    got = ns["gpu_properties"](0)
    assert got["capability"] == "9.0" and got["memory GiB"] == 141.0 and got["max SM clock MHz (props)"] == 1980


def test_nvidia_smi_command_and_parse(ns, monkeypatch):
    seen = {}

    def run(cmd, capture_output, text, timeout):
        seen["cmd"] = cmd
        line = "580.65.06, 1980, 1980, 3201, 700.00, Disabled\n"
        return subprocess.CompletedProcess(cmd, 0, stdout=line, stderr="")

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    out = ns["nvidia_smi"](run=run)
    assert seen["cmd"][0] == "/usr/bin/nvidia-smi"
    assert seen["cmd"][2] == "--query-gpu=" + ",".join(ns["SMI_FIELDS"])
    assert "--format=csv,noheader,nounits" in seen["cmd"]
    assert out["driver_version"] == "580.65.06" and out["mig.mode.current"] == "Disabled"


def test_nvidia_smi_absent_or_failing(ns, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert ns["nvidia_smi"]() is None
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    fail = lambda cmd, **k: subprocess.CompletedProcess(cmd, 9, stdout="", stderr="NVIDIA-SMI has failed")  # noqa: E731
    assert ns["nvidia_smi"](run=fail) is None
