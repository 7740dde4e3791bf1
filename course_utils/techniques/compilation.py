"""Graph compilation helpers that lesson 06 writes out first and later lessons and exercises reuse.

Lesson 06 writes the compiler calls in its own cells (``torch.compile`` with freezing and with the caches
off, ``torch._dynamo.explain``, ``torch.export`` and AOTInductor, a CUDA graph captured by hand, a counting
backend). What stays here: :func:`break_even_calls` (after how many calls a compile has paid for itself,
used by lessons 06 and 14).
"""

from __future__ import annotations

import math


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
