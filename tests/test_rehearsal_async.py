"""The stand-in GPU is asynchronous: queued work, copies that land later, a device clock, and the rules that follow.

Each rule: one right use, and the mistake it exists for (the message names the fix). Device time is modelled
(fakegpu.standins.clock), so the verdicts about overlap depend on the operators issued, not on this
machine's load: the kernels are long enough on the stand-in's clock that launching them never dominates.
"""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
import torch

from course_utils.sections import gpu_sections
from course_utils.supply import modes
from fakegpu.standins.streams import MODEL
from fakegpu.standins.tensor import RehearsalError
from scripts import run_cells

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the rehearsal stands in for a missing GPU")


def test_work_is_queued_until_something_waits_for_it(gpu):
    x = torch.ones(1024, device="cuda")
    y = x * 3
    assert MODEL.pending() >= 1  # issued, not computed: a GPU would still be running it
    gpu.synchronize()
    assert MODEL.pending() == 0 and float(y.sum()) == 3072.0
    z = y + 1  # a host read waits for the stream: the value is there
    assert z[0].item() == 4.0


def test_a_timer_that_does_not_synchronize_is_caught(gpu):
    a = torch.randn(256, 256, device="cuda")
    gpu.synchronize()
    t0 = time.perf_counter()
    a @ a
    with pytest.raises(RehearsalError, match="wall-clock timer around GPU work measures only the launch"):
        (time.perf_counter() - t0) * 1000
    start, end = gpu.Event(enable_timing=True), gpu.Event(enable_timing=True)
    gpu.synchronize()
    t0 = time.perf_counter()
    start.record()
    a @ a
    end.record()
    gpu.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1000  # synchronized: allowed, and it waited for the modelled time
    assert wall_ms >= start.elapsed_time(end) > 0


def test_a_non_blocking_copy_to_the_host_lands_when_the_host_waits(gpu):
    x = torch.arange(8.0, device="cuda") + 1
    h = x.to("cpu", non_blocking=True)
    assert h.is_pinned() and torch.isnan(h).all()  # read before the stream finished: poison, not the values
    gpu.current_stream().synchronize()
    assert torch.equal(h, torch.arange(8.0) + 1)
    buf = torch.empty(8).pin_memory()
    buf.copy_(x * 2, non_blocking=True)
    assert torch.isnan(buf).all()
    gpu.synchronize()
    assert torch.equal(buf, (torch.arange(8.0) + 1) * 2)


def test_a_pinned_host_buffer_is_read_when_the_copy_runs(gpu):
    host = torch.ones(4).pin_memory()
    dev = host.to("cuda", non_blocking=True)
    host.fill_(7.0)  # reused before the copy ran: the GPU copies what is there when it gets to it
    assert torch.equal(dev.cpu(), torch.full((4,), 7.0))


def test_non_blocking_from_pageable_memory_is_reported(gpu):
    from fakegpu.standins.tensor import STATE

    host = torch.ones(1 << 10)
    assert torch.equal(host.to("cuda", non_blocking=True).cpu(), host)  # synchronous, as on a GPU: reported
    assert any("pageable host memory ran synchronously" in n for n in STATE.notes)
    side = gpu.Stream()
    side.wait_stream(gpu.current_stream())
    with gpu.stream(side), pytest.raises(RehearsalError, match="on stream.*meant to overlap"):
        torch.empty(1 << 10, device="cuda").copy_(host, non_blocking=True)
    assert torch.equal(host.pin_memory().to("cuda", non_blocking=True).cpu(), host)  # pinned: fine
    assert torch.equal(host.to("cuda").cpu(), host)  # blocking: fine


@pytest.fixture
def slow_gpu(gpu, monkeypatch):
    """The stand-in GPU ten times slower: each kernel and copy lasts tens of milliseconds of device time, so a
    scheduling delay of a few milliseconds on a loaded 2-core machine (issuing is host work) cannot turn an
    overlap verdict around."""
    from fakegpu.standins import clock

    for name, rate in list(clock.RATES.items()):
        monkeypatch.setitem(clock.RATES, name, rate / 10)
    return gpu


