"""Lesson 13 exercises: a batching LitAPI for the digits CNN, checked by running and serving it.

13.litapi: the answer is ``"path/to/file.py:ClassName"`` (the learner's ``%%writefile`` cell): the lesson's MiniLM
server adapted to another model. The images are drawn at random per check (the seed is printed on failure). The
model is found by its weights (the shipped CNN's, among the modules ``setup`` kept) and observed at the operator
level (:class:`~course_checks.lesson_exercises.observe.OpLog`): a call of the model is a run of its first
convolution, with its batch size, whatever Python path led there. In-process first (cheap; an unsolved stub stops
here), set up on "cpu" and on "cuda" (the rehearsal's stand-in GPU where there is none): the model kept on the
device ``setup`` was given, the batch moved there before the model runs; the pydantic request type accepts an 8x8
image and rejects wrong shapes, non-finite and out-of-range pixels; ``batch`` stacks the images into one (N, 1, 8,
8) tensor; ``predict`` runs the real model once on the whole batch (a decoy module beside it does not count),
through ``self.model(x)`` (not ``model.forward`` past its hooks), under ``torch.inference_mode``; ``unbatch`` gives
one output per request; each answer's probabilities equal the model's softmax (fp32 tolerance) and its label is
their argmax. Then it serves the class with ``max_batch_size=4`` on 127.0.0.1 through a subclass that logs, **inside
the served worker process**, every model call and its batch size; it sends eight good requests and two bad ones
concurrently, and requires 200s with the model's answers, 422s for the bad ones, one model call per batch, every
image computed once, and batches of more than one image.

13.triton-config (a Triton Inference Server config) is in ``l13_triton.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import math
import sys
from pathlib import Path
from typing import Any

from course_checks.exercises import exercise, observed, untimed

SOLUTION_FILE = Path(__file__).resolve().parent / "solutions" / "l13_digits_api.py"
N_IMAGES = 8
#: What setup(device) is given in process, each check: "cuda" is the real GPU, or the rehearsal's CPU stand-in
#: (its "cuda" tensors refuse to meet CPU ones, as CUDA's do): a model left on the CPU, a batch never moved, and a
#: hard-coded .cuda() each fail on one of the two. The CPU first: every other mistake is named there as before.
DEVICES = ("cpu", "cuda")
_REF: dict[str, Any] = {}


def _draw(c: Any = None) -> None:
    """Draw this check's eight test images (N, 1, 8, 8) and the CNN's softmax for them (what answers must equal)."""
    import torch

    from course_checks.lesson_exercises.digits import held_out_digits, reference_cnn

    x_all, _ = held_out_digits()
    rows = sorted(c.rng.sample(range(len(x_all)), N_IMAGES)) if c is not None else list(range(N_IMAGES))
    x = x_all[torch.tensor(rows)]
    with torch.inference_mode():
        _REF["x"], _REF["probs"] = x, torch.softmax(reference_cnn()(x), dim=-1)


def _reference() -> tuple[Any, Any]:
    """The images and softmax drawn for the current check."""
    if "probs" not in _REF:
        _draw()
    return _REF["x"], _REF["probs"]


def find_model(api: Any) -> Any:
    """The module ``setup`` kept on ``api`` that holds the shipped digits CNN's weights (None if there is none)."""
    import torch

    from course_checks.lesson_exercises.digits import reference_cnn

    want = reference_cnn().state_dict()
    found = []
    for v in vars(api).values():
        items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else [v]
        found += [m for m in items if isinstance(m, torch.nn.Module)]
    for m in found:
        sd = m.state_dict()
        if sd.keys() == want.keys() and all(torch.equal(sd[k].cpu(), want[k]) for k in want):
            return m
    return None


def model_calls(log: Any) -> list[int]:
    """Batch sizes of the digits CNN's calls in an OpLog watching it: one run of its first convolution per call."""
    from course_checks.lesson_exercises.observe import CONV_OPS

    return [op.in_shapes[0][0] for op in log.named(*CONV_OPS) if "features.0.weight" in op.watched]


