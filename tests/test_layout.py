"""The lab bench's floor plan: every import in course_utils points down, and no file takes another's private names.

Each module belongs to a room: its folder under ``course_utils/`` (``check/lesson_exercises/`` is a room of its own,
above ``check/``), or ``__init__`` for the package's face. :data:`FLOORS` lists the rooms lowest first; a module may
import its own room and the rooms below it, never one above (imports inside functions count: they are read from the
source as text, as ``farm-studio look course_utils`` reads them). The face imports nothing itself (``cu.<name>``
loads a module by name on first use), so it stands on the ground and any room may import it; modules loaded by name
(``importlib.import_module``: the face, the exercise registry) are not imports here.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "course_utils"

#: the rooms, lowest first: what each needs stands below it
FLOORS = [
    "__init__",  # the face: imports nothing
    "supply",  # switches, paths, models, data, errors: the ground
    "fakegpu",  # the fake GPU (stand-ins, streamcheck): the rehearsal switch comes from supply.modes
    "measuring",  # device, timer, comparisons
    "show",  # results, plots: reads the device's name
    "serve",  # lesson 13's server
    "check",  # output comparison and the exercise registry: knows whether a check is running (show.results)
    "sections",  # a GPU section's life cycle: switches, the fake GPU, the device, the results folder
    "techniques",  # what a later lesson reuses
    "from_lessons",  # lesson cells tagged export: lesson 08's builder uses techniques
    "capstone",  # lesson 14's optimize(): every technique, lesson 08's builder, the checks, the sections
    "check/lesson_exercises",  # each lesson's exercise checkers: may use anything
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    """The room of a module of course_utils (``course_utils.check.lesson_exercises.l03`` -> its own room)."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    if parts[:2] == ["check", "lesson_exercises"]:
        return "check/lesson_exercises"
    return parts[0]


def _is_module(module: str) -> bool:
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _imports(path: Path) -> list[tuple[int, str, list[str], str]]:
    """(line, imported module, names taken from it, the statement as written) for every import of course_utils
    in ``path``, at any depth; ``from pkg import sub`` of a submodule names the submodule."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "course_utils":
                    out.append((node.lineno, alias.name, [], f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "course_utils":
                continue
            names = [a.name for a in node.names]
            text = f"from {'.' * node.level}{node.module or ''} import {', '.join(names)}"
            subs = [n for n in names if _is_module(f"{module}.{n}")]
            for sub in subs:
                out.append((node.lineno, f"{module}.{sub}", [], text))
            if len(subs) < len(names):
                out.append((node.lineno, module, [n for n in names if n not in subs], text))
    return out


def _files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_room_has_a_floor():
    rooms = {_room(_module_name(p)) for p in _files()}
    assert rooms <= set(FLOORS), f"rooms without a floor in FLOORS: {sorted(rooms - set(FLOORS))}"
    assert len(FLOORS) == len(set(FLOORS))


def test_every_import_points_down():
    floor = {room: i for i, room in enumerate(FLOORS)}
    upward = []
    for path in _files():
        here = _room(_module_name(path))
        for line, module, _, text in _imports(path):
            there = _room(module)
            found = f"{path.relative_to(ROOT)}:{line}: `{text}` runs up from {here} to {there}"
            if floor[there] > floor[here] and found not in upward:
                upward.append(found)
    assert not upward, "imports from a lower room to a higher one:\n" + "\n".join(upward)


def test_no_circles_between_files():
    """Inside a room too, no files import each other in a loop (imports inside functions count)."""
    graph = {_module_name(p): {m for _, m, _, _ in _imports(p)} - {_module_name(p)} for p in _files()}
    state: dict[str, str] = {}
    circles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(path[path.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, "files that import each other in a loop:\n" + "\n".join(circles)


def test_no_file_takes_another_files_private_names():
    taken = []
    for path in _files():
        me = _module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        bound = {}  # local name -> course_utils module it stands for
        for line, module, names, text in _imports(path):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and module != me:
                taken.append(f"{path.relative_to(ROOT)}:{line}: `{text}` takes {', '.join(private)}")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_utils"):
                for alias in node.names:
                    if _is_module(f"{node.module}.{alias.name}"):
                        bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name.startswith("course_utils"):
                        bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and node.attr.startswith("_") and not node.attr.startswith("__")):  # fmt: skip
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                taken.append(f"{where}: `{node.value.id}.{node.attr}` of {bound[node.value.id]}")
    assert not taken, "private names used across files:\n" + "\n".join(taken)


def test_the_checks_find_planted_faults(tmp_path, monkeypatch):
    """The reading above finds what it must: an import inside a function that runs up, a private name taken, and
    two files that import each other (one of them inside a function)."""
    fake = tmp_path / "course_utils"
    files = {
        "__init__.py": "",
        "supply/__init__.py": "",
        "supply/modes.py": "def f():\n    from course_utils.show.results import _hidden\n\n    return _hidden\n",
        "show/__init__.py": "",
        "show/plots.py": "from course_utils.show import results\n",
        "show/results.py": "def _hidden():\n    from course_utils.show import plots\n",
    }
    for name, text in files.items():
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).write_text(text)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    for check, words in ((test_every_import_points_down, "runs up from supply to show"),
                         (test_no_file_takes_another_files_private_names, "takes _hidden"),
                         (test_no_circles_between_files, "course_utils.show.plots -> course_utils.show.results -> "
                                                         "course_utils.show.plots")):  # fmt: skip
        try:
            check()
        except AssertionError as exc:
            assert words in str(exc), str(exc)
            assert "circles" in check.__name__ or "course_utils/supply/modes.py:2" in str(exc), str(exc)
        else:
            raise AssertionError(f"{check.__name__} missed the planted fault")
