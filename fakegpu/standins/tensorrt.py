"""A typed fake ``tensorrt`` module: TensorRT 11.1's real API surface, a CPU simulation behind it.

Built from a spec of the real bindings (``trt_api.introspect``, or the snapshot ``trt_11_1_api.json``):

* only classes, methods, properties, enum members and module names that exist in TensorRT 11.1 can be used;
  anything else raises ``AttributeError`` (with the TensorRT 10/11 replacement for removed APIs);
* calls are checked against the pybind11 signatures (overloads, argument count, keyword names, argument
  types: ``str`` is not ``pathlib.Path``, an enum argument must be a member of that enum, ...): a mismatch
  raises ``TypeError`` as pybind11 does; properties are read-only unless the real one has a setter;
* results are fakes of the documented return type.

Behind the surface a small simulation makes the course's code meaningful to test: the ONNX parser reads
the real file, the "engine" (a serialized plan of this fake) runs the ONNX model with ONNX Runtime on the
CPU, reading and writing the CPU torch tensors whose ``data_ptr()`` were passed to ``set_tensor_address``
(device buffers stand-in; the stream handle is any int). Optimization profiles are enforced
(``set_input_shape`` returns False outside them), ``execute_async_v3`` returns False when a tensor has no
address. ``FakeTRT.calls`` logs every API call for tests to inspect.

With ``device_pointers=True`` (the rehearsal, :mod:`fakegpu.standins.rehearsal`) it behaves as on a GPU:
``set_tensor_address`` accepts only stand-in CUDA pointers (``data_ptr()`` of a tensor on the rehearsal's
"cuda"; a host pointer raises, where real TensorRT would fault), reads and writes through them, and
``execute_async_v3(stream)`` needs a CUDA stream handle (``torch.cuda.Stream().cuda_stream``) on which the
inputs' writes are ordered (``wait_stream``/events): an unordered input is reported like a race.
"""

from __future__ import annotations

import functools
import importlib.machinery
import json
import re
import types
from pathlib import Path
from typing import Any

import numpy as np

from fakegpu.standins.tensorrt_build import PLAN_MAGIC as PLAN_MAGIC  # re-exported: the plan format
from fakegpu.standins.tensorrt_build import build_behaviors
from fakegpu.standins.tensorrt_exec import run_behaviors
from fakegpu.standins.tensorrt_surface import (
    REMOVED,
    Dims,
    Enum,
    EnumMember,
    FakeClass,
    FakeObject,
    HostMemory,
    norm_type,
)


