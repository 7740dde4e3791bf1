"""Keep notebooks clean: no outputs, the course kernel, and no drift from their text copies.

Each notebook ``notebooks/NN_slug.ipynb`` is paired (jupytext) with ``lessons/NN_slug.py`` in percent
format, the copy reviewed in pull requests. ``make notebooks`` regenerates the notebooks from the text
copies; ``python -m scripts.nbcheck`` (run by the tests) fails on outputs, execution counts, a
non-course kernel, a missing pair, or cells that differ between the pair.

A developer tool, not part of the shipped ``course_utils`` package. ``make notebooks`` never erases work:
a notebook whose cells match neither its text copy nor the committed text copy (someone edited the
notebook itself) is left alone unless ``FORCE=1``, and then it is backed up under build/notebook-backups/.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
KERNEL_NAME = "gpu-inference-course"
KERNEL_DISPLAY = "GPU inference course"


def check_notebook(path: Path) -> list[str]:
    """Problems with one stored notebook: outputs, execution counts, kernelspec."""
    nb = nbformat.read(path, as_version=4)
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            if cell.get("outputs"):
                problems.append(f"{path.name} cell {i}: has stored outputs (run `make notebooks` or nbstripout)")
            if cell.get("execution_count") is not None:
                problems.append(f"{path.name} cell {i}: has an execution count")
    kernel = nb.metadata.get("kernelspec", {}).get("name")
    if kernel != KERNEL_NAME:
        problems.append(f"{path.name}: kernelspec '{kernel}', expected '{KERNEL_NAME}'")
    return problems


def _cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def check_pair(ipynb: Path, text: Path) -> list[str]:
    """Problems between a notebook and its jupytext text copy (cell types and sources must match)."""
    import jupytext

    a, b = _cells(jupytext.read(ipynb)), _cells(jupytext.read(text))
    if a == b:
        return []
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return [f"{ipynb.name} and {text.name} differ at cell {i}: run `make notebooks` after editing {text.name}"]
    return [f"{ipynb.name} has {len(a)} cells, {text.name} has {len(b)}: run `make notebooks`"]


def check_all(root: Path = ROOT) -> list[str]:
    """Check every notebook in ``notebooks/`` and its pair in ``lessons/``."""
    problems = []
    notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    texts = sorted((root / "lessons").glob("*.py"))
    nb_stems, text_stems = {p.stem for p in notebooks}, {p.stem for p in texts}
    for stem in sorted(nb_stems ^ text_stems):
        problems.append(f"{stem}: notebook and text copy must both exist (notebooks/{stem}.ipynb, lessons/{stem}.py)")
    for nb in notebooks:
        problems += check_notebook(nb)
        text = root / "lessons" / f"{nb.stem}.py"
        if text.exists():
            problems += check_pair(nb, text)
    return problems


def _from_text(text: str | Path, stem: str):
    """The notebook built from a lesson's text copy (a path, or the text itself): no outputs, course kernel."""
    import jupytext

    nb = jupytext.read(text) if isinstance(text, Path) else jupytext.reads(text, fmt="py:percent")
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": KERNEL_DISPLAY, "language": "python"}
    nb.metadata.pop("jupytext", None)
    for i, cell in enumerate(nb.cells):
        cell.id = hashlib.sha1(f"{stem}:{i}".encode()).hexdigest()[:8]  # stable ids: clean diffs
        tags = cell.metadata.get("tags")
        cell.metadata = {"tags": list(tags)} if tags else {}  # tags mark cells the test suites execute
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def _committed_text(root: Path, text: Path) -> str | None:
    """The text copy as committed in git (None outside a checkout or for a new lesson)."""
    rel = text.relative_to(root).as_posix()
    out = subprocess.run(["git", "-C", str(root), "show", f"HEAD:{rel}"], capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def _digest(cells: list[tuple[str, str]]) -> str:
    return hashlib.sha1(repr(cells).encode()).hexdigest()


def _build_record(root: Path, stem: str) -> Path:
    return root / "build" / "notebook-builds" / f"{stem}.sha1"


def notebook_edits(root: Path, text: Path) -> bool:
    """True when ``notebooks/<stem>.ipynb`` was edited by hand (cells added or changed in Jupyter).

    Its cells then match none of: a build of the text copy, a build of the committed text copy, and the last
    build ``make notebooks`` wrote here. Rebuilding it would erase those edits.
    """
    target = root / "notebooks" / f"{text.stem}.ipynb"
    if not target.exists():
        return False
    current = _cells(nbformat.read(target, as_version=4))
    if current == _cells(_from_text(text, text.stem)):
        return False
    record = _build_record(root, text.stem)
    if record.exists() and record.read_text().strip() == _digest(current):
        return False
    committed = _committed_text(root, text)
    return committed is None or current != _cells(_from_text(committed, text.stem))


def build_notebooks(root: Path = ROOT, only: list[str] | None = None, *, force: bool = False) -> list[Path]:
    """Write ``notebooks/NN.ipynb`` from ``lessons/NN.py`` (all, or the lesson numbers in ``only``).

    A notebook with edits of its own (see :func:`notebook_edits`) is skipped with a message, or, with
    ``force``, backed up under build/notebook-backups/ before it is overwritten: nothing is lost.
    """
    written = []
    for text in sorted((root / "lessons").glob("*.py")):
        if only and text.stem.split("_")[0] not in only:
            continue
        out = root / "notebooks" / f"{text.stem}.ipynb"
        if notebook_edits(root, text):
            if not force:
                print(f"kept {out.relative_to(root)}: it has cells that lessons/{text.name} does not. Move those "
                      f"edits into lessons/{text.name} (the source), or run `make notebooks FORCE=1` to overwrite "
                      "it (a backup goes to build/notebook-backups/).")  # fmt: skip
                continue
            backup = root / "build" / "notebook-backups" / f"{text.stem}.{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
            backup.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(out, backup)
            print(f"backed up {out.relative_to(root)} to {backup.relative_to(root)}")
        out.parent.mkdir(exist_ok=True)
        nb = _from_text(text, text.stem)
        nbformat.write(nb, out)
        record = _build_record(root, text.stem)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(_digest(_cells(nb)))
        written.append(out)
    return written


def main() -> int:
    if "--build" in sys.argv:
        only = [a for a in sys.argv[1:] if a.isdigit()]
        for path in build_notebooks(only=only or None, force="--force" in sys.argv):
            print(f"wrote {path.relative_to(ROOT)}")
    problems = check_all()
    for p in problems:
        print(p)
    print("notebooks clean" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
