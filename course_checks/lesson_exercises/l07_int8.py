"""Lesson 07 exercise 07.static-int8: static INT8 (QDQ) with a calibration reader and one layer kept FP32.

The checker reads the Q/DQ nodes and their scales in the quantized file and ORT's profile of which kernels ran,
on a CNN drawn at random per call (the seed is printed on failure)."""

from __future__ import annotations

import collections
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from course_checks.exercises import exercise, observed
from course_checks.lesson_exercises.l07 import fp32_output, random_cnn_onnx
from course_checks.lesson_exercises.observe import cases


def _qdq_info(path: Path) -> dict:
    """From the quantized file: op counts, which convs' weights come through a DequantizeLinear, and the scale of
    each quantized activation (by tensor name)."""
    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(path)).graph
    inits = {i.name: i for i in g.initializer}
    produced = {o: n for n in g.node for o in n.output}
    ops = collections.Counter(n.op_type for n in g.node)
    convs = {n.name: n for n in g.node if n.op_type == "Conv"}
    weight_q = {
        name: getattr(produced.get(n.input[1]), "op_type", "") == "DequantizeLinear" for name, n in convs.items()
    }
    # per quantized conv weight: (number of weight scales, output channels)
    weight_scales = {
        name: (int(np.prod(inits[dq.input[1]].dims)), int(inits[dq.input[0]].dims[0]))
        for name, n in convs.items()
        if weight_q[name]
        and (dq := produced[n.input[1]]).input[1] in inits
        and dq.input[0] in inits
        and inits[dq.input[0]].dims
    }
    scales = {
        n.input[0]: float(numpy_helper.to_array(inits[n.input[1]]))
        for n in g.node
        if n.op_type == "QuantizeLinear" and n.input[1] in inits and n.input[0] not in inits
    }
    return {"ops": ops, "weight_q": weight_q, "scales": scales, "weight_scales": weight_scales}