def observed_predict(api: Any, predict: Any, log_path: str, *args: Any, **kwargs: Any) -> Any:
    """Run ``predict`` under an operator log of the real model; append its calls' batch sizes to ``log_path``.

    Used inside the served worker process by the wrapper :func:`_check_litapi` writes.
    """
    from course_checks.lesson_exercises.observe import OpLog

    model = find_model(api)
    if model is None:
        with open(log_path, "a") as fh:
            fh.write("nomodel\n")
        return predict(*args, **kwargs)
    with OpLog(watch=model) as log:
        out = predict(*args, **kwargs)
    with open(log_path, "a") as fh:
        fh.write(" ".join(map(str, model_calls(log))) + "\n")
    return out


_WRAPPER = """import importlib.util, sys
from course_checks.lesson_exercises import l13 as _l13
_spec = importlib.util.spec_from_file_location("_learner_api_13", {path!r})
_mod = importlib.util.module_from_spec(_spec)
sys.modules["_learner_api_13"] = _mod
_spec.loader.exec_module(_mod)


class ObservedAPI(_mod.{name}):
    def predict(self, x{ctx}):
        return _l13.observed_predict(self, super().predict, {log!r}, x{ctx_call})
"""


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

    rows = [list(r) for r in _bodies()[0]["pixels"]]
    rows[0][0], rows[-1][-1] = 0.0, 1.0  # the ends of the range, drawn in every call: both are valid pixels
    for body in ({"pixels": rows}, *_bodies()):
        try:
            kind.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise AssertionError(
                f"{kind.__name__} rejected a good image with pixels exactly 0.0 and 1.0 (the ends of the range): "
                f"{'.'.join(map(str, first['loc']))}: {first['msg']}. The ends are valid pixels: Field(ge=0.0, "
                "le=1.0), not gt/lt"
            ) from None
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
    from course_utils.measuring.outputs import compare_outputs

    cmp = compare_outputs(probs, ref, "fp32")
    assert cmp.within, (
        f"{where}: probs differ from the model's softmax ({cmp.reason}): return torch.softmax(logits, dim=-1)"
    )
    want = ref.argmax(-1).tolist()
    assert labels == want, f"{where}: labels {labels} but the model's most probable classes are {want}"


def _check_litapi(answer: Any) -> None:
    from course_checks.lesson_exercises.observe import cases

    with cases("13.litapi") as c:
        _draw(c)
        _check_litapi_case(answer)


def _check_litapi_case(answer: Any) -> None:
    import torch

    from course_checks.lesson_exercises.observe import gpu, on_standin

    target, cls = _load(answer)
    threads = torch.get_num_threads()  # setup may set the process's thread count (the server's worker does)
    where = []
    try:
        for device in DEVICES:
            with gpu() if device != "cpu" else contextlib.nullcontext():
                where.append("the rehearsal's stand-in GPU" if device != "cpu" and on_standin() else device)
                api, model, kind = setup_api(cls, device)
                judge_in_process(api, model, kind, device)
    finally:
        torch.set_num_threads(threads)
    sizes = judge_served(target, cls)
    observed(f"in process: {len(_bad_bodies())} bad bodies refused by your request type, pixels of exactly 0.0 and "
             f"1.0 accepted; setup('cpu') and setup('cuda') put the model on {' and '.join(where)}; predict ran the "
             "digits CNN once on a batch of 4 there under inference_mode, answers equal to "
             f"its softmax and argmax. Served: {N_IMAGES} concurrent requests answered 200 with those answers, 2 bad "
             f"ones 422; inside the served worker the model ran {len(sizes)} times, batches of {sizes}")  # fmt: skip


