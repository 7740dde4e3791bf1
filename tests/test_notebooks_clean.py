"""The stored notebooks are clean, use the course kernel, and match their text copies in lessons/."""

import shutil

import nbformat

from scripts import nbcheck


def test_repository_notebooks_are_clean():
    problems = nbcheck.check_all()
    assert not problems, "\n".join(problems)


def test_check_fails_on_a_notebook_with_outputs(tmp_path):
    src = sorted((nbcheck.ROOT / "notebooks").glob("*.ipynb"))[0]
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "lessons").mkdir()
    nb = nbformat.read(src, as_version=4)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", text="hello")]
    code.execution_count = 1
    nbformat.write(nb, tmp_path / "notebooks" / src.name)
    shutil.copy(nbcheck.ROOT / "lessons" / f"{src.stem}.py", tmp_path / "lessons")
    problems = nbcheck.check_all(tmp_path)
    assert any("stored outputs" in p for p in problems) and any("execution count" in p for p in problems)


def test_check_fails_on_drift_kernel_and_missing_pair(tmp_path):
    src = sorted((nbcheck.ROOT / "notebooks").glob("*.ipynb"))[0]
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "lessons").mkdir()
    nb = nbformat.read(src, as_version=4)
    nb.cells[0].source += "\nedited only in the notebook"
    nb.metadata["kernelspec"]["name"] = "python3"
    nbformat.write(nb, tmp_path / "notebooks" / src.name)
    shutil.copy(nbcheck.ROOT / "lessons" / f"{src.stem}.py", tmp_path / "lessons")
    (tmp_path / "lessons" / "99_orphan.py").write_text("# %%\nprint(1)\n")
    problems = "\n".join(nbcheck.check_all(tmp_path))
    assert "differ at cell 0" in problems and "kernelspec 'python3'" in problems and "99_orphan" in problems


def test_build_writes_clean_notebooks(tmp_path):
    (tmp_path / "lessons").mkdir()
    (tmp_path / "lessons" / "50_demo.py").write_text("# %% [markdown]\n# # Demo\n\n# %%\nx = 1\n")
    written = nbcheck.build_notebooks(tmp_path)
    assert [p.name for p in written] == ["50_demo.ipynb"]
    assert nbcheck.check_all(tmp_path) == []


def test_build_never_erases_cells_added_to_a_notebook(tmp_path, capsys):
    (tmp_path / "lessons").mkdir()
    text = tmp_path / "lessons" / "50_demo.py"
    text.write_text("# %% [markdown]\n# # Demo\n\n# %%\nx = 1\n")
    (nb_path,) = nbcheck.build_notebooks(tmp_path)
    text.write_text("# %% [markdown]\n# # Demo\n\n# %%\nx = 2\n")  # the source changed: rebuilding is fine
    assert nbcheck.build_notebooks(tmp_path) == [nb_path]
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("my_own_work = 42"))  # edited in Jupyter
    nbformat.write(nb, nb_path)
    assert nbcheck.build_notebooks(tmp_path) == []
    assert "my_own_work" in nb_path.read_text() and "FORCE=1" in capsys.readouterr().out
    assert nbcheck.build_notebooks(tmp_path, force=True) == [nb_path]
    (backup,) = (tmp_path / "build" / "notebook-backups").glob("50_demo.*.ipynb")
    assert "my_own_work" in backup.read_text() and "my_own_work" not in nb_path.read_text()


def test_tags_survive_the_build(tmp_path):
    (tmp_path / "lessons").mkdir()
    (tmp_path / "lessons" / "50_demo.py").write_text('# %% tags=["contract"]\ndef f():\n    return 1\n')
    (nb_path,) = nbcheck.build_notebooks(tmp_path)
    assert nbformat.read(nb_path, as_version=4).cells[0].metadata["tags"] == ["contract"]


def test_exported_cells_become_one_module_and_drift_is_caught(tmp_path):
    """Cells tagged export are written to course_utils/from_lessons/; an edit of either side without a rebuild fails."""
    (tmp_path / "lessons").mkdir()
    lesson = tmp_path / "lessons" / "98_demo.py"
    lesson.write_text(
        '# %% [markdown]\n# A demo lesson.\n\n# %% tags=["export"]\nimport math\n\n\ndef area(r):\n'
        "    return math.pi * r * r\n\n# %%\nprint(area(2.0))\n"
    )
    nbcheck.build_notebooks(tmp_path)
    (written,) = nbcheck.write_exports(tmp_path)
    assert written == tmp_path / "course_utils" / "from_lessons" / "l98_demo.py"
    namespace: dict = {}
    exec(written.read_text(), namespace)
    assert round(namespace["area"](1.0), 5) == 3.14159 and "print(" not in written.read_text()
    assert nbcheck.check_all(tmp_path) == []
    lesson.write_text(lesson.read_text().replace("r * r", "r ** 2"))
    nbcheck.build_notebooks(tmp_path)
    assert any("differs from the cells tagged export" in p for p in nbcheck.check_all(tmp_path))
    nbcheck.write_exports(tmp_path)
    assert nbcheck.check_all(tmp_path) == []
    written.write_text(written.read_text() + "\n# a hand edit\n")
    assert any("differs from the cells tagged export" in p for p in nbcheck.check_all(tmp_path))
