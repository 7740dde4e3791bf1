"""Lesson 09's loader exercise: the checker accepts a configured loader and rejects wrong, cached or slow ones.

The checker's data set changes every pass and logs each read with its process, so a loader that caches batches
(filled during the first pass), reads in the main process, or reads a copy of the data is caught by what it read,
not by its speed. The speed rejections use loaders that cannot reach the target whatever the machine: every sample
waits on simulated storage, so a loader that waits for one sample at a time (or restarts its workers every pass)
stays near the baseline. The speed acceptance of the reference runs in tests/test_exercises.py.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from course_utils.check import exercises

KEY = "09.loader"


def verdict(fn, **kw) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "more workers than suggested"
        return exercises.verdict(KEY, fn, **kw)


class CachingLoader(DataLoader):
    """No workers; keeps the batches of its first pass and serves them again (fast after the first pass)."""

    def __iter__(self):
        if not hasattr(self, "_kept"):
            self._kept = list(super().__iter__())
        return iter(self._kept)


class CachingWorkersLoader(DataLoader):
    """The same trick with workers: the first pass reads in worker processes, later passes serve the copy."""

    def __iter__(self):
        if not hasattr(self, "_kept"):
            self._kept = list(super().__iter__())
        return iter(self._kept)


def read_in_advance(ds):
    """Reads every sample once, then loads from memory: a copy of the data, not the data set."""
    xs, ys = zip(*(ds[i] for i in range(len(ds))), strict=True)
    return DataLoader(TensorDataset(torch.stack(xs), torch.tensor(ys)), batch_size=8, num_workers=2)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda ds: [b for b in DataLoader(ds, batch_size=8)], "return a torch.utils.data.DataLoader"),
        (lambda ds: DataLoader(ds, batch_size=4, num_workers=2), "batches of 8"),
        (lambda ds: DataLoader(ds, batch_size=8, shuffle=True), "shuffle"),
        (lambda ds: CachingLoader(ds, batch_size=8), "kept from an earlier pass"),
        (lambda ds: CachingWorkersLoader(ds, batch_size=8, num_workers=4), "kept from an earlier pass"),
        (lambda ds: DataLoader(ds, batch_size=8, num_workers=0), "main process"),
        (read_in_advance, "dataset you were given"),
    ],
    ids=["not-a-loader", "batch-4", "shuffled", "cache-no-workers", "cache-with-workers", "no-workers", "copied"],
)
def test_wrong_loaders_are_rejected(make, message):
    assert message in verdict(make, target_ips=1.0)


def test_a_loader_below_the_target_is_rejected():
    # two workers restarted every pass: correct batches, read in workers, but far below an impossible target
    assert "target" in verdict(lambda ds: DataLoader(ds, batch_size=8, num_workers=2), target_ips=1e9)


def test_the_reference_meets_an_easy_target_and_the_seed_is_printed_on_failure():
    assert verdict(exercises.get(KEY).solution, target_ips=1.0) == "accepted"
    assert "random case seed" in verdict(lambda ds: DataLoader(ds, batch_size=8), target_ips=1.0)
