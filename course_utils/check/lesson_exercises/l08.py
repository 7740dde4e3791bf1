"""Lesson 08 exercises: an optimization profile from observed traffic, when an engine must be rebuilt, and the
runner's I/O loop (08.builder, the build itself, is in ``l08_builder.py``)."""

from __future__ import annotations

from collections.abc import Callable

from course_utils.check.exercises import exercise


def _check_profile(fn: Callable[[list[int]], tuple[int, int, int]]) -> None:
    assert fn([1, 4, 4, 8, 4, 2]) == (1, 4, 8), "min 1, max 8, opt = the most frequent batch (4)"
    assert fn([16]) == (16, 16, 16), "one size seen: min = opt = max"
    assert fn([2, 2, 8, 8, 3]) == (2, 2, 8), "on a tie for most frequent, take the smaller batch"
    try:
        fn([])
    except ValueError:
        pass
    else:
        raise AssertionError("no traffic observed: raise ValueError")


@exercise(
    "08.profile",
    "profile_from_traffic(batches): (min, opt, max) batch for a TensorRT profile; opt is the most frequent "
    "batch (smallest on ties); ValueError on an empty list.",
    _check_profile,
)
def profile_from_traffic(batches: list[int]) -> tuple[int, int, int]:
    if not batches:
        raise ValueError("no batch sizes observed")
    counts = {b: batches.count(b) for b in set(batches)}
    opt = min(counts, key=lambda b: (-counts[b], b))
    return min(batches), opt, max(batches)


FIELDS = ("gpu_name", "compute_capability", "trt_version", "precision", "profile", "onnx_sha256", "build")


def _check_rebuild(fn: Callable[[dict | None, dict], list[str]]) -> None:
    here = {"gpu_name": "NVIDIA L4", "compute_capability": "8.9", "trt_version": "11.1.0", "precision": "fp16",
            "profile": {"min": [1], "opt": [8], "max": [32]}, "onnx_sha256": "ab", "built": "2026-11-01",
            "build": {"workspace_bytes": 1 << 30, "tf32": True, "opt_level": 3}}  # fmt: skip
    assert fn(dict(here), here) == [], "identical metadata: nothing to rebuild for"
    assert fn({**here, "built": "yesterday"}, here) == [], "the build date does not make an engine stale"
    assert fn({**here, "trt_version": "10.13.0"}, here) == ["trt_version"], "another TensorRT version: stale"
    got = fn({**here, "gpu_name": "NVIDIA H200", "compute_capability": "9.0"}, here)
    assert got == ["gpu_name", "compute_capability"], "return the differing fields in FIELDS order"
    assert fn({**here, "build": {**here["build"], "tf32": False}}, here) == ["build"], (
        "the same ONNX file built with TF32 off is another engine: the build settings count"
    )
    assert fn(None, here) == list(FIELDS), "no stored metadata: every field is unknown, all stale"


@exercise(
    "08.stale",
    "stale_fields(stored, here): the names in FIELDS (gpu_name, compute_capability, trt_version, precision, "
    "profile, onnx_sha256, build) whose values differ, in that order; all of them if stored is None.",
    _check_rebuild,
)
def stale_fields(stored: dict | None, here: dict) -> list[str]:
    if stored is None:
        return list(FIELDS)
    return [f for f in FIELDS if stored.get(f) != here.get(f)]


# ------------------------------------------------------------------------------ 08.runner: the I/O loop


def _fake_trt():
    """The fake TensorRT 11.1 (``course_utils.check.standins.tensorrt``): the real API surface, ORT behind it."""
    from course_utils.check.standins.tensorrt import fake_from_snapshot

    return fake_from_snapshot()


