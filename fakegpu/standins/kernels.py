"""Which kernel CUDA would run, and what choosing it costs, on the rehearsal's stand-in GPU (an sm_90 part).

Four rules of the CUDA build of PyTorch that a CPU run never meets, modelled simply:

* **cuDNN autotuning workspace** (:func:`convolution_issued`). With ``torch.backends.cudnn.benchmark = True`` the
  first convolution of a new configuration (input and weight shapes, stride, padding, dilation, groups, dtype,
  TF32 switch) runs cuDNN's algorithm search, which tries each algorithm with the largest workspace any of them
  asks for, allocated from the caching allocator (PyTorch's ``aten/src/ATen/native/cudnn/Conv_v7.cpp``:
  ``getMaxWorkspaceSize`` over the algorithms, capped by the largest free block). That workspace shows in
  ``max_memory_allocated`` and is freed at once. *The model*: the workspace is ``AUTOTUNE_WORKSPACE`` times the
  bytes of the input plus the output (never more than the free memory), taken once per configuration while
  ``benchmark`` is on; a later call of the same configuration, and every call with ``benchmark`` off, takes none
  (the per-call workspace of the chosen or heuristic algorithm is not modelled: real steady-state peaks are a
  little higher than the stand-in's). The search's cache lives for the process, as cuDNN's does. A peak read whose
  value that workspace set raises (:meth:`.tensor.State.read_peak`): it is the search's peak, not the steady one.
* **SDPA backends** (:func:`choose_sdpa`). ``F.scaled_dot_product_attention`` on CUDA tries the enabled backends
  in the context's priority order and takes the first whose constraints hold; when none does (math excluded by
  ``sdpa_kernel``), it raises "No available kernel". The constraints are those of PyTorch's
  ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` (``can_use_flash_attention``,
  ``can_use_mem_efficient_attention``, ``can_use_cudnn_attention``; read on PyTorch's main branch, the CUDA build's
  source is not installed) and ``sdp_utils_cpp.h`` (installed with torch 2.14.1 under
  ``torch/include/ATen/native/transformers/``) for an sm_90 GPU, for dense 4-D inputs: flash needs FP16/BF16, no
  ``attn_mask``, equal head dims <= 256 and, with ``is_causal``, as many queries as keys; efficient attention takes
  FP32, FP16, BF16 and a mask, with head dims divisible by 8 (half) or 4 (FP32) and aligned storage offsets; both
  need the last dim contiguous and equal head counts, or one key/value head, unless ``enable_gqa``. cuDNN
  attention is modelled only by its dtype (FP16/BF16), head dim (<= 128, divisible by 8) and determinism rules
  (its layout rules, and the cuDNN-first order torch picks with cuDNN > 9.15 on sm_90, are not). The stand-in then
  computes every backend with the math kernel; the chosen kernel's name is a profiler range
  (``aten::_scaled_dot_product_flash_attention`` ...) beside the math operators, and names its device events.
* **Precision in force** (:func:`matmul_issued`, :func:`_recording`). Each matrix product or convolution on stand-in
  tensors records the precision the switches gave it when it was called (``allow_tf32`` of matmul or cuDNN,
  ``float32_matmul_precision``; a half dtype is its own precision), not when it was defined or timed; a check
  reads the record (:func:`_require`). The stand-in's values are computed in FP32 whatever the record says
  (TF32 rounding is not emulated); its clock runs a TF32 call at the TF32 rate.
* **Device activity in the profiler** (:func:`profiler_patches`). ``torch.profiler.profile`` asked for
  ``ProfilerActivity.CUDA`` records a device event (``DeviceType.CUDA``, the stand-in clock's start and end) for
  every kernel and copy issued on the stand-in while it records, so ``key_averages()`` has device time for GPU work
  and none for work that ran on the CPU. The device events stand alone: they are not attached to the CPU operator
  that launched them (a real trace links them), so a CPU operator's own CUDA-time column reads 0, and
  ``export_chrome_trace`` writes the CPU trace only. A profile that
  asked for CUDA activity and recorded no device event is reported at the cell's end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from fakegpu.standins.clock import tf32_in_force, tf32_state
from fakegpu.standins.streams import MODEL
from fakegpu.standins.tensor import STATE, RehearsalError, Rehearsed

# cuDNN autotuning ------------------------------------------------------------------------------------------------
AUTOTUNE_WORKSPACE = 2  # the modelled search workspace: this many times the input's plus the output's bytes
CONVOLUTIONS = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "cudnn_convolution",
                "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"}  # fmt: skip
AUTOTUNED: set[tuple] = set()  # configurations cuDNN's search has run for (process-wide, as cuDNN's cache)


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _describe(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return (tuple(obj.shape), str(obj.dtype).removeprefix("torch."))
    if isinstance(obj, (list, tuple)):
        return tuple(_describe(o) for o in obj)
    return obj


def convolution_issued(base: str, args: tuple, kwargs: dict, out: Any) -> None:
    """A convolution issued on the stand-in (``args`` and ``out`` meta tensors): the first one of its configuration
    under ``cudnn.benchmark`` takes the search's workspace for a moment (it shows in the peak)."""
    if base not in CONVOLUTIONS or not (torch.backends.cudnn.enabled and torch.backends.cudnn.benchmark):
        return
    key = (base, _describe(args), _describe(tuple(sorted(kwargs.items()))), tf32_state()[1],
           bool(torch.backends.cudnn.deterministic))  # fmt: skip
    if key in AUTOTUNED:
        return
    AUTOTUNED.add(key)
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    outs = out if isinstance(out, (tuple, list)) else [out]
    workspace = AUTOTUNE_WORKSPACE * (_nbytes(x) + sum(_nbytes(o) for o in outs))
    shape = "x".join(map(str, x.shape)) if x is not None else "?"
    STATE.count("cuDNN autotuning searches")
    STATE.workspace(workspace, f"cuDNN's algorithm search for the first {base} of input {shape} under "
                               "torch.backends.cudnn.benchmark=True")  # fmt: skip


