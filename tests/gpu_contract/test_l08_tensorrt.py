"""Lesson 08's TensorRT code (and lesson 14's engine step) run against TensorRT 11.1's real API, on the CPU.

The builder, cache and runner a learner reads in ``lessons/08_tensorrt.py`` (its cells tagged ``contract``)
are executed here with a fake ``tensorrt`` module generated from the real bindings (``standins.tensorrt``,
``trt_api``): only names, argument counts, argument types and enum members that exist in TensorRT 11.1
pass; the fake's engine runs the ONNX model with ONNX Runtime, reading and writing the CPU torch tensors
whose addresses the runner set. ``test_planted_api_breaks_fail`` proves the suite catches the classic
TensorRT 8/10 mistakes by planting each into the lesson's code.
"""

from __future__ import annotations

import sys

import pytest
import torch

from course_utils.measuring.outputs import compare_outputs
from course_utils.techniques import onnx_runtime
from course_utils.techniques import tensorrt_engines as eng
from fakegpu.standins.tensorrt import FakeTRT

from . import lesson_code, trt_api

COVERS = {
    "08.build": "build_engine and load_or_build (parse, workspace, TF32, opt level, timing cache, profile, "
    "cache hit / rebuild on changed settings) against the fake from TensorRT 11.1's bindings",
    "08.fusion": "engine_layers: create_engine_inspector + get_engine_information(LayerInformationFormat.JSON)",
    "08.run": "TrtRunner: tensor names/modes/dtypes, set_input_shape, set_tensor_address, execute_async_v3 on a "
    "non-default stream handle; outputs checked against the PyTorch model (fp32 tolerance)",
    "08.profile-error": "a batch above the profile's max: set_input_shape returns False, BadInputError names the fix",
    "08.resnet50": "the same build/cache/runner functions with a larger workspace and batch profile",
    "14.optimize-tensorrt": "optimize()'s engine step (lesson 08's exported build_engine, Runtime, TrtRunner) incl. "
    "batches above the profile's max (chunked)",
}
NOT_TESTABLE = {
    "08.torch-tensorrt": "torch_tensorrt.compile needs CUDA and the torch-tensorrt package (no CPU path, no "
    "bindings wheel without libraries); unverified until run on a GPU",
}

# Classic mistakes from TensorRT 8-era tutorials: (label, shipped code, planted code). Each must break the suite.
PLANTS = [
    (
        "config.max_workspace_size = n",
        "config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)",
        "config.max_workspace_size = workspace_bytes",
    ),
    ("trt.BuilderFlag.FP16", "config.set_flag(trt.BuilderFlag.TF32)", "config.set_flag(trt.BuilderFlag.FP16)"),
    (
        "context.execute_async_v2(...)",
        "self.context.execute_async_v3(self.stream.cuda_stream)",
        "self.context.execute_async_v2([x.data_ptr()], self.stream.cuda_stream)",
    ),
    (
        "engine.get_binding_shape(0)",
        "tuple(self.context.get_tensor_shape(n))",
        "tuple(self.engine.get_binding_shape(0))",
    ),
    (
        "builder.build_engine(...)",
        "builder.build_serialized_network(network, config)",
        "builder.build_engine(network, config)",
    ),
    ("parse_from_file(Path)", "parser.parse_from_file(str(onnx_path))", "parser.parse_from_file(onnx_path)"),
    ("wrong argument count", "engine.get_tensor_mode(n)", "engine.get_tensor_mode(n, 0)"),
    (
        "enum property set from a str",
        "config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, hardware_compat)",
        "config.hardware_compatibility_level = hardware_compat",
    ),
    (
        "output address of the input",
        "self.context.set_tensor_address(n, outs[n].data_ptr())",
        "self.context.set_tensor_address(n, x.data_ptr())",
    ),
]


class CpuStream:
    """A CUDA stream's stand-in: ``cuda_stream`` is an int handle (never 0, the default stream)."""

    cuda_stream = 0x5EED

    def wait_stream(self, other) -> None:
        pass


