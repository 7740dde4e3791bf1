"""Lesson 07's exercises reject wrong answers: a session at the wrong level, thread count or spinning setting,
one built from another model, or something that is not a session."""

from __future__ import annotations

import onnxruntime as ort
import pytest
import torch
from torch import nn

from course_utils import backends as be
from course_utils import exercises
from course_utils.lesson_exercises import l07

LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
          "all": "ORT_ENABLE_ALL"}  # fmt: skip


def _session(path, level="all", threads=1, *, spinning="0", set_level=True, set_threads=True):
    so = ort.SessionOptions()
    if set_level:
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    if set_threads:
        so.intra_op_num_threads = threads
    if spinning is not None:
        so.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _rejects(fn, match: str) -> None:
    with pytest.raises(AssertionError, match=match):
        exercises.get("07.session").checker(fn)


def test_reference_session_passes():
    exercises.get("07.session").checker(l07.build_session)


def test_level_ignored_is_rejected():
    _rejects(lambda p, level, t: _session(p, "all", t), "level")


def test_level_off_by_one_is_rejected():
    shifted = {"disable": "basic", "basic": "extended", "extended": "all", "all": "all"}
    _rejects(lambda p, level, t: _session(p, shifted[level], t), "level")


def test_threads_ignored_is_rejected():
    _rejects(lambda p, level, t: _session(p, level, set_threads=False), "intra_op_num_threads")


def test_spinning_left_on_is_rejected():
    _rejects(lambda p, level, t: _session(p, level, t, spinning=None), "spinning")


def test_session_of_another_model_fails_parity(tmp_path):
    torch.manual_seed(1)
    other = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(512, 10)).eval()
    wrong = be.export_onnx(other, torch.randn(2, 1, 8, 8), tmp_path / "other.onnx")
    _rejects(lambda p, level, t: _session(wrong, level, t), "differ from PyTorch")


def test_not_a_session_is_rejected():
    _rejects(lambda p, level, t: ort.SessionOptions(), "InferenceSession")


def test_options_not_passed_to_the_session_is_rejected(tmp_path):
    def forgot(p, level, t):
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
        so.intra_op_num_threads = t
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(p, providers=["CPUExecutionProvider"])  # so never passed

    _rejects(forgot, "level|intra_op_num_threads")
