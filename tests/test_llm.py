"""course_utils.supply.llm: the SmolLM2 file found, converted once into a checksummed cache; a stand-in of its shape."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from course_utils.supply import llm
from course_utils.supply.errors import CourseError, MissingFileError, SettingError


def test_tiny_llama_has_smollm2s_shape_and_is_seeded():
    model = llm.tiny_llama()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # SmolLM2-135M's count, tied embeddings
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 576, 9, 3)
    assert (cfg.head_dim, cfg.vocab_size, cfg.intermediate_size) == (64, 49152, 1536)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not model.training


def test_tiny_llama_overrides_and_seed():
    a, b = llm.tiny_llama(num_hidden_layers=2), llm.tiny_llama(num_hidden_layers=2)
    c = llm.tiny_llama(seed=1, num_hidden_layers=2)
    assert a.config.num_hidden_layers == 2 and len(a.model.layers) == 2
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.model.layers[0].mlp.up_proj.weight, c.model.layers[0].mlp.up_proj.weight)
    rng_before = torch.random.get_rng_state()
    llm.tiny_llama(num_hidden_layers=1)
    assert torch.equal(rng_before, torch.random.get_rng_state()), "building the stand-in must not move the global RNG"


def test_tiny_llama_generates_greedily_with_the_cache():
    model = llm.tiny_llama(num_hidden_layers=2)
    ids = torch.tensor([[1, 504, 3156, 282, 4649, 30]])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
    assert out.shape == (1, 11) and torch.equal(out[:, :6], ids)
    with torch.no_grad():  # the first new token is the argmax of the prompt's last logits
        assert out[0, 6] == model(ids).logits[0, -1].argmax()


class _NewForward(torch.nn.Module):  # transformers >= 5.24
    def forward(self, input_ids=None, attention_mask=None, cache=None, **kwargs):
        return "cache" if cache is not None else "none"


class _OldForward(torch.nn.Module):  # transformers 5.0-5.23: an unknown cache= would land in **kwargs
    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, **kwargs):
        return "cache" if past_key_values is not None else "none"


class _NoCacheForward(torch.nn.Module):
    def forward(self, input_ids=None, **kwargs):
        return "none"


def test_cache_arg_names_the_keyword_the_forward_takes():
    assert llm.cache_keyword(_NewForward()) == "cache" and llm.cache_arg(_NewForward(), 7) == {"cache": 7}
    assert llm.cache_keyword(_OldForward()) == "past_key_values"
    for module in (_NewForward(), _OldForward()):
        assert module(1, **llm.cache_arg(module, object())) == "cache"  # the cache reaches the forward
    with pytest.raises(llm.MissingBackendError, match=r"neither `cache` nor `past_key_values`.*make setup"):
        llm.cache_arg(_NoCacheForward(), 1)


def test_cache_arg_reaches_the_installed_transformers_cache():
    """On the installed transformers: the cache passed by cache_arg fills (the prompt's tokens), and the next step
    attends to it (its logits equal a pass over the whole sequence)."""
    from transformers import DynamicCache

    model = llm.tiny_llama(num_hidden_layers=2, vocab_size=512)
    ids = torch.tensor([[1, 50, 316, 28, 469, 30]])
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(ids[:, :5], **llm.cache_arg(model, cache))
        assert cache.get_seq_length() == 5
        step = model(ids[:, 5:], **llm.cache_arg(model, cache)).logits[:, -1]
        whole = model(ids).logits[:, -1]
    torch.testing.assert_close(step, whole, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_crop_cache_forgets_the_last_token_and_the_next_step_overwrites_it(kind):
    """On the installed transformers (5.17's StaticCache has no crop: the fallback path): after a step and a crop,
    the cache holds the prompt again and the step's logits come out the same."""
    from transformers import DynamicCache, StaticCache

    model = llm.tiny_llama(num_hidden_layers=2, vocab_size=512)
    ids = torch.tensor([[1, 50, 316, 28, 469]])
    cache = (
        DynamicCache(config=model.config) if kind == "dynamic" else StaticCache(config=model.config, max_cache_len=8)
    )
    with torch.inference_mode():
        model(ids, **llm.cache_arg(model, cache))
        pos = torch.tensor([[5]])
        first = model(torch.tensor([[30]]), position_ids=pos, **llm.cache_arg(model, cache)).logits
        assert cache.get_seq_length() == 6
        llm.crop_cache(cache, 1)
        assert cache.get_seq_length() == 5
        second = model(torch.tensor([[30]]), position_ids=pos, **llm.cache_arg(model, cache)).logits
    torch.testing.assert_close(first, second)
    with pytest.raises(ValueError, match="pass how many"):
        llm.crop_cache(cache, -1)


def test_crop_cache_without_crop_moves_each_layers_count_back():
    """The transformers 5.17-5.23 StaticLayer shape: no crop, a cumulative_length tensor changed in place."""

    class Layer:
        def __init__(self, n, initialized=True):
            self.cumulative_length, self.is_initialized = torch.tensor(n), initialized

    class Cache:
        layers = [Layer(7), Layer(7), Layer(0, initialized=False)]

    cache = Cache()
    counts = [layer.cumulative_length for layer in cache.layers]
    llm.crop_cache(cache, 2)
    assert [int(c) for c in counts] == [5, 5, 0]
    assert all(c is layer.cumulative_length for c, layer in zip(counts, cache.layers, strict=True))  # in place

    class Odd:
        layers = [object()]

    with pytest.raises(llm.MissingBackendError, match="neither crop nor cumulative_length"):
        llm.crop_cache(Odd(), 1)


def test_missing_package_names_the_fix(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == llm.PACKAGE else real(name, *a))
    with pytest.raises(MissingFileError, match="make setup"):
        llm.smollm2_files()
    assert llm.has_smollm2() is False


def test_cache_dir_follows_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(llm.CACHE_VAR, str(tmp_path / "x"))
    assert llm.cache_dir() == tmp_path / "x" / llm.MODEL_FOLDER  # a folder of the cache's own, inside the one named
    monkeypatch.setenv(llm.CACHE_VAR, "~/models")
    assert llm.cache_dir() == Path.home() / "models" / llm.MODEL_FOLDER
    monkeypatch.delenv(llm.CACHE_VAR)
    assert llm.cache_dir().parts[-2:] == ("gpu-inference-course", "smollm2-135m")


def _fake_cache(folder, gguf):
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    files = {p.name: llm._sha256(p) for p in folder.iterdir()}
    manifest = {"format": llm._FORMAT, "source": gguf.name, "source_size": gguf.stat().st_size, "files": files}
    (folder / llm.MANIFEST).write_text(json.dumps(manifest))


def test_cache_problems_are_found(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"gguf")
    folder = tmp_path / "cache"
    assert llm._cache_problem(folder, gguf) is None  # nothing there yet: convert, no message
    _fake_cache(folder, gguf)
    assert llm._cache_problem(folder, gguf) is None
    (folder / "model.safetensors").write_bytes(b"weightz")  # same size, other bytes
    assert "model.safetensors does not match its sha256" == llm._cache_problem(folder, gguf)
    (folder / "model.safetensors").unlink()
    assert llm._cache_problem(folder, gguf) == "model.safetensors is missing"
    (folder / llm.MANIFEST).write_text("{not json")
    assert llm._cache_problem(folder, gguf) == "its manifest is damaged"
    (folder / llm.MANIFEST).unlink()
    assert llm._cache_problem(folder, gguf) == "no manifest"
    gguf.write_bytes(b"another gguf")
    _fake_cache(tmp_path / "c2", tmp_path / "m.gguf")
    (tmp_path / "m.gguf").write_bytes(b"x")
    assert llm._cache_problem(tmp_path / "c2", tmp_path / "m.gguf") == "it was converted from another GGUF file"


def test_a_damaged_cache_is_rebuilt_not_used(monkeypatch, tmp_path, capsys):
    gguf_dir = tmp_path / "pkg"
    gguf_dir.mkdir()
    (gguf_dir / llm.GGUF_NAME).write_bytes(b"gguf")
    monkeypatch.setattr(llm, "smollm2_files", lambda: (gguf_dir, llm.GGUF_NAME))
    monkeypatch.setenv(llm.CACHE_VAR, str(tmp_path / "cache"))
    _fake_cache(tmp_path / "cache", gguf_dir / llm.GGUF_NAME)
    (tmp_path / "cache" / "model.safetensors").write_bytes(b"corrupt")
    converted = []

    def fake_convert(folder, d, name):
        converted.append(folder)
        raise RuntimeError("stop here: conversion was asked for")

    monkeypatch.setattr(llm, "_convert", fake_convert)
    with pytest.raises(RuntimeError, match="conversion was asked for"):
        llm.load_smollm2()
    assert converted == [tmp_path / "cache"]
    assert "cannot be used (model.safetensors does not match its sha256): rebuilding it" in capsys.readouterr().out


def test_real_smollm2_answers_paris():
    """Loads the real model (first run converts it: ~20 s quiet, ~2 min on a loaded machine)."""
    model, tok = llm.load_smollm2()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert llm._cache_problem(llm.cache_dir(), llm.smollm2_files()[0] / llm.GGUF_NAME) is None
    ids = llm.chat_ids(tok, "What is the capital of France?")
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
    assert tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).startswith("The capital of France is Paris")
    again, tok2 = llm.load_smollm2()
    assert again is model and tok2 is tok


# ---- the cache owns its folder, cleans up after itself, reads without the lock, checks its variable --------------


class _Conversion:
    """A stand-in for the GGUF reader (transformers' ``from_pretrained(..., gguf_file=...)``): a 1-layer Llama and
    a word-level tokenizer, so ``load_smollm2`` runs its real cache code (save, manifest, replace, load) in about
    a second. ``fail`` makes the tokenizer's ``save_pretrained`` write part of a file and then raise it."""

    def __init__(self) -> None:
        self.fail: BaseException | None = None
        self.calls = 0

    def tokenizer(self):
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate("the capital is paris".split())}}
        raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        raw.pre_tokenizer = pre_tokenizers.Whitespace()
        tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
        if self.fail is not None:  # saved after the model: the weights are on disk when the failure comes
            error = self.fail

            def save_part_then_fail(path, *a, **kw):
                (Path(path) / "tokenizer.json").write_bytes(b"{" * 100_000)  # the disk filled up here
                raise error

            tok.save_pretrained = save_part_then_fail
        return tok

    def model(self):
        from transformers import LlamaConfig, LlamaForCausalLM

        self.calls += 1
        config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=4)  # fmt: skip
        return LlamaForCausalLM(config)


