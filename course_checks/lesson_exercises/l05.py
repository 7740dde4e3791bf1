"""Lesson 05 exercises: torchao INT8 with layers kept in FP32, and the PT2E static INT8 pipeline.

Both checkers build a random model per call (widths, the layer to keep in FP32, calibration data; the seed is
printed on failure) and look where quantization really happens: the weights' tensor types and the INT8
tensors the forward pass reads (an operator log), the converted graph's quantize/dequantize nodes and their
scales (which only calibration on the given batches produces), and the calibration batches seen running.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from course_checks.exercises import exercise, observed
from course_checks.lesson_exercises.observe import OpLog, cases
from course_utils.measuring.outputs import compare_outputs

COSINE_MIN = 0.99  # output cosine an INT8 variant must keep against FP32 on these random models


def torchao_int8_weight(mod: nn.Linear) -> str | None:
    """Why ``mod``'s weight is not a torchao INT8 tensor, or None when it is one."""
    w = mod.weight
    kind = type(w)
    if not kind.__module__.startswith("torchao"):
        return f"weight is a plain {kind.__name__} ({kind.__module__})"
    if not hasattr(w, "__tensor_flatten__"):
        return f"weight is a {kind.__name__} without inner tensors"
    names, _ = w.__tensor_flatten__()
    if not any(getattr(w, n).dtype == torch.int8 for n in names):
        return f"{kind.__name__} stores no int8 data (inner tensors {names})"
    return None


def _random_mlp(c) -> nn.Sequential:
    """3 or 4 Linear layers, the middle ones in a nested block: their names ('0', '2.0', '2.2', '3') are paths,
    and '0' is part of '2.0' (a filter matching names by substring or prefix keeps the wrong layers)."""
    widths = c.rng.sample(range(16, 129, 8), c.randint(4, 5))  # distinct widths: each weight shape is unique
    torch.manual_seed(c.seed)
    linears = [nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False)]
    block: list[nn.Module] = []
    for lin in linears[1:-1]:
        block += [lin, nn.ReLU()]
    return nn.Sequential(linears[0], nn.ReLU(), nn.Sequential(*block), linears[-1]).eval()


