"""What the exercise checkers observe: the operators that really ran, random cases, forbidden shortcuts.

A checker must see the technique where it runs, not where a Python hook can be bypassed:

* :class:`OpLog` is a ``TorchDispatchMode``: every ATen operator that runs **on this thread** while it is active
  is logged with its input and output dtypes, devices and shapes, and which watched tensors (a model's weights,
  by storage) it read. Work moved to numpy, to another thread or to a throwaway input does not show up as the
  operators the checker expects, so it is rejected.
* :func:`cases` draws a checker's random cases from a seed chosen per call (``COURSE_EXERCISE_SEED`` fixes it);
  a failure message ends with the seed, so the learner can rerun the same case;
* :func:`gpu` gives the device a GPU technique targets (the real GPU, or the rehearsal's CPU stand-in), so a
  case can be drawn where the technique runs;
* :func:`forbid` makes named shortcuts raise (``model.generate`` inside a decode loop, ``torch.cuda.synchronize``
  ...) with a message naming the mistake.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass(frozen=True)
class Op:
    """One operator call seen by :class:`OpLog`."""

    name: str  # e.g. "aten.addmm.default"
    in_dtypes: tuple[torch.dtype, ...]
    out_dtypes: tuple[torch.dtype, ...]
    devices: tuple[str, ...]
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    watched: frozenset[str]  # names of the watched tensors this op read
    thread: int


# Ops whose output is the same weight in another dtype, layout or view (autocast's casts, linear's transpose).
_DERIVES = (
    "_to_copy",
    "aten.t.",
    "aten.view",
    "aten.transpose",
    "aten.permute",
    "aten.contiguous",
    "aten.clone",
    "aten.expand",
    "aten.detach",
    "aten._reshape_alias",
    "aten.reshape",
    "aten.alias",
    "aten.to.",
)


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (meta, some subclasses)
        return None


class OpLog(TorchDispatchMode):
    """Log every operator that runs on this thread while active: ``with OpLog(watch=model) as log: model(x)``.

    ``watch`` names tensors whose use should be seen: a module (its parameters and buffers, by name) or a
    ``{name: tensor}`` mapping. They are matched by storage, so views (a transposed weight) count as a read.
    """

    def __init__(self, watch: torch.nn.Module | dict[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.ops: list[Op] = []
        self._watched: dict[int, str] = {}
        items: Iterable[tuple[str, torch.Tensor]]
        if isinstance(watch, torch.nn.Module):
            items = list(watch.named_parameters()) + list(watch.named_buffers())
        elif isinstance(watch, dict):
            items = watch.items()
        else:
            items = ()
        for name, t in items:
            key = _storage_key(t)
            if key:
                self._watched[key] = name
        self._thread = threading.get_ident()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        flat_out = [a for a in tree_flatten(out)[0] if isinstance(a, torch.Tensor)]
        watched = frozenset(
            self._watched[k] for k in (_storage_key(a) for a in flat_in) if k is not None and k in self._watched
        )
        if watched and any(f in str(func) for f in _DERIVES):  # a cast or view of a weight is still that weight
            for a in flat_out:
                key = _storage_key(a)
                if key:
                    self._watched[key] = "+".join(sorted(watched))
        self.ops.append(
            Op(
                name=str(func),
                in_dtypes=tuple(a.dtype for a in flat_in),
                out_dtypes=tuple(a.dtype for a in flat_out),
                devices=tuple(sorted({a.device.type for a in flat_in + flat_out})),
                in_shapes=tuple(tuple(a.shape) for a in flat_in),
                out_shapes=tuple(tuple(a.shape) for a in flat_out),
                watched=watched,
                thread=threading.get_ident(),
            )
        )
        return out

    # Questions a checker asks of the log.
    def named(self, *fragments: str) -> list[Op]:
        """The logged ops whose name contains any of ``fragments`` (``"conv"``, ``"addmm"``, ``"mm"``...)."""
        return [op for op in self.ops if any(f in op.name for f in fragments)]

    def counts(self) -> Counter[str]:
        """How many times each operator ran."""
        return Counter(op.name for op in self.ops)

    def reads(self, name: str) -> list[Op]:
        """The ops that read the watched tensor ``name`` (e.g. ``"fc.weight"``), directly or through a cast/view."""
        return [op for op in self.ops if any(name in w.split("+") for w in op.watched)]

    def watched_read(self) -> set[str]:
        """Names of every watched tensor some op read (directly or through a cast or view)."""
        return {n for op in self.ops for w in op.watched for n in w.split("+")}


MATMUL_OPS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.matmul", "aten.linear", "aten._int_mm")
CONV_OPS = ("aten.convolution", "aten.conv2d", "aten.conv1d", "aten._convolution", "aten.mkldnn_convolution")


class Cases:
    """A checker's source of random cases for one call: ``rng`` (random.Random) and ``torch_gen``, from ``seed``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.torch_gen = torch.Generator().manual_seed(seed)

    def randn(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=self.torch_gen, dtype=dtype)

    def randint(self, low: int, high: int) -> int:
        """An integer in [low, high] (both included)."""
        return self.rng.randint(low, high)

    def choice(self, seq: list[Any]) -> Any:
        return self.rng.choice(seq)


