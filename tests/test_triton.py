"""Lesson 13's Triton cells (tagged "contract"): config text, validation with Triton's protobuf classes, repository
layout, the docker and perf_analyzer command lines."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from course_utils.supply.models import DigitsCNN
from tests.gpu_contract.lesson_code import lesson_namespace


@pytest.fixture(scope="module")
def ts():
    """Lesson 13's contract cells, executed; attribute access (ts.validate_config) for the names they define."""
    return SimpleNamespace(**lesson_namespace("13"))


@pytest.fixture(scope="module")
def io(ts):
    """One input and one output, as the digits CNN has them."""
    return [ts.TensorSpec("input", "TYPE_FP32", (1, 8, 8))], [ts.TensorSpec("logits", "TYPE_FP32", (10,))]


def test_make_config_parses_with_the_given_settings(ts, io):
    inp, out = io
    text = ts.make_config(
        "m",
        inp,
        out,
        max_batch_size=16,
        preferred_batch_sizes=(4, 8),
        max_queue_delay_us=300,
        instance_count=2,
        kind="KIND_GPU",
    )
    cfg = ts.validate_config(text)
    assert cfg.name == "m" and cfg.max_batch_size == 16
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 300
    assert cfg.instance_group[0].count == 2 and list(cfg.input[0].dims) == [1, 8, 8]


def test_misspelled_field_is_caught(ts, io):
    inp, out = io
    text = ts.make_config("m", inp, out).replace("max_queue_delay_microseconds", "max_queue_delay_microsecond")
    with pytest.raises(ts.TritonConfigError, match="max_queue_delay_microsecond"):
        ts.validate_config(text)


def test_preferred_size_above_maximum_is_caught(ts, io):
    inp, out = io
    text = ts.make_config("m", inp, out, max_batch_size=8, preferred_batch_sizes=(4, 16))
    with pytest.raises(ts.TritonConfigError, match="preferred_batch_size 16 exceeds max_batch_size 8"):
        ts.validate_config(text)
    at_max = ts.make_config("m", inp, out, max_batch_size=8, preferred_batch_sizes=(1, 8))
    assert list(ts.validate_config(at_max).dynamic_batching.preferred_batch_size) == [1, 8], (
        "both ends allowed: 1 and max_batch_size itself"
    )


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"max_batch_size": 0, "preferred_batch_sizes": (1,)}, "needs max_batch_size > 0"),
        ({"preferred_batch_sizes": (0, 8)}, "below 1"),
        ({"instance_count": 0}, "count 0"),
    ],
)
def test_other_semantic_errors(ts, io, kwargs, words):
    inp, out = io
    with pytest.raises(ts.TritonConfigError, match=words):
        ts.validate_config(ts.make_config("m", inp, out, **kwargs))


def test_wrong_enum_value_is_caught(ts, io):
    inp, out = io
    with pytest.raises(ts.TritonConfigError, match="KIND_TPU"):
        ts.validate_config(ts.make_config("m", inp, out).replace("KIND_CPU", "KIND_TPU"))


def test_write_model_repository(ts, tmp_path):
    torch.manual_seed(0)
    model = DigitsCNN().eval()
    folder = ts.write_model_repository(
        tmp_path, model, torch.randn(2, 1, 8, 8), name="digits", max_batch_size=16, preferred_batch_sizes=(8, 16)
    )
    assert folder == tmp_path / "digits"
    assert (folder / "1" / "model.onnx").is_file() and not list(folder.rglob("*.data"))  # one self-contained file
    cfg = ts.validate_config(folder / "config.pbtxt")
    assert cfg.name == "digits" and cfg.input[0].name and list(cfg.output[0].dims) == [10]
    import onnxruntime as ort

    sess = ort.InferenceSession(str(folder / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = torch.randn(5, 1, 8, 8)  # another batch size than the export's: the batch dimension is dynamic
    got = sess.run(None, {cfg.input[0].name: x.numpy()})[0]
    with torch.inference_mode():
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-4)


def test_write_model_repository_rejects_bad_settings(ts, tmp_path):
    with pytest.raises(ts.TritonConfigError, match="kind"):
        ts.write_model_repository(tmp_path, DigitsCNN(), torch.randn(1, 1, 8, 8), kind="GPU")


def test_docker_line(ts, tmp_path):
    line = ts.docker_run_line(tmp_path, gpus=False)
    assert line.startswith("docker run") and "--gpus" not in line and f"{tmp_path.resolve()}:/models" in line
    assert "-p 127.0.0.1:8001:8001" in line and "tritonserver --model-repository=/models" in line
    assert "--gpus all" in ts.docker_run_line(tmp_path)


def test_default_config_has_no_preferred_sizes(ts, io):
    """Triton's batcher guide: most models should not set preferred_batch_size; the delay is the knob."""
    inp, out = io
    text = ts.make_config("m", inp, out, max_queue_delay_us=2500)
    cfg = ts.validate_config(text)
    assert "preferred_batch_size" not in text and not cfg.dynamic_batching.preferred_batch_size
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 2500


def test_perf_analyzer_line(ts):
    line = ts.perf_analyzer_line("digits", concurrency=(1, 64))
    assert line.startswith("perf_analyzer -m digits -u 127.0.0.1:8001") and "--concurrency-range 1:64:2" in line
    line = ts.perf_analyzer_line("digits", rate=(100, 500))
    assert "--request-rate-range 100:500:100" in line and "--request-distribution=poisson" in line
    with pytest.raises(ts.TritonConfigError, match="exactly one"):
        ts.perf_analyzer_line("digits")


def test_onnx_io_drops_only_the_batch_dimension_and_the_initializers(ts, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "n"])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, "n"])  # an initializer listed as an input
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, "n"])
    init = helper.make_tensor("w", TensorProto.FLOAT, [3, 1], [1.0, 2.0, 3.0])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x, w, ids], [y], [init])
    onnx.save(helper.make_model(graph), tmp_path / "m.onnx")
    inputs, outputs = ts.onnx_io(tmp_path / "m.onnx")
    assert inputs == [
        ts.TensorSpec("x", "TYPE_FP32", (3, -1)),  # a named dimension beyond the batch is -1
        ts.TensorSpec("ids", "TYPE_INT64", (5,)),
    ]
    assert outputs == [ts.TensorSpec("y", "TYPE_FP32", (3, -1))]


def test_perf_analyzer_rate_step_is_at_least_one(ts):
    assert "--request-rate-range 10:12:1 " in ts.perf_analyzer_line("digits", rate=(10, 12))
    assert "--request-rate-range 10:30:5 " in ts.perf_analyzer_line("digits", rate=(10, 30))
    assert "--concurrency-range 4:16:4" in ts.perf_analyzer_line("digits", concurrency=(4, 16))