def forget_autotuning() -> None:
    """Forget the searches run so far (as a new process would): tests start from a clean cache."""
    AUTOTUNED.clear()


# precision in force ----------------------------------------------------------------------------------------------
_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "einsum"}
_HALF = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


@dataclass(frozen=True)
class Call:
    """One matrix product or convolution: its operator, dtype and the precision the switches gave it at the call."""

    op: str
    dtype: str
    precision: str
    switches: tuple[tuple[str, object], ...]


_RECORDERS: list[list[Call]] = []


def precision_of(base: str, dtype: torch.dtype) -> str:
    """The precision CUDA runs operator ``base`` in now: the dtype's, or for FP32 'tf32' when its switch is on."""
    if dtype in _HALF:
        return _HALF[dtype]
    if dtype != torch.float32:
        return str(dtype).removeprefix("torch.")
    return "tf32" if tf32_in_force(base) else "fp32"


def _switches(base: str) -> tuple[tuple[str, object], ...]:
    try:
        if base in CONVOLUTIONS:
            return (("torch.backends.cudnn.allow_tf32", bool(torch.backends.cudnn.allow_tf32)),)
        return (("torch.backends.cuda.matmul.allow_tf32", bool(torch.backends.cuda.matmul.allow_tf32)),
                ("torch.get_float32_matmul_precision()", torch.get_float32_matmul_precision()))  # fmt: skip
    except RuntimeError:  # the newer fp32_precision API was mixed in: the legacy switches no longer answer
        owner = torch.backends.cudnn.conv if base in CONVOLUTIONS else torch.backends.cuda.matmul
        name = "torch.backends.cudnn.conv" if base in CONVOLUTIONS else "torch.backends.cuda.matmul"
        return ((f"{name}.fp32_precision", owner.fp32_precision),)


def matmul_issued(base: str, flat: list) -> None:
    """A matrix product or convolution issued on the stand-in: its precision at the call, for the recorders."""
    if not _RECORDERS or (base not in _MATMULS and base not in CONVOLUTIONS):
        return
    dtype = next((t.dtype for t in flat if isinstance(t, Rehearsed) and t.is_floating_point()), None)
    if dtype is None:
        return
    call = Call(base, str(dtype).removeprefix("torch."), precision_of(base, dtype), _switches(base))
    for recorder in _RECORDERS:
        recorder.append(call)


@contextlib.contextmanager
def _recording() -> Iterator[list[Call]]:
    """``with _recording() as calls:``: every matrix product and convolution issued on the stand-in in the block,
    with the precision in force when it was called."""
    calls: list[Call] = []
    _RECORDERS.append(calls)
    try:
        yield calls
    finally:
        _RECORDERS.remove(calls)