def setup_api(cls: type, device: str = "cpu") -> tuple[Any, Any, type]:
    """The learner's class set up in this process as the server would, on ``device`` (inside ``observe.gpu()`` for
    "cuda"): (api, the digits CNN it kept, its pydantic request type). Raises AssertionError when setup keeps no
    module with the shipped CNN's weights, or keeps it on another device than the one it was given."""
    import torch

    api = cls(max_batch_size=4, batch_timeout=0.01)
    try:
        api.setup(device)
    except (RuntimeError, AssertionError) as exc:
        if device == "cpu" and any(w in str(exc).lower() for w in ("cuda", "nvidia", "gpu")):
            raise AssertionError(
                f"setup('cpu') used CUDA anyway ({type(exc).__name__}: {str(exc)[:150]}): LitServe tells setup the "
                "device to run on; load the model there (load_digits_model('cnn', device=device)), never .cuda()"
            ) from None
        raise
    modules = [m for m in vars(api).values() if isinstance(m, torch.nn.Module)]
    assert modules, "setup must keep the model on self (self.model = cu.models.load_digits_model('cnn', ...))"
    model = find_model(api)
    assert model is not None, (
        "setup kept no module with the shipped digits CNN's weights: load it with "
        "course_utils.supply.models.load_digits_model('cnn', device=device) and keep it on self (self.model = ...)"
    )
    placed = sorted({p.device.type for p in model.parameters()})
    assert placed == [torch.device(device).type], (
        f"setup was given device '{device}' but keeps the digits CNN on {' and '.join(placed)}: load it where LitServe "
        "says (load_digits_model('cnn', device=device), or .to(device)); on a GPU server it would run on the "
        + ("CPU" if placed == ["cpu"] else "wrong device")
    )
    return api, model, _request_type(api)


def judge_in_process(api: Any, model: Any, kind: type, device: str = "cpu") -> None:
    """The drawn request set (:func:`_draw`) judged on a set-up ``api`` in this process: validation of good and bad
    bodies, ``batch`` of four, one ``predict`` that runs the real model once on the batch (through its hooks,
    under inference_mode), ``unbatch`` and ``encode_response`` equal to the model's softmax and argmax."""
    import torch

    from course_checks.lesson_exercises.observe import OpLog

    _check_validation(kind)
    bodies, (_, ref) = _bodies()[:4], _reference()
    x = api.batch([api.decode_request(kind.model_validate(b)) for b in bodies])
    assert isinstance(x, torch.Tensor) and tuple(x.shape) == (4, 1, 8, 8), (
        "batch must stack the four images into one tensor of shape (4, 1, 8, 8), got "
        f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}"
    )
    top: list[bool] = []
    first: list[bool] = []
    hooks = [model.register_forward_hook(lambda m, args, out: top.append(True)),
             model.features[0].register_forward_hook(
                 lambda m, args, out: first.append(torch.is_inference_mode_enabled()))]  # fmt: skip
    try:
        with OpLog(watch=model) as log:
            out = api.predict(x)
    except RuntimeError as exc:  # CUDA's (and the stand-in's) refusal to mix devices
        if "same device" not in str(exc):
            raise
        raise AssertionError(
            f"predict ran the model (on '{device}', where setup was told to put it) on the batch as batch() made it, "
            f"on the CPU: {str(exc)[:160]}. Move the batch to the device setup was given first: x.to(self.device)"
        ) from None
    finally:
        for h in hooks:
            h.remove()
    calls = model_calls(log)
    assert calls, (
        "predict did not run the digits CNN that setup loaded (its first convolution never ran on this thread): run "
        "self.model on the batch, not a decoy module, numbers computed elsewhere, or another thread"
    )
    assert len(calls) == 1 and calls[0] == 4, (
        f"predict ran the model {len(calls)} times with batch sizes {calls} for one batch of 4: run it once on the "
        "whole batch (not image by image, not on a throwaway input beside it)"
    )
    assert top, (
        "predict called the model's forward directly (model.forward(x)): that skips the module's hooks, which "
        "serving code relies on (instrumentation, profilers). Call the module: self.model(x)"
    )
    assert all(first), "predict ran the model with autograd on: wrap the call in `with torch.inference_mode():`"
    parts = api.unbatch(out)
    assert len(parts) == len(bodies), f"unbatch must return one output per request ({len(bodies)}), got {len(parts)}"
    probs, labels = _answers([api.encode_response(p) for p in parts])
    _compare(probs, labels, ref[:4], "in-process")


