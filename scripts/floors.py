"""Overlays of the lowest versions pyproject.toml allows, so CI checks that the floors are true.

    python -m scripts.floors build            # build/floors/transformers-5.17.0 from the package index (~10 s)
    python -m scripts.floors build --offline  # build nothing; record why (a wheelhouse set-up has no index)
    python -m scripts.floors path transformers

An overlay is a folder of packages installed with ``pip install --target --no-deps`` (the floor version, and
those of its own requirements the course's environment does not satisfy: transformers 5.17 needs
huggingface-hub < 2, the pinned set has 2.x); ``PYTHONPATH=<overlay>`` puts it in front of the venv's packages
for one process and leaves the venv alone. ``tests/test_version_floors.py`` runs lesson 15's decode loops
against it (token-identical to ``generate``) and skips, naming the reason this script wrote, where no overlay
could be built. ``make test`` calls ``build`` first; a finished overlay is kept (``make clean`` removes it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOORS_DIR = ROOT / "build" / "floors"
CHECKED = ("transformers",)  # the pure-Python packages whose floor CI checks (the one the LLM lessons lean on)
DONE = ".complete.json"
REASON = "not-built.txt"


def floor(package: str, pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The lower bound ``package>=X`` declares in pyproject.toml's dependencies, as written (``"5.17"``)."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    for dep in deps:
        found = re.fullmatch(rf"{re.escape(package)}\s*>=\s*([\w.]+)\s*(,.*)?", dep.strip())
        if found:
            return found.group(1)
    raise LookupError(f"pyproject.toml declares no floor `{package}>=X` among its dependencies")


def exact(version: str) -> str:
    """The release a floor names: ``5.17`` -> ``5.17.0`` (pip's ``==5.17`` would also match it)."""
    return version if version.count(".") >= 2 else version + ".0" * (2 - version.count("."))


def overlay_path(package: str) -> Path:
    return FLOORS_DIR / f"{package}-{exact(floor(package))}"


def not_built_reason() -> str | None:
    """Why no overlay was built (written by ``build``), or None."""
    path = FLOORS_DIR / REASON
    return path.read_text().strip() if path.is_file() else None


def _unmet_requirements(folder: Path, dist: str) -> list[str]:
    """Requirements of ``dist`` (installed in ``folder``) that this environment's installed versions do not meet."""
    from importlib import metadata

    from packaging.requirements import Requirement

    meta = next(folder.glob(f"{dist}-*.dist-info"), None)
    if meta is None:
        return []
    unmet = []
    for line in (meta / "METADATA").read_text().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement, or another platform's
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            continue  # not installed here: transformers imports it lazily, if at all
        if not req.specifier.contains(have, prereleases=True):
            unmet.append(str(req))
    return unmet


def _pip_target(folder: Path, specs: list[str]) -> subprocess.CompletedProcess:
    # Short network timeouts: a machine without the index gives up in well under a minute, not pip's 15 s x 5 tries
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", "--upgrade",
           "--timeout", "15", "--retries", "1", "--target", str(folder), *specs]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


def build(package: str) -> tuple[Path | None, str]:
    """Install ``package`` at its floor (and its unmet requirements) into its overlay; (folder, message)."""
    version = exact(floor(package))
    final = overlay_path(package)
    if (final / DONE).is_file():
        return final, f"{package} {version}: overlay ready in {final}"
    tmp = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        first = _pip_target(tmp, [f"{package}=={version}"])
        if first.returncode != 0:
            return None, f"pip could not install {package}=={version}: {(first.stderr or first.stdout).strip()[-300:]}"
        extra = _unmet_requirements(tmp, package)
        if extra:
            more = _pip_target(tmp, extra)
            if more.returncode != 0:
                return None, f"pip could not install {', '.join(extra)}: {(more.stderr or more.stdout).strip()[-300:]}"
        (tmp / DONE).write_text(json.dumps({"package": package, "version": version, "also": extra}))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"building the {package} {version} overlay failed: {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    also = f" (with {', '.join(extra)})" if extra else ""
    return final, f"{package} {version}: overlay built in {final}{also}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the floor overlays (never fails: a reason is recorded instead)")
    b.add_argument("--offline", action="store_true", help="no package index here (a wheelhouse set-up)")
    p = sub.add_parser("path", help="print a package's overlay folder")
    p.add_argument("package")
    args = ap.parse_args(argv)
    if args.cmd == "path":
        print(overlay_path(args.package))
        return 0
    FLOORS_DIR.mkdir(parents=True, exist_ok=True)
    problems = []
    for package in CHECKED:
        if args.offline and not (overlay_path(package) / DONE).is_file():
            problems.append(f"{package} {exact(floor(package))}: not built, set-up is offline (a wheelhouse)")
            continue
        folder, message = build(package)
        print(f"version floors: {message}")
        if folder is None:
            problems.append(message)
    reason = FLOORS_DIR / REASON
    if problems:
        reason.write_text("; ".join(problems) + "\n")
        print("version floors: " + "; ".join(problems) + " (tests/test_version_floors.py skips)")
    else:
        reason.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
