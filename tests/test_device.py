import pytest
import torch

from course_utils.measuring import device
from course_utils.supply.errors import CourseError, DeviceUnavailableError


def test_pick_and_get_device():
    d = device.pick_device()
    assert d.type in {"cpu", "cuda", "mps"}
    assert device.get_device(None) == d
    assert device.get_device("cpu") == torch.device("cpu")


def test_cuda_request_without_gpu_is_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(DeviceUnavailableError) as info:
        device.get_device("cuda")
    err = info.value
    assert isinstance(err, CourseError)
    rendered = err._render_traceback_()
    assert len(rendered) == 1 and "device='cpu'" in rendered[0]


def test_capabilities_and_table():
    caps = device.capabilities()
    for key in ("cpu", "torch", "device", "cuda_available", "onnxruntime", "tensorrt", "torchao"):
        assert key in caps
    assert caps["cuda_available"] == torch.cuda.is_available()
    table = device.capability_table(caps)
    assert list(table.columns) == ["what", "value"] and len(table) == len(caps)


def test_module_status_reports_import_error():
    ok, info = device.module_status("surely_not_a_module_xyz")
    assert not ok and "ModuleNotFoundError" in info
    ok, version = device.module_status("torch")
    assert ok and version == torch.__version__


def test_cpu_facts_and_describe():
    assert isinstance(device.cpu_model(), str) and device.cpu_model()
    assert isinstance(device.cpu_flags(), set)
    assert isinstance(device.describe(), str)
    device.synchronize("cpu")
    assert device.has_cuda() == torch.cuda.is_available()
