"""Lesson 11's CUDA code, run on the CPU against a stand-in for the ``torch.cuda`` calls it makes.

Every call into the stand-in is bound to the real function's signature (``inspect.signature(...).bind``), so a
misspelt name or a wrong argument fails here as it would on a GPU. ``gpu_peak_mb`` must synchronize, reset the
peak, read what was allocated before, run, synchronize again and read the peak. ``capture_runner`` runs against
a graph stand-in that records the torch operations issued inside ``torch.cuda.graph(g)`` and, on
``g.replay()``, re-runs them on the captured tensors and writes the results into the captured outputs, which
is what a replay does: so a runner that forgets to ``copy_`` new data into the captured input, or returns the
output buffer itself, gives wrong results here too.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import time

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.gpu_contract.lesson_code import lesson_namespace, tagged_cells

COVERS = {
    "11.gpu-peak": "gpu_peak_mb: call order and signatures of synchronize/reset_peak_memory_stats/"
    "memory_allocated/max_memory_allocated, and its arithmetic",
    "11.max-batch": "gpu_peak_mb (as above); the fit is the CPU section's, run in every CPU test",
    "11.cuda-graph-static": "capture_runner: warm-up on a side stream, capture, copy_ into the static input, "
    "replay, clone; against a replaying graph stand-in with the real signatures",
}
NOT_TESTABLE = {
    "11.allocator": "reads the CUDA caching allocator's counters (allocated, reserved, mem_get_info) and times "
    "cudaMalloc after empty_cache: only a GPU has them (its timer, host_call_ms, is tested here)",
    "11.expandable-segments": "measures the CUDA allocator's fragmentation with and without expandable segments "
    "in fresh processes: only a GPU has it",
}

MiB = 2**20


def signed(real, fake):
    """``fake`` with the real function's signature enforced."""
    sig = inspect.signature(real)

    def call(*args, **kwargs):
        sig.bind(*args, **kwargs)
        return fake(*args, **kwargs)

    return call


class _Capture(TorchFunctionMode):
    SKIP = {"__get__", "__set__", "dim", "size", "data_ptr", "numel", "__len__", "__format__", "__repr__"}

    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if getattr(func, "__name__", "") not in self.SKIP:
            self.ops.append((func, args, kwargs, out))
        return out


class FakeGraph:
    """Stand-in for torch.cuda.CUDAGraph: replay re-runs the captured ops and writes into the captured outputs."""

    def __init__(self, keep_graph: bool = False):
        inspect.signature(torch.cuda.CUDAGraph.__new__).bind(torch.cuda.CUDAGraph, keep_graph)
        self.ops: list = []
        self.replays = 0

    def replay(self):
        inspect.signature(torch.cuda.CUDAGraph.replay).bind(self)
        assert self.ops, "replay() before anything was captured"
        self.replays += 1
        new: dict[int, torch.Tensor] = {}

        def swap(v):
            if isinstance(v, torch.Tensor):
                return new.get(id(v), v)
            if isinstance(v, (list, tuple)):
                return type(v)(swap(a) for a in v)
            return v

        with torch.inference_mode():
            for func, args, kwargs, out in self.ops:
                res = func(*swap(args), **{k: swap(v) for k, v in kwargs.items()})
                if isinstance(out, torch.Tensor) and isinstance(res, torch.Tensor):
                    new[id(out)] = res
            for *_, out in self.ops:  # the captured outputs now hold the replay's results
                if isinstance(out, torch.Tensor) and id(out) in new and new[id(out)] is not out:
                    out.copy_(new[id(out)])


class FakeCuda:
    """The torch.cuda calls lesson 11's contract cells make, with the real signatures."""

    def __init__(self):
        self.log: list[str] = []
        self.allocated = 0
        self.peak = 0
        self.CUDAGraph = FakeGraph
        for name in ("synchronize", "reset_peak_memory_stats", "memory_allocated", "max_memory_allocated"):
            setattr(self, name, signed(getattr(torch.cuda, name), getattr(self, "_" + name)))
        self.current_stream = signed(torch.cuda.current_stream, lambda device=None: self._stream)
        self.stream = signed(torch.cuda.stream, lambda stream: contextlib.nullcontext())
        self._stream = self.Stream()

    def Stream(self, device=None, priority=0, **kwargs):  # noqa: N802
        inspect.signature(torch.cuda.Stream.__new__).bind(torch.cuda.Stream, device, priority, **kwargs)
        fake = self

        class S:
            def wait_stream(self, stream):
                inspect.signature(torch.cuda.Stream.wait_stream).bind(self, stream)
                fake.log.append("wait_stream")

        return S()

    @contextlib.contextmanager
    def graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", **kwargs):
        inspect.signature(torch.cuda.graph.__init__).bind(None, cuda_graph, pool, stream, capture_error_mode, **kwargs)
        with _Capture(cuda_graph.ops):
            yield

    def alloc(self, mib):
        self.log.append(f"alloc {mib}")
        self.allocated += mib * MiB
        self.peak = max(self.peak, self.allocated)

    def free(self, mib):
        self.allocated -= mib * MiB

    def _synchronize(self, device=None):
        self.log.append("synchronize")

    def _reset_peak_memory_stats(self, device=None):
        self.log.append("reset_peak_memory_stats")
        self.peak = self.allocated

    def _memory_allocated(self, device=None):
        self.log.append("memory_allocated")
        return self.allocated

    def _max_memory_allocated(self, device=None):
        self.log.append("max_memory_allocated")
        return self.peak


