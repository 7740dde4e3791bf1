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
    assert caps["torch"] == torch.__version__ and caps["device"] == str(device.pick_device())
    assert caps["cpu"] == device.cpu_model() and caps["torch_threads"] == torch.get_num_threads()
    table = device.capability_table(caps)
    assert list(table.columns) == ["what", "value"] and len(table) == len(caps)
    assert list(table["what"]) == list(caps) and list(table["value"]) == [str(v) for v in caps.values()]


@pytest.mark.parametrize(
    "flags, vnni, bf16, amx",
    [
        (set(), False, False, False),
        ({"avx512_vnni"}, True, False, False),
        ({"avx_vnni"}, True, False, False),  # the AVX2 form of VNNI (Alder Lake and later) counts too
        ({"avx512_bf16"}, False, True, False),
        ({"amx_tile"}, False, False, True),  # AMX tiles alone do not say BF16
        ({"amx_tile", "amx_bf16"}, False, True, True),
    ],
)
def test_cpu_precision_facts_come_from_the_flags(monkeypatch, flags, vnni, bf16, amx):
    monkeypatch.setattr(device, "cpu_flags", lambda: set(flags))
    caps = device.capabilities()
    assert (caps["cpu_avx512_vnni"], caps["cpu_bf16"], caps["cpu_amx"]) == (vnni, bf16, amx)


def test_a_missing_backend_says_missing_with_its_error(monkeypatch):
    real = device.module_status
    monkeypatch.setattr(device, "module_status", lambda name: (False, "ModuleNotFoundError: x") if name == "pycuda"
                        else real(name))  # fmt: skip
    assert device.capabilities()["pycuda"] == "missing (ModuleNotFoundError: x)"


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


def test_a_course_error_renders_as_one_line_with_its_own_type_name():
    from course_utils.supply.errors import BadArgumentError, MissingFileError

    assert CourseError("use cpu")._render_traceback_() == ["CourseError: use cpu"]
    assert BadArgumentError("unknown model 'x'")._render_traceback_() == ["BadArgumentError: unknown model 'x'"]
    assert MissingFileError("no data/x.pt")._render_traceback_() == ["MissingFileError: no data/x.pt"]
