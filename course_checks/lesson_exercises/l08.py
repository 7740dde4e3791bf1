"""Lesson 08 exercises: an optimization profile from observed traffic, when an engine must be rebuilt, and the
runner's I/O loop (08.builder, the build itself, is in ``l08_builder.py``)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from course_checks.exercises import exercise, observed
from course_checks.lesson_exercises.observe import Cases, cases


def draw_traffic(c: Cases) -> list[list[int]]:
    """Observed batch sizes per call: unsorted traffic with one most frequent size, two- and three-way ties for
    most frequent (the larger size seen first, so a first-seen tie-break fails), one size only, min == opt, and
    opt == max."""
    sizes = sorted(c.rng.sample([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64], 4))
    lo, a, b, hi = sizes

    def shuffled(xs: list[int]) -> list[int]:
        xs = list(xs)
        c.rng.shuffle(xs)
        return xs

    top = c.randint(3, 6)
    tie = [b] * top + [a] * top  # the larger first
    three = [hi] * 2 + [b] * 2 + [a] * 2 + [lo]
    return [
        shuffled([lo] + [a] * top + [b] * (top - 1) + [hi]),
        tie + shuffled([lo, hi]),
        three,
        [c.choice(sizes)] * c.randint(1, 4),
        [lo] * top + shuffled([a, b, hi]),  # opt == min
        shuffled([lo, a]) + [hi] * top,  # opt == max
    ]


def _expected_profile(batches: list[int]) -> tuple[int, int, int]:
    counts = {b: batches.count(b) for b in set(batches)}
    return min(batches), min(counts, key=lambda b: (-counts[b], b)), max(batches)


def _as_ints(got: Any) -> tuple[int, ...] | None:
    """A returned (min, opt, max) as Python ints (a tuple, list or array of any integer type), else None."""
    try:
        values = list(got.tolist() if hasattr(got, "tolist") else got)
        return tuple(int(v) for v in values) if all(float(v) == int(v) for v in values) else None
    except (TypeError, ValueError):
        return None


def _check_profile(fn: Callable[[list[int]], tuple[int, int, int]]) -> None:
    with cases("08.profile") as c:
        traffic = draw_traffic(c)
        for batches in traffic:
            want, got = _expected_profile(batches), fn(list(batches))
            ints = _as_ints(got)
            assert ints is not None and len(ints) == 3, f"traffic {batches}: return (min, opt, max), got {got!r}"
            if ints != want:
                counts = {b: batches.count(b) for b in set(batches)}
                tied = sorted(b for b in counts if counts[b] == max(counts.values()))
                why = (
                    f"{tied} are tied for most frequent: take the smaller batch (Counter.most_common and "
                    "statistics.mode break ties by first appearance)"
                    if len(tied) > 1 and ints[1] in tied
                    else "min and max of the traffic, opt the most frequent batch"
                )
                raise AssertionError(f"traffic {batches}: (min, opt, max) = {want}, got {tuple(ints)}: {why}")
        try:
            fn([])
        except ValueError:
            pass
        except Exception as exc:  # noqa: BLE001 - a crash on no traffic is the mistake to name
            raise AssertionError(
                f"no traffic observed: your function raised {type(exc).__name__} ({exc}), not ValueError. Check for "
                "an empty list first and raise ValueError (most_common(1)[0] on nothing is an IndexError)"
            ) from None
        else:
            raise AssertionError("no traffic observed: raise ValueError")
    observed(f"{len(traffic)} random traffic lists (ties with the larger batch first, a three-way tie, one size, "
             "opt == min, opt == max) gave their (min, opt, max); an empty list raised ValueError")  # fmt: skip


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
_GPUS = [("NVIDIA L4", "8.9"), ("NVIDIA H200", "9.0"), ("NVIDIA A100-SXM4-80GB", "8.0"), ("NVIDIA L40S", "8.9"),
         ("NVIDIA H100 80GB HBM3", "9.0")]  # fmt: skip


def _metadata(c: Cases) -> dict[str, Any]:
    gpu, cc = c.choice(_GPUS)
    lo, hi = c.randint(1, 4), c.choice([16, 32, 64])
    return {"gpu_name": gpu, "compute_capability": cc, "trt_version": c.choice(["10.13.0", "11.0.0", "11.1.0"]),
            "precision": c.choice(["fp32", "tf32", "fp16", "int8"]),
            "profile": {"min": [lo], "opt": [c.randint(lo, hi)], "max": [hi]},
            "onnx_sha256": f"{c.rng.getrandbits(256):064x}", "built": f"2026-{c.randint(1, 12):02d}-01",
            "build": {"workspace_bytes": 1 << c.randint(28, 32), "tf32": c.choice([True, False]),
                      "opt_level": c.randint(0, 5)}}  # fmt: skip


def _changed(c: Cases, meta: dict[str, Any], field: str) -> Any:
    """Another value of one field, as it differs in practice (one number of a profile, one build setting)."""
    value = meta[field]
    if field == "profile":
        return {**value, "opt": [value["opt"][0] + 1]}
    if field == "build":
        key = c.choice(sorted(value))
        return {**value, key: (not value[key]) if isinstance(value[key], bool) else value[key] + 1}
    if field == "onnx_sha256":
        return value[:-1] + ("0" if value[-1] != "0" else "1")
    if field == "compute_capability":
        return "8.6" if value != "8.6" else "9.0"
    options = {"gpu_name": [g for g, _ in _GPUS], "trt_version": ["10.13.0", "11.0.0", "11.1.0"],
               "precision": ["fp32", "tf32", "fp16", "int8"]}[field]  # fmt: skip
    return c.choice([o for o in options if o != value])


def draw_staleness(c: Cases) -> list[tuple[dict | None, dict, list[str]]]:
    """(stored, here, stale fields) cases: stored as read back from JSON (equal values, other objects), every
    field changed alone (the build settings' one value too), two to four fields at once, a different build date
    only, a stored record lacking a field (older metadata), and no stored record."""
    here = _metadata(c)
    same = json.loads(json.dumps(here))
    out: list[tuple[dict | None, dict, list[str]]] = [(same, here, []), ({**same, "built": "yesterday"}, here, [])]
    for field in c.rng.sample(FIELDS, len(FIELDS)):
        out.append(({**json.loads(json.dumps(here)), field: _changed(c, here, field)}, here, [field]))
    for i in range(2):  # the first holds a pair whose FIELDS order is not alphabetical
        fields = c.rng.sample(FIELDS, c.randint(2, 4))
        if i == 0:
            fields = sorted({*fields, "trt_version", "precision"}, key=FIELDS.index)  # alphabetically: precision first
        stored = json.loads(json.dumps(here))
        stored.update({f: _changed(c, here, f) for f in fields})
        out.append((stored, here, [f for f in FIELDS if f in fields]))
    missing = c.choice(FIELDS)
    out.append(({k: v for k, v in json.loads(json.dumps(here)).items() if k != missing}, here, [missing]))
    out.append((None, here, list(FIELDS)))
    return out


def _check_rebuild(fn: Callable[[dict | None, dict], list[str]]) -> None:
    with cases("08.stale") as c:
        drawn = draw_staleness(c)
        for stored, here, want in drawn:
            try:
                got = fn(copy.deepcopy(stored), copy.deepcopy(here))
            except KeyError as exc:
                if stored is None:
                    raise
                raise AssertionError(
                    f"the stored metadata has no {exc} (written by an older version): your function raised KeyError. "
                    "A field missing from stored is stale: compare stored.get(field) with here.get(field)"
                ) from None
            except (AttributeError, TypeError) as exc:
                if stored is not None:
                    raise
                raise AssertionError(
                    f"nothing stored (stored is None, no engine built yet): your function raised "
                    f"{type(exc).__name__} ({exc}). Then every field is stale: return list(FIELDS)"
                ) from None
            if isinstance(got, (set, frozenset)) and sorted(got) == sorted(want) and len(want) > 1:
                raise AssertionError(f"return a list in FIELDS order ({want}), got the {type(got).__name__} {got}")
            assert isinstance(got, (list, tuple, set, frozenset)), (
                f"return a list of field names, got {type(got).__name__}"
            )
            got = list(got)
            if got == want:
                continue
            diff = [f for f in FIELDS if (stored or {}).get(f) != here.get(f)]
            if stored is not None and sorted(got) == sorted(want):
                raise AssertionError(f"the stale fields are {want}, in FIELDS order; you returned {got}")
            outside = [f for f in got if f not in FIELDS]
            if outside:
                raise AssertionError(
                    f"you returned {outside}, not in FIELDS: only the fields in FIELDS decide a rebuild (the build "
                    f"date alone does not); compare those, in FIELDS order. The stale fields here are {want}"
                )
            if stored is not None and len(got) > len(want) and set(want) <= set(got):
                extra = [f for f in got if f not in want]
                raise AssertionError(
                    f"stored and current metadata are equal in {extra} (stored as read back from JSON: equal values, "
                    f"other objects), yet you called them stale: compare values with != (not `is not`); the stale "
                    f"fields are {want}"
                )
            missed = [f for f in diff if f not in got]
            raise AssertionError(
                f"{'no stored metadata' if stored is None else f'stored differs from current in {diff}'}: the "
                f"stale fields are {want}, you returned {got}"
                + (f" (you left out {missed}: every field in FIELDS counts, the build settings too)" if missed else "")
            )
    observed(f"{len(drawn)} metadata pairs (read back from JSON; each of the {len(FIELDS)} fields changed alone, "
             "several at once, only the build date, a field missing, nothing stored): your stale fields matched "
             "every one, in FIELDS order")  # fmt: skip


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


def fake_trt():
    """The fake TensorRT 11.1 (``fakegpu.standins.tensorrt``): the real API surface, ORT behind it."""
    from fakegpu.standins.tensorrt import fake_from_snapshot

    return fake_from_snapshot()


def two_io_onnx(path, k: float, width: int) -> None:
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


def engine_of(trt, onnx_path, bounds: dict[str, tuple[int, int, int]], width: int):
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

    with cases("08.runner") as c, tempfile.TemporaryDirectory() as tmp:
        trt = fake_trt()
        # batch above the profile's minimum (1): outputs sized for the minimum are too small on every seed
        k, width, batch = round(c.rng.uniform(1.5, 4.0), 3), c.randint(3, 9), c.randint(2, 8)
        onnx_path = Path(tmp) / "two_io.onnx"
        two_io_onnx(onnx_path, k, width)
        engine = engine_of(trt, onnx_path, {"a": (1, 4, 8), "b": (1, 4, 8)}, width)
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
            if "negative dimension" in str(exc):
                raise AssertionError(
                    f"your loop raised {type(exc).__name__}: {exc}: an output shape still holds -1, the dynamic "
                    "batch. engine.get_tensor_shape keeps the -1, and so does context.get_tensor_shape until every "
                    "input's shape is set: set_input_shape for all inputs first, then size each output with "
                    "context.get_tensor_shape(name)"
                ) from exc
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
        on_device = _run_on_device(fn, c, onnx_path, k, width, batch)
    observed(f"one execute_async_v3 on the given stream, after stream.wait_stream(producer) and before "
             f"producer.wait_stream(stream); the engine read the feeds' own buffers and wrote the float32 'sum' and "
             f"float16 'scaled' ({batch}x{width}) you returned" + on_device)  # fmt: skip


def _run_on_device(fn: Callable, c: Cases, onnx_path: Any, k: float, width: int, batch: int) -> str:
    """The loop once more where TensorRT runs: feeds on the (stand-in) GPU, written on a producer stream; TensorRT
    takes device pointers only and its stream must be ordered after the producer (and the producer after it, when
    the outputs are read there). Only on the CPU stand-in (a GPU machine runs the lesson's real engines)."""
    import torch

    from course_checks.lesson_exercises.observe import gpu, on_standin
    from fakegpu.standins.tensorrt import fake_from_snapshot

    with gpu() as device:
        if not on_standin():
            return ""
        trt = fake_from_snapshot(device_pointers=True)
        engine = engine_of(trt, onnx_path, {"a": (1, 4, 8), "b": (1, 4, 8)}, width)
        producer, stream = torch.cuda.Stream(), torch.cuda.Stream()
        try:
            with torch.cuda.stream(producer):
                feeds = {n: c.randn(batch, width).to(device) for n in ("a", "b")}
                out = fn(trt, engine, engine.create_execution_context(), dict(feeds), stream, producer)
                got = {n: out[n].float().cpu() for n in ("sum", "scaled")} if isinstance(out, dict) else None
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - the stand-in's message names what a GPU would do
            raise AssertionError(
                f"with the inputs on the GPU (the CPU stand-in's 'cuda'), your loop failed: {type(exc).__name__}: "
                f"{exc}. Allocate outputs on the inputs' device (torch.empty(..., device=feeds[name].device)), give "
                "TensorRT device pointers, and order the streams both ways"
            ) from None
        assert got is not None, "return {output name: tensor} for each output"
        want = feeds["a"].cpu() * k + feeds["b"].cpu()
        assert torch.allclose(got["sum"], want, atol=1e-5), "on the GPU, 'sum' differs: were the addresses right?"
    return "; on the (stand-in) GPU: device pointers only, outputs on cuda:0, both stream orders held"


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
