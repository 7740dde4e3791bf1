"""One place for paths: COURSE_RESULTS_DIR read the same way from any folder; no modes <-> results cycle.

Unusable COURSE_RESULTS_DIR values are refused before any folder is made, the error for an unwritable folder does
not suggest that folder, and reading results needs no write access (issue 24)."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

import course_utils
from course_utils.show import leaderboard, results
from course_utils.supply import data, paths
from course_utils.supply.errors import CourseError, SettingError

PACKAGE = Path(course_utils.__file__).parent


def test_tilde_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("COURSE_RESULTS_DIR", "~/course results")
    assert paths.results_dir() == tmp_path / "course results"
    assert (tmp_path / "course results").is_dir()


def test_relative_path_is_relative_to_the_repository_not_the_kernel_folder(monkeypatch, tmp_path):
    target = tmp_path / "rel"
    relative = os.path.relpath(target, paths.REPO_ROOT)  # e.g. ../../tmp/pytest-.../rel
    monkeypatch.setenv("COURSE_RESULTS_DIR", relative)
    for cwd in (paths.REPO_ROOT / "notebooks", tmp_path):
        monkeypatch.chdir(cwd)
        assert paths.results_dir() == target.resolve()
    assert paths.resolve_results_dir("") == paths.REPO_ROOT / "results"
    assert paths.resolve_results_dir("  ") == paths.REPO_ROOT / "results"


def test_unwritable_results_dir_names_the_variable(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(blocker / "results"))
    with pytest.raises(SettingError, match="COURSE_RESULTS_DIR") as info:
        results.record("99", "t", median_ms=1.0)
    assert isinstance(info.value, CourseError) and "export COURSE_RESULTS_DIR=" in str(info.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permissions")
def test_read_only_results_dir_names_the_variable(monkeypatch, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(ro))
    try:
        with pytest.raises(SettingError, match="COURSE_RESULTS_DIR"):
            paths.results_dir()
    finally:
        ro.chmod(0o700)


def test_path_with_spaces_works(monkeypatch, tmp_path):
    folder = tmp_path / "my results" / "run 1"
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(folder))
    results.record("99", "with spaces", median_ms=1.5)
    df = results.load_results()
    assert list(df["technique"]) == ["with spaces"] and next(folder.glob("*.csv"))


def test_append_text_adds_header_only_to_an_empty_file(tmp_path):
    f = tmp_path / "x.csv"
    for value in ("1\n", "2\n"):
        paths.append_text(f, lambda empty, v=value: ("h\n" if empty else "") + v)
    assert f.read_text() == "h\n1\n2\n"


def _imports(module: Path) -> set[str]:
    """Course modules (as ``room.module``) imported anywhere in ``module`` (also inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_utils."):
            name = node.module.removeprefix("course_utils.")
            if "." in name:
                out.add(".".join(name.split(".")[:2]))
            else:  # from course_utils.<room> import <module>
                out.update(f"{name}.{a.name}" for a in node.names)
    return out


def _modules() -> dict[str, Path]:
    """``room.module`` -> file, for every module of the package's room folders."""
    out = {}
    for p in PACKAGE.rglob("*.py"):
        rel = p.relative_to(PACKAGE).with_suffix("").parts
        if len(rel) >= 2 and rel[-1] != "__init__":
            out[".".join(rel[:2])] = p
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    return found


def test_no_import_cycles_in_the_package():
    graph: dict[str, set[str]] = {}
    for key, p in _modules().items():
        graph.setdefault(key, set()).update(_imports(p) - {key})
    assert "show.results" not in graph["supply.modes"] and "show.results" not in graph["supply.paths"]
    assert graph["supply.paths"] <= {"supply.errors"}, "paths must stay importable by every module"
    assert not _cycles(graph), f"import cycles: {_cycles(graph)}"


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"modes": {"results"}, "results": {"modes"}}) == [["modes", "results", "modes"]]


# Lesson 13's modules (another engineer's, mid-rewrite) still compute the root; the faults report asks for
# `from .paths import REPO_ROOT` there. Every other module must import it.
NOT_YET_MIGRATED: set[str] = set()


def test_one_repo_root_for_the_package():
    # a module two folders down (course_utils/<room>/x.py) reaches the repository root with parents[2]
    pattern = re.compile(r"__file__\)(\.resolve\(\))?\.(parent\.parent\.parent|parents\[2\])")
    computing = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if pattern.search(p.read_text())}
    extra = sorted(computing - NOT_YET_MIGRATED - {"supply/paths.py"})
    assert not extra, f"{extra} compute the repository root: use `from course_utils.supply.paths import REPO_ROOT`"
    assert "supply/paths.py" in computing
    assert results.REPO_ROOT is paths.REPO_ROOT

    assert data.DATA_DIR == paths.DATA_DIR == paths.REPO_ROOT / "data"


def test_append_text_ends_a_torn_last_line_first(tmp_path):
    f = tmp_path / "x.csv"
    f.write_text("h\n1\n2-torn")
    paths.append_text(f, lambda empty: ("h\n" if empty else "") + "3\n")
    assert f.read_text().splitlines() == ["h", "1", "2-torn", "3"]


@pytest.mark.parametrize(
    "value, words",
    [
        ("$SCRATCH_NOT_SET_24/results", "$SCRATCH_NOT_SET_24, which is not set"),
        ("${SCRATCH_NOT_SET_24}/results", "$SCRATCH_NOT_SET_24, which is not set"),
        ("~nosuchuser24/results", "'~nosuchuser24' names no user"),
        ("file:///tmp/course-results", "a URL, not a path: set a plain path such as '/tmp/course-results'"),
        ("'/tmp/course results'", "quote characters"),
        ('"/tmp/course results"', "quote characters"),
    ],
)
def test_unusable_results_dir_values_are_refused_before_any_folder_is_made(monkeypatch, value, words):
    monkeypatch.delenv("SCRATCH_NOT_SET_24", raising=False)
    before = set(paths.REPO_ROOT.iterdir())
    monkeypatch.setenv("COURSE_RESULTS_DIR", value)
    with pytest.raises(SettingError, match="COURSE_RESULTS_DIR") as info:
        results.record("99", "t", median_ms=1.0)
    assert words in str(info.value)
    assert set(paths.REPO_ROOT.iterdir()) == before, "a folder was created inside the checkout"


def test_the_error_for_an_unwritable_folder_does_not_suggest_that_folder(monkeypatch, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "course-results").write_text("a file where the folder should be")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("COURSE_RESULTS_DIR", "~/course-results")
    with pytest.raises(SettingError) as info:
        paths.results_dir()
    message = str(info.value)
    assert "=~/course-results`" not in message and "export COURSE_RESULTS_DIR=" in message


def test_reading_results_needs_no_write_access(monkeypatch, tmp_path):
    folder = tmp_path / "ro"
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(folder))
    results.record("14", "baseline", median_ms=1.0)
    paths._writable.clear()

    def no_write(path):
        raise SettingError(f"the results folder {path} cannot be written")

    monkeypatch.setattr(paths, "_ensure_writable", no_write)  # root writes through chmod: refuse every write
    assert len(leaderboard.load(include_reference=False)) == 1
    assert len(results.load_results()) == 1
