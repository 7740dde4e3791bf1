"""Graph compilation plumbing lesson 06 calls: the break-even count and guarded reads of torch's private APIs.

Lesson 06 writes the compiler calls in its own cells (``torch.compile`` with freezing and with the caches
off, ``torch._dynamo.explain``, ``torch.export`` and AOTInductor, a CUDA graph captured by hand, a counting
backend). What stays here: :func:`break_even_calls` (after how many calls a compile has paid for itself), and
guarded reads of the private torch APIs lesson 06 shows
(:func:`inductor_cache_dir`, :func:`recompile_limit_key`, :func:`guard_failure_reasons`): their names move between
torch versions (the course runs on torch 2.14 and on the lent GPU machine's torch 2.11), so each returns a fallback
and a note saying why, which the lesson prints, instead of stopping the lesson before its GPU sections.
"""

from __future__ import annotations

import getpass
import math
import os
import re
import tempfile
from typing import Any

import torch


def break_even_calls(first_call_s: float, eager_ms: float, compiled_ms: float) -> float:
    """Calls after which compiling has paid for itself: extra first-call time / time saved per call.

    ``first_call_s`` is the compiled variant's first call (compile + one run). Returns ``math.inf`` when
    the compiled variant is not faster per call (it never pays back) and 0 when compiling cost nothing.
    """
    saved_ms = eager_ms - compiled_ms
    extra_ms = first_call_s * 1000.0 - compiled_ms
    if extra_ms <= 0:
        return 0.0
    if saved_ms <= 0:
        return math.inf
    return math.ceil(extra_ms / saved_ms)


def _missing(name: str, exc: BaseException | None, fallback: str) -> str:
    why = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
    return f"{name} is a private torch API, not found in torch {torch.__version__}{why}; {fallback}"


def inductor_cache_dir() -> tuple[str, str]:
    """``(folder, note)``: Inductor's on-disk cache folder, from ``torch._inductor.runtime.cache_dir_utils.cache_dir``
    (which creates it); where that is missing, the same rule written out (``$TORCHINDUCTOR_CACHE_DIR``, else
    ``<temp dir>/torchinductor_<user>``) and a note saying so (empty when the API answered)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError as exc:
        folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
            tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
        )
        fallback = "the folder shown is the documented default ($TORCHINDUCTOR_CACHE_DIR, else the temp dir)"
        return folder, _missing("torch._inductor.runtime.cache_dir_utils.cache_dir", exc, fallback)
    return cache_dir(), ""


# Dynamo's limit on graphs per function: recompile_limit in current torch, cache_size_limit in older releases.
RECOMPILE_LIMIT_KEYS = ("recompile_limit", "cache_size_limit")


def recompile_limit_key() -> tuple[str | None, str]:
    """``(name, note)``: the ``torch._dynamo.config`` setting that caps recompiles of one function
    (``recompile_limit``, or ``cache_size_limit`` in older torch), or ``(None, why)`` when neither exists, so
    the lesson skips that demonstration and says why."""
    import torch._dynamo

    config = torch._dynamo.config
    for name in RECOMPILE_LIMIT_KEYS:
        if hasattr(config, name):
            note = (
                ""
                if name == RECOMPILE_LIMIT_KEYS[0]
                else _missing("torch._dynamo.config.recompile_limit", None, f"this torch calls it {name}, used instead")
            )
            return name, note
    return None, _missing(
        "torch._dynamo.config.recompile_limit",
        None,
        "nor cache_size_limit: the recompile-limit demonstration is skipped",
    )


def guard_failure_reasons() -> tuple[list[tuple[str, str]] | None, str]:
    """``(rows, note)``: ``(function name, reason)`` for each guard failure Dynamo recorded
    (``torch._dynamo.utils.guard_failures``, private), or ``(None, why)`` where this torch does not keep them
    there (``TORCH_LOGS="recompiles"`` prints them live in any version)."""
    import torch._dynamo.utils as dynamo_utils

    failures: Any = getattr(dynamo_utils, "guard_failures", None)
    if not hasattr(failures, "items"):
        return None, _missing(
            "torch._dynamo.utils.guard_failures", None, 'run with TORCH_LOGS="recompiles" to see the reasons live'
        )
    rows = []
    for code, reasons in failures.items():
        for reason in reasons:
            rows.append((getattr(code, "co_name", str(code)), str(reason).split("  #")[0]))
    return rows, ""
