"""Lesson 06 exercises: one graph for many batch sizes, padding to a compiled shape, an AOTInductor package.

Each checker observes the technique where it runs: a counting ``torch.compile`` backend sees every graph
Dynamo compiles **and every call that runs through a compiled graph** (with its input shapes), so work that
silently falls back to eager (``recompile_limit`` reached, the eager module called directly), a batch that
was concatenated, split or padded, or a second graph, are all visible. Cases (model widths, batch sizes)
are drawn at random per call; a failure names the seed. ``06.pad-batch`` also serves 16-bit requests on the GPU
(or its CPU stand-in) through a graph captured for that device and dtype, so padding made where the request is
not (plain ``torch.zeros(...)``: CPU float32) is named.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
from torch import nn

from course_checks.exercises import exercise
from course_checks.lesson_exercises.observe import Cases, cases, gpu
from course_utils.measuring.outputs import compare_outputs

WATERMARK = 1.002  # the checker's compiled graphs scale their output by this: eager results are told apart


class GraphCalls:
    """A ``torch.compile`` backend: counts the graphs Dynamo compiles and the calls run through them.

    Its graphs return ``WATERMARK`` x the eager result, so an answer computed eagerly (the technique run on a
    throwaway input, then the eager model's output returned) does not match what the compiled model gives.
    """

    def __init__(self) -> None:
        self.graphs = 0
        self.calls: list[tuple[int, ...]] = []  # the first tensor input's shape, per call of a compiled graph

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.graphs += 1
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        # the data input: a tensor placeholder that is not a lifted parameter or buffer ("l_fn_modules_...")
        data = next((i for i, (n, a) in enumerate(zip(names, example_inputs, strict=False))
                     if isinstance(a, torch.Tensor) and "_modules_" not in n), None)  # fmt: skip

        def run(*args):
            self.calls.append(tuple(args[data].shape) if data is not None else ())
            out = gm.forward(*args)
            return type(out)(o * WATERMARK if isinstance(o, torch.Tensor) else o for o in out)

        return run


@contextlib.contextmanager
def _dynamo_config_restored():
    """Undo whatever the learner changed in Dynamo's config (a recompile limit, say) when the check ends."""
    saved = torch._dynamo.config.save_config()
    try:
        yield
    finally:
        torch._dynamo.config.load_config(saved)
        torch._dynamo.reset()


def _random_mlp(c) -> tuple[nn.Module, int]:
    width_in, hidden, out = c.randint(4, 12), c.randint(8, 32), c.randint(2, 6)
    torch.manual_seed(c.seed)
    return nn.Sequential(nn.Linear(width_in, hidden), nn.ReLU(), nn.Linear(hidden, out)).eval(), width_in


def _compiled(model: nn.Module, counter: GraphCalls):
    torch._dynamo.reset()
    return torch.compile(model, backend=counter, dynamic=False)


def mark_dynamic_case(c: Cases) -> tuple[nn.Module, list[int], list[torch.Tensor]]:
    """One call's case: a random MLP and 4-6 distinct batch sizes of 2-40 rows (fewer sizes than Dynamo's
    recompile limit, so a plain loop compiles one graph per size; their sum is none of them), one of them above
    32 (a dynamic range bounded at a power of two as small as 32 refuses it), in random order."""
    model, width = _random_mlp(c)
    big = c.randint(33, 40)
    sizes = [*c.rng.sample([s for s in range(2, 41) if s != big], c.randint(3, 5)), big]
    c.rng.shuffle(sizes)
    return model, sizes, [c.randn(s, width) for s in sizes]


def _serve_marked(fn, compiled, batches: list[torch.Tensor]):
    """``fn(compiled, batches)``; the errors Dynamo raises for a badly bounded mark_dynamic are named."""
    try:
        return fn(compiled, batches)
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        sizes = sorted(len(b) for b in batches)
        if "not in range" in text:
            raise AssertionError(
                f"a batch is outside the range marked dynamic ({text}): the batch sizes are {sizes}. Mark dim 0 "
                "without bounds, torch._dynamo.mark_dynamic(x, 0), or with a min and max covering every batch"
            ) from None
        if "Constraints violated" in text and "size()[0]" not in text:
            raise AssertionError(
                f"Dynamo refused a dimension you marked dynamic ({text}): it is not the batch, the model fixes its "
                "size (a Linear layer needs exactly its in_features). Mark dimension 0, the batch: "
                "torch._dynamo.mark_dynamic(x, 0)"
            ) from None
        if "not simple sympy type" in text:
            raise AssertionError(
                f"Dynamo failed on the bounds given to mark_dynamic ({text}): with only min= or only max= it "
                "cannot build the range. Mark dim 0 without bounds, torch._dynamo.mark_dynamic(x, 0), or pass "
                f"both min= and max= covering every batch (sizes {sizes})"
            ) from None
        raise


def _check_mark_dynamic(fn: Callable[[Callable[..., torch.Tensor], list[torch.Tensor]], list[torch.Tensor]]) -> None:
    with cases("06.mark-dynamic") as c, _dynamo_config_restored(), torch.no_grad():
        model, sizes, batches = mark_dynamic_case(c)
        refs = [model(b) * WATERMARK for b in batches]  # what the compiled model returns
        counter = GraphCalls()
        compiled = _compiled(model, counter)
        try:
            outs = _serve_marked(fn, compiled, [b.clone() for b in batches])
        finally:
            torch._dynamo.reset()
        assert isinstance(outs, list | tuple) and len(outs) == len(batches), (
            f"return one output per batch ({len(batches)}), in order"
        )
        for out, ref, s in zip(outs, refs, sizes, strict=True):
            assert isinstance(out, torch.Tensor) and out.shape == ref.shape, (
                f"batch of {s}: expected an output of shape {tuple(ref.shape)}, got "
                f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}"
            )
        ran = [shape[0] for shape in counter.calls if shape]
        assert counter.graphs >= 1 and ran, "the compiled model never ran: call compiled(x), not the eager model"
        assert counter.graphs == 1, (
            f"{counter.graphs} graphs were compiled for {len(sizes)} batch sizes: mark the batch dimension dynamic "
            "before the first call (torch._dynamo.mark_dynamic(x, 0)) so one size-generic graph serves them all"
        )
        if len(ran) == 1 and ran[0] == sum(sizes):
            raise AssertionError(
                "the batches were concatenated into one call and split afterwards: each request must be served "
                "as it arrives (mark dim 0 dynamic and call compiled(x) per batch)"
            )
        if len(ran) == len(sizes) and all(r == max(sizes) for r in ran):
            raise AssertionError(
                f"every call ran at the largest batch ({max(sizes)}): padding to the max wastes compute; "
                "mark dim 0 dynamic so each batch runs at its own size"
            )
        assert sorted(ran) == sorted(sizes), (
            f"only {len(ran)} of {len(sizes)} batches ran through the compiled graph (batch sizes {ran} vs {sizes}): "
            "the rest ran eagerly (a recompile limit reached, or the eager model called). Mark dim 0 dynamic "
            "instead of limiting recompiles"
        )
        for out, ref, s in zip(outs, refs, sizes, strict=True):
            cmp = compare_outputs(out, ref, "fp32")
            assert cmp.within, (
                f"batch of {s}: output differs from what the compiled model returns ({cmp.reason}): every output "
                "must come from compiled(x), not from the eager model or a modified tensor"
            )


