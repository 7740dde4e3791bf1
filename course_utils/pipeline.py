"""Data pipelines for lessons 09 and 10: decode, resize and normalize real JPEGs, and keep the model fed.

* :class:`JpegDataset` reads the shipped photos (``data/images``), decodes, resizes and normalizes them; it
  repeats them to ``n`` samples so a loader has enough work to measure.
* :func:`make_loader`, :func:`loader_batches` and :func:`num_workers_sweep` run a ``DataLoader`` and always
  shut its worker processes down (no persistent workers are left behind, even when a loop breaks early).
* :class:`Prefetcher` prepares the next item in a background thread while the caller computes (lesson 10's
  CPU analogue of overlapping copies with compute); :func:`run_pipeline` times it with and without overlap
  and :func:`overlap_bound` gives the best case.
* GPU helpers (used inside ``cu.gpu_section``): :func:`copy_to_device_ms` (pageable, pin-every-call,
  pre-pinned copies), :class:`CudaPrefetcher` (copies the next batch on a side stream), and
  :func:`gpu_decode_preprocess` (``decode_jpeg(device="cuda")`` and transforms on GPU tensors).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

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


class JpegDataset(Dataset):
    """The shipped JPEGs repeated to ``n`` samples; item = (normalized image tensor, label = photo index).

    Every ``__getitem__`` reads the file, decodes it and preprocesses it, like a real image data set
    (the files stay in the OS page cache, so this measures CPU work, not the disk).
    """

    def __init__(self, n: int, size: int = 224, paths: Sequence[str | Path] | None = None) -> None:
        if n < 1:
            raise ValueError(f"JpegDataset needs n >= 1 samples, got {n}")
        if paths is None:
            from .data import jpeg_paths

            paths = jpeg_paths()
        self.paths = [str(p) for p in paths]
        if not self.paths:
            raise ValueError("JpegDataset got no image paths: pass paths=cu.data.jpeg_paths()")
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def raw(self, i: int) -> torch.Tensor:
        """The encoded JPEG bytes of sample ``i`` as a uint8 tensor (what GPU decoding starts from)."""
        data = Path(self.paths[i % len(self.paths)]).read_bytes()
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.n:
            raise IndexError(f"index {i} out of range for JpegDataset of {self.n} samples")
        img = decode_jpeg(self.raw(i))
        return preprocess(img, self.size), i % len(self.paths)


def tiny_cnn(num_classes: int = 6) -> nn.Module:
    """A deliberately small image classifier (one strided conv): so fast that the loader is the bottleneck."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 7, stride=4, padding=3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(16, num_classes),
    ).eval()  # fmt: skip


def make_loader(
    dataset: Dataset,
    *,
    batch_size: int = 16,
    num_workers: int = 0,
    pin_memory: bool = False,
    prefetch_factor: int = 2,
) -> DataLoader:
    """A ``DataLoader`` without persistent workers (its worker processes end with each pass)."""
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        kwargs["prefetch_factor"] = prefetch_factor
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers, pin_memory=pin_memory,
        persistent_workers=False, **kwargs,
    )  # fmt: skip


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


def loader_throughput(
    dataset: Dataset, *, num_workers: int = 0, batch_size: int = 16, pin_memory: bool = False
) -> dict[str, float]:
    """One pass over ``dataset``: images/s (worker start-up included), seconds, time to the first batch."""
    loader = make_loader(dataset, batch_size=batch_size, num_workers=num_workers, pin_memory=pin_memory)
    n = 0
    t0 = time.perf_counter()
    first = None
    with loader_batches(loader) as batches:
        for x, _ in batches:
            if first is None:
                first = time.perf_counter() - t0
            n += x.shape[0]
    total = time.perf_counter() - t0
    return {"images": n, "seconds": total, "first_batch_s": first or 0.0, "images_per_s": n / total}


def num_workers_sweep(
    dataset: Dataset, workers: Iterable[int] = (0, 1, 2), *, batch_size: int = 16, pin_memory: bool = False
) -> pd.DataFrame:
    """Loader throughput for each ``num_workers`` value: one row per value (see :func:`loader_throughput`)."""
    rows = []
    for w in workers:
        rows.append({"num_workers": w, **loader_throughput(dataset, num_workers=w, batch_size=batch_size,
                                                           pin_memory=pin_memory)})  # fmt: skip
    return pd.DataFrame(rows)


