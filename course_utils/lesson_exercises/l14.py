"""Lesson 14 exercises: stack channels_last and BF16 autocast yourself; choose a technique from measured rows
(break-even is exercise 06.break-even)."""

from __future__ import annotations

from collections.abc import Callable

from ..exercises import exercise


def _check_pick(fn: Callable[[list[dict], float], str]) -> None:
    rows = [
        {"technique": "compile", "speedup": 1.4, "accuracy_drop": 0.0},
        {"technique": "int8", "speedup": 2.5, "accuracy_drop": 0.03},
        {"technique": "onnxruntime", "speedup": 1.9, "accuracy_drop": 0.002},
        {"technique": "precision bf16", "speedup": 0.6, "accuracy_drop": 0.0},
    ]
    got = fn(rows, 0.01)
    assert got == "onnxruntime", f"budget 0.01: int8 drops 0.03 (too much), so onnxruntime (1.9x) wins; got {got!r}"
    got = fn(rows, 0.05)
    assert got == "int8", f"budget 0.05 allows int8's drop of 0.03 and it is fastest; got {got!r}"
    slow = [{"technique": "precision bf16", "speedup": 0.6, "accuracy_drop": 0.0}]
    got = fn(slow, 0.01)
    assert got == "baseline", f"nothing faster than the baseline (speed-up > 1): answer 'baseline', got {got!r}"
    assert fn([], 0.01) == "baseline", "no rows at all: answer 'baseline'"


@exercise(
    "14.pick",
    "Return the technique with the highest speed-up (> 1) whose accuracy_drop is within the budget, "
    "or 'baseline' when none qualifies.",
    _check_pick,
)
def pick_technique(rows: list[dict], budget: float) -> str:
    ok = [r for r in rows if r["speedup"] > 1.0 and r["accuracy_drop"] <= budget]
    return max(ok, key=lambda r: r["speedup"])["technique"] if ok else "baseline"


def _check_stack(fn: Callable[[object], Callable]) -> None:
    import torch

    from ..compare import compare_outputs
    from ..models import load_digits_model

    model = load_digits_model("cnn")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.rand(16, 1, 8, 8)
    with torch.inference_mode():
        ref = model(x)
    run = fn(model)
    assert callable(run), f"stacked(model) must return a function run(x), got {type(run).__name__}"
    seen: list[tuple[str, bool, torch.dtype]] = []

    def watch(mod, inputs, output):  # every module's forward, so a copy of the model is seen too
        if isinstance(mod, torch.nn.Conv2d):
            seen.append((f"conv{mod.in_channels}->{mod.out_channels}",
                         inputs[0].is_contiguous(memory_format=torch.channels_last), output.dtype))  # fmt: skip

    handle = torch.nn.modules.module.register_module_forward_hook(watch)
    try:
        out = run(x)
    finally:
        handle.remove()
    assert isinstance(out, torch.Tensor), f"run(x) must return a tensor, got {type(out).__name__}"
    assert out.dtype == torch.float32, f"run(x) must return float32 outputs (call .float()), got {out.dtype}"
    assert not out.requires_grad, "run under torch.inference_mode() (or no_grad): the outputs carry autograd history"
    assert seen, "no convolution of the model ran: run(x) must call the model (or a copy of it)"
    not_cl = sorted({n for n, cl, _ in seen if not cl})
    assert not not_cl, f"convolutions {not_cl} got an NCHW input: convert the model and x to torch.channels_last"
    not_bf16 = sorted({f"{n} ({dt})" for n, _, dt in seen if dt != torch.bfloat16})
    assert not not_bf16, (
        f"convolutions {not_bf16} did not compute in bfloat16: wrap the call in torch.autocast('cpu', torch.bfloat16)"
    )
    cmp = compare_outputs(out, ref, "bf16")
    assert cmp.within, f"outputs differ from the FP32 model beyond the bf16 tolerance: {cmp.reason}"
    changed = [k for k, v in model.state_dict().items() if v.dtype != before[k].dtype]
    assert not changed, f"the given model was changed ({changed[:3]} ...): work on copy.deepcopy(model)"


@exercise(
    "14.stack",
    "stacked(model) -> run(x): run a copy of model with weights and input in torch.channels_last under "
    "torch.autocast('cpu', dtype=torch.bfloat16), in inference mode, returning float32 outputs.",
    _check_stack,
)
def stacked(model):
    import copy

    import torch

    fast = copy.deepcopy(model).eval().to(memory_format=torch.channels_last)

    def run(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            return fast(x.contiguous(memory_format=torch.channels_last)).float()

    return run
