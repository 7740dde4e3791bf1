"""Lesson 15 exercises: the KV-cache greedy decode loop, and the KV-cache memory prediction.

15.kv-decode runs the learner's loop on a small random-weight Llama (one of eight, copied fresh per call; prompt
and length drawn per call) and looks inside every forward pass: the positions its rotary embedding was given, the
tokens the first layer ran and the keys its attention saw (the cache's length). The first pass must run the whole
prompt; every later one exactly one token, at the next position, attending to every earlier token (so a loop that
re-runs the sequence, as ids or as ``inputs_embeds``, or one that drops the cache, is seen); the tokens must equal
greedy ``model.generate``'s.
15.kv-memory builds real caches of random small Llama configs (every dtype, a batch of 2 or more, one config whose
head_dim is not hidden_size // num_attention_heads) and compares the learner's predicted bytes (any number type),
naming the usual mistakes; a prediction that runs a model or builds tensors (a cache filled with zeros) is
measuring, and is refused. Each failure message ends with the call's seed, so a learner can rerun the same case.
"""

from __future__ import annotations

import functools
import numbers
import random
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from course_checks.exercises import exercise, observed, untimed
from course_checks.lesson_exercises.observe import Cases, cases
from course_utils.supply.llm import cache_arg, cache_keyword

_DECODE_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                     initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=2)  # fmt: skip


def _kw() -> str:
    """The keyword the installed transformers' Llama takes its KV cache by (``cache``; ``past_key_values`` before
    5.24), for the messages."""
    from transformers import LlamaForCausalLM

    return cache_keyword(LlamaForCausalLM)


@functools.lru_cache(maxsize=8)
def _decode_prototype(seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**_DECODE_SHAPE)).eval()  # big weights: the context matters
    model.generation_config.do_sample = False
    model.generation_config.pad_token_id = model.config.pad_token_id
    return model


def _fingerprint(model: torch.nn.Module) -> tuple:
    """What must not change for a model to be reused by the next check: its modules, dtypes and weights."""
    with torch.no_grad():
        return tuple((n, p.dtype, p.shape, float(p.double().sum())) for n, p in model.state_dict().items())


def _in_generate() -> bool:
    """True when a frame of transformers' ``generate`` is on the stack (however it was called)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "generate" and "transformers" in code.co_filename:
            return True
        frame = frame.f_back
    return False


def draw_decode_case(c: Cases) -> tuple[torch.nn.Module, torch.Tensor, int, torch.Tensor]:
    """One of 8 small random Llamas (built once; see :func:`_fingerprint`), a prompt of 4-20 tokens, 3-9 new tokens
    whose greedy continuation does not stop at EOS, and that continuation (``generate``'s)."""
    model = _decode_prototype(c.randint(0, 7))
    eos = model.config.eos_token_id
    for _ in range(20):
        n_prompt, n_new = c.randint(4, 20), c.randint(3, 9)
        prompt = torch.tensor([[c.randint(3, model.config.vocab_size - 1) for _ in range(n_prompt)]])
        with torch.inference_mode():
            ref = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n_new, do_sample=False)
        ref = ref[:, n_prompt:]
        if ref.shape[1] == n_new and eos not in ref:
            break
    return model, prompt, n_new, ref


