"""Lesson 00 exercises: ask the machine yourself (the capability queries), and decide which precisions run.

``00.inventory`` runs the learner's queries on a fake machine drawn at random per call: ``torch.cuda``'s
queries, the CPU capability and ONNX Runtime's provider list are replaced for the duration of the check, so
only code that really asks PyTorch and ONNX Runtime returns the right answer (a table typed in for this machine,
an nvidia-smi call or a cached answer does not). ``00.precisions`` checks the capability rule on capabilities
drawn at random, most of which no real GPU has, so a lookup table of real GPUs does not pass.
"""

from __future__ import annotations

import contextlib
import numbers
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from course_checks.exercises import exercise
from course_checks.lesson_exercises.observe import Cases, cases

# Real GPUs, their compute capability and the tensor-core formats they run natively (NVIDIA's datasheets).
GPUS = [
    ("GTX 1080 (Pascal)", (6, 1), set()),
    ("V100 (Volta)", (7, 0), set()),
    ("T4 (Turing)", (7, 5), set()),
    ("A100 (Ampere)", (8, 0), {"tf32", "bf16"}),
    ("A10 / RTX 3090 (Ampere)", (8, 6), {"tf32", "bf16"}),
    ("Jetson AGX Orin (Ampere)", (8, 7), {"tf32", "bf16"}),
    ("L4 / L40S / RTX 4090 (Ada)", (8, 9), {"tf32", "bf16", "fp8"}),
    ("H100 / H200 (Hopper)", (9, 0), {"tf32", "bf16", "fp8"}),
    ("B200 (Blackwell)", (10, 0), {"tf32", "bf16", "fp8"}),
    ("RTX 5090 (Blackwell)", (12, 0), {"tf32", "bf16", "fp8"}),
]


def _rule(cap: tuple[int, int] | None) -> set[str]:
    if cap is None:
        return set()
    return ({"tf32", "bf16"} if cap >= (8, 0) else set()) | ({"fp8"} if cap >= (8, 9) else set())


def _check_precisions(fn: Callable[[tuple[int, int] | None], set[str]]) -> None:
    with cases("00.precisions") as c:
        try:
            none = fn(None)
        except (TypeError, AttributeError) as exc:
            raise AssertionError(f"will_run(None) failed ({exc}): None means no GPU; return an empty set") from exc
        assert isinstance(none, set | frozenset), (
            f"will_run(None) returned {none!r}: return a set, here an empty one, set(): without a GPU nothing runs "
            "(a caller asks 'bf16' in will_run(cap) whatever the capability)"
        )
        assert not none, f"will_run(None) returned {none!r}: without a GPU nothing runs, return an empty set"
        # the boundaries (a minor of 9 on an older major, a newer major than any sold, Blackwell), then
        # capabilities drawn at random (most belong to no real GPU: no lookup table passes)
        caps = [(7, 5), (8, 0), (8, 8), (8, 9), (9, 0), (9, 9), (10, 0), (7, 9), (c.choice([11, 13]), c.randint(0, 9))]
        caps += [(c.randint(5, 13), c.randint(0, 9)) for _ in range(12)]
        caps += [(8, c.randint(1, 8)), (7, c.randint(0, 9))]
        c.rng.shuffle(caps)
        for cap in caps:
            want = _rule(cap)
            try:
                got = fn(cap)
            except (KeyError, LookupError) as exc:
                raise AssertionError(
                    f"will_run({cap}) raised {type(exc).__name__} ({exc}): capability {cap} is in no table of GPUs. "
                    "Compare the capability as a (major, minor) tuple instead of looking it up"
                ) from exc
            assert isinstance(got, set | frozenset), f"return a set of names, e.g. {{'tf32', 'bf16'}} (got {got!r})"
            got = {str(g).lower() for g in got}
            extra = got - {"tf32", "bf16", "fp8"}
            assert not extra, (
                f"capability {cap}: your set holds {sorted(extra)}: return only which of 'tf32', 'bf16', 'fp8' run "
                "natively (FP16 runs on all of these GPUs: it is not asked)"
            )
            if cap == (8, 0) and not got:
                raise AssertionError(
                    f"capability {cap}: expected {sorted(want)}, got nothing: TF32 and BF16 run from (8, 0) itself on "
                    "(the A100): compare with >=, not >"
                )
            assert got == want, (
                f"capability {cap}: expected {sorted(want) or 'nothing'}, got {sorted(got) or 'nothing'}. Compare "
                "the capability as a (major, minor) tuple: (8, 6) is newer than (8, 0) and older than (8, 9); "
                "(10, 0) is newer than (9, 9)"
            )
    here = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None
    print(f"On this machine (capability {here}): {sorted(fn(here)) or 'no TF32/BF16/FP8 on a GPU'}.")


