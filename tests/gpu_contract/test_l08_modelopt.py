"""The ModelOpt INT8 command the course builds, parsed by ModelOpt's own argument parser (no GPU needed).

``python -m modelopt.onnx.quantization`` parses its flags with ``get_parser()`` in
``modelopt/onnx/quantization/__main__.py``. That module imports ModelOpt's ONNX stack (onnx_graphsurgeon,
cupy, ...), which a CPU machine need not have; the parser itself needs only argparse. So the wheel
(``nvidia-modelopt``, pinned in the GPU extras) is downloaded without dependencies, and the parser's source
is executed with ModelOpt's own imports replaced by the three argparse helpers they provide (from the same
wheel) and a stub for ``quantize``. Abbreviations are turned off: ModelOpt's CLI would accept
``--calibration_data`` as a prefix of ``--calibration_data_path``; the course must spell every flag out.
"""

from __future__ import annotations

import ast
import logging
import re
from pathlib import Path

import pytest

from course_utils.techniques import tensorrt_engines as eng

from . import trt_api

COVERS = {
    "08.int8": "the ModelOpt INT8 command (engines.modelopt_int8_command, as lesson 08 builds it) parsed by "
    "ModelOpt's own parser with abbreviations off: every flag known, calibration_data_path, calibration_eps "
    "(cuda:0 first) and high_precision_dtype stated; the engine build/run is test_l08_tensorrt.py's",
}


def _pinned_requirement() -> str:
    text = (trt_api.ROOT / "pyproject.toml").read_text()
    m = re.search(r'"(nvidia-modelopt[^"]*)"', text)
    return re.sub(r"\[.*?\]", "", m.group(1)) if m else "nvidia-modelopt"


def _without_modelopt_imports(source: str, filename: str):
    tree = ast.parse(source, filename)
    ours = [n for n in tree.body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("modelopt")]
    tree.body = [n for n in tree.body if n not in ours]
    return compile(tree, filename, "exec")


@pytest.fixture(scope="module")
def modelopt_parser():
    d = trt_api.cache_dir()
    try:
        with trt_api._locked(d):
            wheel = trt_api.fetch_wheel(_pinned_requirement(), "nvidia_modelopt-*-py3-none-any.whl", d)
            root = trt_api.unpack(wheel, d)
    except trt_api.Unavailable as exc:
        pytest.skip(f"ModelOpt's wheel cannot be had here: {exc}")
    pkg = Path(root) / "modelopt" / "onnx" / "quantization"
    helpers: dict = {"__name__": "modelopt_autotune_utils", "logger": logging.getLogger("modelopt")}
    utils = pkg / "autotune" / "utils.py"
    exec(_without_modelopt_imports(utils.read_text(), str(utils)), helpers)  # noqa: S102 - ModelOpt's own source

    def quantize(*args, **kwargs):
        raise AssertionError("the contract suite only parses; it never quantizes")

    main = pkg / "__main__.py"
    ns = {
        "__name__": "modelopt_cli",
        "quantize": quantize,
        **{k: helpers[k] for k in ("MODE_PRESETS", "StoreWithExplicitFlag", "get_node_filter_list")},
    }
    exec(_without_modelopt_imports(main.read_text(), str(main)), ns)  # noqa: S102 - ModelOpt's own source
    print(f"ModelOpt parser from {wheel.name}")

    def parser(*, allow_abbrev: bool = False):
        p = ns["get_parser"]()
        p.allow_abbrev = allow_abbrev
        return p

    return parser


def test_course_command_parses_with_every_flag_spelled_out(modelopt_parser, tmp_path):
    cmd = eng.modelopt_int8_command(tmp_path / "m.onnx", tmp_path / "calib.npy", tmp_path / "m.int8.onnx")
    assert cmd[1:3] == ["-m", "modelopt.onnx.quantization"]
    args, unknown = modelopt_parser().parse_known_args(cmd[3:])
    assert unknown == [], f"flags ModelOpt does not know (abbreviations off): {unknown}"
    assert args.quantize_mode == "int8" and args.calibration_method == "max"
    assert args.calibration_data_path == str(tmp_path / "calib.npy")
    assert args.calibration_eps[0] == "cuda:0", "calibrate on the GPU first (ModelOpt's default starts with cpu)"
    assert args.high_precision_dtype == "fp16"
    assert args.output_path == str(tmp_path / "m.int8.onnx") and args.onnx_path == str(tmp_path / "m.onnx")
    # the defaults the course now states explicitly really are ModelOpt's defaults
    defaults = modelopt_parser().parse_args(["--onnx_path", "m.onnx"])
    assert defaults.calibration_eps[0] == "cpu" and defaults.high_precision_dtype == "fp16"


def test_unknown_and_abbreviated_flags_fail(modelopt_parser):
    base = ["--onnx_path", "m.onnx", "--quantize_mode", "int8"]
    with pytest.raises(SystemExit):
        modelopt_parser().parse_args([*base, "--no_such_flag", "1"])
    with pytest.raises(SystemExit):  # the old course command: accepted only as an abbreviation
        modelopt_parser().parse_args([*base, "--calibration_data", "calib.npy"])
    old = modelopt_parser(allow_abbrev=True).parse_args([*base, "--calibration_data", "calib.npy"])
    assert old.calibration_data_path == "calib.npy", "ModelOpt's own CLI (abbreviations on) accepted it silently"
    with pytest.raises(SystemExit):
        modelopt_parser().parse_args([*base, "--high_precision_dtype", "fp8"])  # not a choice
