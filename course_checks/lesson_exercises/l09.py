"""Lesson 09 exercise: configure a DataLoader that reaches a target images/s on this machine.

The data set of the check stands for slow storage (a fixed wait per sample, as a network file system or object
store would cost; the wait needs no core). Its content is drawn at random per check and **changes every pass**
(an epoch number shared with the worker processes), and every ``__getitem__`` call is logged with the process
that made it (a log file that worker processes append to). So the check sees where the technique runs:

* every pass must read every sample again, in worker processes (a loader that caches the batches of an earlier
  pass serves the previous pass's data, and reads nothing);
* the batches must be the data set's, in order, at ``batch_size=8``;
* the learner's loader, over :data:`EPOCHS` passes, must reach :data:`SPEED_UP` times the rate of the plain
  ``DataLoader(ds, batch_size=8)`` measured here.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from course_checks.exercises import exercise, observed
from course_checks.lesson_exercises.observe import cases

SPEED_UP = 2.5
EPOCHS = 3
BATCH = 8
WAIT_S = 0.04  # the storage's wait per sample


class SlowStorageDataset(Dataset):
    """Random uint8 images (``seed``, the shared ``epoch`` and the index decide them), each after ``wait_s``.

    ``epoch`` is a ``multiprocessing.Value`` inherited by worker processes, so a new pass changes the data
    everywhere; each ``__getitem__`` appends ``pid epoch index`` to ``log_path`` (one small append per line).
    """

    def __init__(self, n: int, seed: int, log_path: str, wait_s: float = WAIT_S, size: int = 16) -> None:
        self.n, self.seed, self.log_path, self.wait_s, self.size = n, seed, log_path, wait_s, size
        self.epoch = multiprocessing.get_context().Value("i", 0)

    def __len__(self) -> int:
        return self.n

    def sample(self, epoch: int, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch * 10_007 + i)
        return torch.randint(0, 256, (3, self.size, self.size), generator=g, dtype=torch.uint8)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for {self.n} samples")
        epoch = int(self.epoch.value)
        with open(self.log_path, "a") as f:
            f.write(f"{os.getpid()} {epoch} {i}\n")
        if self.wait_s:  # (the tests' storage that does not wait skips the call: sleep(0) still yields the core)
            time.sleep(self.wait_s)  # the storage: waiting, not computing
        return self.sample(epoch, i), i


def _reads(log_path: str) -> list[tuple[int, int, int]]:
    text = Path(log_path).read_text() if Path(log_path).exists() else ""
    return [tuple(map(int, line.split())) for line in text.splitlines() if line.strip()]


def _one_pass(loader: DataLoader, ds: SlowStorageDataset, epoch: int, what: str) -> int:
    """Run one pass at ``epoch``; check its batches against the data set's samples; return the images seen."""
    ds.epoch.value = epoch
    want = [torch.stack([ds.sample(epoch, i) for i in range(s, min(s + BATCH, ds.n))]) for s in range(0, ds.n, BATCH)]
    got = []
    for item in loader:
        x = item[0] if isinstance(item, (list, tuple)) else item
        got.append(x)
    shapes = sorted({tuple(getattr(a, "shape", ())) for a in got})
    short = ds.n % BATCH
    dropped = len(got) == len(want) - 1 and all(
        isinstance(a, torch.Tensor) and a.shape == b.shape for a, b in zip(got, want, strict=False)
    )
    assert not dropped, (
        f"{what}: got {len(got)} full batches, not the last, short batch of {short} image(s) ({ds.n} samples): "
        "drop_last=True drops it, and those samples are never seen. Keep drop_last=False"
    )
    assert len(got) == len(want) and all(
        isinstance(a, torch.Tensor) and a.shape == b.shape for a, b in zip(got, want, strict=False)
    ), (
        f"{what}: expected {len(want)} batches of {BATCH} images ({ds.n} samples) in order; got {len(got)} batches of "
        f"shapes {shapes}: keep batch_size={BATCH} and shuffle off"
    )
    dtypes = sorted({str(a.dtype) for a in got} - {str(torch.uint8)})
    assert not dtypes, (
        f"{what}: your batches are {', '.join(dtypes)}, not the data set's {torch.uint8}: the loader must return the "
        "data set's own tensors (convert them for the model after loading, not in the collate_fn)"
    )
    if not all(torch.equal(a, b) for a, b in zip(got, want, strict=True)):
        stale = all(
            torch.equal(a, torch.stack([ds.sample(epoch - 1, i) for i in range(s, s + len(a))]))
            for a, s in zip(got, range(0, ds.n, BATCH), strict=False)
        )
        assert not stale, (
            f"{what}: the batches are the previous pass's: your loader served batches it kept from an earlier pass "
            "instead of reading the data set again. A loader must read every pass (the data can change): no caching"
        )
        raise AssertionError(
            f"{what}: the batches differ from the data set's samples in order: keep shuffle=False (and no sampler), "
            "and return the data set's own tensors"
        )
    return sum(a.shape[0] for a in got)


