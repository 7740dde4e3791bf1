"""Lesson 02's exercises reject wrong fixes and wrong profiler readings (and accept the reference solutions)."""

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from course_utils import exercises


def checker(key):
    return exercises.get(key).checker


def _events(fn):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return list(prof.key_averages())


def top_by_total(fn):
    return max(_events(fn), key=lambda e: e.cpu_time_total).key


def top_including_ranges(fn):
    return max(_events(fn), key=lambda e: e.self_cpu_time_total).key


def top_by_count(fn):
    return max(_events(fn), key=lambda e: e.count).key


def hard_coded(fn):
    fn()
    return "aten::mm"


@pytest.mark.parametrize(
    "wrong, message",
    [
        (top_by_total, "total"),
        (top_including_ranges, "record_function range"),
        (top_by_count, "most self CPU time"),
        (hard_coded, "most self CPU time"),
    ],
)
def test_top_op_rejects_wrong_readings(wrong, message):
    with pytest.raises(AssertionError, match=message):
        checker("02.top-op")(wrong)


def per_image_loop(images):
    return torch.stack([torch.from_numpy(im).float() / 16.0 for im in images]).unsqueeze(1)


def wrong_scale(images):
    return torch.from_numpy(np.stack(images)).float().div_(255.0).unsqueeze(1)


@pytest.mark.parametrize("wrong, message", [(per_image_loop, "once per image"), (wrong_scale, "divide")])
def test_vectorize_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        checker("02.vectorize")(wrong)


def per_row_item(logits):
    probs = torch.softmax(logits, dim=1)
    return [(int(p.argmax().item()), float(p.max().item())) for p in probs]


def logits_not_probs(logits):
    conf, label = logits.max(dim=1)
    return list(zip(label.tolist(), conf.tolist(), strict=True))


@pytest.mark.parametrize("wrong, message", [(per_row_item, "per-row"), (logits_not_probs, "softmax")])
def test_one_sync_rejects(wrong, message):
    with pytest.raises(AssertionError, match=message):
        checker("02.one-sync")(wrong)
