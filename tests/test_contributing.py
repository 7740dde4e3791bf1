"""CONTRIBUTING.md and lessons/_template.py hold: every lesson has the template's fixed parts, the template has
them all (and runs), `make test-lesson` does what the guide says, and every COURSE_* variable is in the guide.

The fixed parts (CONTRIBUTING.md, "Add a lesson" step 1): the title ``# # NN · Title``; **Goals.** and **The
bottleneck it attacks** before the first ``## `` heading; the headings "What surprised us" and "Exercise...";
"Summary..." as the last heading, with a "Next:" line after it. Lessons that lack a part today are listed below
with the reason; each list fails when a lesson in it gains the part, so the lists only shrink.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))
TEMPLATE = ROOT / "lessons" / "_template.py"
GUIDE = ROOT / "CONTRIBUTING.md"

SURPRISED = "## What surprised us"
NEXT = "Next: after the Summary"
# Lessons without "What surprised us" yet (someone is adding it): remove a lesson once it has the heading.
KNOWN_MISSING: set[str] = set()
# Lessons whose Summary does not name the next lesson yet; the last lesson has none to name.
NO_NEXT_YET: set[str] = set()
# By design: 00 comes before the taxonomy and 01 defines it, so neither attacks one bottleneck.
NO_BOTTLENECK = {"00", "01"}
# Names the tests make up to exercise the switch and path parsers: no variable of the course.
MADE_UP = {"COURSE_NO_SUCH_VAR", "COURSE_TEST_OPT", "COURSE_TEST_UNSET"}


def missing_parts(text: str, number: str) -> list[str]:
    """The template's fixed parts that ``text`` (a lesson numbered ``number``, or "NN") lacks, by name."""
    missing = []
    titles = re.findall(r"^# # (.*)$", text, re.M)
    if not titles or not re.match(rf"{number} · \S", titles[0]):
        missing.append(f"# # {number} · Title")
    first = re.search(r"^# ## ", text, re.M)
    intro = text[: first.start()] if first else text
    for part in ("**Goals.**", "**The bottleneck"):
        if part not in intro:
            missing.append(f"{part} (before the first ## heading)")
    headings = re.findall(r"^# (## .*?)\s*$", text, re.M)
    if SURPRISED not in headings:
        missing.append(SURPRISED)
    if not any(h.startswith("## Exercise") for h in headings):
        missing.append("## Exercise")
    if not headings or not headings[-1].startswith("## Summary"):
        missing.append("## Summary (the last heading)")
    elif "Next:" not in text[text.rindex("\n# " + headings[-1]) :]:
        missing.append(NEXT)
    return missing


def expected_gaps(number: str) -> set[str]:
    gaps = set()
    if number in KNOWN_MISSING:
        gaps.add(SURPRISED)
    if number in NO_NEXT_YET or number == LESSONS[-1].name[:2]:
        gaps.add(NEXT)
    if number in NO_BOTTLENECK:
        gaps.add("**The bottleneck (before the first ## heading)")
    return gaps


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_lesson_has_the_templates_parts(lesson):
    number = lesson.name[:2]
    missing = [m for m in missing_parts(lesson.read_text(), number) if m not in expected_gaps(number)]
    assert not missing, f"{lesson.name} lacks {missing} (the shape of lessons/_template.py, CONTRIBUTING.md)"


def test_the_known_gaps_are_still_gaps():
    """Each listed lesson still lacks its part: once it has it, the list must lose it (so the lists shrink)."""
    by_number = {p.name[:2]: p for p in LESSONS}
    listed = {SURPRISED: KNOWN_MISSING, NEXT: NO_NEXT_YET - {LESSONS[-1].name[:2]}}
    stale = []
    for part, numbers in listed.items():
        for n in sorted(numbers):
            if n in by_number and part not in missing_parts(by_number[n].read_text(), n):
                stale.append(f"lesson {n} has {part!r} now: remove it from the list in tests/test_contributing.py")
            elif n not in by_number:
                stale.append(f"lesson {n} is listed but lessons/{n}_*.py does not exist")
    assert not stale, "\n".join(stale)
    warnings.warn(f"lessons still without {SURPRISED!r}: {sorted(KNOWN_MISSING)}; without a Next: line: "
                  f"{sorted(NO_NEXT_YET)}", UserWarning, stacklevel=1)  # fmt: skip


def test_missing_parts_names_each_part():
    assert missing_parts(TEMPLATE.read_text(), "NN") == []
    bare = "# %% [markdown]\n# # 42 · Demo\n# ## Exercise\n# ## Summary\n"
    assert missing_parts(bare, "42") == [
        "**Goals.** (before the first ## heading)",
        "**The bottleneck (before the first ## heading)",
        SURPRISED,
        NEXT,
    ]
    assert missing_parts(bare.replace("42 ·", "43 ·"), "42")[0] == "# # 42 · Title"
    assert "## Summary (the last heading)" in missing_parts(bare + "# ## More\n", "42")


