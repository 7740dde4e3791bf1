import pytest
import torch

from course_utils import modes
from course_utils.errors import GPURequiredError


def test_pick_follows_smoke(monkeypatch):
    monkeypatch.setenv("COURSE_SMOKE", "1")
    assert modes.is_smoke() and modes.pick(full=100, smoke=2) == 2
    monkeypatch.setenv("COURSE_SMOKE", "0")
    assert not modes.is_smoke() and modes.pick(full=100, smoke=2) == 100


def test_gpu_section_skips_and_records(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert modes.gpu_section("99.test") is False
    assert "skipped" in capsys.readouterr().out
    rows = modes.read_sections()
    assert rows[-1]["section"] == "99.test" and rows[-1]["ran"] is False and rows[-1]["kind"] == "gpu"


def test_gpu_section_strict_raises(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setenv("COURSE_STRICT_GPU", "1")
    assert modes.is_strict_gpu()
    with pytest.raises(GPURequiredError, match="99.strict.*no CUDA GPU"):
        modes.gpu_section("99.strict")


def test_missing_modules_and_needs(monkeypatch):
    assert modes.missing_modules(["torch", "surely_not_a_module_xyz"]) == ["surely_not_a_module_xyz"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Fake GPU")
    assert modes.gpu_section("99.needs", needs=("surely_not_a_module_xyz",)) is False
    assert "surely_not_a_module_xyz" in modes.read_sections()[-1]["reason"]
    assert modes.gpu_section("99.ok") is True


def test_opt_in_section(monkeypatch):
    assert modes.opt_in_section("99.opt", "COURSE_TEST_OPT", "Starts something.") is False
    assert modes.read_sections()[-1]["kind"] == "opt-in"
    monkeypatch.setenv("COURSE_TEST_OPT", "1")
    assert modes.opt_in_section("99.opt", "COURSE_TEST_OPT", "Starts something.") is True


def test_mode_summary():
    summary = modes.mode_summary()
    assert {"size mode", "strict GPU", "results folder"} <= set(summary)
    assert modes.sections_file().name == "sections.jsonl"
