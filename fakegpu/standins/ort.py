"""ONNX Runtime's CUDA execution provider on the rehearsal's stand-in GPU.

``InferenceSession(..., providers=["CUDAExecutionProvider", ...], provider_options=[...])`` becomes a
:class:`StandinSession`: the CUDA provider's options are validated against the option names and value kinds of
ORT's CUDA provider (``OrtCUDAProviderOptionsV2`` / ``CUDAExecutionProviderInfo``: an unknown name or a bad
value raises as ORT's provider-options parser does), then the model runs on ORT's CPU provider. IOBinding with
``"cuda"`` buffers accepts only stand-in device pointers (a host pointer bound as CUDA memory raises) and
reads and writes through them. With ``enable_cuda_graph`` the first run's input/output shapes and addresses
are kept; a later run with another shape or address raises, because ORT replays the captured graph without
looking at the new bindings.

Stream order: ORT's CUDA provider runs on a stream of its own (or on torch's, given ``user_compute_stream``), so
an input torch wrote is safe to read only once the host waited for that write (``torch.cuda.synchronize()``)
or when ORT runs on the stream that wrote it; otherwise the run raises, as the read would be of stale or torn
data on a GPU. At the end of a run ORT synchronizes its stream (unless the run option
``disable_synchronize_execution_providers`` is "1"), so its outputs are complete when the call returns.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from fakegpu.standins.clock import LAUNCH_S, RATES
from fakegpu.standins.streams import MODEL, StandinStream
from fakegpu.standins.tensor import STATE, RehearsalError

_BOOL = "bool"
# ORT 1.31 CUDA provider options (OrtCUDAProviderOptionsV2 and the string options of CUDAExecutionProviderInfo)
CUDA_OPTIONS: dict[str, Any] = {
    "device_id": "int", "has_user_compute_stream": _BOOL, "user_compute_stream": "int", "gpu_mem_limit": "int",
    "arena_extend_strategy": {"kNextPowerOfTwo", "kSameAsRequested"},
    "cudnn_conv_algo_search": {"EXHAUSTIVE", "HEURISTIC", "DEFAULT"}, "do_copy_in_default_stream": _BOOL,
    "gpu_external_alloc": "int", "gpu_external_free": "int", "gpu_external_empty_cache": "int",
    "cudnn_conv_use_max_workspace": _BOOL, "enable_cuda_graph": _BOOL, "cudnn_conv1d_pad_to_nc1d": _BOOL,
    "tunable_op_enable": _BOOL, "tunable_op_tuning_enable": _BOOL, "tunable_op_max_tuning_duration_ms": "int",
    "enable_skip_layer_norm_strict_mode": _BOOL, "prefer_nhwc": _BOOL, "use_ep_level_unified_stream": _BOOL,
    "use_tf32": _BOOL, "sdpa_kernel": "int", "fuse_conv_bias": _BOOL,
}  # fmt: skip
_NP = {np.float32: np.float32, np.float16: np.float16, np.int64: np.int64, np.int32: np.int32}


def validate_cuda_options(options: dict[str, Any]) -> None:
    """Raise as ORT's CUDA provider would for an unknown option or a value it cannot parse."""
    for name, value in options.items():
        kind = CUDA_OPTIONS.get(name)
        STATE.count("ORT options validated")
        if kind is None:
            raise RehearsalError(f"[ONNXRuntimeError] : 1 : FAIL : Unknown provider option: \"{name}\" "
                                 f"(CUDAExecutionProvider accepts: {', '.join(sorted(CUDA_OPTIONS))})")  # fmt: skip
        text = str(value)
        ok = (text in {"0", "1", "true", "false", "True", "False"} if kind == _BOOL
              else text.lstrip("-").isdigit() if kind == "int" else text in kind)  # fmt: skip
        if not ok:
            raise RehearsalError(
                f'[ONNXRuntimeError] : 1 : FAIL : Failed to parse provider option "{name}" '
                f'value "{text}" (expected {kind if isinstance(kind, str) else sorted(kind)})'
            )
        if name == "device_id" and int(text) != 0:
            raise RehearsalError(f"Invalid device ID: {text}, must be between 0 (inclusive) and 1 (exclusive).")


