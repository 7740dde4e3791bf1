"""Lesson 07 exercises: a session built with the options it really runs with, and the fused graph ORT writes
(07.static-int8, static INT8 with one layer kept FP32, is in ``l07_int8.py``).

The checkers look where ORT decides: the options a session is **created** with (snapshotted inside
``InferenceSession.__init__``: options changed on any object after creation change nothing that runs), the
optimized graph ORT itself writes, the Q/DQ nodes and their scales in the quantized file, and ORT's profile
of which kernels ran. Models are built at random per call (the seed is printed on failure).
"""

from __future__ import annotations

import collections
import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from course_checks.exercises import exercise
from course_checks.lesson_exercises.observe import cases

_LEVEL_NAMES = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
SPIN = "session.intra_op.allow_spinning"


def random_cnn_onnx(path: Path, c, blocks: int | None = None, identity: bool = False) -> tuple[Path, list[str]]:
    """A random small CNN written directly as ONNX (Conv-Relu blocks, Flatten, Gemm); returns (path, conv names).

    Built with ``onnx.helper`` (no exporter: fast), input ``input`` (N, 3, 8, 8), output ``logits``. With
    ``identity`` an Identity node follows the Flatten (what the basic level's Identity elimination removes).
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(c.seed)
    blocks = blocks or c.randint(2, 4)
    chans = [3] + [c.randint(4, 10) for _ in range(blocks)]
    nodes, inits, prev, convs = [], [], "input", []
    for i in range(blocks):
        w = (rng.standard_normal((chans[i + 1], chans[i], 3, 3)) * (2 / (9 * chans[i])) ** 0.5).astype(np.float32)
        b = (rng.standard_normal(chans[i + 1]) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        name = f"conv_{i}_{rng.integers(1000)}"
        convs.append(name)
        nodes.append(helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], name=name, pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu_{i}"))
        prev = f"r{i}"
    nodes.append(helper.make_node("Flatten", [prev], ["flat"], name="flatten"))
    if identity:
        nodes.append(helper.make_node("Identity", ["flat"], ["flat_id"], name="identity"))
    feat = chans[-1] * 64
    gw = (rng.standard_normal((5, feat)) * (1 / feat) ** 0.5).astype(np.float32)
    inits += [numpy_helper.from_array(gw, "gw"), numpy_helper.from_array(np.zeros(5, np.float32), "gb")]
    nodes.append(helper.make_node("Gemm", ["flat_id" if identity else "flat", "gw", "gb"], ["logits"], name="fc",
                                  transB=1))  # fmt: skip
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5])], initializer=inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path, convs


def fp32_output(path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]


@contextlib.contextmanager
def creation_options():
    """Record the options every ``InferenceSession`` is created with, at creation (what ORT copies and uses)."""
    import onnxruntime as ort

    seen: list[dict] = []
    cls = ort.InferenceSession
    original = cls.__init__

    def init(self, path_or_bytes, sess_options=None, providers=None, *args, **kwargs):
        snap = {"path": str(path_or_bytes) if isinstance(path_or_bytes, str | Path) else "<bytes>", "options": None,
                "providers": [p if isinstance(p, str) else p[0] for p in providers] if providers else None}  # fmt: skip
        if sess_options is not None:
            try:
                spin = sess_options.get_session_config_entry(SPIN)
            except RuntimeError:
                spin = "not set"
            snap["options"] = {"level": sess_options.graph_optimization_level,
                               "threads": sess_options.intra_op_num_threads, "spin": spin}  # fmt: skip
        original(self, path_or_bytes, sess_options, providers, *args, **kwargs)
        snap["session"] = self
        seen.append(snap)

    cls.__init__ = init
    try:
        yield seen
    finally:
        cls.__init__ = original


GPU_BUILD_PROVIDERS = ["CUDAExecutionProvider", "CPUExecutionProvider"]


@contextlib.contextmanager
def _gpu_build_providers(fn: Callable[..., object]):
    """``onnxruntime.get_available_providers()`` answers as the GPU build of ORT does (CUDA first) while ``fn``
    runs, under the module's name and any name ``fn``'s module imported it by: a session created with that list
    would not run on the CPU where the GPU build is installed, whichever build runs the check."""
    import onnxruntime as ort

    real = ort.get_available_providers

    def gpu_build() -> list[str]:
        return list(GPU_BUILD_PROVIDERS)

    scope = getattr(fn, "__globals__", {})
    imported = [name for name, value in list(scope.items()) if value is real and not name.startswith("__")]
    ort.get_available_providers = gpu_build
    scope.update(dict.fromkeys(imported, gpu_build))
    try:
        yield
    finally:
        ort.get_available_providers = real
        scope.update(dict.fromkeys(imported, real))


def draw_session_case(c, tmp: Path) -> tuple[Path, np.ndarray, np.ndarray, list[tuple[str, int]]]:
    """What a seed draws for 07.session: the CNN (written under ``tmp``), an input, the FP32 output, and the four
    levels in random order, each with its thread count."""
    path, _ = random_cnn_onnx(Path(tmp) / "cnn.onnx", c)
    x = c.randn(c.randint(2, 6), 3, 8, 8).numpy()
    ref = fp32_output(path, x)
    return path, x, ref, [(level, c.randint(1, 3)) for level in c.rng.sample(list(_LEVEL_NAMES), 4)]


def judge_session_call(fn: Callable[[str, str, int], object], path: Path, x: np.ndarray, ref: np.ndarray,
                       level: str, threads: int) -> None:  # fmt: skip
    """One call of the learner's function, judged on the options the session it returns was created with."""
    import onnxruntime as ort
    import torch

    from course_utils.measuring.outputs import compare_outputs

    with creation_options() as seen, _gpu_build_providers(fn):
        sess = fn(str(path), level, threads)
    assert isinstance(sess, ort.InferenceSession), f"return the onnxruntime.InferenceSession, got {type(sess)}"
    made = [s for s in seen if s["session"] is sess]
    assert made, "return the session your function created (not one made before the call)"
    snap = made[0]
    assert snap["options"] is not None, (
        "the session was created without SessionOptions: build the options first, then pass them to "
        "InferenceSession(path, so, providers=[...]) (options set afterwards change nothing that runs)"
    )
    assert sess.get_providers()[0] == "CPUExecutionProvider", f"run on the CPU provider, got {sess.get_providers()}"
    asked = snap["providers"]
    assert not asked or asked[0] == "CPUExecutionProvider", (
        f"the session was created with providers={asked}: ORT takes the first one available, so on a machine "
        "with that provider the session would not run on the CPU. Pass providers=['CPUExecutionProvider']"
        + (" (not onnxruntime.get_available_providers(): it lists what the package was built with, GPU first in "
           "the GPU build)" if asked == GPU_BUILD_PROVIDERS else "")
    )  # fmt: skip
    (out,) = sess.run(None, {sess.get_inputs()[0].name: x})
    cmp = compare_outputs(torch.from_numpy(out), torch.from_numpy(ref), "fp32")
    assert cmp.within, f"level {level}: outputs differ from the model's ({cmp.reason}): load onnx_path itself"
    want = getattr(ort.GraphOptimizationLevel, _LEVEL_NAMES[level])
    got = snap["options"]
    assert got["level"] == want, (
        f"level '{level}': the session was created at {got['level']}, expected {want}: set "
        "graph_optimization_level BEFORE creating the session (changing it afterwards does nothing)"
    )
    assert got["threads"] == threads, (
        f"threads={threads}: the session was created with intra_op_num_threads={got['threads']} "
        "(set it before creating the session)"
    )
    assert got["spin"] == "0", (
        f"thread spinning was '{got['spin']}' at creation: so.add_session_config_entry('{SPIN}', '0') "
        "before creating the session"
    )


