"""The offline GPU check in strict mode: on a machine without a GPU it fails, naming the first GPU section."""

import pytest
import torch

from scripts import gpu_check


def test_refuses_without_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_check.main(["--lessons", "00", "--no-save"]) == 2
    assert "needs one" in capsys.readouterr().out


def test_strict_run_on_cpu_fails_naming_the_section(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rc = gpu_check.main(["--allow-cpu", "--lessons", "00", "--no-save", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "GPURequiredError" in out and "00.gpu-visible" in out and "SKIPPED: no CUDA GPU" in out


def test_environment_names_versions():
    env = gpu_check.environment()
    assert {"gpu", "driver", "cuda", "torch", "tensorrt", "onnxruntime", "date"} <= set(env)
