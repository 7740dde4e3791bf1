"""scripts/mutate.py does not rot: every planted bug still applies to the current sources, and one is caught."""

from __future__ import annotations

import shutil

from scripts import mutate


def test_every_mutation_applies_to_the_current_sources():
    problems = mutate.check_snippets()
    assert not problems, "update scripts/mutate.py:\n" + "\n".join(problems)
    assert len(mutate.MUTATIONS) >= 35
    issue = [m for m in mutate.MUTATIONS if m.source == "issue 22"]
    assert len(issue) >= 15, "every bug issue 22 lists is planted"
    wider = [m for m in mutate.MUTATIONS if m.source == "issue 32"]
    assert len(wider) >= 30 and len({m.file for m in wider}) >= 15, "issue 32: planted over many modules"
    fourth = [m for m in mutate.MUTATIONS if m.source == "issue 32 round 4"]
    assert len(fourth) >= 25 and len({m.file for m in fourth}) >= 12, "issue 32 round 4: modules no round targeted"
    assert len({m.id for m in mutate.MUTATIONS}) == len(mutate.MUTATIONS), "mutation ids are unique"
    roots = ("course_utils/", "course_checks/", "fakegpu/", "lessons/")  # the three packages and the lessons
    assert all(m.file.startswith(roots) and m.tests for m in mutate.MUTATIONS)


def test_a_stale_snippet_is_reported(tmp_path):
    (tmp_path / "course_utils").mkdir()
    (tmp_path / "course_utils" / "x.py").write_text("a = 1\n")
    stale = mutate.M("x", "x.py", "a = 2", "a = 3", "test_x.py", "nothing")
    problems = mutate.check_snippets(tmp_path, [stale])
    assert problems[0].startswith("x: snippet found 0 times") and "test file tests/test_x.py" in problems[1]


def test_one_mutation_is_caught_and_the_copy_is_restored():
    m = mutate.Mutation(
        "fp32-tolerance-100x-fast",
        "course_utils/measuring/outputs.py",
        (('"fp32": {"max_rel": 1e-4,', '"fp32": {"max_rel": 1e-2,'),),
        ("tests/test_compare.py::test_tolerance_values_are_the_documented_ones",),
        "compare: the FP32 tolerance loosened 100x",
    )
    work = mutate.make_copy()
    try:
        before = (work / m.file).read_text()
        caught, tail, _ = mutate.run_mutation(work, m, timeout=120)
        assert caught is True, tail
        assert (work / m.file).read_text() == before, "the mutation must be removed after its run"
        assert (mutate.ROOT / m.file).read_text() == before, "the working tree is never touched"
    finally:
        shutil.rmtree(work, ignore_errors=True)