@exercise(
    "06.mark-dynamic",
    "serve(compiled, batches): return compiled(x) for every batch, each batch run once at its own size through "
    "ONE compiled graph: mark dimension 0 of each input dynamic (torch._dynamo.mark_dynamic(x, 0)) before calling.",
    _check_mark_dynamic,
)
def serve(compiled: Callable[..., torch.Tensor], batches: list[torch.Tensor]) -> list[torch.Tensor]:
    outs = []
    for x in batches:
        torch._dynamo.mark_dynamic(x, 0)
        outs.append(compiled(x))
    return outs


def pad_case(c: Cases) -> tuple[nn.Module, int, torch.Tensor, list[torch.Tensor]]:
    """One call's case: a random MLP, the captured batch ``size`` (4-12), the capture input, and three requests
    in random order: fewer rows than ``size``, exactly ``size``, and more (below 3 x ``size``, never a multiple of
    ``size``: a remainder is always left for the last, padded chunk)."""
    model, width = _random_mlp(c)
    size = c.randint(4, 12)
    capture = c.randn(size, width)
    rows = [c.randint(1, size - 1), size, c.randint(1, 2) * size + c.randint(1, size - 1)]  # the last: no multiple
    return model, size, capture, [c.randn(n, width) for n in c.rng.sample(rows, len(rows))]


