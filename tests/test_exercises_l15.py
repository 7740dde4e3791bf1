"""Lesson 15's exercise checkers accept the reference solutions and reject plausible wrong submissions, saying why."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from course_checks import exercises

SEEDS = (1, 2, 3)  # full checker runs of each wrong answer (the 200-seed sweeps run the drawing/judging core)
SWEEP = range(200)


def _verdicts(key, fn, seeds=SEEDS):
    return [exercises.verdict(key, fn, seed=s) for s in seeds]


def _rejected(key, fn, reason, seeds=SEEDS):
    for v in (exercises.verdict(key, fn, seed=s) for s in seeds):
        assert v != "accepted" and reason in v, v
        assert "seed" in v, "a failure names its seed"


# ---- 15.kv-decode ------------------------------------------------------------------------------------------
def decode_returned_cache(model, ids, n):  # right too: the cache the model returns, passed back each step
    new = []
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        for step in range(n):
            token = out.logits[:, -1:].argmax(-1)
            new.append(token)
            if step < n - 1:
                out = model(token, cache=out.cache, use_cache=True)
    return torch.cat(new, 1)


def decode_explicit_positions(model, ids, n):  # right too: positions given by hand, int64 numpy-free
    cache, new = DynamicCache(config=model.config), []
    with torch.no_grad():
        logits = model(ids, cache=cache).logits
        for step in range(n):
            token = logits[:, -1:].argmax(-1)
            new.append(token)
            if step < n - 1:
                pos = torch.tensor([[ids.shape[1] + step]])
                logits = model(token, cache=cache, position_ids=pos).logits
    return torch.cat(new, 1)[0]  # a 1-D tensor is accepted too


def test_decode_reference_and_alternatives_are_accepted():
    for fn in (exercises.get("15.kv-decode").solution, decode_returned_cache, decode_explicit_positions):
        assert _verdicts("15.kv-decode", fn) == ["accepted"] * len(SEEDS), fn.__name__
    assert exercises.verdict("15.kv-decode", exercises.get("15.kv-decode").solution) == "accepted"  # random seed


def test_decode_reference_is_accepted_on_many_seeds():
    """The full check of the reference on 40 seeds (each runs generate and the loop: the 200-seed sweep of the
    decode checker is its judging core, below)."""
    ref = exercises.get("15.kv-decode").solution
    bad = {s: v for s in range(40) if (v := exercises.verdict("15.kv-decode", ref, seed=s)) != "accepted"}
    assert not bad, bad


def no_cache_embeds(model, ids, n):
    """No cache: the sequence's embeddings grow by one token per step and all of them run again (inputs_embeds)."""
    embed = model.get_input_embeddings()
    with torch.no_grad():
        embeds = embed(ids)
        new = []
        for _ in range(n):
            token = model(inputs_embeds=embeds, use_cache=False).logits[:, -1:].argmax(-1)
            new.append(token)
            embeds = torch.cat([embeds, embed(token)], 1)
    return torch.cat(new, 1)


def test_decode_rejects_no_cache_through_inputs_embeds():
    _rejected("15.kv-decode", no_cache_embeds, "recomputes the sequence (no KV cache), whether fed as ids or as")


def fresh_cache_each_step(model, ids, n):
    new = []
    with torch.no_grad():
        logits = model(ids, cache=DynamicCache(config=model.config)).logits
        for step in range(n):
            token = logits[:, -1:].argmax(-1)
            new.append(token)
            if step < n - 1:
                logits = model(token, cache=DynamicCache(config=model.config)).logits
    return torch.cat(new, 1)


def test_decode_rejects_a_fresh_cache_each_step():
    _rejected("15.kv-decode", fresh_cache_each_step, "no cache reached the model")


