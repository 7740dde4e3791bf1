"""A Triton Inference Server model repository for a course model: write it, validate it, show how to run it.

Triton serves models from a folder ``<repository>/<model name>/`` holding ``config.pbtxt`` and a numbered
version folder (``1/model.onnx``). The config sets the batching that Triton does on the server side:
``max_batch_size``, ``dynamic_batching { preferred_batch_size, max_queue_delay_microseconds }`` and
``instance_group`` (how many copies of the model, on CPU or GPU).

Batching guidance (Triton's dynamic batcher guide): set ``max_batch_size`` and ``max_queue_delay_microseconds``
(how long a request may wait for batch-mates) and measure with ``perf_analyzer``; leave
``preferred_batch_size`` unset for most models (the batcher already forms the largest batch it can); it helps
only a model much faster at a few specific sizes, such as a TensorRT engine built for them.

The config is validated with Triton's own protobuf classes (``tritonclient.grpc.model_config_pb2``
parsed by ``google.protobuf.text_format``), which catches misspelled fields and wrong types, plus the
checks the parser does not do (a preferred batch size above ``max_batch_size``, dynamic batching without
batching). Nothing here starts Triton: the ``docker run`` line and the client code are returned as text.
Install ``tritonclient`` without its dependencies (its pins would downgrade protobuf): it then needs
``grpcio`` and ``python-rapidjson`` for ``tritonclient.grpc`` to import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_utils.supply.errors import CourseError, MissingBackendError

KINDS = ("KIND_CPU", "KIND_GPU", "KIND_AUTO")
#: numpy/ONNX element type -> Triton data type name
TRITON_DTYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "int64": "TYPE_INT64", "int32": "TYPE_INT32",
                 "int8": "TYPE_INT8", "uint8": "TYPE_UINT8", "bfloat16": "TYPE_BF16"}  # fmt: skip
#: Triton container release used in the docker line; pick one that matches your driver (NGC support matrix).
DEFAULT_TRITON_TAG = "25.10"


class TritonConfigError(CourseError, ValueError):
    """A Triton ``config.pbtxt`` does not parse, or parses but would be rejected or misbehave."""


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as Triton describes it: name, Triton data type, dims without the batch dim."""

    name: str
    data_type: str
    dims: tuple[int, ...]


def _pb2():
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except (ImportError, RuntimeError) as exc:
        raise MissingBackendError(
            "tritonclient's protobuf classes are missing: pip install --no-deps tritonclient grpcio python-rapidjson "
            f"(or make setup) ({exc})"
        ) from None
    return model_config_pb2, text_format


def make_config(
    name: str,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    *,
    max_batch_size: int = 32,
    preferred_batch_sizes: Sequence[int] = (),
    max_queue_delay_us: int = 500,
    instance_count: int = 1,
    kind: str = "KIND_CPU",
    platform: str = "onnxruntime_onnx",
) -> str:
    """The text of a ``config.pbtxt`` with dynamic batching (not validated: see :func:`validate_config`).

    ``dims`` of inputs and outputs exclude the batch dimension (Triton adds it when ``max_batch_size > 0``).
    ``max_queue_delay_us`` is how long Triton may hold a request to form a larger batch; preferred sizes are
    written only when given (most models should not set them).
    """

    def tensor(t: TensorSpec) -> str:
        dims = ", ".join(str(d) for d in t.dims)
        return f'  {{\n    name: "{t.name}"\n    data_type: {t.data_type}\n    dims: [ {dims} ]\n  }}'

    sizes = ", ".join(str(s) for s in preferred_batch_sizes)
    preferred = f"  preferred_batch_size: [ {sizes} ]\n" if preferred_batch_sizes else ""
    ins = ",\n".join(tensor(t) for t in inputs)
    outs = ",\n".join(tensor(t) for t in outputs)
    return (
        f'name: "{name}"\n'
        f'platform: "{platform}"\n'
        f"max_batch_size: {max_batch_size}\n"
        f"input [\n{ins}\n]\n"
        f"output [\n{outs}\n]\n"
        f"dynamic_batching {{\n{preferred}"
        f"  max_queue_delay_microseconds: {max_queue_delay_us}\n}}\n"
        f"instance_group [\n  {{\n    count: {instance_count}\n    kind: {kind}\n  }}\n]\n"
    )


