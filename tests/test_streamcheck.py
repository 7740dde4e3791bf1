"""Unit tests for course_utils.fakegpu.streamcheck: the recording device module finds unordered stream accesses."""

from __future__ import annotations

import torch

from course_utils.fakegpu.streamcheck import RecordingDevice, describe


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
