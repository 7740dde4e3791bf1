"""Lesson 10's double-buffer exercise: the checker accepts the reference and rejects each way to get it wrong."""

from __future__ import annotations

import pytest
import torch

from course_checks import exercises

KEY = "10.double-buffer"


def loop(
    *,
    wait_copy=True,
    wait_free=True,
    join=True,
    one_stream=False,
    fresh=False,
    serial=False,
    caller_wait=True,
    record=True,
    sync=False,
    events=True,
    aside=False,
    item=False,
    query=False,
    tolist=False,
    bufs_on_copy=False,
    device_guard=False,
    host_buffers=False,
):
    """The double-buffer loop with one step left out or changed."""

    def fn(model, chunks, device):
        dm = torch.get_device_module(device)
        copy_s, caller = dm.Stream(), dm.current_stream()
        comp_s = copy_s if one_stream else dm.Stream()
        if bufs_on_copy:  # allocated on the copy stream (no caller wait needed), then read on the compute stream
            with dm.stream(copy_s):
                bufs = [torch.empty_like(chunks[0], device=device) for _ in range(2)]
        elif host_buffers:  # like the chunks: in host memory, not on the device
            bufs = [torch.empty_like(chunks[0]) for _ in range(2)]
        else:
            bufs = [torch.empty_like(chunks[0], device=device) for _ in range(2)]
        if caller_wait:
            copy_s.wait_stream(caller)
            comp_s.wait_stream(caller)
        copied, freed = [dm.Event() for _ in range(2)], [dm.Event() for _ in range(2)]
        outs, last = [], None
        for i, chunk in enumerate(chunks):
            k = i % 2
            with dm.stream(copy_s):
                if serial and last is not None:
                    copy_s.wait_event(last)
                if i >= 2 and wait_free:
                    copy_s.wait_event(freed[k])
                buf = torch.empty_like(chunk, device=device) if fresh else bufs[k]
                buf.copy_(chunk, non_blocking=True)
                if events:
                    copied[k].record(copy_s)
                if sync:
                    dm.synchronize()  # the host waits for the copy instead of an event
            with dm.stream(comp_s):
                if wait_copy and events:
                    comp_s.wait_event(copied[k])
                elif wait_copy:
                    comp_s.wait_stream(copy_s)
                out = model(buf)
                freed[k].record(comp_s)
                last = freed[k]
                if item:
                    float(out.sum().item())  # "check progress": a host read of a GPU result
                if tolist:
                    out[0, 0, 0].tolist()
            if query:
                while not freed[k].query():  # poll until compute i is done
                    pass
            if aside:
                out = model(chunk)  # the baseline, computed on the caller's stream
            if record and not isinstance(caller, torch.cpu.Stream):
                out.record_stream(caller)
            if device_guard and device != "cpu":  # skipped on the check's recording device, which runs on "cpu"
                out.record_stream(caller)
            outs.append(out)
        if join:
            caller.wait_stream(comp_s)
        return outs

    return fn


def copy_ahead_then_wait_stream(model, chunks, device):
    """Copies one chunk ahead, but compute i waits for the whole copy stream, i.e. also for copy i+1: no overlap."""
    dm = torch.get_device_module(device)
    copy_s, comp_s, caller = dm.Stream(), dm.Stream(), dm.current_stream()
    bufs = [torch.empty_like(chunks[0], device=device) for _ in range(2)]
    copy_s.wait_stream(caller)
    comp_s.wait_stream(caller)
    freed = [dm.Event() for _ in range(2)]

    def copy(i):
        with dm.stream(copy_s):
            if i >= 2:
                copy_s.wait_event(freed[i % 2])
            bufs[i % 2].copy_(chunks[i], non_blocking=True)

    copy(0)
    outs = []
    for i in range(len(chunks)):
        if i + 1 < len(chunks):
            copy(i + 1)
        with dm.stream(comp_s):
            comp_s.wait_stream(copy_s)
            out = model(bufs[i % 2])
            freed[i % 2].record(comp_s)
        if not isinstance(caller, torch.cpu.Stream):
            out.record_stream(caller)
        outs.append(out)
    caller.wait_stream(comp_s)
    return outs


def verdict(fn) -> str:
    return exercises.verdict(KEY, fn)


def test_reference_and_equivalent_loop_are_accepted():
    for seed in range(200):
        assert exercises.verdict(KEY, exercises.get(KEY).solution, seed=seed) == "accepted"
        assert exercises.verdict(KEY, loop(), seed=seed) == "accepted"