def validate_config(config: str | Path) -> Any:
    """Parse a ``config.pbtxt`` (text or path) with Triton's ``ModelConfig`` and check what the parser does not.

    Returns the parsed ``ModelConfig`` message. Raises :class:`TritonConfigError` for a parse error (a
    misspelled field or a wrong value type: the message names it and the line), a preferred batch size above
    ``max_batch_size`` or below 1, dynamic batching with ``max_batch_size: 0``, a missing input or output, or
    an instance count below 1.
    """
    pb2, text_format = _pb2()
    text = Path(config).read_text() if isinstance(config, Path) else config
    cfg = pb2.ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        raise TritonConfigError(
            f"config.pbtxt does not parse as Triton's ModelConfig: {exc}. Check the field's spelling against "
            "https://github.com/triton-inference-server/common/blob/main/protobuf/model_config.proto"
        ) from None
    problems = []
    if not cfg.name:
        problems.append("'name' is empty (it must match the model's folder name)")
    if cfg.max_batch_size < 0:
        problems.append(f"max_batch_size is {cfg.max_batch_size}; use 0 (no batching) or a positive maximum")
    if cfg.HasField("dynamic_batching"):
        if cfg.max_batch_size == 0:
            problems.append("dynamic_batching needs max_batch_size > 0 (with 0 Triton never batches)")
        for size in cfg.dynamic_batching.preferred_batch_size:
            if size < 1:
                problems.append(f"preferred_batch_size {size} is below 1")
            elif cfg.max_batch_size and size > cfg.max_batch_size:
                problems.append(
                    f"preferred_batch_size {size} exceeds max_batch_size {cfg.max_batch_size} "
                    "(Triton rejects the model at load time); lower it or raise max_batch_size"
                )
    if not cfg.input:
        problems.append("no input declared")
    if not cfg.output:
        problems.append("no output declared")
    for group in cfg.instance_group:
        if group.count < 1:
            problems.append(f"instance_group count {group.count} is below 1")
    if problems:
        raise TritonConfigError("config.pbtxt is invalid: " + "; ".join(problems))
    return cfg


def onnx_io(path: str | Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of an ONNX model as :class:`TensorSpec` (batch dimension dropped)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    init = {i.name for i in m.graph.initializer}

    def spec(v: Any) -> TensorSpec:
        t = v.type.tensor_type
        np_name = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)[1:]
        return TensorSpec(v.name, TRITON_DTYPES.get(np_name, "TYPE_FP32"), dims)

    return [spec(v) for v in m.graph.input if v.name not in init], [spec(v) for v in m.graph.output]


def write_model_repository(
    root: str | Path,
    model: Any,
    example: Any,
    *,
    name: str = "digits_cnn",
    max_batch_size: int = 32,
    preferred_batch_sizes: Sequence[int] = (),
    max_queue_delay_us: int = 500,
    instance_count: int = 1,
    kind: str = "KIND_CPU",
) -> Path:
    """Write ``<root>/<name>/config.pbtxt`` and ``<root>/<name>/1/model.onnx``; return the model folder.

    ``example`` is one batch of inputs for the export.
    The config is validated before anything is written.
    """
    if kind not in KINDS:
        raise TritonConfigError(f"kind must be one of {KINDS}, got {kind!r}")
    folder = Path(root) / name
    from course_utils.techniques.onnx_runtime import export_onnx

    onnx_path = export_onnx(model, example, folder / "1" / "model.onnx", dynamic_batch=True)
    inputs, outputs = onnx_io(onnx_path)
    text = make_config(name, inputs, outputs, max_batch_size=max_batch_size,
                       preferred_batch_sizes=preferred_batch_sizes, max_queue_delay_us=max_queue_delay_us,
                       instance_count=instance_count, kind=kind)  # fmt: skip
    validate_config(text)
    (folder / "config.pbtxt").write_text(text)
    return folder


def docker_run_line(repository: str | Path, *, gpus: bool = True, tag: str = DEFAULT_TRITON_TAG) -> str:
    """The ``docker run`` command that serves ``repository`` with Triton's container (ports on 127.0.0.1 only).

    8000 is HTTP, 8001 gRPC, 8002 Prometheus metrics. Binding to 127.0.0.1 keeps the server off the network.
    """
    gpu = "--gpus all " if gpus else ""
    ports = " ".join(f"-p 127.0.0.1:{p}:{p}" for p in (8000, 8001, 8002))
    return (
        f"docker run --rm {gpu}--shm-size=1g {ports} -v {Path(repository).resolve()}:/models "
        f"nvcr.io/nvidia/tritonserver:{tag}-py3 tritonserver --model-repository=/models"
    )


def perf_analyzer_line(name: str, *, concurrency: tuple[int, int] | None = None, rate: tuple[int, int] | None = None,
                       url: str = "127.0.0.1:8001") -> str:  # fmt: skip
    """The ``perf_analyzer`` command (Triton's SDK container) that sweeps concurrency or a request rate for ``name``.

    It reports throughput and p50/p90/p95/p99 latency with the server-side queue and compute times; with
    ``--request-rate-range`` and ``--request-distribution=poisson`` the load is open-loop.
    """
    if (concurrency is None) == (rate is None):
        raise TritonConfigError("give exactly one of concurrency=(lo, hi) or rate=(lo, hi)")
    base = f"perf_analyzer -m {name} -u {url} -i grpc --percentile=99 --measurement-interval 5000"
    if concurrency is not None:
        lo, hi = concurrency
        return f"{base} --concurrency-range {lo}:{hi}:{lo if lo > 1 else 2}"
    lo, hi = rate
    return f"{base} --request-rate-range {lo}:{hi}:{max(1, (hi - lo) // 4)} --request-distribution=poisson"