def _elapsed_ms(gpu, fn) -> float:
    gpu.synchronize()
    start, end = gpu.Event(enable_timing=True), gpu.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def test_streams_run_side_by_side_on_the_device_clock_and_one_stream_does_not(slow_gpu):
    gpu = slow_gpu
    narrow = [torch.randn(1, 64, 16384, device="cuda") for _ in range(8)]  # few outputs, many FLOP: narrow kernels
    other = torch.randn(1, 16384, 64, device="cuda")
    s1, s2, main = gpu.Stream(), gpu.Stream(), gpu.current_stream()

    def one() -> None:
        for a in narrow:
            torch.bmm(a, other)

    def two() -> None:
        s1.wait_stream(main)
        s2.wait_stream(main)
        for i, a in enumerate(narrow):
            with gpu.stream(s1 if i % 2 else s2):
                torch.bmm(a, other)
        main.wait_stream(s1)
        main.wait_stream(s2)

    serial, parallel = _elapsed_ms(gpu, one), _elapsed_ms(gpu, two)
    assert parallel < 0.7 * serial, (serial, parallel)
    wide = [torch.randn(512, 512, device="cuda") for _ in range(4)]  # each fills the stand-in GPU alone
    serial_w = _elapsed_ms(gpu, lambda: [a @ a for a in wide])

    def two_wide() -> None:
        s1.wait_stream(main)
        s2.wait_stream(main)
        for i, a in enumerate(wide):
            with gpu.stream(s1 if i % 2 else s2):
                a @ a
        main.wait_stream(s1)
        main.wait_stream(s2)

    assert _elapsed_ms(gpu, two_wide) > 0.9 * serial_w


def test_a_copy_on_a_side_stream_overlaps_compute_and_on_the_same_stream_it_does_not(slow_gpu):
    gpu = slow_gpu
    host = torch.randn(4 << 20).pin_memory()  # 16 MiB: tens of ms on the slowed stand-in copy engine
    dst = torch.empty_like(host, device="cuda")
    a = torch.randn(1, 64, 8192, device="cuda")  # about as long on the stand-in's clock as the copy
    b = torch.randn(1, 8192, 64, device="cuda")
    side, main = gpu.Stream(), gpu.current_stream()

    def serialized() -> None:
        dst.copy_(host, non_blocking=True)
        torch.bmm(a, b)

    def overlapped() -> None:
        side.wait_stream(main)
        with gpu.stream(side):
            dst.copy_(host, non_blocking=True)
        torch.bmm(a, b)
        main.wait_stream(side)

    assert _elapsed_ms(gpu, overlapped) < 0.8 * _elapsed_ms(gpu, serialized)


def _warm_and_capture(gpu, model, x, warm_mode):
    side = gpu.Stream()
    side.wait_stream(gpu.current_stream())
    with gpu.stream(side), warm_mode():
        for _ in range(2):
            model(x)
    gpu.current_stream().wait_stream(side)
    g = gpu.CUDAGraph()
    with torch.inference_mode(), gpu.graph(g):
        out = model(x)
    return g, out


def test_graph_replay_rewrites_the_static_output(gpu):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval().cuda()
    static_in = torch.randn(2, 8, device="cuda")
    g, static_out = _warm_and_capture(gpu, model, static_in, torch.no_grad)  # grad-mode warm-up: accepted
    assert torch.isnan(static_out.cpu()).all()  # captured work has not run: the output holds no result yet
    results = []
    for _ in range(2):
        static_in.copy_(torch.randn(2, 8, device="cuda"))
        g.replay()
        results.append(static_out)  # not cloned: the next replay overwrites it
    with torch.inference_mode():
        want = model(static_in)
    assert torch.equal(results[0].cpu(), want.cpu())  # the first result now shows the second replay's values


def test_a_static_input_freed_after_capture_is_caught(gpu):
    model = torch.nn.Linear(8, 8).eval().cuda()
    static_in = torch.randn(2, 8, device="cuda")
    g, _ = _warm_and_capture(gpu, model, static_in, torch.inference_mode)
    g.replay()
    del static_in
    with pytest.raises(RehearsalError, match="static input.*freed after capture"):
        g.replay()


def test_printing_inside_a_capture_is_caught(gpu):
    model = torch.nn.Linear(8, 8).eval().cuda()
    x = torch.randn(2, 8, device="cuda")
    side = gpu.Stream()
    side.wait_stream(gpu.current_stream())
    with gpu.stream(side), torch.inference_mode():
        model(x)
    gpu.current_stream().wait_stream(side)
    with pytest.raises(RehearsalError, match="capturing: a host read .printing"), gpu.graph(gpu.CUDAGraph()):
        print(model(x))


def test_a_peak_read_without_a_reset_between_variants_is_caught(gpu):
    gpu.synchronize()
    gpu.reset_peak_memory_stats()
    big = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    del big
    first = gpu.max_memory_allocated()
    small = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")  # the next variant, smaller
    del small
    with pytest.raises(RehearsalError, match="previous variant's peak.*reset_peak_memory_stats"):
        gpu.max_memory_allocated()
    gpu.reset_peak_memory_stats()
    kept = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    assert gpu.max_memory_allocated() < first and kept.numel() == 1 << 20