@pytest.fixture
def conversion(monkeypatch, tmp_path):
    """``load_smollm2`` with a tiny fake conversion: the package's GGUF is a 4-byte file in ``tmp_path/pkg``."""
    import transformers

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / llm.GGUF_NAME).write_bytes(b"gguf")
    monkeypatch.setattr(llm, "smollm2_files", lambda: (pkg, llm.GGUF_NAME))
    monkeypatch.setattr(llm, "_loaded", {})
    fake = _Conversion()
    real_tok = transformers.AutoTokenizer.from_pretrained
    real_model = transformers.AutoModelForCausalLM.from_pretrained

    def tok(path, *a, gguf_file=None, **kw):
        return fake.tokenizer() if gguf_file else real_tok(path, *a, **kw)

    def model(path, *a, gguf_file=None, **kw):
        return fake.model() if gguf_file else real_model(path, *a, **kw)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tok)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
    return fake


def _listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_a_folder_holding_other_files_keeps_them_the_model_goes_into_its_own_subfolder(
    conversion, tmp_path, monkeypatch
):
    """COURSE_LLM_CACHE=~/models: the learner's files there are never deleted (they were: 'no manifest: rebuilding')."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "thesis.txt").write_text("four years of work")
    (models / "other-model.bin").write_bytes(b"\x01" * 1000)
    before = _listing(models)
    monkeypatch.setenv(llm.CACHE_VAR, str(models))
    model, tok = llm.load_smollm2()
    assert model.config.num_hidden_layers == 1 and conversion.calls == 1
    assert {k: v for k, v in _listing(models).items() if k in before} == before, "files of the learner were lost"
    assert llm.cache_dir() == models / llm.MODEL_FOLDER and (models / llm.MODEL_FOLDER / llm.MANIFEST).is_file()
    monkeypatch.setattr(llm, "_loaded", {})
    llm.load_smollm2()  # the second load uses the cache
    assert conversion.calls == 1


@pytest.mark.parametrize("damaged", ["no manifest", "damaged manifest"])
def test_a_folder_that_is_not_the_caches_own_is_refused_naming_it_and_the_variable(conversion, tmp_path, monkeypatch,
                                                                                   damaged):  # fmt: skip
    """The model's own subfolder already holds someone else's files: refused, nothing deleted, the fix named."""
    parent = tmp_path / "models"
    folder = parent / llm.MODEL_FOLDER
    folder.mkdir(parents=True)
    (folder / "my-notes.txt").write_text("mine")
    if damaged == "damaged manifest":  # a cache of ours, damaged, with a file of the learner's put into it
        (folder / "config.json").write_text("{}")
        (folder / llm.MANIFEST).write_text("{not json")
    before = _listing(folder)
    monkeypatch.setenv(llm.CACHE_VAR, str(parent))
    with pytest.raises(SettingError) as info:
        llm.load_smollm2()
    message = str(info.value)
    assert str(folder) in message and llm.CACHE_VAR in message and "my-notes.txt" in message, message
    assert _listing(folder) == before and conversion.calls == 0


def test_a_damaged_cache_of_its_own_is_rebuilt_in_place(conversion, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(llm.CACHE_VAR, str(tmp_path / "models"))
    llm.load_smollm2()
    folder = llm.cache_dir()
    (folder / "model.safetensors").write_bytes(b"corrupt")
    monkeypatch.setattr(llm, "_loaded", {})
    llm.load_smollm2()
    assert conversion.calls == 2 and llm._cache_problem(folder, tmp_path / "pkg" / llm.GGUF_NAME) is None
    assert "does not match its sha256): rebuilding it" in capsys.readouterr().out


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_conversion_leaves_no_temporary_folder(conversion, tmp_path, monkeypatch, failure):
    """The disk fills up (or the learner interrupts) while the converted model is written: no .tmp<pid> is left."""
    parent = tmp_path / "models"
    monkeypatch.setenv(llm.CACHE_VAR, str(parent))
    conversion.fail = failure
    with pytest.raises((CourseError, KeyboardInterrupt)) as info:
        llm.load_smollm2()
    assert sorted(p.name for p in parent.iterdir() if not p.name.endswith(".lock")) == [], list(parent.iterdir())
    if isinstance(failure, OSError):  # one line naming the folder, the cause and the variable
        assert (
            "No space left" in str(info.value) and str(parent) in str(info.value) and llm.CACHE_VAR in str(info.value)
        )
    conversion.fail = None
    llm.load_smollm2()
    assert (llm.cache_dir() / llm.MANIFEST).is_file()


def test_stale_temporary_folders_are_removed_under_the_lock(conversion, tmp_path, monkeypatch):
    """Leftovers of killed conversions (each retry had a new pid) are removed by the next conversion."""
    parent = tmp_path / "models"
    for pid in (4_000_001, 4_000_002):
        (parent / f"{llm.MODEL_FOLDER}.tmp{pid}").mkdir(parents=True)
        (parent / f"{llm.MODEL_FOLDER}.tmp{pid}" / "model.safetensors").write_bytes(b"\0" * 100_000)
    (parent / "smollm2-135m.tmp-mine").mkdir()  # not a name the cache writes: kept
    monkeypatch.setenv(llm.CACHE_VAR, str(parent))
    llm.load_smollm2()
    left = sorted(p.name for p in parent.iterdir() if p.is_dir())
    assert left == [llm.MODEL_FOLDER, "smollm2-135m.tmp-mine"], left


def test_a_complete_cache_is_read_without_taking_the_lock(conversion, tmp_path, monkeypatch):
    """An instructor's shared, read-only cache: loading must not open the lock file for writing."""
    parent = tmp_path / "shared"
    monkeypatch.setenv(llm.CACHE_VAR, str(parent))
    llm.load_smollm2()
    locks = [parent / f"{llm.MODEL_FOLDER}.lock", *tmp_path.rglob("*.lock")]
    for lock in locks:  # a lock that cannot be opened (even by root, who writes through read-only permissions)
        if lock.is_file():
            lock.unlink()
        lock.mkdir(exist_ok=True)
    monkeypatch.setattr(llm, "_loaded", {})
    model, _ = llm.load_smollm2()
    assert model.config.num_hidden_layers == 1 and conversion.calls == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permissions")
