"""Lesson 07 exercise 07.static-int8: static INT8 (QDQ) with a calibration reader and one layer kept FP32.

The checker reads the Q/DQ nodes and their scales in the quantized file and ORT's profile of which kernels ran,
on a CNN drawn at random per call (the seed is printed on failure)."""

from __future__ import annotations

import collections
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from course_utils.check.exercises import exercise
from course_utils.check.lesson_exercises.l07 import _fp32, random_cnn_onnx
from course_utils.check.lesson_exercises.observe import cases


def _qdq_info(path: Path, exclude: str) -> dict:
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
    first_q = next((n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == "input"), None)
    scale = float(numpy_helper.to_array(inits[first_q.input[1]])) if first_q is not None else None
    return {"ops": ops, "weight_q": weight_q, "input_scale": scale}


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


def _check_static(fn: Callable[[str, str, list[np.ndarray], str], None]) -> None:
    import torch

    from course_utils.check.compare import compare_outputs

    with cases("07.static-int8") as c, tempfile.TemporaryDirectory() as tmp:
        path, convs = random_cnn_onnx(Path(tmp) / "cnn.onnx", c, blocks=3)
        big = c.randint(1, 2)
        base = c.rng.uniform(1, 4)
        calib = [(c.randn(c.randint(2, 6), 3, 8, 8) * base * (8 if i == big else 1)).numpy() for i in range(3)]
        allx = np.concatenate([x.ravel() for x in calib])  # the calibration data's range, for the input-scale check
        # Each later conv kept once, in random order (the first conv's input quantizer shows what calibration
        # saw): a submission that ignores keep_fp32 and keeps a conv of its own choosing fails one of the calls.
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
            info = _qdq_info(out, keep)
            assert info["ops"]["QuantizeLinear"] and info["ops"]["DequantizeLinear"], (
                f"no QuantizeLinear/DequantizeLinear pairs in the file (ops {dict(info['ops'])}): static INT8 in QDQ "
                "format is quantize_static(..., calibration reader, quant_format=QuantFormat.QDQ)"
            )
            assert info["input_scale"] is not None, "the model input is not quantized: quantize_static with a reader"
            assert not info["weight_q"].get(keep, True), (
                f"conv '{keep}' was quantized: pass nodes_to_exclude=['{keep}'] to keep it FP32"
            )
            fp32 = [n for n, q in info["weight_q"].items() if n != keep and not q]
            assert not fp32, f"conv(s) {fp32} stayed FP32: only '{keep}' should"
            ratio = info["input_scale"] * 255 / float(max(allx.max(), 0) - min(allx.min(), 0))
            assert 0.9 <= ratio <= 1.1, (
                f"the input's INT8 scale covers {ratio:.2f}x the range of the calibration batches: the reader fed "
                "other "
                "data (hand the quantizer every batch you were given, one {'input': array} per get_next(), then None)"
            )
            x = (c.randn(c.randint(2, 5), 3, 8, 8) * base).numpy()
            ran = _kernels_run(out, x)
            assert ran["QLinearConv"] >= len(convs) - 1, (
                f"ORT's profile shows {ran['QLinearConv']} QLinearConv kernel(s) for {len(convs) - 1} quantized "
                "conv(s): "
                f"the quantized graph did not run as INT8 (kernels seen {dict(ran)})"
            )
            import onnxruntime as ort

            q = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
            cmp = compare_outputs(torch.from_numpy(q), torch.from_numpy(_fp32(path, x)), "int8")
            # a random 8x8 CNN quantized per tensor reaches cosine 0.979-1.0 with a correct pipeline (seen over seeds);
            # wrong calibration is caught above by the input scale, wrong nodes by the graph
            assert cmp.cosine >= 0.95, f"INT8 output cosine to FP32 {cmp.cosine:.4f} < 0.95: {cmp}"
            print(f"   Q/DQ nodes {info['ops']['QuantizeLinear']}/{info['ops']['DequantizeLinear']}; QLinearConv ran "
                  f"{ran['QLinearConv']}x; '{keep}' FP32; cosine {cmp.cosine:.4f}")  # fmt: skip


@exercise(
    "07.static-int8",
    "quantize_file(onnx_in, onnx_out, calib, keep_fp32): a CalibrationDataReader over the calib arrays "
    "({'input': array} per get_next(), then None) and quantize_static(..., quant_format=QuantFormat.QDQ, "
    "per_channel=True, nodes_to_exclude=[keep_fp32]) writing onnx_out.",
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

    quantize_static(onnx_in, onnx_out, Reader(calib), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    nodes_to_exclude=[keep_fp32])  # fmt: skip
