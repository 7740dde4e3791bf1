import json
import warnings

import pytest
import torch

from course_utils.sections import gpu_sections
from course_utils.supply import modes
from course_utils.supply.errors import CourseError, GPURequiredError, SettingError


def test_pick_follows_smoke(monkeypatch):
    monkeypatch.setenv("COURSE_SMOKE", "1")
    assert modes.is_smoke() and modes.pick(full=100, smoke=2) == 2
    monkeypatch.setenv("COURSE_SMOKE", "0")
    assert not modes.is_smoke() and modes.pick(full=100, smoke=2) == 100


def test_gpu_section_skips_and_records(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_sections.gpu_section("99.test") is False
    assert "skipped" in capsys.readouterr().out
    rows = modes.read_sections()
    assert rows[-1]["section"] == "99.test" and rows[-1]["ran"] is False and rows[-1]["kind"] == "gpu"


def test_gpu_section_strict_raises(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.setenv("COURSE_STRICT_GPU", "1")
    assert modes.is_strict_gpu()
    with pytest.raises(GPURequiredError, match="99.strict.*no CUDA GPU"):
        gpu_sections.gpu_section("99.strict")


def test_missing_modules_and_needs(monkeypatch):
    assert modes.missing_modules(["torch", "surely_not_a_module_xyz"]) == ["surely_not_a_module_xyz"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Fake GPU")
    assert gpu_sections.gpu_section("99.needs", needs=("surely_not_a_module_xyz",)) is False
    assert "surely_not_a_module_xyz" in modes.read_sections()[-1]["reason"]
    assert gpu_sections.gpu_section("99.ok") is True


def test_opt_in_section(monkeypatch):
    assert modes.opt_in_section("99.opt", "COURSE_TEST_OPT", "Starts something.") is False
    assert modes.read_sections()[-1]["kind"] == "opt-in"
    monkeypatch.setenv("COURSE_TEST_OPT", "1")
    assert modes.opt_in_section("99.opt", "COURSE_TEST_OPT", "Starts something.") is True


def test_mode_summary():
    summary = modes.mode_summary()
    assert {"size mode", "strict GPU", "results folder"} <= set(summary)
    assert modes.sections_file().name == "sections.jsonl"


@pytest.mark.parametrize(
    ("raw", "on"),
    [
        ("1", True),
        (" 1 ", True),
        ("TRUE", True),
        ("yes", True),
        ("On", True),
        ("0", False),
        ("false", False),
        (" no", False),
        ("OFF", False),
        ("", False),
    ],
)
def test_switch_accepts_on_off_words(monkeypatch, raw, on):
    monkeypatch.setenv("COURSE_SMOKE", raw)
    assert modes.switch("COURSE_SMOKE") is on and modes.is_smoke() is on


@pytest.mark.parametrize("raw", ["2", "smoke", "1 0", "tru", "-1"])
@pytest.mark.parametrize("var", ["COURSE_SMOKE", "COURSE_STRICT_GPU", "COURSE_TEST_OPT"])
def test_switch_rejects_anything_else_naming_variable_and_values(monkeypatch, raw, var):
    monkeypatch.setenv(var, raw)
    with pytest.raises(SettingError, match=var) as info:
        if var == "COURSE_SMOKE":
            modes.pick(full=1, smoke=2)
        elif var == "COURSE_STRICT_GPU":
            modes.is_strict_gpu()
        else:
            modes.opt_in_section("99.opt", var, "Starts something.")
    assert "1/0, true/false, yes/no, on/off" in str(info.value) and repr(raw) in str(info.value)
    assert isinstance(info.value, CourseError)


def test_unset_switch_is_off(monkeypatch):
    monkeypatch.delenv("COURSE_TEST_UNSET", raising=False)
    assert modes.switch("COURSE_TEST_UNSET") is False


def test_reported_mode_matches_the_mode_used(monkeypatch):
    from course_utils.show import results

    monkeypatch.setenv("COURSE_SMOKE", " 1 ")
    assert modes.pick(full="full", smoke="smoke") == "smoke"
    assert modes.mode_summary()["size mode"].startswith("smoke")
    assert results.record("99", "t", median_ms=1.0)["mode"] == "smoke"
    monkeypatch.setenv("COURSE_SMOKE", "off")
    assert modes.mode_summary()["size mode"] == "full" and results.record("99", "t", median_ms=1.0)["mode"] == "full"


def test_read_sections_skips_torn_and_garbled_lines():
    path = modes.sections_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    good = json.dumps({"section": "99.good", "ran": False, "reason": "r", "kind": "gpu", "time": 1.0})
    path.write_text(f'{good}\n{{"section": "99.torn", "ran": fal\n\x00\x00garbage\n[1, 2]\n\n{good}\n')
    with pytest.warns(UserWarning, match=r"skipped 3 unreadable line\(s\) of .*sections\.jsonl \(line 2, 3, 4\)"):
        rows = modes.read_sections()
    assert [r["section"] for r in rows] == ["99.good", "99.good"]


def test_section_record_survives_concurrent_writers():
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_sections, args=(i,)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no torn line
        rows = modes.read_sections()
    assert len(rows) == 4 * 50


def _write_sections(i: int) -> None:
    for k in range(50):
        modes.record_section(f"99.p{i}.{k}", False, "x" * 5000, "gpu")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="rehearsal runs where there is no GPU")
def test_a_section_whose_body_cannot_run_is_skipped_not_completed(monkeypatch, capsys):
    monkeypatch.setenv("COURSE_REHEARSE", "1")
    monkeypatch.setattr(gpu_sections, "_HOOKS", {"cells": True})
    assert not gpu_sections.gpu_section("99.needs-engine", requires={"08.build's fp16 engine": False, "a model": True})
    assert not gpu_sections.gpu_section("99.trt-provider", providers=("TensorrtExecutionProvider",))
    rows = {r["section"]: r for r in modes.read_sections()}
    assert rows["99.needs-engine"]["status"] == "skipped" and not rows["99.needs-engine"]["ran"]
    assert rows["99.needs-engine"]["reason"].startswith("needs 08.build's fp16 engine, which the cells above")
    assert rows["99.trt-provider"]["status"] == "not-rehearsable"
    assert "ONNX Runtime here has no TensorrtExecutionProvider" in rows["99.trt-provider"]["reason"]
    assert gpu_sections.gpu_section(
        "99.cuda-provider", providers=("CUDAExecutionProvider",)
    )  # the stand-in provides it
    assert gpu_sections.finish_cell(True) is None
    assert modes.read_sections()[-1]["status"] == "completed"
    assert "every timing it prints is the stand-in's" in capsys.readouterr().out


def test_available_names_what_is_skipped(capsys):
    assert modes.available(("json",), "step 1")
    assert not modes.available(("surely_not_installed_xyz",), "step 6 (torchao INT8)")
    assert "step 6 (torchao INT8) skipped: missing Python package(s): surely_not" in capsys.readouterr().out


def test_a_plain_script_that_crashes_in_a_section_records_it_failed(monkeypatch):
    """Without the cell runner: the excepthook records the crashed section failed (then calls the old hook); the
    atexit hook records a section still pending when the script ends normally as completed."""
    import sys

    seen, at_exit = [], []
    monkeypatch.setattr(gpu_sections, "_HOOKS", {})
    monkeypatch.setattr(gpu_sections, "_PENDING", [])
    monkeypatch.setattr(gpu_sections.atexit, "register", at_exit.append)
    monkeypatch.setattr(sys, "excepthook", lambda *a: seen.append(a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Fake GPU")
    try:  # a plain script: no IPython shell (an earlier test in this process may have started the global one)
        import IPython

        monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    except ImportError:
        pass
    assert gpu_sections.gpu_section("99.crash")
    assert len(at_exit) == 1
    err = ValueError("boom\nmore")
    sys.excepthook(ValueError, err, None)
    last = modes.read_sections()[-1]
    assert (last["section"], last["status"], last["ran"], last["reason"]) == ("99.crash", "failed", False,
                                                                              "ValueError: boom")  # fmt: skip
    assert seen == [(ValueError, err, None)]
    assert gpu_sections.gpu_section("99.ends")
    at_exit[0]()
    last = modes.read_sections()[-1]
    assert (last["section"], last["status"], last["ran"]) == ("99.ends", "completed", True)


def test_rehearsing_needs_the_switch_and_no_real_gpu(monkeypatch):
    no_real_gpu = modes.no_real_gpu
    monkeypatch.setenv("COURSE_REHEARSE", "1")
    monkeypatch.setattr(modes, "no_real_gpu", lambda: False)  # a CUDA machine: the real GPU runs the sections
    assert modes.rehearsing() is False and modes.standin_label() == ""
    monkeypatch.setattr(modes, "no_real_gpu", lambda: True)
    assert modes.rehearsing() is True and "rehearsal stand-in" in modes.standin_label()
    monkeypatch.setenv("COURSE_REHEARSE", "0")
    assert modes.rehearsing() is False
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: 1, raising=False)
    assert no_real_gpu() is False
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: 0, raising=False)
    assert no_real_gpu() is True


def test_mode_summary_reads_each_switch(monkeypatch):
    monkeypatch.setenv("COURSE_SMOKE", " 1 ")
    monkeypatch.delenv("COURSE_STRICT_GPU", raising=False)
    summary = modes.mode_summary()
    assert summary["size mode"] == "smoke (COURSE_SMOKE=1)" and summary["strict GPU"] is False
    monkeypatch.setenv("COURSE_SMOKE", "0")
    monkeypatch.setenv("COURSE_STRICT_GPU", "yes")
    summary = modes.mode_summary()
    assert summary["size mode"] == "full" and summary["strict GPU"] is True


def test_start_seeds_every_generator_with_the_seed_it_is_given(monkeypatch, capsys):
    import random

    import numpy as np

    from course_utils.sections.lesson import start

    monkeypatch.delenv("COURSE_REHEARSE", raising=False)
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        draws = {}
        for seed in (5, 6):
            random.seed(99), np.random.seed(99), torch.manual_seed(99)  # start() must replace these
            assert isinstance(start("00", "demo", seed=seed), torch.device)
            draws[seed] = (random.random(), float(np.random.rand()), float(torch.rand(1)))
        random.seed(5), np.random.seed(5), torch.manual_seed(5)
        assert draws[5] == (random.random(), float(np.random.rand()), float(torch.rand(1)))
        assert all(a != b for a, b in zip(draws[5], draws[6], strict=True)), "each generator follows the seed"
    finally:
        random.setstate(saved[0]), np.random.set_state(saved[1]), torch.set_rng_state(saved[2])
    assert "Lesson 00: demo" in capsys.readouterr().out


def test_a_stand_in_module_without_a_finder_is_not_missing(monkeypatch):
    import sys
    import types

    probe = types.ModuleType("course_standin_probe")  # __spec__ is None: find_spec raises ValueError
    monkeypatch.setitem(sys.modules, "course_standin_probe", probe)
    missing = modes.missing_modules(["course_standin_probe", "json", "course_no_such_module"])
    assert missing == ["course_no_such_module"]