def _serve_one(fn, compiled, x: torch.Tensor, size: int, ref: torch.Tensor, calls: list, graphs: Callable[[], int],
               precision: str, where: str = "") -> None:  # fmt: skip
    """Serve request ``x`` through ``fn`` and judge its output against ``ref`` (what the compiled model returns)
    and the calls the compiled graph saw (``calls``, appended to by the graph; ``graphs()`` how many exist)."""
    n = x.shape[0]
    before = len(calls)
    try:
        out = fn(compiled, x.clone(), size)
    except ValueError as exc:
        raise AssertionError(
            f"{where}a request of {n} rows raised ValueError ({exc}): split it into chunks of {size}, pad "
            "the last chunk, and run each chunk through the compiled model"
        ) from None
    except RuntimeError as exc:
        if "same device" not in str(exc):
            raise
        raise AssertionError(
            f"{where}a request of {n} rows on {x.device.type} failed: {str(exc).split(' (when')[0]}. The padding rows "
            "were made on the CPU (torch.zeros(...) without device=): make them where the request is, "
            "x.new_zeros(...) or torch.zeros(..., device=x.device, dtype=x.dtype)"
        ) from None
    if isinstance(out, torch.Tensor) and out.shape[1:] == ref.shape[1:] and len(out) < n:
        raise AssertionError(
            f"{where}a request of {n} rows got {len(out)} output rows: every row needs its output, the last "
            f"chunk's {n % size or size} rows too (zero-pad that chunk to {size} and keep its real rows)"
        )
    assert isinstance(out, torch.Tensor) and out.shape == ref.shape, (
        f"{where}a request of {n} rows: return its {n} real rows (shape {tuple(ref.shape)}), got "
        f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}: "
        "slice off the padding"
    )
    ran = calls[before:]
    assert graphs() == 1, (
        f"{where}a request of {n} rows compiled a new graph (ran at {[r[0] for r in ran if r]}): pad every "
        f"chunk to the captured batch {size} so the one graph is reused"
    )
    assert ran and all(r[:1] == (size,) for r in ran), (
        f"{where}a request of {n} rows ran through the compiled graph {len(ran)} time(s) at {ran}: pad to {size}"
    )
    assert len(ran) == math.ceil(n / size), (
        f"{where}a request of {n} rows needs {math.ceil(n / size)} compiled call(s) of {size}, it made "
        f"{len(ran)}: rows that bypass the compiled model run eagerly"
    )
    cmp = compare_outputs(out.to(ref.device), ref, precision)
    assert cmp.within, (
        f"{where}a request of {n} rows: output differs from what the compiled model returns ({cmp.reason}): "
        "every row must come from a compiled call (no eager model, the real rows first)"
    )


def _check_pad(fn: Callable[[Callable[..., torch.Tensor], torch.Tensor, int], torch.Tensor]) -> None:
    with cases("06.pad-batch") as c, _dynamo_config_restored(), torch.no_grad():
        model, size, capture, requests = pad_case(c)
        counter = GraphCalls()
        compiled = _compiled(model, counter)
        try:
            compiled(capture)  # "captured" for batch `size`: the one shape it may run at
            counter.calls.clear()
            for x in requests:
                ref = model(x) * WATERMARK  # what the compiled model returns
                _serve_one(fn, compiled, x, size, ref, counter.calls, lambda: counter.graphs, "fp32")
        finally:
            torch._dynamo.reset()
        with gpu() as device:
            serve_on_device(fn, c, device)