def test_a_cuda_index_into_a_cpu_tensor_and_a_second_gpu_are_refused(gpu):
    cpu_t, idx = torch.arange(10.0), torch.tensor([1, 2], device="cuda")
    with pytest.raises(RehearsalError, match="indices should be either on cpu or on the same device"):
        cpu_t[idx]
    assert torch.equal(torch.arange(10.0, device="cuda")[torch.tensor([1, 2])].cpu(), torch.tensor([1.0, 2.0]))
    for device in ("cuda:1", "cuda:3"):
        with pytest.raises(RehearsalError, match="invalid device ordinal"):
            torch.ones(2, device=device)
        with pytest.raises(RehearsalError, match="invalid device ordinal"):
            torch.ones(2).to(device)
    with pytest.raises(RehearsalError, match="invalid device ordinal"):
        gpu.set_device(1)


def test_pinned_cache_and_allocation_history(gpu, tmp_path):
    for _ in range(2):
        p = torch.randn(1000).pin_memory()
        del p
    stats = gpu.host_memory_stats()
    assert stats["num_host_alloc"] == 1 and stats["allocations.current"] == 1  # the block was reused
    gpu.memory._record_memory_history(max_entries=100)
    t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    del t
    path = tmp_path / "snap.pickle"
    gpu.memory._dump_snapshot(str(path))
    gpu.memory._record_memory_history(enabled=None)
    trace = pickle.loads(path.read_bytes())["device_traces"][0]
    assert [e["action"] for e in trace] == ["alloc", "free_completed"] and trace[0]["size"] == 1 << 20


def test_ort_reads_bound_inputs_in_stream_order(gpu, tmp_path):
    import onnxruntime as ort

    from tests.test_rehearsal import _bind, _onnx

    model, path = _onnx(tmp_path)
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    own = ort.InferenceSession(str(path), providers=cuda)
    x, out = torch.randn(2, 4, device="cuda") * 2, torch.empty(2, 3, device="cuda")
    with pytest.raises(RehearsalError, match="ONNX Runtime input 'x'.*torch.cuda.synchronize\\(\\)"):
        _bind(own, x, out)  # torch's write may still be queued when ORT's own stream reads
    shared = ort.InferenceSession(
        str(path), providers=cuda, provider_options=[{"user_compute_stream": str(gpu.current_stream().cuda_stream)}, {}]
    )
    with torch.inference_mode():  # on torch's stream, ORT runs after torch's queued work: no synchronize needed
        torch.testing.assert_close(_bind(shared, x, out).cpu(), model(x.cpu()))


def test_pycuda_stand_in_copies_are_asynchronous(gpu):
    import pycuda.autoprimaryctx  # noqa: F401 - the rehearsal's stand-in (pycuda is not installed here)
    import pycuda.driver as cuda

    host = cuda.pagelocked_empty((4,), np.float32)
    host[:] = np.arange(4, dtype=np.float32)
    dev, back, stream = cuda.mem_alloc(host.nbytes), cuda.pagelocked_empty((4,), np.float32), cuda.Stream()
    cuda.memcpy_htod_async(dev, host, stream)
    cuda.memcpy_dtoh_async(back, dev, stream)
    assert np.isnan(back).all()  # queued: read before synchronize, no result
    stream.synchronize()
    assert np.array_equal(back, host)
    with pytest.raises(RehearsalError, match="second CUDA context"):
        import pycuda.autoinit  # noqa: F401


