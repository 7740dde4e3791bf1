"""Lesson 13 exercise 13.triton-config: a Triton Inference Server model config, parsed by Triton's own ``ModelConfig``.

Random cases per check, with every boundary of the queue-delay rule drawn in every call (the p99 budget binding,
twice the HTTP round trip binding, the two equal, the budget exactly spent, the budget overspent). The config must
name the model, its platform, batch size, queue delay, the input/output names, data types and dims, and instance
groups making the asked number of CPU instances (a count left out is Triton's 1; one case in every call asks for
more); and set nothing else that changes how requests are served (a queue policy that rejects requests, a version
that the model folder does not hold, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course_checks.exercises import exercise, observed


def queue_delay_us(p99_target_ms: float, batch_ms: float, http_ms: float) -> int:
    """Lesson 13's rule for how long a request may wait for batch-mates: twice the HTTP round trip, capped by the
    budget the p99 target leaves after two full batches and the HTTP cost, and 0 when nothing is left."""
    budget_ms = p99_target_ms - 2 * batch_ms - http_ms
    return round(1000 * max(0.0, min(budget_ms, 2 * http_ms)))


def draw_configs(c: Any) -> list[tuple[str, int, float, float, float, int, str]]:
    """(name, max batch, p99 target, batch ms, http ms, instances, which boundary) per case: four model names, the
    budget binding, twice the HTTP time binding, the two exactly equal, the budget exactly spent and overspent."""
    names = c.rng.sample(["digits", "digits_cnn", "mnist8", "lenet8", "tiny_digits", "digits_v2"], 5)
    cases = []
    for name, kind in zip(names, ["budget", "http", "equal", "spent", "over"], strict=True):
        batch_ms, http_ms = c.randint(5, 400) / 10, c.randint(5, 400) / 10
        spare = {"budget": 2 * http_ms * c.rng.uniform(0.2, 0.9), "http": 2 * http_ms * c.rng.uniform(1.2, 5.0),
                 "equal": 2 * http_ms, "spent": 0.0, "over": -c.randint(1, 50) / 10}[kind]  # fmt: skip
        p99 = round(2 * batch_ms + http_ms + spare, 1) if kind in ("budget", "http") else 2 * batch_ms + http_ms + spare
        cases.append((name, c.choice([4, 8, 16, 32, 64]), p99, batch_ms, http_ms, c.randint(1, 4), kind))
    if all(case[5] == 1 for case in cases):  # at least one case asks for more than Triton's default of one instance
        cases[0] = (*cases[0][:5], c.randint(2, 4), cases[0][6])
    c.rng.shuffle(cases)
    return cases


# Fields a config may set beyond the asked ones without changing how the model is served.
_HARMLESS = {("backend",), ("version_policy",), ("instance_group", "name"), ("input", "format"),
             ("output", "label_filename")}  # fmt: skip


def _fields(msg: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every field set in a protobuf message, as (path, value), nested messages and repeated ones walked."""
    out = []
    for field, value in msg.ListFields():
        path = (*prefix, field.name)
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            repeated = getattr(field, "is_repeated", None)
            repeated = field.label == field.LABEL_REPEATED if repeated is None else repeated
            items = value if repeated else [value]
            for item in items:
                out += _fields(item, path) or [(path, item)]
        else:
            out.append((path, value))
    return out


def _delay_hint(got: int, delay: int, budget_us: int, one_batch_us: int) -> str:
    """What a wrong queue delay ``got`` is, where it is a usual mistake (``one_batch_us``: the rule with one batch
    in the budget instead of two)."""
    if abs(got - budget_us) <= 1 and abs(budget_us - delay) > 1:
        return (
            " (the whole budget: waiting longer than the HTTP stragglers, about two round trips behind, fills no "
            "batch and only adds latency)"
        )
    if got >= 1 and abs(got - delay / 1000) <= 1:
        return " (in milliseconds: the field is in microseconds, multiply by 1000)"
    if abs(got - one_batch_us) <= 1 and abs(one_batch_us - delay) > 1:
        return (
            " (2 x batch: a full batch may be running when a request arrives, and its own batch runs after it; "
            "your budget leaves room for one)"
        )
    return ""


