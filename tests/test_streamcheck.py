"""Unit tests for fakegpu.streamcheck: the recording device module finds unordered stream accesses.

streamcheck pinned on known answers: each way of ordering two streams (stream synchronize, event synchronize,
wait_event, wait_stream) removes exactly the one race it orders, and nothing else does."""

from __future__ import annotations

import pytest
import torch

from fakegpu.streamcheck import RecordingDevice, describe


def test_ordered_and_unordered_accesses():
    src = torch.ones(4)
    dev = RecordingDevice()
    with dev.run("cpu"):
        dm = torch.get_device_module("cpu")
        assert dm is dev
        s = dm.Stream()
        buf = torch.empty(4)
        with dm.stream(s):
            buf.copy_(src)
            ev = dm.Event()
            ev.record(s)
        dm.current_stream().wait_event(ev)
        ok = buf * 2  # ordered after the copy
        with dm.stream(s):
            buf.copy_(src)  # overwrites buf: nothing orders it after the read above or before the one below
        late = buf + 1
    assert torch.equal(ok, 2 * src) and torch.equal(late, src + 1)
    races = dev.races()
    assert len(races) == 2
    assert {describe(r).split("'")[1] for r in races} == {"mul", "copy_"}
    assert torch.get_device_module("cpu") is torch.cpu  # restored


def test_synchronize_orders_everything_and_views_are_no_new_memory():
    dev = RecordingDevice()
    with dev.run("cpu"):
        dm = torch.get_device_module("cpu")
        s = dm.Stream()
        x = torch.zeros(4)  # a kernel on the default stream
        s.wait_stream(dm.current_stream())
        with dm.stream(s):
            x.add_(1)
        dm.synchronize()
        y = x[:2] * 3  # a view of x, read after the host waited for every stream
    assert not dev.races() and torch.equal(y, torch.full((2,), 3.0))


def test_record_stream_is_required_across_streams():
    dev = RecordingDevice()
    with dev.run("cpu"):
        dm = torch.get_device_module("cpu")
        side, main = dm.Stream(), dm.current_stream()
        with dm.stream(side):
            a = torch.ones(3).to("cpu", non_blocking=True)  # new memory, made on the side stream
            b = torch.ones(3).to("cpu", non_blocking=True)
        main.wait_stream(side)
        a.record_stream(main)
        a + b
    missing = dev.missing_record_stream()
    assert len(missing) == 1 and missing[0][1] is side
    assert not dev.races()


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
