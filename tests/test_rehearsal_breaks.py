"""GPU bugs planted in a copy of a lesson make its rehearsal fail, each with a message that names the fix.

One plant per kind of bug that gives wrong numbers rather than an error on a GPU (issue 29): a timer that does
not synchronize, a "pinned" buffer that is pageable, a CUDA-graph output returned without a clone, a peak read
without a reset between variants, ONNX Runtime reading an input torch has not finished writing, a global switch
(cudnn.benchmark) not restored, a non-blocking device-to-host copy read before its stream finished; and a model
moved to the device in place, whose damage shows in a later cell, which is why the suite rehearses whole lessons.
Also the issue-20 break of lesson 10 (a CPU model fed the stream code's CUDA tensors), rehearsed as on a GPU
machine (``COURSE_REHEARSE_SCOPE=lesson``).

Each test rehearses a copy of the lesson's code cell by cell: its setup cell, its contract cells (the functions
the sections call), the cells that make what the planted section uses, the planted section and, for damage that
shows later, the later cell (the measurements and exercises in between are left out to keep the test short);
the shipped lesson passes the whole-lesson run of ``tests/test_lessons_as_scripts.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scripts import run_cells

ROOT = Path(__file__).resolve().parent.parent
SETUP = ("cu.lesson.start(",)  # the lesson's setup cell (and the import cell in the lessons that have one apart)
# kind: (lesson, shipped code, planted code, cells kept besides the setup and the contract cells (the last is where
# the failure must show), what the failure says)
PLANTS = {
    "timer without synchronize": (
        "03", "                sync()\n", "",
        ("resnet, note = cu.models.resnet(", 'gpu_section("03.cudnn-benchmark"'),
        r"time\.perf_counter\(\) - start read while .* GPU operation\(s\) .* still queued.*synchronize",
    ),
    "pinned buffer that is pageable": (
        "10", "torch.randn(gb, 3, 224, 224).pin_memory() for _ in range(n_chunks)",
        "torch.randn(gb, 3, 224, 224) for _ in range(n_chunks)", ("import torchvision", 'gpu_section("10.streams"'),
        r"non_blocking=True host-to-device copy on stream\d+, where a copy can only be meant to overlap, reads "
        r"pageable host memory.*pin the host tensor",
    ),
    "graph output not cloned": (
        "11", "        return static_out.clone()\n", "        return static_out\n",
        ("import subprocess", 'gpu_section("11.cuda-graph-static"'),
        r"CUDA graph replay vs eager \(the earlier call\).*beyond the tf32 tolerance",
    ),
    "peak not reset between variants": (
        "11", "    torch.cuda.reset_peak_memory_stats()\n", "", ("import subprocess", 'gpu_section("11.gpu-peak"'),
        r"max_memory_allocated\(\) returned .* previous variant's peak.*reset_peak_memory_stats",
    ),
    "ORT reads an input torch still writes": (
        "07", "        torch.cuda.synchronize()\n        half.run_with_iobinding(io)",
        "        half.run_with_iobinding(io)",
        ('model, note = cu.models.resnet("resnet18")', "onnx_path = work /", 'gpu_section("07.cuda-provider"'),
        r"ONNX Runtime input 'input'.? on ONNX Runtime's own CUDA stream reads memory that .* wrote.*synchronize",
    ),
    "switch not restored": (
        "03", "        torch.backends.cudnn.benchmark = old\n", "        pass\n",
        ("resnet, note = cu.models.resnet(", 'gpu_section("03.cudnn-benchmark"'),
        r"GPU section '03.cudnn-benchmark' left torch.backends.cudnn.benchmark = True \(it was False\).*finally",
    ),
    "host reads a non-blocking copy before its stream finished": (
        "08", "        self.stream.synchronize()  # the copies", "        pass  # the copies",
        ("digits = cu.data.load_digits_split()", "opt_b, max_b = cu.pick(", "here = tensorrt_engines.engine_metadata(",
         'gpu_section("08.build"', 'gpu_section("08.pycuda"'),
        r"pycuda runner vs torch-buffer runner differs from the baseline .*non-finite",
    ),
    "model moved to the device in place (fails in a later cell)": (
        "11", '    gmodel, _ = cu.models.resnet("resnet50", device="cuda")\n', '    gmodel = model.to("cuda")\n',
        ("import subprocess", 'gpu_section("11.gpu-peak"', "make = lambda b: torch.randn(b, 3, SIZE, SIZE)"),
        r"Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu",
    ),
}  # fmt: skip


def planted(lesson: str, shipped: str, plant: str, keep: tuple[str, ...]) -> str:
    """A copy of the lesson with the bug planted: its setup cell, its contract cells (the functions the GPU sections
    call) and the cells named in ``keep``, in the lesson's order, up to the last of them."""
    path = next((ROOT / "lessons").glob(f"{lesson}_*.py"))
    text = path.read_text()
    assert text.count(shipped) == 1, f"{path.name} changed: {shipped!r} should occur once"
    cells = run_cells.cells(text.replace(shipped, plant))
    wanted = [next(i for i, (_, src) in enumerate(cells) if needle in src) for needle in (*SETUP, *keep)]
    contract = [i for i, (_, src) in enumerate(cells) if src.startswith("# %% tags=") and '"contract"' in src[:60]]
    chosen = sorted({*wanted, *(i for i in contract if i < wanted[-1])})
    return "".join(cells[i][1] for i in chosen)


def rehearse(source: str, name: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    lesson = tmp_path / "lessons" / name
    lesson.parent.mkdir()
    lesson.write_text(source)
    env = dict(os.environ, COURSE_SMOKE="1", COURSE_REHEARSE="1", MPLBACKEND="agg", PYTHONPATH=str(ROOT),
               COURSE_RESULTS_DIR=str(tmp_path / "results"), **env)  # fmt: skip
    env.pop("COURSE_STRICT_GPU", None)
    return subprocess.run(
        [sys.executable, "-m", "scripts.run_cells", lesson.name],
        cwd=lesson.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the rehearsal stands in for a missing GPU")


@cpu_only
@pytest.mark.parametrize("kind", list(PLANTS))
def test_a_planted_bug_fails_the_rehearsal(kind, tmp_path):
    import re

    lesson, shipped, plant, keep, message = PLANTS[kind]
    name = next((ROOT / "lessons").glob(f"{lesson}_*.py")).name
    proc = rehearse(planted(lesson, shipped, plant, keep), name, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, f"{kind}: the rehearsal passed with the bug planted:\n{out[-2000:]}"
    failed = [line for line in out.splitlines() if re.match(r"cell at line \d+ of .* failed: ", line)]
    assert failed and re.search(message, failed[-1]), f"{kind}: wrong failure:\n{out[-2500:]}"


@cpu_only
def test_cpu_model_fed_cuda_tensors_fails_the_rehearsal(tmp_path):
    shipped, plant = "tiny_dev = copy.deepcopy(tiny).to(device)", "tiny_dev = tiny"
    keep = ("import torchvision", plant)
    proc = rehearse(planted("10", shipped, plant, keep), "10_streams.py", tmp_path, COURSE_REHEARSE_SCOPE="lesson")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-2000:]
    assert "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu" in out
