"""Every lesson runs as a plain script, through the GPU check, in an environment like the lent GPU machine's.

This is one of the two runs every lesson gets in the suite (nbmake is the other). Each lesson goes through
``scripts/gpu_check.py --allow-cpu --allow-missing`` exactly as the check runs on a lent GPU machine without
network or Jupyter: cell by cell (``scripts/run_cells.py``), behind the import blocker of
``tests/test_gpu_check.py`` (no IPython, Jupyter, pydantic, torchao, LitServe, TorchCodec, TensorRT, ModelOpt,
pycuda, MiniLM or SmolLM2 packages), with figures drawn (matplotlib's agg backend) and the GPU sections played by
the rehearsal's CPU stand-ins (``COURSE_REHEARSE=1``: placement, stream order and asynchrony, CUDA-graph rules,
TensorRT/ORT/pycuda pointers, peak memory, timers, global switches).

It fails when a lesson ends before its GPU sections for any reason other than a named missing package, when a
GPU section fails, when a section is recorded "not rehearsable" for anything but a named missing package or a
named GPU-only kernel, and when the sections reached differ from :data:`EXPECTED`. The rehearsal rows go to
``$COURSE_RESULTS_DIR/sections-rehearsal.jsonl`` of the run (``make test``), from which ``scripts/gpu_levels.py``
builds README's table (checked after the run).
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import torch

from course_utils.supply.paths import append_text
from fakegpu.standins import rehearsal
from scripts import gpu_check
from scripts.gpu_levels import lesson_sections
from tests.test_gpu_check import BLOCKER, MISSING

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))
RUN_RESULTS = os.environ.get("COURSE_RESULTS_DIR")  # read before conftest isolates each test's results folder
NAMED = ["missing Python package(s): ", *rehearsal.NOT_REHEARSABLE.values()]
# What the machine-like run reaches, lesson by lesson: the outcome of every GPU section (a lesson that ends early
# for a named missing package leaves its later sections "not reached").
EXPECTED = {
    "00": {"00.gpu-visible": "completed"},
    "01": {"01.gpu-sync": "completed", "01.transfer": "completed"},
    "02": {"02.cuda-profile": "completed"},
    "03": {"03.real-oom": "completed", "03.cudnn-benchmark": "completed"},
    "04": {"04.gpu-precisions": "completed"},
    "05": {"05.gpu-fp8-int4": "not reached"},  # MiniLM's package is missing there, before the section
    "06": {"06.cuda-graphs": "completed", "06.compile-cuda": "not-rehearsable"},
    "07": {"07.cuda-provider": "completed"},
    "08": {
        "08.build": "completed",
        "08.fusion": "completed",
        "08.run": "completed",
        "08.pycuda": "completed",
        "08.profile-error": "completed",
        "08.int8": "not-rehearsable",
        "08.resnet50": "completed",
        "08.resnet50-int8": "not-rehearsable",
        "08.torch-tensorrt": "not-rehearsable",
    },  # fmt: skip
    "09": {
        "09.pin-memory": "completed",
        "09.uint8-transfer": "completed",
        "09.prefetch": "completed",
        "09.gpu-decode": "not-rehearsable",
    },  # fmt: skip
    "10": {"10.streams": "completed", "10.pageable-copy": "completed", "10.concurrent-kernels": "completed"},
    "11": {
        "11.allocator": "completed",
        "11.gpu-peak": "completed",
        "11.max-batch": "completed",
        "11.expandable-segments": "not-rehearsable",
        "11.cuda-graph-static": "completed",
    },  # fmt: skip
    "12": {"12.gpu-2to4": "not-rehearsable"},
    "13": {"13.serve-gpu": "not reached"},  # every cell after the first serves through LitServe (missing there)
    "14": {"14.optimize-tensorrt": "completed"},
    "15": {
        "15.gpu-gqa": "completed",
        "15.gpu-sdpa": "completed",
        "15.gpu-bf16-decode": "completed",  # SmolLM2's package is missing there: its shape with random weights
        "15.gpu-cuda-graphs": "not-rehearsable",
        "15.gpu-int4": "not-rehearsable",
    },  # fmt: skip
    "16": {"16.gpu-serve": "not reached", "16.vllm": "not reached"},  # SmolLM2's package is missing there
    "17": {"17.nccl-tp": "not-rehearsable"},  # NCCL ranks are other processes on the GPU
}


def test_every_lesson_is_found():
    assert len(LESSONS) >= 15


def test_every_lesson_has_its_expected_sections():
    numbers = sorted(p.name[:2] for p in LESSONS)
    assert sorted(EXPECTED) == numbers, (
        f"EXPECTED names lessons {sorted(EXPECTED)}, lessons/ holds {numbers}: add EXPECTED['NN'] for each new lesson "
        "(each GPU section's outcome in this run; {} for a lesson without one) and drop entries of removed lessons"
    )


def _machine_like(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(ROOT)]))
    monkeypatch.setenv("COURSE_LLM_CACHE", str(tmp_path / "llm-cache"))  # no converted SmolLM2 there either
    monkeypatch.delenv("COURSE_REHEARSE_SCOPE", raising=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine `make gpu-check` runs the real thing")
@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs_through_the_gpu_check_as_on_the_lent_machine(lesson, tmp_path, monkeypatch, capsys):
    _machine_like(tmp_path, monkeypatch)
    out, number = tmp_path / "out", lesson.name[:2]
    rc = gpu_check.main(
        ["--allow-cpu", "--allow-missing", "--no-save", "--lessons", number, "--out", str(out), "--budget", "900"]
    )
    printed = capsys.readouterr().out
    record = out / "results" / "sections.jsonl"
    rows = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    if RUN_RESULTS:
        shared = Path(RUN_RESULTS).expanduser() / "sections-rehearsal.jsonl"
        append_text(shared, "".join(json.dumps(r) + "\n" for r in rows if r.get("mode") == "rehearsal"))
    status = next(csv.DictReader((out / "lessons.csv").read_text().splitlines()))["status"]
    log = (out / "log" / f"{number}.log").read_text()
    tail = "\n".join(log.splitlines()[-25:])
    missing = status.removeprefix("skipped: missing ").replace("-", "_")
    assert status == "ok" or (status.startswith("skipped: missing ") and missing in MISSING), (
        f"{lesson.name} ended for a reason other than a named missing package ({status}):\n{tail}"
    )
    assert rc == 0, printed[-2000:]
    sections = {r["section"]: r for r in csv.DictReader((out / "sections.csv").read_text().splitlines())}
    ours = {k for k in lesson_sections(ROOT) if k[:2] == number}
    assert set(sections) >= ours, f"sections with no record: {sorted(ours - set(sections))}"
    for key in ours:
        row = sections[key]
        assert row["status"] != "failed", f"{key} failed on the stand-ins: {row['reason']}\n{tail}"
        if row["status"] == "not-rehearsable":
            reason = row["reason"].removeprefix("not rehearsable: ")
            assert any(reason.startswith(n) for n in NAMED), f"{key}: not rehearsable for no named reason: {reason}"
    got = {key: sections[key]["status"] for key in ours}
    assert number in EXPECTED, f"{lesson.name}: no EXPECTED['{number}'] (its GPU sections' outcomes): add one"
    assert got == EXPECTED[number], f"{lesson.name}: the GPU sections reached changed:\n{tail}"
    entered = {r["section"] for r in rows if r.get("status") == "entered"}
    decided = {r["section"] for r in rows if r.get("status") in {"completed", "failed", "not-rehearsable"}}
    assert entered <= decided, f"sections entered but never decided: {sorted(entered - decided)}"
