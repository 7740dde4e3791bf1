"""Lesson 09 exercise: configure a DataLoader that reaches a target images/s on this machine.

The data set of the check reads each photo from slow storage (a fixed wait per file, as a network file system
or object store would cost); the check measures the plain ``DataLoader(ds, batch_size=8)``
here, sets the target at :data:`SPEED_UP` times its rate, and runs the learner's loader for :data:`EPOCHS`
passes, as a serving job or a training loop would. It rejects a loader that changes the batches (order, size,
values), and one below the target.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.data import DataLoader, Dataset

from ..exercises import exercise

SPEED_UP = 2.5
EPOCHS = 3
BATCH = 8


class SlowStorageDataset(Dataset):
    """The shipped photos (decoded and resized once, uint8), each served after ``wait_s`` of storage latency.

    The wait stands for reading from a network file system or an object store: it needs no core, so it is the
    same on a busy machine as on an idle one.
    """

    def __init__(self, n: int = 48, size: int = 32, wait_s: float = 0.04) -> None:
        from ..pipeline import JpegDataset

        photos = JpegDataset(1, size=size, normalize=False)
        self.images = [JpegDataset(1, size=size, paths=[p], normalize=False)[0][0] for p in photos.paths]
        self.n, self.wait_s = n, wait_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} samples")
        time.sleep(self.wait_s)  # the storage: waiting, not computing
        return self.images[i % len(self.images)].clone(), i % len(self.images)


def _images_per_s(loader: DataLoader, epochs: int) -> float:
    n, t0 = 0, time.perf_counter()
    for _ in range(epochs):
        for x, _ in loader:
            n += x.shape[0]
    return n / (time.perf_counter() - t0)


def _check_loader(fn: Callable[[Dataset], DataLoader], target_ips: float | None = None) -> None:
    ds = SlowStorageDataset()
    loader = fn(ds)
    assert isinstance(loader, DataLoader), f"return a torch.utils.data.DataLoader, got {type(loader).__name__}"
    assert loader.dataset is ds, "build the DataLoader on the dataset you were given"
    want = [x for x, _ in DataLoader(SlowStorageDataset(n=len(ds), wait_s=0.0), batch_size=BATCH)]
    got = [x for x, _ in loader]
    assert len(got) == len(want) and all(a.shape == b.shape for a, b in zip(got, want, strict=False)), (
        f"expected {len(want)} batches of {BATCH} images in order; got {len(got)} batches of shapes "
        f"{sorted({tuple(a.shape) for a in got})}: keep batch_size={BATCH} and shuffle off"
    )
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), (
        "the batches differ from the data set's samples in order: keep shuffle=False (and no sampler)"
    )
    if target_ips is None:
        base = _images_per_s(DataLoader(ds, batch_size=BATCH), 1)
        target_ips = SPEED_UP * base
        base_txt = f" ({SPEED_UP:g}x the {base:.0f} img/s of DataLoader(ds, batch_size={BATCH}) here)"
    else:
        base_txt = ""
    ips = _images_per_s(loader, EPOCHS)
    assert ips >= target_ips, (
        f"{ips:.0f} img/s over {EPOCHS} passes, target {target_ips:.0f}{base_txt}. Each sample waits on storage, "
        "which needs no core: more workers than cores can wait at once; and workers that survive between passes "
        "do not start again"
    )
    print(f"   your loader: {ips:.0f} img/s over {EPOCHS} passes (target {target_ips:.0f} img/s{base_txt})")


@exercise(
    "09.loader",
    f"Return DataLoader(dataset, batch_size={BATCH}, ...) with enough workers to wait on storage in parallel "
    "(more than cores is fine here) and persistent_workers=True, shuffle off.",
    _check_loader,
)
def make_fast_loader(dataset: Dataset) -> DataLoader:
    return DataLoader(dataset, batch_size=BATCH, num_workers=8, persistent_workers=True, prefetch_factor=2)