def _check_session(fn: Callable[[str, str, int], object]) -> None:
    with cases("07.session") as c, tempfile.TemporaryDirectory() as tmp:
        path, x, ref, calls = draw_session_case(c, Path(tmp))
        for level, threads in calls:
            judge_session_call(fn, path, x, ref, level, threads)


@exercise(
    "07.session",
    "build_session(onnx_path, level, threads): an onnxruntime.InferenceSession on the CPU provider CREATED with "
    "SessionOptions at the graph optimization level named by level ('disable', 'basic', 'extended', 'all'), "
    "intra_op_num_threads = threads and the session config entry 'session.intra_op.allow_spinning' = '0'.",
    _check_session,
)
def build_session(onnx_path: str, level: str, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVEL_NAMES[level])
    so.intra_op_num_threads = threads
    so.add_session_config_entry(SPIN, "0")
    return ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])


# ------------------------------------------------------------------ 07.fusion: the graph ORT really runs


class OpCounts(collections.Counter):
    """An op-type Counter (equal to a plain one with the same counts) that also knows each node's domain:
    ``domains`` counts ``(domain, op_type)`` pairs, the default ONNX domain as ""."""

    domains: collections.Counter


def _op_counts(nodes) -> OpCounts:
    nodes = list(nodes)
    counts = OpCounts(n.op_type for n in nodes)
    counts.domains = collections.Counter((_domain(n.domain), n.op_type) for n in nodes)
    return counts


def _domain(d: str) -> str:
    return "" if d in ("", "ai.onnx") else d


