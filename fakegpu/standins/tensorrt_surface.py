"""The fake TensorRT's API surface: enums, dims, host memory and objects that only have what TensorRT 11.1 has.

Used by :class:`fakegpu.standins.tensorrt.FakeTRT`: every attribute is looked up in the spec of the
real bindings; a name that is not there raises ``AttributeError`` (with :data:`REMOVED`'s hint for APIs that
TensorRT 10 or 11 removed), and calls are checked against the pybind11 signatures.
"""

from __future__ import annotations

from typing import Any

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


def norm_type(t: str) -> str:
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

    def __init__(self, fake: Any, cls: str, **state: Any) -> None:
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

    def __init__(self, fake: Any, name: str) -> None:
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
