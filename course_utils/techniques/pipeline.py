"""Data-pipeline plumbing shared by lessons 09 and 10 (the techniques themselves are written in the lessons).

* :func:`decode_jpeg` (TorchCodec, or torchvision.io where it is missing) and :func:`preprocess` (resize,
  scale, normalize on tensors of any device); :func:`tiny_cnn`, a model so small that the loader limits.
  Lesson 09's data set, ``PhotoDataset``, is exported from its cell (``course_utils.from_lessons.l09_data_pipeline``:
  lesson 10 and ``spawn`` workers import it there), not kept here as a second copy.
* :func:`loader_batches` shuts a DataLoader's workers down even when a loop stops early.
* :class:`Prefetcher` prepares the next item in a background thread (lesson 10's CPU analogue of overlapping
  copies with compute), :func:`overlap_bound` gives a two-stage pipeline's best case and :class:`Timeline`
  draws who ran when.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def jpeg_decoder() -> str:
    """Which JPEG decoder :func:`decode_jpeg` uses here: ``"torchcodec"`` (current) or ``"torchvision.io"``."""
    import importlib.util

    return "torchcodec" if importlib.util.find_spec("torchcodec") is not None else "torchvision.io"


def decode_jpeg(raw: torch.Tensor | list[torch.Tensor], device: str | torch.device = "cpu") -> Any:
    """Decode JPEG bytes (1-D uint8 CPU tensor, or a list of them) to uint8 RGB (3, H, W) tensor(s) on ``device``.

    Uses TorchCodec's ``decode_jpeg`` (nvJPEG when ``device`` is CUDA; pass a list to decode a batch in one
    call). torchvision.io's image decoders are deprecated since torchvision 0.29 in favour of TorchCodec; they
    are the fallback where torchcodec is not installed.
    """
    if jpeg_decoder() == "torchcodec":
        from torchcodec.decoders import decode_jpeg as _decode

        return _decode(raw, mode="RGB", device=device)
    import warnings

    from torchvision.io import ImageReadMode
    from torchvision.io import decode_jpeg as _tv_decode

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return _tv_decode(raw, mode=ImageReadMode.RGB, device=device)


def preprocess(img: torch.Tensor, size: int = 224) -> torch.Tensor:
    """uint8 image (3, H, W) -> float32 (3, size, size), scaled to [0, 1] and ImageNet-normalized.

    The same code runs on CPU and GPU tensors (torchvision.transforms.v2.functional works on tensors of
    any device), so the GPU path in lesson 09 computes the same thing as the CPU loader.
    """
    import torchvision.transforms.v2.functional as F

    if img.dtype != torch.uint8 or img.ndim != 3 or img.shape[0] != 3:
        raise ValueError(
            f"preprocess expects a uint8 (3, H, W) image, got {img.dtype} {tuple(img.shape)}: "
            "decode with cu.pipeline.decode_jpeg(raw_bytes)"
        )
    out = F.resize(img, [size, size], antialias=True)
    out = F.to_dtype(out, torch.float32, scale=True)
    return F.normalize(out, list(IMAGENET_MEAN), list(IMAGENET_STD))


def tiny_cnn(num_classes: int = 6) -> nn.Module:
    """A deliberately small image classifier (one strided conv): so fast that the loader is the bottleneck."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 7, stride=4, padding=3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(16, num_classes),
    ).eval()  # fmt: skip


@contextlib.contextmanager
def loader_batches(loader: DataLoader) -> Iterator[Iterator[Any]]:
    """Iterate a loader and shut its worker processes down on exit, even after ``break`` or an error.

    ``with loader_batches(loader) as batches: for x, y in batches: ...``
    """
    it = iter(loader)
    try:
        yield it
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)  # multi-process iterator: stop workers now
        if shutdown is not None:
            shutdown()
        del it


# ----------------------------------------------------------------------------------------------------
# Overlap on the CPU: a background thread prepares the next item while the model runs.


