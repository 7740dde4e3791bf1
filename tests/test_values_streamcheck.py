"""streamcheck pinned on known answers: each way of ordering two streams (stream synchronize, event synchronize,
wait_event, wait_stream) removes exactly the one race it orders, and nothing else does."""

from __future__ import annotations

import pytest
import torch

from course_utils.fakegpu.streamcheck import RecordingDevice


def _write_then_read(order: str) -> int:
    """A write on a side stream, then a read on the default stream, ordered by ``order``; the number of races."""
    src = torch.ones(4)
    dev = RecordingDevice()
    with dev.run("cpu"):
        dm = torch.get_device_module("cpu")
        side = dm.Stream()
        buf = torch.empty(4)
        side.wait_stream(dm.current_stream())  # buf was made on the default stream
        with dm.stream(side):
            buf.copy_(src)
            ev = dm.Event()
            ev.record(side)
        if order == "stream.synchronize":
            side.synchronize()
        elif order == "event.synchronize":
            ev.synchronize()
        elif order == "wait_event":
            dm.current_stream().wait_event(ev)
        elif order == "wait_stream":
            dm.current_stream().wait_stream(side)
        elif order == "device.synchronize":
            dm.synchronize()
        out = buf * 2
    assert torch.equal(out, 2 * src)
    return len(dev.races())


@pytest.mark.parametrize(
    "order", ["stream.synchronize", "event.synchronize", "wait_event", "wait_stream", "device.synchronize"]
)
def test_each_ordering_removes_the_race(order):
    assert _write_then_read(order) == 0, f"{order} orders the read after the write"


def test_without_ordering_the_race_is_found():
    assert _write_then_read("none") == 1
