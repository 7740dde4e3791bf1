"""Bring your own model: try the course's techniques on any ``nn.Module`` and see which pay on this machine.

:func:`optimize` takes a model, an example input and an accuracy function, and goes through the techniques
in the course's order: baseline, batching, reduced precision, ``torch.compile``, ONNX Runtime, TensorRT
(GPU only) and INT8 quantization. Each variant's outputs are first compared with the baseline's
(:func:`course_utils.compare.compare_outputs`, tolerance per precision) and its accuracy is checked against an
accuracy budget; only a variant that computes the same thing is timed (:func:`course_utils.timing.measure`).
What does not apply here is skipped with the reason. The result, :class:`OptimizeReport`, holds a table
(``report.df``), a plot (``report.plot()``) and can write its rows to the results folder
(``report.record(...)``); :func:`decision_guide` turns it into "on this machine, try X first".

Lesson 14 runs it on one model; learners point it at their own afterwards.
"""

from __future__ import annotations

import copy
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from .compare import Comparison, compare_outputs
from .device import synchronize
from .errors import CourseError
from .timing import Measurement, measure

TECHNIQUES: tuple[str, ...] = ("baseline", "batching", "precision", "compile", "onnxruntime", "tensorrt", "int8")
"""The techniques :func:`optimize` knows, in the order it tries them (the course's order)."""

LINEAR_HEAVY_SHARE = 0.5
"""Dynamic INT8 quantizes Linear (and RNN) layers only: it is tried when at least this share of the
parameters sits in ``nn.Linear`` layers."""

COLUMNS = ["technique", "applied", "reason", "batch_size", "median_ms", "throughput", "speedup", "accuracy",
           "within_budget", "check", "setup_s"]  # fmt: skip


class OptimizeInputError(CourseError, ValueError):
    """The model, example or options given to :func:`optimize` cannot be used as they are."""


class _Skip(Exception):
    """Raised by a technique builder: the technique does not apply here (the message says why)."""


@dataclass
class Step:
    """One row of the report: a technique, whether it ran, why not, and what it measured."""

    technique: str
    applied: bool
    reason: str = ""
    batch_size: int | None = None
    median_ms: float | None = None
    throughput: float | None = None
    speedup: float | None = None
    accuracy: float | None = None
    within_budget: bool | None = None
    check: str = ""
    setup_s: float | None = None
    measurement: Measurement | None = field(default=None, repr=False)
    comparison: Comparison | None = field(default=None, repr=False)
    precision: str = "fp32"

    def row(self) -> dict[str, Any]:
        return {c: getattr(self, c) for c in COLUMNS}


@dataclass
class _Variant:
    """A runnable version of the model: ``run(x)`` takes an input on the device and returns fp32 outputs."""

    name: str
    run: Callable[[torch.Tensor], torch.Tensor]
    precision: str = "fp32"
    setup_s: float = 0.0
    note: str = ""


class _Runner:
    """What ``accuracy_fn`` receives: call it on a batch (any device); returns float32 outputs."""

    def __init__(self, run: Callable[[torch.Tensor], torch.Tensor], device: torch.device, name: str) -> None:
        self._run, self.device, self.name = run, device, name

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x.to(self.device))

    def __repr__(self) -> str:
        return f"<optimized variant '{self.name}' on {self.device}>"


