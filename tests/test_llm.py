"""course_utils.supply.llm: the SmolLM2 file found, converted once into a checksummed cache; a stand-in of its shape."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from course_utils.supply import llm
from course_utils.supply.errors import MissingFileError


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


def test_missing_package_names_the_fix(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == llm.PACKAGE else real(name, *a))
    with pytest.raises(MissingFileError, match="make setup"):
        llm.smollm2_files()
    assert llm.has_smollm2() is False


def test_cache_dir_follows_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(llm.CACHE_VAR, str(tmp_path / "x"))
    assert llm.cache_dir() == tmp_path / "x"
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
