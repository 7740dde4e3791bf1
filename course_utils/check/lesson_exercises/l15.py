"""Lesson 15 exercises: the KV-cache greedy decode loop, and the KV-cache memory prediction.

15.kv-decode runs the learner's loop on a random-weight 2-layer model of SmolLM2's shape (fresh weights, prompt
and length drawn per call) and watches the model's embedding layer: the first forward pass must take the whole
prompt, every later one exactly one new token, and the tokens must equal greedy ``model.generate``'s.
15.kv-memory builds a real cache of a random small Llama config (dtype, batch and length drawn per call) and
compares the learner's predicted bytes with the bytes the cache's tensors hold, naming the usual mistakes.
Each failure message ends with the call's seed, so a learner can rerun the same case.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from course_utils.check.exercises import exercise


def _seed(seed: int | None) -> int:
    """The case seed: given (tests), fixed by COURSE_EXERCISE_SEED, or fresh per call."""
    fixed = os.environ.get("COURSE_EXERCISE_SEED", "").strip()
    if seed is None and fixed.isdigit():
        return int(fixed)
    return int.from_bytes(os.urandom(4), "little") if seed is None else seed


def _in_generate() -> bool:
    """True when a frame of transformers' ``generate`` is on the stack (however it was called)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "generate" and "transformers" in code.co_filename:
            return True
        frame = frame.f_back
    return False


def _check_kv_decode(fn: Callable, *, seed: int | None = None) -> None:
    from transformers import DynamicCache  # noqa: F401  (imported here so a missing package fails clearly)

    from course_utils.supply.llm import tiny_llama

    seed = _seed(seed)
    rng = random.Random(seed)
    tag = f" (random case seed {seed}; COURSE_EXERCISE_SEED={seed} repeats it)"
    model = tiny_llama(
        seed=rng.randrange(1 << 16), num_hidden_layers=2, vocab_size=4096, initializer_range=0.2
    )  # small, fast; big weights: context matters
    eos = model.config.eos_token_id
    for _ in range(20):  # a case whose greedy continuation does not stop at EOS
        n_prompt, n_new = rng.randint(4, 20), rng.randint(3, 9)
        prompt = torch.tensor([[rng.randrange(3, model.config.vocab_size) for _ in range(n_prompt)]])
        with torch.inference_mode():
            ref = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n_new, do_sample=False)
        ref = ref[:, n_prompt:]
        if ref.shape[1] == n_new and eos not in ref:
            break
    calls: list[tuple[int, bool]] = []  # (tokens fed, inside generate)
    hook = model.model.embed_tokens.register_forward_pre_hook(
        lambda mod, args: calls.append((int(args[0].shape[-1]) if args else -1, _in_generate()))
    )
    try:
        out = fn(model, prompt.clone(), n_new)
    finally:
        hook.remove()
    assert not any(gen for _, gen in calls), (
        "your function called model.generate: write the loop yourself (prefill once, then one token per "
        "forward pass with the cache)" + tag
    )
    assert calls, (
        "the model you were given never ran: compute the tokens with model(...) on it, not from fixed numbers" + tag
    )
    assert isinstance(out, torch.Tensor), f"return a tensor of token ids, got {type(out).__name__}" + tag
    out = out.reshape(1, -1) if out.dim() == 1 else out
    if out.shape[-1] == n_prompt + n_new and torch.equal(out[:, :n_prompt].cpu(), prompt):
        raise AssertionError("you returned the prompt too: return only the new tokens, shape (1, max_new_tokens)" + tag)
    assert out.shape == (1, n_new), (
        f"you returned {tuple(out.shape)}, expected (1, {n_new}): exactly max_new_tokens new tokens (an off-by-one "
        "in the loop's range?)" + tag
    )
    fed = [n for n, _ in calls]
    assert fed[0] == n_prompt, (
        f"the first forward pass took {fed[0]} tokens: run the whole prompt ({n_prompt} tokens) once, then one "
        "token per step" + tag
    )
    for step, n in enumerate(fed[1:], start=1):
        if n == n_prompt:
            raise AssertionError(
                f"step {step} ran the prompt again ({n} tokens): the prefill is computed once; keep its cache and "
                "feed only the newest token" + tag
            )
        if n != 1:
            raise AssertionError(
                f"step {step} fed {n} tokens through the model: that recomputes the sequence (no KV cache). Pass the "
                "cache from the previous step (cache=...) and feed only the newest token, shape (1, 1)" + tag
            )
    if len(fed) > n_new:
        raise AssertionError(
            f"{len(fed)} forward passes for {n_new} new tokens: one too many. The prefill's logits give the first "
            "token; each later token needs one pass, and the last token needs none after it" + tag
        )
    if not torch.equal(out.cpu().long(), ref):
        first = int((out.cpu().long() != ref).nonzero()[0, 1])
        raise AssertionError(
            f"new token {first} is {int(out[0, first])}, greedy generate gives {int(ref[0, first])}: take the argmax "
            "of the last position's logits, pass the same cache object on every step and let the model count positions "
            "from the cache" + tag
        )