def _kernels_run(path: Path, x: np.ndarray) -> collections.Counter:
    """ORT's profile of one run: the kernels that really ran, by op type (each node once)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "prof")
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        sess.run(None, {"input": x})
        events = json.loads(Path(sess.end_profiling()).read_text())
    nodes = {
        (e["name"], e["args"]["op_name"]) for e in events if e.get("cat") == "Node" and "op_name" in e.get("args", {})
    }
    return collections.Counter(op for _, op in nodes)


FLOAT_CONVS = ("Conv", "FusedConv", "NchwcConv")  # the float convolution kernels ORT's CPU provider runs
SCALE_TOL = 0.02  # MinMax calibration: the same batches give the same scales (order does not matter)


def draw_calibration(c: Any, path: Path) -> list[np.ndarray]:
    """Three batches of distinct sizes holding separate extremes: the lowest input values, the highest, and the
    strongest first-layer response (a narrower batch matching the first conv's strongest filter, per channel),
    redrawn until leaving any one out changes some MinMax scale by more than 3% (the judge allows 2%): the
    quantizer fed one or two of them gives other scales than fed all three."""
    w, b = _first_conv(path)
    k = int((np.abs(w.sum(axis=(2, 3))).sum(1) + b).argmax())
    sign = np.sign(w[k].sum(axis=(1, 2))).reshape(1, 3, 1, 1)
    calib: list[np.ndarray] = []
    for attempt in range(20):
        s, m = c.rng.uniform(1.0, 3.0), c.rng.uniform(1.5, 2.5)
        sizes = c.rng.sample(range(2, 7), 3)
        low = c.randn(sizes[0], 3, 8, 8).numpy() * s - m * s
        high = c.randn(sizes[1], 3, 8, 8).numpy() * s + m * s
        matched = sign * (3.0 + attempt / 10) * s + c.randn(sizes[2], 3, 8, 8).numpy() * (0.1 * s)
        calib = [x.astype(np.float32) for x in (low, high, matched)]
        c.rng.shuffle(calib)
        if leave_one_out_change(path, calib) > 0.03:
            break
    return calib


def leave_one_out_change(path: Path, calib: list[np.ndarray]) -> float:
    """The smallest, over the batches, of the largest relative change in a MinMax scale (the input's range with 0,
    each ReLU's maximum) when that batch is left out: computed with the FP32 CNN in torch, no quantizer."""
    import onnx
    import torch
    from onnx import numpy_helper

    g = onnx.load(str(path)).graph
    inits = {i.name: torch.from_numpy(numpy_helper.to_array(i)) for i in g.initializer}
    convs = [n for n in g.node if n.op_type == "Conv"]
    rows = []
    for x in calib:
        h = torch.from_numpy(x)
        row = [float(-h.min()), float(h.max())]
        for n in convs:
            h = torch.relu(torch.nn.functional.conv2d(h, inits[n.input[1]], inits[n.input[2]], padding=1))
            row.append(float(h.max()))
        rows.append(row)

    def scales(part: list[list[float]]) -> list[float]:
        top = [max(v) for v in zip(*part, strict=True)]
        return [max(top[0], 0) + max(top[1], 0), *top[2:]]

    full = scales(rows)
    return min(max(1 - p / f for p, f in zip(scales(rows[:i] + rows[i + 1 :]), full, strict=True))
               for i in range(len(rows)))  # fmt: skip


def judge_scales(got: dict[str, float], expected: dict[str, float]) -> None:
    """Each activation scale in the file within :data:`SCALE_TOL` of the reference's on the same batches."""
    assert "input" in got, "the model input is not quantized: quantize_static with a reader"
    for name in sorted(set(got) & set(expected)):
        ratio = got[name] / expected[name]
        assert abs(ratio - 1) <= SCALE_TOL, (
            f"the INT8 scale of tensor '{name}' is {ratio:.2f}x what the calibration batches give: the reader fed "
            "other data (one or some of the batches, the widest only, or arrays of your own). Hand the quantizer "
            "every batch you were given, one {'input': array} per get_next(), then None"
        )


def _check_static(fn: Callable[[str, str, list[np.ndarray], str], None]) -> None:
    import torch

    from course_utils.measuring.outputs import compare_outputs

    with cases("07.static-int8") as c, tempfile.TemporaryDirectory() as tmp:
        path, convs = random_cnn_onnx(Path(tmp) / "cnn.onnx", c, blocks=3)
        calib = draw_calibration(c, path)
        reference = Path(tmp) / "reference.int8.onnx"
        quantize_file(str(path), str(reference), [x.copy() for x in calib], convs[1])
        expected = _qdq_info(reference)["scales"]
        seen = []
        for n_call, keep in enumerate(c.rng.sample(convs[1:], 2)):
            out = Path(tmp) / f"cnn.int8.{n_call}.onnx"
            try:
                fn(str(path), str(out), [x.copy() for x in calib], keep)
            except NotImplementedError:
                raise
            except Exception as exc:  # noqa: BLE001 - the quantizer's own error is the most useful message
                raise AssertionError(
                    f"your quantization raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
                ) from None
            assert out.exists(), (
                f"nothing was written to {out.name}: quantize_static(model_input, model_output, reader, ...)"
            )
            info = _qdq_info(out)
            assert info["ops"]["QuantizeLinear"] and info["ops"]["DequantizeLinear"], (
                f"no QuantizeLinear/DequantizeLinear pairs in the file (ops {dict(info['ops'])}): static INT8 in QDQ "
                "format is quantize_static(..., calibration reader, quant_format=QuantFormat.QDQ)"
            )
            assert not info["ops"]["QLinearConv"], (
                f"the file holds {info['ops']['QLinearConv']} QLinearConv node(s): that is the QOperator format, "
                "in which no conv carries its Q/DQ pairs. Write QDQ: quantize_static(..., "
                "quant_format=QuantFormat.QDQ)"
            )
            assert not info["weight_q"].get(keep, True), (
                f"conv '{keep}' was quantized: pass nodes_to_exclude=['{keep}'] to keep it FP32"
            )
            fp32 = [n for n, q in info["weight_q"].items() if n != keep and not q]
            assert not fp32, f"conv(s) {fp32} stayed FP32: only '{keep}' should"
            per_tensor = {n: v for n, v in info["weight_scales"].items() if v[0] != v[1]}
            assert not per_tensor, (
                "conv(s) " + ", ".join(f"'{n}' ({k} weight scale(s) for {o} output channels)"
                                       for n, (k, o) in per_tensor.items())
                + ": the weights were quantized per tensor. quantize_static(..., per_channel=True) gives each "
                "output channel its own scale"
            )  # fmt: skip
            judge_scales(info["scales"], expected)
            x = calib[c.randint(0, 2)][:3].copy()
            ran = _kernels_run(out, x)
            floats = sum(ran[k] for k in FLOAT_CONVS)
            assert ran["QLinearConv"] >= len(convs) - 1, (
                f"ORT's profile shows {ran['QLinearConv']} QLinearConv kernel(s) for {len(convs) - 1} quantized "
                f"conv(s): the quantized graph did not run as INT8 (kernels seen {dict(ran)})"
            )
            assert floats >= 1 and ran["QLinearConv"] == len(convs) - 1, (
                f"ORT's profile shows {ran['QLinearConv']} QLinearConv kernels and {floats} float convolutions: "
                f"'{keep}' ran in INT8 although excluded. Its input still comes through a DequantizeLinear and its "
                "output goes on to a QuantizeLinear, and ORT fuses DQ -> Conv -> Q into a QLinearConv. Exclude the "
                f"node that produces '{keep}''s input too (nodes_to_exclude=['{keep}', <that node>])"
            )
            import onnxruntime as ort

            q = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
            fp32 = torch.from_numpy(fp32_output(path, x))
            cmp = compare_outputs(torch.from_numpy(q), fp32, "int8")
            # a correct pipeline mostly reaches cosine 0.95-1.0 on three images of a random 8x8 CNN, but on some
            # models and batches less (0.94 seen on seed 15): the bar is 0.95, or 0.02 below what the reference
            # quantization of the same model (other layer kept) gives on the same images where that is lower.
            # Wrong calibration is caught above by the activation scales, wrong nodes by the graph and the profile
            ref_q = ort.InferenceSession(str(reference), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
            bar = min(0.95, compare_outputs(torch.from_numpy(ref_q), fp32, "int8").cosine - 0.02)
            assert cmp.cosine >= bar, f"INT8 output cosine to FP32 {cmp.cosine:.4f} < {bar:.4f}: {cmp}"
            qdq = f"{info['ops']['QuantizeLinear']}/{info['ops']['DequantizeLinear']}"
            seen.append(f"keep '{keep}': Q/DQ nodes {qdq}, per-channel weight scales, {len(info['scales'])} "
                        f"activation scales as the 3 batches give, ORT ran {ran['QLinearConv']} QLinearConv and "
                        f"{floats} float Conv kernel(s); cosine {cmp.cosine:.4f}")  # fmt: skip
    observed("; ".join(seen))


def _first_conv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The first convolution's weight and bias, read from the ONNX file."""
    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(path)).graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    conv = next(n for n in g.node if n.op_type == "Conv")
    return inits[conv.input[1]], inits[conv.input[2]]


@exercise(
    "07.static-int8",
    "quantize_file(onnx_in, onnx_out, calib, keep_fp32): a CalibrationDataReader over the calib arrays "
    "({'input': array} per get_next(), then None) and quantize_static(..., quant_format=QuantFormat.QDQ, "
    "per_channel=True, nodes_to_exclude=[keep_fp32, the node that produces its input]) writing onnx_out.",
    _check_static,
)
def quantize_file(onnx_in: str, onnx_out: str, calib: list[np.ndarray], keep_fp32: str) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self, batches: list[np.ndarray]) -> None:
            self.batches = iter(batches)

        def get_next(self) -> dict[str, np.ndarray] | None:
            x = next(self.batches, None)
            return None if x is None else {"input": x}

    import onnx

    nodes = onnx.load(onnx_in).graph.node
    producer = {out: n.name for n in nodes for out in n.output}
    feeding = [producer[i] for n in nodes if n.name == keep_fp32 for i in n.input[:1] if i in producer]
    # with a Q/DQ pair on its input, ORT would fuse the excluded conv into a QLinearConv: leave its input FP32 too
    quantize_static(onnx_in, onnx_out, Reader(calib), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    nodes_to_exclude=[keep_fp32, *feeding])  # fmt: skip