def _check_torchao_mlp(fn: Callable[[nn.Module, set[str]], nn.Module]) -> None:
    with cases("05.torchao-mlp") as c:
        mlp = _random_mlp(c)
        names = [n for n, m in mlp.named_modules() if isinstance(m, nn.Linear)]
        # Two calls with different layers to keep, one of them naming two layers (in random order): a submission
        # that keeps a fixed name fails one call, one that keeps only one of the names it is given (the first, say)
        # fails the two-name call.
        before = copy.deepcopy(mlp.state_dict())
        # the single name kept is part of another name ('0' of '2.0'): a substring or prefix match keeps both
        a = c.choice([n for n in names if any(n != m and n in m for m in names)])
        b, d = c.rng.sample([n for n in names if n != a], 2)
        keeps = [{a}, {b, d}]
        c.rng.shuffle(keeps)
        for keep in keeps:
            q = fn(mlp, set(keep))
            assert isinstance(q, nn.Module), f"return the quantized model (an nn.Module), not {type(q).__name__}"
            after = mlp.state_dict()
            unchanged = all(type(after[k]) is type(v) and torch.equal(after[k], v) for k, v in before.items())
            assert unchanged, "the model you were given changed: quantize a copy (copy.deepcopy) and return it"
            dyn = [n for n, m in q.named_modules() if type(m).__module__.startswith("torch.ao.nn.quantized")]
            assert not dyn, (
                f"{dyn[:2]} come from torch.ao's quantize_dynamic (deprecated): use torchao's quantize_ with an "
                "INT8 config"
            )
            linears = {n: m for n, m in q.named_modules() if isinstance(m, nn.Linear)}
            assert set(linears) == set(names), (
                f"the returned model's Linear layers are {sorted(linears)}, expected {names}: quantize the model you "
                "were given (a copy of it), not another one"
            )
            for name in keep:
                why = torchao_int8_weight(linears[name])
                assert why is not None, (
                    f"'{name}' must stay FP32 (keep_fp32={sorted(keep)}) but holds INT8 weights: pass quantize_ a "
                    "filter_fn(module, fqn) that returns False for every name in keep_fp32"
                    + (f" (fqn is the full path, '{name}', not its last part)" if "." in name else "")
                )
                assert linears[name].weight.dtype == torch.float32, (
                    f"'{name}' must stay FP32, it is {linears[name].weight.dtype}"
                )
            bad = {n: why for n, m in linears.items() if n not in keep and (why := torchao_int8_weight(m))}
            inside = {n: k for n in bad for k in keep if k in n}
            quantized = len(linears) - len(keep) - len(bad)
            assert not (inside and set(inside) == set(bad) and quantized), (
                f"'{next(iter(inside))}' stayed FP32, but keep_fp32 is {sorted(keep)}: your filter matched "
                f"'{next(iter(inside.values()))}' as a part of that longer name (a substring, or its last component). "
                "Compare whole names: "
                "filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn not in keep_fp32"
            )
            assert not bad, (
                f"{len(bad)} Linear layer(s) that should be INT8 are not torchao INT8 tensors, e.g. "
                f"{next(iter(bad.items()))}: quantize_(model, Int8...Config(), filter_fn=...) quantizes each Linear "
                "the filter accepts"
            )
            x = c.randn(c.randint(3, 9), linears[names[0]].in_features)
            with torch.no_grad():
                ref = mlp(x)
                try:
                    with OpLog(watch=q) as log:
                        out = q(x)
                except Exception as exc:  # noqa: BLE001 - any failure to run is the learner's to see
                    raise AssertionError(f"running the quantized model failed: {type(exc).__name__}: {exc}") from None
            int8_reads = {shape for op in log.ops for dt, shape in zip(op.in_dtypes, op.in_shapes, strict=False)
                          if dt == torch.int8}  # fmt: skip
            for name, m in linears.items():
                if name in keep:
                    assert log.reads(f"{name}.weight"), (
                        f"the FP32 layer '{name}' was never used while the model ran: return the model whose forward "
                        "runs these layers"
                    )
                    continue
                o, i = m.weight.shape
                assert (o, i) in int8_reads or (i, o) in int8_reads, (
                    f"no INT8 weight of '{name}' ({o}x{i}) was read while the returned model ran: its forward must run "
                    "the quantized layers (not an FP32 copy kept beside them)"
                )
            cmp = compare_outputs(out, ref, "int8")
            assert cmp.cosine >= COSINE_MIN, f"output cosine to FP32 {cmp.cosine:.4f} < {COSINE_MIN}: {cmp}"
            observed(f"keep {sorted(keep)}: {len(linears) - len(keep)} Linear layers hold torchao INT8 weights, "
                     f"read as int8 while running; {sorted(keep)} FP32; cosine {cmp.cosine:.4f}")  # fmt: skip


@exercise(
    "05.torchao-mlp",
    "quantize_mlp(model, keep_fp32): an INT8 copy of the MLP made with torchao's quantize_ and an INT8 config, "
    "every Linear INT8 except the ones named in keep_fp32 (a filter_fn); the argument stays unchanged.",
    _check_torchao_mlp,
)
def quantize_mlp(model: nn.Module, keep_fp32: set[str]) -> nn.Module:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    q = copy.deepcopy(model)
    quantize_(q, Int8WeightOnlyConfig(), filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn not in keep_fp32)
    return q


# ------------------------------------------------------------------ 05.pt2e: static INT8, one layer kept FP32

QUANT = "quantized_decomposed.quantize_per_tensor"
DEQUANT_W = "quantized_decomposed.dequantize_per_channel"
DEQUANT_A = "quantized_decomposed.dequantize_per_tensor"


def _random_cnn(c) -> nn.Sequential:
    c1, c2, c3 = (c.randint(4, 12) for _ in range(3))
    torch.manual_seed(c.seed)
    return nn.Sequential(
        nn.Conv2d(3, c1, 3, padding=1), nn.ReLU(), nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(),
        nn.Conv2d(c2, c3, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c3, 5),
    ).eval()  # fmt: skip


