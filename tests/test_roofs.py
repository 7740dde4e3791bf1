"""Roofs that match the run: the bandwidth probe's buffers are several times the last-level cache."""

import pytest

from course_utils.measuring import device


def _fake_sysfs(tmp_path, sizes):
    for i, size in enumerate(sizes):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "size").write_text(size + "\n")
    return tmp_path


def test_last_level_cache_is_the_largest_level(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "CPU_CACHE_DIR", _fake_sysfs(tmp_path, ["32K", "64K", "512K", "8192K"]))
    assert device.last_level_cache_bytes("cpu") == 8 * 2**20


def test_unreadable_cache_is_none(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "CPU_CACHE_DIR", tmp_path / "missing")
    monkeypatch.setattr(device.platform, "system", lambda: "Linux")
    assert device.last_level_cache_bytes("cpu") is None


@pytest.mark.parametrize(
    ("cache_mib", "buffer_mib"), [(8, 64), (32, 128), (105, 420), (1024, 512), (None, 128)]
)  # fmt: skip
def test_bandwidth_buffers_are_four_caches_within_limits(monkeypatch, cache_mib, buffer_mib):
    monkeypatch.setattr(device, "last_level_cache_bytes", lambda d=None: cache_mib and cache_mib * 2**20)
    assert device.bandwidth_buffer_bytes("cpu") == buffer_mib * 2**20