class FakeTorch:
    """``torch`` with ``cuda`` replaced by the stand-in."""

    def __init__(self, cuda):
        self.cuda = cuda

    def __getattr__(self, name):
        return getattr(torch, name)


def namespace(cuda, replace=None):
    preset = {"torch": FakeTorch(cuda), "time": time}
    if replace is None:
        return lesson_namespace("11", **preset)
    old, new = replace
    cells = tagged_cells("11")
    assert sum(c.count(old) for c in cells) == 1, f"{old!r} should appear once in the contract cells"
    fixed = dict(preset)
    for src in cells:
        exec(src.replace(old, new), preset)  # noqa: S102 - the lesson's code with one line changed
        preset.update(fixed)  # an exported cell's own `import torch` does not replace the stand-in
    return preset


def test_gpu_peak_mb_order_and_arithmetic():
    cuda = FakeCuda()
    cuda.alloc(100)  # the model and its input, allocated before
    cuda.log.clear()

    def work():
        cuda.alloc(30)
        cuda.free(30)
        cuda.alloc(5)

    assert namespace(cuda)["gpu_peak_mb"](work) == pytest.approx(30.0)
    assert cuda.log[:3] == ["synchronize", "reset_peak_memory_stats", "memory_allocated"]
    assert cuda.log[-2:] == ["synchronize", "max_memory_allocated"]


def test_gpu_peak_mb_plant_fails():
    """Without the reset, the peak of earlier work leaks into the measurement."""
    cuda = FakeCuda()
    cuda.alloc(500)
    cuda.free(500)
    ns = namespace(cuda, ("    torch.cuda.reset_peak_memory_stats()\n", ""))
    assert ns["gpu_peak_mb"](lambda: cuda.alloc(10)) != pytest.approx(10.0)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(inplace=True), torch.nn.Flatten()).eval()


def runner_results(ns):
    m = model()
    xs = [torch.randn(2, 3, 8, 8) for _ in range(4)]
    run = ns["capture_runner"](m, xs[0])
    outs = [run(x) for x in xs[1:]]
    with torch.inference_mode():
        refs = [m(x) for x in xs[1:]]
    return outs, refs, run


def test_capture_runner_replays_new_data():
    cuda = FakeCuda()
    outs, refs, run = runner_results(namespace(cuda))
    for out, ref in zip(outs, refs, strict=True):
        assert torch.allclose(out, ref, atol=1e-6)
    assert cuda.log.count("wait_stream") == 2  # side stream waits for the main one, and back
    with pytest.raises(ValueError):
        run(torch.randn(3, 3, 8, 8))


@pytest.mark.parametrize(
    "plant",
    [("        static_in.copy_(x)\n", ""), ("return static_out.clone()", "return static_out")],
)
def test_capture_runner_plants_fail(plant):
    outs, refs, _ = runner_results(namespace(FakeCuda(), plant))
    assert not all(torch.allclose(o, r, atol=1e-6) for o, r in zip(outs, refs, strict=True))


def test_stand_in_rejects_wrong_signatures():
    cuda = FakeCuda()
    with pytest.raises(TypeError):
        cuda.reset_peak_memory_stats("cuda:0", True)
    with pytest.raises(TypeError), cuda.graph(FakeGraph(), capture="x"):
        pass


def test_host_call_ms_times_the_host_call_with_perf_counter():
    """Issue 20: allocator calls are host-side; CUDA events around them time an empty stretch of stream."""
    cuda = FakeCuda()
    ms = namespace(cuda)["host_call_ms"](lambda: time.sleep(0.02), 3)
    assert len(ms) == 3 and min(ms) >= 19.0, ms  # the call's own wall time
    assert cuda.log.count("synchronize") == 3  # queued device work is waited for before each timed call


def test_the_allocator_section_does_not_time_host_calls_with_events():
    from tests.gpu_contract.lesson_code import lesson_path

    text = lesson_path("11").read_text()
    body = text[text.index('if cu.gpu_section("11.allocator")') :]
    body = body[: body.index("\nelse:")]
    assert not re.search(r"cu\.measure\([^#]*device=\"cuda\"", body, re.S), (
        "empty_cache()/allocation are host-side calls: time them with host_call_ms (perf_counter), not CUDA events"
    )
    assert "host_call_ms(" in body
