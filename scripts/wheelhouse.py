"""A wheelhouse for offline set-up: every package `make setup` installs, in one folder, with a manifest.

    python -m scripts.wheelhouse build DIR --extras cpu,dev --no-deps tritonclient==2.73.0 ...
    python -m scripts.wheelhouse check DIR --extras cpu,dev --no-deps tritonclient==2.73.0 ...

``make wheelhouse`` runs ``build`` (on a machine with the internet): ``pip download`` of what set-up asks for
(pip itself, the build backend of ``pyproject.toml``, the pinned torch, the course's dependencies and the
chosen extras, and the packages set-up installs with ``--no-deps``), source packages turned into wheels, and
``manifest.json``: each file's name, version, SHA256 and size, the Python and platform it was built for, and
what was asked for. ``make lab WHEELHOUSE=DIR`` runs ``check`` before pip or uv touch anything: it walks what
set-up will ask for through the wheels' own requirements (markers evaluated for this interpreter) and stops
with one line per problem, naming the missing wheel and who needs it, a wheel for another Python or platform,
or a file whose SHA256 differs from the manifest, instead of pip's resolver error halfway through.

Runs with the base Python (no course packages needed): ``packaging`` is taken from the interpreter, from pip's
own copy, or from the wheelhouse's packaging wheel, in that order.
"""

from __future__ import annotations

import argparse
import base64
import csv
import email.parser
import hashlib
import importlib
import io
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = "manifest.json"
FORMAT = 1
PIP_SEED = ["pip", "wheel"]  # pip (upgraded by set-up) and wheel (uv seeds it into Python 3.11 venvs)
ARCHIVES = (".whl", ".tar.gz", ".zip")


class WheelhouseError(Exception):
    """The wheelhouse cannot serve this set-up; the message names each problem and the fix."""


def load_packaging(folder: Path | None = None) -> SimpleNamespace:
    """The ``packaging`` modules this script uses: installed, else pip's vendored copy, else the wheelhouse's."""
    subs = ("markers", "requirements", "specifiers", "tags", "utils", "version")
    for base in ("packaging", "pip._vendor.packaging"):
        try:
            return SimpleNamespace(**{s: importlib.import_module(f"{base}.{s}") for s in subs})
        except ImportError:
            continue
    wheels = sorted(Path(folder).glob("packaging-*-py3-none-any.whl")) if folder else []
    if wheels:
        sys.path.insert(0, str(wheels[-1]))  # a pure-Python wheel imports from its zip
        return SimpleNamespace(**{s: importlib.import_module(f"packaging.{s}") for s in subs})
    raise WheelhouseError("this Python has neither pip nor packaging: install pip (python3 -m ensurepip)")


# --- what set-up asks for ---------------------------------------------------------------------------------------


@dataclass
class Asked:
    """What set-up installs: ``resolved`` with their dependencies, ``no_deps`` without, ``optional`` if they can."""

    resolved: list[str]
    no_deps: list[str]
    optional: list[str]


def asked(extras: list[str], *, no_deps: list[str] = (), only: list[str] = (), optional: list[str] = (),
          installer: str = "pip", pyproject: Path = ROOT / "pyproject.toml") -> Asked:  # fmt: skip
    """The requirements of a set-up with these extras, read from ``pyproject.toml`` (the one place of the pins).

    ``only`` (``make setup SETUP_ONLY=...``) replaces the course's dependencies, extras and ``no_deps``
    packages by that list: set-up then installs the course package itself with ``--no-deps``.
    """
    data = tomllib.loads(pyproject.read_text())
    project = data["project"]
    build = list(data.get("build-system", {}).get("requires", []))
    seed = PIP_SEED if installer == "pip" else ["pip", "setuptools", "wheel"]  # uv venv --seed
    if only:
        return Asked(seed + build + list(only), [], [])
    reqs = list(project.get("dependencies", []))
    extra_table = project.get("optional-dependencies", {})
    for e in extras:
        if e not in extra_table:
            raise WheelhouseError(f"pyproject.toml has no extra {e!r} (it has: {', '.join(sorted(extra_table))})")
        reqs += extra_table[e]
    return Asked(seed + build + reqs, list(no_deps), list(optional))


