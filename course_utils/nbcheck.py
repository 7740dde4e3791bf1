"""Keep notebooks clean: no outputs, the course kernel, and no drift from their text copies.

Each notebook ``notebooks/NN_slug.ipynb`` is paired (jupytext) with ``lessons/NN_slug.py`` in percent
format, the copy reviewed in pull requests. ``make notebooks`` regenerates the notebooks from the text
copies; ``python -m course_utils.nbcheck`` (run by the tests) fails on outputs, execution counts, a
non-course kernel, a missing pair, or cells that differ between the pair.
"""

from __future__ import annotations

import hashlib
import sys
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


def build_notebooks(root: Path = ROOT, only: list[str] | None = None) -> list[Path]:
    """Write ``notebooks/NN.ipynb`` from ``lessons/NN.py`` (all, or the lesson numbers in ``only``)."""
    import jupytext

    written = []
    for text in sorted((root / "lessons").glob("*.py")):
        if only and text.stem.split("_")[0] not in only:
            continue
        nb = jupytext.read(text)
        nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": KERNEL_DISPLAY, "language": "python"}
        nb.metadata.pop("jupytext", None)
        for i, cell in enumerate(nb.cells):
            cell.id = hashlib.sha1(f"{text.stem}:{i}".encode()).hexdigest()[:8]  # stable ids: clean diffs
            tags = cell.metadata.get("tags")
            cell.metadata = {"tags": list(tags)} if tags else {}  # tags mark cells the test suites execute
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        out = root / "notebooks" / f"{text.stem}.ipynb"
        out.parent.mkdir(exist_ok=True)
        nbformat.write(nb, out)
        written.append(out)
    return written


def main() -> int:
    if "--build" in sys.argv:
        only = [a for a in sys.argv[1:] if a.isdigit()]
        for path in build_notebooks(only=only or None):
            print(f"wrote {path.relative_to(ROOT)}")
    problems = check_all()
    for p in problems:
        print(p)
    print("notebooks clean" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
