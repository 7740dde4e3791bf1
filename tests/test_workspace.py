"""Learning never dirties the sources: a lesson run and saved in the workspace leaves git and the checks clean.

`make lab` opens ``workspace/`` (git-ignored), a copy of ``notebooks/`` made on first run and never
overwritten. This test makes a workspace in a scratch folder with the same Makefile target, executes lesson
00 there, edits an exercise cell, and saves the notebook with its outputs through a real Jupyter server
(the path JupyterLab's autosave takes, jupytext's contents manager included). Afterwards ``git status`` is
unchanged and the clean-notebook check still passes.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat

from scripts import nbcheck

ROOT = Path(__file__).resolve().parent.parent


def _git_status() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True).stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _put(url: str, token: str, model: dict) -> int:
    req = urllib.request.Request(url, data=json.dumps(model).encode(), method="PUT")
    req.add_header("Authorization", f"token {token}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:  # loopback only
        return resp.status


def test_make_workspace_copies_once_and_never_overwrites(tmp_path):
    ws = tmp_path / "ws"
    subprocess.run(["make", "-s", "workspace", f"WORKSPACE={ws}"], cwd=ROOT, check=True, capture_output=True)
    copies = sorted(p.name for p in ws.glob("*.ipynb"))
    assert copies == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    mine = ws / copies[0]
    nb = nbformat.read(mine, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("my_notes = 1"))
    nbformat.write(nb, mine)
    before = mine.read_text()
    subprocess.run(["make", "-s", "workspace", f"WORKSPACE={ws}"], cwd=ROOT, check=True, capture_output=True)
    assert mine.read_text() == before, "make workspace must never overwrite the learner's copy"
    subprocess.run(["make", "-s", "reset-lesson", "LESSON=" + copies[0][:2], f"WORKSPACE={ws}"], cwd=ROOT, check=True)
    assert list((ws / ".old").glob(copies[0] + ".*")), "reset-lesson keeps the old copy"


def test_running_and_saving_a_lesson_in_the_workspace_leaves_the_repo_clean(tmp_path):
    from nbclient import NotebookClient

    status_before, problems_before = _git_status(), nbcheck.check_all()
    sources = [*ROOT.glob("lessons/00_*.py"), *ROOT.glob("notebooks/00_*.ipynb")]
    sources_before = {p: p.read_bytes() for p in sources}
    ws = tmp_path / "ws"
    subprocess.run(["make", "-s", "workspace", f"WORKSPACE={ws}"], cwd=ROOT, check=True, capture_output=True)
    (lesson,) = ws.glob("00_*.ipynb")
    nb = nbformat.read(lesson, as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name=nbcheck.KERNEL_NAME, resources={"metadata": {"path": str(ws)}}
    ).execute()
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code")
    stub = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "NotImplementedError" in c.source)
    nb.cells[stub].source += "\n# my answer goes here"

    port, token = _free_port(), secrets.token_hex(16)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "server",
            f"--ServerApp.root_dir={ws}",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            f"--IdentityProvider.token={token}",
            "--no-browser",
            "--allow-root",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/api/contents/{lesson.name}"
        deadline = time.time() + 60
        while True:
            try:
                assert _put(url, token, {"type": "notebook", "format": "json", "content": nb}) in (200, 201)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)

    saved = nbformat.read(lesson, as_version=4)
    assert "my answer goes here" in saved.cells[stub].source and any(c.get("outputs") for c in saved.cells)
    assert {p: p.read_bytes() for p in sources} == sources_before, "saving in the workspace changed the sources"
    if not status_before:  # a clean checkout (CI): nothing at all may change
        assert _git_status() == "", "saving in the workspace changed tracked files"
    untracked = {line for line in _git_status().splitlines() if line.startswith("??")}
    assert untracked <= set(status_before.splitlines()), "saving in the workspace created files git sees"
    assert not list(ws.glob("*.py")), "a paired text copy was written beside the workspace notebook"
    if not problems_before:
        assert nbcheck.check_all() == [], "the clean-notebook check fails after a workspace save"


def test_resets_within_one_second_never_overwrite_an_earlier_backup(tmp_path):
    """`make reset-lesson` twice in a second (and reset-workspace then reset-lesson): every old copy is kept.

    A `date` that always prints the same second stands in for two quick runs (backups were named to the second:
    the second reset replaced the first backup, 2 of 2 tries)."""
    ws, fake_bin = tmp_path / "ws", tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "date").write_text("#!/bin/sh\necho 20261201-120000\n")
    (fake_bin / "date").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake_bin}{os.pathsep}{os.environ['PATH']}")

    def make(*args: str) -> None:
        subprocess.run(["make", "-s", *args, f"WORKSPACE={ws}"], cwd=ROOT, check=True, capture_output=True, env=env)

    make("workspace")
    lesson = sorted(ws.glob("*.ipynb"))[0]
    versions = []
    for step in ("reset-lesson", "reset-lesson", "reset-workspace", "reset-lesson"):
        versions.append(f'{{"my work": "before {step} #{len(versions)}"}}')
        lesson.write_text(versions[-1])
        make(step, "LESSON=" + lesson.name[:2]) if step == "reset-lesson" else make(step)
    kept = sorted(p.read_text() for p in (ws / ".old").glob(lesson.name + ".*"))
    assert kept == sorted(versions), f"backups lost: {len(kept)} of {len(versions)} kept"
    assert lesson.read_bytes() == (ROOT / "notebooks" / lesson.name).read_bytes()
