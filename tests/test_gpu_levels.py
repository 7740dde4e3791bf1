"""The verification table is generated from run records: executed > rehearsed > API-checked > unverified.

README's table itself is compared with this run's records after the run (tests/after_run/test_run_record.py).
"""

from __future__ import annotations

import json

import pytest

from scripts import gpu_levels


def test_contract_claims_name_existing_sections():
    assert gpu_levels.stale_claims() == [], "COVERS/NOT_TESTABLE name sections no lesson enters"


def _tree(tmp_path, lesson: str, contract: str = "", env: dict | None = None, records: list[dict] | None = None):
    (tmp_path / "lessons").mkdir()
    (tmp_path / "lessons" / "50_demo.py").write_text(lesson)
    (tmp_path / "tests" / "gpu_contract").mkdir(parents=True)
    (tmp_path / "tests" / "gpu_contract" / "test_l50.py").write_text(contract)
    (tmp_path / "data" / "reference").mkdir(parents=True)
    (tmp_path / "records").mkdir()
    if env:
        (tmp_path / "data" / "reference" / "gpu.env.json").write_text(json.dumps(env))
    if records:
        lines = "".join(json.dumps({"kind": "gpu", "time": 1.0, "run": "r1", **r}) + "\n" for r in records)
        (tmp_path / "records" / "sections-rehearsal.jsonl").write_text(lines)
    return tmp_path


LESSON = "".join(f'if cu.gpu_section("50.{k}"):\n    pass\n' for k in "abcdef")
CONTRACT = 'COVERS = {"50.b": "checks b", "50.c": "checks c"}\nNOT_TESTABLE = {"50.e": "needs the hardware"}\n'
RECORDS = [
    {"section": "50.a", "ran": False, "reason": "", "status": "entered", "mode": "rehearsal"},
    {
        "section": "50.a",
        "ran": True,
        "reason": "",
        "status": "completed",
        "mode": "rehearsal",
        "checks": {"placement checks": 12, "stream-order checks": 3, "stream-order violations": 0, "other": 1},
    },
    {"section": "50.b", "ran": False, "reason": "", "status": "entered", "mode": "rehearsal"},
    {
        "section": "50.b",
        "ran": False,
        "reason": "not rehearsable: torch.compile",
        "status": "not-rehearsable",
        "mode": "rehearsal",
    },
    {"section": "50.d", "ran": False, "reason": "", "status": "entered", "mode": "rehearsal"},
    {
        "section": "50.d",
        "ran": False,
        "reason": "RehearsalError: stream order",
        "status": "failed",
        "mode": "rehearsal",
    },
    {"section": "50.f", "ran": True, "reason": "", "status": "completed", "mode": "gpu"},  # not a rehearsal row
]


def test_levels_from_records_claims_and_reference_runs(tmp_path):
    env = {"gpu": "H200", "date": "2026-12-01", "torch": "2.11", "sections_ran": ["50.c"]}
    root = _tree(tmp_path, LESSON, CONTRACT, env, RECORDS)
    got = {r.section: (r.level, r.detail) for r in gpu_levels.levels(root, records=root / "records")}
    assert got["50.a"][0] == "rehearsed" and "placement, stream order" in got["50.a"][1]
    assert got["50.b"][0] == "API-checked" and "torch.compile" in got["50.b"][1]
    assert got["50.c"][0] == "executed" and "H200" in got["50.c"][1] and "checks c" in got["50.c"][1]
    assert got["50.d"] == ("unverified", "rehearsal: RehearsalError: stream order")
    assert got["50.e"] == ("unverified", "not contract-testable: needs the hardware (`tests/gpu_contract/test_l50.py`)")
    assert got["50.f"] == ("unverified", "no run record and no contract test names it")
    table = gpu_levels.table(gpu_levels.levels(root, records=root / "records"))
    assert table.startswith("6 GPU-only sections: 1 API-checked, 1 executed, 1 rehearsed, 3 unverified.")


def test_an_entered_section_is_not_rehearsed(tmp_path):
    """A body that never completed (the process died inside it) leaves only 'entered': not a level."""
    root = _tree(tmp_path, LESSON, "", None, RECORDS[:1])
    assert gpu_levels.levels(root, records=root / "records")[0].level == "unverified"


def test_enforced_lists_kinds_not_counts():
    assert gpu_levels.enforced({"placement checks": 5, "graph captures": 1, "timing checks": 0}) == (
        "CUDA-graph capture rules, placement"
    )
    assert gpu_levels.enforced({}) == "nothing beyond running the body"


def test_unclaimed_and_stale_and_non_literal_keys_are_caught(tmp_path):
    root = _tree(tmp_path, 'cu.gpu_section("50.a")\n', 'COVERS = {"50.gone": "x"}\n')
    assert gpu_levels.levels(root)[0].detail == "no run record and no contract test names it"
    assert gpu_levels.stale_claims(root) == ["50.gone"]
    (root / "lessons" / "50_demo.py").write_text("key = '50.a'\ncu.gpu_section(key)\n")
    with pytest.raises(ValueError, match="literal key"):
        gpu_levels.lesson_sections(root)


def test_render_readme_needs_markers():
    with pytest.raises(ValueError, match="markers"):
        gpu_levels.render_readme("no table here", [])


def test_a_body_that_exercised_no_rule_is_not_rehearsed(tmp_path):
    """08.build on the stand-ins calls TensorRT's fake builder and no CUDA rule: that is an API check, no more."""
    base = {"ran": True, "reason": "", "status": "completed", "mode": "rehearsal"}
    records = [
        {"section": "50.b", **base, "checks": {"streams created": 1, "global switches compared": 1}},
        {"section": "50.f", **base, "checks": {"global switches compared": 1}},
        {"section": "50.a", **base, "checks": {"timer reads checked": 2, "global switches compared": 1}},
    ]
    root = _tree(tmp_path, LESSON, CONTRACT, None, records)
    got = {r.section: (r.level, r.detail) for r in gpu_levels.levels(root, records=root / "records")}
    assert got["50.b"][0] == "API-checked" and "exercised no CUDA rule" in got["50.b"][1]
    assert got["50.f"][0] == "unverified" and "but exercised no CUDA rule" in got["50.f"][1]
    assert got["50.a"][0] == "rehearsed" and "wall-clock timers wait for the GPU" in got["50.a"][1]