def end_to_end(loader: DataLoader, model: Callable[[torch.Tensor], Any], device: str | torch.device = "cpu") -> dict:
    """Images/s of loading + moving + running ``model`` over one pass of ``loader`` (synchronized)."""
    dev = torch.device(device)
    n = 0
    t0 = time.perf_counter()
    with torch.inference_mode(), loader_batches(loader) as batches:
        for x, _ in batches:
            model(x.to(dev, non_blocking=True))
            n += x.shape[0]
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    total = time.perf_counter() - t0
    return {"images": n, "seconds": total, "images_per_s": n / total}


# ----------------------------------------------------------------------------------------------------
# Overlap on the CPU: a background thread prepares the next item while the model runs.


class Prefetcher:
    """Iterate ``prepare(item)`` for each item of ``source``, computed ``depth`` items ahead in a thread.

    Use it as a context manager so the thread always stops::

        with Prefetcher(raw_batches, prepare=decode) as batches:
            for x in batches:
                model(x)

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


def run_pipeline(
    items: Sequence[Any],
    prepare: Callable[[Any], Any],
    compute: Callable[[Any], Any],
    *,
    overlap: bool,
    depth: int = 2,
) -> float:
    """Seconds to ``compute(prepare(item))`` for every item, sequentially or with a :class:`Prefetcher`."""
    t0 = time.perf_counter()
    if overlap:
        with Prefetcher(items, prepare, depth=depth) as prepared:
            for x in prepared:
                compute(x)
    else:
        for item in items:
            compute(prepare(item))
    return time.perf_counter() - t0


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
# GPU helpers (call them inside cu.gpu_section; they need CUDA).


def _need_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        from .errors import DeviceUnavailableError

        raise DeviceUnavailableError(f"{what} needs a CUDA GPU: run it inside `if cu.gpu_section(...)`")


def copy_to_device_ms(x: torch.Tensor, mode: str, *, repeats: int = 20, device: str = "cuda") -> float:
    """Median ms of one host-to-device copy of ``x``: ``pageable`` (plain ``.to``), ``pin_each_call``
    (``x.pin_memory()`` then ``non_blocking`` copy, every call) or ``pinned`` (pinned once, untimed).

    Pinning allocates page-locked memory and copies into it: doing that per call can cost more than the
    copy it speeds up. Pin once (or let the DataLoader's pin thread do it) and reuse.
    """
    _need_cuda("copy_to_device_ms")
    if mode not in {"pageable", "pin_each_call", "pinned"}:
        raise ValueError(f"mode must be 'pageable', 'pin_each_call' or 'pinned', got {mode!r}")
    src = x.pin_memory() if mode == "pinned" else x

    def once() -> torch.Tensor:
        if mode == "pageable":
            return src.to(device)
        if mode == "pin_each_call":
            return src.pin_memory().to(device, non_blocking=True)
        return src.to(device, non_blocking=True)

    from .timing import measure

    return measure(once, device=device, min_repeats=repeats, warn_spread=False).median_ms


class CudaPrefetcher:
    """Copy the next batch to the GPU on a side stream while the current batch computes.

    Wraps an iterable of CPU tensors or (tensor, label) tuples (ideally pinned, e.g. a ``DataLoader`` with
    ``pin_memory=True``). The consumer's stream waits for the copy (``wait_stream``), and ``record_stream``
    tells the caching allocator the tensor is used on the consumer stream. Use as a context manager.
    """

    def __init__(self, source: Iterable[Any], device: str | torch.device = "cuda") -> None:
        _need_cuda("CudaPrefetcher")
        self.source, self.device = source, torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)
        self._it: Iterator[Any] | None = None
        self._next: Any = None

    def _to_device(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, (list, tuple)):
            return type(batch)(self._to_device(b) for b in batch)
        return batch

    def _preload(self) -> None:
        assert self._it is not None
        try:
            batch = next(self._it)
        except StopIteration:
            self._next = None
            return
        with torch.cuda.stream(self.stream):
            self._next = self._to_device(batch)

    def _record(self, batch: Any, stream: torch.cuda.Stream) -> None:
        if isinstance(batch, torch.Tensor):
            batch.record_stream(stream)
        elif isinstance(batch, (list, tuple)):
            for b in batch:
                self._record(b, stream)

    def __iter__(self) -> Iterator[Any]:
        self._it = iter(self.source)
        self._preload()
        while self._next is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)
            batch = self._next
            self._record(batch, current)
            self._preload()
            yield batch

    def __enter__(self) -> CudaPrefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stream.synchronize()
        shutdown = getattr(self._it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._it = None


def gpu_decode_preprocess(raw: Sequence[torch.Tensor], size: int = 224, device: str = "cuda") -> torch.Tensor:
    """Decode JPEGs on the GPU (nvJPEG via :func:`decode_jpeg`) and preprocess there: (N, 3, size, size).

    ``raw`` holds encoded files as CPU uint8 tensors (``JpegDataset.raw(i)``). Only the compressed bytes
    cross PCIe; decoding, resizing and normalizing run on the GPU.
    """
    _need_cuda("gpu_decode_preprocess")
    imgs = decode_jpeg(list(raw), device=device)
    return torch.stack([preprocess(img, size) for img in imgs])


# ----------------------------------------------------------------------------------------------------
# Timelines: who ran what, when (CPU threads here; CUDA events in stream_pipeline).


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


def stream_pipeline(
    model: Callable[[torch.Tensor], torch.Tensor], chunks: Sequence[torch.Tensor], *, overlap: bool,
    timeline: Timeline | None = None,
) -> tuple[float, list[torch.Tensor]]:  # fmt: skip
    """Copy each pinned CPU chunk to the GPU and run ``model`` on it; return (ms, outputs).

    ``overlap=False``: copy and compute on one stream, one after the other. ``overlap=True``: copies on a
    copy stream into two preallocated device buffers (double buffering), compute on a compute stream; CUDA
    events order them: compute ``i`` waits for copy ``i``, and copy ``i+2`` waits until compute ``i`` is
    done with its buffer. Intervals (from CUDA events, in ms) go to ``timeline`` when given.
    """
    _need_cuda("stream_pipeline")
    if not chunks or not all(c.is_pinned() for c in chunks):
        raise ValueError("stream_pipeline needs a non-empty list of pinned CPU tensors: use t.pin_memory() once")
    dev = torch.device("cuda")
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
    copy_s = torch.cuda.Stream() if overlap else torch.cuda.current_stream()
    comp_s = torch.cuda.Stream() if overlap else torch.cuda.current_stream()
    bufs = [torch.empty_like(chunks[0], device=dev) for _ in range(2)]
    marks: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
    done: list[torch.cuda.Event] = []
    outs = []
    torch.cuda.synchronize()
    start = ev()
    start.record(torch.cuda.current_stream())
    copy_s.wait_stream(torch.cuda.current_stream())
    comp_s.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode():
        for i, chunk in enumerate(chunks):
            buf = bufs[i % 2]
            with torch.cuda.stream(copy_s):
                if i >= 2:
                    copy_s.wait_event(done[i - 2])  # buffer still in use by compute i-2
                c0, c1 = ev(), ev()
                c0.record(copy_s)
                buf.copy_(chunk, non_blocking=True)
                c1.record(copy_s)
            with torch.cuda.stream(comp_s):
                comp_s.wait_event(c1)  # compute i starts after copy i
                k0, k1 = ev(), ev()
                k0.record(comp_s)
                outs.append(model(buf))
                k1.record(comp_s)
            done.append(k1)
            marks += [("copy H2D", c0, c1), ("compute", k0, k1)]
    end = ev()
    torch.cuda.current_stream().wait_stream(comp_s)
    end.record(torch.cuda.current_stream())
    end.synchronize()
    if timeline is not None:
        for lane, a, b in marks:
            timeline.add(lane, lane, start.elapsed_time(a), start.elapsed_time(b))
    return start.elapsed_time(end), outs