@exercise(
    "15.kv-decode",
    "kv_decode(model, input_ids, max_new_tokens): greedy decoding with a KV cache, written out: one forward pass "
    "over the prompt with a fresh cache, then one forward pass per new token feeding only that token (shape (1, 1)) "
    "and the same cache. Return the new tokens only, shape (1, max_new_tokens). Do not call generate.",
    _check_kv_decode,
)
def kv_decode(model, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    new = []
    with torch.inference_mode():
        logits = model(input_ids, cache=cache).logits
        for step in range(max_new_tokens):
            token = logits[:, -1:].argmax(-1)
            new.append(token)
            if step < max_new_tokens - 1:
                logits = model(token, cache=cache).logits
    return torch.cat(new, dim=1)


class _NoModelOps(TorchDispatchMode):
    """Records matrix products run inside the learner's prediction (building a cache is measuring, not predicting)."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if any(k in name for k in ("mm", "linear", "embedding", "scaled_dot_product")):
            self.ran.append(name)
        return func(*args, **(kwargs or {}))


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _random_config(rng: random.Random):
    from transformers import LlamaConfig

    kv_heads = rng.randint(1, 3)
    heads = kv_heads * rng.randint(2, 4)  # grouped-query attention: more query heads than kv heads
    head_dim = rng.choice((8, 16, 32))
    return LlamaConfig(
        vocab_size=64, hidden_size=heads * head_dim, intermediate_size=32, num_hidden_layers=rng.randint(2, 4),
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=128,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip


def _measured_kv_bytes(config, batch: int, tokens: int, dtype: torch.dtype) -> int:
    from transformers import DynamicCache, LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(dtype).eval()
    cache = DynamicCache(config=config)
    with torch.inference_mode():
        model(torch.randint(3, config.vocab_size, (batch, tokens)), cache=cache)
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)


def _formula(
    config,
    batch: int,
    tokens: int,
    dtype: torch.dtype,
    *,
    heads=None,
    two=2,
    layers=None,
    size=None,
    extra_tokens=0,
    unit=1.0,
):
    b = torch.empty((), dtype=dtype).element_size() if size is None else size
    L = config.num_hidden_layers if layers is None else layers
    kv = config.num_key_value_heads if heads is None else heads
    return L * two * batch * kv * (tokens + extra_tokens) * config.head_dim * b / unit


_MISTAKES: list[tuple[Callable, str]] = [
    (lambda c, b, t, d: _formula(c, b, t, d, heads=c.num_attention_heads), "you used the attention (query) heads: "
     "K and V are stored per KV head (config.num_key_value_heads); grouped-query attention shares them"),
    (lambda c, b, t, d: _formula(c, b, t, d, two=1), "you left out the factor 2: the cache holds keys AND values"),
    (lambda c, b, t, d: _formula(c, 1, t, d), "you left out the batch size: every sequence has its own cache"),
    (lambda c, b, t, d: _formula(c, b, t, d, layers=1), "you left out the layers: each layer keeps its own K and V"),
    (lambda c, b, t, d: _formula(c, b, t, d, size=4), "you assumed 4 bytes per element whatever the dtype: use "
     "torch.empty((), dtype=dtype).element_size() or dtype.itemsize"),
    (lambda c, b, t, d: _formula(c, b, t, d, size=2), "you assumed 2 bytes per element whatever the dtype: use "
     "torch.empty((), dtype=dtype).element_size() or dtype.itemsize"),
    (lambda c, b, t, d: _formula(c, b, t, d, extra_tokens=1), "off by one token: the cache holds the tokens seen"),
    (lambda c, b, t, d: _formula(c, b, t, d, extra_tokens=-1), "off by one token: the cache holds the tokens seen"),
    (lambda c, b, t, d: _formula(c, b, t, d, unit=1024), "you returned KiB: return bytes"),
    (lambda c, b, t, d: _formula(c, b, t, d, unit=2**20), "you returned MiB: return bytes"),
    (lambda c, b, t, d: _formula(c, b, t, d, unit=1e6), "you returned MB: return bytes"),
    (lambda c, b, t, d: _formula(c, b, t, d, unit=1 / 8), "you returned bits: return bytes"),
]  # fmt: skip


def _diagnose(answers: list[tuple[float, tuple]]) -> str:
    """The first known mistake that reproduces every one of the learner's answers."""
    for formula, why in _MISTAKES:
        if all(abs(got - formula(*case)) <= 1e-9 * max(1.0, abs(got)) for got, case in answers):
            return why
    return "compare your formula with: layers x 2 x batch x kv_heads x tokens x head_dim x bytes per element"


def _check_kv_memory(fn: Callable, *, seed: int | None = None) -> None:
    seed = _seed(seed)
    rng = random.Random(seed)
    tag = f" (random case seed {seed}; COURSE_EXERCISE_SEED={seed} repeats it)"
    dtypes = list(_DTYPES)
    rng.shuffle(dtypes)  # every dtype once: a fixed element size cannot pass
    batches = [rng.randint(2, 4), rng.randint(1, 4), rng.randint(1, 4)]
    answers, wrong = [], []
    for dtype, batch in zip(dtypes, batches, strict=True):
        config = _random_config(rng)
        tokens = rng.randint(3, 30)
        case = (config, batch, tokens, dtype)
        spy = _NoModelOps()
        with spy:
            got = fn(*case)
        assert not spy.ran, (
            f"your prediction ran a model ({spy.ran[0]}): predict the bytes from the config with the formula; the "
            "lesson measures a real cache afterwards" + tag
        )
        assert isinstance(got, (int, float)) and not isinstance(got, bool), (
            f"return the number of bytes as an int, got {type(got).__name__}" + tag
        )
        measured = _measured_kv_bytes(*case)
        answers.append((got, case))
        if got != measured:
            wrong.append(
                f"{config.num_hidden_layers} layers, {config.num_attention_heads} heads, {config.num_key_value_heads} "
                f"kv heads, head_dim {config.head_dim}, batch {batch}, {tokens} tokens, {dtype}: you predicted {got}, "
                f"the cache holds {measured} bytes"
            )
    assert not wrong, f"{wrong[0]}. " + _diagnose(answers) + tag


@exercise(
    "15.kv-memory",
    "kv_bytes(config, batch, tokens, dtype): the bytes a KV cache holds for a Llama config (layers, key/value heads, "
    "head_dim), a batch of sequences of `tokens` tokens each, in `dtype`. Return an int (bytes).",
    _check_kv_memory,
)
def kv_bytes(config, batch: int, tokens: int, dtype: torch.dtype) -> int:
    per_element = torch.empty((), dtype=dtype).element_size()
    return config.num_hidden_layers * 2 * batch * config.num_key_value_heads * tokens * config.head_dim * per_element
