"""Bring your own model: try the course's techniques on any ``nn.Module`` and see which pay on this machine.

:func:`optimize` takes a model, an example input and an accuracy function, and goes through the techniques
in the course's order: baseline, batching, reduced precision (04), ``torch.compile`` (06), ONNX Runtime (07),
TensorRT (08, GPU only) and INT8 quantization (05). Each variant's outputs are first compared with the
baseline's (:func:`course_utils.measuring.outputs.compare_outputs`, tolerance per precision; on CUDA, FP32 variants are
held to the TF32 tolerance, since cuDNN convolutions run TF32 by default) and its accuracy is checked against a
budget; only a variant that computes the same thing is timed. What does not apply here, or whose package
does not import, is skipped with the reason. The result is an
:class:`~course_utils.capstone.optimizing.report.OptimizeReport`.

Errors: with ``on_error="raise"`` a technique that fails stops the run with its exception (the tests and smoke
runs do this, so a broken technique cannot hide as a row); with ``"record"`` it becomes a ``failed: ...`` row
and the other techniques still run. Default: ``COURSE_OPTIMIZE_ON_ERROR`` if set, else ``raise`` in smoke mode
and ``record`` otherwise. Lesson 14 builds the same techniques by hand first; this is the automated cross-check.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from course_utils.capstone.optimizing.report import COLUMNS, OptimizeReport, Step, cumulative_speedup, decision_guide
from course_utils.capstone.optimizing.techniques import LINEAR_HEAVY_SHARE, linear_share
from course_utils.capstone.optimizing.techniques import Skip as _Skip
from course_utils.capstone.optimizing.techniques import Variant as _Variant
from course_utils.capstone.optimizing.techniques import batching as _batching
from course_utils.capstone.optimizing.techniques import compile_model as _compile
from course_utils.capstone.optimizing.techniques import int8 as _int8
from course_utils.capstone.optimizing.techniques import onnxruntime as _onnxruntime
from course_utils.capstone.optimizing.techniques import precision as _precision
from course_utils.capstone.optimizing.techniques import tensorrt as _tensorrt
from course_utils.measuring.comparing import compare
from course_utils.measuring.device import synchronize
from course_utils.measuring.outputs import compare_outputs
from course_utils.measuring.timing import measure
from course_utils.supply.errors import CourseError

__all__ = ["COLUMNS", "LINEAR_HEAVY_SHARE", "TECHNIQUES", "OptimizeInputError", "OptimizeReport", "Step",
           "cumulative_speedup", "decision_guide", "linear_share", "optimize"]  # fmt: skip

TECHNIQUES: tuple[str, ...] = ("baseline", "batching", "precision", "compile", "onnxruntime", "tensorrt", "int8")
"""The techniques :func:`optimize` knows, in the order it tries them (the course's order)."""

ON_ERROR_ENV = "COURSE_OPTIMIZE_ON_ERROR"


class OptimizeInputError(CourseError, ValueError):
    """The model, example or options given to :func:`optimize` cannot be used as they are."""


class _Runner:
    """What ``accuracy_fn`` receives: call it on a batch (any device); returns float32 outputs."""

    def __init__(self, run: Callable[[torch.Tensor], torch.Tensor], device: torch.device, name: str) -> None:
        self._run, self.device, self.name = run, device, name

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self._run(x.to(self.device))

    def __repr__(self) -> str:
        return f"<optimized variant '{self.name}' on {self.device}>"


def _on_error(value: str | None) -> str:
    from course_utils.supply.modes import is_smoke

    value = value or os.environ.get(ON_ERROR_ENV, "").strip().lower() or ("raise" if is_smoke() else "record")
    if value not in ("raise", "record"):
        raise OptimizeInputError(f"on_error / {ON_ERROR_ENV}='{value}': use 'raise' or 'record'")
    return value


def _tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    raise OptimizeInputError(
        f"the model returned {type(out).__name__}, but optimize() compares tensors: wrap the model so that "
        "forward returns one tensor (e.g. `lambda x: model(x)['logits']` inside a small nn.Module)."
    )


def _bigger_batch(example: torch.Tensor, target: int) -> torch.Tensor:
    reps = math.ceil(target / example.shape[0])
    return example.repeat(reps, *([1] * (example.ndim - 1)))[:target].contiguous()


def optimize(
    model: nn.Module,
    example: torch.Tensor,
    accuracy_fn: Callable[[nn.Module | Callable], float],
    *,
    device: str | torch.device | None = None,
    accuracy_budget: float = 0.01,
    techniques: Sequence[str] | None = None,
    batch_size: int | None = None,
    has_batch_dim: bool | None = None,
    model_name: str | None = None,
    measure_kwargs: dict[str, Any] | None = None,
    on_error: str | None = None,
    verbose: bool = True,
) -> OptimizeReport:
    """Try each technique on ``model``, verify it against the baseline, time it, and return a report.

    * ``example``: one input batch, as production sends it (its batch size is the baseline's).
    * ``accuracy_fn(run) -> float``: your quality metric (higher is better); ``run`` behaves like the model.
    * ``accuracy_budget``: the largest accuracy drop below the baseline that still counts as "within budget".
    * ``techniques``: a subset of :data:`TECHNIQUES` (baseline always runs); the others are "not requested".
    * ``batch_size``: the larger batch the batching step tries (default 32, 8 in smoke mode).
    * ``has_batch_dim``: whether dim 0 of ``example`` is a batch (default: ``example.ndim >= 2``).
    * ``on_error``: ``"raise"`` or ``"record"`` (see the module's docstring).
    """
    from course_utils.measuring.device import get_device
    from course_utils.supply.modes import pick

    if not isinstance(model, nn.Module):
        raise OptimizeInputError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(example, torch.Tensor):
        raise OptimizeInputError(f"example must be one torch.Tensor input batch, got {type(example).__name__}")
    if not callable(accuracy_fn):
        raise OptimizeInputError("accuracy_fn must be callable: accuracy_fn(run) -> float, higher is better")
    wanted = list(TECHNIQUES) if techniques is None else ["baseline", *techniques]
    unknown = sorted(set(wanted) - set(TECHNIQUES))
    if unknown:
        raise OptimizeInputError(f"unknown technique(s) {unknown}: choose from {list(TECHNIQUES)}")
    if accuracy_budget < 0:
        raise OptimizeInputError("accuracy_budget is an allowed drop, e.g. 0.01 for one point: it cannot be negative")
    errors = _on_error(on_error)
    dev = get_device(device)
    model, example = model.eval().to(dev), example.to(dev)
    batched = example.ndim >= 2 if has_batch_dim is None else has_batch_dim
    b = int(example.shape[0]) if batched else 1
    big = batch_size or pick(full=32, smoke=8)
    mkw = dict(measure_kwargs or {})
    log = print if verbose else (lambda *a, **k: None)
    fp32_tol = "tf32" if dev.type == "cuda" else "fp32"  # default cuDNN convolutions run TF32

    with torch.inference_mode():
        ref = _tensor(model(example)).float()

    def eager(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model(x).float()

    base_acc = float(accuracy_fn(_Runner(eager, dev, "baseline")))
    base_m = measure(lambda: eager(example), device=dev, batch_size=b, label="baseline", **mkw)
    # measure()'s settings for cu.compare's rounds: each round times at least min_repeats calls for min_time_s
    ckw = {k2: mkw[k] for k, k2 in (("min_time_s", "min_round_s"), ("min_repeats", "min_calls"), ("warmup", "warmup"))
           if k in mkw}  # fmt: skip
    steps = [Step("baseline", True, f"eager fp32, {torch.get_num_threads()} threads", b, base_m.median_ms,
                  base_m.throughput, 1.0, base_acc, True, "reference", 0.0, base_m, None, "fp32")]  # fmt: skip
    log(f"baseline: {base_m.median_ms:.3f} ms per batch of {b}, accuracy {base_acc:.4f}")

    def evaluate(v: _Variant, x: torch.Tensor, reuse_accuracy: float | None = None) -> Step:
        n = int(x.shape[0]) if batched else 1
        synchronize(dev)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = _tensor(v.run(x)).float()
        synchronize(dev)  # GPU work is asynchronous: stop the clock when it has finished
        first_call_s = time.perf_counter() - t0
        tol = fp32_tol if v.precision == "fp32" else v.precision
        cmp = compare_outputs(out[:b] if batched else out, ref, tol)
        acc = reuse_accuracy if reuse_accuracy is not None else float(accuracy_fn(_Runner(v.run, dev, v.name)))
        within = cmp.within and base_acc - acc <= accuracy_budget + 1e-12
        check = str(cmp).split("]", 1)[-1].strip()
        step = Step(v.name, True, v.note, n, accuracy=acc, within_budget=within, check=check,
                    setup_s=v.setup_s + first_call_s, comparison=cmp, precision=v.precision)  # fmt: skip
        log(f"{v.name}: {cmp}")
        if not cmp.within:
            step.reason = (v.note + "; " if v.note else "") + f"outputs outside the {tol} tolerance, not timed"
            return step
        # the variant and the baseline take turns in rounds; per item, so a bigger batch is judged by throughput
        pair = compare({"baseline": lambda: eager(example), v.name: lambda: _Runner(v.run, dev, v.name)(x)},
                       baseline="baseline", device=dev, items={"baseline": b, v.name: n}, **ckw)  # fmt: skip
        m = pair.measurements[v.name]
        step.measurement, step.median_ms, step.throughput = m, m.median_ms, m.throughput
        step.ratio = pair.ratio(v.name)
        step.speedup = step.ratio.estimate
        if base_acc - acc > accuracy_budget + 1e-12:
            step.reason = (v.note + "; " if v.note else "") + f"accuracy drop {base_acc - acc:.4f} > budget"
        log(f"{v.name}: {m.median_ms:.3f} ms per batch of {n}, {step.ratio} the baseline, accuracy {acc:.4f}")
        return step

    def failed(name: str, when: str, exc: Exception) -> Step:
        if errors == "raise" or isinstance(exc, CourseError):
            raise exc  # strict GPU mode, bad input, and (on_error="raise") every failure stop the run
        log(f"{name}: failed {when}: {exc}")
        return Step(name, False, f"failed {when}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")

    builders: dict[str, Callable[[], list[_Variant]]] = {
        "batching": lambda: _batching(eager, batched, b, big),
        "precision": lambda: _precision(model, dev),
        "compile": lambda: _compile(model),
        "onnxruntime": lambda: _onnxruntime(model, example, ref, dev),
        "tensorrt": lambda: _tensorrt(model, example, dev, max(big, b)),
        "int8": lambda: _int8(model, compiled="compile" in wanted),
    }
    variants: dict[str, tuple[_Variant, Step]] = {}
    for tech in TECHNIQUES[1:]:
        if tech not in wanted:
            steps.append(Step(tech, False, "not requested (techniques=...)"))
            continue
        try:
            built = builders[tech]()
        except _Skip as exc:
            steps.append(Step(tech, False, str(exc)))
            log(f"{tech}: skipped: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - recorded or re-raised by failed()
            steps.append(failed(tech, "to build", exc))
            continue
        for v in built:
            x = _bigger_batch(example, big) if tech == "batching" else example
            try:
                step = evaluate(v, x, base_acc if tech == "batching" else None)
            except Exception as exc:  # noqa: BLE001
                step = failed(v.name, "when run", exc)
            steps.append(step)
            variants[v.name] = (v, step)
    steps += _stacked(variants, evaluate, example, big, failed)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return OptimizeReport(steps, str(dev), base_acc, accuracy_budget, b, torch.get_num_threads(),
                          model_name or type(model).__name__, load)  # fmt: skip


def _pays(step: Step) -> bool:
    return bool(step.applied and step.within_budget and step.speedup is not None and step.speedup > 1.0)


def _stacked(variants, evaluate, example: torch.Tensor, big: int, failed) -> list[Step]:
    """If batching pays and another technique does too, run the best one at the larger batch as well."""
    if "batching" not in variants or not _pays(variants["batching"][1]):
        return []
    others = [(s.speedup, v, s) for k, (v, s) in variants.items() if k != "batching" and _pays(s)]
    if not others:
        return []
    _, v, s = max(others, key=lambda t: t[0])
    stacked = _Variant(f"batching + {v.name}", v.run, v.precision, v.setup_s, f"{v.name} at batch {big}")
    try:
        return [evaluate(stacked, _bigger_batch(example, big), s.accuracy)]
    except Exception as exc:  # noqa: BLE001
        return [failed(stacked.name, "when run", exc)]
