"""GPU bugs planted in a copy of a lesson make its rehearsal fail, each with a message that names the fix.

One plant per kind of bug that gives wrong numbers rather than an error on a GPU (issue 29): a timer that does
not synchronize, a "pinned" buffer that is pageable, a CUDA-graph output returned without a clone, a peak read
without a reset between variants, ONNX Runtime reading an input torch has not finished writing, a global switch
(cudnn.benchmark) not restored, a non-blocking device-to-host copy read before its stream finished, CUDA events
recorded in the wrong order (lesson 01's timer: a negative time, issue 41); and a model
moved to the device in place, whose damage shows in a later cell, which is why the suite rehearses whole lessons.
Also the issue-20 break of lesson 10 (a CPU model fed the stream code's CUDA tensors), rehearsed as on a GPU
machine (``COURSE_REHEARSE_SCOPE=lesson``).

Each test rehearses a copy of the lesson's code cell by cell: its setup cell, its contract cells (the functions
the sections call), the cells that make what the planted section uses, the planted section and, for damage that
shows later, the later cell (the measurements and exercises in between are left out to keep the test short);
the shipped lesson passes the whole-lesson run of ``tests/test_lessons_as_scripts.py``.

The rules issue 41's GPU audit found missing are tested in process, on the stand-in (no lesson ships those
mistakes): a peak that holds cuDNN's autotuning workspace, SDPA backends that refuse FP32 or a mask, events recorded
in reverse order, a CUDA profile of work that ran on the CPU, TF32 switched on after the timed calls. Each has a
helper used right (it passes) and with the bug planted (the stand-in names the mistake).
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
    "CUDA events recorded in the wrong order": (
        "01", "            start.record()\n            fn()\n            end.record()\n",
        "            end.record()\n            fn()\n            start.record()\n",
        ('if cu.gpu_section("01.gpu-sync")',),
        r"start\.elapsed_time\(end\) = -\d+\.\d+ ms: the end event was recorded before the start event",
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


# The rules of issue 41's GPU audit, in process on the stand-in (no lesson ships these mistakes): each a helper used
# right (it passes) and with the bug planted (the stand-in names the mistake).
@pytest.fixture
def fp32_switches():
    """TF32 off and cuDNN's benchmark off for the test, whatever an earlier test left; restored afterwards."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
             torch.get_float32_matmul_precision())  # fmt: skip
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.backends.cudnn.benchmark = saved[2]
        torch.set_float32_matmul_precision(saved[3])


def _peak_mib(model, x, warmup: bool) -> float:
    """model(x)'s peak memory on the GPU; ``warmup=False`` is the planted bug (the first call is the one measured)."""
    with torch.inference_mode():
        if warmup:
            model(x)
            torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        model(x)
        torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


@cpu_only
def test_cudnn_autotuning_workspace_shows_in_a_peak(gpu, fp32_switches):
    from fakegpu.standins import kernels
    from fakegpu.standins.tensor import STATE, RehearsalError

    kernels.forget_autotuning()
    conv = torch.nn.Conv2d(3, 8, 3).to("cuda")
    off = _peak_mib(conv, torch.randn(2, 3, 30, 30, device="cuda"), warmup=False)  # benchmark off: no search
    torch.backends.cudnn.benchmark = True
    assert _peak_mib(conv, torch.randn(2, 3, 30, 30, device="cuda"), warmup=True) == pytest.approx(off)
    with pytest.raises(RehearsalError, match=r"max_memory_allocated\(\) returned .* MiB, a peak set by .* MiB of "
                       r"cuDNN's algorithm search for the first conv2d of input 2x3x32x32 under "
                       r"torch.backends.cudnn.benchmark=True.*warm-up call"):  # fmt: skip
        _peak_mib(conv, torch.randn(2, 3, 32, 32, device="cuda"), warmup=False)
    # the workspace: AUTOTUNE_WORKSPACE x (input + output bytes), on top of what is live, for the new shape only
    x = torch.randn(2, 3, 34, 34, device="cuda")
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        y = conv(x)
    assert STATE.peak - STATE.allocated == kernels.AUTOTUNE_WORKSPACE * (x.nbytes + y.nbytes)
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        y2 = conv(x)  # the same shape again: its algorithm is cached
    assert STATE.peak == STATE.allocated and y2.shape == y.shape
    # benchmark toggled between measurement and use: measured off (no search), used on (the search runs then)
    torch.backends.cudnn.benchmark = False
    x_new = torch.randn(2, 3, 36, 36, device="cuda")
    _peak_mib(conv, x_new, warmup=True)
    torch.backends.cudnn.benchmark = True
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        conv(x_new)
    with pytest.raises(RehearsalError, match="cuDNN's algorithm search for the first conv2d of input 2x3x36x36"):
        torch.cuda.max_memory_allocated()