def test_the_template_has_every_part_runs_and_is_no_lesson(tmp_path):
    assert missing_parts(TEMPLATE.read_text(), "NN") == []
    env = {**os.environ, "COURSE_RESULTS_DIR": str(tmp_path / "results")}
    proc = subprocess.run(
        [sys.executable, str(TEMPLATE)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "template:" in proc.stdout and list(tmp_path.iterdir()) == []  # it only prints
    from scripts import nbcheck

    assert TEMPLATE not in nbcheck.lesson_texts() and len(nbcheck.lesson_texts()) == len(LESSONS)


def _make(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("no make on PATH")
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "LESSON"}}
    return subprocess.run(["make", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_make_test_lesson_names_the_lessons_tests():
    proc = _make("-n", "test-lesson", "LESSON=00")
    assert proc.returncode == 0, proc.stderr
    (notebook,) = (ROOT / "notebooks").glob("00_*.ipynb")
    parts = [f"notebooks/{notebook.name}", "--nbmake", "tests/test_lessons_as_scripts.py", '-k "00_']
    parts += ["tests/test_exercises_l00.py", "COURSE_SMOKE=1", "COURSE_RESULTS_DIR=", "OMP_NUM_THREADS="]
    for part in parts:
        assert part in proc.stdout, f"`make -n test-lesson LESSON=00` does not name {part}:\n{proc.stdout}"


@pytest.mark.parametrize("args", [[], ["LESSON=99"], ["LESSON=3"], ["LESSON=_template"]])
def test_make_test_lesson_without_a_lesson_prints_its_usage(args):
    proc = _make("test-lesson", *args)
    assert proc.returncode != 0
    assert "usage: make test-lesson LESSON=03" in proc.stdout + proc.stderr


def test_every_course_variable_is_in_the_guide():
    files = [ROOT / "Makefile"]
    for folder in ("course_utils", "course_checks", "fakegpu", "scripts", "lessons", "tests"):
        files += sorted((ROOT / folder).rglob("*.py"))
    names = set()
    for path in files:
        if path != Path(__file__).resolve():
            names |= set(re.findall(r"COURSE_[A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8")))
    guide = GUIDE.read_text()
    missing = sorted(n for n in names - MADE_UP if f"`{n}`" not in guide)
    assert not missing, f"CONTRIBUTING.md's Switches do not name {missing}"


# ---- CONTRIBUTING.md's "Add a lesson", followed on a copy of the repository with a toy lesson 18 ----------------
TOY_LESSON = """# ---
# jupyter:
#   kernelspec:
#     display_name: GPU inference course
#     language: python
#     name: gpu-inference-course
# ---

# %% [markdown]
# # 18 · Toy lesson
#
# **Goals.** A toy lesson the contributor's test adds: it doubles a tensor.
#
# **The bottleneck it attacks** (*01 · Measuring inference*, the taxonomy): none, it is a toy.

# %%
import torch

import course_utils as cu

device = cu.lesson.start("18", "Toy lesson")
x = torch.arange(4.0)
print("doubled:", (2 * x).tolist())

# %% [markdown]
# ## On a GPU

# %%
if cu.gpu_section("18.toy-gpu", why="The toy section needs a CUDA GPU."):
    g = torch.arange(4.0, device="cuda")
    print("doubled on the GPU:", (2 * g).cpu().tolist())

# %% [markdown]
# ## What surprised us
# Nothing: it is a toy.
#
# ## Exercise
# **18.double.** Return twice n.


# %%
def double(n):
    raise NotImplementedError  # your code here


cu.exercises.check("18.double", double)

# %% [markdown]
# ## Summary
# A toy.
#
# Next: **19 · None**.
"""

TOY_EXERCISE = '''"""Lesson 18's exercise (a toy the contributor's test adds)."""

from course_checks.exercises import exercise
from course_checks.lesson_exercises.observe import cases


def _check_double(fn):
    with cases("18.double") as c:
        n = c.randint(-50, 50)
        got = fn(n)
        assert got == 2 * n, f"double({n}) should be {2 * n}, got {got}"


@exercise("18.double", "Return twice n.", _check_double, time_limit=30)
def double(n):
    return 2 * n
'''

TOY_EXERCISE_TESTS = """from course_checks import exercises


def test_18_double():
    assert exercises.verdict("18.double", exercises.get("18.double").solution, seed=1) == "accepted"
    assert "should be" in exercises.verdict("18.double", lambda n: n, seed=1)
"""

# The checks that run over every lesson, each of which must see a new lesson (test ids or failure messages).
PER_LESSON_CHECKS = [
    "tests/test_contributing.py::test_every_lesson_has_the_templates_parts",
    "tests/test_key_calls.py",
    "tests/test_ratio_prints.py",
    "tests/test_exercise_cells.py",
    "tests/test_exercises.py::test_every_exercise_has_its_lessons_tests",
    "tests/test_readme_bench.py::test_readme_lists_every_exercise",
    "tests/test_notebooks_clean.py::test_repository_notebooks_are_clean",
    "tests/test_rehearsal.py::test_every_gpu_section_body_lies_within_one_cell",
    "tests/test_lessons_as_scripts.py::test_every_lesson_has_its_expected_sections",
]


def _copy_of_the_repository(dest: Path) -> Path:
    """The tracked files of this checkout (as they are in the work tree) copied to ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    for name in listed.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def _in_copy(repo: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER"}}
    env.update(PYTHONPATH=str(repo), COURSE_SMOKE="1", COURSE_RESULTS_DIR=str(repo / "build" / "results"))
    return subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_new_lesson_is_seen_by_every_per_lesson_check(tmp_path):
    repo = _copy_of_the_repository(tmp_path / "repo")
    where = _in_copy(
        repo,
        "-c",
        "import course_utils, course_checks, fakegpu, scripts as s\n"
        "print(course_utils.__file__, course_checks.__file__, fakegpu.__file__, s.__file__)",
    )
    assert where.returncode == 0 and where.stdout.count(str(repo)) == 4, where.stdout + where.stderr

    # Step 1: the lesson, its notebook. Step 3: its exercise and the exercise's tests.
    (repo / "lessons" / "18_toy.py").write_text(TOY_LESSON)
    (previous,) = [p for p in sorted((repo / "lessons").glob("[0-9][0-9]_*.py")) if p.name < "18"][-1:]
    text = previous.read_text()  # the lesson before the new one names it in its Summary's Next: line
    at = text.rindex("\n# ## Summary") + 1
    at = text.index("\n", at) + 1
    previous.write_text(text[:at] + "# Next: **18 · Toy lesson**.\n#\n" + text[at:])
    # --force: the copy is no git checkout, so the build cannot tell an edit of the source from one of the notebook
    build = _in_copy(repo, "-m", "scripts.nbcheck", "--build", "18", previous.name[:2], "--force")
    assert "wrote notebooks/18_toy.ipynb" in build.stdout, build.stdout + build.stderr
    # "18_toy", not "18": a backup of lesson 17's notebook is named by the clock (17_...20261204-011825.ipynb)
    problems = [line for line in build.stdout.splitlines() if "18_toy" in line and not line.startswith("wrote ")]
    assert not problems and (repo / "notebooks" / "18_toy.ipynb").exists(), build.stdout + build.stderr
    (repo / "course_checks" / "lesson_exercises" / "l18.py").write_text(TOY_EXERCISE)
    (repo / "tests" / "test_exercises_l18.py").write_text(TOY_EXERCISE_TESTS)

    # Before steps 2, 4 and 5, the checks that need them fail and name the lesson or its exercise.
    before = _in_copy(repo, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *PER_LESSON_CHECKS)
    assert before.returncode != 0, before.stdout[-3000:]
    for needs in ("test_every_lesson_has_key_calls", "test_every_lesson_has_its_expected_sections",
                  "test_readme_lists_every_exercise"):  # fmt: skip
        assert f"{needs}" in before.stdout and "FAILED" in before.stdout, (needs, before.stdout[-3000:])
    assert "'18'" in before.stdout and "18.double" in before.stdout, before.stdout[-3000:]

    # Step 2: the key calls in docs/DESIGN.md. Step 4: EXPECTED. Step 5: README names the exercise.
    design = repo / "docs" / "DESIGN.md"
    text = design.read_text()
    end = text.index("```", text.index("```key-calls") + 3)
    design.write_text(text[:end] + "18  cu\\.gpu_section\\(\n18  2 \\* x\n" + text[end:])
    scripts_test = repo / "tests" / "test_lessons_as_scripts.py"
    text = scripts_test.read_text()
    scripts_test.write_text(text.replace("EXPECTED = {\n", 'EXPECTED = {\n    "18": {"18.toy-gpu": "completed"},\n', 1))
    readme = repo / "README.md"
    text = readme.read_text()
    readme.write_text(text.replace("**The exercises, by lesson**", "**The exercises, by lesson** (18 `18.double`)", 1))

    after = _in_copy(
        repo, "-m", "pytest", "-q", "-rA", "-p", "no:randomly", "-p", "no:cacheprovider", *PER_LESSON_CHECKS,
        "tests/test_exercises_l18.py", "--nbmake", "notebooks/18_toy.ipynb", "tests/test_lessons_as_scripts.py::"
        "test_lesson_runs_through_the_gpu_check_as_on_the_lent_machine[18_toy]",
    )  # fmt: skip
    assert after.returncode == 0, after.stdout[-4000:] + after.stderr[-2000:]
    for seen in ("18_toy", "[18]", "test_18_double", "18_toy.ipynb"):  # scanned, listed, run and rehearsed
        assert seen in after.stdout, (seen, after.stdout[-3000:])
    levels = _in_copy(repo, "-c", "from scripts.gpu_levels import lesson_sections; print(sorted(lesson_sections()))")
    assert "'18.toy-gpu'" in levels.stdout, levels.stdout + levels.stderr