class StandinBinding:
    """``session.io_binding()`` of a stand-in CUDA session."""

    def __init__(self, session: StandinSession) -> None:
        self.session, self.inputs, self.outputs = session, {}, {}
        self._results: list[np.ndarray] = []

    def _buffer(self, name: str, device_type: str, element_type: Any, shape: Any, ptr: int) -> tuple:
        dtype = np.dtype(element_type)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if str(device_type).lower() == "cuda":
            STATE.count("ORT IOBinding pointer checks")
            host = STATE.host_address(ptr, nbytes)
            if host is None:
                raise RehearsalError(
                    f"IOBinding '{name}': {int(ptr):#x} bound as 'cuda' memory is not a live CUDA buffer of "
                    f"{nbytes} bytes (a host pointer or a freed tensor?): bind a CUDA tensor's data_ptr()"
                )
            return host[0], dtype, tuple(shape), int(ptr), host[1]
        return int(ptr), dtype, tuple(shape), int(ptr), None

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any, shape: Any, buffer_ptr: int):
        self.inputs[name] = self._buffer(name, device_type, element_type, shape, buffer_ptr)

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type: Any = None,
                    shape: Any = None, buffer_ptr: Any = None) -> None:  # fmt: skip
        self.outputs[name] = None if buffer_ptr is None else self._buffer(name, device_type, element_type, shape,
                                                                         buffer_ptr)  # fmt: skip

    def bind_cpu_input(self, name: str, arr: np.ndarray) -> None:
        arr = np.ascontiguousarray(arr)
        self._keep = getattr(self, "_keep", []) + [arr]
        self.inputs[name] = (arr.ctypes.data, arr.dtype, arr.shape, arr.ctypes.data, None)

    def synchronize_inputs(self) -> None:
        s = self.session.stream()
        MODEL.host_sync(s.clock, "IOBinding.synchronize_inputs()", s.ready)

    def synchronize_outputs(self) -> None:
        s = self.session.stream()
        MODEL.host_sync(s.clock, "IOBinding.synchronize_outputs()", s.ready)

    def clear_binding_inputs(self) -> None:
        self.inputs = {}

    def clear_binding_outputs(self) -> None:
        self.outputs = {}

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        return [r.copy() for r in self._results]