def _two_io_onnx(path, k: float, width: int) -> None:
    """An ONNX model with inputs a, b (N x width, float32) and outputs sum = a*k + b (float32), scaled = a*b (float16).

    ``k`` is drawn per check: an answer computed in torch instead of read from the engine's buffers must know it.
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", width])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", width])
    out_sum = helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["N", width])
    out_scaled = helper.make_tensor_value_info("scaled", TensorProto.FLOAT16, ["N", width])
    kk = numpy_helper.from_array(np.array([k], dtype=np.float32), "k")
    nodes = [helper.make_node("Mul", ["a", "k"], ["ak"], name="scale"),
             helper.make_node("Add", ["ak", "b"], ["sum"], name="add"),
             helper.make_node("Mul", ["a", "b"], ["prod"], name="mul"),
             helper.make_node("Cast", ["prod"], ["scaled"], name="cast", to=TensorProto.FLOAT16)]  # fmt: skip
    graph = helper.make_graph(nodes, "two_io", [a, b], [out_sum, out_scaled], initializer=[kk])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


class OrderStream:
    """A CUDA stream's stand-in on the CPU: a non-zero handle; logs ``wait_stream`` calls in the fake's call order."""

    def __init__(self, trt, handle: int, name: str) -> None:
        self.trt, self.cuda_stream, self.name = trt, handle, name
        self.waits: list[tuple[int, str]] = []  # (index in trt.calls when it happened, the stream waited on)

    def wait_stream(self, other) -> None:
        self.waits.append((len(self.trt.calls), getattr(other, "name", type(other).__name__)))


def _engine(trt, onnx_path, bounds: dict[str, tuple[int, int, int]], width: int):
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network = builder.create_network(0)
    assert trt.OnnxParser(network, trt.Logger()).parse_from_file(str(onnx_path))
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in bounds.items():
        profile.set_shape(name, (lo, width), (opt, width), (hi, width))
    config.add_optimization_profile(profile)
    return trt.Runtime(trt.Logger()).deserialize_cuda_engine(builder.build_serialized_network(network, config))


def _check_runner(fn: Callable) -> None:
    import tempfile
    from pathlib import Path

    import torch

    from course_utils.check.lesson_exercises.observe import cases

    with cases("08.runner") as c, tempfile.TemporaryDirectory() as tmp:
        trt = _fake_trt()
        k, width, batch = round(c.rng.uniform(1.5, 4.0), 3), c.randint(3, 9), c.randint(1, 8)
        onnx_path = Path(tmp) / "two_io.onnx"
        _two_io_onnx(onnx_path, k, width)
        engine = _engine(trt, onnx_path, {"a": (1, 4, 8), "b": (1, 4, 8)}, width)
        context = engine.create_execution_context()
        feeds = {"a": c.randn(batch, width), "b": c.randn(batch, width)}
        stream, producer = OrderStream(trt, 0x5EED, "stream"), OrderStream(trt, 0x7EA, "producer")
        try:
            out = fn(trt, engine, context, dict(feeds), stream, producer)
        except NotImplementedError:
            raise
        except (AttributeError, TypeError) as exc:
            raise AssertionError(f"TensorRT 11.1 does not accept that: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - any crash of the learner's loop is a wrong answer
            raise AssertionError(f"your loop raised {type(exc).__name__}: {exc}") from exc
        calls = [w for w, _ in trt.calls]
        runs = [i for i, w in enumerate(calls) if w == "IExecutionContext.execute_async_v3"]
        assert len(runs) == 1, f"call context.execute_async_v3 exactly once (called {len(runs)} times)"
        assert trt.called("IExecutionContext.execute_async_v3")[0][0] == stream.cuda_stream, (
            "execute on the stream you were given: context.execute_async_v3(stream.cuda_stream)"
        )
        shapes = trt.called("IExecutionContext.set_input_shape")
        assert sorted(a[0] for a in shapes) == ["a", "b"], "call context.set_input_shape(name, shape) for every input"
        addressed = sorted(a[0] for a in trt.called("IExecutionContext.set_tensor_address"))
        assert addressed == ["a", "b", "scaled", "sum"], f"every input and output needs an address, got {addressed}"
        before = [i for i, other in stream.waits if other == "producer" and i <= runs[0]]
        assert before, (
            "TensorRT's stream never waited for the stream that wrote the inputs: call stream.wait_stream(producer) "
            "before execute_async_v3 (else TensorRT may read inputs that are not written yet)"
        )
        after = [i for i, other in producer.waits if other == "stream" and i > runs[0]]
        assert after, (
            "the producer stream never waited for TensorRT's stream: call producer.wait_stream(stream) after "
            "execute_async_v3 (else later torch work may read outputs TensorRT has not written yet)"
        )
        assert isinstance(out, dict) and sorted(out) == ["scaled", "sum"], (
            "return {output name: tensor} for each output"
        )
        for name in ("a", "b"):
            assert context.get_tensor_address(name) == feeds[name].data_ptr(), (
                f"the context you were given has no address for input '{name}' (or another one): run the engine and "
                "context passed in, with the feeds' own buffers (no engine of your own, no copies)"
            )
        for name in ("sum", "scaled"):
            where, mine = context.get_tensor_address(name), out[name]
            assert isinstance(mine, torch.Tensor) and mine.data_ptr() == where, (
                f"output '{name}' is not the buffer whose address you gave TensorRT: return the tensors the engine "
                "wrote (allocated before execute_async_v3, addressed with set_tensor_address), not a recomputation"
            )
        assert out["scaled"].dtype == torch.float16, "allocate each output with the engine's dtype (scaled is HALF)"
        assert tuple(out["sum"].shape) == (batch, width), "allocate each output with context.get_tensor_shape(name)"
        torch.testing.assert_close(
            out["sum"], feeds["a"] * k + feeds["b"], msg="sum differs: were the addresses right?"
        )
        torch.testing.assert_close(out["scaled"].float(), (feeds["a"] * feeds["b"]).half().float(),
                                   msg="scaled differs: were the addresses right?")  # fmt: skip


@exercise(
    "08.runner",
    "run_engine(trt, engine, context, feeds, stream, producer): for each input in feeds, context.set_input_shape "
    "and context.set_tensor_address(name, tensor.data_ptr()); for each output (engine.get_tensor_mode is OUTPUT), "
    "a torch.empty of context.get_tensor_shape(name) and the engine's dtype, its address set; "
    "stream.wait_stream(producer); context.execute_async_v3(stream.cuda_stream); producer.wait_stream(stream); "
    "return {output name: tensor}.",
    _check_runner,
)
def run_engine(trt, engine, context, feeds, stream, producer):
    import torch

    dtypes = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT32": torch.int32,
              "INT64": torch.int64, "INT8": torch.int8, "BOOL": torch.bool}  # fmt: skip
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    outputs, inputs = {}, {}
    for name in names:
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            inputs[name] = feeds[name].contiguous()  # kept referenced until the stream has run
            context.set_input_shape(name, tuple(inputs[name].shape))
            context.set_tensor_address(name, inputs[name].data_ptr())
    for name in names:
        if engine.get_tensor_mode(name) == trt.TensorIOMode.OUTPUT:
            dtype = dtypes[engine.get_tensor_dtype(name).name]
            device = next(iter(feeds.values())).device
            outputs[name] = torch.empty(tuple(context.get_tensor_shape(name)), dtype=dtype, device=device)
            context.set_tensor_address(name, outputs[name].data_ptr())
    stream.wait_stream(producer)  # the inputs are written before TensorRT reads them
    if not context.execute_async_v3(stream.cuda_stream):
        raise RuntimeError("execute_async_v3 failed")
    producer.wait_stream(stream)  # later work on the producer stream waits for the outputs
    return outputs
