"""Exercise 05.torchao-mlp rejects answers that skip the technique, quantize the wrong way or break accuracy."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from course_utils import exercises


def run_checker(fn):
    exercises.get("05.torchao-mlp").checker(fn)


def test_reference_passes():
    run_checker(exercises.get("05.torchao-mlp").solution)


def test_rejects_unquantized_copy():
    with pytest.raises(AssertionError, match="not INT8 torchao"):
        run_checker(lambda m: copy.deepcopy(m))


def test_rejects_quantize_dynamic():
    def legacy(m):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.ao.quantization.quantize_dynamic(copy.deepcopy(m), {nn.Linear}, dtype=torch.qint8)

    with pytest.raises(AssertionError, match="quantize_dynamic"):
        run_checker(legacy)


def test_rejects_partial_quantization():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    def first_only(m):
        q = copy.deepcopy(m)
        quantize_(q, Int8WeightOnlyConfig(), filter_fn=lambda mod, name: name == "net.0")
        return q

    with pytest.raises(AssertionError, match="Linear layers are not INT8"):
        run_checker(first_only)


def test_rejects_in_place_quantization():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    def in_place(m):
        quantize_(m, Int8WeightOnlyConfig())
        return m

    with pytest.raises(AssertionError, match="changed"):
        run_checker(in_place)


def test_rejects_broken_accuracy():
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    def broken(m):
        q = copy.deepcopy(m)
        with torch.no_grad():
            q.net[-1].bias.copy_(torch.arange(10.0) * 100)  # every image now predicts class 9
        quantize_(q, Int8WeightOnlyConfig())
        return q

    with pytest.raises(AssertionError, match="points below FP32"):
        run_checker(broken)
