"""What the fake TensorRT's parser and builder do: read the real ONNX file, check profiles, write a plan.

The parser reads the ONNX file's inputs, outputs and nodes (``network.num_inputs``/``get_input(i)`` and the
outputs' pair give them back as TensorRT's ITensor: name, shape with -1 for dynamic dims, dtype); the builder
checks that every dynamic input has a profile that agrees with the network's fixed dims, and returns a plan
(:data:`PLAN_MAGIC` + JSON holding the ONNX model) that :mod:`fakegpu.standins.tensorrt_exec` runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fakegpu.standins.tensorrt_surface import Dims, FakeObject, HostMemory

PLAN_MAGIC = b"FAKETRT-PLAN\n"

_ONNX_TO_TRT = {1: "FLOAT", 10: "HALF", 16: "BF16", 3: "INT8", 6: "INT32", 7: "INT64", 9: "BOOL", 2: "UINT8"}


def _onnx_io(path: str | None, data: bytes | None = None) -> dict[str, list[dict[str, Any]]]:
    """The inputs and outputs of the ONNX model in file ``path``, or in ``data`` (its bytes)."""
    import onnx

    model = onnx.load_from_string(data) if data is not None else onnx.load(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}

    def desc(v):
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in v.type.tensor_type.shape.dim]
        return {"name": v.name, "dtype": _ONNX_TO_TRT.get(v.type.tensor_type.elem_type, "FLOAT"), "dims": dims}

    return {
        "inputs": [desc(v) for v in model.graph.input if v.name not in inits],
        "outputs": [desc(v) for v in model.graph.output],
        "nodes": [[n.name or n.op_type, n.op_type] for n in model.graph.node],
    }


def build_behaviors(fake: Any) -> dict[str, Any]:
    """Hooks that give the fake's parser, network, builder, config, profiles and timing cache their state."""

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
            data = Path(str(model)).read_bytes()  # the real parser reads the file now, not at build time
        except Exception as exc:  # noqa: BLE001 - the real parser reports any failure as errors
            st(parser)["errors"].append(f"cannot read ONNX file {model}: {exc}")
            return False
        st(net).update(onnx=str(model), onnx_bytes=data, io=io)
        return True

    def parse(parser, model, path=None):
        """``parser.parse(f.read())``: the model's bytes (``path``: where external weights would be found)."""
        net = st(parser)["network"]
        try:
            data = bytes(model)
            io = _onnx_io(None, data)
        except Exception as exc:  # noqa: BLE001 - the real parser reports any failure as errors
            st(parser)["errors"].append(f"cannot parse the ONNX model bytes: {exc}")
            return False
        st(net).update(onnx=str(path) if path is not None else "<bytes given to OnnxParser.parse>", onnx_bytes=data,
                       io=io)  # fmt: skip
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

        onnx_b64 = base64.b64encode(ns["onnx_bytes"]).decode()  # a plan holds the weights
        plan = {"onnx": ns["onnx"], "onnx_b64": onnx_b64, "io": ns["io"], "profiles": profiles,
                "pools": cs.get("pools", {}),
                "flags": sorted(cs.get("flags_set", set())), "config": {k: str(v) for k, v in cfg.items()},
                "verbosity": str(cs.get("profiling_verbosity"))}  # fmt: skip
        return HostMemory(PLAN_MAGIC + json.dumps(plan).encode())

    def io_tensor(network, index, kind):
        """``network.get_input(i)`` / ``get_output(i)``: the parsed model's tensor (one object per index, as the
        bindings return the network's own ITensor); ``None`` for an index out of range, as the C++ API's
        nullptr. Dynamic dims read -1, the dtype is the ONNX element type's ``trt.DataType``."""
        io = st(network).get("io", {}).get(kind, [])
        i = int(index)
        if not 0 <= i < len(io):
            return None
        made = st(network).setdefault(f"{kind}_tensors", {})
        if i not in made:
            d = io[i]
            made[i] = obj("ITensor", name=d["name"], dtype=getattr(fake.enums["DataType"], d["dtype"]),
                          shape=Dims([v if isinstance(v, int) and v > 0 else -1 for v in d["dims"]]),
                          is_network_input=kind == "inputs", is_network_output=kind == "outputs")  # fmt: skip
        return made[i]

    return {
        "INetworkDefinition.get_input": lambda n, index: io_tensor(n, index, "inputs"),
        "INetworkDefinition.get_output": lambda n, index: io_tensor(n, index, "outputs"),
        "OnnxParser.__init__": parser_init,
        "OnnxParser.parse_from_file": parse_from_file,
        "OnnxParser.parse": parse,
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
    }