def judge_config(
    cfg: Any, name: str, mbs: int, delay: int, instances: int, where: str, budget_us: int, one_batch_us: int = -9
) -> None:
    """The parsed ``ModelConfig`` against the case (``budget_us``: the whole p99 budget, a common wrong delay;
    ``one_batch_us``: the delay with one batch in the budget, another): asked fields right, nothing else that
    changes serving."""
    from tritonclient.grpc import model_config_pb2

    fp32 = model_config_pb2.DataType.Value("TYPE_FP32")
    cpu = model_config_pb2.ModelInstanceGroup.Kind.Value("KIND_CPU")
    assert cfg.name == name, f"name the model {name!r}, the name asked (got {cfg.name!r})"
    assert cfg.platform == "onnxruntime_onnx", (
        f"the model's name {name!r} is right; its platform should be 'onnxruntime_onnx' (got {cfg.platform!r})"
    )
    assert cfg.backend in ("", "onnxruntime"), f"backend {cfg.backend!r}: the model is an ONNX file (onnxruntime)"
    assert cfg.max_batch_size == mbs, f"max_batch_size should be {mbs}, got {cfg.max_batch_size}"
    assert cfg.HasField("dynamic_batching"), "add a dynamic_batching block" + (
        f" ({where}: a queue delay of 0 still batches the requests already waiting when an instance frees up; "
        "without the block Triton runs them one by one. Keep dynamic_batching { max_queue_delay_microseconds: 0 })"
        if delay == 0
        else ""
    )
    got = cfg.dynamic_batching.max_queue_delay_microseconds
    assert abs(got - delay) <= 1, (
        f"{where}: the queue delay is min(budget, 2 x http) with budget = p99 - 2 x batch - http, and 0 when the "
        f"budget is spent (lesson 13's batch_timeout rule), here {delay} us; got {got}"
        + _delay_hint(got, delay, budget_us, one_batch_us)
    )
    assert not cfg.dynamic_batching.preferred_batch_size, "leave preferred_batch_size out (most models)"
    io = (
        [(t.name, t.data_type, list(t.dims)) for t in cfg.input],
        [(t.name, t.data_type, list(t.dims)) for t in cfg.output],
    )
    assert io == ([("input", fp32, [1, 8, 8])], [("logits", fp32, [10])]), (
        "one input named 'input' (data_type: TYPE_FP32, dims [1, 8, 8]) and one output named 'logits' "
        "(TYPE_FP32, dims [10]), no batch dimension: Triton matches these names and types against the ONNX "
        f"model and rejects the model otherwise. Got inputs {io[0]}, outputs {io[1]}"
    )
    kind_name = model_config_pb2.ModelInstanceGroup.Kind.Name
    groups = [(g.count, kind_name(g.kind)) for g in cfg.instance_group]
    # Triton creates one instance for a group whose count is left out (or 0); groups of CPU instances add up
    made = sum(max(count, 1) for count, _ in groups)
    assert groups and all(g.kind == cpu for g in cfg.instance_group) and made == instances, (
        f"instance_group [ {{ count: {instances}, kind: KIND_CPU }} ]: that many copies of the model on the "
        f"CPU. Got {groups}"
        + (
            f": a count left out (or 0) is not none, Triton then creates 1 instance, and this case asks {instances}"
            if any(count < 1 for count, _ in groups) and made != instances
            else ""
        )
    )
    if cfg.HasField("version_policy"):
        policy = cfg.version_policy
        versions = list(policy.specific.versions) if policy.HasField("specific") else [1]
        assert 1 in versions and (not policy.HasField("latest") or policy.latest.num_versions >= 1), (
            f"version_policy serves versions {versions}: the model folder holds version 1 only (1/model.onnx), so "
            "Triton would serve nothing. Leave version_policy out (the latest version is served)"
        )
    asked = {("name",), ("platform",), ("max_batch_size",), ("dynamic_batching",),
             ("dynamic_batching", "max_queue_delay_microseconds"),
             ("input", "name"), ("input", "data_type"), ("input", "dims"), ("output", "name"), ("output", "dims"),
             ("output", "data_type"), ("instance_group", "count"), ("instance_group", "kind")}  # fmt: skip
    extra = [(p, v) for p, v in _fields(cfg) if p not in asked and p[:1] != ("version_policy",) and p not in _HARMLESS]
    if extra:
        path, value = extra[0]
        field = ".".join(path)
        why = (
            "a queue policy: with a timeout and timeout_action REJECT (or a max_queue_size) Triton turns requests "
            "away instead of serving them"
            if "queue_policy" in field
            else "it changes how Triton serves the model, and the exercise does not ask for it"
        )
        raise AssertionError(f"{where}: the config sets {field} = {value!r}: {why}. Leave it out")


