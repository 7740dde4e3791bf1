"""Lesson 10's double-buffer exercise: the checker accepts the reference and rejects each way to get it wrong."""

from __future__ import annotations

import pytest
import torch

from course_utils import exercises

KEY = "10.double-buffer"


def loop(*, wait_copy=True, wait_free=True, join=True, one_stream=False, fresh=False, serial=False):
    """The double-buffer loop with one step left out or changed."""

    def fn(model, chunks, device):
        dm = torch.get_device_module(device)
        copy_s, caller = dm.Stream(), dm.current_stream()
        comp_s = copy_s if one_stream else dm.Stream()
        bufs = [torch.empty_like(chunks[0]) for _ in range(2)]
        copied, freed = [dm.Event() for _ in range(2)], [dm.Event() for _ in range(2)]
        outs, last = [], None
        for i, chunk in enumerate(chunks):
            k = i % 2
            with dm.stream(copy_s):
                if serial and last is not None:
                    copy_s.wait_event(last)
                if i >= 2 and wait_free:
                    copy_s.wait_event(freed[k])
                buf = torch.empty_like(chunk) if fresh else bufs[k]
                buf.copy_(chunk, non_blocking=True)
                copied[k].record(copy_s)
            with dm.stream(comp_s):
                if wait_copy:
                    comp_s.wait_event(copied[k])
                outs.append(model(buf))
                freed[k].record(comp_s)
                last = freed[k]
        if join:
            caller.wait_stream(comp_s)
        return outs

    return fn


def verdict(fn) -> str:
    return exercises.verdict(KEY, fn)


def test_reference_and_equivalent_loop_are_accepted():
    assert verdict(exercises.get(KEY).solution) == "accepted"
    assert verdict(loop()) == "accepted"


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (dict(wait_copy=False), "data race"),
        (dict(wait_free=False), "data race"),
        (dict(join=False), "data race"),
        (dict(one_stream=True), "one stream and compute on another"),
        (dict(fresh=True), "different buffers"),
        (dict(serial=True), "never overlap"),
    ],
)
def test_wrong_loops_are_rejected(wrong, message):
    assert message in verdict(loop(**wrong))


def test_wrong_outputs_are_rejected():
    def off_by_one(model, chunks, device):
        return [model(c) for c in chunks[1:]] + [model(chunks[0])]

    assert "differs" in verdict(off_by_one)

    def plain(model, chunks, device):  # right outputs, no streams at all
        return [model(c) for c in chunks]

    assert "copy each chunk" in verdict(plain)


def test_checker_leaves_torch_unpatched():
    before = torch.get_device_module
    verdict(loop(wait_copy=False))
    assert torch.get_device_module is before
