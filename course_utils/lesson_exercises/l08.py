"""Lesson 08 exercises: an optimization profile from observed traffic, and when an engine must be rebuilt."""

from __future__ import annotations

from collections.abc import Callable

from ..exercises import exercise


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
    """The contract suite's fake TensorRT 11.1 (tests/gpu_contract/fake_trt.py of the course checkout)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tests" / "gpu_contract" / "fake_trt.py"
    if not path.exists():
        raise AssertionError(f"this self-check needs the course checkout's {path.name} (not found at {path})")
    if "course_fake_trt" not in sys.modules:
        spec = importlib.util.spec_from_file_location("course_fake_trt", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["course_fake_trt"] = module
        spec.loader.exec_module(module)
    return sys.modules["course_fake_trt"].fake_from_snapshot()


def _two_io_onnx(path) -> None:
    """An ONNX model with inputs a, b (N x 4, float32) and outputs sum (float32), scaled (float16)."""
    import onnx
    from onnx import TensorProto, helper

    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 4])
    out_sum = helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["N", 4])
    out_scaled = helper.make_tensor_value_info("scaled", TensorProto.FLOAT16, ["N", 4])
    nodes = [helper.make_node("Add", ["a", "b"], ["sum"], name="add"),
             helper.make_node("Mul", ["a", "b"], ["prod"], name="mul"),
             helper.make_node("Cast", ["prod"], ["scaled"], name="cast", to=TensorProto.FLOAT16)]  # fmt: skip
    graph = helper.make_graph(nodes, "two_io", [a, b], [out_sum, out_scaled])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


class _Stream:
    """A stand-in for torch.cuda.Stream on the CPU: its handle is an int, wait_stream orders nothing here."""

    cuda_stream = 0x5EED

    def wait_stream(self, other) -> None:
        pass


def _check_runner(fn: Callable) -> None:
    import tempfile
    from pathlib import Path

    import torch

    trt = _fake_trt()
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "two_io.onnx"
        _two_io_onnx(onnx_path)
        builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
        network = builder.create_network(0)
        assert trt.OnnxParser(network, trt.Logger()).parse_from_file(str(onnx_path))
        config = builder.create_builder_config()
        profile = builder.create_optimization_profile()
        for name in ("a", "b"):
            profile.set_shape(name, (1, 4), (4, 4), (8, 4))
        config.add_optimization_profile(profile)
        engine = trt.Runtime(trt.Logger()).deserialize_cuda_engine(builder.build_serialized_network(network, config))
        context = engine.create_execution_context()
        torch.manual_seed(0)
        feeds = {"a": torch.randn(3, 4), "b": torch.randn(3, 4)}
        try:
            out = fn(trt, engine, context, feeds, _Stream())
        except NotImplementedError:
            raise
        except (AttributeError, TypeError) as exc:
            raise AssertionError(f"TensorRT 11.1 does not accept that: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - any crash of the learner's loop is a wrong answer
            raise AssertionError(f"your loop raised {type(exc).__name__}: {exc}") from exc
    shapes = trt.called("IExecutionContext.set_input_shape")
    assert sorted(a[0] for a in shapes) == ["a", "b"], "call context.set_input_shape(name, shape) for every input"
    runs = trt.called("IExecutionContext.execute_async_v3")
    assert len(runs) == 1, f"call context.execute_async_v3 exactly once (called {len(runs)} times)"
    assert runs[0][0] == _Stream.cuda_stream, "execute on the stream you were given: stream.cuda_stream"
    addressed = sorted(a[0] for a in trt.called("IExecutionContext.set_tensor_address"))
    assert addressed == ["a", "b", "scaled", "sum"], f"every input and output needs an address, got {addressed}"
    assert isinstance(out, dict) and sorted(out) == ["scaled", "sum"], "return {output name: tensor} for each output"
    assert out["scaled"].dtype == torch.float16, "allocate each output with the engine's dtype (scaled is HALF)"
    assert tuple(out["sum"].shape) == (3, 4), "allocate each output with context.get_tensor_shape(name)"
    torch.testing.assert_close(out["sum"], feeds["a"] + feeds["b"], msg="sum differs: were the addresses right?")
    torch.testing.assert_close(out["scaled"].float(), (feeds["a"] * feeds["b"]).half().float(),
                               msg="scaled differs: were the addresses right?")  # fmt: skip


@exercise(
    "08.runner",
    "run_engine(trt, engine, context, feeds, stream): for each input name in feeds, context.set_input_shape and "
    "context.set_tensor_address(name, tensor.data_ptr()); for each output (engine.get_tensor_mode(name) is "
    "OUTPUT), a torch.empty of context.get_tensor_shape(name) and the engine's dtype, its address set; then "
    "context.execute_async_v3(stream.cuda_stream); return {output name: tensor}.",
    _check_runner,
)
def run_engine(trt, engine, context, feeds, stream):
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
    if not context.execute_async_v3(stream.cuda_stream):
        raise RuntimeError("execute_async_v3 failed")
    return outputs
