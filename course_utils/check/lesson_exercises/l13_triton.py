"""Lesson 13 exercise 13.triton-config: a Triton Inference Server model config, parsed by Triton's own ``ModelConfig``.

Random cases per check; the config must name the model, its platform, batch size, queue delay, the input/output
names, data types and dims, and an instance group with the asked count (> 0) of CPU instances."""

from __future__ import annotations

from collections.abc import Callable

from course_utils.check.exercises import exercise


def _check_triton_config(fn: Callable[..., str]) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from course_utils.check.lesson_exercises.observe import cases

    fp32 = model_config_pb2.DataType.Value("TYPE_FP32")
    cpu = model_config_pb2.ModelInstanceGroup.Kind.Value("KIND_CPU")
    with cases("13.triton-config") as c:
        # Three different names per call, so a config that always names one model fails on at least two.
        names = c.rng.sample(["digits", "digits_cnn", "mnist8", "lenet8", "tiny_digits"], 4)
        draws = [(name, c.choice([4, 8, 16, 32, 64]),
                  float(c.randint(50, 2000)), c.randint(5, 4000) / 10, c.randint(5, 400) / 10, c.randint(1, 4))
                 for name in names[:3]]  # fmt: skip
        draws.append((names[3], 8, 100.0, 60.0, 5.0, 1))  # a budget already spent: the delay is 0
        for name, mbs, p99, batch_ms, http_ms, instances in draws:
            delay = max(0, round((p99 - 2 * batch_ms - http_ms) * 1000))
            text = fn(name, mbs, p99, batch_ms, http_ms, instances)
            assert isinstance(text, str), f"return the config text (a str), got {type(text).__name__}"
            try:
                cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
            except text_format.ParseError as exc:
                raise AssertionError(f"the config does not parse as Triton's ModelConfig: {exc}") from None
            assert cfg.name == name and cfg.platform == "onnxruntime_onnx", (
                f"name the model {name!r} (got {cfg.name!r}) and its platform 'onnxruntime_onnx' (got {cfg.platform!r})"
            )
            assert cfg.max_batch_size == mbs, f"max_batch_size should be {mbs}, got {cfg.max_batch_size}"
            assert cfg.HasField("dynamic_batching"), "add a dynamic_batching block"
            got = cfg.dynamic_batching.max_queue_delay_microseconds
            assert got == delay, (
                f"for p99 {p99} ms, batch {batch_ms} ms, http {http_ms} ms the queue delay is "
                f"max(0, p99 - 2 x batch - http) = {delay} us, got {got}"
            )
            assert not cfg.dynamic_batching.preferred_batch_size, "leave preferred_batch_size out (most models)"
            io = (
                [(t.name, t.data_type, list(t.dims)) for t in cfg.input],
                [(t.name, t.data_type, list(t.dims)) for t in cfg.output],
            )
            assert io == ([("input", fp32, [1, 8, 8])], [("logits", fp32, [10])]), (
                "one input named 'input' (data_type: TYPE_FP32, dims [1, 8, 8]) and one output named 'logits' "
                "(TYPE_FP32, dims [10]), no batch dimension: Triton matches these names and types against the ONNX "
                f"model and rejects the model otherwise. Got inputs {io[0]}, outputs {io[1]}"
            )
            groups = [(g.count, g.kind) for g in cfg.instance_group]
            assert groups == [(instances, cpu)], (
                f"instance_group [ {{ count: {instances}, kind: KIND_CPU }} ]: that many copies of the model on the "
                f"CPU (a count of 0 serves nothing). Got {groups}"
            )


@exercise(
    "13.triton-config",
    "Return config.pbtxt text: name, platform onnxruntime_onnx, max_batch_size, input 'input' TYPE_FP32 dims "
    "[1, 8, 8], output 'logits' TYPE_FP32 dims [10], instance_group with count instances and kind KIND_CPU, "
    "dynamic_batching with max_queue_delay_microseconds = max(0, p99_target_ms - 2 * batch_ms - http_ms) in "
    "microseconds (rounded), and no preferred_batch_size.",
    _check_triton_config,
    time_limit=30,
)
def triton_config(name: str, max_batch_size: int, p99_target_ms: float, batch_ms: float, http_ms: float,
                  instances: int) -> str:  # fmt: skip
    delay_us = max(0, round((p99_target_ms - 2 * batch_ms - http_ms) * 1000))
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "input", data_type: TYPE_FP32, dims: [ 1, 8, 8 ] }} ]
output [ {{ name: "logits", data_type: TYPE_FP32, dims: [ 10 ] }} ]
instance_group [ {{ count: {instances}, kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
"""