def test_the_decode_judge_names_each_mistake_on_every_drawn_case():
    """The judging core over 200 seeds: for each seed's case (prompt and length), the passes each wrong loop
    makes (queries, keys, positions) are rejected with their reason, and the right passes accepted."""
    import random

    from course_checks.lesson_exercises.l15 import judge_decode

    for seed in SWEEP:
        rng = random.Random(seed)
        n_prompt, n_new = rng.randint(4, 20), rng.randint(3, 9)
        prompt = torch.randint(3, 500, (1, n_prompt), generator=torch.Generator().manual_seed(seed))
        ref = torch.randint(3, 500, (1, n_new), generator=torch.Generator().manual_seed(seed + 1))
        right = [(n_prompt, n_prompt, False)] + [(1, n_prompt + s, False) for s in range(1, n_new)]
        pos = [list(range(n_prompt))] + [[n_prompt + s - 1] for s in range(1, n_new)]
        judge_decode(right, pos, ref.clone(), prompt, n_new, ref)
        wrong = {
            "recomputes the sequence": ([(n_prompt + s, n_prompt + s, False) for s in range(n_new)], pos, ref),
            "ran the prompt again": ([(n_prompt, n_prompt, False)] * n_new, pos, ref),
            "no cache reached the model": ([right[0]] + [(1, 1, False)] * (n_new - 1), pos, ref),
            "one too many": (right + [(1, n_prompt + n_new, False)], pos + [[n_prompt + n_new - 1]], ref),
            "placed at position": (right, [pos[0]] + [[n_prompt]] * (n_new - 1), ref),
            "greedy generate gives": (right, pos, (ref + 1) % 500),
            "called model.generate": ([(n_prompt, n_prompt, True)], pos, ref),
            "expected (1, ": (right, pos, ref[:, :-1]),
        }
        for reason, (attention, positions, out) in wrong.items():
            try:
                judge_decode(attention, positions, out, prompt, n_new, ref)
            except AssertionError as exc:
                assert reason in str(exc), (seed, reason, str(exc))
            else:
                raise AssertionError(f"seed {seed}: {reason!r} accepted")


def test_decode_leaves_no_hook_and_rebuilds_a_model_the_answer_changed():
    from course_checks.lesson_exercises import l15
    from course_checks.lesson_exercises.observe import Cases

    def halves(model, ids, n):
        model.half()  # changes the checker's model in place
        return torch.zeros(1, n, dtype=torch.long)

    assert exercises.verdict("15.kv-decode", halves, seed=1) != "accepted"
    model = l15.draw_decode_case(Cases(1))[0]
    assert next(model.parameters()).dtype == torch.float32, "a model an answer changed is not reused"
    assert not model.model.rotary_emb._forward_pre_hooks and not model.model.layers[0].self_attn._forward_hooks


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

    _rejected("15.kv-decode", forgets_cache, "no cache reached the model")


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

    _rejected("15.kv-decode", stuck, "count positions")


# ---- 15.kv-memory ------------------------------------------------------------------------------------------


def _bytes(dtype):
    return torch.empty((), dtype=dtype).element_size()


def test_memory_rejects_attention_heads():
    def heads(c, b, t, dt):
        return c.num_hidden_layers * 2 * b * c.num_attention_heads * t * c.head_dim * _bytes(dt)

    _rejected("15.kv-memory", heads, "attention (query) heads", seeds=SEEDS)


def test_memory_rejects_the_hidden_size_per_token():
    def hidden(c, b, t, dt):  # K and V as wide as the hidden state: the query heads, and hidden_size, not head_dim
        return c.num_hidden_layers * 2 * b * t * c.hidden_size * _bytes(dt)

    _rejected("15.kv-memory", hidden, "you used hidden_size per token", seeds=SEEDS)


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

    _rejected("15.kv-memory", measure, "that is measuring")


def test_memory_rejects_filling_a_cache_with_zeros():
    def zeros(c, b, t, dt):
        cache = DynamicCache(config=c)
        for layer in range(c.num_hidden_layers):
            kv = torch.zeros(b, c.num_key_value_heads, t, c.head_dim, dtype=dt)
            cache.update(kv, kv.clone(), layer)
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)

    _rejected("15.kv-memory", zeros, "that is measuring")