def _module_of(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "?"
    path = list(stack.values())[-1][0]
    return path.split(".")[-1] if path else "?"


def _conv_state(gm) -> dict[str, dict[str, bool]]:
    """For each conv node (by its module's name): is its weight dequantized per channel, its input per tensor."""
    state = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and "conv" in str(n.target):
            x, w = n.args[0], n.args[1]
            state[_module_of(n)] = {
                "weight_int8": getattr(w, "op", "") == "call_function" and DEQUANT_W in str(w.target),
                "input_int8": getattr(x, "op", "") == "call_function" and DEQUANT_A in str(x.target),
            }
    return state


SCALE_TOL = 0.02  # an activation scale within 2% of what the given batches give (order or concatenation: 0%)


def draw_calibration(c: Any, model: nn.Module) -> list[torch.Tensor]:
    """Three calibration batches of distinct sizes, each holding an extreme no other holds: the lowest input values
    (a batch shifted down), the highest (shifted up) and the highest first-layer activations (a narrower batch that
    matches the first conv's strongest filter, per channel) so calibrating on any one or two of them, on the widest
    only, or on synthetic data over the same range, changes an activation scale."""
    conv = model[0]
    w = conv.weight.detach()
    k = int((w.sum(dim=(2, 3)).abs().sum(1) + conv.bias.detach()).argmax())  # the filter a constant image drives
    sign = w[k].sum(dim=(1, 2)).sign().view(1, 3, 1, 1)
    s, m = c.rng.uniform(1.0, 3.0), c.rng.uniform(1.5, 2.5)
    sizes = c.rng.sample(range(3, 12), 3)
    low = c.randn(sizes[0], 3, 8, 8) * s - m * s
    high = c.randn(sizes[1], 3, 8, 8) * s + m * s
    matched = sign * 3.0 * s + c.randn(sizes[2], 3, 8, 8) * (0.1 * s)
    calib = [low, high, matched]
    c.rng.shuffle(calib)
    return calib


def activation_scales(model: nn.Module, batches: list[torch.Tensor], *, is_qat: bool = False) -> dict[str, float]:
    """The INT8 scale an X86InductorQuantizer activation observer (the default config's, or with ``is_qat`` the
    QAT config's fake quantizer) gives the model's input and each ReLU's output when the batches run through the
    model in order (forward hooks on the eager model: no export needed)."""
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import get_default_x86_inductor_quantization_config

    spec = get_default_x86_inductor_quantization_config(is_qat=is_qat).input_activation
    names = ["input", *(n for n, m in model.named_children() if isinstance(m, nn.ReLU))]
    observers = {n: spec.observer_or_fake_quant_ctr() for n in names}
    seen: dict[str, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda _m, _a, out, n=n: seen.__setitem__(n, out))
             for n, m in model.named_children() if n in observers]  # fmt: skip
    try:
        with torch.no_grad():
            for x in batches:
                seen["input"] = x
                model(x)
                for n, obs in observers.items():
                    obs(seen[n])
    finally:
        for h in hooks:
            h.remove()
    return {n: float(obs.calculate_qparams()[0]) for n, obs in observers.items()}


def graph_scales(gm: torch.fx.GraphModule) -> dict[str, float]:
    """The INT8 scale of each activation quantized in the converted graph: the input's and each ReLU's output."""
    out = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and QUANT in str(n.target) and isinstance(n.args[1], float):
            src = n.args[0]
            if getattr(src, "op", "") == "placeholder":
                out["input"] = float(n.args[1])
            elif "relu" in str(getattr(src, "target", "")):
                out[_module_of(src)] = float(n.args[1])
    return out


def _scales_match(got: dict[str, float], expected: dict[str, float]) -> bool:
    return all(abs(scale / expected[name] - 1) <= SCALE_TOL for name, scale in got.items())


