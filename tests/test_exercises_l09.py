"""Lesson 09's loader exercise: the checker accepts a configured loader and rejects wrong or slow ones.

The speed rejections use loaders that cannot reach the target whatever the machine: every sample waits on
simulated storage, so a loader that waits for one sample at a time (or restarts its workers every pass) stays
near the baseline. The speed acceptance of the reference runs in tests/test_exercises.py.
"""

from __future__ import annotations

import warnings

import pytest
from torch.utils.data import DataLoader

from course_utils import exercises

KEY = "09.loader"


def verdict(fn, **kw) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "more workers than suggested"
        return exercises.verdict(KEY, fn, **kw)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda ds: [b for b in DataLoader(ds, batch_size=8)], "return a torch.utils.data.DataLoader"),
        (lambda ds: DataLoader(ds, batch_size=4, num_workers=2), "batches of 8"),
        (lambda ds: DataLoader(ds, batch_size=8, shuffle=True), "shuffle"),
    ],
)
def test_wrong_loaders_are_rejected(make, message):
    assert message in verdict(make, target_ips=1.0)


def test_a_loader_below_the_target_is_rejected():
    assert "target" in verdict(lambda ds: DataLoader(ds, batch_size=8), target_ips=1e9)
    assert "target" in verdict(lambda ds: DataLoader(ds, batch_size=8))  # the baseline itself: 1x < 2.5x


def test_the_reference_meets_an_easy_target():
    assert verdict(exercises.get(KEY).solution, target_ips=1.0) == "accepted"