def _require(calls: list[Call], precision: str, what: str) -> None:
    """Raise when ``calls`` (from :func:`_recording`) is empty or any of them ran in another precision than
    ``precision``: the variant ``what`` was timed in a precision it does not claim."""
    if not calls:
        raise RehearsalError(f"{what}: no matrix product or convolution ran on the stand-in GPU while it was timed, "
                             f"so nothing ran in {precision} (rehearsal stand-in)")  # fmt: skip
    other = [c for c in calls if c.precision != precision]
    if other:
        first = other[0]
        said = ", ".join(f"{name} = {value!r}" for name, value in first.switches)
        raise RehearsalError(
            f"{what} is labelled {precision}, but {len(other)} of its {len(calls)} matrix products/convolutions ran "
            f"in {first.precision} ({first.op}, {first.dtype}): at the call {said}. The switches in force at the "
            "call decide the precision; set them before the timed calls, not after (rehearsal stand-in)"
        )


# SDPA backends ---------------------------------------------------------------------------------------------------
SDPA_OPS = {"flash": "aten::_scaled_dot_product_flash_attention",
            "efficient": "aten::_scaled_dot_product_efficient_attention",
            "cudnn": "aten::_scaled_dot_product_cudnn_attention",
            "math": "aten::_scaled_dot_product_attention_math"}  # fmt: skip
_ENUM = {1: "flash", 2: "efficient", 0: "math", 3: "cudnn"}  # at::SDPBackend (torch._C._get_sdp_priority_order)


def _enabled() -> dict[str, bool]:
    b = torch.backends.cuda
    return {"flash": b.flash_sdp_enabled(), "efficient": b.mem_efficient_sdp_enabled(), "math": b.math_sdp_enabled(),
            "cudnn": b.cudnn_sdp_enabled()}  # fmt: skip


def _order() -> list[str]:
    get = getattr(torch._C, "_get_sdp_priority_order", None)
    order = [_ENUM[i] for i in (get() if get else [1, 2, 0, 3]) if i in _ENUM]
    return order or ["flash", "efficient", "math", "cudnn"]


def _common(q: Any, k: Any, v: Any, enable_gqa: bool, ignore_singleton: bool, same_kv_heads: bool = True) -> str | None:
    """Constraints the fused kernels share (torch 2.14.1's installed ``ATen/native/transformers/sdp_utils_cpp.h``:
    check_tensor_shapes, check_batch_size_and_num_heads_dense with GQA and MQA support as sdp_utils.cpp declares it
    for CUDA, check_grouped_query_attention, check_nonzero_sequence_lengths_dense,
    check_last_dim_stride_equals_1_dense)."""
    if not (q.dim() == k.dim() == v.dim() == 4):
        return f"query, key and value must be 4-D (got {q.dim()}-D, {k.dim()}-D, {v.dim()}-D)"
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        return "query, key and value need the same batch size"
    hq, hk, hv = q.shape[1], k.shape[1], v.shape[1]
    if enable_gqa:
        if (same_kv_heads and hk != hv) or hq % hk or (not same_kv_heads and hq % hv):
            return f"enable_gqa needs key and value heads ({hk}, {hv}) equal and dividing the query heads ({hq})"
    elif not (hq == hk == hv) and not (hk == hv == 1):
        return f"query, key and value heads differ ({hq}, {hk}, {hv}) without enable_gqa=True"
    if min(q.shape[2], k.shape[2]) == 0:
        return "a sequence length is 0"
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.stride(-1) != 1 and not (ignore_singleton and t.shape[-1] == 1):
            return f"the {name}'s last dimension is not contiguous (stride {t.stride(-1)})"
    return None


