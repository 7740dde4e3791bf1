"""Lesson 08's FP32 reference and ResNet-50 targets, checked on the CPU: each trap of issue 20 as a test that fails
on the code before the fix.

* in-place ``.half()``/``.float()``/``.cuda()`` on a model still used as the FP32 reference (``source_traps``);
* ``eng, _ = load_or_build(...)`` overwriting the module alias the lesson's own functions use;
* TF32 switched back *on* for matmuls after the "true FP32" reference (``true_fp32`` restores what was there);
* batch-1 latency measured on an engine tuned for batch 256 (``r50_profiles``: one engine per job);
* the ResNet-50 INT8 throughput target never measured (``target_verdict``: measured vs target, per GPU model).
"""

from __future__ import annotations

import ast
import re

import numpy as np
import pytest
import torch

from .lesson_code import lesson_namespace, lesson_path

COVERS = {
    "08.resnet50-int8": "r50_profiles (a latency engine tuned at batch 1 beside the throughput one) and "
    "target_verdict (measured images/s vs the course's H200 target, matched by GPU model token); the ModelOpt "
    "command is the one test_l08_modelopt.py parses",
}

CONVERTERS = {"half", "float", "bfloat16", "double", "cuda", "to", "cpu"}
MODEL_SOURCES = {"load_digits_model", "resnet", "minilm"}


def _model_names(tree: ast.AST) -> set[str]:
    """Names bound at top level to a model loaded by ``cu.models.*`` (``x = ...`` or ``x, note = ...``)."""
    names = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        if isinstance(func, ast.Attribute) and func.attr in MODEL_SOURCES:
            for target in node.targets:
                elts = target.elts if isinstance(target, ast.Tuple) else [target]
                if elts and isinstance(elts[0], ast.Name):
                    names.add(elts[0].id)
    return names


def in_place_conversions(lesson: str) -> list[str]:
    """``model.half()``-style calls on a loaded model: they convert the module in place (deepcopy first)."""
    tree = ast.parse(lesson_path(lesson).read_text())
    models = _model_names(tree)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in CONVERTERS
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in models
        ):
            found.append(f"line {node.lineno}: {node.func.value.id}.{node.func.attr}(...)")
    return found


def shadowed_imports(lesson: str) -> list[str]:
    """Assignments to a name an import bound (outside ``except ImportError`` fallbacks)."""
    tree = ast.parse(lesson_path(lesson).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                imported.add((alias.asname or alias.name).split(".")[0])
    fallback = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler):
            fallback |= {id(n) for n in ast.walk(node)}
    return [
        f"line {n.lineno}: '{n.id}' is assigned but names an imported module"
        for n in ast.walk(tree)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in imported and id(n) not in fallback
    ]


@pytest.mark.parametrize("lesson", ["05", "07", "08"])
def test_no_in_place_conversion_of_a_reference_model(lesson):
    found = in_place_conversions(lesson)
    assert not found, f"lesson {lesson} converts a loaded model in place (use copy.deepcopy(model).half()): {found}"


@pytest.mark.parametrize("lesson", ["05", "06", "07", "08"])
def test_no_assignment_overwrites_an_imported_module(lesson):
    found = shadowed_imports(lesson)
    assert not found, f"lesson {lesson}: {found}"


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("08")


def test_true_fp32_turns_tf32_off_and_restores_previous_settings(ns):
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        for before in [(True, False), (False, True)]:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before
            with ns["true_fp32"]():
                assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
            after = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
            assert after == before, f"TF32 settings {before} came back as {after}"
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_run_section_leaves_no_global_tf32_switch():
    src = lesson_path("08").read_text()
    assert "matmul.allow_tf32 = True" not in src, "lesson 08 turns TF32 on for every later matmul"


def test_latency_engine_is_tuned_for_batch_one(ns):
    profiles = ns["r50_profiles"](256)
    lat, thr = profiles["latency"], profiles["throughput"]
    assert lat.min[0] == lat.opt[0] == lat.max[0] == 1, f"batch-1 latency needs an engine tuned at 1: {lat}"
    assert thr.opt[0] == thr.max[0] == 256 and thr.min[0] == 1


def test_int8_throughput_is_printed_against_the_target(ns):
    verdict = ns["target_verdict"]
    steady = np.linspace(0.99, 1.01, 15)  # the per-call throughputs of a quiet run, spread 2%
    assert verdict(70_000 * steady, "NVIDIA H200").endswith(": met")
    assert verdict(60_000 * steady, "NVIDIA H200 NVL").endswith(": missed")
    assert "66,220" in verdict(60_000 * steady, "NVIDIA H200")  # 70% of 94,600
    # calls on both sides of the target: the interval straddles it, so nothing is concluded
    assert verdict(np.linspace(50_000, 80_000, 15), "NVIDIA H200").endswith(": not shown")
    assert verdict(70_000 * steady, "NVIDIA H200", standin=True).endswith("not judged (stand-in timing)")
    other = verdict(90_000 * steady, "NVIDIA H100 80GB HBM3")
    assert "not comparable" in other and "measured 90,000" in other


def test_resnet50_section_measures_latency_and_int8():
    src = lesson_path("08").read_text()
    assert re.search(r'cu\.gpu_section\(\s*"08\.resnet50-int8"', src) and "target_verdict(" in src
    assert "r50_profiles(big)" in src
    assert "throughput * 1000" not in src, "Measurement.throughput is already items per second"
