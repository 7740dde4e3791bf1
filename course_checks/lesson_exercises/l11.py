"""Lesson 11 exercise: a CUDA-graph runner with a CPU fallback, both on fixed buffers.

The check draws a random model and batch per call (the seed is printed on failure) and observes the model at the
operator level (:class:`~course_checks.lesson_exercises.observe.OpLog`, a dispatch mode), not only through a
Python wrapper: the runner's results must match ``model(x)`` batch after batch (a result kept from an earlier
call must not change), a batch of another shape must raise ``ValueError``, and the technique must show. On the
CPU fallback each ``run(x)`` runs the model's convolution exactly once, on one preallocated input buffer (never
on the caller's tensor). On CUDA (where a GPU exists) no convolution operator is dispatched during ``run(x)`` at
all: a replay launches the recorded kernels without going through PyTorch's dispatcher. ``torch.jit.trace``,
``torch.jit.script`` and ``torch.compile`` are refused with the reason: a traced module is no graph (it
dispatches every operator again on each call), and the exercise is to write the capture yourself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from course_checks.exercises import exercise, observed
from course_checks.lesson_exercises.observe import CONV_OPS, OpLog, cases, forbid, gpu
from course_utils.from_lessons.l11_memory import capture_runner

Runner = Callable[[torch.Tensor], torch.Tensor]

_TRACE = (
    "torch.jit.trace/script is no CUDA graph: the traced module still dispatches and launches every operator "
    "from the CPU on each call. Capture with torch.cuda.CUDAGraph() and torch.cuda.graph(g), replay with "
    "g.replay() (on the CPU: a fixed input buffer and the model itself)"
)
_COMPILE = (
    "torch.compile(mode='reduce-overhead') would capture graphs for you: this exercise is to write the capture "
    "yourself with torch.cuda.CUDAGraph() and torch.cuda.graph(g)"
)


class _Watched(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.calls, self.ptrs = inner, 0, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.ptrs.append(x.data_ptr())
        return self.inner(x)


def _check_on(make: Callable[[torch.nn.Module, torch.Tensor], Runner], device: str, c: Any) -> str:
    cin, cout, side, batch = c.randint(2, 4), c.randint(3, 6), c.randint(6, 10), c.randint(1, 4)
    inner = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 3), torch.nn.ReLU(), torch.nn.Flatten()).eval()
    with torch.no_grad():
        inner[0].weight.copy_(c.randn(*inner[0].weight.shape))
    inner = inner.to(device)
    model = _Watched(inner)
    xs = [c.randn(batch, cin, side, side).to(device) for _ in range(3)]
    given = [x.clone() for x in xs]
    with _no_shortcuts(), _cuda_rules():
        run = make(model, xs[0])
        assert callable(run), "return a function run(x)"
        shortcut = _compiled_inside(run)
        assert shortcut is None, shortcut
        replays_before = _replays()
        calls_after_setup = model.calls
        outs, logs = [], []
        for x in xs:
            with OpLog(watch={"conv weight": inner[0].weight, "the caller's x": x}) as log:
                outs.append(run(x))
            logs.append(log)
    changed = [i for i, (x, g) in enumerate(zip(xs, given, strict=True)) if not torch.equal(x, g)]
    assert not changed, (
        f"run() changed the caller's tensor{'s' if len(changed) > 1 else ''} {changed} (0 is the example you were "
        "given): the example itself became your input buffer. Copy it once (static_in = example.clone()) and "
        "copy_ each batch into that copy"
    )
    with torch.inference_mode():
        refs = [inner(x) for x in xs]
    for i, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        assert isinstance(out, torch.Tensor) and out.shape == ref.shape, f"run(batch {i}) should return {ref.shape}"
        if torch.allclose(out, ref, atol=1e-4):
            continue
        if i < len(refs) - 1 and torch.allclose(out, refs[-1], atol=1e-4):
            why = (
                " (kept from an earlier call, it was overwritten by the last call's result: return a clone of the "
                "static output)"
            )
        elif i > 0 and torch.allclose(out, refs[0], atol=1e-4):
            why = (
                ": it is the example's result. The model (or the graph) reads the static input: copy each batch "
                "into it with static_in.copy_(x); binding the name to a new tensor does not change what it reads"
            )
        else:
            why = ""
        raise AssertionError(f"batch {i}: the result differs from model(x){why}")
    grads = [i for i, out in enumerate(outs) if out.requires_grad]
    assert not grads, (
        f"run(batch {grads[0]}) returned a result that requires grad (an autograd graph): run the model under "
        "torch.inference_mode() (on CUDA the warm-up and the capture too), or every call keeps its activations "
        "alive for a backward that never comes"
    )
    for other, what in (
        ((batch + 1, cin, side, side), "a batch of another size"),
        ((batch, cin, side + 1, side + 1), "images of another size (the same batch size)"),
    ):
        try:
            with _no_shortcuts(), _cuda_rules():
                run(c.randn(*other).to(device))
        except ValueError:
            pass
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001 - any other error is the wrong answer
            raise AssertionError(
                f"{what} {other} raised {type(exc).__name__}: compare the whole x.shape with the buffer's first "
                "and raise ValueError"
            ) from None
        else:
            raise AssertionError(
                f"{what} {other} must raise ValueError: the buffers (and a graph) are fixed; compare the whole "
                "x.shape, not only the batch"
            )
    convs = [[op for op in log.named(*CONV_OPS) if "conv weight" in op.watched] for log in logs]
    if device == "cuda":
        ran = sum(len(cv) for cv in convs)
        assert ran == 0 and model.calls == calls_after_setup, (
            f"the model's convolution was dispatched {ran} times during run(): eager (or traced) code, not a "
            "replay. Capture a torch.cuda.CUDAGraph once and call graph.replay() in run()"
        )
        replays = _replays() - replays_before
        assert replays in (-1, len(xs)), (
            f"{len(xs)} calls of run() replayed a CUDA graph {replays} times: replay the captured graph once per "
            "call (graph.replay())"
        )
        counted = f"{replays} graph replays" if replays >= 0 else "the model's forward never called"
        return (
            f"on cuda: {len(xs)} calls of run(), {counted}, 0 convolutions dispatched, "
            "results equal to model(x) and kept across calls, another shape refused with ValueError"
        )
    for i, cv in enumerate(convs):
        assert len(cv) == 1, (
            f"run(batch {i}) ran the model's convolution {len(cv)} times: run the model once per call, on the "
            "buffer (not on a throwaway input beside it, not zero times with an answer computed earlier)"
        )
        assert "the caller's x" not in cv[0].watched, (
            "run the model on your buffer, not on the caller's tensor: static_in.copy_(x), then model(static_in)"
        )
    used = model.ptrs[calls_after_setup:]
    assert len(used) == len(xs) and len(set(used)) == 1, (
        "on the CPU fallback, copy each batch into one preallocated input buffer (static_in.copy_(x)) and call "
        "the model you were given on that buffer, once per run(x)"
    )
    return f"on cpu: {len(xs)} calls of run(), each one convolution on one fixed buffer, results kept"


def _replays() -> int:
    """Graph replays counted by the rehearsal's stand-in GPU so far (-1 on a real GPU, which counts none here)."""
    from fakegpu.standins import rehearsal

    return rehearsal.checks().get("graph replays", 0) if rehearsal.active() else -1


