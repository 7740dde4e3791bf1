"""The digits test images and the shipped CNN for the checkers of lessons 12-14, read from disk once per process.

``load_digits_split`` parses scikit-learn's CSV and ``load_digits_model`` reads and verifies the weights file:
about 60 ms a call, most of a check's time, for the same data every time. Here they are loaded once; each call
hands out copies (a fresh model, cloned images), so an answer that edits what it was given changes nothing for
the next check.
"""

from __future__ import annotations

import copy
from typing import Any

_LOADED: dict[str, Any] = {}


def held_out_digits() -> tuple[Any, Any]:
    """(x_test, y_test) of the course's digits split, as fresh copies: (N, 1, 8, 8) float32 in [0, 1], int64."""
    if "split" not in _LOADED:
        from course_utils.supply.data import load_digits_split

        _LOADED["split"] = load_digits_split()
    split = _LOADED["split"]
    return split.x_test.clone(), split.y_test.clone()


def digits_cnn() -> Any:
    """A fresh copy of the shipped digits CNN in eval mode (``load_digits_model("cnn")``, verified once)."""
    if "cnn" not in _LOADED:
        from course_utils.supply.models import load_digits_model

        _LOADED["cnn"] = load_digits_model("cnn")
    return copy.deepcopy(_LOADED["cnn"]).eval()


def reference_cnn() -> Any:
    """The loaded CNN itself, for a checker's own reference outputs and weights: never hand it to an answer."""
    if "cnn" not in _LOADED:
        digits_cnn()
    return _LOADED["cnn"]
