"""The floor plan of the course's three packages: every import points down, and no file takes another's private names.

Three packages, one audience each, lowest first: ``fakegpu`` (the CPU stand-in of CUDA: it imports nothing from the
rest of the course), ``course_utils`` (the bench a learner reads) and ``course_checks`` (the exercise checkers and
their answer keys). Inside ``course_utils`` each module belongs to a room, its folder (``course_utils`` itself is the
package's face); ``course_checks/lesson_exercises`` is a room above the checker machinery. :data:`FLOORS` lists the
rooms lowest first; a module may import its own room and the rooms below it, never one above (imports inside
functions count: they are read from the source as text, as ``farm-studio look`` reads them). The face imports
nothing itself (``cu.<name>`` loads a module by name on first use, ``cu.exercises`` included), so it stands on the
ground of its package and any room above may import it; modules loaded by name (``importlib.import_module``: the
face, the exercise registry) are not imports here.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the three packages, lowest first
PACKAGE_NAMES = ("fakegpu", "course_utils", "course_checks")
PACKAGES = [ROOT / name for name in PACKAGE_NAMES]
#: the most lines of hand-written Python the bench (course_utils) may hold: the package a learner reads stays small.
#: course_utils/from_lessons is not counted: it is the lessons' own cells (tagged export), read in the lessons.
BENCH_MAX_LINES = 7500

#: the rooms, lowest first: what each needs stands below it
FLOORS = [
    "fakegpu",  # the fake GPU (stand-ins, streamcheck): its own "is there a real GPU" switch, nothing else
    "course_utils",  # the bench's face: imports nothing
    "course_utils/supply",  # switches, paths, models, data, errors: the ground
    "course_utils/measuring",  # device, timer, comparisons (timed and of outputs)
    "course_utils/show",  # results, plots: reads the device's name
    "course_utils/serve",  # lesson 13's server, lesson 16's streaming load
    "course_utils/sections",  # a GPU section's life cycle: switches, the fake GPU, the device, the results folder
    "course_utils/techniques",  # what a later lesson reuses
    "course_utils/from_lessons",  # lesson cells tagged export: lesson 08's builder uses techniques
    "course_utils/capstone",  # lesson 14's optimize(): every technique, lesson 08's builder, the sections
    "course_checks",  # the exercise machinery: time limits, verdicts, the registry
    "course_checks/lesson_exercises",  # each lesson's exercise checkers: may use anything
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    """The room of a module (``course_utils.show.plots`` -> ``course_utils/show``; ``fakegpu.standins.tensor`` ->
    ``fakegpu``; ``course_checks.lesson_exercises.l03`` -> ``course_checks/lesson_exercises``)."""
    package, *parts = module.split(".")
    if package == "fakegpu" or not parts:
        return package
    if package == "course_checks":
        return "course_checks/lesson_exercises" if parts[0] == "lesson_exercises" else package
    return f"{package}/{parts[0]}"


def _is_module(module: str) -> bool:
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _imports(path: Path) -> list[tuple[int, str, list[str], str]]:
    """(line, imported module, names taken from it, the statement as written) for every import of the course's
    packages in ``path``, at any depth; ``from pkg import sub`` of a submodule names the submodule."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGE_NAMES:
                    out.append((node.lineno, alias.name, [], f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] not in PACKAGE_NAMES:
                continue
            names = [a.name for a in node.names]
            text = f"from {'.' * node.level}{node.module or ''} import {', '.join(names)}"
            subs = [n for n in names if _is_module(f"{module}.{n}")]
            for sub in subs:
                out.append((node.lineno, f"{module}.{sub}", [], text))
            if len(subs) < len(names):
                out.append((node.lineno, module, [n for n in names if n not in subs], text))
    return out


def _files(packages: list[Path] | None = None) -> list[Path]:
    return sorted(p for pkg in (packages or PACKAGES) for p in pkg.rglob("*.py") if "__pycache__" not in p.parts)


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
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGE_NAMES:
                for alias in node.names:
                    if _is_module(f"{node.module}.{alias.name}"):
                        bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name.split(".")[0] in PACKAGE_NAMES:
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
        "supply/paths.py": "import course_checks.exercises\n",
        "show/__init__.py": "",
        "show/plots.py": "from course_utils.show import results\n",
        "show/results.py": "def _hidden():\n    from course_utils.show import plots\n",
    }
    for name, text in files.items():
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).write_text(text)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGES", [fake])
    (tmp_path / "course_checks").mkdir()
    (tmp_path / "course_checks" / "exercises.py").write_text("")
    for check, words in ((test_every_import_points_down, "runs up from course_utils/supply to course_utils/show"),
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


def test_three_packages_and_the_bench_stays_small():
    """The course is three packages, and the one a learner reads holds at most BENCH_MAX_LINES lines of Python."""
    for pkg in PACKAGES:
        assert (pkg / "__init__.py").is_file(), f"{pkg.name}/__init__.py is missing: the course is three packages"
    hand_written = [p for p in _files([ROOT / "course_utils"]) if "from_lessons" not in p.parts]
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in hand_written)
    assert lines <= BENCH_MAX_LINES, (
        f"course_utils holds {lines} lines of Python, more than {BENCH_MAX_LINES}: the bench is what a learner reads. "
        "Checker code belongs in course_checks, stand-in code in fakegpu, single-lesson code in its lesson's cells."
    )


def test_the_stand_ins_import_nothing_from_the_course():
    """fakegpu stands at the bottom: not even course_utils' switches (it has its own real_gpu.no_real_gpu)."""
    found = [f"{p.relative_to(ROOT)}:{line}: {text}" for p in _files([ROOT / "fakegpu"])
             for line, module, _, text in _imports(p) if module.split(".")[0] != "fakegpu"]  # fmt: skip
    assert not found, "fakegpu imports the course:\n" + "\n".join(found)


def test_checking_one_exercise_loads_only_its_lessons_checkers():
    """``cu.exercises.get("03.max-wait")`` loads lesson 03's checkers and the shared helpers, no other lesson's;
    ``registry()`` loads them all."""
    code = (
        "import sys, course_utils as cu\n"
        "cu.exercises.get('03.max-wait')\n"
        "print(sorted(m.rpartition('.')[2] for m in sys.modules if m.startswith('course_checks.lesson_exercises.')))\n"
        "print(sorted(k[:2] for k in cu.exercises.registry()) and 'all')\n"
        "print(len({m for m in sys.modules if m.startswith('course_checks.lesson_exercises.l')}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    one, _, everything = out.stdout.splitlines()
    lessons = {name for name in eval(one) if name.startswith("l") and name[1:3].isdigit()}
    assert lessons == {"l03"}, f"checking 03.max-wait loaded {sorted(lessons)}"
    n_files = len([p for p in (ROOT / "course_checks" / "lesson_exercises").glob("l[0-9][0-9]*.py")])
    assert int(everything) == n_files, (everything, n_files)