class FakeTRT(types.ModuleType):
    """The fake module. ``FakeTRT(spec)``; use it where the course code expects ``import tensorrt as trt``."""

    def __init__(self, spec: dict[str, Any], device_pointers: bool = False) -> None:
        super().__init__("tensorrt")
        self.device_pointers = device_pointers
        # A real module has a spec: code that asks importlib.util.find_spec("tensorrt") while the fake sits in
        # sys.modules (torch.export does) must get an answer, not "tensorrt.__spec__ is None".
        self.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
        self.spec = spec
        self.__version__ = spec["version"]
        self.calls: list[tuple[str, tuple]] = []
        self.unknown_types: set[str] = set()
        self.enums = {name: Enum(name, members) for name, members in spec["enums"].items()}
        self.behavior = {**build_behaviors(self), **run_behaviors(self)}

    # ---- module attributes
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        spec = self.__dict__["spec"]
        if name in spec["classes"]:
            return FakeClass(self, name)
        if name in self.__dict__["enums"]:
            return self.__dict__["enums"][name]
        if name in spec["constants"]:
            return self.resolve_attr(spec["constants"][name])
        if name in spec["functions"]:
            return lambda *a, **k: self.call(None, name, spec["functions"][name], a, k)
        hint = f" ({REMOVED[name]})" if name in REMOVED else ""
        raise AttributeError(f"TensorRT 11.1 has no module attribute 'tensorrt.{name}'{hint}")

    # ---- the spec
    def class_chain(self, cls: str) -> list[str]:
        return [cls, *self.spec["classes"][cls]["bases"]]

    def member(self, cls: str, name: str):
        for c in self.class_chain(cls):
            spec = self.spec["classes"].get(c, {})
            for kind, table in (("method", "methods"), ("property", "properties"), ("attr", "attrs")):
                if name in spec.get(table, {}):
                    return kind, spec[table][name]
        return None

    def no_attribute(self, cls: str, name: str) -> AttributeError:
        hint = f" ({REMOVED[name]})" if name in REMOVED else ""
        return AttributeError(f"TensorRT 11.1: '{cls}' object has no attribute '{name}'{hint}")

    def resolve_attr(self, value: Any):
        if isinstance(value, str) and value.startswith("class:"):
            return self.enums[value[6:]]
        if isinstance(value, str) and value.rsplit(".", 1)[0] in self.enums:
            enum, member = value.rsplit(".", 1)
            return getattr(self.enums[enum], member)
        return value

    def enum_for(self, typ: str) -> str | None:
        t = norm_type(typ)
        for name in self.enums:
            if name == t or name.endswith("." + t):
                return name
        return None

    def class_for(self, typ: str) -> str | None:
        t = norm_type(typ)
        classes = self.spec["classes"]
        if t in classes:
            return t
        if t.startswith("I") and t[1:] in classes:  # C++ IBuilder / IRuntime / IParserError
            return t[1:]
        return None

    def accepts(self, typ: str, value: Any) -> bool:
        """Does pybind11 accept ``value`` for a parameter of type ``typ``? (the casters' main rules)"""
        t = norm_type(typ)
        if t.startswith("typing.Optional[") and value is None:
            return True
        t = re.sub(r"^typing\.Optional\[(.*)\]$", r"\1", t)
        if t in ("int", "typing.SupportsInt", "typing.SupportsIndex"):
            return not isinstance(value, float | str | bytes) and hasattr(value, "__int__")
        if t in ("float", "typing.SupportsFloat"):
            return isinstance(value, int | float | np.floating | np.integer)
        if t == "bool":
            return isinstance(value, bool | int | np.bool_)
        if t == "str":
            return isinstance(value, str | bytes)
        if t in ("typing_extensions.Buffer", "collections.abc.Buffer", "buffer"):
            return isinstance(value, bytes | bytearray | memoryview | np.ndarray)
        if t in ("tuple", "list"):
            return type(value).__name__ == t
        if t == "Dims" or t.startswith("Dims"):
            return isinstance(value, Dims) or (
                isinstance(value, tuple | list) and all(self.accepts("int", v) for v in value)
            )
        m = re.match(r"^(?:collections\.abc\.Sequence|list|typing\.Sequence)\[(.*)\]$", t)
        if m:
            return isinstance(value, list | tuple) and all(self.accepts(m.group(1), v) for v in value)
        enum = self.enum_for(t)
        if enum is not None:
            return isinstance(value, EnumMember) and value.enum == enum
        cls = self.class_for(t)
        if cls is not None:
            if cls == "IHostMemory" and isinstance(value, HostMemory):
                return True
            return isinstance(value, FakeObject) and cls in self.class_chain(value.__dict__["_cls"])
        if t not in ("object", "typing.Any"):
            self.unknown_types.add(t)
        return True

    def bind(self, what: str, sigs: list[dict], args: tuple, kwargs: dict) -> dict[str, Any]:
        """Match a call to one pybind11 overload; raise TypeError (as pybind11 does) when none fits."""
        for sig in sigs:
            params = sig["params"]
            if len(args) > len(params):
                continue
            bound = dict(zip([p[0] for p in params], args, strict=False))
            if set(kwargs) - {p[0] for p in params[len(args) :]}:
                continue
            bound.update(kwargs)
            if any(p[0] not in bound and not p[2] for p in params):
                continue
            if all(self.accepts(p[1], bound[p[0]]) for p in params if p[0] in bound):
                return bound
        shown = "; ".join(f"({', '.join(f'{p[0]}: {p[1]}' for p in s['params'])}) -> {s['returns']}" for s in sigs)
        got = ", ".join([type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in kwargs.items()])
        raise TypeError(f"TensorRT 11.1: {what}(): incompatible function arguments ({got}); supported: {shown}")

    def call(self, obj: FakeObject | None, name: str, sigs: list[dict], args: tuple, kwargs: dict):
        cls = obj.__dict__["_cls"] if obj is not None else "tensorrt"
        bound = self.bind(f"{cls}.{name}", sigs, args, kwargs)
        self.log(f"{cls}.{name}", args, kwargs)
        hook = self.behavior.get(f"{cls}.{name}")
        if hook is not None:
            return hook(obj, **bound)
        return self.default(sigs[0]["returns"])

    def default(self, typ: str):
        t = norm_type(typ)
        if t == "None":
            return None
        if t == "bool":
            return True
        if t == "int":
            return 0
        if t == "float":
            return 0.0
        if t == "str":
            return ""
        if t.startswith("list"):
            return []
        if t == "Dims":
            return Dims()
        if t == "IHostMemory":
            return HostMemory(b"")
        enum = self.enum_for(t)
        if enum is not None:
            return next(iter(self.enums[enum].__members__.values()))
        cls = self.class_for(t)
        return FakeObject(self, cls) if cls else None

    def log(self, what: str, args: tuple, kwargs: dict | None = None) -> None:
        self.calls.append((what, tuple(args) + tuple((kwargs or {}).items())))

    def called(self, what: str) -> list[tuple]:
        """The arguments of every logged call of ``what`` (e.g. ``"IExecutionContext.execute_async_v3"``)."""
        return [a for w, a in self.calls if w == what]


@functools.cache
def _snapshot() -> dict[str, Any]:
    """The checked-in snapshot of TensorRT 11.1's API, parsed once per process (a fake only reads it; parsing it
    for every fake was a third of an exercise check's time)."""
    return json.loads((Path(__file__).with_name("trt_11_1_api.json")).read_text())


def fake_from_snapshot(device_pointers: bool = False) -> FakeTRT:
    """A fake built from the checked-in snapshot of TensorRT 11.1's API (no wheel needed); ``device_pointers``:
    see the module doc."""
    return FakeTRT(_snapshot(), device_pointers)