def _attend(q, k, v, mask=None, backends=None, **kw):
    """Attention under ``sdpa_kernel(backends)`` (all backends when None)."""
    import contextlib

    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backends) if backends else contextlib.nullcontext(), torch.inference_mode():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


@cpu_only
def test_sdpa_backends_refuse_what_cuda_refuses(gpu):
    from torch.nn.attention import SDPBackend

    from fakegpu.standins import rehearsal

    flash, efficient = [SDPBackend.FLASH_ATTENTION], [SDPBackend.EFFICIENT_ATTENTION]
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 16, 64) for _ in range(3))
    mask = torch.rand(16, 16) > 0.3
    mask[:, 0] = True
    gq, gk, gv, gmask = (t.to("cuda") for t in (q, k, v, mask))
    h = [t.half() for t in (gq, gk, gv)]
    # right uses: FP16 without a mask on flash; FP32 with a mask on efficient attention; values as torch's on the CPU
    assert _attend(*h, backends=flash).shape == (1, 4, 16, 64)
    torch.testing.assert_close(_attend(gq, gk, gv, gmask, efficient).cpu(), _attend(q, k, v, mask), rtol=1e-5,
                               atol=1e-5)  # fmt: skip
    assert rehearsal.checks()["SDPA calls on the flash kernel"] == 1
    assert rehearsal.checks()["SDPA calls on the efficient kernel"] == 1
    # planted: flash forced on FP32, on an explicit mask, on a causal call with fewer queries than keys
    with pytest.raises(RuntimeError, match=r"No available kernel\. Aborting execution\..*flash: it needs FP16 or "
                       r"BF16 inputs \(got float32\).*math: disabled"):  # fmt: skip
        _attend(gq, gk, gv, backends=flash)
    with pytest.raises(RuntimeError, match=r"No available kernel.*flash: it takes no attn_mask"):
        _attend(*h, gmask, flash)
    with pytest.raises(RuntimeError, match=r"No available kernel.*flash: is_causal with 4 queries and 16 keys"):
        _attend(h[0][:, :, :4], h[1], h[2], backends=flash, is_causal=True)
    # efficient attention: head dims divisible by 4 (FP32) or 8 (FP16), not BF16-only like flash
    odd = torch.randn(1, 4, 16, 20, device="cuda")
    assert _attend(odd, odd, odd, backends=efficient).shape == (1, 4, 16, 20)
    with pytest.raises(RuntimeError, match=r"efficient: head dims .* divisible by 8 \(got 20, 20, 20\)"):
        _attend(odd.half(), odd.half(), odd.half(), backends=efficient)
    assert rehearsal.checks()["SDPA calls with no available kernel"] == 4
    # default backends: FP32 with a boolean mask and grouped-query heads runs efficient attention, values as on CPU
    kv = (k[:, :2], v[:, :2])
    out = _attend(gq, *(t.to("cuda") for t in kv), gmask, enable_gqa=True)
    torch.testing.assert_close(out.cpu(), _attend(q, *kv, mask, enable_gqa=True), rtol=1e-5, atol=1e-5)
    assert rehearsal.checks()["SDPA calls on the efficient kernel"] == 3  # the mask, the head dim of 20, this one