@exercise(
    "00.precisions",
    "will_run(capability) -> set of 'tf32', 'bf16', 'fp8' that run natively: TF32 and BF16 from (8, 0), "
    "FP8 from (8, 9); None (no GPU) gives an empty set.",
    _check_precisions,
    time_limit=30,
)
def will_run(capability: tuple[int, int] | None) -> set[str]:
    if capability is None:
        return set()
    out = set()
    if tuple(capability) >= (8, 0):
        out |= {"tf32", "bf16"}
    if tuple(capability) >= (8, 9):
        out.add("fp8")
    return out


# ---- 00.inventory: the capability queries themselves, on a fake machine ---------------------------------------

_NAMES = ["NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L4", "Tesla T4", "NVIDIA A10", "NVIDIA GeForce RTX 4090",
          "NVIDIA H100 80GB HBM3", "NVIDIA L40S", "NVIDIA B200", "Quadro RTX 6000"]  # fmt: skip
_CPU_CAPS = ["AVX512", "AVX2", "DEFAULT", "ZVECTOR", "SVE256"]
_PROVIDERS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "OpenVINOExecutionProvider",
              "DnnlExecutionProvider", "ROCMExecutionProvider"]  # fmt: skip


def _fake_machine(c: Cases, gpus: int) -> dict[str, Any]:
    """A machine no table can know: random GPU names, capabilities, memory and SM counts; a random CPU capability;
    ONNX Runtime providers that list CUDA whether or not a GPU is present (as the GPU build of ORT does)."""
    devices = []
    for _ in range(gpus):
        devices.append({
            "name": c.choice(_NAMES) + f" #{c.randint(100, 999)}",
            "capability": (c.randint(6, 12), c.randint(0, 9)),
            "memory_gib": round(c.randint(40, 1900) / 10, 1),
            "multiprocessors": c.randint(20, 160),
        })  # fmt: skip
    others = [p for p in _PROVIDERS if p != "CUDAExecutionProvider" and c.rng.random() < 0.5]
    providers = [*others[:1], "CUDAExecutionProvider", *others[1:], "CPUExecutionProvider"]  # a GPU build of ORT
    return {"cuda": bool(devices), "gpus": devices, "cpu_capability": c.choice(_CPU_CAPS), "ort_providers": providers}


def _index(device: Any = None) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return 0 if d.index is None else d.index