def test_a_read_only_complete_cache_loads(conversion, tmp_path, monkeypatch):
    parent = tmp_path / "shared"
    monkeypatch.setenv(llm.CACHE_VAR, str(parent))
    llm.load_smollm2()
    for p in (llm.cache_dir(), parent):
        p.chmod(0o555)
    try:
        monkeypatch.setattr(llm, "_loaded", {})
        llm.load_smollm2()
    finally:
        for p in (parent, llm.cache_dir()):
            p.chmod(0o755)


@pytest.mark.parametrize(
    "value, words",
    [
        ("$COURSE_NO_SUCH_VAR/llm", "$COURSE_NO_SUCH_VAR, which is not set"),
        ("'{tmp}/llm'", "quote"),
        ('"{tmp}/llm"', "quote"),
        ("models/llm", "relative path"),
        ("file://{tmp}/llm", "URL"),
        ("~nosuchuser12345/llm", "names no user"),
    ],
)
def test_cache_variable_is_checked_like_the_results_folder(monkeypatch, tmp_path, value, words):
    """Values that would become a folder inside the notebook's folder (540 MB in the workspace) are refused."""
    monkeypatch.setenv(llm.CACHE_VAR, value.format(tmp=tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingError, match=llm.CACHE_VAR) as info:
        llm.cache_dir()
    assert words in str(info.value) and "restart the kernel" in str(info.value)
    assert not any(tmp_path.iterdir()), "a folder was created"


def test_an_unwritable_cache_folder_names_the_folder_and_the_variable(conversion, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(llm.CACHE_VAR, str(blocker / "llm"))
    with pytest.raises(SettingError) as info:
        llm.load_smollm2()
    message = str(info.value)
    assert llm.CACHE_VAR in message and str(blocker / "llm") in message and f"export {llm.CACHE_VAR}=" in message
    assert conversion.calls == 0, "the folder is checked before the minutes-long conversion"


def test_a_refusal_names_three_foreign_files_and_counts_only_the_others(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    folder.mkdir()
    for name in "abcde":
        (folder / f"{name}.txt").write_text(name)
    monkeypatch.delenv(llm.CACHE_VAR, raising=False)
    with pytest.raises(SettingError, match=r"\(a\.txt, b\.txt, c\.txt and 2 more\)"):
        llm._refuse_foreign(folder)
    (folder / "d.txt").unlink()
    (folder / "e.txt").unlink()
    with pytest.raises(SettingError, match=r"\(a\.txt, b\.txt, c\.txt\), so it is not"):
        llm._refuse_foreign(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt", "b.txt", "c.txt"], "nothing is deleted"