def _event_ms(fn, reverse: bool = False) -> float:
    """fn's device time between two CUDA events; ``reverse=True`` is the planted bug (end recorded first)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first, last = (end, start) if reverse else (start, end)
    first.record()
    fn()
    last.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


@cpu_only
def test_elapsed_time_of_reversed_events_is_caught(gpu):
    from fakegpu.standins.tensor import RehearsalError

    a = torch.randn(256, 256, device="cuda")
    assert _event_ms(lambda: a @ a) > 0
    with pytest.raises(RehearsalError, match=r"start\.elapsed_time\(end\) = -\d+\.\d+ ms: the end event was recorded "
                       r"before the start event on default.*wrong order"):  # fmt: skip
        _event_ms(lambda: a @ a, reverse=True)
    # events of two streams may end in either order (overlap): a negative time there is CUDA's answer, returned
    side = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        b = a @ a
        start.record()
    end.record()  # the default stream is idle: this point comes before the side stream's
    torch.cuda.synchronize()
    assert start.elapsed_time(end) < 0 and b.shape == a.shape


def _device_us(model, x) -> float:
    """The device time a CUDA-activity profile of model(x) records."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model(x)
    return sum(e.self_device_time_total for e in prof.key_averages())


@cpu_only
def test_a_cuda_profile_records_device_events_only_for_gpu_work(gpu):
    from fakegpu.standins import rehearsal

    model, x = torch.nn.Linear(64, 64), torch.randn(8, 64)
    rehearsal.take_notes()
    assert _device_us(model, x) == 0  # planted: the model and input left on the CPU: no CUDA events
    assert any("recorded no CUDA kernel: the profiled work ran on the CPU" in n for n in rehearsal.take_notes())
    assert rehearsal.checks()["profiles asking for CUDA activity that recorded none"] == 1
    gpu_model = model.to("cuda")
    assert _device_us(gpu_model, x.to("cuda")) > 0
    assert not rehearsal.take_notes() and rehearsal.checks()["profiles with device activity"] == 2


def _tf32_variant(a, b, set_after: bool = False):
    """The matrix products of a variant timed as 'tf32'; ``set_after=True`` is the planted bug (the switch is
    turned on after the timed calls)."""
    from fakegpu.standins import kernels

    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not set_after
        with kernels._recording() as calls:
            for _ in range(3):
                a @ b
            torch.cuda.synchronize()
        torch.backends.cuda.matmul.allow_tf32 = True
        return calls
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@cpu_only
def test_tf32_in_force_at_the_call_is_recorded(gpu, fp32_switches):
    from fakegpu.standins import kernels
    from fakegpu.standins.tensor import RehearsalError

    a = torch.randn(32, 32, device="cuda")
    kernels._require(_tf32_variant(a, a), "tf32", "variant 'tf32'")
    with pytest.raises(RehearsalError, match=r"variant 'tf32' is labelled tf32, but 3 of its 3 matrix "
                       r"products/convolutions ran in fp32 \(mm, float32\): at the call "
                       r"torch.backends.cuda.matmul.allow_tf32 = False.*before the timed calls"):  # fmt: skip
        kernels._require(_tf32_variant(a, a, set_after=True), "tf32", "variant 'tf32'")
    # the switches at the call decide, not those when the function was defined; convolutions read cuDNN's switch
    torch.backends.cuda.matmul.allow_tf32 = True
    fn = lambda: a @ a  # noqa: E731
    torch.backends.cuda.matmul.allow_tf32 = False
    conv = torch.nn.Conv2d(3, 4, 3).to("cuda")
    with kernels._recording() as calls, torch.inference_mode():
        fn()
        torch.backends.cudnn.allow_tf32 = True
        conv(torch.randn(1, 3, 8, 8, device="cuda"))
        fn().half() @ a.half()
    expected = [("matmul", "fp32"), ("conv2d", "tf32"), ("matmul", "fp32"), ("matmul", "fp16")]  # inference: unsplit
    assert [(c.op, c.precision) for c in calls] == expected
    with pytest.raises(RehearsalError, match="no matrix product or convolution ran on the stand-in GPU"):
        kernels._require([], "tf32", "variant 'tf32'")
