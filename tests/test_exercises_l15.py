"""Lesson 15's exercise checkers accept the reference solutions and reject plausible wrong submissions, saying why."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from course_utils.check import exercises

SEEDS = (1, 2, 3)


def _verdicts(key, fn):
    return [exercises.verdict(key, fn, seed=s) for s in SEEDS]


def _rejected(key, fn, reason, seeds=(1,)):
    for v in (exercises.verdict(key, fn, seed=s) for s in seeds):
        assert v != "accepted" and reason in v, v
        assert "seed" in v, "a failure names its seed"


def test_references_pass_on_several_seeds():
    for key in ("15.kv-decode", "15.kv-memory"):
        assert _verdicts(key, exercises.get(key).solution) == ["accepted"] * len(SEEDS)
    assert exercises.verdict("15.kv-decode", exercises.get("15.kv-decode").solution) == "accepted"  # random seed


# ---- 15.kv-decode ------------------------------------------------------------------------------------------


def test_decode_rejects_no_cache():
    def no_cache(model, ids, n):
        seq = ids
        with torch.no_grad():
            for _ in range(n):
                nxt = model(seq, use_cache=False).logits[:, -1:].argmax(-1)
                seq = torch.cat([seq, nxt], 1)
        return seq[:, ids.shape[1] :]

    _rejected("15.kv-decode", no_cache, "recomputes the sequence (no KV cache)")


def test_decode_rejects_generate_inside():
    def via_generate(model, ids, n):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
        return out[:, ids.shape[1] :]

    def via_class_generate(model, ids, n):  # the same, called through the class
        out = type(model).generate(model, ids, attention_mask=torch.ones_like(ids), max_new_tokens=n)
        return out[:, ids.shape[1] :]

    _rejected("15.kv-decode", via_generate, "called model.generate")
    _rejected("15.kv-decode", via_class_generate, "called model.generate")


def test_decode_rejects_a_hard_coded_answer():
    _rejected("15.kv-decode", lambda model, ids, n: torch.zeros(1, n, dtype=torch.long), "never ran")


def test_decode_rejects_recomputing_the_prefill_each_step():
    def prefill_each_step(model, ids, n):
        new = []
        with torch.no_grad():
            for _ in range(n):
                cache = DynamicCache(config=model.config)
                seq = torch.cat([ids, *new], 1) if new else ids
                model(seq[:, : ids.shape[1]], cache=cache)  # the prompt again, every step
                logits = model(seq[:, ids.shape[1] :], cache=cache).logits if new else model(ids).logits
                new.append(logits[:, -1:].argmax(-1))
        return torch.cat(new, 1)

    _rejected("15.kv-decode", prefill_each_step, "ran the prompt again")


def test_decode_rejects_off_by_one_lengths():
    ref = exercises.get("15.kv-decode").solution
    _rejected("15.kv-decode", lambda m, ids, n: ref(m, ids, n + 1), "expected (1, ")
    _rejected("15.kv-decode", lambda m, ids, n: ref(m, ids, n - 1), "expected (1, ")


def test_decode_rejects_the_prompt_in_the_answer():
    ref = exercises.get("15.kv-decode").solution
    _rejected("15.kv-decode", lambda m, ids, n: torch.cat([ids, ref(m, ids, n)], 1), "returned the prompt too")


def test_decode_rejects_an_extra_forward_pass():
    def one_too_many(model, ids, n):
        cache, new = DynamicCache(config=model.config), []
        with torch.no_grad():
            logits = model(ids, cache=cache).logits
            for _ in range(n):
                token = logits[:, -1:].argmax(-1)
                new.append(token)
                logits = model(token, cache=cache).logits  # also after the last token
        return torch.cat(new, 1)

    _rejected("15.kv-decode", one_too_many, "one too many")


def test_decode_rejects_one_token_without_the_cache():
    def forgets_cache(model, ids, n):
        new = []
        with torch.no_grad():
            logits = model(ids).logits
            for step in range(n):
                token = logits[:, -1:].argmax(-1)
                new.append(token)
                if step < n - 1:
                    logits = model(token).logits  # one token, but no cache: the model sees no context
        return torch.cat(new, 1)

    _rejected("15.kv-decode", forgets_cache, "greedy generate gives")


def test_decode_rejects_a_stuck_position():
    def stuck(model, ids, n):
        cache, new = DynamicCache(config=model.config), []
        with torch.no_grad():
            logits = model(ids, cache=cache).logits
            for step in range(n):
                token = logits[:, -1:].argmax(-1)
                new.append(token)
                if step < n - 1:  # every new token told it sits right after the prompt
                    logits = model(token, cache=cache, position_ids=torch.tensor([[ids.shape[1]]])).logits
        return torch.cat(new, 1)

    _rejected("15.kv-decode", stuck, "count positions", seeds=SEEDS)


# ---- 15.kv-memory ------------------------------------------------------------------------------------------


def _bytes(dtype):
    return torch.empty((), dtype=dtype).element_size()


def test_memory_rejects_attention_heads():
    def heads(c, b, t, dt):
        return c.num_hidden_layers * 2 * b * c.num_attention_heads * t * c.head_dim * _bytes(dt)

    _rejected("15.kv-memory", heads, "attention (query) heads", seeds=SEEDS)


def test_memory_rejects_missing_factor_two():
    _rejected(
        "15.kv-memory",
        lambda c, b, t, dt: c.num_hidden_layers * b * c.num_key_value_heads * t * c.head_dim * _bytes(dt),
        "factor 2",
        seeds=SEEDS,
    )


def test_memory_rejects_fixed_element_size():
    def always_fp32(c, b, t, dt):
        return c.num_hidden_layers * 2 * b * c.num_key_value_heads * t * c.head_dim * 4

    def always_two(c, b, t, dt):
        return c.num_hidden_layers * 2 * b * c.num_key_value_heads * t * c.head_dim * 2

    _rejected("15.kv-memory", always_fp32, "assumed 4 bytes per element", seeds=SEEDS)
    _rejected("15.kv-memory", always_two, "assumed 2 bytes per element", seeds=SEEDS)


def test_memory_rejects_missing_batch_and_layers():
    def no_batch(c, b, t, dt):
        return c.num_hidden_layers * 2 * c.num_key_value_heads * t * c.head_dim * _bytes(dt)

    def no_layers(c, b, t, dt):
        return 2 * b * c.num_key_value_heads * t * c.head_dim * _bytes(dt)

    _rejected("15.kv-memory", no_batch, "batch size", seeds=SEEDS)
    _rejected("15.kv-memory", no_layers, "left out the layers", seeds=SEEDS)


def test_memory_rejects_wrong_units_and_hard_coded_numbers():
    ref = exercises.get("15.kv-memory").solution
    _rejected("15.kv-memory", lambda c, b, t, dt: ref(c, b, t, dt) / 1024, "KiB")
    _rejected("15.kv-memory", lambda c, b, t, dt: 12288, "you predicted 12288")


def test_memory_rejects_measuring_instead_of_predicting():
    from transformers import LlamaForCausalLM

    def measure(c, b, t, dt):
        cache = DynamicCache(config=c)
        LlamaForCausalLM(c).to(dt)(torch.randint(3, c.vocab_size, (b, t)), cache=cache)
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)

    _rejected("15.kv-memory", measure, "ran a model")


def test_check_prints_the_verdicts(capsys):
    exercises.check("15.kv-memory", exercises.get("15.kv-memory").solution)

    def unsolved(c, b, t, dt):
        raise NotImplementedError

    exercises.check("15.kv-memory", unsolved)
    out = capsys.readouterr().out
    assert "correct" in out and "not solved yet" in out