@dataclass
class OptimizeReport:
    """What :func:`optimize` found: one :class:`Step` per technique, plus the settings it ran with."""

    steps: list[Step]
    device: str
    baseline_accuracy: float
    accuracy_budget: float
    example_batch: int
    threads: int
    model_name: str = "model"
    load_avg: float | None = None

    @property
    def busy(self) -> bool:
        """True when other work competed for the CPU during the run (1-minute load above the core count)."""
        import os

        return self.load_avg is not None and self.load_avg > (os.cpu_count() or 1)

    @property
    def df(self) -> pd.DataFrame:
        """The table: technique, applied, reason, batch size, median ms, throughput, speed-up, accuracy, ..."""
        df = pd.DataFrame([s.row() for s in self.steps], columns=COLUMNS)
        df["batch_size"] = df["batch_size"].astype("Int64")
        df["cumulative_speedup"] = cumulative_speedup(df)
        return df

    def step(self, technique: str) -> Step:
        """The first step whose technique name starts with ``technique`` (KeyError if none)."""
        for s in self.steps:
            if s.technique == technique or s.technique.startswith(technique + " "):
                return s
        raise KeyError(f"no step '{technique}'; steps: {[s.technique for s in self.steps]}")

    def paying(self, min_gain: float = 1.05) -> pd.DataFrame:
        """Rows that ran, stayed within budget and are at least ``min_gain`` times the baseline speed, best first."""
        df = self.df
        ok = df["applied"] & df["within_budget"].fillna(False).astype(bool) & (df["technique"] != "baseline")
        df = df[ok & (df["speedup"].astype(float) >= min_gain)]
        return df.sort_values("speedup", ascending=False).reset_index(drop=True)

    def plot(self, *, title: str | None = None):
        """Two panels: speed-up per technique (with the best-so-far line) and accuracy against the budget."""
        import matplotlib.pyplot as plt

        df = self.df
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 0.45 * len(df) + 2.2), sharey=True)
        names = list(df["technique"])
        ypos = list(range(len(df)))
        speed = df["speedup"].astype(float).fillna(0.0)
        colors = []
        for _, r in df.iterrows():
            if not r["applied"] or pd.isna(r["speedup"]):
                colors.append("lightgray")
            elif not r["within_budget"]:
                colors.append("tab:orange")
            else:
                colors.append("tab:green" if r["speedup"] >= 1.0 else "tab:red")
        ax1.barh(ypos, speed, color=colors)
        ax1.plot(df["cumulative_speedup"].astype(float), ypos, color="black", marker="o", lw=1.2,
                 label="best so far (cumulative)")  # fmt: skip
        ax1.axvline(1.0, color="black", lw=0.8)
        for i, r in df.iterrows():
            if pd.notna(r["speedup"]):
                text = f" {r['speedup']:.2f}x"
            else:
                text = " skipped" if not r["applied"] else " not timed"
            ax1.text(speed.iloc[i], i, text, va="center", fontsize=8)
        ax1.set_yticks(ypos, names)
        ax1.invert_yaxis()
        ax1.set_xlabel("speed-up vs baseline (throughput, x)")
        ax1.legend(loc="lower right", fontsize=8)
        acc = df["accuracy"].astype(float)
        ax2.scatter(acc, ypos, color=colors, s=50, zorder=3)
        ax2.axvline(self.baseline_accuracy, color="black", lw=0.8, label="baseline")
        ax2.axvspan(self.baseline_accuracy - self.accuracy_budget, self.baseline_accuracy, color="tab:green",
                    alpha=0.12, label=f"budget ({self.accuracy_budget:g})")  # fmt: skip
        ax2.set_xlabel("accuracy (your accuracy_fn)")
        ax2.legend(loc="lower left", fontsize=8)
        fig.suptitle(title or f"{self.model_name} on {self.device}: what pays here (gray: skipped or not timed)")
        fig.tight_layout()
        return fig

    def record(self, lesson: str, *, model: str | None = None) -> int:
        """Write one results row per timed step (via :func:`course_utils.results.record`); return how many."""
        from .results import record

        n = 0
        for s in self.steps:
            if s.measurement is None:
                continue
            err = None if s.comparison is None else s.comparison.max_rel
            record(lesson, s.technique, model=model or self.model_name, device=self.device, dtype=s.precision,
                   measurement=s.measurement, speedup_vs_baseline=s.speedup, error_vs_baseline=err,
                   notes=f"accuracy {s.accuracy:.4f}; {s.reason}" if s.accuracy is not None else s.reason)  # fmt: skip
            n += 1
        return n


