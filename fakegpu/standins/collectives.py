"""Stand-in rule for ``torch.distributed`` collectives on the rehearsal's CUDA device: they are asynchronous.

On NCCL, ``dist.all_reduce(t)`` on a CUDA tensor returns once the collective is *queued* on the GPU, not when the
sum has arrived; a host clock read right after it (``time.perf_counter() - start``) times the launch. gloo on a
CPU returns when the work is done, so code written on a CPU times the collective correctly there and wrongly on a
GPU. With the rule installed (inside a rehearsal), a collective on a stand-in CUDA tensor of a
one-rank world (the only world one process can rehearse) leaves its work queued on the current stream, as NCCL
does: the rehearsal's timer rule (:func:`fakegpu.standins.rehearsal._timer`) then stops a host-clock
timing that did not wait, and CUDA events recorded around the call, or a ``torch.cuda.synchronize()`` before the
clock is read, time it as on a GPU. Its values are those of one rank: the sum, the gather of one tensor.

:func:`install` takes the rehearsal's ``patch(owner, name, value)`` (as :func:`.packages.install` does), for
``rehearsal.activate`` to call (a test passes ``monkeypatch.setattr``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

_NAMES = ("all_reduce", "all_gather", "broadcast")


def _standin(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cuda"


def _one_rank(group: Any) -> bool:
    return not dist.is_initialized() or dist.get_world_size(group) == 1


def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    """``dist.<name>`` that queues its work on the stand-in stream for a stand-in CUDA tensor of one rank."""

    def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
        if not (_standin(tensor) and _one_rank(group)):
            return real(tensor, *([op] if op is not None else []), group=group, async_op=async_op)
        tensor.add_(0)  # one rank's sum (or max, min, average) is the tensor itself: queued, not waited for
        return None

    def all_gather(tensor_list: Any, tensor: Any, group: Any = None, async_op: bool = False) -> Any:
        if not (_standin(tensor) and _one_rank(group)):
            return real(tensor_list, tensor, group=group, async_op=async_op)
        tensor_list[0].copy_(tensor)  # queued on the current stream
        return None

    def broadcast(tensor: Any, src: int = 0, group: Any = None, async_op: bool = False) -> Any:
        if not (_standin(tensor) and _one_rank(group)):
            return real(tensor, src, group=group, async_op=async_op)
        tensor.add_(0)
        return None

    return {"all_reduce": all_reduce, "all_gather": all_gather, "broadcast": broadcast}[name]


def install(patch: Callable[[Any, str, Any], None]) -> None:
    """Install the rule with the rehearsal's ``patch(owner, name, value)`` (undone by its deactivate)."""
    for name in _NAMES:
        patch(dist, name, wrap(name, getattr(dist, name)))
