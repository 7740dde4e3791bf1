"""Unit tests for course_utils.techniques.pipeline (the data-pipeline plumbing lessons 09 and 10 share)."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch
from torch.utils.data import DataLoader

from course_utils.from_lessons.l09_data_pipeline import PhotoDataset
from course_utils.supply import data
from course_utils.techniques import pipeline


def test_preprocess_shape_and_normalization() -> None:
    img = torch.full((3, 10, 20), 255, dtype=torch.uint8)
    out = pipeline.preprocess(img, 8)
    assert out.shape == (3, 8, 8) and out.dtype == torch.float32
    want = (1.0 - torch.tensor(pipeline.IMAGENET_MEAN)) / torch.tensor(pipeline.IMAGENET_STD)
    assert torch.allclose(out[:, 0, 0], want, atol=1e-5)


def test_decode_jpeg_matches_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = PhotoDataset(data.jpeg_paths(), 1, 16).raw(0)
    img = pipeline.decode_jpeg(raw)
    assert img.dtype == torch.uint8 and img.ndim == 3 and img.shape[0] == 3
    monkeypatch.setattr(pipeline, "jpeg_decoder", lambda: "torchvision.io")
    assert torch.equal(pipeline.decode_jpeg(raw), img)
    assert isinstance(pipeline.decode_jpeg([raw, raw]), list)


def test_preprocess_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="decode_jpeg"):
        pipeline.preprocess(torch.zeros(3, 4, 4), 4)


def test_dataset_repeats_shipped_jpegs() -> None:
    ds = PhotoDataset(data.jpeg_paths(), 8, 16)
    assert len(ds) == 8
    x, label = ds[len(ds.paths)]
    assert x.shape == (3, 16, 16) and label == 0
    assert ds.raw(0).dtype == torch.uint8
    with pytest.raises(IndexError):
        ds[8]
    with pytest.raises(ValueError):
        PhotoDataset(data.jpeg_paths(), 0, 16)


def test_dataset_uint8_variant_matches_normalized() -> None:
    ds = PhotoDataset(data.jpeg_paths(), 2, 16)
    raw = PhotoDataset(data.jpeg_paths(), 2, 16, normalize=False)
    img, label = raw[1]
    assert img.dtype == torch.uint8 and img.shape == (3, 16, 16) and label == 1
    mean = torch.tensor(pipeline.IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(pipeline.IMAGENET_STD).view(3, 1, 1)
    assert torch.allclose((img.float() / 255 - mean) / std, ds[1][0], atol=1e-5)


def test_loader_batches_stops_workers_after_early_exit() -> None:
    ds = PhotoDataset(data.jpeg_paths(), 4, 16)
    ref = next(iter(DataLoader(ds, batch_size=4)))[0]
    with pipeline.loader_batches(DataLoader(ds, batch_size=2, num_workers=1)) as batches:
        first = next(batches)[0]  # leave the loop early: workers must still stop
    assert torch.equal(first, ref[:2])
    assert multiprocessing.active_children() == []


def test_prefetcher_order_errors_and_stop() -> None:
    with pipeline.Prefetcher(range(10), lambda v: v * 2) as it:
        assert list(it) == [v * 2 for v in range(10)]

    def boom(v: int) -> int:
        if v == 3:
            raise RuntimeError("bad item")
        return v

    with pytest.raises(RuntimeError, match="bad item"), pipeline.Prefetcher(range(10), boom) as it:
        list(it)
    p = pipeline.Prefetcher(range(1000), lambda v: v, depth=1)
    with p as it:
        for v in it:
            if v == 2:
                break
    assert not p.alive
    assert not any(t.name == "prefetcher" for t in threading.enumerate())
    with pytest.raises(ValueError):
        pipeline.Prefetcher([], depth=0)


def test_overlap_bound() -> None:
    assert pipeline.overlap_bound(1.0, 3.0, 4) == 1.0 + 3 * 3.0 + 3.0
    assert pipeline.overlap_bound(2.0, 2.0, 1) == 4.0
    with pytest.raises(ValueError):
        pipeline.overlap_bound(1.0, 1.0, 0)


def test_timeline_records_and_plots() -> None:
    tl = pipeline.Timeline()
    tl.add("a", "a", 0.0, 2.0)
    tl.add("b", "b", 1.0, 3.0)
    assert tl.busy_overlap_s("a", "b") == pytest.approx(1.0)
    wrapped = tl.wrap("c", lambda v: v + 1)
    assert wrapped(1) == 2 and len(tl.frame()) == 3
    fig = tl.plot(title="T", unit="ms")
    import matplotlib.pyplot as plt

    try:
        (ax,) = fig.axes
        bars = [p.vertices for c in ax.collections for p in c.get_paths()]  # one lane a collection, one bar a path
        x = [(round(float(v[:, 0].min()), 9), round(float(v[:, 0].max()), 9)) for v in bars]
        y = [(round(float(v[:, 1].min()), 9), round(float(v[:, 1].max()), 9)) for v in bars]
        assert x[:2] == [(0.0, 2.0), (1.0, 3.0)], "each bar spans its interval: start to end"
        assert y == [(-0.4, 0.4), (0.6, 1.4), (1.6, 2.4)], "lanes a, b, c on rows 0, 1, 2"
        assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"], "one row per lane, in order"
        assert ax.get_xlabel() == "time (ms)" and ax.get_title() == "T"
    finally:
        plt.close(fig)


def test_busy_overlap_of_disjoint_and_nested_intervals() -> None:
    tl = pipeline.Timeline()
    tl.add("a", "a", 0.0, 1.0)
    tl.add("a", "a", 2.0, 5.0)
    tl.add("b", "b", 1.0, 2.0)  # touches both of a's intervals, overlaps neither
    tl.add("b", "b", 3.0, 4.0)  # inside a's second one
    assert tl.busy_overlap_s("a", "b") == pytest.approx(1.0)
    assert tl.busy_overlap_s("b", "a") == pytest.approx(1.0)
