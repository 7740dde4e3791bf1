"""No dead code in the course's packages: every public function and class of ``course_utils``, ``course_checks``
and ``fakegpu`` has a caller.

A public name (a top-level ``def``/``class`` without a leading underscore, in every module and subpackage) must be
used in a lesson (``lessons/*.py``), a script (``scripts/*.py``) or one of the three packages, apart from its own
definition; tests do not count (a function only its test calls is dead weight a learner still has to read past).
Uses are read from the code (names, attributes, imports, and string constants that are exactly the name, such as
the package's lazy shortcuts), never from comments or prose. A file other than the defining module counts only
when it also names that module (``cu.sweep.knee``, ``from .sweep import knee``): a lesson's own variable
``knee`` is not a call of ``sweep.knee``. A reference solution registered with ``@exercise("NN.slug", ...)`` is
used when a lesson names its key. Code exported from a lesson (``from_lessons/lNN_slug.py``) is used when that
lesson calls it (the lesson's cells are the same code).

:data:`ALLOWED` lists the names that have no caller yet in modules this test's author does not own, each with the
owner who removes it (or gives it a caller); the list only shrinks: a listed name that has found a caller, or no
longer exists, fails the test so that the entry is deleted.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [ROOT / name for name in ("course_utils", "course_checks", "fakegpu")]

# Called by the learner by hand (named in prose and in every exercise's hint), not by course code.
LEARNER_API = {"course_checks/exercises.py:show_solution"}

# Dead names in modules owned by others, until the owner removes them (or gives them a caller). The lead empties
# this list; it must never grow.
ALLOWED: dict[str, str] = {
    # "module.py:name": "owner",
    # called from the source l13 generates for the served worker (a string this test cannot see)
    "course_checks/lesson_exercises/l13.py:observed_predict": "lesson_exercises/l13.py (generated code)",
}


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in pkg.rglob("*.py") if "__pycache__" not in p.parts)


def _key(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _stem(module: str) -> str:
    """The name a user of ``module`` writes: ``sweep`` for ``sweep.py``, ``standins`` for ``standins/__init__.py``."""
    parts = module.removesuffix(".py").split("/")
    return parts[-2] if parts[-1] == "__init__" and len(parts) > 1 else parts[-1]


def _exercise_key(node: ast.AST) -> str | None:
    """The key of an ``@exercise("NN.slug", ...)`` decorator on ``node``, if any."""
    for dec in getattr(node, "decorator_list", []):
        if isinstance(dec, ast.Call) and getattr(dec.func, "id", getattr(dec.func, "attr", "")) == "exercise":
            if dec.args and isinstance(dec.args[0], ast.Constant) and isinstance(dec.args[0].value, str):
                return dec.args[0].value
    return None


def public_definitions() -> list[tuple[str, str, ast.AST]]:
    """(module key, name, node) of every top-level public def/class of the package."""
    out = []
    for path in _modules():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not node.name.startswith(
                "_"
            ):
                out.append((_key(path), node.name, node))
    return out


def used_names(source: str, skip: ast.AST | None = None) -> list[str]:
    """Every name the code uses (names, attributes, imported names, identifier-like string constants).

    ``skip``: a definition whose own name does not count (its body's uses of other names do).
    """
    tree = ast.parse(source)
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append(node.id)
        elif isinstance(node, ast.Attribute):
            out.append(node.attr)
        elif isinstance(node, ast.alias):
            out.extend(node.name.split("."))
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.extend(node.module.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # "measure" (a lazy shortcut) or ":ClassName" (a class loaded from "path/to/file.py:ClassName")
            # or "l13_digits_api.py" (a module loaded from its file)
            m = re.fullmatch(r"[:.]?([A-Za-z_]\w*)", node.value) or re.fullmatch(r"([A-Za-z_]\w*)\.py", node.value)
            if m:
                out.append(m.group(1))
    return out


def _lesson_sources() -> list[tuple[str, str]]:
    lessons = sorted(p for p in ROOT.glob("lessons/*.py") if not p.name.startswith("_"))  # not _template.py
    files = lessons + sorted(ROOT.glob("scripts/*.py"))
    return [(p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")) for p in files]


def dead_names() -> list[str]:
    """``module:name`` of every public definition without a caller."""
    lesson_text = ""
    uses: dict[str, set[str]] = {}
    for name, text in _lesson_sources():
        uses[name] = set(used_names(text))
        lesson_text += text
    per_module = {_key(p): p.read_text(encoding="utf-8") for p in _modules()}
    module_uses = {k: used_names(v) for k, v in per_module.items()}
    uses.update({k: set(v) for k, v in module_uses.items()})
    dead = []
    for module, name, node in public_definitions():
        key = _exercise_key(node)
        if key is not None:
            if not re.search(r"""["']""" + re.escape(key) + r"""["']""", lesson_text):
                dead.append(f"{module}:{name}")
            continue
        stem = _stem(module)
        if any(name in used and stem in used for f, used in uses.items() if f != module):
            continue
        # code exported from a lesson's cells (from_lessons/lNN_slug.py): the lesson that wrote it calls it there
        if module.startswith("course_utils/from_lessons/l") and name in uses.get(f"lessons/{stem[1:]}.py", set()):
            continue
        # its own module: uses other than the definition itself (a recursive call does not count either)
        own = module_uses[module].count(name)
        inside = sum(1 for n in used_names(ast.unparse(node)) if n == name)
        if own - inside > 0:
            continue
        dead.append(f"{module}:{name}")
    return dead


def test_every_public_function_has_a_caller():
    dead = [d for d in dead_names() if d not in ALLOWED and d not in LEARNER_API]
    assert not dead, (
        f"{len(dead)} public name(s) of the course's packages have no caller in a lesson, a script or a package: "
        f"{dead}. Remove them (and their tests), or make them private (_name) if only their module uses them."
    )


def test_the_allow_list_only_shrinks():
    dead = set(dead_names())
    stale = [k for k in ALLOWED if k not in dead]
    assert not stale, f"these entries of ALLOWED have a caller now or are gone: delete them from the list: {stale}"


def test_the_finder_finds_a_planted_dead_function(tmp_path, monkeypatch):
    pkg = tmp_path / "course_utils"
    (pkg / "sub").mkdir(parents=True)
    (tmp_path / "lessons").mkdir()
    (tmp_path / "scripts").mkdir()
    (pkg / "a.py").write_text(
        "def used_by_lesson():\n    pass\n\n\ndef dead():\n    return dead()\n\n\n"
        "def helper():\n    pass\n\n\ndef user():\n    helper()\n\n\nclass _Private:\n    pass\n"
    )
    (pkg / "sub" / "b.py").write_text(
        "from ..a import user\n\n\n@exercise('99.used', 'p', None)\ndef sol():\n    pass\n\n\n"
        "@exercise('99.unused', 'p', None)\ndef sol2():\n    pass\n\n\nclass Lonely:\n    '''dead too'''\n"
    )
    (tmp_path / "lessons" / "99_x.py").write_text(
        "# used_by_lesson is named in a comment only here, so it does not count\n"
        "import course_utils as cu\ncu.a.used_by_lesson()\ncu.exercises.check('99.used', f)\n# Lonely\n"
    )
    (pkg / "sweepy.py").write_text("def knee():\n    pass\n")
    (tmp_path / "scripts" / "s.py").write_text("knee = 3  # a variable of the same name, not a call of sweepy.knee\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGES", [pkg])
    assert sorted(dead_names()) == [f"course_utils/{n}" for n in ("a.py:dead", "sub/b.py:Lonely", "sub/b.py:sol2",
                                                                   "sweepy.py:knee")]  # fmt: skip