def judge_scales(got: dict[str, float], expected: dict[str, float], qat: dict[str, float] | None = None) -> None:
    """Every activation scale in the graph within :data:`SCALE_TOL` of what the given batches give. ``qat``: the
    scales the QAT config's fake quantizers give for the same batches; a graph whose input scale is that one is
    named as such (only the input's: the later activations a QAT graph saw were fake-quantized)."""
    assert "input" in got, "the model's input is not quantized in the graph: calibrate and convert the whole model"
    if qat is not None and not _scales_match(got, expected) and _scales_match({"input": got["input"]}, qat):
        raise AssertionError(
            "the input's INT8 scale is the one the QAT config's fake quantizer gives for the calibration batches "
            "(get_default_x86_inductor_quantization_config(is_qat=True)): post-training static INT8 uses the "
            "default config, get_default_x86_inductor_quantization_config()"
        )
    for name, scale in got.items():
        ratio = scale / expected[name]
        where = "the input" if name == "input" else f"the output of ReLU '{name}'"
        assert abs(ratio - 1) <= SCALE_TOL, (
            f"the INT8 scale of {where} is {ratio:.2f}x what observers fed the calibration batches give: the "
            "observers saw other data (a subset of the batches, the widest one only, synthetic values over their "
            "range, or batches of your own). Run every given batch, and nothing else, through the prepared model "
            "before convert_pt2e"
        )


def draw_pt2e_case(c: Any) -> tuple[nn.Sequential, list[str], list[torch.Tensor], tuple, list[str]]:
    """What a seed draws for 05.pt2e: the CNN, its conv names, the calibration batches, the example input, and the
    two convs to keep FP32 (each later conv once, in random order: the first conv's input quantizer is the
    calibration probe, and a submission that keeps a layer of its own choosing fails one of the two calls)."""
    model = _random_cnn(c)
    convs = [n for n, m in model.named_children() if isinstance(m, nn.Conv2d)]
    calib = draw_calibration(c, model)
    example = (calib[0][:2].clone(),)
    return model, convs, calib, example, c.rng.sample(convs[1:], 2)


def judge_pt2e_graph(gm: Any, convs: list[str], keep: str) -> dict[str, dict[str, bool]]:
    """The returned graph's structure: a converted GraphModule (no observers left) with INT8 quantize/dequantize
    ops, every conv's weight and input INT8 except ``keep``'s. Returns each conv's state."""
    if not isinstance(gm, torch.fx.GraphModule):
        raise AssertionError(
            f"returned a {type(gm).__name__}, not the converted graph: static INT8 is torch.export.export(...)"
            ".module() -> prepare_pt2e(..., X86InductorQuantizer()) -> calibration -> convert_pt2e"
        )
    observers = [n for n, _ in gm.named_modules() if "activation_post_process" in n]
    assert not observers, f"observers {observers[:2]} are still in the graph: call convert_pt2e after calibrating"
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert not any("choose_qparams" in t for t in targets), (
        "the graph computes activation scales while it runs (choose_qparams nodes): that is dynamic quantization "
        "(a config with is_dynamic=True). Static INT8 takes its scales from calibration: "
        "get_default_x86_inductor_quantization_config()"
    )
    assert any(QUANT in t for t in targets) and any(DEQUANT_W in t for t in targets), (
        "the graph holds no INT8 quantize/dequantize ops: prepare_pt2e with "
        "X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config()), calibrate, "
        "convert_pt2e"
    )
    state = _conv_state(gm)
    assert set(state) >= set(convs), f"convolutions {sorted(set(convs) - set(state))} are missing from the graph"
    assert not state[keep]["weight_int8"] and not state[keep]["input_int8"], (
        f"conv '{keep}' (keep_fp32) was quantized: quantizer.set_module_name_qconfig('{keep}', None) before "
        "prepare_pt2e keeps it FP32"
    )
    fp32 = [n for n in convs if n != keep and not state[n]["weight_int8"]]
    assert not fp32, f"conv(s) {fp32} stayed FP32: only '{keep}' should (set_global quantizes the rest)"
    return state


def conv_input_shapes(log: OpLog) -> set[tuple[int, ...]]:
    """The concrete input shapes of the convolutions that ran (export's symbolic traces left out)."""
    return {op.in_shapes[0] for op in log.named("conv")
            if op.in_shapes and all(type(d) is int for d in op.in_shapes[0])}  # fmt: skip


def judge_calibration_ran(ran: set[tuple[int, ...]], calib: list[torch.Tensor]) -> None:
    """Every calibration batch ran through the model (its shape among the convs' inputs), or all of them as one."""
    missed = [tuple(x.shape) for x in calib if tuple(x.shape) not in ran]
    if any(shape[0] >= sum(x.shape[0] for x in calib) for shape in ran):
        missed = []  # the batches concatenated into one: the same images, one pass
    assert not missed, (
        f"calibration batches of shape {missed} never ran through the prepared model: calibrate on every "
        "batch you were given (run prepared(x) for each)"
    )


