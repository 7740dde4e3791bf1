"""Lesson 08 exercise 08.builder: the TensorRT 11 build itself, checked against the fake built from 11.1's bindings."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from course_checks.exercises import exercise, observed
from course_checks.lesson_exercises.l08 import OrderStream, fake_trt, run_engine, two_io_onnx


def draw_build_case(c: Any) -> tuple[float, int, dict[str, tuple[int, int, int]], int]:
    """The model's constant and width, each input's (min, opt, max) batch (strictly increasing; the two inputs'
    bounds differ, so one input's profile given to both is seen) and the workspace limit."""
    k, width = round(c.rng.uniform(1.5, 4.0), 3), c.randint(3, 9)
    bounds: dict[str, tuple[int, int, int]] = {}
    while len(set(bounds.values())) < 2:
        for name in ("a", "b"):
            lo, hi = c.randint(1, 4), c.randint(16, 64)
            bounds[name] = (lo, c.randint(lo + 1, hi - 1), hi)
    return k, width, bounds, (1 << c.randint(20, 30)) * c.randint(1, 3)


def _check_builder(fn: Callable) -> None:
    import tempfile
    from pathlib import Path

    import torch

    from course_checks.lesson_exercises.observe import cases
    from fakegpu.standins.tensorrt import PLAN_MAGIC

    with cases("08.builder") as c, tempfile.TemporaryDirectory() as tmp:
        seen = []
        for true_fp32 in c.rng.sample([True, False], 2):
            trt = fake_trt()
            builds = _watch_builds(trt)
            k, width, bounds, workspace = draw_build_case(c)
            onnx_path = Path(tmp) / f"model_{c.randint(0, 10**6)}.onnx"
            two_io_onnx(onnx_path, k, width)
            shapes = {n: tuple((d, width) for d in b) for n, b in bounds.items()}
            try:
                plan = fn(trt, str(onnx_path), shapes, workspace, true_fp32)
            except NotImplementedError:
                raise
            except (AttributeError, TypeError) as exc:
                raise AssertionError(f"TensorRT 11.1 does not accept that: {exc}") from exc
            except Exception as exc:  # noqa: BLE001 - any crash of the learner's build is a wrong answer
                raise AssertionError(f"your build raised {type(exc).__name__}: {exc}") from exc
            case = f"(true_fp32={true_fp32}, shapes={shapes}, workspace={workspace})"
            assert plan is not None, (
                f"the build returned None {case}: parse the ONNX file (OnnxParser.parse_from_file) and give every "
                "dynamic input a profile shape"
            )
            try:
                blob = bytes(plan)
            except TypeError:
                raise AssertionError(
                    f"return the serialized plan (bytes of build_serialized_network), not {type(plan).__name__}"
                ) from None
            assert blob.startswith(PLAN_MAGIC), "return the serialized plan from builder.build_serialized_network"
            import json

            info = json.loads(blob[len(PLAN_MAGIC) :])
            # the network's model is the given file's (parse_from_file(path), or parse(bytes) of that file)
            assert base64.b64decode(info["onnx_b64"]) == onnx_path.read_bytes(), (
                f"the plan was built from {info['onnx']}, not from the file you were given ({onnx_path.name})"
            )
            assert len(info["profiles"]) == 1, f"add exactly one optimization profile, found {len(info['profiles'])}"
            prof = info["profiles"][0]
            for name, (lo, opt, hi) in bounds.items():
                want = [[lo, width], [opt, width], [hi, width]]
                got = prof.get(name)
                assert got is not None, (
                    f"input '{name}' has no shapes in the profile: profile.set_shape for every input"
                )
                assert [list(s) for s in got] == want, (
                    f"input '{name}': profile shapes {got}, expected (min, opt, max) = {want} {case}"
                )
            limit = info["pools"].get("WORKSPACE")
            # (where two units give the same number, the binary one: TensorRT's own docs quote MiB and GiB)
            units = {workspace // 10**6: "MB", workspace >> 20: "MiB", workspace // 10**9: "GB", workspace >> 30: "GiB"}
            assert limit == workspace, (
                f"workspace limit {limit}, expected {workspace}: "
                + (f"that is the limit in {units[limit]}; " if limit in units and limit != workspace else "")
                + "config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes) takes bytes"
            )
            made = [b for b in builds if b["plan"] == blob]
            assert made, "return the plan that builder.build_serialized_network returned (bytes of it), unchanged"
            tf32_on = made[-1]["tf32"]  # the config the engine was built with, read when the build ran
            if true_fp32:
                assert not tf32_on, (
                    "true FP32 asked, but the engine was built with TF32 on (TensorRT 11's default): clear it on the "
                    "config you pass to build_serialized_network, before the build "
                    "(config.clear_flag(trt.BuilderFlag.TF32))"
                )
            else:
                assert tf32_on, "true_fp32=False: leave TF32 on (TensorRT's default); the engine was built without it"
            seen.append(f"true_fp32={true_fp32}: TF32 {'on' if tf32_on else 'off'} in the build's config")
            engine = trt.Runtime(trt.Logger()).deserialize_cuda_engine(blob)
            b = c.randint(max(bounds["a"][0], bounds["b"][0]), min(bounds["a"][2], bounds["b"][2]))
            feeds = {"a": c.randn(b, width), "b": c.randn(b, width)}
            s1, s2 = OrderStream(trt, 0x5EED, "stream"), OrderStream(trt, 0x7EA, "producer")
            out = run_engine(trt, engine, engine.create_execution_context(), feeds, s1, s2)
            torch.testing.assert_close(out["sum"], feeds["a"] * k + feeds["b"], msg="the engine computes another model")
            seen[-1] += f", workspace {workspace} B, one profile {[list(map(list, v)) for v in prof.values()]}"
    observed("two plans read back (built from the given file, engine run): " + "; ".join(seen))


def _watch_builds(trt: Any) -> list[dict[str, Any]]:
    """Record, when each build runs, whether TF32 is on in the config it is given, and the plan it returns: what
    the engine was built with (a config changed after the build, or another config, does not count)."""
    build = trt.behavior["Builder.build_serialized_network"]
    builds: list[dict[str, Any]] = []

    def watched(builder: Any, **bound: Any) -> Any:
        state = bound["config"].__dict__["_state"]  # the fake config's flags (its get_flag misreads a config with
        # another flag set: TF32 is on unless cleared, as in TensorRT 11)
        tf32 = "TF32" in state.get("flags_set", set()) or "TF32" not in state.get("flags_cleared", set())
        plan = build(builder, **bound)
        builds.append({"tf32": tf32, "plan": bytes(plan) if plan is not None else None})
        return plan

    trt.behavior["Builder.build_serialized_network"] = watched
    return builds


@exercise(
    "08.builder",
    "build(trt, onnx_path, shapes, workspace_bytes, true_fp32): parse onnx_path; ONE optimization profile with "
    "shapes[name] = (min, opt, max) for EVERY input; the workspace limit; TF32 cleared when true_fp32; return "
    "bytes(builder.build_serialized_network(network, config)).",
    _check_builder,
)
def build(trt, onnx_path: str, shapes: dict[str, tuple], workspace_bytes: int, true_fp32: bool):
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        raise RuntimeError([parser.get_error(i).desc() for i in range(parser.num_errors)])
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if true_fp32:
        config.clear_flag(trt.BuilderFlag.TF32)  # TensorRT 11 allows TF32 unless told otherwise
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in shapes.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError("the build failed: see the TensorRT log")
    return bytes(plan)