# ---- the same exercise where it runs: a GPU batch in 16 bits --------------------------------------------------
DEVICE_WATERMARK = 1.25  # beyond the 16-bit tolerances (1.002 is within them): eager outputs told apart here too


class CapturedGraph:
    """A graph captured for batch ``size`` of ``dtype`` on ``device`` (as a CUDA graph or a compiled graph on the
    GPU is): it records the shape of each call, and names an input of another dtype or device, which such a
    graph cannot take. (torch.compile does not run on the CPU stand-in of the GPU, so this plays its part there;
    ``_orig_mod`` is the eager model, as on a compiled module.)"""

    def __init__(self, model: nn.Module, size: int, device: str, dtype: torch.dtype) -> None:
        self._orig_mod, self.size, self.device, self.dtype = model, size, device, dtype
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != torch.device(self.device).type:
            raise AssertionError(
                f"a padded chunk reached the compiled model on {x.device.type}, the request was on {self.device}: "
                "make the padding where the request is (x.new_zeros(...) or torch.zeros(..., device=x.device, "
                "dtype=x.dtype)), and run each chunk where the model is"
            )
        if x.dtype != self.dtype:
            raise AssertionError(
                f"a padded chunk reached the compiled model as {x.dtype}, the request was {self.dtype}: "
                "torch.zeros(...) makes float32 unless given dtype=, and torch.cat promoted the chunk to it (a new "
                "graph, or a dtype error, on the GPU). Pad with x.new_zeros(...) or torch.zeros(..., "
                "device=x.device, dtype=x.dtype)"
            )
        self.calls.append(tuple(x.shape))
        return self._orig_mod(x) * DEVICE_WATERMARK


def pad_device_case(c: Cases) -> tuple[nn.Module, int, torch.dtype, list[torch.Tensor]]:
    """The device part of one call's case: a random MLP in float16 or bfloat16, the captured batch ``size`` (4-12)
    and two requests that leave a remainder to pad (fewer rows than ``size``; more, not a multiple), in random
    order; tensors on the CPU (moved to the device by :func:`serve_on_device`)."""
    model, width = _random_mlp(c)
    dtype = c.choice([torch.float16, torch.bfloat16])
    size = c.randint(4, 12)
    rows = [c.randint(1, size - 1), c.randint(1, 2) * size + c.randint(1, size - 1)]
    return model, size, dtype, [c.randn(n, width) for n in c.rng.sample(rows, len(rows))]


def serve_on_device(fn: Callable[..., torch.Tensor], c: Cases, device: str) -> str:
    """The requests of :func:`pad_device_case` served on ``device`` (the GPU or its stand-in) in 16 bits through a
    :class:`CapturedGraph`, each judged as on the CPU: padding made with plain ``torch.zeros(...)`` (a CPU float32
    tensor) is named. The tests run this over many seeds without the check's compiled part."""
    model, size, dtype, requests = pad_device_case(c)
    model = model.to(device, dtype)
    graph = CapturedGraph(model, size, device, dtype)
    precision = "fp16" if dtype == torch.float16 else "bf16"
    for x in requests:
        x = x.to(device, dtype)
        ref = model(x) * DEVICE_WATERMARK
        _serve_one(fn, graph, x, size, ref, graph.calls, lambda: 1, precision, f"on {device} in {dtype}: ")
    return f"{len(requests)} {dtype} requests on {device} padded to {size}"


@exercise(
    "06.pad-batch",
    "serve_padded(compiled, x, size): `compiled` runs only at batch `size` (its one graph). Split x into chunks "
    "of `size`, zero-pad the last chunk, run every chunk through compiled, and return the real rows' outputs. "
    "Requests may come on the GPU in 16 bits: pad on x's device, in x's dtype.",
    _check_pad,
)
def serve_padded(compiled: Callable[..., torch.Tensor], x: torch.Tensor, size: int) -> torch.Tensor:
    outs = []
    for chunk in x.split(size):
        n = chunk.shape[0]
        if n < size:
            chunk = torch.cat([chunk, chunk.new_zeros((size - n, *chunk.shape[1:]))])
        outs.append(compiled(chunk)[:n])
    return torch.cat(outs)