def refusals(q: Any, k: Any, v: Any, attn_mask: Any, is_causal: bool, enable_gqa: bool) -> dict[str, str | None]:
    """Why each backend cannot run this call on an sm_90 GPU (None: it can), the runtime switches included."""
    enabled = _enabled()
    half = q.dtype in (torch.float16, torch.bfloat16)
    dq, dk, dv = q.shape[-1], k.shape[-1], v.shape[-1]
    out: dict[str, str | None] = {}
    # flash: sdp_utils.cpp can_use_flash_attention (check_for_attn_mask, check_head_dim_size_flash,
    # check_flash_causal_non_square_seqlens, check_dtypes_flash_attention)
    out["flash"] = (
        "disabled (sdpa_kernel or torch.backends.cuda.enable_flash_sdp)" if not enabled["flash"]
        else _common(q, k, v, enable_gqa, ignore_singleton=True)
        or ("it takes no attn_mask (an explicit mask, boolean or additive)" if attn_mask is not None else None)
        or (f"head dims must be equal and <= 256 (got {dq}, {dk}, {dv})"
            if not (dq == dk == dv and dq <= 256) else None)
        or (f"is_causal with {q.shape[-2]} queries and {k.shape[-2]} keys (it needs as many)"
            if is_causal and q.shape[-2] != k.shape[-2] else None)
        or (f"it needs FP16 or BF16 inputs (got {str(q.dtype).removeprefix('torch.')})" if not half else None)
    )  # fmt: skip
    # efficient: sdp_utils.cpp can_use_mem_efficient_attention (check_head_dim_size_mem_efficient with
    # minimum_gemm_alignment on sm80+, check_data_ptr_alignment_mem_efficient, dtypes FP16/FP32/BF16)
    align = 8 if half else 4
    offsets = [t.storage_offset() % align for t in (q, k, v) if t.numel()]
    out["efficient"] = (
        "disabled (sdpa_kernel or torch.backends.cuda.enable_mem_efficient_sdp)" if not enabled["efficient"]
        else _common(q, k, v, enable_gqa, ignore_singleton=False)
        or (f"it needs FP16, BF16 or FP32 inputs (got {str(q.dtype).removeprefix('torch.')})"
            if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) else None)
        or (f"head dims must be equal for query and key and divisible by {align} (got {dq}, {dk}, {dv})"
            if not (dq == dk and dq % align == 0 and dv % align == 0 and dq > 0 and dv > 0) else None)
        or ("query/key/value storage offsets are not aligned" if any(offsets) else None)
    )  # fmt: skip
    # cuDNN: sdp_utils.cpp can_use_cudnn_attention (modelled in part: dtypes, head dim, determinism)
    out["cudnn"] = (
        "disabled (sdpa_kernel or torch.backends.cuda.enable_cudnn_sdp)" if not enabled["cudnn"]
        else _common(q, k, v, enable_gqa, ignore_singleton=True, same_kv_heads=False)
        or ("cuDNN SDPA is not deterministic (torch.use_deterministic_algorithms)"
            if torch.are_deterministic_algorithms_enabled()
            and not torch.is_deterministic_algorithms_warn_only_enabled() else None)
        or (f"it needs FP16 or BF16 inputs (got {str(q.dtype).removeprefix('torch.')})" if not half else None)
        or (f"head dims must be <= 128 and divisible by 8 (got {dq}, {dv})"
            if not (dq <= 128 and dv <= 128 and dq % 8 == 0 and dv % 8 == 0) else None)
    )  # fmt: skip
    out["math"] = None if enabled["math"] else "disabled (sdpa_kernel or torch.backends.cuda.enable_math_sdp)"
    return out


def choose_sdpa(q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False,
                enable_gqa: bool = False) -> str:  # fmt: skip
    """The backend CUDA's ``select_sdp_backend`` takes for this call (the first in priority order that can run it);
    raises CUDA's "No available kernel" with every backend's reason when none can."""
    why = refusals(q, k, v, attn_mask, is_causal, enable_gqa)
    for backend in _order():
        if why.get(backend) is None:
            STATE.count(f"SDPA calls on the {backend} kernel")
            return backend
    STATE.count("SDPA calls with no available kernel")
    reasons = "; ".join(f"{b}: {why[b]}" for b in ("flash", "efficient", "cudnn", "math"))
    raise RehearsalError(f"No available kernel. Aborting execution. (rehearsal stand-in, an sm_90 GPU's rules: "
                         f"{reasons})")  # fmt: skip