def test_a_switch_left_changed_fails_its_section(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_REHEARSE", "1")
    monkeypatch.setattr(gpu_sections, "_HOOKS", {})
    lesson = tmp_path / "52_switch.py"
    lesson.write_text(
        "# %%\nimport torch\nimport course_utils as cu\n"
        "# %%\nif cu.gpu_section('52.restored'):\n    old = torch.backends.cudnn.benchmark\n"
        "    try:\n        torch.backends.cudnn.benchmark = True\n"
        "    finally:\n        torch.backends.cudnn.benchmark = old\n"
        "# %%\nif cu.gpu_section('52.left'):\n    torch.backends.cuda.matmul.allow_tf32 = True\n"
    )
    try:
        assert run_cells.run(lesson) == 1
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    rows = {r["section"]: r for r in modes.read_sections()}
    assert rows["52.restored"]["status"] == "completed"
    assert rows["52.left"]["status"] == "failed" and "allow_tf32 = True (it was False)" in rows["52.left"]["reason"]


def test_every_process_wide_switch_is_compared_at_the_cells_end():
    from fakegpu.standins import switches

    assert set(switches.READERS) == {
        "torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32",
        "torch.get_float32_matmul_precision()", "torch.backends.cudnn.benchmark",
        "torch.backends.cudnn.deterministic", "torch.backends.cudnn.enabled",
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
        "torch.backends.cuda.flash_sdp_enabled()", "torch.backends.cuda.mem_efficient_sdp_enabled()",
        "torch.backends.cuda.math_sdp_enabled()", "torch.are_deterministic_algorithms_enabled()",
        "torch.get_default_dtype()", "torch.is_grad_enabled()",
    }  # fmt: skip
    before = switches.snapshot()
    switches.check("53.same", before)
    old = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = not old
        with pytest.raises(
            RehearsalError, match=rf"'53.left' left torch.backends.cudnn.benchmark = {not old} \(it was"
        ):
            switches.check("53.left", before)
    finally:
        torch.backends.cudnn.benchmark = old
    switches.check("53.restored", before)


def test_an_ort_cuda_graph_replayed_with_a_buffer_at_a_new_address_is_caught(gpu, tmp_path):
    import onnxruntime as ort

    from tests.test_rehearsal import _bind, _onnx

    _, path = _onnx(tmp_path)
    graphed = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
                                   provider_options=[{"enable_cuda_graph": "1"}, {}])  # fmt: skip
    x, out = torch.randn(2, 4, device="cuda"), torch.empty(2, 3, device="cuda")
    gpu.synchronize()
    _bind(graphed, x, out)
    _bind(graphed, x, out)  # the same shapes at the same addresses: the replay is right
    moved_x, moved_out = x.clone(), torch.empty(2, 3, device="cuda")
    gpu.synchronize()
    with pytest.raises(RehearsalError, match=r"captured its graph with 'x' of shape \(2, 4\) at 0x"):
        _bind(graphed, moved_x, out)  # same shape, new address: ORT would read the old buffer
    with pytest.raises(RehearsalError, match=r"captured its graph with 'y' of shape \(2, 3\) at 0x"):
        _bind(graphed, x, moved_out)


def test_stream_and_event_synchronize_wait_for_the_device_time_and_wait_event_orders_it(slow_gpu):
    """A host wait on one stream (Stream.synchronize, Event.synchronize) lasts until that stream's modelled device
    time; a stream that waits for an event starts its later work no earlier than the event's time. Both bounds
    only hold for the right rule: the broken one reads the launch time (a few ms against hundreds modelled)."""
    gpu = slow_gpu
    a = torch.randn(512, 512, device="cuda")  # about 100 ms per product on the slowed stand-in
    side, main = gpu.Stream(), gpu.current_stream()
    for how in ("stream", "event"):
        gpu.synchronize()
        side.wait_stream(main)
        t0 = time.perf_counter()
        with gpu.stream(side):
            start, end = gpu.Event(enable_timing=True), gpu.Event(enable_timing=True)
            start.record()
            a @ a
            a @ a
            end.record()
        main.wait_event(end)
        after = gpu.Event(enable_timing=True)
        after.record()  # on main, after its wait for the side stream's event
        side.synchronize() if how == "stream" else end.synchronize()
        waited_ms = (time.perf_counter() - t0) * 1000
        modelled = start.elapsed_time(end)
        assert modelled > 100 and waited_ms >= modelled, (how, modelled, waited_ms)
        gpu.synchronize()
        assert start.elapsed_time(after) >= modelled, how


def test_copy_cost_is_the_pinned_or_pageable_rate_plus_latency():
    from fakegpu.standins import clock

    pinned, pageable = clock.RATES["pinned"], clock.RATES["pageable"]
    assert pinned == 3 * pageable  # the stand-in's model: pinned copies three times as fast
    assert clock.copy_cost(int(pinned), True) == pytest.approx(clock.COPY_LATENCY_S + 1.0, rel=1e-12)
    assert clock.copy_cost(int(pageable), False) == pytest.approx(clock.COPY_LATENCY_S + 1.0, rel=1e-12)
    assert clock.copy_cost(0, False) == clock.COPY_LATENCY_S


def test_the_pinned_cache_rounds_up_to_a_power_of_two(gpu):
    for nbytes, block in ((4096, 4096), (4097, 8192), (1, 1)):
        t = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        before = gpu.host_memory_stats()["active_bytes.current"]
        del t
        assert before - gpu.host_memory_stats()["active_bytes.current"] == block, nbytes