DYNAMIC_BATCH = "Export with a dynamic batch, dynamic_shapes=({0: torch.export.Dim('batch', min=1, max=...)},)"


def serve(gm: Any, x: torch.Tensor) -> torch.Tensor:
    """The converted graph's output for ``x``; a batch size its export guards reject is named."""
    try:
        return gm(x)
    except Exception as exc:
        if "Guard failed" in str(exc) and "size()[0]" in str(exc):
            raise AssertionError(
                f"the returned graph rejects a batch of {x.shape[0]} ({exc}): its batch dimension is fixed or bounded "
                f"too tightly to serve any batch size. {DYNAMIC_BATCH} with a max well above the calibration batches"
            ) from None
        raise


def _check_pt2e(fn: Callable[[nn.Module, tuple, list[torch.Tensor], str], nn.Module]) -> None:
    with cases("05.pt2e") as c:
        model, convs, calib, example, keeps = draw_pt2e_case(c)
        expected = activation_scales(model, calib)  # what observers fed exactly these batches give
        seen = []
        for keep in keeps:
            with OpLog() as log:
                try:
                    gm = fn(copy.deepcopy(model), example, [x.clone() for x in calib], keep)
                except Exception as exc:
                    if "Guard failed" in str(exc) and "size()[0]" in str(exc):
                        sizes = sorted(x.shape[0] for x in calib)
                        raise AssertionError(
                            f"a calibration batch did not fit the exported graph ({exc}): its batch dimension is "
                            f"fixed or bounded too tightly. {DYNAMIC_BATCH}, covering every batch (sizes {sizes})"
                        ) from None
                    raise
            judge_pt2e_graph(gm, convs, keep)
            judge_calibration_ran(conv_input_shapes(log), calib)
            got = graph_scales(gm)
            judge_scales(
                got, expected, None if _scales_match(got, expected) else activation_scales(model, calib, is_qat=True)
            )
            # served at batch 1 and at every calibration image at once (a batch larger than any calibration batch)
            one, x = calib[c.randint(0, len(calib) - 1)][:1].clone(), torch.cat(calib)
            with torch.no_grad():
                outs = [serve(gm, one), serve(gm, x)]
                assert tuple(outs[0].shape) == tuple(model(one).shape), (
                    f"the graph returns shape {tuple(outs[0].shape)} for a batch of 1, FP32 {tuple(model(one).shape)}"
                )
                cmp = compare_outputs(outs[1], model(x), "int8")
            assert cmp.cosine >= 0.95, f"the INT8 graph's output cosine to FP32 is {cmp.cosine:.4f} (< 0.95): {cmp}"
            seen.append(f"keep '{keep}': {len(convs) - 1} convs with INT8 weights and inputs, '{keep}' without; the "
                        f"activation scales of {sorted(graph_scales(gm))} within {SCALE_TOL:.0%} of what observers "
                        f"fed the {len(calib)} given batches give; output cosine {cmp.cosine:.4f}")  # fmt: skip
    observed("; ".join(seen))


@exercise(
    "05.pt2e",
    "static_int8(model, example, calib, keep_fp32): PT2E static INT8: torch.export.export (dynamic batch), "
    "X86InductorQuantizer with the default config globally and set_module_name_qconfig(keep_fp32, None), "
    "prepare_pt2e, run every calibration batch, convert_pt2e; return the converted graph module.",
    _check_pt2e,
)
def static_int8(model: nn.Module, example: tuple, calib: list[torch.Tensor], keep_fp32: str) -> nn.Module:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    batch = torch.export.Dim("batch", min=1, max=1024)
    exported = torch.export.export(model, example, dynamic_shapes=({0: batch},))
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    quantizer.set_module_name_qconfig(keep_fp32, None)
    prepared = prepare_pt2e(exported.module(), quantizer)
    with torch.no_grad():
        for x in calib:
            prepared(x)
    return convert_pt2e(prepared)
