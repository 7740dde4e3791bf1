"""Lesson 06's GPU section, run on CPU: the CUDA-graph capture the learner reads, against a strict stand-in.

`capture_cuda_graph` and `replay` (cells tagged "contract") run with `torch.cuda` replaced by a fake that
offers only names that exist in the real `torch.cuda` (same classes, methods and call signatures, checked
with `inspect.signature` against the installed torch), keeps track of streams, and records the operators run
inside `torch.cuda.graph(...)` so that `graph.replay()` re-executes them into the SAME output tensors, the
way a CUDA graph writes into its static buffers. Tensors are CPU tensors.
"""

from __future__ import annotations

import contextlib
import inspect
import types

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "06.cuda-graphs": "capture_cuda_graph + replay run on CPU against a signature-checked fake torch.cuda that "
    "replays the captured operators into the static output: parity with eager, static buffers overwritten, "
    "warm-up on a side stream with wait_stream both ways (the torch.compile modes are not run)",
}
NOT_TESTABLE = {
    "06.compile-cuda": "torch.compile's CUDA modes (reduce-overhead, max-autotune) generate Triton kernels that only a "
    "GPU runs",
}

REAL = torch.cuda


def _bind(real, *args, **kwargs) -> None:
    """Raise TypeError when the call would not match the real function's signature."""
    inspect.signature(real).bind(*args, **kwargs)


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class _Strict:
    """Attribute access limited to what the real class has; names the fake does not model raise clearly."""

    _real: type

    def __getattr__(self, name):
        if hasattr(self._real, name):
            raise NotImplementedError(f"the contract fake does not model {self._real.__name__}.{name}")
        raise AttributeError(f"{self._real.__name__} has no attribute {name!r} (real torch.cuda API)")


class FakeStream(_Strict):
    _real = REAL.Stream

    def __init__(self, fake, device=None, priority=0, **kwargs) -> None:
        _bind(REAL.Stream, device, priority, **kwargs)
        self.fake = fake

    def wait_stream(self, stream) -> None:
        _bind(REAL.Stream.wait_stream, self, stream)
        assert isinstance(stream, FakeStream), "wait_stream takes a stream"
        self.fake.events.append(("wait", self, stream))


class FakeGraph(_Strict):
    _real = REAL.CUDAGraph

    def __init__(self, *args, **kwargs) -> None:
        _bind(REAL.CUDAGraph, *args, **kwargs)
        self.ops: list = []
        self.captured = False

    def replay(self) -> None:
        assert self.captured, "replay() before the graph was captured"
        with torch.no_grad():
            for func, args, kwargs, out in self.ops:
                new = func(*args, **kwargs)
                for old_t, new_t in zip(tree_flatten(out)[0], tree_flatten(new)[0], strict=True):
                    if isinstance(old_t, torch.Tensor) and old_t is not new_t:
                        old_t.copy_(new_t)


class FakeCuda(types.SimpleNamespace):
    def __init__(self) -> None:
        super().__init__()
        self.events: list = []
        self.default = FakeStream(self)
        self.current = self.default
        self.side_ops = 0

    def __getattr__(self, name):
        if hasattr(REAL, name):
            raise NotImplementedError(f"the contract fake does not model torch.cuda.{name}")
        raise AttributeError(f"module 'torch.cuda' has no attribute {name!r}")

    def Stream(self, *args, **kwargs):  # noqa: N802 - the real name
        return FakeStream(self, *args, **kwargs)

    def current_stream(self, device=None):
        _bind(REAL.current_stream, device)
        return self.current

    @contextlib.contextmanager
    def stream(self, stream):
        _bind(REAL.stream, stream)
        previous, self.current = self.current, stream
        rec = _Recorder()
        with rec:
            yield
        self.side_ops += len(rec.ops) if stream is not self.default else 0
        self.events.append(("ran on side stream", stream, len(rec.ops)))
        self.current = previous

    def CUDAGraph(self, *args, **kwargs):  # noqa: N802 - the real name
        return FakeGraph(*args, **kwargs)

    @contextlib.contextmanager
    def graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", **kwargs):
        _bind(REAL.graph.__init__, None, cuda_graph, pool, stream, capture_error_mode, **kwargs)
        assert isinstance(cuda_graph, FakeGraph), "torch.cuda.graph(...) needs a torch.cuda.CUDAGraph()"
        self.events.append(("capture", cuda_graph))
        rec = _Recorder()
        with rec:
            yield
        cuda_graph.ops, cuda_graph.captured = rec.ops, True