def test_compute_waiting_for_the_copy_stream_right_after_the_copy_is_accepted():
    """comp_s.wait_stream(copy_s) issued right after copy i waits for everything issued on the copy stream so far,
    which is copy i: the order the event gives (the lesson's definition of wait_stream), accepted on every seed;
    the copies still wait for the compute's events before reusing a buffer."""
    for seed in range(200):
        assert exercises.verdict(KEY, loop(events=False), seed=seed) == "accepted", seed


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (dict(wait_copy=False), "data race"),
        (dict(wait_free=False), "data race"),
        (dict(join=False), "data race"),
        (dict(one_stream=True), "one stream and compute on another"),
        (dict(fresh=True), "different buffers"),
        (dict(serial=True), "never overlap"),
        (dict(caller_wait=False), "wait_stream(caller)"),
        (dict(record=False), "record_stream"),
        (dict(sync=True), "synchronize() makes the host wait"),
        (dict(aside=True), "throwaway input"),
        (dict(item=True), "the host waited for the GPU (.item()"),
        (dict(query=True), "the host waited for the GPU (event.query()"),
        (dict(tolist=True), "the host waited for the GPU (.tolist()"),
        (dict(bufs_on_copy=True, caller_wait=False), "that is not an output (a buffer allocated inside"),
        (dict(record=False, device_guard=True), "not by the device string"),
        (dict(host_buffers=True), "empty_like(chunks[0], device=device)"),
    ],
    ids=[
        "no-wait-copy",
        "no-wait-free",
        "no-join",
        "one-stream",
        "fresh-buffers",
        "serialized",
        "no-caller-wait",
        "no-record-stream",
        "synchronize",
        "baseline-aside",
        "item",
        "event-query",
        "tolist",
        "buffers-on-copy-stream",
        "record-stream-guarded-by-device-string",
        "buffers-in-host-memory",
    ],
)
def test_wrong_loops_are_rejected(wrong, message):
    for seed in range(200):
        got = exercises.verdict(KEY, loop(**wrong), seed=seed)
        assert message in got, (seed, got)


def buffers_on_the_copy_stream_recorded(model, chunks, device):
    """Buffers allocated on the copy stream and recorded for the compute stream: a right alternative."""
    dm = torch.get_device_module(device)
    copy_s, comp_s, caller = dm.Stream(), dm.Stream(), dm.current_stream()
    with dm.stream(copy_s):
        bufs = [torch.empty_like(chunks[0], device=device) for _ in range(2)]
    if not isinstance(caller, torch.cpu.Stream):
        for b in bufs:
            b.record_stream(comp_s)
    copied, freed = [dm.Event() for _ in range(2)], [dm.Event() for _ in range(2)]
    outs = []
    for i, chunk in enumerate(chunks):
        k = i % 2
        with dm.stream(copy_s):
            copy_s.wait_event(freed[k])  # an event not recorded yet (i < 2) waits for nothing
            bufs[k].copy_(chunk, non_blocking=True)
            copied[k].record(copy_s)
        with dm.stream(comp_s):
            comp_s.wait_event(copied[k])
            out = model(bufs[k])
            freed[k].record(comp_s)
        if not isinstance(caller, torch.cpu.Stream):
            out.record_stream(caller)
        outs.append(out)
    caller.wait_stream(comp_s)
    return outs


def test_buffers_on_the_copy_stream_with_record_stream_are_accepted():
    for seed in range(50):  # the boundary (where the buffers are made) is in every case: 50 seeds keep it short
        assert exercises.verdict(KEY, buffers_on_the_copy_stream_recorded, seed=seed) == "accepted", seed


def test_compute_waiting_for_the_next_copy_is_rejected():
    assert "compute 0 waits for copy 1" in verdict(copy_ahead_then_wait_stream)


def test_wrong_outputs_are_rejected():
    def off_by_one(model, chunks, device):
        return [model(c) for c in chunks[1:]] + [model(chunks[0])]

    assert "differs" in verdict(off_by_one)

    def plain(model, chunks, device):  # right outputs, no streams at all
        return [model(c) for c in chunks]

    assert "copy each chunk" in verdict(plain)


def test_the_case_is_random_and_its_seed_printed():
    got = verdict(loop(wait_copy=False))
    assert "random case seed" in got


def test_checker_leaves_torch_unpatched():
    before = torch.get_device_module
    verdict(loop(wait_copy=False))
    assert torch.get_device_module is before