def torch_pins(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The torch and torchvision pins (installed first by set-up, from PyTorch's CPU index with CPU_TORCH=1)."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [d for d in deps if re.match(r"torch(vision)?==", d)]


# --- build -----------------------------------------------------------------------------------------------------


def _pip(args: list[str], *, quiet: bool = False) -> None:
    cmd = [sys.executable, "-m", "pip", *args] + (["-q"] if quiet else [])
    print("+ " + " ".join(cmd[2:]), flush=True)
    done = subprocess.run(cmd)
    if done.returncode != 0:
        raise WheelhouseError(f"pip {args[0]} failed (exit {done.returncode}): see its output above")


def build(folder: Path, want: Asked, *, torch_index: str = "", target: list[str] = ()) -> dict:
    """Download every wheel of ``want`` into ``folder`` and write its manifest; return the manifest.

    ``target`` is pip's ``--python-version``/``--platform``/``--implementation``/``--abi`` options for a
    wheelhouse made for another machine (then only binary wheels are taken).
    """
    folder.mkdir(parents=True, exist_ok=True)
    base = ["download", "--dest", str(folder), "--find-links", str(folder), *target]
    if target:
        base += ["--only-binary=:all:"]
    pins = torch_pins()
    if torch_index and set(pins) <= set(want.resolved):
        _pip([*base, "--index-url", torch_index, *pins])  # the CPU-only torch first, as set-up installs it
    _pip([*base, *want.resolved])
    if want.no_deps:
        _pip([*base, "--no-deps", *want.no_deps])
    for req in want.optional:
        try:
            _pip([*base, req])
        except WheelhouseError as exc:
            print(f"warning: optional {req} not in the wheelhouse ({exc}); set-up goes on without it", flush=True)
    if not target:
        _wheels_from_sources(folder)
    manifest = write_manifest(folder, want, target=target)
    print(f"wheelhouse {folder}: {len(manifest['files'])} files, {_size(manifest)}; manifest {MANIFEST}")
    return manifest


def _wheels_from_sources(folder: Path) -> None:
    """Turn each source package pip downloaded into a wheel, so the offline set-up builds nothing."""
    for src in sorted(p for p in folder.iterdir() if p.name.endswith((".tar.gz", ".zip"))):
        try:
            _pip(["wheel", "--no-deps", "--wheel-dir", str(folder), str(src)], quiet=True)
            src.unlink()
        except WheelhouseError:
            print(f"warning: {src.name} did not build into a wheel here; it stays a source package", flush=True)


def _size(manifest: dict) -> str:
    return f"{sum(f['bytes'] for f in manifest['files']) / 2**20:,.0f} MiB"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _name_version(pk: SimpleNamespace, filename: str) -> tuple[str, str]:
    if filename.endswith(".whl"):
        name, version, _, _ = pk.utils.parse_wheel_filename(filename)
    else:
        name, version = pk.utils.parse_sdist_filename(filename)
    return str(name), str(version)


def write_manifest(folder: Path, want: Asked, *, target: list[str] = ()) -> dict:
    """``folder/manifest.json``: every archive's name, version, SHA256 and size, the target and the request."""
    pk = load_packaging(folder)
    files = []
    for path in sorted(p for p in folder.iterdir() if p.name.endswith(ARCHIVES)):
        name, version = _name_version(pk, path.name)
        files.append({"file": path.name, "name": name, "version": version, "sha256": sha256(path),
                      "bytes": path.stat().st_size})  # fmt: skip
    manifest = {
        "format": FORMAT,
        "built": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "target": _target(target),
        "asked": {"resolved": want.resolved, "no_deps": want.no_deps, "optional": want.optional},
        "files": files,
    }
    tmp = folder / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, folder / MANIFEST)
    return manifest


def _target(target: list[str]) -> dict:
    """The Python and platform the wheelhouse is for: pip's target options, else this interpreter."""
    pairs = list(zip(target[::2], target[1::2], strict=False))
    platforms = [v for k, v in pairs if k == "--platform"]
    return {
        "python": dict(pairs).get("--python-version", "{}.{}".format(*sys.version_info[:2])),
        "implementation": sys.implementation.name,
        "platform": " ".join(platforms) or sysconfig.get_platform(),
    }


# --- check -----------------------------------------------------------------------------------------------------


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not folder.is_dir():
        raise WheelhouseError(f"wheelhouse {folder} is not a folder (is the USB stick mounted?)")
    try:
        manifest = json.loads(path.read_text())
        manifest["files"]  # noqa: B018 - a manifest without its file list is no manifest
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WheelhouseError(
            f"{path} cannot be read ({type(exc).__name__}): build the wheelhouse with `make wheelhouse "
            f"WHEELHOUSE={folder}` on a machine with the internet"
        ) from None
    return manifest


def check(folder: Path, want: Asked) -> list[str]:
    """Every problem that would stop set-up from installing ``want`` out of ``folder`` offline (empty: none).

    Walks the requirements from what set-up asks for through each chosen wheel's ``Requires-Dist`` (markers
    and extras evaluated for this interpreter), choosing the newest compatible wheel as pip would, and checks
    each chosen file against the manifest's SHA256. ``no_deps`` packages are checked without their
    requirements; ``optional`` ones are not checked (set-up goes on without them).
    """
    pk = load_packaging(folder)
    manifest = read_manifest(folder)
    here = f"Python {platform.python_version()} ({sys.implementation.name}) on {sysconfig.get_platform()}"
    tags = set(pk.tags.sys_tags())
    env = pk.markers.default_environment()
    entries, problems = manifest_entries(pk, manifest, folder)
    by_name: dict[str, list[dict]] = {}
    for entry in entries:
        by_name.setdefault(str(pk.utils.canonicalize_name(entry["name"])), []).append(entry)
    listed = {e.get("file") for e in manifest["files"] if isinstance(e, dict)}
    problems += [f"{p.name} is in the folder but not in its manifest: remove it, or rebuild (make wheelhouse)"
                 for p in sorted(folder.iterdir()) if p.name.endswith(ARCHIVES) and p.name not in listed]  # fmt: skip
    specs: dict[str, list] = {}
    extras: dict[str, set[str]] = {}
    chosen: dict[str, dict] = {}
    top = {""}
    queue = [(pk.requirements.Requirement(r), "set-up", top, True) for r in want.resolved]
    queue += [(pk.requirements.Requirement(r), "set-up (--no-deps)", top, False) for r in want.no_deps]
    reported: set[str] = set()
    while queue:
        req, who, parent_extras, deps = queue.pop(0)
        if req.marker is not None and not any(req.marker.evaluate({**env, "extra": e}) for e in parent_extras):
            continue
        name = str(pk.utils.canonicalize_name(req.name))
        specs.setdefault(name, []).append((req.specifier, who))
        new_extras = set(req.extras) - extras.get(name, set())
        extras.setdefault(name, set()).update(req.extras)
        pick, why = _choose(pk, name, by_name.get(name, []), specs[name], tags, folder)
        if pick is None:
            if name not in reported:
                reported.add(name)
                problems.append(f"{why} (needed by {who})")
            continue
        if chosen.get(name) is pick and not new_extras:
            continue
        chosen[name] = pick
        if deps:
            label = f"{pick['name']} {pick['version']}"
            for dep in _requires(folder / pick["file"]):
                queue.append((pk.requirements.Requirement(dep), label, top | extras[name], True))
    for _name, entry in sorted(chosen.items()):
        path = folder / entry["file"]
        if not path.is_file():
            problems.append(f"missing wheel {entry['file']} (listed in the manifest, not in the folder)")
        elif path.stat().st_size != entry.get("bytes", path.stat().st_size) or sha256(path) != entry["sha256"]:
            problems.append(f"{entry['file']} is damaged: its SHA256 differs from the manifest (copied incompletely?)")
        elif path.name.endswith(".whl") and (why := wheel_problem(path)):
            problems.append(f"{entry['file']} is not a whole wheel: {why} (cut short when it was downloaded or "
                            "built?): rebuild the wheelhouse (make wheelhouse)")  # fmt: skip
    target = manifest.get("target", {})
    ours = _target([])
    if problems and target and (target.get("python"), target.get("platform")) != (ours["python"], ours["platform"]):
        problems.append(
            f"the wheelhouse was built for Python {target.get('python')} ({target.get('implementation')}) on "
            f"{target.get('platform')}; set-up here runs {here}"
        )
    return problems


ENTRY_FIELDS = {"file": str, "name": str, "version": str, "sha256": str}


def manifest_entries(pk, manifest: dict, folder: Path) -> tuple[list[dict], list[str]]:
    """``(the manifest's well-formed file entries, one line per malformed one)``: an entry needs ``file``,
    ``name``, ``version`` (a valid version) and ``sha256`` as text, ``bytes`` (if given) as a whole number."""
    files = manifest.get("files")
    fix = f"rebuild the wheelhouse (make wheelhouse WHEELHOUSE={folder}) or restore manifest.json from the stick"
    if not isinstance(files, list):
        return [], [f"{MANIFEST} is malformed: 'files' is {type(files).__name__}, not a list of entries: {fix}"]
    good, bad = [], []
    for i, entry in enumerate(files, 1):
        what = f"{MANIFEST} entry {i}"
        if not isinstance(entry, dict):
            bad.append(f"{what} is malformed: {type(entry).__name__}, not an object: {fix}")
            continue
        if isinstance(entry.get("file"), str):
            what += f" ({entry['file']})"
        wrong = [k for k, t in ENTRY_FIELDS.items() if not isinstance(entry.get(k), t) or not entry.get(k)]
        if "bytes" in entry and (not isinstance(entry["bytes"], int) or isinstance(entry["bytes"], bool)):
            wrong.append("bytes")
        if not wrong:
            try:
                pk.version.Version(entry["version"])
            except pk.version.InvalidVersion:
                wrong.append("version")
        if wrong:
            bad.append(f"{what} is malformed: {', '.join(repr(k) for k in wrong)} missing or not valid: {fix}")
        else:
            good.append(entry)
    return good, bad


def _record_digest(digest: bytes) -> str:
    """A SHA256 digest as a wheel's RECORD writes it."""
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def wheel_problem(path: Path) -> str:
    """What makes ``path`` no whole wheel ('' when none): it must open as a zip archive, hold one
    ``*.dist-info/RECORD``, and every file must match its RECORD line (SHA256 and size; pip's own check, done
    before pip runs) with no file left out of RECORD. A wheel cut short before its zip directory or its
    RECORD was written fails here, though its SHA256 matches a manifest written from the cut file."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            records = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
            if len(records) != 1:
                return f"{'no' if not records else len(records)} *.dist-info/RECORD file(s) in it"
            lines = list(csv.reader(io.StringIO(zf.read(records[0]).decode("utf-8"))))
            listed = {}
            for row in lines:
                if row and row[0]:
                    listed[row[0]] = (row + ["", ""])[1:3]
            unsigned = {records[0], records[0] + ".jws", records[0] + ".p7s"}
            if missing := sorted(set(listed) - set(names) - unsigned):
                more = ", ..." if missing[1:] else ""
                return f"{len(missing)} file(s) its RECORD lists are not in it ({missing[0]}{more})"
            if extra := sorted(set(names) - set(listed) - unsigned):
                return f"{len(extra)} file(s) in it are not in its RECORD ({extra[0]}{', ...' if extra[1:] else ''})"
            for name, (digest, size) in listed.items():
                if name in unsigned or not digest:
                    continue
                if size and not size.isdigit():
                    return f"its RECORD gives {name} the size {size!r}"
                if size and zf.getinfo(name).file_size != int(size):
                    return f"{name} has {zf.getinfo(name).file_size} bytes, its RECORD says {size}"
                algo = digest.split("=", 1)[0]
                if algo != "sha256":
                    return f"{name}'s RECORD digest uses {algo!r}, not sha256"
                h = hashlib.sha256()
                with zf.open(name) as member:
                    for block in iter(lambda m=member: m.read(1 << 20), b""):
                        h.update(block)
                if _record_digest(h.digest()) != digest:
                    return f"{name} differs from its RECORD's SHA256"
    except (OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, UnicodeDecodeError, csv.Error) as exc:
        return f"it cannot be read as a zip archive ({type(exc).__name__}: {exc})"
    return ""


def _choose(pk, name: str, entries: list[dict], specs: list, tags: set, folder: Path) -> tuple[dict | None, str]:
    """The newest entry whose version meets every specifier and whose tags this interpreter runs, or why none."""
    wanted = name + (",".join(sorted({str(s) for s, _ in specs if str(s)})) or " (any version)")
    if not entries:
        return None, f"no wheel for {wanted} in the wheelhouse"
    fits = [e for e in entries if all(s.contains(pk.version.Version(e["version"]), prereleases=True) for s, _ in specs)]
    if not fits:
        have = ", ".join(sorted({e["version"] for e in entries}))
        return None, f"no wheel for {wanted} in the wheelhouse (it has {name} {have})"
    runs = [e for e in fits if _runs_here(pk, e["file"], tags, folder)]
    if not runs:
        files = ", ".join(e["file"] for e in fits[:3])
        return None, f"no wheel for {wanted} runs on this Python and platform (the wheelhouse has {files})"
    return max(runs, key=lambda e: pk.version.Version(e["version"])), ""


def _runs_here(pk, filename: str, tags: set, folder: Path) -> bool:
    if not filename.endswith(".whl"):
        return True  # a source package builds anywhere (or fails naming what it needs)
    if not tags & set(pk.utils.parse_wheel_filename(filename)[3]):
        return False
    requires_python = _metadata(folder / filename).get("Requires-Python")
    return not requires_python or platform.python_version() in pk.specifiers.SpecifierSet(requires_python)


def _metadata(path: Path):
    """A wheel's METADATA headers (empty when the file is missing or not a wheel)."""
    try:
        with zipfile.ZipFile(path) as zf:
            name = next(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
            return email.parser.Parser().parsestr(zf.read(name).decode("utf-8", "replace"), headersonly=True)
    except (OSError, zipfile.BadZipFile, StopIteration):
        return email.parser.Parser().parsestr("")


def _requires(path: Path) -> list[str]:
    return list(_metadata(path).get_all("Requires-Dist") or [])


# --- command line ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["build", "check"])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--extras", default="cpu,dev", help="pyproject extras set-up installs (comma-separated)")
    ap.add_argument("--no-deps", nargs="*", default=[], help="packages set-up installs with --no-deps")
    ap.add_argument("--optional", nargs="*", default=[], help="packages set-up installs only if it can (pycuda)")
    ap.add_argument("--only", default="", help="SETUP_ONLY: just these requirements (space-separated)")
    ap.add_argument("--installer", choices=["pip", "uv"], default="pip")
    ap.add_argument("--torch-index", default="", help="PyTorch's CPU index (CPU_TORCH=1)")
    ap.add_argument("--python-version", help="build for another Python (pip download's option)")
    ap.add_argument("--platform", action="append", default=[], help="for another platform (repeatable)")
    args = ap.parse_args(argv)
    folder = args.folder.expanduser().resolve()
    only = args.only.split()
    try:
        want = asked([e for e in args.extras.split(",") if e], no_deps=args.no_deps, only=only,
                     optional=args.optional, installer=args.installer)  # fmt: skip
        if args.action == "build":
            target = ["--python-version", args.python_version] if args.python_version else []
            for tag in args.platform:
                target += ["--platform", tag]
            build(folder, want, torch_index=args.torch_index, target=target)
            if target:
                return 0
        problems = check(folder, want)
    except WheelhouseError as exc:
        print(f"wheelhouse: {exc}", file=sys.stderr)
        return 1
    if problems:
        print(f"wheelhouse {folder} cannot serve this set-up offline:", file=sys.stderr)
        for p in problems[:25]:
            print(f"  - {p}", file=sys.stderr)
        if len(problems) > 25:
            print(f"  ... and {len(problems) - 25} more", file=sys.stderr)
        print(
            f"Fix: rebuild it with `make wheelhouse WHEELHOUSE={folder}` on a machine with the internet and the "
            "same Python and platform, or set up from the package index (leave WHEELHOUSE unset).",
            file=sys.stderr,
        )
        return 1
    print(f"wheelhouse {folder}: complete for this set-up ({len(want.resolved) + len(want.no_deps)} requirements)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
