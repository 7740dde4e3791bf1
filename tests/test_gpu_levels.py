"""The verification table: every GPU-only section has a level, README shows the current table."""

from __future__ import annotations

import json

import pytest

from scripts import gpu_levels


def test_readme_table_is_current():
    readme = (gpu_levels.ROOT / "README.md").read_text()
    assert gpu_levels.render_readme(readme, gpu_levels.levels()) == readme, (
        "README's GPU verification table is stale: run `python -m scripts.gpu_levels --write`"
    )


def test_no_gpu_section_is_left_without_a_contract_test_or_a_reason():
    bare = [r.section for r in gpu_levels.levels() if r.detail == "no contract test names it"]
    assert not bare, f"GPU sections with no contract test and no NOT_TESTABLE reason: {bare}"


def test_contract_claims_name_existing_sections():
    assert gpu_levels.stale_claims() == [], "COVERS/NOT_TESTABLE name sections no lesson enters"


def _tree(tmp_path, lesson: str, contract: str = "", env: dict | None = None):
    (tmp_path / "lessons").mkdir()
    (tmp_path / "lessons" / "50_demo.py").write_text(lesson)
    (tmp_path / "tests" / "gpu_contract").mkdir(parents=True)
    (tmp_path / "tests" / "gpu_contract" / "test_l50.py").write_text(contract)
    (tmp_path / "data" / "reference").mkdir(parents=True)
    if env:
        (tmp_path / "data" / "reference" / "gpu.env.json").write_text(json.dumps(env))
    return tmp_path


def test_levels_from_claims_and_reference_runs(tmp_path):
    lesson = 'if cu.gpu_section("50.a"):\n    pass\nif cu.gpu_section("50.b", needs=("x",)):\n    pass\n'
    lesson += "if gpu_section('50.c'):\n    pass\n"
    contract = 'COVERS = {"50.a": "checks a"}\nNOT_TESTABLE = {"50.b": "needs the hardware"}\n'
    root = _tree(tmp_path, lesson, contract, {"gpu": "H200", "date": "2026-12-01", "sections_ran": ["50.c"]})
    got = {r.section: (r.level, r.detail) for r in gpu_levels.levels(root)}
    assert got["50.a"][0] == "contract-tested" and "checks a" in got["50.a"][1]
    assert got["50.b"] == ("unverified", "not contract-testable: needs the hardware (`tests/gpu_contract/test_l50.py`)")
    assert got["50.c"][0] == "executed" and "H200" in got["50.c"][1]
    table = gpu_levels.table(gpu_levels.levels(root))
    assert "3 GPU-only sections" in table and "1 executed" in table


def test_unclaimed_and_stale_and_non_literal_keys_are_caught(tmp_path):
    root = _tree(tmp_path, 'cu.gpu_section("50.a")\n', 'COVERS = {"50.gone": "x"}\n')
    assert gpu_levels.levels(root)[0].detail == "no contract test names it"
    assert gpu_levels.stale_claims(root) == ["50.gone"]
    (root / "lessons" / "50_demo.py").write_text("key = '50.a'\ncu.gpu_section(key)\n")
    with pytest.raises(ValueError, match="literal key"):
        gpu_levels.lesson_sections(root)


def test_render_readme_needs_markers():
    with pytest.raises(ValueError, match="markers"):
        gpu_levels.render_readme("no table here", [])