class _TwoInputs(nn.Module):
    """features (N, F) and per-row weights (N, 1): both share the batch dimension."""

    def __init__(self, features: int, hidden: int, out: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, out))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.body(x) * mask


def export_case(c: Cases) -> tuple[nn.Module, int, tuple[torch.Tensor, torch.Tensor], int]:
    """One call's case: the (x, mask) model, its feature width, an example batch of 3 (a batch of 1 would be
    specialized) and ``max_batch`` (40-200, above the usual small Dim ranges)."""
    torch.manual_seed(c.seed)
    features = c.randint(4, 12)
    model = _TwoInputs(features, c.randint(8, 24), c.randint(2, 5)).eval()
    max_batch = c.randint(40, 200)
    return model, features, (c.randn(3, features), c.randn(3, 1).abs() + 0.5), max_batch


def _check_export(fn: Callable[[nn.Module, tuple[torch.Tensor, torch.Tensor], int], object]) -> None:
    from torch.export import ExportedProgram

    with cases("06.export") as c, torch.no_grad():
        model, features, example, max_batch = export_case(c)
        try:
            ep = fn(model, example, max_batch)
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - torch.export's own error is the most useful message
            first = str(exc).strip().splitlines()
            raise AssertionError(f"your export raised {type(exc).__name__}: {' '.join(first[:2])}") from None
        assert isinstance(ep, ExportedProgram), (
            f"return the torch.export.ExportedProgram itself, got {type(ep).__name__} "
            "(torch.jit.trace is legacy and torch.compile is not an export; call torch.export.export)"
        )
        sym = {str(k): v for k, v in ep.range_constraints.items()}
        placeholders = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs]
        batch_dims = [str(n.meta["val"].shape[0]) for n in placeholders]
        assert len(batch_dims) == 2, f"export both inputs (x, mask), found {len(batch_dims)} user inputs"
        assert all(d in sym for d in batch_dims), (
            f"the batch dimension was specialized to {batch_dims}: pass dynamic_shapes with a torch.export.Dim "
            "for dimension 0 of both inputs (and an example batch of 2 or more: a batch of 1 is specialized)"
        )
        assert batch_dims[0] == batch_dims[1], (
            f"x and mask got separate batch symbols {batch_dims}: they share the batch, so give both the SAME Dim "
            "(otherwise the graph must guard that they are equal)"
        )
        rng = sym[batch_dims[0]]
        assert rng.lower <= 1 and rng.upper >= max_batch, (
            f"the batch range is {rng.lower}..{rng.upper}: it must cover 1..{max_batch} "
            f"(torch.export.Dim('batch', min=1, max={max_batch}))"
        )
        module = ep.module()
        for n in sorted({1, 2, c.randint(4, max_batch - 1), max_batch}):
            x, mask = c.randn(n, features), c.randn(n, 1).abs() + 0.5
            try:
                out = module(x, mask)
            except Exception as exc:  # noqa: BLE001 - the learner's graph refusing a size is the finding
                raise AssertionError(f"the exported program refused batch {n}: {type(exc).__name__}: {exc}") from None
            cmp = compare_outputs(out, model(x, mask), "fp32")
            assert cmp.within, f"batch {n}: the exported program differs from eager: {cmp}"
        ops = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
        assert any("linear" in o or "addmm" in o for o in ops), f"the graph holds no Linear op ({sorted(ops)[:6]})"


@exercise(
    "06.export",
    "export_two_inputs(model, example, max_batch): torch.export.export the (x, mask) model with ONE shared "
    "torch.export.Dim for dimension 0 of both inputs, covering 1..max_batch; return the ExportedProgram.",
    _check_export,
)
def export_two_inputs(model: nn.Module, example: tuple[torch.Tensor, torch.Tensor], max_batch: int):
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    return torch.export.export(model, example, dynamic_shapes=({0: batch}, {0: batch}))
