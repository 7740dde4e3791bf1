"""engines.engine_staleness and the cache key pinned: an engine whose only difference is one build setting is
stale (and named so), and each key field on its own changes the key."""

from __future__ import annotations

import pytest

from course_utils.techniques import tensorrt_engines as engines

BASE = dict(
    gpu_name="NVIDIA H200",
    compute_capability=(9, 0),
    trt_version="11.1.0",
    precision="fp16",
    profile=engines.Profile.for_batch("input", (3, 224, 224), 1, 8, 32),
    onnx_sha256="ab" * 32,
)


def test_same_facts_are_fresh():
    meta = engines.engine_metadata(**BASE)
    assert engines.engine_staleness(meta, engines.engine_metadata(**BASE)) == []
    assert meta["compute_capability"] == "9.0" and meta["build"] == engines.BUILD_DEFAULTS


@pytest.mark.parametrize(
    "setting, value",
    [
        ("tf32", False),
        ("opt_level", 5),
        ("workspace_bytes", 1 << 28),
        ("hardware_compat", "AMPERE_PLUS"),
        ("version_compatible", True),
    ],
)
def test_only_a_build_setting_changed_is_stale(setting, value):
    stored = engines.engine_metadata(**BASE)
    expected = engines.engine_metadata(**BASE, build={setting: value})
    reasons = engines.engine_staleness(stored, expected)
    assert len(reasons) == 1 and reasons[0].startswith("build: engine has"), reasons
    assert repr(value) in reasons[0] or str(value) in reasons[0]
    assert engines.engine_cache_key(**BASE) != engines.engine_cache_key(**BASE, build={setting: value})


def test_a_timing_cache_is_not_a_build_setting():
    assert engines.engine_cache_key(**BASE) == engines.engine_cache_key(**BASE, build={"timing_cache": "x.cache"})
    assert engines.engine_cache_key(**BASE) == engines.engine_cache_key(**BASE, build={"tf32": True})


@pytest.mark.parametrize(
    "field, value",
    [
        ("gpu_name", "NVIDIA L4"),
        ("compute_capability", (8, 9)),
        ("trt_version", "10.9.0"),
        ("precision", "int8"),
        ("profile", engines.Profile.for_batch("input", (3, 224, 224), 1, 16, 32)),
        ("onnx_sha256", "cd" * 32),
    ],
)
def test_each_key_field_alone_makes_it_stale(field, value):
    changed = {**BASE, field: value}
    reasons = engines.engine_staleness(engines.engine_metadata(**BASE), engines.engine_metadata(**changed))
    assert [r.split(":")[0] for r in reasons] == [field]
    assert engines.engine_cache_key(**BASE) != engines.engine_cache_key(**changed)


def test_missing_metadata_is_stale():
    assert engines.engine_staleness(None, engines.engine_metadata(**BASE))[0].startswith("no metadata")


def test_profile_shapes_and_their_order():
    p = engines.Profile.for_batch("x", (3, 8), 1, 4, 16)
    assert (p.min, p.opt, p.max) == ((1, 3, 8), (4, 3, 8), (16, 3, 8))
    assert p.as_dict() == {"name": "x", "min": [1, 3, 8], "opt": [4, 3, 8], "max": [16, 3, 8]}
    engines.Profile("x", (2,), (2,), (2,))  # min == opt == max is allowed
    for bad in [((1,), (4,), (2,)), ((4,), (2,), (8,)), ((0,), (1,), (2,)), ((1, 2), (1,), (1,))]:
        with pytest.raises(ValueError, match="profile 'x'"):
            engines.Profile("x", *bad)
