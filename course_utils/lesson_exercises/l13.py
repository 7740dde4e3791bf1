"""Lesson 13 exercises: a batching LitAPI for the digits CNN (checked by running and serving it); a Triton config.

13.litapi: the answer is ``"path/to/file.py:ClassName"`` (the learner's ``%%writefile`` cell): the lesson's MiniLM
server adapted to another model. The check runs the class in-process first (cheap; an unsolved stub stops here):
the pydantic request type accepts an 8x8 image and rejects wrong shapes, non-finite and out-of-range pixels;
``batch`` stacks four images into one (4, 1, 8, 8) tensor; ``predict`` calls the model once, under
``torch.inference_mode``; ``unbatch`` gives one output per request; each answer's probabilities equal the model's
softmax (fp32 tolerance) and its label is their argmax. Then it serves the class with ``max_batch_size=4`` on
127.0.0.1, sends eight good requests and two bad ones concurrently, and requires 200s with the model's answers,
422s for the bad ones, and fewer model calls than requests (batches were formed).
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..exercises import exercise

SOLUTION_FILE = Path(__file__).resolve().parent / "solutions" / "l13_digits_api.py"
N_IMAGES = 8
_REF: dict[str, Any] = {}


def _reference() -> tuple[Any, Any]:
    """Eight test images (N, 1, 8, 8) and the CNN's softmax for them: what the served answers must equal."""
    if "probs" not in _REF:
        import torch

        from .. import data, models

        x = data.load_digits_split().x_test[:N_IMAGES]
        with torch.inference_mode():
            _REF["x"], _REF["probs"] = x, torch.softmax(models.load_digits_model("cnn")(x), dim=-1)
    return _REF["x"], _REF["probs"]


def _bodies() -> list[dict]:
    return [{"pixels": img[0].tolist()} for img in _reference()[0]]


def _bad_bodies() -> dict[str, dict]:
    rows = _bodies()[0]["pixels"]

    def with_pixel(v: Any) -> dict:
        return {"pixels": [[v, *rows[0][1:]], *rows[1:]]}

    return {
        "7 rows": {"pixels": rows[:7]},
        "a row of 9": {"pixels": [rows[0] + [0.0], *rows[1:]]},
        "a pixel of 5.0 (outside [0, 1])": with_pixel(5.0),
        "a pixel of -1.0 (outside [0, 1])": with_pixel(-1.0),
        "a NaN pixel": with_pixel(math.nan),
        "an infinite pixel": with_pixel(math.inf),
        "a pixel that is text": with_pixel("dark"),
    }


def _load(answer: Any) -> tuple[str, type]:
    """(serve target "file.py:Name", class) from an answer "file.py:Name" or a zero-argument solution function."""
    if callable(answer) and not isinstance(answer, type):
        answer = answer()
    path, _, name = str(answer).rpartition(":")
    assert path and Path(path).is_file(), f"give 'path/to/file.py:ClassName' of an existing file, got {answer!r}"
    mod_name = f"_exercise_13_{Path(path).stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    assert hasattr(module, name), f"{path} defines no {name}"
    return f"{path}:{name}", getattr(module, name)


def _request_type(api: Any) -> type:
    """The pydantic model decode_request's ``request`` is annotated with (FastAPI validates with it)."""
    try:
        kind = inspect.signature(api.decode_request, eval_str=True).parameters["request"].annotation
    except (KeyError, NameError) as exc:
        raise AssertionError(f"decode_request(self, request: YourRequestModel) could not be read: {exc}") from None
    assert inspect.isclass(kind) and hasattr(kind, "model_validate"), (
        "annotate decode_request's `request` with a pydantic model (class DigitsRequest(BaseModel)), so bad "
        f"requests get a 422 before they reach a batch; got {kind!r}"
    )
    return kind


def _check_validation(kind: type) -> None:
    from pydantic import ValidationError

    kind.model_validate(_bodies()[0])  # a good image must pass (a ValidationError here is the learner's to read)
    for what, body in _bad_bodies().items():
        try:
            kind.model_validate(body)
        except ValidationError:
            continue
        raise AssertionError(
            f"{kind.__name__} accepted {what}: require exactly 8 rows of 8 finite numbers in [0, 1] "
            "(Field(min_length=, max_length=, ge=, le=, allow_inf_nan=False))"
        )


def _answers(outputs: list[Any]) -> tuple[Any, list[Any]]:
    """(probs as an (N, 10) tensor, labels) from the JSON-like answers, with a clear message for a wrong form."""
    import torch

    for o in outputs:
        assert isinstance(o, dict) and {"label", "probs"} <= set(o), (
            f'each answer must be {{"label": int, "probs": [10 floats]}}, got {str(o)[:120]}'
        )
        assert isinstance(o["label"], int) and not isinstance(o["label"], bool), (
            f"label must be a plain int (int(probs.argmax())), got {type(o['label']).__name__}"
        )
        assert isinstance(o["probs"], list) and len(o["probs"]) == 10, (
            f"probs must be a list of 10 numbers (probs.tolist()), got {str(o['probs'])[:120]}"
        )
    return torch.tensor([o["probs"] for o in outputs], dtype=torch.float32), [o["label"] for o in outputs]


def _compare(probs: Any, labels: list[Any], ref: Any, where: str) -> None:
    from ..compare import compare_outputs

    cmp = compare_outputs(probs, ref, "fp32")
    assert cmp.within, (
        f"{where}: probs differ from the model's softmax ({cmp.reason}): return torch.softmax(logits, dim=-1)"
    )
    want = ref.argmax(-1).tolist()
    assert labels == want, f"{where}: labels {labels} but the model's most probable classes are {want}"


