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

With ``device_pointers=True`` (the rehearsal, :mod:`course_utils.check.standins.rehearsal`) it behaves as on a GPU:
``set_tensor_address`` accepts only stand-in CUDA pointers (``data_ptr()`` of a tensor on the rehearsal's
"cuda"; a host pointer raises, where real TensorRT would fault), reads and writes through them, and
``execute_async_v3(stream)`` needs a CUDA stream handle (``torch.cuda.Stream().cuda_stream``) on which the
inputs' writes are ordered (``wait_stream``/events): an unordered input is reported like a race.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import json
import re
import types
from pathlib import Path
from typing import Any

import numpy as np

PLAN_MAGIC = b"FAKETRT-PLAN\n"

# Removed APIs: the hint the fake adds to its AttributeError (the error itself comes from the spec).
REMOVED = {
    "max_workspace_size": "removed in TensorRT 10: config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, n)",
    "build_engine": "removed in TensorRT 10: builder.build_serialized_network(network, config)",
    "execute_async_v2": "removed in TensorRT 10: set_tensor_address per tensor, then execute_async_v3(stream)",
    "execute_async": "removed in TensorRT 10: set_tensor_address per tensor, then execute_async_v3(stream)",
    "get_binding_shape": "removed in TensorRT 10: engine.get_tensor_shape(name) / context.get_tensor_shape(name)",
    "set_binding_shape": "removed in TensorRT 10: context.set_input_shape(name, shape)",
    "num_bindings": "removed in TensorRT 10: engine.num_io_tensors and engine.get_tensor_name(i)",
    "binding_is_input": "removed in TensorRT 10: engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT",
    "FP16": "removed in TensorRT 11 (strongly typed networks): export the ONNX model in half precision",
    "INT8": "removed in TensorRT 11: explicit quantization (Q/DQ nodes from ModelOpt) in the ONNX file",
    "BF16": "removed in TensorRT 11: precision comes from the ONNX graph",
    "int8_calibrator": "removed in TensorRT 11: calibrate with ModelOpt, which writes Q/DQ nodes",
    "platform_has_fast_fp16": "removed in TensorRT 11: check torch.cuda.get_device_capability()",
}

_ONNX_TO_TRT = {1: "FLOAT", 10: "HALF", 16: "BF16", 3: "INT8", 6: "INT32", 7: "INT64", 9: "BOOL", 2: "UINT8"}
_TRT_TO_NP = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64,
              "BOOL": np.bool_, "UINT8": np.uint8}  # fmt: skip


def _norm(t: str) -> str:
    """A spec type name without C++ namespaces (``nvinfer1::v_1_0::IGpuAllocator`` -> ``IGpuAllocator``)."""
    return t.split("::")[-1].strip()


class EnumMember:
    """A pybind11 enum member: ``trt.BuilderFlag.TF32`` (int() gives its value; equal only to itself)."""

    __slots__ = ("enum", "name", "value")

    def __init__(self, enum: str, name: str, value: int) -> None:
        object.__setattr__(self, "enum", enum)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "value", value)

    def __int__(self) -> int:
        return self.value

    __index__ = __int__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EnumMember) and (other.enum, other.value) == (self.enum, self.value)

    def __hash__(self) -> int:
        return hash((self.enum, self.value))

    def __repr__(self) -> str:
        return f"<{self.enum.split('.')[-1]}.{self.name}: {self.value}>"


class Enum:
    """A pybind11 enum type: members as attributes, ``__members__``; an unknown member is an AttributeError."""

    def __init__(self, name: str, members: dict[str, int]) -> None:
        self._name = name
        self.__members__ = {m: EnumMember(name, m, v) for m, v in members.items()}

    def __getattr__(self, item: str) -> EnumMember:
        if item.startswith("__"):
            raise AttributeError(item)
        members = self.__dict__["__members__"]
        if item not in members:
            hint = f" ({REMOVED[item]})" if item in REMOVED else ""
            known = sorted(members)
            raise AttributeError(f"TensorRT 11.1: {self._name} has no member '{item}'{hint}; members: {known}")
        return members[item]

    def __call__(self, value: int) -> EnumMember:
        for m in self.__members__.values():
            if m.value == int(value):
                return m
        raise ValueError(f"{self._name}: no member with value {value}")