def _check_triton_config(fn: Callable[..., str]) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from course_checks.lesson_exercises.observe import cases

    with cases("13.triton-config") as c:
        drawn = draw_configs(c)
        # the longest delay judged first: a delay off by a unit (ms for us) shows as such there, not rounded to 0
        for name, mbs, p99, batch_ms, http_ms, instances, kind in sorted(drawn, key=lambda d: -queue_delay_us(*d[2:5])):
            delay = queue_delay_us(p99, batch_ms, http_ms)
            text = fn(name, mbs, p99, batch_ms, http_ms, instances)
            assert isinstance(text, str), f"return the config text (a str), got {type(text).__name__}"
            try:
                cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
            except text_format.ParseError as exc:
                raise AssertionError(f"the config does not parse as Triton's ModelConfig: {exc}") from None
            where = f"p99 {p99:g} ms, batch {batch_ms} ms, http {http_ms} ms ({kind})"
            budget_us = round(1000 * max(0.0, p99 - 2 * batch_ms - http_ms))
            one_batch_us = queue_delay_us(p99 + batch_ms, batch_ms, http_ms)
            judge_config(cfg, name, mbs, delay, instances, where, budget_us, one_batch_us)
    observed(f"{len(drawn)} configs parsed by Triton's ModelConfig with the asked name, platform, batch size, "
             "input/output, CPU instances, and queue delays min(budget, 2 x http) at every boundary "
             f"({', '.join(d[-1] for d in drawn)}); no other serving field set")  # fmt: skip


@exercise(
    "13.triton-config",
    "Return config.pbtxt text: name, platform onnxruntime_onnx, max_batch_size, input 'input' TYPE_FP32 dims "
    "[1, 8, 8], output 'logits' TYPE_FP32 dims [10], instance_group with count instances and kind KIND_CPU, "
    "dynamic_batching with max_queue_delay_microseconds = lesson 13's rule, min(budget, 2 * http_ms) with budget = "
    "p99_target_ms - 2 * batch_ms - http_ms (0 when the budget is spent), in microseconds (rounded); nothing else.",
    _check_triton_config,
    time_limit=30,
)
def triton_config(name: str, max_batch_size: int, p99_target_ms: float, batch_ms: float, http_ms: float,
                  instances: int) -> str:  # fmt: skip
    budget_ms = p99_target_ms - 2 * batch_ms - http_ms  # what two full batches and the HTTP cost leave
    wait_ms = 2 * http_ms if 2 * http_ms < budget_ms else budget_ms  # the stragglers, within the budget
    delay_us = round(1000 * wait_ms) if wait_ms > 0 else 0
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "input", data_type: TYPE_FP32, dims: [ 1, 8, 8 ] }} ]
output [ {{ name: "logits", data_type: TYPE_FP32, dims: [ 10 ] }} ]
instance_group [ {{ count: {instances}, kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
"""