def judge_served(target: str, cls: type) -> list[int]:
    """The class served with max_batch_size=4 on 127.0.0.1 (a subclass logs the model's calls inside the served
    worker process): the drawn request set and two bad bodies, sent concurrently, judged from the answers and
    the served process's own log."""
    import tempfile

    from course_utils.serve import load_generator as load
    from course_utils.serve import server_process

    path, _, name = target.rpartition(":")
    sig = inspect.signature(cls.predict)
    ctx, ctx_call = (", context", ", context=context") if "context" in sig.parameters else ("", "")
    ref = _reference()[1]
    bad = [_bad_bodies()[k] for k in ("7 rows", "a pixel of 5.0 (outside [0, 1])")]
    with tempfile.TemporaryDirectory(prefix="course_13_") as tmp:
        calls_log = Path(tmp) / "model_calls.txt"
        wrapper = Path(tmp) / "observed_13_api.py"
        wrapper.write_text(_WRAPPER.format(path=str(Path(path).resolve()), name=name, log=str(calls_log), ctx=ctx,
                                           ctx_call=ctx_call))  # fmt: skip
        with contextlib.ExitStack() as stack:
            with untimed():  # starting the server and waiting until it is ready: the checker's set-up
                srv = stack.enter_context(
                    server_process.serve(f"{wrapper}:ObservedAPI", max_batch_size=4, batch_timeout=0.3)
                )
            answers = load.post_many(srv.predict_url, _bodies() + bad)
            n_predicts = len(srv.calls())
        lines = calls_log.read_text().splitlines() if calls_log.exists() else []
    good, rejected = answers[:N_IMAGES], answers[N_IMAGES:]
    failed = [a for a in good if a[0] != 200]
    assert not failed, f"the server failed good requests: {failed[:2]}"
    assert all(code == 422 for code, _ in rejected), f"bad requests must get 422, got {[c for c, _ in rejected]}"
    probs, labels = _answers([a for _, a in good])
    _compare(probs, labels, ref, "served")
    assert "nomodel" not in lines, "in the served process, setup kept no module with the digits CNN's weights"
    sizes = [[int(v) for v in line.split()] for line in lines]
    assert len(sizes) == n_predicts, f"the served worker logged {len(sizes)} predict calls, LitServe {n_predicts}"
    per_call = [len(sz) for sz in sizes]
    assert all(n == 1 for n in per_call), (
        f"inside the served process, predict ran the digits CNN {per_call} times per batch: once per batch"
    )
    batch_sizes = [sz[0] for sz in sizes]
    assert sum(batch_sizes) == N_IMAGES, (
        f"inside the served process the model computed {sum(batch_sizes)} images (batches {batch_sizes}) for "
        f"{N_IMAGES} good requests: each image once, on the batch that LitServe formed"
    )
    assert max(batch_sizes) > 1, (
        f"{N_IMAGES} concurrent requests ran as batches of {batch_sizes} inside the served process: no batches "
        "formed. Implement batch() and unbatch(), and serve with max_batch_size > 1"
    )
    return batch_sizes


@exercise(
    "13.litapi",
    "Complete MyDigitsAPI in my_api.py, the MiniLM server adapted to the digits CNN: DigitsRequest accepts exactly "
    "8 rows of 8 finite numbers in [0, 1]; setup loads the CNN with "
    "course_utils.supply.models.load_digits_model('cnn'); decode_request gives a (1, 8, 8) float tensor; "
    "batch stacks them into (N, 1, 8, 8); predict calls the model "
    "once under torch.inference_mode and returns softmax probabilities; unbatch returns one row per request; "
    'encode_response gives {"label": argmax, "probs": [10 floats]}. '
    "Reference: course_checks/lesson_exercises/solutions/l13_digits_api.py",
    _check_litapi,
    imports=("litserve", "pydantic", "httpx", "course_utils.serve.server_process", "course_utils.serve.load_generator"),
)
def litapi_solution() -> str:
    """The reference solution is a file the server can import: print(open(SOLUTION_FILE).read()) to read it."""
    return f"{SOLUTION_FILE}:SolutionDigitsAPI"
