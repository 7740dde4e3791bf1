"""Each operator on stand-in "CUDA" tensors: checked, placed on the device clock, queued on its stream.

:meth:`Rehearsed.__torch_dispatch__ <.tensor.Rehearsed>` sends every operator here. In order:

* **placement**: a CPU tensor (not a 0-dim scalar) meeting a stand-in CUDA tensor raises CUDA's own "Expected all
  tensors to be on the same device" (copies and CPU index tensors into a CUDA tensor are allowed, as on CUDA; a
  CUDA index into a CPU tensor is not);
* **copies between host and device** follow CUDA's rules (:func:`to_device`, :func:`_to_host`): blocking copies
  wait for the current stream; ``non_blocking=True`` is asynchronous only with pinned host memory; from pageable
  memory it runs synchronously (and on a side stream, where it can only be meant to overlap, it is an error);
  a non-blocking copy to the host lands when the host waits for its stream;
* **graph capture** records the operator for replay instead of queueing it (:mod:`.graphs`);
* **views** (``view``, ``transpose``, slices) are made at once: they read no data;
* everything else gets its outputs' shapes from a meta run, is checked for stream order (:mod:`.order`), placed on
  the device timeline (:mod:`.clock`) and queued (:mod:`.streams`): it computes when something waits for it.
  Operators whose output size depends on the data (``nonzero``) make the host wait, as on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fakegpu.standins import clock as costs
from fakegpu.standins import copies, kernels
from fakegpu.standins.cuda import gpu_only_op
from fakegpu.standins.issue import order, place
from fakegpu.standins.streams import MODEL
from fakegpu.standins.tensor import (
    HOOKS,
    STATE,
    RehearsalError,
    Rehearsed,
    fmap,
    key_of,
    leaves,
    poison,
    unwrap,
    wrap,
)

# operators that may legally mix a CPU tensor with a CUDA one (copies; CPU index tensors; metadata checks)
_MIXED_OK = {"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "index", "index_put_", "index_put",
             "lift_fresh", "set_", "_index_put_impl_", "_has_compatible_shallow_copy_type", "is_same_size"}  # fmt: skip
_INDEX = {"index", "index_put_", "index_put", "_index_put_impl_"}
_HOST_READ = {"_local_scalar_dense", "equal", "is_nonzero", "allclose", "item"}
_INPLACE_VIEW = {"transpose_", "t_", "squeeze_", "unsqueeze_", "as_strided_", "swapdims_", "swapaxes_", "detach_"}
_DATA_DEPENDENT = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim",
                   "bincount", "repeat_interleave", "argwhere", "nonzero_numpy", "_assert_async", "set_", "resize_",
                   "_local_scalar_dense"}  # fmt: skip
_ALLOCATE_ONLY = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


def name_of(func: Any) -> tuple[str, str]:
    name = func._schema.name.split("::")[-1]
    return name + (f".{func._overloadname}" if func._overloadname != "default" else ""), name


def _placement(base: str, name: str, args: tuple, flat: list) -> None:
    cuda_in = [t for t in flat if isinstance(t, Rehearsed)]
    cpu_in = [t for t in flat if isinstance(t, torch.Tensor) and not isinstance(t, Rehearsed) and t.dim() > 0]
    if not (cpu_in and cuda_in):
        return
    if base in _INDEX and args and not isinstance(args[0], Rehearsed):
        STATE.count("placement violations")
        raise RehearsalError(
            "indices should be either on cpu or on the same device as the indexed tensor (cpu) (rehearsal "
            "stand-in: a CUDA index tensor into a CPU tensor; move the index to the CPU, or the tensor to 'cuda')"
        )
    if base not in _MIXED_OK and name not in _MIXED_OK:
        STATE.count("placement violations")
        raise RehearsalError(
            "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
            f"(when checking argument for {base}; rehearsal stand-in: move the CPU tensor or the module to "
            "'cuda', or the CUDA one to 'cpu')"
        )


def _meta(obj: Any) -> Any:
    def one(t: Any) -> Any:
        if isinstance(t, torch.Tensor):
            e = t.elem if isinstance(t, Rehearsed) else t
            return torch.empty_strided(e.shape, e.stride(), dtype=e.dtype, device="meta")
        if isinstance(t, torch.device) and t.type == "cuda":
            return torch.device("meta")
        return t

    return fmap(one, obj)


def _host_args(obj: Any) -> Any:
    """Arguments as the queued work will see them: stand-ins unwrapped, CPU tensors (indices) copied now."""

    def one(t: Any) -> Any:
        if isinstance(t, Rehearsed):
            return t.elem
        if isinstance(t, torch.Tensor):
            return t.clone()
        if isinstance(t, torch.device) and t.type == "cuda":
            return torch.device("cpu")
        return t

    return fmap(one, obj)


def _composite(func: Any) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


def _no_pin(kwargs: dict) -> dict:
    return {k: v for k, v in kwargs.items() if k != "pin_memory"}


def _kwargs(kwargs: dict) -> dict:
    out = _no_pin(kwargs)
    if isinstance(out.get("device"), (str, torch.device)) and torch.device(out["device"]).type == "cuda":
        out["device"] = torch.device("cpu")
    return out


def _arg(func: Any, args: tuple, kwargs: dict, index: int) -> Any:
    arg = func._schema.arguments[index]
    return args[index] if index < len(args) else kwargs.get(arg.name)


def _written(func: Any, args: tuple, kwargs: dict) -> list[Rehearsed]:
    out = []
    for i, arg in enumerate(func._schema.arguments):
        value = _arg(func, args, kwargs, i)
        if arg.alias_info is not None and arg.alias_info.is_write:
            out += [v for v in leaves(value) if isinstance(v, Rehearsed)]
    return out


def _alias_of(func: Any, args: tuple, kwargs: dict, ret: Any) -> Any:
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.before_set == ret.alias_info.before_set:
            return _arg(func, args, kwargs, i)
    return None


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    name, base = name_of(func)
    gpu_only_op(base)
    flat = leaves((args, kwargs))
    _placement(base, name, args, flat)
    STATE.count("placement checks")
    MODEL.raise_deferred()
    if base == "copy_" and isinstance(args[1], torch.Tensor):
        non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
        if not isinstance(args[0], Rehearsed):
            return copies.to_host(args[1], non_blocking, dst=args[0])
        if not isinstance(args[1], Rehearsed):
            return copies.to_device(args[1], non_blocking, dst=args[0])
    if base in {"_to_copy", "to"}:
        target = kwargs.get("device") or next((a for a in args[1:] if isinstance(a, (torch.device, str))), None)
        if target is not None and torch.device(target).type == "cpu":
            dtype = kwargs.get("dtype") or next((a for a in args[1:] if isinstance(a, torch.dtype)), None)
            non_blocking = kwargs.get("non_blocking") or any(a is True for a in args[1:3] if isinstance(a, bool))
            return copies.to_host(args[0], bool(non_blocking), convert={"dtype": dtype} if dtype else {})
    capture = STATE.capture
    if base in _HOST_READ:
        if capture is not None:
            capture.forbid(f"a host read ({base}: .item(), .tolist(), bool(), printing)")
        MODEL.wait_current(f"a host read ({base})")
        order(name, base, {key_of(t.elem) for t in flat if isinstance(t, Rehearsed)}, set(), set())
        return func(*unwrap(args), **unwrap(kwargs))
    rets = func._schema.returns
    if base in _INPLACE_VIEW:  # metadata only: done at once (the wrapper returned carries the new shape)
        return wrap(func(*unwrap(args), **unwrap(kwargs)))
    if any(r.alias_info and not r.alias_info.is_write for r in rets) and _composite(func):
        return func.decompose(*args, **kwargs)  # may copy (reshape, contiguous, to): its parts are dispatched
    if not any("Tensor" in str(r.type) for r in rets) or any(r.alias_info and not r.alias_info.is_write for r in rets):
        out = func(*unwrap(args), **_kwargs(unwrap(kwargs)))  # a view or a metadata query: no data is read
        if torch.is_inference_mode_enabled() and any(isinstance(t, Rehearsed) and not t.is_inference() for t in flat):
            with torch.inference_mode(False):  # a view of a normal tensor made in inference mode is a normal one
                return fmap(lambda t: wrap(t) if isinstance(t, torch.Tensor) else t, out)
        return fmap(lambda t: wrap(t) if isinstance(t, torch.Tensor) else t, out)
    run_func = func
    if base == "cudnn_batch_norm":  # CUDA picks cuDNN's kernel for a "cuda" tensor; its CPU twin has 3 outputs
        run_func = _cudnn_batch_norm
    try:
        if base in _DATA_DEPENDENT:
            raise NotImplementedError(base)
        meta_out, cost = _meta_run(func, base, args, kwargs, flat)
    except Exception:  # noqa: BLE001 - no meta kernel, or an output size that depends on the data
        if capture is not None:
            capture.forbid(f"'{base}', whose output size depends on the data (it synchronizes with the host)")
        return _at_once(func, run_func, name, base, args, kwargs)
    outs, fresh = _outputs(func, args, kwargs, meta_out, poisoned=capture is not None)
    written = _written(func, args, kwargs)
    reads = {key_of(t.elem) for t in flat if isinstance(t, Rehearsed)}
    host_args, host_kwargs = _host_args(args), _host_args(_kwargs(kwargs))
    fresh_elems = [(slot, t.elem) for slot, t in fresh]
    if capture is not None:
        keys = reads | {key_of(t.elem) for t in written}
        capture.record(run_func, host_args, host_kwargs, fresh_elems, keys, cost, base)
        for _, t in fresh_elems:
            MODEL.made(key_of(t), MODEL.current)  # memory of the graph's private pool, on the capture stream
        return outs
    clock = order(name, base, reads, {key_of(t.elem) for t in written}, {key_of(t) for _, t in fresh_elems})
    kernels.matmul_issued(base, flat)
    if base in kernels.CONVOLUTIONS:
        kernels.convolution_issued(base, _meta(args), _meta(_no_pin(kwargs)), meta_out)
    place("compute", *cost, name=f"aten::{base}")
    if base not in _ALLOCATE_ONLY:
        MODEL.enqueue(MODEL.current, clock, lambda: run_into(run_func, host_args, host_kwargs, fresh_elems))
    return outs


_META: dict[tuple, tuple] = {}  # operator and argument signature -> (meta outputs, cost): loops repeat shapes
_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


def _signature(func: Any, args: tuple, kwargs: dict, flat: list) -> tuple | None:
    parts: list[Any] = [func, len(args), tuple(kwargs), costs.tf32_state()]
    for leaf in flat:
        if isinstance(leaf, torch.Tensor):
            e = leaf.elem if isinstance(leaf, Rehearsed) else leaf
            parts.append((tuple(e.shape), e.stride(), e.dtype, isinstance(leaf, Rehearsed)))
        elif isinstance(leaf, _SCALARS):
            parts.append((type(leaf), leaf))
        else:
            return None
    return tuple(parts)


def _meta_run(func: Any, base: str, args: tuple, kwargs: dict, flat: list) -> tuple[Any, tuple[float, float]]:
    """The operator's outputs on meta tensors (shapes, strides, dtypes) and its cost on the stand-in's clock."""
    key = _signature(func, args, kwargs, flat)
    if key is not None and key in _META:
        return _META[key]
    margs, mkwargs = _meta(args), _meta(_no_pin(kwargs))
    meta_out = func(*margs, **mkwargs)
    found = meta_out, costs.kernel_cost(func, base, margs, mkwargs, meta_out)
    if key is not None:
        if len(_META) > 8192:
            _META.clear()
        _META[key] = found
    return found


def _cudnn_batch_norm(*args: Any, **kwargs: Any) -> tuple:
    out = torch.ops.aten.native_batch_norm.default(*args, **kwargs)
    return (*out, torch.empty(0, dtype=torch.uint8))


def run_into(func: Callable[..., Any], args: Any, kwargs: Any, fresh: list[tuple[int, torch.Tensor]]) -> None:
    """Compute an operator on the host tensors; write its fresh outputs (by position among the result's leaves)
    into the memory handed out at issue."""
    produced = leaves(func(*args, **kwargs))
    for slot, out in fresh:
        out.copy_(produced[slot])


def _outputs(func: Any, args: tuple, kwargs: dict, meta_out: Any, poisoned: bool) -> tuple[Any, list]:
    """Stand-in outputs shaped like the meta run's (fresh memory), or the written arguments for in-place returns;
    and [(position among the result's leaves, fresh output)]."""
    rets = func._schema.returns
    metas = list(meta_out) if len(rets) > 1 else [meta_out]
    fresh: list[tuple[int, Rehearsed]] = []
    result = []
    offset = 0
    for ret, m in zip(rets, metas, strict=True):
        if ret.alias_info is not None and ret.alias_info.is_write:
            result.append(_alias_of(func, args, kwargs, ret))
            offset += len(leaves(m))
            continue

        def alloc(leaf: Any) -> Any:
            nonlocal offset
            offset += 1
            if not isinstance(leaf, torch.Tensor):
                return leaf
            t = torch.empty_strided(leaf.shape, leaf.stride(), dtype=leaf.dtype)
            out = wrap(poison(t) if poisoned else t)
            fresh.append((offset - 1, out))
            return out

        result.append(fmap(alloc, m))
    return (tuple(result) if len(rets) > 1 else result[0]), fresh


def _at_once(func: Any, run_func: Any, name: str, base: str, args: tuple, kwargs: dict) -> Any:
    """An operator that cannot be queued (no meta kernel, data-dependent size): the host waits, then it runs."""
    STATE.count("operators run at once (the host waited)")
    MODEL.wait_current(f"'{base}' (its output size depends on the data)")
    flat = leaves((args, kwargs))
    before = {key_of(t.elem) for t in flat if isinstance(t, Rehearsed)}
    written = {key_of(t.elem) for t in _written(func, args, kwargs)}
    out = run_func(*unwrap(args), **_kwargs(unwrap(kwargs)))
    new = {key_of(t) for t in leaves(out) if isinstance(t, torch.Tensor) and key_of(t) not in before}
    order(name, base, before, written, new)
    place("compute", costs.LAUNCH_S, name=f"aten::{base}")
    return fmap(lambda t: wrap(t) if isinstance(t, torch.Tensor) and not isinstance(t, Rehearsed) else t, out)


HOOKS.dispatch, HOOKS.run_into = dispatch, run_into  # what tensor.py and graphs.py call (they sit below this file)