def _check_litapi(answer: Any) -> None:
    import torch

    target, cls = _load(answer)
    api = cls(max_batch_size=4, batch_timeout=0.01)
    threads = torch.get_num_threads()  # setup may set the process's thread count (the server's worker does)
    try:
        api.setup("cpu")
        modules = [m for m in vars(api).values() if isinstance(m, torch.nn.Module)]
        assert modules, "setup must keep the model on self (self.model = cu.models.load_digits_model('cnn', ...))"
        kind = _request_type(api)
        _check_validation(kind)
        bodies, (_, ref) = _bodies()[:4], _reference()
        x = api.batch([api.decode_request(kind.model_validate(b)) for b in bodies])
        assert isinstance(x, torch.Tensor) and tuple(x.shape) == (4, 1, 8, 8), (
            "batch must stack the four images into one tensor of shape (4, 1, 8, 8), got "
            f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}"
        )
        calls: list[bool] = []
        hook = modules[0].register_forward_hook(lambda m, args, out: calls.append(torch.is_inference_mode_enabled()))
        try:
            out = api.predict(x)
        finally:
            hook.remove()
    finally:
        torch.set_num_threads(threads)
    assert len(calls) == 1, f"predict ran the model {len(calls)} times for a batch of 4: run it once on the whole batch"
    assert all(calls), "predict ran the model with autograd on: wrap the call in `with torch.inference_mode():`"
    parts = api.unbatch(out)
    assert len(parts) == len(bodies), f"unbatch must return one output per request ({len(bodies)}), got {len(parts)}"
    probs, labels = _answers([api.encode_response(p) for p in parts])
    _compare(probs, labels, ref[:4], "in-process")

    from .. import load, server_process

    bad = [_bad_bodies()[k] for k in ("7 rows", "a pixel of 5.0 (outside [0, 1])")]
    with server_process.serve(target, max_batch_size=4, batch_timeout=0.3) as srv:
        answers = load.post_many(srv.predict_url, _bodies() + bad)
        n_calls = len(srv.calls())
    good, rejected = answers[:N_IMAGES], answers[N_IMAGES:]
    failed = [a for a in good if a[0] != 200]
    assert not failed, f"the server failed good requests: {failed[:2]}"
    assert all(code == 422 for code, _ in rejected), f"bad requests must get 422, got {[c for c, _ in rejected]}"
    probs, labels = _answers([a for _, a in good])
    _compare(probs, labels, ref, "served")
    assert n_calls < N_IMAGES, f"{N_IMAGES} concurrent requests took {n_calls} model calls: no batches formed"


@exercise(
    "13.litapi",
    "Complete MyDigitsAPI in my_api.py, the MiniLM server adapted to the digits CNN: DigitsRequest accepts exactly "
    "8 rows of 8 finite numbers in [0, 1]; setup loads the CNN with course_utils.models.load_digits_model('cnn'); "
    "decode_request gives a (1, 8, 8) float tensor; batch stacks them into (N, 1, 8, 8); predict calls the model "
    "once under torch.inference_mode and returns softmax probabilities; unbatch returns one row per request; "
    'encode_response gives {"label": argmax, "probs": [10 floats]}. '
    "Reference: course_utils/lesson_exercises/solutions/l13_digits_api.py",
    _check_litapi,
)
def litapi_solution() -> str:
    """The reference solution is a file the server can import: print(open(SOLUTION_FILE).read()) to read it."""
    return f"{SOLUTION_FILE}:SolutionDigitsAPI"


def _check_triton_config(fn: Callable[..., str]) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    cases = (((32, 1500.0, 400.0, 20.0), 680_000), ((8, 100.0, 60.0, 5.0), 0), ((16, 50.0, 10.0, 2.5), 27_500))
    for args, delay in cases:
        text = fn("digits", *args)
        try:
            cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
        except text_format.ParseError as exc:
            raise AssertionError(f"the config does not parse as Triton's ModelConfig: {exc}") from None
        assert cfg.name == "digits" and cfg.platform == "onnxruntime_onnx", "name the model and its ONNX platform"
        assert cfg.max_batch_size == args[0], f"max_batch_size should be {args[0]}, got {cfg.max_batch_size}"
        assert cfg.HasField("dynamic_batching"), "add a dynamic_batching block"
        got = cfg.dynamic_batching.max_queue_delay_microseconds
        assert got == delay, f"for {args[1:]} the queue delay is max(0, p99 - 2 x batch - http) = {delay} us, got {got}"
        assert not cfg.dynamic_batching.preferred_batch_size, "leave preferred_batch_size out (most models)"
        assert [list(i.dims) for i in cfg.input] == [[1, 8, 8]] and [list(o.dims) for o in cfg.output] == [[10]], (
            "one input 'input' with dims [1, 8, 8] and one output 'logits' with dims [10] (no batch dimension)"
        )


@exercise(
    "13.triton-config",
    "Return config.pbtxt text: name, platform onnxruntime_onnx, max_batch_size, input 'input' TYPE_FP32 dims "
    "[1, 8, 8], output 'logits' TYPE_FP32 dims [10], dynamic_batching with max_queue_delay_microseconds = "
    "max(0, p99_target_ms - 2 * batch_ms - http_ms) in microseconds, and no preferred_batch_size.",
    _check_triton_config,
)
def triton_config(name: str, max_batch_size: int, p99_target_ms: float, batch_ms: float, http_ms: float) -> str:
    delay_us = max(0, round((p99_target_ms - 2 * batch_ms - http_ms) * 1000))
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "input", data_type: TYPE_FP32, dims: [ 1, 8, 8 ] }} ]
output [ {{ name: "logits", data_type: TYPE_FP32, dims: [ 10 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}
"""
