"""Execute the code a learner reads: the cells of a lesson tagged for a test suite.

A lesson marks a cell in its text copy (``lessons/NN_slug.py``) with a jupytext tag::

    # %% tags=["contract"]
    def build_engine(trt, onnx_path, ...):
        ...

``lesson_namespace("08")`` executes every cell tagged ``contract`` of lesson 08, in order, in a fresh
namespace (optionally pre-filled, e.g. with a fake ``trt`` module, which a cell's own imports do not replace)
and returns it, so a test calls the very
functions the notebook shows. Tagged cells should define functions and classes, not run heavy work.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

LESSONS = Path(__file__).resolve().parents[2] / "lessons"
_CELL = re.compile(r"^# %%(.*)$", re.M)


def lesson_path(lesson: str) -> Path:
    """The text copy of lesson ``lesson`` ("08" -> lessons/08_tensorrt.py)."""
    found = sorted(LESSONS.glob(f"{lesson}_*.py"))
    if len(found) != 1:
        raise FileNotFoundError(f"expected one lessons/{lesson}_*.py, found {found}")
    return found[0]


def tagged_cells(lesson: str, tag: str = "contract") -> list[str]:
    """Sources of the code cells of ``lesson`` that carry ``tag`` (in file order)."""
    text = lesson_path(lesson).read_text()
    heads = list(_CELL.finditer(text))
    cells = []
    for i, head in enumerate(heads):
        header = head.group(1)
        if "[markdown]" in header:
            continue
        tags = re.search(r"tags=\[([^\]]*)\]", header)
        if not tags or f'"{tag}"' not in tags.group(1):
            continue
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        cells.append(text[head.end() : end])
    return cells


def lesson_namespace(lesson: str, tag: str = "contract", **preset: Any) -> dict[str, Any]:
    """Execute ``lesson``'s cells tagged ``tag`` in a namespace pre-filled with ``preset``; return it."""
    cells = tagged_cells(lesson, tag)
    if not cells:
        raise LookupError(f"lesson {lesson} has no code cell tagged '{tag}' (# %% tags=[\"{tag}\"])")
    ns: dict[str, Any] = {"__name__": f"lesson_{lesson}_{tag}", **preset}
    path = str(lesson_path(lesson))
    for src in cells:
        exec(compile(src, path, "exec", dont_inherit=True), ns)  # noqa: S102 - the lesson's own code, by design
        # A cell tagged export carries its own imports (`import torch`): the preset (a stand-in torch) stays.
        ns.update(preset)
    return ns