@pytest.fixture(scope="module")
def spec():
    s, source = trt_api.api_spec()
    print(f"TensorRT API from: {source}")
    return s


@pytest.fixture()
def fake(spec):
    return FakeTRT(spec)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from course_utils.supply.models import load_digits_model

    model = load_digits_model("cnn")
    path = onnx_runtime.export_onnx(model, torch.zeros(2, 1, 8, 8), tmp_path_factory.mktemp("onnx") / "digits.onnx")
    return model, path


def scenario(ns, trt, model, onnx_path, tmp) -> None:
    """What the lesson does on a GPU, on the fake: build, cache, inspect, run, check parity, leave the profile."""
    profile = eng.Profile.for_batch("input", (1, 8, 8), 1, 4, 8)
    plan = ns["build_engine"](trt, onnx_path, profile, tf32=False, opt_level=1, timing_cache=tmp / "timing.cache")
    assert isinstance(plan, bytes) and plan and (tmp / "timing.cache").exists()
    assert [a[0] for a in trt.called("IBuilderConfig.clear_flag")] == [trt.BuilderFlag.TF32], "true FP32: TF32 off"
    assert isinstance(ns["build_engine"](trt, onnx_path, profile), bytes)  # TensorRT's default: TF32 on
    assert [a[0] for a in trt.called("IBuilderConfig.set_flag")] == [trt.BuilderFlag.TF32]
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    platform = {"gpu_name": "fake GPU", "compute_capability": (9, 0), "trt_version": trt.__version__}
    args = (trt, runtime, onnx_path, profile, tmp / "engines", platform, "fp32")
    engine, info = ns["load_or_build"](*args, tf32=False)
    assert info["built"] and info["why"] == "no cached engine"
    assert ns["load_or_build"](*args, tf32=False)[1]["why"] == "cache hit"
    rebuilt = ns["load_or_build"](*args, tf32=False, opt_level=5, hardware_compat="AMPERE_PLUS")[1]
    assert rebuilt["built"] and rebuilt["key"] != info["key"], "another optimization level is another engine"
    layers = ns["engine_layers"](trt, engine)
    assert 0 < len(layers) < sum(onnx_runtime.count_nodes(onnx_path).values()), layers
    runner = ns["TrtRunner"](trt, engine, CpuStream())
    for b in (1, 4, 8):
        x = torch.rand(b, 1, 8, 8)
        with torch.inference_mode():
            ref = model(x)
        cmp = compare_outputs(runner(x).clone(), ref, "fp32")
        assert cmp.within, f"batch {b}: {cmp}"
    handles = [a[0] for a in trt.called("IExecutionContext.execute_async_v3")]
    assert handles and all(h == CpuStream.cuda_stream for h in handles), "run on the runner's own stream"
    with pytest.raises(onnx_runtime.BadInputError, match="outside the engine's profile"):
        runner(torch.rand(9, 1, 8, 8))
    with pytest.raises(onnx_runtime.BadInputError, match="float16"):
        runner(torch.rand(2, 1, 8, 8).half())


def test_lesson_builder_cache_runner(fake, digits, tmp_path):
    model, onnx_path = digits
    ns = lesson_code.lesson_namespace("08")
    scenario(ns, fake, model, onnx_path, tmp_path)
    assert not fake.unknown_types, f"types the fake could not check: {fake.unknown_types}"


@pytest.mark.parametrize("label, shipped, planted", PLANTS, ids=[p[0] for p in PLANTS])
def test_planted_api_breaks_fail(label, shipped, planted, fake, digits, tmp_path):
    model, onnx_path = digits
    source = "\n".join(lesson_code.tagged_cells("08"))
    assert source.count(shipped) == 1, f"the lesson's code changed: '{shipped}' should occur once"
    ns = {"__name__": "planted"}
    exec(compile(source.replace(shipped, planted), "lessons/08_tensorrt.py (planted)", "exec"), ns)  # noqa: S102
    with pytest.raises((AttributeError, TypeError, AssertionError, RuntimeError, onnx_runtime.CourseError)) as err:
        scenario(ns, fake, model, onnx_path, tmp_path)
    print(f"planted {label}: {type(err.value).__name__}: {str(err.value).splitlines()[0][:200]}")


