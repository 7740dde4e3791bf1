"""Unit tests for course_utils.techniques.compilation: break-even arithmetic and the compile counter."""

from __future__ import annotations

import math

import torch
from torch import nn

from course_utils.techniques import compilation as C


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()


def test_break_even():
    assert C.break_even_calls(1.0, eager_ms=2.0, compiled_ms=1.0) == 999
    assert C.break_even_calls(1.0, eager_ms=1.0, compiled_ms=2.0) == math.inf
    assert C.break_even_calls(0.0005, eager_ms=1.0, compiled_ms=0.5) == 0.0
    # 1000 - 0.7 = 999.3 ms extra, 1.3 ms saved per call: 768.7 calls, so the 769th call pays it back
    assert C.break_even_calls(1.0, eager_ms=2.0, compiled_ms=0.7) == 769


def test_break_even_when_compiling_costs_nothing_and_saves_nothing():
    # first call 2 ms = the compiled run itself: no extra time, so it has paid for itself at once
    assert C.break_even_calls(0.002, eager_ms=2.0, compiled_ms=2.0) == 0.0
    assert C.break_even_calls(0.002, eager_ms=1.0, compiled_ms=2.0) == 0.0
    assert C.break_even_calls(0.0021, eager_ms=2.0, compiled_ms=2.0) == math.inf  # 0.1 ms extra, nothing saved
    # extra = first call - compiled call (not - eager call): 100 - 1 = 99 ms over 2 ms saved per call
    assert C.break_even_calls(0.1, eager_ms=3.0, compiled_ms=1.0) == 50


# The private torch APIs lesson 06 shows, each read through a guard: where this torch lacks it (the lent GPU
# machine has torch 2.11), a fallback and a note naming the API and the torch version, never an exception.
def test_inductor_cache_dir_from_the_api_and_without_it(monkeypatch, tmp_path):
    import sys

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "ind"))
    folder, note = C.inductor_cache_dir()
    assert folder == str(tmp_path / "ind") and note == ""
    monkeypatch.setitem(sys.modules, "torch._inductor.runtime.cache_dir_utils", None)  # import fails
    folder, note = C.inductor_cache_dir()
    assert folder == str(tmp_path / "ind")
    assert note.startswith(f"torch._inductor.runtime.cache_dir_utils.cache_dir is a private torch API, not found in "
                           f"torch {torch.__version__} (ModuleNotFoundError")  # fmt: skip
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    folder, _ = C.inductor_cache_dir()
    import getpass
    import tempfile

    assert folder == f"{tempfile.gettempdir()}/torchinductor_{getpass.getuser()}"


def test_recompile_limit_key_follows_the_torch_version(monkeypatch):
    import types

    import torch._dynamo

    assert C.recompile_limit_key() == ("recompile_limit", "")  # this torch
    monkeypatch.setattr(torch._dynamo, "config", types.SimpleNamespace(cache_size_limit=8))  # older torch
    key, note = C.recompile_limit_key()
    assert key == "cache_size_limit" and "recompile_limit is a private torch API" in note and "used instead" in note
    monkeypatch.setattr(torch._dynamo, "config", types.SimpleNamespace())
    key, note = C.recompile_limit_key()
    assert key is None and "demonstration is skipped" in note


def test_guard_failure_reasons_after_a_recompile_and_without_the_api(monkeypatch):
    import torch._dynamo
    import torch._dynamo.utils
    from torch._dynamo.testing import CompileCounter

    def scaled(x):
        return x * 2

    torch._dynamo.reset()
    try:
        compiled = torch.compile(scaled, backend=CompileCounter(), dynamic=False)
        compiled(torch.ones(2))
        compiled(torch.ones(3))  # a new size fails the shape guard: a recompile with its reason
        rows, note = C.guard_failure_reasons()
    finally:
        torch._dynamo.reset()
    assert note == "" and any(name == "scaled" and "size" in reason for name, reason in rows), rows
    monkeypatch.delattr(torch._dynamo.utils, "guard_failures")
    rows, note = C.guard_failure_reasons()
    assert rows is None and "torch._dynamo.utils.guard_failures is a private torch API" in note
    assert 'TORCH_LOGS="recompiles"' in note


def test_lesson_06_reads_the_private_apis_only_through_the_guards():
    """A direct use would stop the lesson on a torch without the name (before its GPU sections)."""
    import re
    from pathlib import Path

    code = [
        line.split("#")[0] for line in (Path(__file__).parents[1] / "lessons" / "06_graph_compilation.py").read_text()
        .splitlines() if not line.lstrip().startswith("#")
    ]  # fmt: skip
    for name in ("guard_failures", "cache_dir_utils", "recompile_limit", "cache_size_limit"):
        direct = [line for line in code if re.search(rf"torch\.\S*{name}|import.*{name}", line)]
        assert not direct, f"lesson 06 uses {name} directly: {direct}"
    assert sum("cu.compilation." in line for line in code) >= 3