def _check_loader(fn: Callable[[Dataset], DataLoader], target_ips: float | None = None, wait_s: float = WAIT_S) -> None:
    """The check; the tests give ``target_ips`` (the speed judged against a fixed rate, not the baseline measured
    here) and, with it, ``wait_s=0`` (storage that does not wait: every other judgment reads only the batches and
    the read log, not the time they took)."""
    if wait_s != WAIT_S and target_ips is None:  # the baseline waits WAIT_S: a faster storage would beat it
        raise ValueError("a storage wait other than WAIT_S needs a fixed target_ips")
    with cases("09.loader") as c, tempfile.TemporaryDirectory() as tmp:
        # never a multiple of BATCH: the last batch is short in every call (drop_last=True would lose it)
        n = BATCH * c.randint(5, 7) + c.randint(1, BATCH - 1)
        log = str(Path(tmp) / "reads.log")
        ds = SlowStorageDataset(n, seed=c.randint(1, 10**6), log_path=log, wait_s=wait_s)
        loader = fn(ds)
        assert isinstance(loader, DataLoader), f"return a torch.utils.data.DataLoader, got {type(loader).__name__}"
        view = loader.dataset
        if isinstance(view, torch.utils.data.Subset) and view.dataset is ds:
            raise AssertionError(
                f"your DataLoader reads a torch.utils.data.Subset of the dataset you were given ({len(view)} of its "
                f"{len(ds)} samples): a view of it, not a copy, but the exercise loads the data set itself: "
                "DataLoader(ds, ...), with no Subset or sampler between"
            )
        assert loader.dataset is ds, (
            "build the DataLoader on the dataset you were given (not on a copy or on samples read in advance: "
            "the data changes between passes)"
        )
        if target_ips is None:
            base_ds = SlowStorageDataset(n, seed=0, log_path=str(Path(tmp) / "base.log"))
            t0 = time.perf_counter()
            for _ in DataLoader(base_ds, batch_size=BATCH):
                pass
            base = n / (time.perf_counter() - t0)
            target_ips = SPEED_UP * base
            base_txt = f" ({SPEED_UP:g}x the {base:.0f} img/s of DataLoader(ds, batch_size={BATCH}) here)"
        else:
            base_txt = ""
        images, t0 = 0, time.perf_counter()
        for epoch in range(1, EPOCHS + 1):
            images += _one_pass(loader, ds, epoch, f"pass {epoch}")
        ips = images / (time.perf_counter() - t0)
        reads = _reads(log)
        main = os.getpid()
        per_pass = Counter(e for _, e, _ in reads)
        for epoch in range(1, EPOCHS + 1):
            assert per_pass[epoch] >= n, (
                f"pass {epoch} read {per_pass[epoch]} of the {n} samples from the data set: your loader served batches "
                "it kept from an earlier pass. A loader must call the data set every pass: no caching"
            )
        # only the passes' reads: a look at a sample before building the loader (epoch 0) is not loading
        in_passes = [(pid, e) for pid, e, _ in reads if 1 <= e <= EPOCHS]
        in_main = sum(1 for pid, _ in in_passes if pid == main)
        assert in_main == 0, (
            f"{in_main} of {len(in_passes)} samples were read in the main process during the passes: with "
            "num_workers=0 the loader waits "
            "for one sample at a time. Give it worker processes (num_workers > 0): they wait on storage in parallel"
        )
        workers = Counter(pid for pid, _ in in_passes)
        assert ips >= target_ips, (
            f"{ips:.0f} img/s over {EPOCHS} passes with {len(workers)} worker process(es), target {target_ips:.0f}"
            f"{base_txt}. Each sample waits on storage, which needs no core: more workers than cores can wait at "
            "once; and workers that survive between passes (persistent_workers=True) do not start again"
        )
        observed(f"your loader: {ips:.0f} img/s over {EPOCHS} passes, {len(workers)} worker processes read the "
                 f"samples (target {target_ips:.0f} img/s{base_txt})")  # fmt: skip
        del loader  # persistent workers end with their loader


@exercise(
    "09.loader",
    f"Return DataLoader(dataset, batch_size={BATCH}, ...) with enough workers to wait on storage in parallel "
    "(more than cores is fine here) and persistent_workers=True, shuffle off.",
    _check_loader,
    time_limit=120,
)
def make_fast_loader(dataset: Dataset) -> DataLoader:
    return DataLoader(dataset, batch_size=BATCH, num_workers=8, persistent_workers=True, prefetch_factor=2)