def sdpa(func: Any, args: tuple, kwargs: dict) -> Any:
    """``F.scaled_dot_product_attention`` on stand-in tensors: the backend CUDA would choose (or its error), then
    the math kernel under that backend's name."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
    given = dict(zip(names, args, strict=False)) | kwargs
    q, k, v = given["query"], given["key"], given["value"]
    backend = choose_sdpa(q, k, v, given.get("attn_mask"), bool(given.get("is_causal", False)),
                          bool(given.get("enable_gqa", False)))  # fmt: skip
    dropout = float(given.get("dropout_p", 0.0) or 0.0)
    if dropout:
        raise RehearsalError("scaled_dot_product_attention with dropout_p > 0 (training) is not modelled by the "
                             "rehearsal")  # fmt: skip
    with torch.autograd.profiler.record_function(SDPA_OPS[backend]), MODEL.clock.naming(SDPA_OPS[backend]):
        out = _math(q, k, v, given.get("attn_mask"), bool(given.get("is_causal", False)), given.get("scale"),
                    bool(given.get("enable_gqa", False)))  # fmt: skip
    return out


def _math(q: Any, k: Any, v: Any, mask: Any, is_causal: bool, scale: Any, enable_gqa: bool) -> Any:
    """The math backend in operators on the stand-in tensors (torch's own math kernel makes its causal mask with a
    CUDA factory, which a CPU build cannot run)."""
    if enable_gqa and k.dim() >= 3 and q.shape[-3] != k.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = (t.unsqueeze(-3).expand(*t.shape[:-2], group, *t.shape[-2:]).flatten(-4, -3) for t in (k, v))
    scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if is_causal:
        keep = q.new_ones((q.shape[-2], k.shape[-2]), dtype=torch.bool).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf")) if mask.dtype == torch.bool else scores + mask
    return scores.softmax(-1) @ v


# the profiler's device activity ----------------------------------------------------------------------------------
def profiler_patches(patch: Any) -> None:
    """Install, with ``patch(owner, name, value)``, the device events of a profile that asked for CUDA activity."""
    from torch.autograd import profiler as autograd_profiler
    from torch.autograd.profiler_util import DeviceType, FunctionEvent
    from torch.profiler import profiler as torch_profiler

    kineto = torch_profiler._KinetoProfile
    real_prepare, inner = kineto.prepare_trace, autograd_profiler.profile
    real_start, real_exit, real_ensure = inner._start_trace, inner.__exit__, inner._ensure_function_events

    def prepare_trace(self: Any) -> None:
        real_prepare(self)
        if getattr(self, "_rehearsal_cuda", False) and self.profiler is not None:
            self.profiler._rehearsal_cuda = True

    def start_trace(self: Any) -> None:
        real_start(self)
        if getattr(self, "_rehearsal_cuda", False):
            self._rehearsal_kernels, self._rehearsal_origin = [], MODEL.clock.now()
            self._rehearsal_added = False
            MODEL.clock.recorders.append(self._rehearsal_kernels)

    def exit_(self: Any, *exc: Any) -> Any:
        kernels = getattr(self, "_rehearsal_kernels", None)
        if kernels is not None and any(kernels is r for r in MODEL.clock.recorders):
            if exc[0] is None:
                MODEL.sync_all("the profiler's exit")  # the CUDA profiler synchronizes before it stops
            MODEL.clock.recorders[:] = [r for r in MODEL.clock.recorders if r is not kernels]
            STATE.count("profiles with device activity")
            if not kernels:
                STATE.count("profiles asking for CUDA activity that recorded none")
                STATE.note("torch.profiler.profile was asked for ProfilerActivity.CUDA and recorded no CUDA kernel: "
                           "the profiled work ran on the CPU (a model or input left off the GPU?)")  # fmt: skip
        return real_exit(self, *exc)

    def ensure(self: Any) -> None:
        real_ensure(self)
        kernels = getattr(self, "_rehearsal_kernels", None)
        if kernels is None or getattr(self, "_rehearsal_added", True) or self._function_events is None:
            return
        self._rehearsal_added = True
        origin = self._rehearsal_origin
        events = self._function_events
        next_id = max((e.id for e in events), default=0) + 1
        for i, (name, start, end, sid) in enumerate(kernels):
            events.append(FunctionEvent(id=next_id + i, name=name, thread=sid, start_us=(start - origin) * 1e6,
                                        end_us=(end - origin) * 1e6, use_device="cuda", device_type=DeviceType.CUDA,
                                        device_index=0, stack=[]))  # fmt: skip
        for e in events:
            e.use_device = "cuda"

    patch(kineto, "prepare_trace", prepare_trace)
    patch(inner, "_start_trace", start_trace)
    patch(inner, "__exit__", exit_)
    patch(inner, "_ensure_function_events", ensure)
