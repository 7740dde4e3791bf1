"""A fake ``pycuda`` built from pycuda 2026.1's own source, enforcing what CUDA enforces on a runner.

pycuda cannot be built or imported on a CPU machine (it links libcuda). Its API was read from the sdist
(``pip download --no-deps pycuda==2026.1``): the names and argument names its C++ wrapper registers
(``src/wrapper/wrap_cudadrv.cpp``: ``py::def``, ``py::class_``), the Python-level functions of
``pycuda/driver.py`` and the two context modules; they are kept in ``pycuda_2026_1_api.json``.

The fake (:class:`FakePycuda`) accepts only names in that snapshot (others raise ``AttributeError`` naming
pycuda 2026.1) and keyword arguments the wrapper declares; the functions a TensorRT runner needs are
simulated on host memory, with CUDA's rules:

* ``pagelocked_empty`` returns a pinned host array (filled with garbage, as real memory is);
  ``memcpy_*_async`` refuse pageable (ordinary numpy) host memory and a missing stream (the default
  stream synchronizes with every other one);
* ``mem_alloc`` returns a device allocation; ``int(alloc)`` is its device pointer (the fake TensorRT reads
  and writes there); a host array where a device buffer belongs is refused;
* ``memcpy_dtoh_async`` is only queued: the host buffer holds the result after ``stream.synchronize()``;
* ``pycuda.autoinit`` makes a second context (recorded in ``contexts``); ``autoprimaryctx`` retains the
  primary one, PyTorch's.

``FakePycuda.log`` records (call, stream handle, ...) tuples for tests.

With ``device=True`` (the rehearsal, which puts it in ``sys.modules`` when pycuda is not installed) it runs on
the stand-in GPU: ``mem_alloc`` memory is stand-in CUDA memory (the fake TensorRT accepts its pointers), a pycuda
stream is a stand-in stream (its ``handle`` is one TensorRT accepts), async copies are queued on it in stream
order and run when the host waits (a device-to-host copy's buffer holds NaN until ``stream.synchronize()``), and
``import pycuda.autoinit`` raises: it would make a second CUDA context beside PyTorch's.
"""

from __future__ import annotations

import importlib.abc
import itertools
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

from fakegpu.standins.tensor import RehearsalError

SNAPSHOT = Path(__file__).with_name("pycuda_2026_1_api.json")


class PinnedArray(np.ndarray):
    """A page-locked host array (what ``pagelocked_empty`` returns)."""


class FakePycudaError(RehearsalError):
    """What real CUDA would reject (or silently get wrong) in a runner."""


class DeviceAllocation:
    """Device memory: ``int()`` gives the device pointer."""

    def __init__(self, fake: FakePycuda, nbytes: int) -> None:
        self._fake = fake
        self._mem = np.full(int(nbytes), 0xA5, dtype=np.uint8)  # device memory starts as garbage
        self.nbytes = int(nbytes)
        self._tensor = None
        if fake.device:  # stand-in CUDA memory (cuMemAlloc: no stream): a device pointer TensorRT accepts
            import torch

            from fakegpu.standins.tensor import wrap

            self._tensor = wrap(torch.full((int(nbytes),), 0xA5, dtype=torch.uint8))
            self._mem = self._tensor.elem.numpy()

    def __int__(self) -> int:
        if self._tensor is not None:
            return int(self._tensor.data_ptr())
        return int(self._mem.ctypes.data)

    __index__ = __int__

    def free(self) -> None:
        self._fake.allocations.pop(int(self), None)

    def __getattr__(self, name: str) -> Any:
        _check_name(self._fake, "DeviceAllocation", name)
        raise NotImplementedError(f"fake pycuda does not simulate DeviceAllocation.{name}")


def _check_name(fake: FakePycuda, cls: str, name: str) -> None:
    if name not in fake.spec["classes"].get(cls, []):
        raise AttributeError(f"pycuda 2026.1's {cls} has no attribute '{name}'")


def _check_kwargs(fake: FakePycuda, func: str, args: tuple, kwargs: dict) -> None:
    params = fake.spec["driver_functions"][func] or []
    unknown = [k for k in kwargs if k not in params]
    if unknown or len(args) + len(kwargs) > len(params):
        raise TypeError(
            f"pycuda.driver.{func}() takes ({', '.join(params)}); got {len(args)} positional "
            f"and keywords {sorted(kwargs)}"
        )