class Dims:
    """``trt.Dims``: a sequence of ints (the real one has __len__, __getitem__, __eq__, no methods)."""

    def __init__(self, shape=()) -> None:
        self._d = tuple(int(v) for v in shape)

    def __len__(self) -> int:
        return len(self._d)

    def __getitem__(self, i):
        return self._d[i]

    def __eq__(self, other: object) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Dims | tuple | list) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._d)

    def __repr__(self) -> str:
        return f"Dims({list(self._d)})"


class HostMemory(bytes):
    """``trt.IHostMemory``: a buffer (the real one exposes the buffer protocol), with ``nbytes``/``dtype``."""

    @property
    def nbytes(self) -> int:
        return len(self)


class FakeObject:
    """An instance of a TensorRT class: attribute access and calls are checked against the spec."""

    def __init__(self, fake: FakeTRT, cls: str, **state: Any) -> None:
        object.__setattr__(self, "_fake", fake)
        object.__setattr__(self, "_cls", cls)
        object.__setattr__(self, "_state", dict(state))

    def __getattr__(self, name: str):
        fake, cls = self.__dict__["_fake"], self.__dict__["_cls"]
        if name.startswith("__"):
            raise AttributeError(name)
        member = fake.member(cls, name)
        if member is None:
            raise fake.no_attribute(cls, name)
        kind, spec = member
        if kind == "method":
            return lambda *a, **k: fake.call(self, name, spec, a, k)
        if kind == "attr":
            return fake.resolve_attr(spec)
        fake.log(f"{cls}.{name}", ())
        hook = fake.behavior.get(f"{cls}.{name}")
        if hook is not None:
            return hook(self)
        if name in self.__dict__["_state"]:
            return self.__dict__["_state"][name]
        return fake.default(spec["type"])

    def __setattr__(self, name: str, value: Any) -> None:
        fake, cls = self.__dict__["_fake"], self.__dict__["_cls"]
        member = fake.member(cls, name)
        if member is None or member[0] != "property":
            raise fake.no_attribute(cls, name)
        if not member[1]["writable"]:
            raise AttributeError(f"TensorRT 11.1: {cls}.{name} is read-only")
        if not fake.accepts(member[1]["type"], value):
            raise TypeError(f"TensorRT 11.1: {cls}.{name} takes {member[1]['type']}, got {type(value).__name__}")
        fake.log(f"{cls}.{name}=", (value,))
        self.__dict__["_state"][name] = value

    def __repr__(self) -> str:
        return f"<fake tensorrt.{self.__dict__['_cls']}>"


class FakeClass:
    """A TensorRT class object: calling it constructs (checked against ``__init__``), attributes are class attrs."""

    def __init__(self, fake: FakeTRT, name: str) -> None:
        self._fake, self._name = fake, name

    def __call__(self, *args, **kwargs):
        spec = self._fake.spec["classes"][self._name]
        if not spec["init"]:
            raise TypeError(f"TensorRT 11.1: {self._name} cannot be constructed from Python (no __init__)")
        obj = FakeObject(self._fake, self._name)
        bound = self._fake.bind(f"{self._name}()", spec["init"], args, kwargs)
        self._fake.log(f"{self._name}()", args)
        hook = self._fake.behavior.get(f"{self._name}.__init__")
        if hook is not None:
            hook(obj, bound)
        return obj

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        member = self._fake.member(self._name, name)
        if member is None or member[0] != "attr":
            raise self._fake.no_attribute(self._name, name)
        return self._fake.resolve_attr(member[1])


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
        self.behavior = _behaviors(self)

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
        t = _norm(typ)
        for name in self.enums:
            if name == t or name.endswith("." + t):
                return name
        return None

    def class_for(self, typ: str) -> str | None:
        t = _norm(typ)
        classes = self.spec["classes"]
        if t in classes:
            return t
        if t.startswith("I") and t[1:] in classes:  # C++ IBuilder / IRuntime / IParserError
            return t[1:]
        return None

    def accepts(self, typ: str, value: Any) -> bool:
        """Does pybind11 accept ``value`` for a parameter of type ``typ``? (the casters' main rules)"""
        t = _norm(typ)
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
        t = _norm(typ)
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