def test_fake_refuses_what_tensorrt_11_removed(fake):
    config = fake.Builder(fake.Logger()).create_builder_config()
    for bad in (
        lambda: fake.BuilderFlag.FP16,
        lambda: fake.BuilderFlag.INT8,
        lambda: fake.IInt8EntropyCalibrator2,
        lambda: setattr(config, "max_workspace_size", 1 << 30),
        lambda: config.int8_calibrator,
    ):
        with pytest.raises(AttributeError, match="TensorRT 11.1"):
            bad()
    with pytest.raises(TypeError, match="incompatible function arguments"):
        config.set_memory_pool_limit(1 << 30)  # the pool type is missing
    with pytest.raises(TypeError):
        config.set_flag(fake.MemoryPoolType.WORKSPACE)  # a member of another enum
    with pytest.raises(AttributeError, match="read-only"):
        config.num_optimization_profiles = 2
    assert fake.BuilderFlag.TF32 == fake.BuilderFlag.TF32 and int(fake.BuilderFlag.TF32) >= 0


def test_optimize_engine_step_runs_against_the_fake(fake, monkeypatch):
    """Lesson 14's ``optimize()`` TensorRT step: export, lesson 08's exported build_engine, Runtime, TrtRunner.

    Its accuracy probe calls the variant on more rows than the profile's maximum batch: the runner must cover
    every batch it is asked to run (issue 13).
    """
    from course_utils.capstone import optimize
    from course_utils.sections import gpu_sections
    from course_utils.supply.data import load_digits_split
    from course_utils.supply.models import load_digits_model

    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(gpu_sections, "gpu_section", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "Stream", CpuStream)
    model = load_digits_model("cnn")
    example = torch.rand(4, 1, 8, 8)
    (variant,) = optimize._tensorrt(model, example, torch.device("cpu"), 8)
    assert variant.precision == "fp16"
    images = load_digits_split().x_test  # real digits: random noise gives near-tied logits, and FP16 flips ties
    for n in (1, 4, 8, 30):  # 30 > the profile's max of 8: run in chunks
        x = images[:n]
        with torch.inference_mode():
            ref = model(x)
        cmp = compare_outputs(variant.run(x), ref, "fp16")
        assert cmp.within, f"batch {n}: {cmp}"
    assert fake.called("IExecutionContext.execute_async_v3")


def test_optimize_runs_the_code_lesson_08_shows():
    """course_utils/from_lessons/l08_tensorrt.py (what optimize() imports) is the lesson's exported cells, as loaded."""
    import inspect

    from course_utils.from_lessons import l08_tensorrt
    from scripts import nbcheck

    lesson = nbcheck.ROOT / "lessons" / "08_tensorrt.py"
    assert inspect.getsource(l08_tensorrt) == nbcheck.exported_source(lesson), "run `make notebooks`"


def test_exported_runner_refuses_below_profile_min(fake, digits, monkeypatch):
    """optimize() runs lesson 08's exported builder and runner: a batch outside the profile names the profile."""
    from course_utils.from_lessons import l08_tensorrt

    model, onnx_path = digits
    profile = eng.Profile.for_batch("input", (1, 8, 8), 2, 4, 8)
    engine = fake.Runtime(fake.Logger()).deserialize_cuda_engine(l08_tensorrt.build_engine(fake, onnx_path, profile))
    runner = l08_tensorrt.TrtRunner(fake, engine, CpuStream())
    outside = r"outside the engine's profile .*\(2, 1, 8, 8\) to \(8, 1, 8, 8\)"
    with pytest.raises(onnx_runtime.BadInputError, match=outside):
        runner(torch.rand(1, 1, 8, 8))
    x = torch.rand(8, 1, 8, 8)
    with torch.inference_mode():
        assert compare_outputs(runner(x), model(x), "fp32").within