def test_memory_rejects_head_dim_from_the_hidden_size():
    def from_hidden(c, b, t, dt):
        return (
            c.num_hidden_layers
            * 2
            * b
            * c.num_key_value_heads
            * t
            * (c.hidden_size // c.num_attention_heads)
            * _bytes(dt)
        )

    _rejected("15.kv-memory", from_hidden, "hidden_size // num_attention_heads")


def test_memory_accepts_the_answer_in_any_number_type():
    import numpy as np

    ref = exercises.get("15.kv-memory").solution
    for convert in (np.int64, float, np.float64, lambda v: torch.tensor(v), int, np.int32):
        assert _verdicts("15.kv-memory", lambda c, b, t, dt, f=convert: f(ref(c, b, t, dt))) == ["accepted"] * 3
    alternatives = [
        lambda c, b, t, dt: c.num_hidden_layers * 2 * b * c.num_key_value_heads * t * c.head_dim * dt.itemsize,
        lambda c, b, t, dt: np.prod([c.num_hidden_layers, 2, b, c.num_key_value_heads, t, c.head_dim, dt.itemsize]),
        lambda c, b, t, dt: (
            c.num_hidden_layers * 2 * b * c.num_key_value_heads * t * c.head_dim * torch.finfo(dt).bits // 8
        ),
    ]
    for fn in alternatives:
        assert _verdicts("15.kv-memory", fn) == ["accepted"] * 3
    assert "got str" in exercises.verdict("15.kv-memory", lambda c, b, t, dt: str(ref(c, b, t, dt)), seed=1)


def test_the_memory_judge_over_every_drawn_case():
    """The drawing and judging core over 200 seeds: each known mistake is named, right answers in any number type
    are accepted. (The truth here is the formula; the next test checks it against real caches.)"""
    import numpy as np

    from course_checks.lesson_exercises import l15
    from course_checks.lesson_exercises.observe import Cases

    ref = exercises.get("15.kv-memory").solution
    for seed in SWEEP:
        cs = l15.draw_memory_cases(Cases(seed))
        truths = [ref(*case) for case in cs]
        assert len({case[3] for case in cs}) == 3 and cs[0][1] >= 3
        assert any(case[0].head_dim != case[0].hidden_size // case[0].num_attention_heads for case in cs)
        l15.judge_memory([(np.int64(t), case) for t, case in zip(truths, cs, strict=True)], truths)
        for formula, why in l15._MISTAKES:
            try:
                l15.judge_memory([(formula(*case), case) for case in cs], truths)
            except AssertionError as exc:
                assert why in str(exc), (seed, why, str(exc))
            else:
                raise AssertionError(f"seed {seed}: {why!r} accepted")


def test_a_cache_sized_for_the_position_limit_is_named():
    """A StaticCache's reasoning (preallocated to the model's max_position_embeddings), not the tokens seen: named
    on each of 200 seeds' cases by the judging core, and through the full check on a few."""
    from course_checks.lesson_exercises import l15
    from course_checks.lesson_exercises.observe import Cases

    ref = exercises.get("15.kv-memory").solution

    def preallocated(c, b, t, dt):
        return ref(c, b, c.max_position_embeddings, dt)

    for seed in SWEEP:
        cs = l15.draw_memory_cases(Cases(seed))
        try:
            l15.judge_memory([(preallocated(*case), case) for case in cs], [ref(*case) for case in cs])
        except AssertionError as exc:
            assert "max_position_embeddings tokens" in str(exc), (seed, str(exc))
        else:
            raise AssertionError(f"seed {seed}: accepted")
    _rejected("15.kv-memory", preallocated, "max_position_embeddings tokens")


def test_the_formula_is_what_real_caches_hold():
    from course_checks.lesson_exercises import l15
    from course_checks.lesson_exercises.observe import Cases

    ref = exercises.get("15.kv-memory").solution
    for seed in range(12):
        for case in l15.draw_memory_cases(Cases(seed)):
            assert l15.measured_kv_bytes(*case) == ref(*case), (seed, case[1:])


def test_check_prints_the_verdicts(capsys):
    exercises.check("15.kv-memory", exercises.get("15.kv-memory").solution)

    def unsolved(c, b, t, dt):
        raise NotImplementedError

    exercises.check("15.kv-memory", unsolved)
    out = capsys.readouterr().out
    assert "passed its self-check" in out and "not solved yet" in out


def test_kv_decode_checkers_own_set_up_is_not_counted(monkeypatch):
    """The checker's first imports and its reference (generate) run untimed: with a 1.5 s limit and a set-up made
    to take 2.5 s of CPU, the reference is still accepted (a busy machine's minute of imports is not the learner's)."""
    import dataclasses
    import time

    from course_checks.lesson_exercises import l15

    sealed, code = exercises._SEALED["15.kv-decode"]
    monkeypatch.setitem(exercises._SEALED, "15.kv-decode", (dataclasses.replace(sealed, time_limit=1.5), code))
    real = l15.draw_decode_case

    def slow_draw(c):
        t0 = time.thread_time()
        while time.thread_time() - t0 < 2.5:
            pass
        return real(c)

    monkeypatch.setattr(l15, "draw_decode_case", slow_draw)
    assert exercises.verdict("15.kv-decode", l15.kv_decode, seed=0) == "accepted"