@contextlib.contextmanager
def cases(key: str) -> Iterator[Cases]:
    """Random cases for one checker call; an AssertionError raised inside gets the seed appended.

    The seed is fresh per call (so no table of answers passes) unless the test's ``verdict(..., seed=)`` or
    ``COURSE_EXERCISE_SEED`` fixes it (a value that is not a seed raises ``exercises.SeedError``).
    """
    from course_checks.exercises import drew, fixed_seed

    fixed = fixed_seed()
    seed = fixed if fixed is not None else random.SystemRandom().randrange(2**31)
    drew(seed)
    try:
        yield Cases(seed)
    except AssertionError as exc:
        note = f"[{key}: random case seed {seed}; COURSE_EXERCISE_SEED={seed} repeats it]"
        raise AssertionError(f"{exc} {note}") from None


@contextlib.contextmanager
def gpu() -> Iterator[str]:
    """The device GPU techniques target, ``"cuda"``: the real GPU where there is one, else the rehearsal's CPU
    stand-in (its "cuda" tensors enforce placement; activated for the block unless a rehearsal already runs).

    A checker draws a case on it so that code written for one device only (``torch.autocast("cpu")`` hard-coded,
    ``empty_cache`` guarded by ``torch.cuda.is_available()``) is judged where it would run.
    """
    from fakegpu.standins import rehearsal

    if rehearsal.active() or not rehearsal.no_real_gpu():
        yield "cuda"
        return
    rehearsal.activate()
    try:
        yield "cuda"
    finally:
        rehearsal.deactivate()


def on_standin() -> bool:
    """True when "cuda" is the rehearsal's CPU stand-in (inside :func:`gpu` on a machine without a GPU)."""
    from fakegpu.standins import rehearsal

    return rehearsal.active() and rehearsal.no_real_gpu()


@contextlib.contextmanager
def forbid(**targets: tuple[Any, str]) -> Iterator[None]:
    """Make shortcuts raise while active: ``forbid(generate=(model, "call the model, not generate()"))``.

    Each keyword names an attribute; its value is ``(owner, message)``. Calling ``owner.<name>`` raises
    AssertionError with ``message``. The attributes are restored on exit.
    """
    saved = []
    try:
        for name, (owner, message) in targets.items():
            had = name in vars(owner) if hasattr(owner, "__dict__") else False
            saved.append((owner, name, had, getattr(owner, name, None)))

            def refuse(*_a: Any, _m: str = message, **_k: Any) -> Any:
                raise AssertionError(_m)

            setattr(owner, name, refuse)
        yield
    finally:
        for owner, name, had, old in reversed(saved):
            if had:
                setattr(owner, name, old)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