# ------------------------------------------------------------------------------------------ the simulation


def _readable(ptr: int, nbytes: int) -> bool:
    """Is [ptr, ptr + nbytes) inside one read-write mapping of this process? (a bad address must not crash)"""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return False
    for line in maps:
        rng, perms = line.split()[:2]
        lo, hi = (int(v, 16) for v in rng.split("-"))
        if lo <= ptr and ptr + nbytes <= hi and perms.startswith("rw"):
            return True
    return False


def _onnx_io(path: str) -> dict[str, list[dict[str, Any]]]:
    import onnx

    model = onnx.load(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}

    def desc(v):
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in v.type.tensor_type.shape.dim]
        return {"name": v.name, "dtype": _ONNX_TO_TRT.get(v.type.tensor_type.elem_type, "FLOAT"), "dims": dims}

    return {
        "inputs": [desc(v) for v in model.graph.input if v.name not in inits],
        "outputs": [desc(v) for v in model.graph.output],
        "nodes": [[n.name or n.op_type, n.op_type] for n in model.graph.node],
    }


def _fused_layers(nodes: list[list[str]]) -> list[dict[str, Any]]:
    """A plausible fusion for the inspector: Conv/Gemm absorb the BatchNormalization/Relu/Add after them."""
    layers: list[dict[str, Any]] = []
    absorbable = {"BatchNormalization", "Relu", "Add", "Clip"}
    for name, op in nodes:
        if layers and op in absorbable and layers[-1]["_head"] in ("Conv", "Gemm", "MatMul"):
            layers[-1]["Name"] += f" + {name}"
            continue
        layers.append({"Name": name, "LayerType": "CaskConvolution" if op == "Conv" else op, "_head": op})
    for layer in layers:
        layer.pop("_head")
    return layers


