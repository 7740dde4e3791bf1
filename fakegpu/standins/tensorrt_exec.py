"""What the fake TensorRT's runtime, engine and execution context do: run the plan with ONNX Runtime on the CPU.

The engine runs the plan's ONNX model with ONNX Runtime, reading and writing the buffers whose addresses were
passed to ``set_tensor_address``; profiles are enforced (``set_input_shape`` returns False outside them). With
device pointers (the rehearsal) an address must be live stand-in CUDA memory and the inputs' writes must be
ordered before ``execute_async_v3``'s stream.
"""

from __future__ import annotations

import ctypes
import itertools
import json
from typing import Any

import numpy as np

from fakegpu.standins.tensorrt_build import PLAN_MAGIC
from fakegpu.standins.tensorrt_surface import Dims, EnumMember, FakeObject, HostMemory

_TRT_TO_NP = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64,
              "BOOL": np.bool_, "UINT8": np.uint8}  # fmt: skip


def _host_rooms(ptrs: set[int]) -> dict[int, int]:
    """Bytes from each host address in ``ptrs`` to the end of the live torch storage or numpy array holding it (0:
    none).

    A copy must fit the buffer the address points into, not only some mapping of the process: a too-small
    output buffer would otherwise be overrun and the heap corrupted (the kernel dies with no verdict). Tensors are
    tracked by the garbage collector; numpy arrays are not, so they are found among what tracked objects hold (for
    the addresses no tensor holds). One pass over the process's objects serves every address of an execute call:
    the pass is what a check spends its time on.
    """
    import gc

    import torch

    rooms = dict.fromkeys(ptrs, 0)

    def spans(objects: list[Any], kind: type, wanted: list[int]) -> None:
        # the objects of that kind picked out at C speed (a Python loop over every object is what once made a
        # check cost a second): their types' verdicts are computed once each, then compress() keeps the matches
        types = set(map(type, objects))
        of_kind = {t for t in types if issubclass(t, kind)}
        for obj in itertools.compress(objects, map(of_kind.__contains__, map(type, objects))):
            try:
                if kind is np.ndarray:
                    start, size = obj.__array_interface__["data"][0], obj.nbytes
                else:
                    storage = obj.untyped_storage()
                    start, size = storage.data_ptr(), storage.nbytes()
            except (RuntimeError, NotImplementedError, TypeError):  # meta tensors, subclasses without storage
                continue
            for ptr in wanted:
                if start <= ptr < start + size:
                    rooms[ptr] = max(rooms[ptr], start + size - ptr)

    tracked = gc.get_objects()
    spans(tracked, torch.Tensor, list(rooms))
    if unheld := [ptr for ptr, room in rooms.items() if not room]:
        spans(gc.get_referents(*tracked), np.ndarray, unheld)
    return rooms


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


def run_behaviors(fake: Any) -> dict[str, Any]:
    """Hooks that give the fake's runtime, engines, inspectors and execution contexts their state."""

    def enum(e: str, m: str) -> EnumMember:
        return getattr(fake.enums[e], m)

    def obj(cls: str, **state: Any) -> FakeObject:
        return FakeObject(fake, cls, **state)

    def st(o: FakeObject) -> dict[str, Any]:
        return o.__dict__["_state"]

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
            from fakegpu.standins.streams import MODEL as model

            stream = model.stream_for(stream_handle)
            clock = stream.tick()
            model.external_run(stream)  # the work queued on the stream runs first; the engine takes device time

        rooms: dict[int, int] = {}  # host addresses' room, found in one pass on the first host buffer

        def host(ptr: int, nbytes: int, name: str, write: bool) -> int:
            if model is None:
                if not rooms:
                    rooms.update(_host_rooms(set(cs["addresses"].values())))
                room = rooms[ptr]
                if room < nbytes:
                    held = "is not inside any live tensor or array" if not room else f"has room for {room} bytes"
                    raise RuntimeError(
                        f"fake TensorRT: the buffer at {ptr:#x} given for {'output' if write else 'input'} '{name}' "
                        f"{held}, but '{name}' needs {nbytes} bytes ({tuple(context_shape(context, name))}): "
                        "allocate it with context.get_tensor_shape(name) and the engine's dtype, and keep it alive"
                    )
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
    from fakegpu.standins.tensor import STATE

    STATE.count("TensorRT pointer checks")
    found = STATE.host_address(ptr, nbytes)
    if found is None:
        raise RuntimeError(
            f"TensorRT (rehearsal): the address {ptr:#x} given for '{name}' is not {nbytes} bytes of live CUDA memory "
            "(a host pointer, or a freed tensor): bind a CUDA tensor's data_ptr() and keep the tensor alive"
        )
    return found