@contextlib.contextmanager
def _cuda_rules() -> Iterator[None]:
    """A CUDA rule the rehearsal's stand-in GPU enforces (capture without warm-up ...), broken: a rejection."""
    from fakegpu.standins.rehearsal import RehearsalError

    try:
        yield
    except RehearsalError as exc:
        raise AssertionError(f"on the GPU your runner broke a CUDA rule: {exc}") from None


@contextlib.contextmanager
def _no_shortcuts() -> Iterator[None]:
    """Tracing, scripting and compiling refused wherever they are reached from (torch.jit.trace is also
    torch.jit._trace.trace; torch._dynamo.optimize is torch.compile's engine)."""
    import torch._dynamo
    import torch.jit._script
    import torch.jit._trace

    with forbid(trace=(torch.jit, _TRACE), script=(torch.jit, _TRACE), compile=(torch, _COMPILE)), forbid(
        trace=(torch.jit._trace, _TRACE), trace_module=(torch.jit._trace, _TRACE), script=(torch.jit._script, _TRACE)
    ), forbid(optimize=(torch._dynamo, _COMPILE)):  # fmt: skip
        yield


def _compiled_inside(run: Callable[..., Any], depth: int = 3) -> str | None:
    """Why ``run`` calls a traced, scripted or compiled module (found in its closure), or None."""
    seen: set[int] = set()
    todo: list[tuple[Any, int]] = [(run, 0)]
    while todo:
        obj, level = todo.pop()
        if id(obj) in seen or level > depth:
            continue
        seen.add(id(obj))
        kind = type(obj).__module__ + "." + type(obj).__name__
        if isinstance(obj, (torch.jit.ScriptModule, torch.jit.ScriptFunction)) or "torch.jit" in kind:
            return _TRACE
        if "_dynamo" in kind or hasattr(obj, "_torchdynamo_orig_callable"):
            return _COMPILE
        inner = [c.cell_contents for c in (getattr(obj, "__closure__", None) or ()) if _has(c)]
        inner += [getattr(obj, a) for a in ("__self__", "__wrapped__", "func") if hasattr(obj, a)]
        if isinstance(obj, torch.nn.Module):
            inner += list(obj.children())
        todo += [(o, level + 1) for o in inner]
    return None


def _has(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _check_runner(make: Callable[[torch.nn.Module, torch.Tensor], Runner]) -> None:
    with cases("11.graph-runner") as c:
        seen = [_check_on(make, "cpu", c)]
        with gpu() as device:  # the CUDA path, on the rehearsal's stand-in where there is no GPU
            seen.append(_check_on(make, device, c))
    observed("; ".join(seen))


@exercise(
    "11.graph-runner",
    "static_in = example.clone(); on CUDA warm up on a side stream, capture out = model(static_in) in "
    "torch.cuda.graph(g); run(x): check the shape (ValueError), static_in.copy_(x), g.replay(), return a clone; "
    "on CPU run(x): check, copy_, return model(static_in) under inference_mode.",
    _check_runner,
    time_limit=60,
)
def make_graph_runner(model: torch.nn.Module, example: torch.Tensor) -> Runner:
    if example.is_cuda:
        return capture_runner(model, example)  # lesson 11's runner, exported from its cell (one copy)
    static_in = example.clone()

    def run_eager(x: torch.Tensor) -> torch.Tensor:
        if x.shape != static_in.shape:
            raise ValueError(f"this runner was built for {tuple(static_in.shape)}, got {tuple(x.shape)}")
        static_in.copy_(x)
        with torch.inference_mode():
            return model(static_in)

    return run_eager
