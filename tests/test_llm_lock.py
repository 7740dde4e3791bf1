"""The LLM cache's conversion lock (course_utils.supply.llm): one converter at a time, the others wait for it and
then find the model converted.

The conversion itself is replaced by a stand-in that takes a moment and writes a valid cache (one file and its
sha256 manifest), so these tests run in about a second; the cache's other rules are tested in ``test_llm.py``.
"""

from __future__ import annotations

import fcntl
import json
import threading
import time

import pytest

from course_utils.supply import llm


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """(folder, gguf dir, conversions): ``llm._convert`` replaced by a 0.3 s stand-in that records each call."""
    gguf_dir = tmp_path / "pkg"
    gguf_dir.mkdir()
    (gguf_dir / llm.GGUF_NAME).write_bytes(b"gguf")
    folder = tmp_path / "cache" / llm.MODEL_FOLDER
    folder.parent.mkdir()
    conversions: list[int] = []

    def convert(folder, gguf_dir, name):
        conversions.append(threading.get_ident())
        time.sleep(0.3)  # a conversion takes a while: a second converter without the lock would start meanwhile
        folder.mkdir(exist_ok=True)
        (folder / "weights.bin").write_bytes(b"weights")
        manifest = {"format": llm._FORMAT, "source": name, "source_size": (gguf_dir / name).stat().st_size,
                    "files": {"weights.bin": llm._sha256(folder / "weights.bin")}}  # fmt: skip
        (folder / llm.MANIFEST).write_text(json.dumps(manifest))

    monkeypatch.setattr(llm, "_convert", convert)
    return folder, gguf_dir, conversions


def _ensure(folder, gguf_dir, errors):
    try:
        llm._ensure_converted(folder, gguf_dir, llm.GGUF_NAME)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


def test_a_conversion_waits_for_the_lock_held_by_another(cache):
    """While another converter holds ``<folder>.lock`` (an exclusive flock on its own open file, as another
    process's would be), nothing is converted; released, the waiting call converts once."""
    folder, gguf_dir, conversions = cache
    errors: list[BaseException] = []
    with open(folder.parent / f"{folder.name}.lock", "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        waiting = threading.Thread(target=_ensure, args=(folder, gguf_dir, errors), daemon=True)
        waiting.start()
        time.sleep(0.5)
        assert conversions == [] and waiting.is_alive(), "the conversion did not wait for the lock"
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
    waiting.join(10)
    assert not waiting.is_alive() and errors == [] and len(conversions) == 1
    assert llm._cache_problem(folder, gguf_dir / llm.GGUF_NAME) is None


def test_two_converters_at_once_convert_once(cache):
    """Two calls started together on an empty cache (two notebooks, two test workers): one converts, the other
    waits on the lock and then finds the converted model, as the read-back check says."""
    folder, gguf_dir, conversions = cache
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_ensure, args=(folder, gguf_dir, errors), daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert len(conversions) == 1, f"{len(conversions)} conversions ran at once: the lock was not taken"
    assert llm._cache_problem(folder, gguf_dir / llm.GGUF_NAME) is None