@contextlib.contextmanager
def _pretend(machine: dict[str, Any], asked: list[str], scope: dict[str, Any] | None = None) -> Iterator[None]:
    """Replace the capability queries with answers from ``machine`` (restored on exit); log each query asked.

    ``scope`` is the learner's function's globals: a query imported by name (``from torch.cuda import
    get_device_properties``) is the same function as the module's, so it is answered by the fake machine too."""
    gpus = machine["gpus"]

    def gpu(device: Any = None) -> dict[str, Any]:
        i = _index(device)
        if not machine["cuda"]:
            raise AssertionError(
                "you asked a GPU's properties on a machine where torch.cuda.is_available() is False: "
                "check is_available() first and report no GPUs"
            )
        assert 0 <= i < len(gpus), f"GPU index {i} does not exist: there are torch.cuda.device_count() = {len(gpus)}"
        return gpus[i]

    def props(device: Any = None) -> types.SimpleNamespace:
        asked.append("get_device_properties")
        g = gpu(device)
        return types.SimpleNamespace(name=g["name"], major=g["capability"][0], minor=g["capability"][1],
                                     total_memory=int(g["memory_gib"] * 2**30),
                                     multi_processor_count=g["multiprocessors"])  # fmt: skip

    def log(name: str, value: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            asked.append(name)
            return value(*args, **kwargs)

        return call

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        asked.append("mem_get_info")
        total = int(gpu(device)["memory_gib"] * 2**30)
        return total // 3, total  # (free, total): the total is the device's memory, as total_memory

    fakes = {
        (torch.cuda, "is_available"): log("is_available", lambda: machine["cuda"]),
        (torch.cuda, "mem_get_info"): mem_get_info,
        (torch.cuda, "device_count"): log("device_count", lambda: len(gpus)),
        (torch.cuda, "get_device_properties"): props,
        (torch.cuda, "get_device_capability"): log("get_device_capability", lambda d=None: gpu(d)["capability"]),
        (torch.cuda, "get_device_name"): log("get_device_name", lambda d=None: gpu(d)["name"]),
        (torch.backends.cpu, "get_cpu_capability"): log("get_cpu_capability", lambda: machine["cpu_capability"]),
    }
    try:
        import onnxruntime

        fakes[(onnxruntime, "get_available_providers")] = log("get_available_providers",
                                                              lambda: list(machine["ort_providers"]))  # fmt: skip
    except ImportError:  # pragma: no cover - onnxruntime is a course dependency
        onnxruntime = None
    saved = [(owner, name, getattr(owner, name)) for owner, name in fakes]
    scope = scope if scope is not None else {}
    imported = {
        var: fakes[(owner, name)]
        for owner, name, real in saved
        for var, value in list(scope.items())
        if value is real and not var.startswith("__")
    }
    scope_saved = {var: scope[var] for var in imported}
    subprocess = sys.modules.get("subprocess")
    real_run = subprocess.run if subprocess else None

    def no_smi(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(
            "you ran a command (nvidia-smi?) to learn about the GPU: ask PyTorch instead "
            "(torch.cuda.get_device_properties), the way every lesson does"
        )

    try:
        for (owner, name), fake in fakes.items():
            setattr(owner, name, fake)
        scope.update(imported)
        if subprocess:
            subprocess.run = no_smi
        yield
    finally:
        for owner, name, old in saved:
            setattr(owner, name, old)
        scope.update(scope_saved)
        if subprocess:
            subprocess.run = real_run


def _compare_inventory(got: Any, machine: dict[str, Any], asked: list[str]) -> None:
    assert isinstance(got, dict), f"return a dict with keys cuda, gpus, cpu_capability, ort_providers (got {got!r})"
    missing = {"cuda", "gpus", "cpu_capability", "ort_providers"} - set(got)
    assert not missing, f"your dict has no {sorted(missing)}: return cuda, gpus, cpu_capability and ort_providers"
    assert asked, (
        "inventory() asked PyTorch nothing on this machine: an answer typed in, or cached from an earlier call, does "
        "not describe the machine it runs on. Call torch.cuda.is_available() (and the other queries) inside the "
        "function, every time"
    )
    assert "is_available" in asked, (
        "you never asked torch.cuda.is_available() whether a GPU is usable: check is_available() first, then ask "
        "about each GPU (the GPU build of PyTorch can see no GPU: a driver missing, CUDA_VISIBLE_DEVICES empty)"
    )
    assert bool(got["cuda"]) == machine["cuda"], (
        f"cuda={got['cuda']!r} but torch.cuda.is_available() says {machine['cuda']}"
        + (": ONNX Runtime's providers list what the package was built with, not what the machine has; decide "
           "'GPU present' with torch.cuda.is_available()" if not machine["cuda"] else "")
    )  # fmt: skip
    assert isinstance(got["gpus"], list | tuple), (
        f"gpus={got['gpus']!r}: give a list with one dict per GPU (an empty list [] when CUDA is not available)"
    )
    gpus = list(got["gpus"])
    assert len(gpus) == len(machine["gpus"]), (
        f"you listed {len(gpus)} GPUs, this machine has {len(machine['gpus'])}: one entry per index in "
        "range(torch.cuda.device_count()) (and none when CUDA is not available)"
    )
    for i, (mine, real) in enumerate(zip(gpus, machine["gpus"], strict=True)):
        assert isinstance(mine, dict), f"GPU {i}: give a dict with name, capability, memory_gib, multiprocessors"
        assert mine.get("name") == real["name"], (
            f"GPU {i}: name {mine.get('name')!r}, expected {real['name']!r}: ask about device i, not always 0"
        )
        cap = mine.get("capability")
        assert isinstance(cap, tuple | list), (
            f"GPU {i}: capability {cap!r} is a {type(cap).__name__}: give it as a tuple (props.major, props.minor), "
            f"here {real['capability']} (a number such as 8.9 cannot tell (8, 10) from (8, 1))"
        )
        assert tuple(cap) == real["capability"], (
            f"GPU {i}: capability {cap!r}, expected {real['capability']}: (props.major, props.minor) or "
            "torch.cuda.get_device_capability(i), as a tuple"
        )
        mem = mine.get("memory_gib")
        assert isinstance(mem, numbers.Real) and not isinstance(mem, bool), (
            f"GPU {i}: memory_gib should be a number (got {mem!r})"
        )
        mem = float(mem)  # numpy and Python numbers alike
        if mem > 1e6:
            raise AssertionError(f"GPU {i}: memory_gib={mem:.4g} looks like bytes: divide total_memory by 2**30")
        gib = real["memory_gib"]
        for unit, scale in (("GB (10**9 bytes)", 2**30 / 1e9), ("MiB (2**20 bytes)", 2**10), ("MB", 2**30 / 1e6)):
            if abs(mem - gib * scale) <= 0.06 * scale and abs(mem - gib) > 0.06:
                raise AssertionError(
                    f"GPU {i}: memory_gib={mem:.6g} looks like {unit}, expected {gib} GiB: divide total_memory by 2**30"
                )
        assert abs(mem - real["memory_gib"]) <= 0.06, (
            f"GPU {i}: memory_gib={mem}, expected {real['memory_gib']} (total_memory / 2**30)"
        )
        assert mine.get("multiprocessors") == real["multiprocessors"], (
            f"GPU {i}: multiprocessors={mine.get('multiprocessors')!r}, expected {real['multiprocessors']} "
            "(props.multi_processor_count)"
        )
    assert got["cpu_capability"] == machine["cpu_capability"], (
        f"cpu_capability={got['cpu_capability']!r}, expected {machine['cpu_capability']!r}: "
        "torch.backends.cpu.get_cpu_capability()"
    )
    assert isinstance(got["ort_providers"], list | tuple), (
        f"ort_providers is a {type(got['ort_providers']).__name__}: keep onnxruntime.get_available_providers() as "
        "the list it returns (its order is ONNX Runtime's priority, which a set loses)"
    )
    assert list(got["ort_providers"]) == machine["ort_providers"], (
        f"ort_providers={got['ort_providers']!r}, expected {machine['ort_providers']!r}: "
        "onnxruntime.get_available_providers(), in its order (call it through the module inside your function)"
    )


def _check_inventory(fn: Callable[[], dict[str, Any]]) -> None:
    with cases("00.inventory") as c:
        sizes = [0, c.randint(1, 2), c.randint(3, 5)]
        c.rng.shuffle(sizes)
        for n in sizes:  # three machines per check: no GPU, one or two, several
            machine, asked = _fake_machine(c, n), []
            with _pretend(machine, asked, getattr(fn, "__globals__", None)):
                got = fn()
            _compare_inventory(got, machine, asked)
    real = fn()
    print(f"On this machine: CUDA {real['cuda']}, {len(real['gpus'])} GPU(s), CPU capability "
          f"{real['cpu_capability']}, ORT providers {real['ort_providers']}.")  # fmt: skip


@exercise(
    "00.inventory",
    "inventory() -> {'cuda', 'gpus', 'cpu_capability', 'ort_providers'}, asked from torch.cuda, "
    "torch.backends.cpu and onnxruntime; one dict per GPU: name, capability (major, minor), memory_gib, "
    "multiprocessors.",
    _check_inventory,
    time_limit=30,
)
def inventory() -> dict[str, Any]:
    import onnxruntime

    cuda = torch.cuda.is_available()
    gpus = []
    for i in range(torch.cuda.device_count() if cuda else 0):
        p = torch.cuda.get_device_properties(i)
        gpus.append({"name": p.name, "capability": (p.major, p.minor), "memory_gib": p.total_memory / 2**30,
                     "multiprocessors": p.multi_processor_count})  # fmt: skip
    return {
        "cuda": cuda,
        "gpus": gpus,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "ort_providers": onnxruntime.get_available_providers(),
    }