class Stream:
    """A pycuda stream: a non-zero ``handle``; queued device-to-host copies land at ``synchronize()``."""

    _handles = itertools.count(0x7000)

    def __init__(self, fake: FakePycuda, flags: int = 0) -> None:
        self._fake, self.handle, self._pending = fake, next(Stream._handles), []
        self._standin = None
        if fake.device:  # a stand-in stream: the fake TensorRT's execute_async_v3 accepts its handle
            from fakegpu.standins.streams import StandinStream

            self._standin = StandinStream(_name=f"pycuda stream {len(fake.streams)}")
            self.handle = self._standin.cuda_stream
        fake.streams[self.handle] = self

    def synchronize(self) -> None:
        if self._standin is not None:
            from fakegpu.standins.streams import MODEL

            MODEL.host_sync(self._standin.clock, "pycuda Stream.synchronize()", self._standin.ready)
        for copy in self._pending:
            copy()
        self._pending.clear()
        self._fake.log.append(("synchronize", self.handle))

    def is_done(self) -> bool:
        return not self._pending and (self._standin is None or not self._standin.queue)

    def __getattr__(self, name: str) -> Any:
        _check_name(self._fake, "Stream", name)
        raise NotImplementedError(f"fake pycuda does not simulate Stream.{name}")


class FakePycuda:
    """The modules ``pycuda``, ``pycuda.driver``, ``pycuda.autoprimaryctx``, ``pycuda.autoinit``."""

    def __init__(self, device: bool = False) -> None:
        self.device = device
        self.spec = json.loads(SNAPSHOT.read_text())
        self.log: list[tuple] = []
        self.allocations: dict[int, DeviceAllocation] = {}
        self.streams: dict[int, Stream] = {}
        self.contexts: list[str] = []
        self.driver = self._driver()

    # ---- the driver module
    def _driver(self) -> types.ModuleType:
        fake = self
        known = set(self.spec["driver_functions"]) | set(self.spec["driver_python_functions"])
        known |= set(self.spec["classes"])

        class Driver(types.ModuleType):
            def __getattr__(self, name: str) -> Any:
                if name.startswith("__"):
                    raise AttributeError(name)
                if name not in known:
                    raise AttributeError(f"module 'pycuda.driver' (pycuda 2026.1) has no attribute '{name}'")
                raise NotImplementedError(f"fake pycuda does not simulate pycuda.driver.{name}")

        drv = Driver("pycuda.driver")
        drv.Stream = lambda flags=0: Stream(fake, flags)
        drv.DeviceAllocation = DeviceAllocation
        drv.init = lambda flags=0: None

        def pagelocked_empty(*args, **kwargs):
            _check_kwargs(fake, "pagelocked_empty", args, kwargs)
            bound = dict(zip(["shape", "dtype", "order", "mem_flags"], args, strict=False)) | kwargs
            arr = np.empty(bound["shape"], dtype=bound["dtype"], order=bound.get("order", "C")).view(PinnedArray)
            arr.view(np.uint8).fill(0xA5)  # uninitialised memory: garbage, not zeros
            fake.log.append(("pagelocked_empty", tuple(np.atleast_1d(bound["shape"]))))
            return arr

        def mem_alloc(nbytes):
            alloc = DeviceAllocation(fake, nbytes)
            fake.allocations[int(alloc)] = alloc
            fake.log.append(("mem_alloc", int(nbytes)))
            return alloc

        def memcpy_htod_async(*args, **kwargs):
            _check_kwargs(fake, "memcpy_htod_async", args, kwargs)
            dest, src, stream = _bind(args, kwargs)
            dev = fake._device(dest, "memcpy_htod_async: dest")
            host = fake._pinned(src, "memcpy_htod_async: src")
            fake._stream(stream, "memcpy_htod_async")
            if host.nbytes > dev.nbytes:
                raise FakePycudaError(f"memcpy_htod_async: {host.nbytes} bytes into a {dev.nbytes}-byte allocation")

            def land() -> None:  # reads the host buffer when the copy runs, as the copy engine does
                dev._mem[: host.nbytes] = np.ascontiguousarray(host).view(np.uint8).reshape(-1)

            if not fake.queue(stream, dev, write=True, run=land, what="memcpy_htod_async", nbytes=host.nbytes):
                land()
            fake.log.append(("memcpy_htod_async", stream.handle, int(dev)))

        def memcpy_dtoh_async(*args, **kwargs):
            _check_kwargs(fake, "memcpy_dtoh_async", args, kwargs)
            dest, src, stream = _bind(args, kwargs)
            host = fake._pinned(dest, "memcpy_dtoh_async: dest")
            dev = fake._device(src, "memcpy_dtoh_async: src")
            fake._stream(stream, "memcpy_dtoh_async")
            if host.nbytes > dev.nbytes:
                raise FakePycudaError(f"memcpy_dtoh_async: {host.nbytes} bytes from a {dev.nbytes}-byte allocation")

            def land() -> None:
                host.view(np.uint8).reshape(-1)[:] = dev._mem[: host.nbytes]

            host.view(np.uint8).fill(0xFF)  # until the copy lands the host sees no result (NaN for floats)
            if not fake.queue(stream, dev, write=False, run=land, what="memcpy_dtoh_async", nbytes=host.nbytes):
                stream._pending.append(land)  # queued: the host buffer is written at synchronize()
            fake.log.append(("memcpy_dtoh_async", stream.handle, int(dev)))

        def _bind(args, kwargs):
            bound = dict(zip(["dest", "src", "stream"], args, strict=False)) | kwargs
            return bound.get("dest"), bound.get("src"), bound.get("stream")

        drv.pagelocked_empty, drv.mem_alloc = pagelocked_empty, mem_alloc
        drv.memcpy_htod_async, drv.memcpy_dtoh_async = memcpy_htod_async, memcpy_dtoh_async
        return drv

    # ---- rules
    def _device(self, obj: Any, what: str) -> DeviceAllocation:
        if isinstance(obj, DeviceAllocation):
            return obj
        if isinstance(obj, int) and obj in self.allocations:
            return self.allocations[obj]
        raise FakePycudaError(f"{what} is {type(obj).__name__}, not device memory: pass a cuda.mem_alloc(...) buffer")

    def _pinned(self, obj: Any, what: str) -> np.ndarray:
        if isinstance(obj, PinnedArray):
            return obj
        if isinstance(obj, np.ndarray):
            raise FakePycudaError(
                f"{what} is pageable host memory: an async copy needs a page-locked buffer "
                "(cuda.pagelocked_empty); from pageable memory the copy is not asynchronous"
            )
        raise FakePycudaError(f"{what} is {type(obj).__name__}: pass a host numpy array from cuda.pagelocked_empty")

    def _stream(self, stream: Any, what: str) -> None:
        if not isinstance(stream, Stream):
            raise FakePycudaError(
                f"{what} without a stream runs on the default stream, which serializes with every "
                "other stream: pass the runner's cuda.Stream()"
            )

    def queue(self, stream: Stream, dev: DeviceAllocation, write: bool, run: Any, what: str, nbytes: int) -> bool:
        """On the stand-in GPU: order the copy on the stream and queue it (True); host memory only: False."""
        if stream._standin is None or dev._tensor is None:
            return False
        from fakegpu.standins.clock import copy_cost
        from fakegpu.standins.streams import MODEL

        s = stream._standin
        clock = s.tick()
        MODEL.use(dev._tensor.elem.untyped_storage().data_ptr(), f"pycuda {what}", write, s, clock)
        engine = "h2d" if write else "d2h"
        s.ready = MODEL.clock.issue(engine, s.sid, s.ready, copy_cost(nbytes, pinned=True))
        MODEL.enqueue(s, clock, run)
        return True

    def is_device_pointer(self, ptr: int) -> bool:
        return int(ptr) in self.allocations

    # ---- modules
    def modules(self) -> dict[str, types.ModuleType]:
        """``sys.modules`` entries: pycuda, pycuda.driver, pycuda.autoprimaryctx, pycuda.autoinit (lazy)."""
        fake = self
        pkg = types.ModuleType("pycuda")
        pkg.__path__ = []  # a package: `import pycuda.driver` works
        pkg.driver = self.driver
        primary = types.ModuleType("pycuda.autoprimaryctx")
        primary.context, primary.device = "primary context (shared with PyTorch)", "device 0"

        class AutoInit(types.ModuleType):
            def __getattr__(self, name: str) -> Any:
                raise AttributeError(name)

        auto = AutoInit("pycuda.autoinit")
        auto.context, auto.device = "a second context (Device.make_context)", "device 0"
        mods = {"pycuda": pkg, "pycuda.driver": self.driver, "pycuda.autoprimaryctx": primary, "pycuda.autoinit": auto}
        original_import = __builtins__["__import__"] if isinstance(__builtins__, dict) else __builtins__.__import__

        def record(name, *a, **k):
            if name == "pycuda.autoinit":
                fake.contexts.append("autoinit: a second CUDA context beside PyTorch's primary one")
            if name == "pycuda.autoprimaryctx":
                fake.contexts.append("autoprimaryctx: the primary context")
            return original_import(name, *a, **k)

        self._import = record
        return mods

    def rehearsal_modules(self) -> dict[str, types.ModuleType]:
        """``sys.modules`` entries for the rehearsal: ``pycuda.autoinit`` is left out (:class:`AutoinitRefused`)."""
        return {k: v for k, v in self.modules().items() if k != "pycuda.autoinit"}

    def install(self, monkeypatch) -> None:
        """Put the fake into ``sys.modules`` (and record which context module is imported)."""
        import builtins

        for name, mod in self.modules().items():
            monkeypatch.setitem(sys.modules, name, mod)
        monkeypatch.setattr(builtins, "__import__", self._import)


class AutoinitRefused(importlib.abc.MetaPathFinder):
    """In the rehearsal, ``import pycuda.autoinit`` fails: it makes a second CUDA context beside PyTorch's."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "pycuda.autoinit":
            raise FakePycudaError(
                "import pycuda.autoinit creates a second CUDA context beside PyTorch's primary one: its memory, "
                "pointers and streams are not valid in PyTorch's (TensorRT reports an invalid argument). Import "
                "pycuda.autoprimaryctx instead (rehearsal stand-in)"
            )
        return None