class TorchWithFakeCuda(types.ModuleType):
    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__("torch")
        self.cuda = cuda

    def __getattr__(self, name):
        return getattr(torch, name)


@pytest.fixture(scope="module")
def lesson():
    return lesson_namespace("06")


def _setup(ns):
    fake = FakeCuda()
    ns["torch"] = TorchWithFakeCuda(fake)  # the lesson's functions look `torch` up in this namespace
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 5),
    ).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
    return ns, fake, model


def test_capture_and_replay_write_the_static_output(lesson):
    ns, fake, model = _setup(lesson)
    example = torch.randn(2, 3, 8, 8)
    graph, static_in, static_out = ns["capture_cuda_graph"](model, example)
    with torch.no_grad():
        torch.testing.assert_close(static_out, model(example))
        assert static_in is not example, "capture from a copy: the caller's tensor is not the static buffer"
        kept = static_out.clone()
        x2 = torch.randn(2, 3, 8, 8)
        out = ns["replay"](graph, static_in, static_out, x2)
        assert out.data_ptr() == static_out.data_ptr(), "replay returns the static output buffer"
        torch.testing.assert_close(out, model(x2))
        assert not torch.equal(out, kept), "the next replay overwrites the previous result"


def test_warm_up_runs_on_a_side_stream_before_capture(lesson):
    ns, fake, model = _setup(lesson)
    ns["capture_cuda_graph"](model, torch.randn(2, 3, 8, 8), warmup=2)
    kinds = [e[0] for e in fake.events]
    assert fake.side_ops > 0, "warm-up ran no operators on the side stream"
    first_wait, ran, second_wait, capture = kinds.index("wait"), kinds.index("ran on side stream"), None, None
    second_wait = kinds.index("wait", ran)
    capture = kinds.index("capture")
    assert first_wait < ran < second_wait < capture
    side = fake.events[ran][1]
    assert fake.events[first_wait][1] is side and fake.events[first_wait][2] is fake.default
    assert fake.events[second_wait][1] is fake.default and fake.events[second_wait][2] is side


def test_the_fake_is_strict():
    fake = FakeCuda()
    with pytest.raises(AttributeError):
        fake.CudaGraph()  # noqa: B018 - a misspelt class must fail
    with pytest.raises(AttributeError):
        fake.CUDAGraph().launch()
    with pytest.raises(TypeError):
        with fake.graph(fake.CUDAGraph(), bogus=1):
            pass
    with pytest.raises(NotImplementedError):
        fake.make_graphed_callables  # noqa: B018 - real but not modelled: say so rather than pass


@pytest.mark.parametrize("smoke", [True, False])
def test_compile_cuda_sizes_smoke_runs_reduce_overhead_on_a_small_input(monkeypatch, smoke):
    """06.compile-cuda's own size lines (its cell, read from the lesson): smoke compiles reduce-overhead only, on a
    64x64 crop of the input (max-autotune's minutes of kernel benchmarking would eat a timed GPU run); full size
    keeps both modes on the full input."""
    import re

    import course_utils as cu
    from tests.gpu_contract.lesson_code import lesson_path

    text = lesson_path("06").read_text()
    cell = text[text.index('if cu.gpu_section("06.compile-cuda"') :]
    lines = [m.group(0).strip() for m in re.finditer(r"^\s+(cuda_modes|xc) = cu\.pick\(.*$", cell, re.M)][:2]
    assert len(lines) == 2, "the section's size lines moved: update this test"
    if smoke:
        monkeypatch.setenv("COURSE_SMOKE", "1")
    else:
        monkeypatch.delenv("COURSE_SMOKE", raising=False)
    ns = {"cu": cu, "xg": torch.randn(1, 3, 224, 224)}
    for line in lines:
        exec(line, ns)  # noqa: S102 - the lesson's own lines
    if smoke:
        assert ns["cuda_modes"] == ("reduce-overhead",) and ns["xc"].shape == (1, 3, 64, 64)
        assert ns["xc"].is_contiguous()
    else:
        assert ns["cuda_modes"] == ("reduce-overhead", "max-autotune") and ns["xc"] is ns["xg"]
    # the sized input is the one compiled, checked and timed
    assert "for mode in cuda_modes:" in cell and "first_call_s(compiled_g, xc," in cell and "compiled_g(xc)" in cell