def _behaviors(fake: FakeTRT) -> dict[str, Any]:
    """Hooks that give the fake's objects state: parser, builder, profiles, runtime, engine, context."""

    def enum(e: str, m: str) -> EnumMember:
        return getattr(fake.enums[e], m)

    def obj(cls: str, **state: Any) -> FakeObject:
        return FakeObject(fake, cls, **state)

    def st(o: FakeObject) -> dict[str, Any]:
        return o.__dict__["_state"]

    def parser_init(parser, bound):
        st(parser).update(network=bound["network"], errors=[])

    def parse_from_file(parser, model):
        net = st(parser)["network"]
        try:
            io = _onnx_io(str(model))
        except Exception as exc:  # noqa: BLE001 - the real parser reports any failure as errors
            st(parser)["errors"].append(f"cannot read ONNX file {model}: {exc}")
            return False
        st(net).update(onnx=str(model), io=io)
        return True

    def get_error(parser, index):
        errors = st(parser)["errors"]
        if not 0 <= int(index) < len(errors):
            raise IndexError(f"parser error index {index} out of range ({len(errors)} errors)")
        return obj("ParserError", desc=errors[int(index)])

    def set_shape(profile, input, min, opt, max):  # noqa: A002 - the real parameter names
        mn, op, mx = (tuple(Dims(s)) for s in (min, opt, max))
        if not (len(mn) == len(op) == len(mx)) or not all(a <= b <= c for a, b, c in zip(mn, op, mx, strict=True)):
            raise ValueError(f"set_shape('{input}'): need equal ranks and min <= opt <= max, got {mn}, {op}, {mx}")
        st(profile).setdefault("shapes", {})[str(input)] = (mn, op, mx)

    def add_profile(config, profile):
        profiles = st(config).setdefault("profiles", [])
        profiles.append(dict(st(profile).get("shapes", {})))
        return len(profiles) - 1

    def set_flag(config, flag):
        st(config).setdefault("flags_set", set()).add(flag.name)
        st(config).setdefault("flags_cleared", set()).discard(flag.name)

    def clear_flag(config, flag):
        st(config).setdefault("flags_set", set()).discard(flag.name)
        st(config).setdefault("flags_cleared", set()).add(flag.name)

    def set_pool(config, pool, pool_size):
        st(config).setdefault("pools", {})[pool.name] = int(pool_size)

    def create_timing_cache(config, serialized_timing_cache):
        return obj("ITimingCache", blob=bytes(serialized_timing_cache) or b"FAKE-TIMING-CACHE")

    def set_timing_cache(config, cache, ignore_mismatch):
        st(config)["timing_cache"] = cache
        return True

    def build(builder, network, config, **_):
        ns, cs = st(network), st(config)
        if "io" not in ns:
            return None  # nothing parsed: the real builder logs an error and returns None
        profiles = cs.get("profiles", [])
        for inp in ns["io"]["inputs"]:
            dynamic = any(not isinstance(d, int) or d <= 0 for d in inp["dims"])
            if dynamic and not any(inp["name"] in p for p in profiles):
                return None  # a dynamic input without a profile: the real builder fails
            for p in profiles:
                if inp["name"] in p:
                    for shape in p[inp["name"]]:
                        fixed = [d for d in inp["dims"]]
                        if len(shape) != len(fixed) or any(
                            isinstance(f, int) and f > 0 and f != s for f, s in zip(fixed, shape, strict=True)
                        ):
                            return None  # profile shape disagrees with the network's fixed dims
        cfg = {k: getattr(config, k) for k in ("builder_optimization_level",) if k in cs}
        import base64

        onnx_b64 = base64.b64encode(Path(ns["onnx"]).read_bytes()).decode()  # a plan holds the weights
        plan = {"onnx": ns["onnx"], "onnx_b64": onnx_b64, "io": ns["io"], "profiles": profiles,
                "pools": cs.get("pools", {}),
                "flags": sorted(cs.get("flags_set", set())), "config": {k: str(v) for k, v in cfg.items()},
                "verbosity": str(cs.get("profiling_verbosity"))}  # fmt: skip
        return HostMemory(PLAN_MAGIC + json.dumps(plan).encode())

    def deserialize(runtime, **bound):
        blob = bytes(next(iter(bound.values())))
        if not blob.startswith(PLAN_MAGIC):
            return None  # not a plan of this TensorRT: the real runtime logs an error and returns None
        return obj("ICudaEngine", plan=json.loads(blob[len(PLAN_MAGIC) :]))

    def io_list(engine) -> list[dict[str, Any]]:
        io = st(engine)["plan"]["io"]
        return [{**t, "mode": "INPUT"} for t in io["inputs"]] + [{**t, "mode": "OUTPUT"} for t in io["outputs"]]

    def tensor(engine, name) -> dict[str, Any]:
        for t in io_list(engine):
            if t["name"] == name:
                return t
        raise KeyError(f"fake engine: no I/O tensor named {name!r}")

    def get_tensor_name(engine, index):
        ts = io_list(engine)
        if not 0 <= int(index) < len(ts):
            raise IndexError(f"I/O tensor index {index} out of range (num_io_tensors = {len(ts)})")
        return ts[int(index)]["name"]

    def engine_shape(engine, name):
        return Dims([d if isinstance(d, int) and d > 0 else -1 for d in tensor(engine, name)["dims"]])

    def profile_shape(engine, name, profile_index):
        shapes = st(engine)["plan"]["profiles"][int(profile_index)][name]
        return [Dims(s) for s in shapes]

    def create_context(engine, **_):
        return obj("IExecutionContext", engine_obj=engine, shapes={}, addresses={})

    def inspector_info(inspector, format):  # noqa: A002
        plan = st(st(inspector)["engine_obj"])["plan"]
        layers = _fused_layers(plan["io"]["nodes"])
        if format == enum("LayerInformationFormat", "JSON"):
            return json.dumps({"Layers": layers, "Bindings": [t["name"] for t in plan["io"]["inputs"]]})
        return "\n".join(layer["Name"] for layer in layers)

    def set_input_shape(context, name, shape):
        engine = st(context)["engine_obj"]
        try:
            t = tensor(engine, str(name))
        except KeyError:
            return False
        shape = tuple(int(v) for v in shape)
        prof = st(engine)["plan"]["profiles"]
        if t["mode"] != "INPUT" or not prof or t["name"] not in prof[0]:
            return False
        mn, _, mx = prof[0][t["name"]]
        if len(shape) != len(mn) or not all(a <= s <= b for a, s, b in zip(mn, shape, mx, strict=True)):
            return False  # outside the optimization profile: the real call logs an error, returns False
        st(context)["shapes"][t["name"]] = shape
        return True

    def symbols(context) -> dict[str, int]:
        engine, out = st(context)["engine_obj"], {}
        for t in io_list(engine):
            if t["mode"] == "INPUT" and t["name"] in st(context)["shapes"]:
                for d, v in zip(t["dims"], st(context)["shapes"][t["name"]], strict=True):
                    if isinstance(d, str):
                        out[d] = v
        return out

    def context_shape(context, name):
        engine = st(context)["engine_obj"]
        t = tensor(engine, str(name))
        if t["mode"] == "INPUT" and t["name"] in st(context)["shapes"]:
            return Dims(st(context)["shapes"][t["name"]])
        sym = symbols(context)
        return Dims([d if isinstance(d, int) and d > 0 else sym.get(d, -1) for d in t["dims"]])

    def set_address(context, name, memory):
        engine = st(context)["engine_obj"]
        try:
            tensor(engine, str(name))
        except KeyError:
            return False
        if fake.device_pointers:
            _device(int(memory), 1, str(name))
        st(context)["addresses"][str(name)] = int(memory)
        return True

    def execute(context, stream_handle):
        import onnxruntime as ort

        cs = st(context)
        engine = cs["engine_obj"]
        plan = st(engine)["plan"]
        model = stream = clock = None
        if fake.device_pointers:  # the rehearsal: CUDA pointers and stream order, as on a GPU
            from course_utils.check.standins.streams import MODEL as model

            stream = model.stream_for(stream_handle)
            clock = stream.tick()

        def host(ptr: int, nbytes: int, name: str, write: bool) -> int:
            if model is None:
                if not _readable(ptr, nbytes):
                    raise RuntimeError(f"fake TensorRT: address {ptr:#x} of '{name}' is not valid memory")
                return ptr
            address, key = _device(ptr, nbytes, name)
            what = f"TensorRT execute_async_v3 {'output' if write else 'input'} '{name}'"
            model.use(key, what, write, stream, clock)
            return address

        feeds = {}
        for t in io_list(engine):
            shape = tuple(context_shape(context, t["name"]))
            if t["name"] not in cs["addresses"] or any(d < 0 for d in shape):
                return False  # a tensor without an address or an input without a shape: the real call fails
            if t["mode"] == "INPUT":
                dtype = np.dtype(_TRT_TO_NP[t["dtype"]])
                nbytes = int(np.prod(shape)) * dtype.itemsize
                ptr = host(cs["addresses"][t["name"]], nbytes, t["name"], False)
                raw = (ctypes.c_char * nbytes).from_address(ptr)
                feeds[t["name"]] = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        if "session" not in st(engine):
            so = ort.SessionOptions()
            so.log_severity_level = 3
            import base64

            model_bytes = base64.b64decode(plan["onnx_b64"])
            st(engine)["session"] = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
        outs = st(engine)["session"].run([t["name"] for t in plan["io"]["outputs"]], feeds)
        for t, value in zip(plan["io"]["outputs"], outs, strict=True):
            value = np.ascontiguousarray(value.astype(_TRT_TO_NP[t["dtype"]]))
            if tuple(value.shape) != tuple(context_shape(context, t["name"])):
                raise RuntimeError(f"fake TensorRT: output '{t['name']}' shape {value.shape} disagrees")
            ptr = host(cs["addresses"][t["name"]], value.nbytes, t["name"], True)
            ctypes.memmove(ptr, value.ctypes.data, value.nbytes)
        cs["last_stream"] = int(stream_handle)
        return True

    return {
        "OnnxParser.__init__": parser_init,
        "OnnxParser.parse_from_file": parse_from_file,
        "OnnxParser.num_errors": lambda p: len(st(p)["errors"]),
        "OnnxParser.get_error": get_error,
        "ParserError.desc": lambda e: st(e)["desc"],
        "INetworkDefinition.num_inputs": lambda n: len(st(n).get("io", {}).get("inputs", [])),
        "INetworkDefinition.num_outputs": lambda n: len(st(n).get("io", {}).get("outputs", [])),
        "Builder.create_network": lambda b, **_: obj("INetworkDefinition"),
        "Builder.create_builder_config": lambda b: obj("IBuilderConfig"),
        "Builder.create_optimization_profile": lambda b: obj("IOptimizationProfile"),
        "Builder.build_serialized_network": build,
        "IOptimizationProfile.set_shape": set_shape,
        "IBuilderConfig.add_optimization_profile": add_profile,
        "IBuilderConfig.set_flag": set_flag,
        "IBuilderConfig.clear_flag": clear_flag,
        "IBuilderConfig.get_flag": lambda c, flag: flag.name in st(c).get("flags_set", {"TF32"}),
        "IBuilderConfig.set_memory_pool_limit": set_pool,
        "IBuilderConfig.get_memory_pool_limit": lambda c, pool: st(c).get("pools", {}).get(pool.name, 0),
        "IBuilderConfig.create_timing_cache": create_timing_cache,
        "IBuilderConfig.set_timing_cache": set_timing_cache,
        "IBuilderConfig.get_timing_cache": lambda c: st(c).get("timing_cache"),
        "IBuilderConfig.num_optimization_profiles": lambda c: len(st(c).get("profiles", [])),
        "ITimingCache.serialize": lambda t: HostMemory(st(t)["blob"]),
        "Runtime.deserialize_cuda_engine": deserialize,
        "ICudaEngine.num_io_tensors": lambda e: len(io_list(e)),
        "ICudaEngine.num_optimization_profiles": lambda e: len(st(e)["plan"]["profiles"]),
        "ICudaEngine.num_layers": lambda e: len(_fused_layers(st(e)["plan"]["io"]["nodes"])),
        "ICudaEngine.get_tensor_name": get_tensor_name,
        "ICudaEngine.get_tensor_mode": lambda e, name: enum("TensorIOMode", tensor(e, str(name))["mode"]),
        "ICudaEngine.get_tensor_dtype": lambda e, name: enum("DataType", tensor(e, str(name))["dtype"]),
        "ICudaEngine.get_tensor_shape": engine_shape,
        "ICudaEngine.get_tensor_profile_shape": profile_shape,
        "ICudaEngine.create_execution_context": create_context,
        "ICudaEngine.create_engine_inspector": lambda e: obj("EngineInspector", engine_obj=e),
        "ICudaEngine.serialize": lambda e: HostMemory(PLAN_MAGIC + json.dumps(st(e)["plan"]).encode()),
        "EngineInspector.get_engine_information": inspector_info,
        "IExecutionContext.set_input_shape": set_input_shape,
        "IExecutionContext.get_tensor_shape": context_shape,
        "IExecutionContext.set_tensor_address": set_address,
        "IExecutionContext.get_tensor_address": lambda c, name: st(c)["addresses"].get(str(name), 0),
        "IExecutionContext.execute_async_v3": execute,
        "IExecutionContext.engine": lambda c: st(c)["engine_obj"],
        "IExecutionContext.all_binding_shapes_specified": lambda c: all(
            t["name"] in st(c)["shapes"] for t in io_list(st(c)["engine_obj"]) if t["mode"] == "INPUT"
        ),
    }


def _device(ptr: int, nbytes: int, name: str) -> tuple[int, int]:
    """(host address, storage key) of a stand-in CUDA pointer; a host pointer raises as TensorRT would fail."""
    from course_utils.check.standins.tensor import STATE

    STATE.count("TensorRT pointer checks")
    found = STATE.host_address(ptr, nbytes)
    if found is None:
        raise RuntimeError(
            f"TensorRT (rehearsal): the address {ptr:#x} given for '{name}' is not {nbytes} bytes of live CUDA memory "
            "(a host pointer, or a freed tensor): bind a CUDA tensor's data_ptr() and keep the tensor alive"
        )
    return found


def fake_from_snapshot(device_pointers: bool = False) -> FakeTRT:
    """A fake built from the checked-in snapshot of TensorRT 11.1's API (no wheel needed); ``device_pointers``:
    see the module doc."""
    return FakeTRT(json.loads((Path(__file__).with_name("trt_11_1_api.json")).read_text()), device_pointers)
