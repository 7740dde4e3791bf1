"""optimize() on models no lesson uses: a Conv1d net (no Linear layers) and a small GRU tagger."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from course_utils.capstone import optimize as opt
from course_utils.supply.errors import CourseError


class Conv1dNet(nn.Module):
    """A 1-D conv net over 4-channel sequences, pooled to 6 scores: no Linear layer at all."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(4, 16, 5, padding=2), nn.ReLU(), nn.Conv1d(16, 6, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).mean(-1)


class GRUTagger(nn.Module):
    """A GRU over 8-dim tokens with a wide Linear head: most parameters are in Linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(8, 16, batch_first=True)
        self.head = nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(x)[0][:, -1])


def _setup(model: nn.Module, shape: tuple[int, ...]):
    torch.manual_seed(0)
    model = model.eval()
    data = torch.randn(64, *shape[1:])
    with torch.no_grad():
        labels = model(data).argmax(-1)

    def accuracy(run) -> float:
        return float((run(data).argmax(-1) == labels).float().mean())

    return model, torch.randn(*shape), accuracy


FAST = {"min_time_s": 0.01, "min_repeats": 3, "warmup": 1, "warn_spread": False}


def test_conv1d_net_reports_every_technique():
    model, example, acc = _setup(Conv1dNet(), (2, 4, 32))
    report = opt.optimize(
        model,
        example,
        acc,
        device="cpu",
        techniques=["batching", "precision", "int8"],
        measure_kwargs=FAST,
        verbose=False,
    )
    df = report.df
    assert [t.split(" ")[0] for t in df["technique"][:7]] == list(opt.TECHNIQUES)
    for col in ["technique", "applied", "reason", "median_ms", "speedup", "accuracy", "within_budget"]:
        assert col in df.columns
    base = report.step("baseline")
    assert base.speedup == 1.0 and base.accuracy == 1.0
    batching = report.step("batching")
    assert batching.applied and batching.batch_size == 8 and batching.median_ms > 0
    int8 = report.step("int8")
    assert not int8.applied and "not applicable" in int8.reason and "Linear" in int8.reason
    assert "not requested" in report.step("compile").reason
    bf16 = report.step("precision bf16")
    assert bf16.applied and bf16.comparison is not None
    assert (df["cumulative_speedup"].diff().dropna() >= 0).all()
    guide = opt.decision_guide(report)
    assert "On this machine" in guide and "int8" in guide
    fig = report.plot()
    assert len(fig.axes) == 2


def test_gru_gets_dynamic_int8():
    model, example, acc = _setup(GRUTagger(), (1, 12, 8))
    assert opt.linear_share(model) > opt.LINEAR_HEAVY_SHARE
    report = opt.optimize(model, example, acc, device="cpu", techniques=["int8"], measure_kwargs=FAST, verbose=False)
    step = report.step("int8")
    assert step.applied, step.reason
    assert step.accuracy is not None and step.precision == "int8"
    if step.comparison.within:
        assert step.speedup is not None and step.speedup > 0
    else:
        assert step.speedup is None and "not timed" in step.reason


def test_tensorrt_skips_with_reason_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    model, example, acc = _setup(Conv1dNet(), (2, 4, 32))
    report = opt.optimize(
        model, example, acc, device="cpu", techniques=["tensorrt"], measure_kwargs=FAST, verbose=False
    )
    trt = report.step("tensorrt")
    assert not trt.applied and "GPU" in trt.reason


def test_variant_outside_tolerance_is_not_timed(monkeypatch):
    model, example, acc = _setup(Conv1dNet(), (2, 4, 32))

    def broken_precision(model, dev):
        return [opt._Variant("precision broken", lambda x: model(x) * 0 + 1.0, "bf16", 0.0, "")]

    monkeypatch.setattr(opt, "_precision", broken_precision)
    report = opt.optimize(
        model, example, acc, device="cpu", techniques=["precision"], measure_kwargs=FAST, verbose=False
    )
    step = report.step("precision")
    assert step.applied and step.speedup is None and step.within_budget is False and "not timed" in step.reason
    assert "Outside the budget" in opt.decision_guide(report)


def test_failing_technique_is_reported_and_others_run(monkeypatch):
    model, example, acc = _setup(Conv1dNet(), (2, 4, 32))

    def boom(*a, **k):
        raise RuntimeError("export exploded")

    monkeypatch.setattr(opt, "_onnxruntime", boom)
    report = opt.optimize(
        model,
        example,
        acc,
        device="cpu",
        techniques=["onnxruntime", "batching"],
        measure_kwargs=FAST,
        verbose=False,
        on_error="record",
    )
    assert (
        report.step("onnxruntime").reason.startswith("failed")
        and "export exploded" in report.step("onnxruntime").reason
    )
    assert report.step("batching").applied


def test_failing_technique_raises_in_tests_and_smoke_runs(monkeypatch):
    """The tests (and smoke runs) must not hide a broken technique as a 'failed:' row."""
    model, example, acc = _setup(Conv1dNet(), (2, 4, 32))

    def boom(*a, **k):
        raise RuntimeError("export exploded")

    monkeypatch.setattr(opt, "_onnxruntime", boom)
    with pytest.raises(RuntimeError, match="export exploded"):
        opt.optimize(
            model,
            example,
            acc,
            device="cpu",
            techniques=["onnxruntime"],
            measure_kwargs=FAST,
            verbose=False,
            on_error="raise",
        )
    monkeypatch.setenv("COURSE_SMOKE", "1")
    monkeypatch.delenv(opt.ON_ERROR_ENV, raising=False)
    with pytest.raises(RuntimeError, match="export exploded"):  # default in smoke mode
        opt.optimize(model, example, acc, device="cpu", techniques=["onnxruntime"], measure_kwargs=FAST, verbose=False)
    monkeypatch.setenv(opt.ON_ERROR_ENV, "record")
    report = opt.optimize(
        model, example, acc, device="cpu", techniques=["onnxruntime"], measure_kwargs=FAST, verbose=False
    )
    assert "failed" in report.step("onnxruntime").reason
    monkeypatch.setenv(opt.ON_ERROR_ENV, "ignore")
    with pytest.raises(CourseError, match="'raise' or 'record'"):
        opt.optimize(model, example, acc, device="cpu", techniques=[], measure_kwargs=FAST, verbose=False)


def test_failed_rows_are_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    model, example, acc = _setup(Conv1dNet(), (2, 4, 32))
    monkeypatch.setattr(opt, "_onnxruntime", lambda *a, **k: 1 / 0)
    report = opt.optimize(
        model,
        example,
        acc,
        device="cpu",
        techniques=["onnxruntime"],
        measure_kwargs=FAST,
        verbose=False,
        on_error="record",
    )
    assert report.record("99", model="conv1d") == 2  # the baseline, and the failed step (no timing)
    from course_utils.show import results

    rows = results.load_results(sorted(tmp_path.glob("*.csv")))
    assert rows["notes"].astype(str).str.startswith("failed").sum() == 1


def _broken_package(tmp_path, monkeypatch, name: str) -> None:
    """Make ``import name`` raise a RuntimeError from inside the package, as a half-installed wheel does."""
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('libonnxruntime.so: cannot open shared object file')\n")
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize("how", ["missing", "broken"])
def test_backend_that_fails_to_import_is_a_skipped_technique(tmp_path, monkeypatch, how):
    model, example, acc = _setup(Conv1dNet(), (2, 4, 32))
    if how == "missing":
        monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import raises ImportError
    else:
        _broken_package(tmp_path, monkeypatch, "onnxruntime")
    report = opt.optimize(
        model,
        example,
        acc,
        device="cpu",
        techniques=["onnxruntime", "batching"],
        measure_kwargs=FAST,
        verbose=False,
        on_error="raise",
    )
    step = report.step("onnxruntime")
    assert not step.applied and "cannot be imported" in step.reason and "make setup" in step.reason
    assert report.step("batching").applied, "the other techniques still run"


def test_require_onnxruntime_names_the_fix_for_a_broken_install(tmp_path, monkeypatch):
    from course_utils.supply.errors import MissingBackendError
    from course_utils.techniques import onnx_runtime

    _broken_package(tmp_path, monkeypatch, "onnxruntime")
    with pytest.raises(MissingBackendError, match="RuntimeError.*make setup"):
        onnx_runtime.require_onnxruntime()


def test_onnxruntime_step_matches_the_model():
    model, example, acc = _setup(Conv1dNet(), (2, 4, 32))
    report = opt.optimize(
        model,
        example,
        acc,
        device="cpu",
        techniques=["onnxruntime"],
        measure_kwargs=FAST,
        verbose=False,
        on_error="raise",
    )
    step = report.step("onnxruntime")
    assert step.applied and step.comparison.within and step.precision == "fp32", step.reason


def test_no_batch_dim_and_record(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(tmp_path))
    model, _, _ = _setup(Conv1dNet(), (2, 4, 32))
    single = nn.Sequential(model.body, nn.Flatten(0))
    example = torch.randn(4, 32).unsqueeze(0)
    report = opt.optimize(
        single,
        example,
        lambda run: 1.0,
        device="cpu",
        techniques=["batching"],
        has_batch_dim=False,
        measure_kwargs=FAST,
        verbose=False,
    )
    assert "no batch dimension" in report.step("batching").reason
    assert report.record("99", model="conv1d") == 1
    assert list(tmp_path.glob("*.csv"))


def test_bad_input_names_the_fix():
    model, example, acc = _setup(Conv1dNet(), (2, 4, 32))
    with pytest.raises(CourseError, match="choose from"):
        opt.optimize(model, example, acc, techniques=["warp-drive"])
    with pytest.raises(CourseError, match="Tensor"):
        opt.optimize(model, [example], acc)
    with pytest.raises(CourseError, match="nn.Module"):
        opt.optimize(lambda x: x, example, acc)

    class Dicty(nn.Module):
        def forward(self, x):
            return {"logits": x}

    with pytest.raises(CourseError, match="wrap the model"):
        opt.optimize(Dicty(), example, acc, techniques=[])


def test_no_gain_says_keep_the_baseline():
    model, example, acc = _setup(Conv1dNet(), (2, 4, 32))
    report = opt.optimize(model, example, acc, device="cpu", techniques=[], measure_kwargs=FAST, verbose=False)
    assert "keep the baseline" in opt.decision_guide(report)
    assert opt.cumulative_speedup(report.df).eq(1.0).all()


def test_within_budget_judges_the_accuracy_drop_not_a_gain(monkeypatch):
    """Two variants computing the model's outputs: one 5 points less accurate (outside a 1-point budget), one
    5 points more accurate (within it: a gain is no drop)."""
    model, example, _ = _setup(Conv1dNet(), (2, 4, 32))
    scores = {"baseline": 0.80, "precision worse": 0.75, "precision better": 0.85}

    def two_precisions(model, dev):
        return [opt._Variant(name, model, "fp32", 0.0, "") for name in ("precision worse", "precision better")]

    monkeypatch.setattr(opt, "_precision", two_precisions)
    report = opt.optimize(model, example, lambda run: scores[run.name], device="cpu", techniques=["precision"],
                          accuracy_budget=0.01, measure_kwargs=FAST, verbose=False)  # fmt: skip
    worse, better = report.step("precision worse"), report.step("precision better")
    assert worse.accuracy == 0.75 and worse.within_budget is False and "accuracy drop 0.0500 > budget" in worse.reason
    assert better.accuracy == 0.85 and better.within_budget is True and "budget" not in better.reason


def test_batching_is_stacked_with_the_best_paying_technique():
    def step(name, speedup, within=True):
        return opt.Step(name, True, speedup=speedup, within_budget=within, accuracy=0.9)

    def variant(name):
        return opt._Variant(name, lambda x: x, "fp32", 0.0, "")

    variants = {n: (variant(n), step(n, s, w)) for n, s, w in (("batching", 1.5, True), ("compile", 1.2, True),
                ("onnxruntime", 1.8, True), ("int8", 3.0, False), ("precision", 0.9, True))}  # fmt: skip
    seen = []

    def evaluate(v, x, reuse):
        seen.append((v.name, tuple(x.shape), reuse))
        return opt.Step(v.name, True)

    example = torch.randn(3, 2)
    out = opt._stacked(variants, evaluate, example, 8, None)
    assert [s.technique for s in out] == ["batching + onnxruntime"]  # int8 pays more, but outside the budget
    assert seen == [("batching + onnxruntime", (8, 2), 0.9)]
    variants["batching"] = (variant("batching"), step("batching", 1.0))
    assert opt._stacked(variants, evaluate, example, 8, None) == []  # batching that does not pay: nothing stacked


def test_bigger_batch_repeats_the_example_to_exactly_the_target():
    example = torch.arange(6.0).reshape(3, 2)
    big = opt._bigger_batch(example, 8)
    assert big.shape == (8, 2) and big.is_contiguous()
    assert torch.equal(big, example[[0, 1, 2, 0, 1, 2, 0, 1]])
    assert torch.equal(opt._bigger_batch(example, 6), torch.cat([example, example]))
    assert torch.equal(opt._bigger_batch(example, 2), example[:2])


def test_linear_share_counts_weights_and_biases_and_int8_is_tried_at_exactly_half(monkeypatch):
    from course_utils.capstone.optimizing import techniques as T

    assert T.linear_share(nn.Linear(2, 2)) == 1.0  # 4 weights and 2 biases, all in the Linear layer
    assert T.linear_share(nn.Conv1d(1, 1, 5)) == 0.0
    half = nn.Sequential(nn.Linear(2, 2), nn.Conv1d(1, 1, 5))  # 6 parameters each
    assert T.linear_share(half) == 0.5
    assert T.linear_share(nn.Sequential(nn.Linear(4, 2), nn.Conv1d(1, 1, 1))) == 10 / 12

    def no_torchao(name, fix):
        raise T.Skip("torchao left out by this test")

    monkeypatch.setattr(T, "import_or_skip", no_torchao)
    with pytest.raises(T.Skip, match="left out by this test"):  # 0.5 is enough: it gets as far as importing
        T.int8(half, compiled=False)
    with pytest.raises(T.Skip, match="not applicable: only 46%"):
        T.int8(nn.Sequential(nn.Linear(2, 2), nn.Conv1d(1, 1, 6)), compiled=False)  # 6 of 6 + 7: 46%


def test_batching_is_skipped_when_the_example_already_has_the_batching_batch():
    from course_utils.capstone.optimizing import techniques as T

    eager = nn.Identity()
    with pytest.raises(T.Skip, match="already has batch 8 >= the batching step's batch 8"):
        T.batching(eager, True, 8, 8)
    (variant,) = T.batching(eager, True, 7, 8)
    assert variant.name == "batching" and variant.note == "same model, batch 8 instead of 7"
    with pytest.raises(T.Skip, match="no batch dimension"):
        T.batching(eager, False, 1, 8)


def test_the_baseline_is_timed_and_counted_at_the_examples_batch(monkeypatch):
    """The baseline runs the example's batch (2) and its items/s count those 2 items, while the batching step runs
    and counts 16: a baseline labelled with the batching step's batch would report 8x its real items/s."""
    model, example, acc = _setup(Conv1dNet(), (2, 4, 32))
    real, seen = opt.measure, []

    def spy(fn, **kw):  # what each timed call runs: (label, the batch it is counted as, the batch it runs)
        seen.append((kw.get("label"), kw.get("batch_size"), int(fn().shape[0])))
        return real(fn, **kw)

    monkeypatch.setattr(opt, "measure", spy)
    report = opt.optimize(model, example, acc, device="cpu", techniques=["batching"], batch_size=16,
                          measure_kwargs=FAST, verbose=False)  # fmt: skip
    assert seen == [("baseline", 2, 2)]
    base, batching = report.step("baseline"), report.step("batching")
    assert base.batch_size == base.measurement.batch_size == 2
    assert base.throughput == pytest.approx(2 * 1000 / base.median_ms, rel=1e-9)
    assert batching.batch_size == batching.measurement.batch_size == 16
    assert batching.throughput == pytest.approx(16 * 1000 / batching.median_ms, rel=1e-9)
    row = report.df.set_index("technique").loc["baseline"]
    assert row["batch_size"] == 2 and row["throughput"] == pytest.approx(2 * 1000 / row["median_ms"], rel=1e-9)