class Prefetcher:
    """Iterate ``prepare(item)`` for each item of ``source``, computed ``depth`` items ahead in a thread.

    Use it as a context manager so the thread always stops: ``with Prefetcher(raws, decode) as batches: ...``.
    An exception in ``prepare`` is re-raised in the consuming loop. Work overlaps only where the two sides
    release the GIL (torch and torchvision ops do) and spare cores exist.
    """

    _DONE = object()

    def __init__(self, source: Iterable[Any], prepare: Callable[[Any], Any] | None = None, depth: int = 2) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.source, self.prepare, self.depth = source, prepare or (lambda v: v), depth
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _work(self) -> None:
        try:
            for item in self.source:
                if self._stop.is_set():
                    return
                out = self.prepare(item)
                while not self._stop.is_set():
                    try:
                        self._queue.put(("item", out), timeout=0.05)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._put_final(("error", exc))
            return
        self._put_final(("done", self._DONE))

    def _put_final(self, msg: tuple[str, Any]) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(msg, timeout=0.05)
                return
            except queue.Full:
                continue

    def start(self) -> Prefetcher:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="prefetcher", daemon=True)
            self._thread.start()
        return self

    def __iter__(self) -> Iterator[Any]:
        self.start()
        while True:
            kind, value = self._queue.get()
            if kind == "done":
                return
            if kind == "error":
                raise value
            yield value

    def close(self) -> None:
        """Stop the thread and wait for it (safe to call twice)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Prefetcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def overlap_bound(prep_s: float, compute_s: float, n: int) -> float:
    """Best-case time of a two-stage pipeline over ``n`` items (per item: ``prep_s``, ``compute_s``).

    The first item's preparation cannot overlap anything and the last compute follows it; in between the
    slower stage sets the pace: ``prep + (n - 1) * max(prep, compute) + compute``. For large ``n`` this is
    ``n * max(prep, compute)``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return prep_s + (n - 1) * max(prep_s, compute_s) + compute_s


# ----------------------------------------------------------------------------------------------------
# Timelines: who ran what, when.


class Timeline:
    """Record (lane, label, start, end) intervals and draw them as a Gantt chart, to see overlap.

    ``step = timeline.wrap("prepare", prepare)`` returns ``prepare`` timed into lane ``"prepare"``.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, float, float]] = []
        self._lock = threading.Lock()
        self.t0 = time.perf_counter()

    def add(self, lane: str, label: str, start: float, end: float) -> None:
        with self._lock:
            self.rows.append((lane, label, start, end))

    def wrap(self, lane: str, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def timed(item: Any) -> Any:
            start = time.perf_counter() - self.t0
            out = fn(item)
            self.add(lane, lane, start, time.perf_counter() - self.t0)
            return out

        return timed

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=["lane", "label", "start", "end"])

    def busy_overlap_s(self, a: str, b: str) -> float:
        """Seconds during which lanes ``a`` and ``b`` were both busy."""
        df = self.frame()
        total = 0.0
        for _, x in df[df["lane"] == a].iterrows():
            for _, y in df[df["lane"] == b].iterrows():
                total += max(0.0, min(x["end"], y["end"]) - max(x["start"], y["start"]))
        return total

    def plot(self, *, title: str = "Timeline", ax=None, unit: str = "s"):
        """Gantt chart: one row per lane, one bar per interval."""
        import matplotlib.pyplot as plt

        df = self.frame()
        if ax is None:
            fig, ax = plt.subplots(figsize=(10, 0.6 * max(1, df["lane"].nunique()) + 1.5))
        else:
            fig = ax.figure
        lanes = list(dict.fromkeys(df["lane"]))
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, lane in enumerate(lanes):
            g = df[df["lane"] == lane]
            ax.broken_barh(list(zip(g["start"], g["end"] - g["start"], strict=True)), (i - 0.4, 0.8),
                           color=colors[i % len(colors)], edgecolor="black")  # fmt: skip
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_xlabel(f"time ({unit})")
        ax.set_title(title)
        fig.tight_layout()
        return fig