def cumulative_speedup(df: pd.DataFrame) -> pd.Series:
    """Best speed-up found so far, going down the table: only steps that ran within budget count."""
    best, out = 1.0, []
    for _, r in df.iterrows():
        if r["applied"] and bool(r["within_budget"]) and pd.notna(r["speedup"]):
            best = max(best, float(r["speedup"]))
        out.append(best)
    return pd.Series(out, index=df.index, dtype=float)


def linear_share(model: nn.Module) -> float:
    """Share of the model's parameters held by ``nn.Linear`` layers (0.0 for a model without any)."""
    total = sum(p.numel() for p in model.parameters())
    if total == 0:
        return 0.0
    lin = sum(p.numel() for m in model.modules() if isinstance(m, nn.Linear) for p in m.parameters(recurse=False))
    return lin / total


def _first_tensor(out: Any) -> torch.Tensor:
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
    verbose: bool = True,
) -> OptimizeReport:
    """Try each technique on ``model``, verify it against the baseline, time it, and return a report.

    * ``example``: one input batch, as the model will see it in production (its batch size is the baseline's).
    * ``accuracy_fn(run) -> float``: your quality metric (higher is better). ``run`` is a callable taking a
      batch of inputs (on any device) and returning float32 outputs; call it like the model.
    * ``accuracy_budget``: the largest accuracy drop below the baseline that still counts as "within budget".
    * ``techniques``: a subset of :data:`TECHNIQUES` (baseline always runs); the others appear as skipped
      ("not requested"). Leave out ``"compile"`` for a quick look: a cold ``torch.compile`` costs tens of
      seconds on a small CPU.
    * ``batch_size``: the larger batch the batching step tries (default 32, 8 in smoke mode).
    * ``has_batch_dim``: whether dim 0 of ``example`` is a batch (default: ``example.ndim >= 2``).

    A variant whose outputs differ from the baseline beyond the tolerance of its precision is not timed:
    a speed-up of something that computes something else is no speed-up.
    """
    from .device import get_device
    from .modes import pick

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

    dev = get_device(device)
    model = model.eval().to(dev)
    example = example.to(dev)
    batched = example.ndim >= 2 if has_batch_dim is None else has_batch_dim
    b = int(example.shape[0]) if batched else 1
    big = batch_size or pick(full=32, smoke=8)
    mkw = dict(measure_kwargs or {})
    name = model_name or type(model).__name__
    log = print if verbose else (lambda *a, **k: None)

    with torch.inference_mode():
        ref = _first_tensor(model(example)).float()

    def eager(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model(x).float()

    base_acc = float(accuracy_fn(_Runner(eager, dev, "baseline")))
    base_m = measure(lambda: eager(example), device=dev, batch_size=b, label="baseline", **mkw)
    base_tp = b / base_m.median_ms
    steps = [Step("baseline", True, f"eager fp32, {torch.get_num_threads()} threads", b, base_m.median_ms,
                  base_m.throughput, 1.0, base_acc, True, "reference", 0.0, base_m, None, "fp32")]  # fmt: skip
    log(f"baseline: {base_m.median_ms:.3f} ms per batch of {b}, accuracy {base_acc:.4f}")

    variants: dict[str, tuple[_Variant, Step]] = {}

    def evaluate(v: _Variant, x: torch.Tensor, *, reuse_accuracy: float | None = None) -> Step:
        n = int(x.shape[0]) if batched else 1
        synchronize(dev)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = _first_tensor(v.run(x)).float()
        synchronize(dev)  # GPU work is asynchronous: stop the clock when it has finished
        first_call_s = time.perf_counter() - t0
        cmp = compare_outputs(out[:b] if batched else out, ref, v.precision)
        acc = reuse_accuracy if reuse_accuracy is not None else float(accuracy_fn(_Runner(v.run, dev, v.name)))
        within = cmp.within and (base_acc - acc) <= accuracy_budget + 1e-12
        check = str(cmp).split("]", 1)[-1].strip()
        step = Step(v.name, True, v.note, n, accuracy=acc, within_budget=within, check=check,
                    setup_s=v.setup_s + first_call_s, comparison=cmp, precision=v.precision)  # fmt: skip
        log(f"{v.name}: {cmp}")
        if not cmp.within:
            step.reason = (v.note + "; " if v.note else "") + f"outputs outside the {v.precision} tolerance, not timed"
            log(f"{v.name}: not timed (outputs differ from the baseline)")
            return step
        m = measure(lambda: v.run(x), device=dev, batch_size=n, label=v.name, **mkw)
        step.measurement, step.median_ms, step.throughput = m, m.median_ms, m.throughput
        step.speedup = (n / m.median_ms) / base_tp
        if base_acc - acc > accuracy_budget + 1e-12:
            step.reason = (v.note + "; " if v.note else "") + f"accuracy drop {base_acc - acc:.4f} > budget"
        log(f"{v.name}: {m.median_ms:.3f} ms per batch of {n}, {step.speedup:.2f}x the baseline, accuracy {acc:.4f}")
        return step

    builders: dict[str, Callable[[], list[_Variant]]] = {
        "batching": lambda: _batching(eager, batched, b, big),
        "precision": lambda: _precision(model, dev),
        "compile": lambda: _compile(model, dev),
        "onnxruntime": lambda: _onnxruntime(model, example, dev),
        "tensorrt": lambda: _tensorrt(model, example, dev, max(big, b)),
        "int8": lambda: _int8(model, dev, compiled="compile" in wanted),
    }
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
        except CourseError:
            raise  # strict GPU mode and bad input stop the run
        except Exception as exc:  # noqa: BLE001 - a technique that fails is reported, the others still run
            steps.append(Step(tech, False, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"))
            log(f"{tech}: failed: {exc}")
            continue
        for v in built:
            x = _bigger_batch(example, big) if tech == "batching" else example
            try:
                step = evaluate(v, x, reuse_accuracy=base_acc if tech == "batching" else None)
            except CourseError:
                raise
            except Exception as exc:  # noqa: BLE001
                step = Step(v.name, False, f"failed when run: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                log(f"{v.name}: failed when run: {exc}")
            steps.append(step)
            variants[v.name] = (v, step)

    steps += _stacked(variants, evaluate, example, big)
    return OptimizeReport(steps, str(dev), base_acc, accuracy_budget, b, torch.get_num_threads(), name, _load())


def _load() -> float | None:
    """The 1-minute load average (None where the OS does not report one)."""
    import os

    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _pays(step: Step) -> bool:
    return bool(step.applied and step.within_budget and step.speedup is not None and step.speedup > 1.0)


def _stacked(variants: dict[str, tuple[_Variant, Step]], evaluate, example: torch.Tensor, big: int) -> list[Step]:
    """If batching pays and another technique does too, run the best one at the larger batch as well."""
    if "batching" not in variants or not _pays(variants["batching"][1]):
        return []
    others = [(s.speedup, v, s) for k, (v, s) in variants.items() if k != "batching" and _pays(s)]
    if not others:
        return []
    _, v, s = max(others, key=lambda t: t[0])
    stacked = _Variant(f"batching + {v.name}", v.run, v.precision, v.setup_s, f"{v.name} at batch {big}")
    try:
        return [evaluate(stacked, _bigger_batch(example, big), reuse_accuracy=s.accuracy)]
    except Exception as exc:  # noqa: BLE001
        return [Step(stacked.name, False, f"failed when run: {type(exc).__name__}: {exc}")]


# --- the techniques -------------------------------------------------------------------------------------


def _batching(eager, batched: bool, b: int, big: int) -> list[_Variant]:
    if not batched:
        raise _Skip("not applicable: the example has no batch dimension (pass has_batch_dim=True if dim 0 is one)")
    if b >= big:
        raise _Skip(f"the example already has batch {b} >= the batching step's batch {big} (set batch_size=)")
    return [_Variant("batching", eager, "fp32", 0.0, f"same model, batch {big} instead of {b}")]


def _precision(model: nn.Module, dev: torch.device) -> list[_Variant]:
    if dev.type == "cuda":
        dtypes = [("fp16", torch.float16)] + ([("bf16", torch.bfloat16)] if torch.cuda.is_bf16_supported() else [])
    elif dev.type == "cpu":
        dtypes = [("bf16", torch.bfloat16)]
    else:
        raise _Skip(f"autocast is not tried on {dev.type}")
    out = []
    for label, dt in dtypes:

        def run(x: torch.Tensor, dt: torch.dtype = dt) -> torch.Tensor:
            with torch.inference_mode(), torch.autocast(dev.type, dtype=dt):
                return model(x).float()

        from .device import cpu_flags

        note = f"torch.autocast('{dev.type}', dtype={dt})"
        if dev.type == "cpu" and not ({"avx512_bf16", "amx_bf16"} & cpu_flags()):
            note += "; this CPU has no BF16 instructions (emulated)"
        out.append(_Variant(f"precision {label}", run, label, 0.0, note))
    return out


def _compile(model: nn.Module, dev: torch.device) -> list[_Variant]:
    compiled = torch.compile(copy.deepcopy(model))

    def run(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return compiled(x).float()

    return [_Variant("compile", run, "fp32", 0.0, "torch.compile (inductor, default mode); setup = first call")]


def _onnxruntime(model: nn.Module, example: torch.Tensor, dev: torch.device) -> list[_Variant]:
    from .modes import missing_modules

    if missing_modules(("onnxruntime", "onnx", "onnxscript")):
        raise _Skip("missing Python package(s): " + ", ".join(missing_modules(("onnxruntime", "onnx", "onnxscript"))))
    from . import backends

    t0 = time.perf_counter()
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if dev.type == "cuda" else ["CPUExecutionProvider"]
    with tempfile.TemporaryDirectory(prefix="optimize_onnx_") as tmp:  # the session keeps the graph in memory
        path = backends.export_onnx(copy.deepcopy(model).cpu(), example.cpu(), Path(tmp) / "m.onnx", dynamic_batch=True)
        session = backends.ort_session(path, providers=providers, level="all", strict=False)
    runner = backends.ort_runner(session)
    setup = time.perf_counter() - t0
    used = session.get_providers()
    note = f"ONNX Runtime {used[0]}, level all; setup = export + session"
    if dev.type == "cuda" and used[0] != "CUDAExecutionProvider":
        note += " (CUDA provider did not load: ran on CPU)"

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(runner(x)).float().to(dev)

    return [_Variant("onnxruntime", run, "fp32", setup, note)]


def _tensorrt(model: nn.Module, example: torch.Tensor, dev: torch.device, max_batch: int) -> list[_Variant]:
    """FP16 TensorRT engine built from an FP16 ONNX export (TensorRT 11: strongly typed, no precision flags)."""
    from .modes import gpu_section

    if not gpu_section("14.optimize-tensorrt", needs=("tensorrt", "onnx", "onnxscript")):
        raise _Skip("GPU-only: needs a CUDA GPU and the tensorrt package (see the printed reason)")
    import tensorrt as trt

    from . import backends

    t0 = time.perf_counter()
    half = copy.deepcopy(model).half().to(dev)
    b = int(example.shape[0])
    profile = backends.Profile.for_batch("input", tuple(example.shape[1:]), 1, b, max(max_batch, b))
    with tempfile.TemporaryDirectory(prefix="optimize_trt_") as tmp:
        onnx_path = backends.export_onnx(half, example.half(), Path(tmp) / "m_fp16.onnx", dynamic_batch=True)
        blob = backends.build_engine(onnx_path, profile=profile)
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(blob)
    runner = backends.TrtRunner(engine)
    setup = time.perf_counter() - t0

    def run(x: torch.Tensor) -> torch.Tensor:
        return runner(x.to(dev, runner.input_dtype)).float()

    return [_Variant("tensorrt fp16", run, "fp16", setup, f"TensorRT {trt.__version__} FP16 engine from ONNX")]


def _int8(model: nn.Module, dev: torch.device, *, compiled: bool) -> list[_Variant]:
    share = linear_share(model)
    if share == 0.0:
        raise _Skip(
            "not applicable: the model has no nn.Linear layers, and dynamic INT8 quantizes only Linear layers "
            "(for convolutions use static PTQ with calibration, lesson 05)"
        )
    if share < LINEAR_HEAVY_SHARE:
        raise _Skip(
            f"not applicable: only {share:.0%} of the parameters are in nn.Linear layers (dynamic INT8 would "
            "quantize only those and leave the rest in fp32; use static PTQ, lesson 05)"
        )
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    t0 = time.perf_counter()
    q = copy.deepcopy(model)
    quantize_(q, Int8DynamicActivationInt8WeightConfig())
    note = f"torchao dynamic INT8 on Linear layers ({share:.0%} of parameters)"
    if compiled:
        q = torch.compile(q)
        note += ", under torch.compile (setup = quantize + first call)"
    else:
        note += ", eager (torchao INT8 pays mostly under torch.compile, which was not requested)"
    setup = time.perf_counter() - t0

    def run(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return q(x).float()

    return [_Variant("int8 dynamic", run, "int8", setup, note)]


# --- reading the report ---------------------------------------------------------------------------------


def decision_guide(report: OptimizeReport, *, min_gain: float = 1.05) -> str:
    """Advice from the report's own numbers: what to try first on this machine, what did not pay, what was skipped.

    ``min_gain`` is the smallest speed-up counted as a gain (timings on a busy machine vary by a few percent).
    """
    df = report.df
    base = df[df["technique"] == "baseline"].iloc[0]
    lines = [
        f"Model {report.model_name} on {report.device} ({report.threads} threads), baseline "
        f"{base['median_ms']:.3f} ms per batch of {report.example_batch}, accuracy {report.baseline_accuracy:.4f} "
        f"(budget: a drop of at most {report.accuracy_budget:g})."
    ]
    if report.busy:
        import os

        lines.append(
            f"Caution: the machine was busy during this run (load average {report.load_avg:.1f} on "
            f"{os.cpu_count()} cores): other processes competed for the CPU, so the timings below may be "
            "distorted (multi-threaded eager PyTorch suffers most). Re-run on a quiet machine before deciding."
        )
    paying = report.paying(min_gain)
    if paying.empty:
        lines.append(
            f"On this machine, no technique reached {min_gain:.2f}x the baseline's throughput within the budget: "
            "keep the baseline, and look at the bottleneck again (lesson 01-02) before optimizing."
        )
    else:
        top = paying.iloc[0]
        lines.append(
            f"On this machine, try {top['technique']} first: {top['speedup']:.2f}x the baseline's throughput, "
            f"accuracy {top['accuracy']:.4f}."
        )
        for _, r in paying.iloc[1:].iterrows():
            lines.append(f"  then {r['technique']}: {r['speedup']:.2f}x, accuracy {r['accuracy']:.4f}")
        if pd.notna(top["setup_s"]) and top["setup_s"] >= 1.0:
            lines.append(f"  ({top['technique']} costs {top['setup_s']:.1f} s of set-up before the first answer.)")
    ran = df[df["applied"] & (df["technique"] != "baseline")]
    slow = ran[ran["speedup"].astype(float) < min_gain]
    for _, r in slow.iterrows():
        verdict = "slower than" if r["speedup"] < 1.0 else "about the same as"
        lines.append(f"Does not pay here: {r['technique']} is {verdict} the baseline ({r['speedup']:.2f}x).")
    for _, r in ran[~ran["within_budget"].fillna(False).astype(bool)].iterrows():
        lines.append(f"Outside the budget: {r['technique']} ({r['reason'] or r['check']}).")
    for _, r in df[~df["applied"]].iterrows():
        lines.append(f"Skipped: {r['technique']}: {r['reason']}")
    return "\n".join(lines)