class _Passes:
    """What each forward pass of the model really computed, seen inside it: the positions its rotary embedding
    was given, and in the first layer's attention the tokens it ran (queries) and the keys it attended to (the
    cache's length after the step's update, or the queries when no cache was passed)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.positions: list[list[int]] = []
        self.attention: list[tuple[int, int, bool]] = []  # (queries, keys, inside generate)
        inner = model.model
        self.hooks = [
            inner.rotary_emb.register_forward_pre_hook(self._rotary, with_kwargs=True),
            inner.layers[0].self_attn.register_forward_hook(self._attention, with_kwargs=True),
        ]

    def _rotary(self, module: Any, args: tuple, kwargs: dict) -> None:
        pos = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        self.positions.append([] if pos is None else [int(p) for p in pos.reshape(-1)[: pos.shape[-1]].tolist()])

    def _attention(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        queries = int(hidden.shape[-2]) if hidden is not None else -1
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        keys = int(cache.get_seq_length(module.layer_idx)) if cache is not None else queries
        self.attention.append((queries, keys, _in_generate()))

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


def _check_kv_decode(fn: Callable) -> None:
    with untimed():  # transformers' lazy modules load on first use (a minute on a busy machine): not the learner's
        from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: F401  (a missing package fails here)

    with cases("15.kv-decode") as c:
        with untimed():  # the checker's own model and greedy reference (generate's first call loads more modules)
            model, prompt, n_new, ref = draw_decode_case(c)
        n_prompt = prompt.shape[1]
        seen, before = _Passes(model), _fingerprint(model)
        try:
            out = fn(model, prompt.clone(), n_new)
        finally:
            seen.remove()
            if _fingerprint(model) != before:  # changed by the answer: build afresh for the next check
                _decode_prototype.cache_clear()
        judge_decode(seen.attention, seen.positions, out, prompt, n_new, ref)
    observed(f"{len(seen.attention)} forward passes for {n_new} new tokens: the first on the {n_prompt}-token prompt "
             "(positions 0..), each later one on 1 token at the next position attending to every earlier key "
             "(the cache); tokens equal greedy generate's")  # fmt: skip


def judge_decode(attention: list[tuple[int, int, bool]], positions: list[list[int]], out: Any, prompt: torch.Tensor,
                 n_new: int, ref: torch.Tensor) -> None:  # fmt: skip
    """Judge a decode loop from what its forward passes computed (queries, keys, positions) and its tokens."""
    n_prompt = prompt.shape[1]
    assert not any(gen for *_, gen in attention), (
        "your function called model.generate: write the loop yourself (prefill once, then one token per "
        "forward pass with the cache)"
    )
    assert attention, (
        "the model you were given never ran: compute the tokens with model(...) on it, not from fixed numbers"
    )
    assert isinstance(out, torch.Tensor), f"return a tensor of token ids, got {type(out).__name__}"
    out = out.reshape(1, -1) if out.dim() == 1 else out
    if out.shape[-1] == n_prompt + n_new and torch.equal(out[:, :n_prompt].cpu(), prompt):
        raise AssertionError("you returned the prompt too: return only the new tokens, shape (1, max_new_tokens)")
    assert out.shape == (1, n_new), (
        f"you returned {tuple(out.shape)}, expected (1, {n_new}): exactly max_new_tokens new tokens (an off-by-one "
        "in the loop's range?)"
    )
    queries, keys = attention[0][:2]
    assert queries == n_prompt, (
        f"the first forward pass ran {queries} tokens: run the whole prompt ({n_prompt} tokens) once, then one "
        "token per step"
    )
    for step, (q, k, _) in enumerate(attention[1:], start=1):
        if q == n_prompt:
            raise AssertionError(
                f"step {step} ran the prompt again ({q} tokens): the prefill is computed once; keep its cache and "
                "feed only the newest token"
            )
        if q != 1:
            raise AssertionError(
                f"step {step} ran {q} tokens through the model's layers: that recomputes the sequence (no KV cache), "
                f"whether fed as ids or as inputs_embeds. Pass the cache from the previous step ({_kw()}=...) and feed "
                "only the newest token, shape (1, 1)"
            )
        if k != n_prompt + step:
            raise AssertionError(
                f"step {step}'s attention saw {k} key(s), the sequence has {n_prompt + step} tokens: "
                + ("no cache reached the model, so it sees only the new token (no context). Pass the prefill's cache "
                   f"on every step ({_kw()}=cache)" if k == 1 else "the cache does not hold exactly the tokens so far "
                   "(a fresh cache, or tokens added twice?): pass the same cache object on every step")
            )  # fmt: skip
    if len(attention) > n_new:
        raise AssertionError(
            f"{len(attention)} forward passes for {n_new} new tokens: one too many. The prefill's logits give the "
            "first token; each later token needs one pass, and the last token needs none after it"
        )
    for step, pos in enumerate(positions[1 : len(attention)], start=1):
        if pos and pos != [n_prompt + step - 1]:
            raise AssertionError(
                f"step {step}'s token was placed at position {pos}, it is token {n_prompt + step - 1} of the sequence: "
                "let the model count positions from the cache (pass no position_ids, or the right ones)"
            )
    if not torch.equal(out.cpu().long(), ref):
        first = int((out.cpu().long() != ref).nonzero()[0, 1])
        raise AssertionError(
            f"new token {first} is {int(out[0, first])}, greedy generate gives {int(ref[0, first])}: take the argmax "
            "of the last position's logits, pass the same cache object on every step and let the model count positions "
            "from the cache"
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
        logits = model(input_ids, **cache_arg(model, cache)).logits  # cache= (transformers >= 5.24)
        for step in range(max_new_tokens):
            token = logits[:, -1:].argmax(-1)
            new.append(token)
            if step < max_new_tokens - 1:
                logits = model(token, **cache_arg(model, cache)).logits
    return torch.cat(new, dim=1)


class _NoModelOps(TorchDispatchMode):
    """Records what a prediction should not need: model operators (matmuls, embeddings, attention) and tensors of
    8 or more elements (a cache filled with zeros, to read its size, is a measurement, not a prediction)."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__
        if any(k in name for k in ("mm", "linear", "embedding", "scaled_dot_product")):
            self.ran.append(f"a model's operator ({name})")
        big = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.numel() >= 8]
        if big:
            self.ran.append(f"a tensor of shape {tuple(big[0].shape)} ({name})")
        return out


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _random_config(rng: random.Random, own_head_dim: bool = False, layers: tuple[int, int] = (2, 4)):
    """A small Llama config; ``own_head_dim``: its head_dim is not hidden_size // num_attention_heads (the config
    says head_dim itself, as many models do)."""
    from transformers import LlamaConfig

    kv_heads = rng.randint(1, 3)
    heads = kv_heads * rng.randint(2, 4)  # grouped-query attention: more query heads than kv heads
    head_dim = rng.choice((8, 16, 32))
    hidden = heads * (head_dim * 3 // 2 if own_head_dim else head_dim)  # 3/2: no other mistake's factor
    return LlamaConfig(
        vocab_size=64, hidden_size=hidden, intermediate_size=32, num_hidden_layers=rng.randint(*layers),
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=128,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip


def measured_kv_bytes(config, batch: int, tokens: int, dtype: torch.dtype) -> int:
    """The bytes a real ``DynamicCache`` holds after a Llama of ``config`` ran ``tokens`` tokens of ``batch``
    sequences in ``dtype`` (weights left uninitialised: their values do not change a cache's size)."""
    from transformers import DynamicCache, LlamaModel
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = LlamaModel(config).to(dtype).eval()
    cache = DynamicCache(config=config)
    with torch.inference_mode():
        model(torch.randint(3, config.vocab_size, (batch, tokens)), **cache_arg(model, cache))
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
    head_dim=None,
):
    b = torch.empty((), dtype=dtype).element_size() if size is None else size
    head_dim = config.head_dim if head_dim is None else head_dim
    L = config.num_hidden_layers if layers is None else layers
    kv = config.num_key_value_heads if heads is None else heads
    return L * two * batch * kv * (tokens + extra_tokens) * head_dim * b / unit


_MISTAKES: list[tuple[Callable, str]] = [
    (lambda c, b, t, d: _formula(c, b, t, d, size=None, head_dim=c.hidden_size // c.num_attention_heads),
     "you took head_dim as hidden_size // num_attention_heads: this config sets head_dim itself (config.head_dim)"),
    (lambda c, b, t, d: _formula(c, b, t, d, heads=c.num_attention_heads), "you used the attention (query) heads: "
     "K and V are stored per KV head (config.num_key_value_heads); grouped-query attention shares them"),
    (lambda c, b, t, d: _formula(c, b, t, d, heads=1, head_dim=c.hidden_size), "you used hidden_size per token: "
     "K and V each hold num_key_value_heads x head_dim values per token (grouped-query attention has fewer KV "
     "heads than query heads, and head_dim x heads need not be hidden_size)"),
    (lambda c, b, t, d: _formula(c, b, t, d, two=1), "you left out the factor 2: the cache holds keys AND values"),
    (lambda c, b, t, d: _formula(c, 1, t, d), "you left out the batch size: every sequence has its own cache"),
    (lambda c, b, t, d: _formula(c, b, t, d, layers=1), "you left out the layers: each layer keeps its own K and V"),
    (lambda c, b, t, d: _formula(c, b, t, d, size=4), "you assumed 4 bytes per element whatever the dtype: use "
     "torch.empty((), dtype=dtype).element_size() or dtype.itemsize"),
    (lambda c, b, t, d: _formula(c, b, t, d, size=2), "you assumed 2 bytes per element whatever the dtype: use "
     "torch.empty((), dtype=dtype).element_size() or dtype.itemsize"),
    (lambda c, b, t, d: _formula(c, b, c.max_position_embeddings, d), "you sized the cache for "
     "max_position_embeddings tokens (a StaticCache preallocated to the model's limit): a DynamicCache holds "
     "exactly the tokens seen"),
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


def draw_memory_cases(c: Cases) -> list[tuple[Any, int, int, torch.dtype]]:
    """Three cases (config, batch, tokens, dtype): every dtype once, a batch of 3 or more first, one config whose
    head_dim is its own (not hidden_size // num_attention_heads)."""
    dtypes = list(_DTYPES)
    c.rng.shuffle(dtypes)  # every dtype once: a fixed element size cannot pass
    own = c.randint(0, 2)
    configs = [_random_config(c.rng, own_head_dim=i == own, layers=(3, 4) if i == own else (2, 4)) for i in range(3)]
    # the first batch is 3 or more and differs from its layer count (so "no batch", "no layers" and "no factor 2"
    # give different answers); one config has 3 or 4 layers
    batches = [c.choice([b for b in (3, 4, 5) if b != configs[0].num_hidden_layers]), c.randint(1, 4),
               c.randint(1, 4)]  # fmt: skip
    return [(config, batch, c.randint(3, 30), dtype)
            for config, dtype, batch in zip(configs, dtypes, batches, strict=True)]  # fmt: skip


def _as_number(got: Any) -> float | None:
    """The learner's answer as a number (int, float, numpy or 0-d torch scalar), or None if it is not one."""
    if isinstance(got, torch.Tensor) and got.numel() == 1 and not got.dtype.is_complex and got.dtype != torch.bool:
        return float(got)
    if isinstance(got, numbers.Real) and not isinstance(got, bool):
        return float(got)
    return None


def judge_memory(answers: list[tuple[Any, tuple]], truths: list[int]) -> None:
    """Each answer equal to its case's true cache bytes, else the first known mistake that explains them all."""
    wrong = []
    for (got, case), measured in zip(answers, truths, strict=True):
        value = _as_number(got)
        assert value is not None, f"return the number of bytes as an int, got {type(got).__name__}"
        if value != measured:
            config, batch, tokens, dtype = case
            wrong.append(
                f"{config.num_hidden_layers} layers, {config.num_attention_heads} heads, {config.num_key_value_heads} "
                f"kv heads, head_dim {config.head_dim} (hidden_size {config.hidden_size}), batch {batch}, {tokens} "
                f"tokens, {dtype}: you predicted {got}, the cache holds {measured} bytes"
            )
    assert not wrong, f"{wrong[0]}. " + _diagnose([(_as_number(g), case) for g, case in answers])


def _check_kv_memory(fn: Callable) -> None:
    with cases("15.kv-memory") as c:
        answers, truths = [], []
        for case in draw_memory_cases(c):
            spy = _NoModelOps()
            with spy:
                got = fn(*case)
            assert not spy.ran, (
                f"your prediction made {spy.ran[0]}: that is measuring (running a model, filling a cache), not "
                "predicting. Compute the bytes from the config with the formula; the lesson measures a real cache "
                "afterwards"
            )
            answers.append((got, case))
            truths.append(measured_kv_bytes(*case))
        judge_memory(answers, truths)
    kinds = ", ".join(str(case[3]).removeprefix("torch.") for _, case in answers)
    observed(f"{len(truths)} predictions equal to the bytes of real DynamicCaches ({kinds}; "
             f"batches {[t[1] for _, t in answers]}; one config with its own head_dim), made without running a "
             "model or building tensors")  # fmt: skip


@exercise(
    "15.kv-memory",
    "kv_bytes(config, batch, tokens, dtype): the bytes a KV cache holds for a Llama config (layers, key/value heads, "
    "head_dim), a batch of sequences of `tokens` tokens each, in `dtype`. Return an int (bytes).",
    _check_kv_memory,
)
def kv_bytes(config, batch: int, tokens: int, dtype: torch.dtype) -> int:
    per_element = torch.empty((), dtype=dtype).element_size()
    return config.num_hidden_layers * 2 * batch * config.num_key_value_heads * tokens * config.head_dim * per_element
