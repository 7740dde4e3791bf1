"""Lesson 10's stream code, run on the CPU against a recording device module (no GPU needed).

The lesson writes its pipelines against ``torch.get_device_module(device)``. Here that module is
:class:`fakegpu.streamcheck.RecordingDevice`: the very functions of the lesson's ``contract`` cells run,
every copy and kernel is logged with its stream, and the tests require the model's outputs, no unordered
access to the same memory (a race on a GPU), ``record_stream`` wherever memory crosses streams, and that the
copies really run on another stream than the compute.
"""

from __future__ import annotations

import pytest
import torch

from fakegpu.streamcheck import RecordingDevice, describe
from tests.gpu_contract.lesson_code import lesson_namespace, tagged_cells

COVERS = {
    "10.streams": "one_stream, side_stream_prefetch and double_buffered_loop: outputs, ordering, record_stream, "
    "copies on their own stream",
}
NOT_TESTABLE = {
    "10.pageable-copy": "measures how long the CUDA driver holds the CPU for a pageable vs pinned copy: only a GPU "
    "can show it",
    "10.concurrent-kernels": "measures whether the hardware scheduler runs kernels of two streams side by side: "
    "only a GPU can show it",
}

NS = lesson_namespace("10", torch=torch)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()


def run(fn, n=5):
    m = model()
    chunks = [torch.randn(2, 3, 8, 8) for _ in range(n)]
    with torch.inference_mode():
        ref = [m(c) for c in chunks]
    dev = RecordingDevice()
    with torch.inference_mode(), dev.run("cpu"):
        torch.zeros(4).add_(1)  # the caller's stream has work queued before the call (as in any real program)
        dev.entry_tick = dev.default.clock.get(dev.default.sid, 0)
        outs = fn(m, chunks, "cpu")
        torch.cat(outs)  # the caller reads the results on its stream
    for a, b in zip(outs, ref, strict=True):
        assert torch.equal(a, b)
    return dev


def used_before_the_caller_was_waited_for(dev) -> list[str]:
    """Memory allocated on the caller's stream, then used on a side stream that never waited for the caller.

    The caching allocator hands out a block as soon as it is free *in the caller's stream order*: kernels the
    caller queued earlier may still use it. A side stream must wait for the caller (wait_stream) before touching
    such memory (or the memory must be allocated on the side stream itself).
    """
    bad = []
    for k, accesses in dev.access.items():
        if dev.origin.get(k) is not dev.default:
            continue
        for a in accesses:
            if a.stream is not dev.default and a.clock.get(dev.default.sid, 0) < dev.entry_tick:
                bad.append(f"'{a.op}' on {a.stream.name}")
    return bad


@pytest.mark.parametrize("name", ["one_stream", "side_stream_prefetch", "double_buffered_loop"])
def test_lesson_pipelines_are_ordered(name):
    dev = run(NS[name])
    races = dev.races()
    assert not races, describe(races[0])
    assert not dev.missing_record_stream(), f"{name}: memory used on another stream without record_stream"
    bad = used_before_the_caller_was_waited_for(dev)
    assert not bad, f"{name}: caller-stream memory used by {bad[:2]} before that stream waited for the caller"


@pytest.mark.parametrize("name", ["side_stream_prefetch", "double_buffered_loop"])
def test_copies_run_beside_compute(name):
    dev = run(NS[name])
    copy_ops = dev.streams_used("to") | dev.streams_used("copy_")
    assert copy_ops and copy_ops.isdisjoint(dev.streams_used("conv2d")), "copies must be on their own stream"


def planted(line: str, fn: str):
    """The lesson's contract cells with ``line`` removed; returns the function ``fn`` from them."""
    cells = tagged_cells("10")
    assert sum(c.count(line) for c in cells) == 1, f"{line!r} should appear once in the lesson's contract cells"
    ns: dict = {"torch": torch}
    for src in cells:
        exec(src.replace(line, "pass"), ns)  # noqa: S102 - the lesson's code with one line removed
    return ns[fn]


def test_the_recorder_catches_a_missing_wait():
    """The lesson's prefetch with its wait_stream removed must show a race (the test can fail)."""
    assert run(planted("main.wait_stream(side)", "side_stream_prefetch")).races()


def test_the_recorder_catches_a_missing_record_stream():
    assert run(planted("x.record_stream(main)", "side_stream_prefetch")).missing_record_stream()
    assert run(planted("out.record_stream(caller)", "double_buffered_loop")).missing_record_stream()


@pytest.mark.parametrize(
    "line", ["copy_s.wait_event(freed[k])", "comp_s.wait_event(copied[k])", "caller.wait_stream(comp_s)"]
)
def test_each_wait_of_the_double_buffer_matters(line):
    assert run(planted(line, "double_buffered_loop")).races(), f"removing {line} should race"


def test_the_double_buffer_waits_for_the_caller_before_writing_its_buffers():
    """Issue 20: the buffers were allocated on the caller's stream and written on the copy stream with no wait."""
    assert not used_before_the_caller_was_waited_for(run(NS["double_buffered_loop"]))
    assert used_before_the_caller_was_waited_for(run(planted("copy_s.wait_stream(caller)", "double_buffered_loop")))


def test_the_stream_checks_run_with_the_model_on_the_device():
    """Issue 20: the CPU-resident tiny_cnn was fed CUDA tensors. The lesson's own check cells, run with
    device='cuda' on the rehearsal's stand-ins (placement checked as CUDA does), must pass."""
    import copy

    import course_utils as cu
    from course_utils.techniques import pipeline
    from fakegpu.standins import rehearsal
    from tests.gpu_contract.lesson_code import lesson_path

    cells = lesson_path("10").read_text().split("# %%")
    picked = [c.split("\n", 1)[1] for c in cells if "host_chunks = [" in c or "double_buffered_loop(tiny" in c]
    assert len(picked) == 2, "expected the side-stream check cell and the double-buffer check cell"
    ns = lesson_namespace("10", torch=torch)
    ns.update(copy=copy, pipeline=pipeline, cu=cu, BATCH=2, SIZE=16, N_BATCHES=3, device=torch.device("cuda"))
    rehearsal.activate()
    try:
        for src in picked:
            exec(compile(src, "lesson 10", "exec"), ns)  # noqa: S102 - the lesson's own cells
    finally:
        counts = rehearsal.deactivate()
    assert counts.get("placement checks", 0) > 0 and not counts.get("placement violations")
