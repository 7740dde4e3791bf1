"""Lesson 13's exercise checkers reject wrong answers: a digits LitAPI that does not batch, splits wrongly,
labels wrongly, skips inference_mode or validation; a Triton config with preferred sizes or the wrong delay.
The LitAPI answers are judged in process on 200 seeds; the reference is also served once (the full path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from course_checks import exercises
from course_checks.lesson_exercises import l13, l13_triton

SOLUTION = l13.SOLUTION_FILE.read_text()


def _variant(tmp_path: Path, *edits: tuple[str, str]) -> str:
    text = SOLUTION
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "wrong_api.py"
    path.write_text(text)
    return f"{path}:SolutionDigitsAPI"


PREDICT = "            logits = self.model(x.to(self.device))"
WRONG = {
    "unbatch returns the whole batch": (
        [("        return list(probs)", "        return [probs]")],
        "one output per request",
    ),
    "no batching: the model runs once per image": (
        [(PREDICT, "            logits = torch.cat([self.model(xi[None].to(self.device)) for xi in x])")],
        "ran the model 4 times",
    ),
    "no inference_mode": (
        [("        with torch.inference_mode():\n" + PREDICT, "        if True:\n" + PREDICT)],
        "inference_mode",
    ),
    "wrong label (the second most probable class)": (
        [("int(probs.argmax())", "int(probs.argsort()[-2])")],
        "labels",
    ),
    "logits instead of probabilities": (
        [("        return torch.softmax(logits, dim=-1).cpu()", "        return logits.cpu()")],
        "softmax",
    ),
    "batch concatenates into (4, 8, 8)": ([("torch.stack(images)", "torch.cat(images)")], r"\(4, 1, 8, 8\)"),
    "no range check on pixels": ([("Field(ge=0.0, le=1.0, allow_inf_nan=False)", "Field()")], "accepted a pixel of 5"),
    "pixels strictly below 1 (lt instead of le)": (
        [("Field(ge=0.0, le=1.0, allow_inf_nan=False)", "Field(ge=0.0, lt=1.0, allow_inf_nan=False)")],
        r"rejected a good image with pixels exactly 0\.0 and 1\.0 .*less than 1",
    ),
    "pixels strictly above 0 (gt instead of ge)": (
        [("Field(ge=0.0, le=1.0, allow_inf_nan=False)", "Field(gt=0.0, le=1.0, allow_inf_nan=False)")],
        r"rejected a good image with pixels exactly 0\.0 and 1\.0 .*greater than 0",
    ),
    "rows of any length": (
        [("Row = Annotated[list[Pixel], Field(min_length=8, max_length=8)]", "Row = list[Pixel]")],
        "accepted a row of 9",
    ),
    "no pydantic model: a plain dict": ([("request: DigitsRequest", "request: dict")], "pydantic model"),
    "a decoy module called once, the real model per image without inference_mode": (
        [
            (
                "        self.model = load_digits_model",
                "        self.decoy = torch.nn.Identity()\n        self.model = load_digits_model",
            ),
            (
                "        with torch.inference_mode():\n" + PREDICT,
                "        with torch.inference_mode():\n            self.decoy(x)\n"
                "        logits = torch.cat([self.model(xi[None]) for xi in x])",
            ),
        ],
        "ran the model 4 times",
    ),
    "model.forward called directly, past the hooks": (
        [(PREDICT, "            logits = self.model.forward(x.to(self.device))")],
        "forward directly",
    ),
    "the model run in a worker thread": (
        [
            (
                PREDICT,
                "            import concurrent.futures as cf\n"
                "            logits = cf.ThreadPoolExecutor(1).submit(self.model, x).result()",
            )
        ],
        "another thread",
    ),
    "the model on a throwaway input, answers from a second copy": (
        [(PREDICT, "            self.model(x[:1])\n            logits = self.model(x)")],
        "ran the model 2 times",
    ),
    "a different model (untrained weights)": (
        [
            (
                '        self.model = load_digits_model("cnn", device=device)',
                '        self.model = type(load_digits_model("cnn"))().eval()',
            )
        ],
        "shipped digits CNN's weights",
    ),
}


WRONG.update({
    "the batch never moved to the device setup was given": (
        [(PREDICT, "            logits = self.model(x)")],
        r"predict ran the model \(on 'cuda', where setup was told to put it\) on the batch as batch\(\) made it, on "
        r"the CPU: .*x\.to\(self\.device\)",
    ),
    "setup ignores its device: the model stays on the CPU": (
        [('load_digits_model("cnn", device=device)', 'load_digits_model("cnn")')],
        "setup was given device 'cuda' but keeps the digits CNN on cpu",
    ),
    "setup hard-codes .cuda()": (
        [('load_digits_model("cnn", device=device)', 'load_digits_model("cnn").cuda()'),
         ("self.model(x.to(self.device))", "self.model(x.cuda())")],
        r"setup\('cpu'\) used CUDA anyway|setup was given device 'cpu' but keeps the digits CNN on cuda",
    ),
})  # fmt: skip


RIGHT = {
    "the reference": (),
    "unbind, cat of unsqueezed images, Tensor.softmax": (
        ("        return list(probs)", "        return probs.unbind(0)"),
        ("torch.stack(images)", "torch.cat([im[None] for im in images])"),
        ("        return torch.softmax(logits, dim=-1).cpu()", "        return logits.softmax(-1).cpu()"),
        ("int(probs.argmax())", "int(torch.argmax(probs).item())"),
    ),
    "the model moved with .to(device), the batch to the model's device": (
        ('load_digits_model("cnn", device=device)', 'load_digits_model("cnn").to(device)'),
        ("self.model(x.to(self.device))", "self.model(x.to(next(self.model.parameters()).device))"),
    ),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_litapi_checker_rejects(name, tmp_path):
    """The full checker on a fresh seed (these answers are all rejected in process, before the server)."""
    edits, words = WRONG[name]
    with pytest.raises(AssertionError, match=words):
        exercises.get("13.litapi").checker(_variant(tmp_path, *edits))


def judged_on_200_seeds(answer):
    """The checker's judgment of ``answer`` in process on each of seeds 0-199: the class loaded and set up once
    (``setup_api``, as the server's worker does once), then each seed's drawn request set (``_draw``) judged on
    that object by ``judge_in_process``, the checker's own code. The served path (a LitServe process, HTTP on
    127.0.0.1, the model's calls counted inside the served worker) costs ~7 s a call: it runs on one seed below."""
    import contextlib

    import torch

    from course_checks.lesson_exercises.observe import Cases, gpu

    _, cls = l13._load(answer)
    threads = torch.get_num_threads()
    reasons = {}
    try:
        for device in l13.DEVICES:  # as the checker: on the CPU, then on the (stand-in) GPU
            with gpu() if device != "cpu" else contextlib.nullcontext():
                try:
                    api, model, kind = l13.setup_api(cls, device)
                except AssertionError as exc:
                    return {seed: reasons.get(seed, str(exc)) for seed in range(200)}
                for seed in range(200):
                    if seed in reasons:
                        continue
                    l13._draw(Cases(seed))
                    try:
                        l13.judge_in_process(api, model, kind, device)
                    except AssertionError as exc:
                        reasons[seed] = str(exc)
    finally:
        torch.set_num_threads(threads)
        l13._REF.clear()
    return {seed: reasons.get(seed, "accepted") for seed in range(200)}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_litapi_rejects_on_200_seeds(name, tmp_path):
    import re

    edits, words = WRONG[name]
    bad = {s: r for s, r in judged_on_200_seeds(_variant(tmp_path, *edits)).items() if not re.search(words, r)}
    assert not bad, bad


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_litapi_right_answers_pass_on_200_seeds(name, tmp_path):
    bad = {s: r for s, r in judged_on_200_seeds(_variant(tmp_path, *RIGHT[name])).items() if r != "accepted"}
    assert not bad, bad


def test_litapi_reference_is_accepted_when_served():
    """The full path once: the server process started, the requests over HTTP, the model's calls counted inside
    the served worker, the server stopped (``server_process.serve`` stops it however the block ends)."""
    assert exercises.verdict("13.litapi", l13.litapi_solution, seed=0) == "accepted"


def test_litapi_unsolved_stub_is_not_attempted(tmp_path, capsys):
    path = tmp_path / "stub.py"
    path.write_text(
        "import litserve as ls\n\n\nclass Stub(ls.LitAPI):\n"
        "    def setup(self, device):\n        raise NotImplementedError\n"
    )
    exercises.check("13.litapi", f"{path}:Stub")
    assert "not solved yet" in capsys.readouterr().out


def test_litapi_checker_names_a_bad_answer():
    for seed in range(200):
        got = exercises.verdict("13.litapi", "nowhere.py:X", seed=seed)
        assert "path/to/file.py:ClassName" in got and f"seed {seed}" in got, (seed, got)


def _cfg(**change):
    """The reference config with one thing changed: a replacement in its text (old=new pairs as tuples), or a
    block added at its end."""

    def fn(*args):
        text = l13_triton.triton_config(*args)
        for old, new in change.get("replace", []):
            text = text.replace(old, new)
        if "add" in change:
            add = change["add"]
            if add.startswith("dynamic_batching"):  # merged into the one dynamic_batching block
                text = text.replace("dynamic_batching {", "dynamic_batching {" + add.split("{", 1)[1].rsplit("}", 1)[0])
            else:
                text += add + "\n"
        return text

    return fn


def _whole_budget(n, m, t, b, h, i):  # the queue delay set to the whole p99 budget (2.58 s in one run)
    text = l13_triton.triton_config(n, m, t, b, h, i)
    return text.replace(
        f"max_queue_delay_microseconds: {l13_triton.queue_delay_us(t, b, h)}",
        f"max_queue_delay_microseconds: {max(0, round((t - 2 * b - h) * 1000))}",
    )


def _in_ms(n, m, t, b, h, i):  # the rule right, written in milliseconds: the field is in microseconds
    text = l13_triton.triton_config(n, m, t, b, h, i)
    return text.replace(
        f"max_queue_delay_microseconds: {l13_triton.queue_delay_us(t, b, h)}",
        f"max_queue_delay_microseconds: {round(max(0.0, min(t - 2 * b - h, 2 * h)))}",
    )


def _one_batch(n, m, t, b, h, i):  # the budget leaves room for one batch, not two (the one queued ahead forgotten)
    text = l13_triton.triton_config(n, m, t, b, h, i)
    return text.replace(
        f"max_queue_delay_microseconds: {l13_triton.queue_delay_us(t, b, h)}",
        f"max_queue_delay_microseconds: {round(1000 * max(0.0, min(t - b - h, 2 * h)))}",
    )


def _no_block_at_zero(n, m, t, b, h, i):  # no dynamic_batching block where the delay is 0 ("no wait, no batching")
    text = l13_triton.triton_config(n, m, t, b, h, i)
    return text.split("dynamic_batching")[0] if l13_triton.queue_delay_us(t, b, h) == 0 else text


def _not_capped(n, m, t, b, h, i):  # min(budget, 2 x http) without the floor at 0: a negative delay
    text = l13_triton.triton_config(n, m, t, b, h, i)
    return text.replace(
        f"max_queue_delay_microseconds: {l13_triton.queue_delay_us(t, b, h)}",
        f"max_queue_delay_microseconds: {round(min(t - 2 * b - h, 2 * h) * 1000)}",
    )


@pytest.mark.parametrize(
    "fn, words",
    [
        (_cfg(replace=[("dynamic_batching {", "dynamic_batching { preferred_batch_size: [4]")]), "preferred_batch"),
        (lambda n, m, t, b, h, i: l13_triton.triton_config(n, m, t, b, 0.0, i), "queue delay"),
        (lambda n, m, t, b, h, i: l13_triton.triton_config(n, m, 1500.0, 400.0, 20.0, i), "queue delay"),  # hard-coded
        (_cfg(replace=[("max_queue_delay_microseconds", "delay_us")]), "does not parse"),
        (lambda n, m, t, b, h, i: l13_triton.triton_config(n, 1, t, b, h, i), "max_batch_size"),
        (lambda n, m, t, b, h, i: l13_triton.triton_config("digits", m, t, b, h, i), "name the model"),
        (_cfg(replace=[('name: "input"', 'name: "x"')]), "one input named 'input'"),
        (_cfg(replace=[('name: "logits"', 'name: "output"')]), "one input named 'input'"),
        (
            _cfg(replace=[("data_type: TYPE_FP32, dims: [ 1, 8, 8 ]", "data_type: TYPE_FP16, dims: [ 1, 8, 8 ]")]),
            "TYPE_FP32",
        ),
        (_cfg(replace=[("data_type: TYPE_FP32, dims: [ 10 ]", "data_type: TYPE_INT64, dims: [ 10 ]")]), "TYPE_FP32"),
        (_cfg(replace=[("dims: [ 1, 8, 8 ]", "dims: [ -1, 1, 8, 8 ]")]), "no batch dimension"),
        (lambda n, m, t, b, h, i: l13_triton.triton_config(n, m, t, b, h, 0), "Triton then creates 1 instance"),
        (_whole_budget, "the whole budget"),
        (
            _cfg(
                add="dynamic_batching { default_queue_policy { timeout_action: REJECT "
                "default_timeout_microseconds: 1 } }"
            ),
            "turns requests away",
        ),
        (_cfg(add="version_policy { specific { versions: [ 7 ] } }"), "holds version 1 only"),
        (_cfg(add='model_warmup [ { name: "w", batch_size: 1 } ]'), "model_warmup"),
        (_not_capped, "does not parse|queue delay"),
        (_in_ms, r"in milliseconds: the field is in microseconds"),
        (_no_block_at_zero, r"a queue delay of 0 still batches"),
        (_one_batch, r"queue delay .* \(2 x batch: a full batch may be running"),
        (_cfg(replace=[("kind: KIND_CPU", "kind: KIND_GPU")]), "KIND_CPU"),
        (
            lambda n, m, t, b, h, i: (
                l13_triton.triton_config(n, m, t, b, h, i).split("instance_group")[0]
                + f"dynamic_batching {{ max_queue_delay_microseconds: {l13_triton.queue_delay_us(t, b, h)} }}"
            ),
            "instance_group",
        ),
    ],
    ids=[
        "preferred",
        "no-http",
        "hard-coded-delay",
        "unparsable",
        "batch-1",
        "fixed-name",
        "input-name",
        "output-name",
        "input-fp16",
        "output-int64",
        "batch-dim",
        "zero-instances",
        "whole-budget",
        "reject-policy",
        "missing-version",
        "warmup",
        "not-capped",
        "in-ms",
        "no-block-at-zero",
        "one-batch",
        "gpu-kind",
        "no-instances",
    ],
)
def test_triton_config_checker_rejects(fn, words):
    """Every wrong config on 200 seeds, those that get a fixed part of the config wrong (the same text every
    seed) too."""
    import re

    for seed in range(200):
        got = exercises.verdict("13.triton-config", fn, seed=seed)
        assert re.search(words, got) and f"seed {seed}" in got, (seed, got)


def test_triton_a_wrong_platform_does_not_call_the_right_name_wrong():
    for seed in range(200):
        got = exercises.verdict("13.triton-config", _cfg(replace=[("onnxruntime_onnx", "tensorrt_plan")]), seed=seed)
        assert "platform should be 'onnxruntime_onnx' (got 'tensorrt_plan')" in got, (seed, got)
        assert "is right" in got and "name the model" not in got, (seed, got)


def test_triton_right_configs_pass_on_every_seed():
    def truncated(n, m, t, b, h, i):  # int() instead of round(): at most 1 us apart
        budget = t - 2 * b - h
        return l13_triton.triton_config(n, m, t, b, h, i).replace(
            f"max_queue_delay_microseconds: {l13_triton.queue_delay_us(t, b, h)}",
            f"max_queue_delay_microseconds: {int(1000 * max(0.0, min(budget, 2 * h)))}",
        )

    harmless = _cfg(add='backend: "onnxruntime"\nversion_policy { latest { num_versions: 1 } }')

    def default_count(n, m, t, b, h, i):  # count left out where one instance is asked: Triton's default is 1
        text = l13_triton.triton_config(n, m, t, b, h, i)
        return text.replace("count: 1, ", "") if i == 1 else text

    def one_per_group(n, m, t, b, h, i):  # i groups of one CPU instance each: i instances
        groups = ", ".join(["{ count: 1, kind: KIND_CPU }"] * i)
        return l13_triton.triton_config(n, m, t, b, h, i).replace(
            f"instance_group [ {{ count: {i}, kind: KIND_CPU }} ]", f"instance_group [ {groups} ]"
        )

    for fn in (l13_triton.triton_config, truncated, harmless, default_count, one_per_group):
        bad = {s: v for s in range(200) if (v := exercises.verdict("13.triton-config", fn, seed=s)) != "accepted"}
        assert not bad, bad


def test_triton_cases_draw_every_boundary_on_every_seed():
    from course_checks.lesson_exercises.observe import Cases

    for seed in range(200):
        cases = l13_triton.draw_configs(Cases(seed))
        assert sorted(k for *_, k in cases) == ["budget", "equal", "http", "over", "spent"]
        assert len({n for n, *_ in cases}) == 5
        for _, _, p99, b, h, _, kind in cases:
            budget = p99 - 2 * b - h
            assert {"budget": budget < 2 * h, "http": budget > 2 * h, "equal": abs(budget - 2 * h) < 1e-9,
                    "spent": abs(budget) < 1e-9, "over": budget < 0}[kind], (seed, kind)  # fmt: skip


def test_triton_reference_is_accepted_and_cases_are_random():
    assert exercises.verdict("13.triton-config", l13_triton.triton_config) == "accepted"
    assert "random case seed" in exercises.verdict("13.triton-config", _cfg(replace=[("KIND_CPU", "KIND_GPU")]))