def _optimized_ops(path, level: str, out: Path) -> OpCounts:
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVEL_NAMES[level])
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return _op_counts(onnx.load(str(out)).graph.node)


def _by_domain(got: collections.Counter) -> collections.Counter | None:
    """A Counter keyed "domain:op_type" (``f"{n.domain}:{n.op_type}"``, the default domain "" or "ai.onnx") as
    ``(domain, op_type)`` pairs; None when its keys are plain op types."""
    if not got or not all(isinstance(k, str) and ":" in k for k in got):
        return None
    return collections.Counter({(_domain(k.rsplit(":", 1)[0]), k.rsplit(":", 1)[1]): v for k, v in got.items()})


def draw_fusion_case(c, tmp: Path) -> tuple[Path, collections.Counter, list[tuple[str, collections.Counter]]]:
    """What a seed draws for 07.fusion: the CNN (written under ``tmp``, with an Identity node so that the basic
    level changes the graph too), its own op counts, and the two levels in random order, each with the op counts
    of the graph ORT optimizes at that level."""
    import onnx

    path, _ = random_cnn_onnx(Path(tmp) / "cnn.onnx", c, identity=True)
    original = _op_counts(onnx.load(str(path)).graph.node)
    levels = c.rng.sample(["basic", "extended"], 2)
    return path, original, [(lv, _optimized_ops(path, lv, Path(tmp) / f"ref_{lv}.onnx")) for lv in levels]


def judge_fusion(got: object, want: collections.Counter, original: collections.Counter, level: str,
                 others: dict[str, collections.Counter] | None = None) -> None:  # fmt: skip
    """The op counts the learner reported for ``level`` against ORT's optimized graph at that level (``others``:
    the counts at the other levels drawn, so that reporting one of those is named)."""
    assert isinstance(got, collections.Counter | dict), f"return a Counter of op types, got {type(got).__name__}"
    got = collections.Counter(got)
    qualified = _by_domain(got)
    if qualified is not None:  # counted as f"{n.domain}:{n.op_type}": judged with the domains where they are known
        if qualified == getattr(want, "domains", None):
            return
        got = collections.Counter()
        for (_, op), v in qualified.items():
            got[op] += v
    if got == original and want != original:
        raise AssertionError(
            f"level '{level}': you report the unoptimized graph's counts: the file you were given, or one ORT wrote "
            "at ORT_DISABLE_ALL. ORT's fused graph is what runs: set graph_optimization_level to the level asked "
            "and SessionOptions.optimized_model_filepath, create the session, and count the nodes of that file"
        )
    for other, counts in (others or {}).items():
        if other != level and got == counts and want != counts:
            raise AssertionError(
                f"level '{level}': you report the graph ORT optimizes at level '{other}' ({dict(got)}): map "
                f"'{level}' to GraphOptimizationLevel.{_LEVEL_NAMES[level]}"
            )
    if qualified is not None and hasattr(want, "domains"):
        shown = {f"{d}:{op}": v for (d, op), v in want.domains.items()}
        raise AssertionError(
            f"level '{level}': you report { ({f'{d}:{op}': v for (d, op), v in qualified.items()}) } by domain and "
            "op_type, ORT's "
            f"optimized graph at that level holds {shown} (set graph_optimization_level to the level asked, save "
            "with optimized_model_filepath, count each node's domain and op_type)"
        )
    assert got == want, (
        f"level '{level}': you report {dict(got)}, ORT's optimized graph at that level holds {dict(want)} "
        "(set graph_optimization_level to the level asked, save with optimized_model_filepath, count op_type)"
    )


def _check_fusion(fn: Callable[[str, str], collections.Counter]) -> None:
    with cases("07.fusion") as c, tempfile.TemporaryDirectory() as tmp:
        path, original, levels = draw_fusion_case(c, Path(tmp))
        for level, want in levels:
            judge_fusion(fn(str(path), level), want, original, level, dict(levels))


@exercise(
    "07.fusion",
    "fused_ops(onnx_path, level): the op-type Counter of the graph ORT optimizes at `level` ('basic' or "
    "'extended'), read from the file SessionOptions.optimized_model_filepath makes it write (keys op_type, or "
    "f'{node.domain}:{node.op_type}').",
    _check_fusion,
)
def fused_ops(onnx_path: str, level: str) -> collections.Counter:
    import onnx
    import onnxruntime as ort

    out = Path(tempfile.mkdtemp(prefix="fused_")) / "optimized.onnx"
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVEL_NAMES[level])
    so.optimized_model_filepath = str(out)
    ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    return collections.Counter(n.op_type for n in onnx.load(str(out)).graph.node)