def test_snapshot_matches_the_live_bindings():
    """``trt_11_1_api.json`` (used where the wheel cannot be had, and by exercise 08.runner) is current."""
    import json

    try:
        live = trt_api.introspect(trt_api.load_bindings())
    except trt_api.Unavailable as exc:
        pytest.skip(f"live TensorRT bindings unavailable here: {exc}")
    snapshot = json.loads(trt_api.SNAPSHOT.read_text())
    assert live == snapshot, "regenerate the snapshot: python -m tests.gpu_contract.trt_api"
    assert live["version"].startswith("11.1")
    ctx = live["classes"]["IExecutionContext"]["methods"]
    assert ctx["execute_async_v3"][0]["params"] == [["stream_handle", "typing.SupportsInt", False]]
    assert "execute_async_v2" not in ctx and "FP16" not in live["enums"]["BuilderFlag"]


def test_signature_parser_handles_overloads_and_brackets():
    doc = (
        "set_input_shape(*args, **kwargs)\nOverloaded function.\n\n"
        "1. set_input_shape(self: tensorrt_bindings.tensorrt.IExecutionContext, name: str, shape: tuple) -> bool\n"
        "2. f(self: X, a: dict[str, int], b: Y = <Severity.WARNING: 2>) -> list[int]\n"
    )
    sigs = trt_api.parse_signatures(doc)
    assert sigs[0] == {"params": [["name", "str", False], ["shape", "tuple", False]], "returns": "bool"}
    assert sigs[1]["params"] == [["a", "dict[str, int]", False], ["b", "Y", True]]


STREAM_PLANTS = [
    ("no wait before execute", "self.stream.wait_stream(dev.current_stream())", "pass"),
    ("no wait after execute", "dev.current_stream().wait_stream(self.stream)", "pass"),
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the rehearsal stands in for a missing GPU")
@pytest.mark.parametrize("planted", [None, *STREAM_PLANTS], ids=lambda p: "shipped" if p is None else p[0])
def test_runner_on_the_rehearsal_gpu_checks_pointers_and_stream_order(planted, spec, digits):
    """The lesson's TrtRunner on the rehearsal's stand-in GPU: CUDA tensors' pointers, a real (stand-in) stream;
    each of its two wait_stream calls removed makes the stream-order check fail; a host tensor is refused."""
    from fakegpu.standins import rehearsal

    model, onnx_path = digits
    source = "\n".join(lesson_code.tagged_cells("08"))
    if planted:
        assert source.count(planted[1]) == 1, f"the lesson's code changed: '{planted[1]}' should occur once"
        source = source.replace(planted[1], planted[2])
    ns = {"__name__": "rehearsed"}
    exec(compile(source, "lessons/08_tensorrt.py", "exec"), ns)  # noqa: S102
    trt = FakeTRT(spec, device_pointers=True)
    rehearsal.activate()
    try:
        profile = eng.Profile.for_batch("input", (1, 8, 8), 1, 4, 8)
        engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(
            ns["build_engine"](trt, onnx_path, profile, tf32=False)
        )
        runner = ns["TrtRunner"](trt, engine, torch.cuda.Stream())
        x = torch.rand(4, 1, 8, 8)
        with torch.inference_mode():
            ref = model(x)
            if planted is None:
                assert compare_outputs(runner(x.cuda()).clone().cpu(), ref, "fp32").within
                with pytest.raises(RuntimeError, match="not .* live CUDA memory"):
                    runner(x)  # a host tensor's pointer given to TensorRT
                assert rehearsal.checks()["TensorRT pointer checks"] >= 2
            else:
                with pytest.raises(rehearsal.RehearsalError, match="stream order") as err:
                    runner(x.cuda()).clone()
                print(f"planted {planted[0]}: {str(err.value)[:200]}")
    finally:
        rehearsal.deactivate()