class StandinSession:
    """An ``InferenceSession`` on the CUDA provider of the stand-in GPU (runs on ORT's CPU provider)."""

    def __init__(self, real_cls: Any, path_or_bytes: Any, sess_options: Any = None, providers: Any = None,
                 provider_options: Any = None, **kwargs: Any) -> None:  # fmt: skip
        names = [p if isinstance(p, str) else p[0] for p in providers]
        opts = list(provider_options or [{} for _ in names])
        for i, p in enumerate(providers):
            if not isinstance(p, str):
                opts[i] = p[1]
        self.cuda_options = {k: str(v) for k, v in opts[names.index("CUDAExecutionProvider")].items()}
        validate_cuda_options(self.cuda_options)
        self.graph = self.cuda_options.get("enable_cuda_graph", "0") in {"1", "true", "True"}
        self.captured: dict[str, tuple] | None = None
        self._inner = real_cls(path_or_bytes, sess_options, providers=["CPUExecutionProvider"], **kwargs)
        self._stream: StandinStream | None = None
        STATE.count("ORT CUDA sessions")

    def stream(self) -> StandinStream:
        """The stream ORT's CUDA provider runs on: torch's when ``user_compute_stream`` names one, else its own."""
        if self.cuda_options.get("has_user_compute_stream", "0") in {"1", "true", "True"} or (
            "user_compute_stream" in self.cuda_options
        ):
            return MODEL.stream_for(int(self.cuda_options["user_compute_stream"]))
        if self._stream is None or self._stream not in MODEL.streams:
            self._stream = StandinStream(_name="ONNX Runtime's own CUDA stream")
        return self._stream

    def _run_on_stream(self, io: StandinBinding | None, run_options: Any, nbytes: int) -> Any:
        """Order the bound CUDA inputs before ORT's stream; return (stream, clock) for the outputs."""
        stream = self.stream()
        clock = stream.tick()
        own = stream.name.startswith("ONNX Runtime")
        fix = ("torch.cuda.synchronize() (or torch.cuda.current_stream().synchronize()) before run_with_iobinding, "
               "or give ORT torch's stream: provider option user_compute_stream=str(torch.cuda.current_stream()"
               ".cuda_stream)") if own else ""  # fmt: skip
        for name, (*_, key) in io.inputs.items() if io else []:
            if key is not None:
                MODEL.use(key, f"ONNX Runtime input '{name}'", False, stream, clock, fix=fix)
        MODEL.flush_to(stream)  # torch's work queued on ORT's stream (user_compute_stream) runs before ORT reads
        stream.ready = MODEL.clock.issue(
            "compute", stream.sid, stream.ready, 20 * LAUNCH_S + nbytes / RATES["bandwidth"]
        )
        return stream, clock

    def _end_of_run(self, stream: StandinStream, run_options: Any) -> None:
        entries = getattr(run_options, "get_run_config_entry", None)
        try:
            off = entries is not None and entries("disable_synchronize_execution_providers") == "1"
        except Exception:  # noqa: BLE001 - the entry is not set
            off = False
        if not off:
            MODEL.host_sync(stream.clock, "ONNX Runtime's end-of-run synchronize", stream.ready)

    def get_providers(self) -> list[str]:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {"CUDAExecutionProvider": dict(self.cuda_options), "CPUExecutionProvider": {}}

    def io_binding(self) -> StandinBinding:
        return StandinBinding(self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _graph_check(self, bound: dict[str, tuple]) -> None:
        if not self.graph:
            return
        if self.captured is None:
            self.captured = bound
            STATE.count("ORT CUDA graph captures")
            return
        STATE.count("ORT CUDA graph replay checks")
        for name, (shape, ptr) in bound.items():
            old = self.captured.get(name)
            if old is not None and old != (shape, ptr):
                raise RehearsalError(
                    f"ORT CUDA graph: this session captured its graph with '{name}' of shape {old[0]} at {old[1]:#x}; "
                    f"this run binds shape {shape} at {ptr:#x}. ORT replays the captured graph without looking at "
                    "new shapes or addresses (wrong results, no error on a GPU): use one session per input shape "
                    "and keep the bound buffers fixed (or gpu_graph_id run options)."
                )

    def run(self, output_names: Any, input_feed: dict, run_options: Any = None) -> list[np.ndarray]:
        self._graph_check({k: (tuple(np.shape(v)), 0) for k, v in input_feed.items()})
        stream, _ = self._run_on_stream(None, run_options, sum(np.asarray(v).nbytes for v in input_feed.values()))
        out = self._inner.run(output_names, input_feed, run_options)
        MODEL.host_sync(stream.clock, "ONNX Runtime run() with host arrays", stream.ready)  # copies to the host
        return out

    def run_with_iobinding(self, io: StandinBinding, run_options: Any = None) -> None:
        bound = {n: (b[2], b[3]) for n, b in {**io.inputs, **{k: v for k, v in io.outputs.items() if v}}.items()}
        self._graph_check(bound)
        nbytes = sum(
            int(np.prod(b[2])) * b[1].itemsize for b in [*io.inputs.values(), *filter(None, io.outputs.values())]
        )
        stream, clock = self._run_on_stream(io, run_options, nbytes)
        feeds = {}
        for name, (host, dtype, shape, *_) in io.inputs.items():
            raw = (ctypes.c_char * (int(np.prod(shape)) * dtype.itemsize)).from_address(host)
            feeds[name] = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        names = [o.name for o in self._inner.get_outputs()]
        results = self._inner.run(names, feeds, run_options)
        io._results = results
        for name, value in zip(names, results, strict=True):
            target = io.outputs.get(name)
            if target is None:
                continue
            host, dtype, shape, _, key = target
            value = np.ascontiguousarray(value.astype(dtype))
            if tuple(value.shape) != tuple(shape):
                raise RehearsalError(
                    f"IOBinding output '{name}': bound shape {shape}, the model produced {value.shape}"
                )
            if key is not None:
                MODEL.use(key, f"ONNX Runtime output '{name}'", True, stream, clock)
            ctypes.memmove(host, value.ctypes.data, value.nbytes)
        self._end_of_run(stream, run_options)
