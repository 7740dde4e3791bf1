"""Lesson 09's loader exercise: the checker accepts a configured loader and rejects wrong, cached or slow ones.

The checker's data set changes every pass and logs each read with its process, so a loader that caches batches
(filled during the first pass), reads in the main process, or reads a copy of the data is caught by what it read,
not by its speed. The speed rejections use loaders that cannot reach the target whatever the machine: every sample
waits on simulated storage, so a loader that waits for one sample at a time (or restarts its workers every pass)
stays near the baseline. The speed acceptance of the reference runs in tests/test_exercises.py.

Over many seeds the storage does not wait (``wait_s=0``, with a fixed target): loaders without workers run on 200
seeds, loaders that start worker processes on 20 (each start costs a tenth of a second).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from course_checks import exercises

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


WRONG_LOADERS = {  # id: (make the loader, the reason), the ones that start no worker process first
    "not-a-loader": (lambda ds: [b for b in DataLoader(ds, batch_size=8)], "return a torch.utils.data.DataLoader"),
    "shuffled": (lambda ds: DataLoader(ds, batch_size=8, shuffle=True), "shuffle"),
    "cache-no-workers": (lambda ds: CachingLoader(ds, batch_size=8), "kept from an earlier pass"),
    "no-workers": (lambda ds: DataLoader(ds, batch_size=8, num_workers=0), "main process"),
    "copied": (read_in_advance, "dataset you were given (not on a copy"),
    "subset": (  # a view, not a copy: named as what it is
        lambda ds: DataLoader(torch.utils.data.Subset(ds, range(len(ds))), batch_size=8),
        "reads a torch.utils.data.Subset of the dataset you were given (",
    ),
    # the sample count is never a multiple of 8 in any call: the short last batch is always there to lose
    "drop-last": (lambda ds: DataLoader(ds, batch_size=8, drop_last=True), "drop_last=True drops it"),
    "batch-4": (lambda ds: DataLoader(ds, batch_size=4, num_workers=2), "batches of 8"),
    "cache-with-workers": (
        lambda ds: CachingWorkersLoader(ds, batch_size=8, num_workers=4),
        "kept from an earlier pass",
    ),
}
IN_PROCESS = ["not-a-loader", "shuffled", "cache-no-workers", "no-workers", "copied", "subset", "drop-last"]
WITH_WORKERS = ["batch-4", "cache-with-workers"]


@pytest.mark.parametrize(("make", "message"), list(WRONG_LOADERS.values()), ids=list(WRONG_LOADERS))
def test_wrong_loaders_are_rejected(make, message):
    assert message in verdict(make, target_ips=1.0)


def test_a_loader_below_the_target_is_rejected():
    # two workers restarted every pass: correct batches, read in workers, but far below an impossible target
    assert "target" in verdict(lambda ds: DataLoader(ds, batch_size=8, num_workers=2), target_ips=1e9)


def test_the_reference_meets_an_easy_target_and_the_seed_is_printed_on_failure():
    assert verdict(exercises.get(KEY).solution, target_ips=1.0) == "accepted"
    assert "random case seed" in verdict(lambda ds: DataLoader(ds, batch_size=8), target_ips=1.0)


@pytest.mark.parametrize("name", IN_PROCESS)
def test_wrong_loaders_without_workers_over_200_seeds(name):
    """Seeds 0-199 with storage that does not wait (``wait_s=0``): these loaders read in the main process (or not
    at all), and the check judges their batches and the read log, never the time the reads took."""
    make, message = WRONG_LOADERS[name]
    for seed in range(200):
        reason = verdict(make, target_ips=1.0, wait_s=0.0, seed=seed)
        assert message in reason and "random case seed" in reason, (seed, reason)


SEEDS_WITH_WORKERS = range(20)


@pytest.mark.parametrize("name", WITH_WORKERS)
def test_wrong_loaders_with_workers_over_some_seeds(name):
    """Only seeds 0-19, not 200: these loaders start real worker processes (a tenth of a second each here), whose
    process ids in the read log are what the check judges, so there is no cheaper path to their rejection. The
    storage does not wait (``wait_s=0``): the judgment reads the batches and the log, not the time."""
    make, message = WRONG_LOADERS[name]
    for seed in SEEDS_WITH_WORKERS:
        reason = verdict(make, target_ips=1.0, wait_s=0.0, seed=seed)
        assert message in reason, (seed, reason)


def test_the_reference_and_a_slow_loader_over_some_seeds():
    """The reference accepted, two workers restarted every pass rejected at an impossible target, on the seeds
    above (real worker processes: see there); storage that does not wait."""
    for seed in SEEDS_WITH_WORKERS:
        assert verdict(exercises.get(KEY).solution, target_ips=1.0, wait_s=0.0, seed=seed) == "accepted", seed
        slow = verdict(lambda ds: DataLoader(ds, batch_size=8, num_workers=2), target_ips=1e9, wait_s=0.0, seed=seed)
        assert "target" in slow, (seed, slow)


def test_a_storage_that_does_not_wait_needs_a_fixed_target():
    with pytest.raises(ValueError, match="fixed target_ips"):
        verdict(exercises.get(KEY).solution, wait_s=0.0)


def peek_then_load(ds):
    """Reads one sample in the main process to look at its shape before building the loader: an honest look, not
    loading; the passes still read in workers, so the loader is accepted."""
    x, _ = ds[0]
    assert x.shape[0] == 3
    return DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)


def batch_sampler_loader(ds):
    """The same loader written with an explicit BatchSampler (batch_size=None): accepted."""
    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(ds), 8, drop_last=False)
    return DataLoader(ds, batch_sampler=sampler, num_workers=2, persistent_workers=True)


def scaled_to_float(ds):
    """Converts the images to float in [0, 1] in the loader's collate_fn: not the data set's tensors."""

    def collate(batch):
        return torch.stack([x for x, _ in batch]).float() / 255, torch.tensor([i for _, i in batch])

    return DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True, collate_fn=collate)


@pytest.mark.parametrize("make", [peek_then_load, batch_sampler_loader], ids=["peek", "batch-sampler"])
def test_right_loaders_written_otherwise_are_accepted(make):
    for seed in range(5):  # real worker processes: see SEEDS_WITH_WORKERS
        assert verdict(make, target_ips=1.0, wait_s=0.0, seed=seed) == "accepted", seed


def test_a_loader_that_converts_the_dtype_is_told_so():
    for seed in range(5):
        reason = verdict(scaled_to_float, target_ips=1.0, wait_s=0.0, seed=seed)
        assert "torch.float32, not the data set's torch.uint8" in reason, (seed, reason)
