"""Exercises shared by all lessons: a self-check the learner calls, and reference solutions the tests run.

A lesson's exercise is a function the learner completes (it starts as ``raise NotImplementedError``).
``check("03.oom-sweep", oom_safe_sweep)`` runs the exercise's checker against the learner's function and prints a
verdict; an unsolved exercise prints "not solved yet" instead of failing, so the shipped notebook runs
top to bottom. ``show_solution("03.oom-sweep")`` prints the reference solution. Each lesson registers its
exercises in ``course_checks/lesson_exercises/lNN.py``; the per-lesson tests (``tests/test_exercises_lNN.py``)
run every reference solution and plausible wrong answers through its checker.

What a check is: a self-check for honest work. It runs the answer on random cases and looks where the technique
runs (operators, graphs, files, the fake TensorRT's engine), and its ✓ line lists what it observed. Code that reads
or patches the checker (its frames, its module, torch's flags) can fool it; it is not an exam and proves nothing
beyond what it observed.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import inspect
import os
import pkgutil
import re
import signal
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_utils.show.results import inside_check

#: CPU seconds the learner's code may use in one check (an endless loop); waits are bounded by WALL_FACTOR x it.
DEFAULT_TIME_LIMIT = 180.0
#: The wall-time bound of a check, as a multiple of its limit (which counts CPU time): a wait that burns no CPU
#: (a stuck DataLoader, a queue nobody fills) is stopped there; a busy machine (a 2-core laptop beside 6 busy
#: programs gives this kernel about 1/4 of a core) stretches wall time less than this.
WALL_FACTOR = 5.0
#: Seconds between further stops when the learner's code caught the first one and went on.
REARM_S = 0.25
#: Seconds between looks while a stop waits for an import to finish, and the longest it waits (or the limit).
IMPORT_POLL_S = 0.05
IMPORT_GRACE_S = 120.0
#: Longest a checker's own set-up (:func:`untimed`: imports, helper processes) may run in all, per check.
UNTIMED_MAX_S = 600.0
MIN_LOOK_S = 0.02  # the shortest wait between two looks at the clocks
#: Modules every check imports before its clock starts (where torch is loaded): entering an operator log
#: (a TorchDispatchMode) or the profiler imports torch._dynamo on first use, and with it sympy (25-60 s on a busy
#: machine), which is no part of the learner's work.
WARM_IMPORTS = ("torch._dynamo",)
#: Longest verdict message printed: a checker that quotes a huge answer is cut, not dumped.
MAX_MESSAGE = 1500
SEED_VAR = "COURSE_EXERCISE_SEED"
SEED_MAX = 2**32 - 1  # seeds a check draws are below 2**31; any value up to this one repeats a case
#: the course's three packages: frames in them are the course's, not the learner's
_PACKAGES = tuple(Path(__file__).resolve().parents[1] / n for n in ("course_utils", "course_checks", "fakegpu"))
_LIBRARIES = {Path(p).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib") if (p := sysconfig.get_path(k))}


@dataclass
class Exercise:
    """One exercise: its key (``"NN.slug"``), a checker that raises AssertionError, a reference solution."""

    key: str
    prompt: str
    checker: Callable[[Callable[..., Any]], None]
    solution: Callable[..., Any]
    time_limit: float = DEFAULT_TIME_LIMIT
    imports: tuple[str, ...] = ()  # modules imported before the clock starts (heavy first imports)


_REGISTRY: dict[str, Exercise] = {}
# Each exercise as registered, with its checker's code: what check() runs, whatever an answer (code a check runs)
# does to _REGISTRY, to an Exercise in it or to a checker's __code__.
_SEALED: dict[str, tuple[Exercise, Any]] = {}


def exercise(
    key: str,
    prompt: str,
    checker: Callable[[Callable[..., Any]], None],
    *,
    time_limit: float = DEFAULT_TIME_LIMIT,
    imports: tuple[str, ...] = (),
):
    """Decorator: register the decorated function as the reference solution of exercise ``key``.

    ``time_limit`` (seconds of the learner's CPU time, see :func:`time_limit`) bounds one run of the checker on a
    learner's answer; ``imports`` names modules the checker needs that are slow to import the first time: they are
    imported before the clock starts (set-up the checker does itself goes in :func:`untimed`).
    """

    def wrap(solution: Callable[..., Any]) -> Callable[..., Any]:
        old = _SEALED.get(key)

        def where(f: Any) -> tuple[Any, Any]:
            return getattr(f, "__module__", None), getattr(f, "__qualname__", None)

        if old is not None and where(old[0].checker) != where(checker):  # a reloaded module registers again
            raise ValueError(f"exercise {key} is registered already: its checker cannot be replaced")
        ex = Exercise(key, prompt, checker, solution, time_limit, tuple(imports))
        _REGISTRY[key], _SEALED[key] = ex, (dataclasses.replace(ex), getattr(checker, "__code__", None))
        return solution

    return wrap


def _load(prefix: str = "l") -> None:
    """Import the exercise modules whose names start with ``prefix`` (``"l03"``: lesson 03's ``l03.py`` and
    ``l03_*.py``; ``"l"``: every lesson's), found in the folder beside this file. They import this module to register
    their exercises (a room above it), so it loads them by name and never imports them itself: checking one exercise
    loads its own lesson's checkers only."""
    for mod in pkgutil.iter_modules([str(Path(__file__).with_name("lesson_exercises"))]):
        if re.fullmatch(r"l\d\d(_\w+)?", mod.name) and mod.name.startswith(prefix):
            importlib.import_module(f"{__package__}.lesson_exercises.{mod.name}")


def registry() -> dict[str, Exercise]:
    """Every registered exercise, by key (loads every lesson's exercise modules)."""
    _load()
    return dict(_REGISTRY)


def get(key: str) -> Exercise:
    """The exercise ``key`` (``"NN.slug"``: only lesson NN's checkers are loaded); a KeyError lists the known keys."""
    lesson = re.fullmatch(r"(\d\d)\.[\w-]+", key) if isinstance(key, str) else None
    if lesson:
        _load(f"l{lesson[1]}")
    if key not in _REGISTRY:
        reg = registry()
        raise KeyError(f"no exercise '{key}'; known: {sorted(reg)}")
    if key not in _SEALED:
        return _REGISTRY[key]
    sealed, code = _SEALED[key]  # as registered: an answer that replaced the checker changes nothing here
    if code is not None and sealed.checker.__code__ is not code:
        sealed.checker.__code__ = code
    _REGISTRY[key] = dataclasses.replace(sealed)
    return _REGISTRY[key]


# ---- the random cases' seed, and what a check observed ----------------------------------------------------------
class SeedError(ValueError):
    """``COURSE_EXERCISE_SEED`` holds something that is not a seed (the message names the fix)."""


@dataclass
class _Run:
    """One checker run: the seed it must use (None: fresh), the seeds it drew, what it observed."""

    seed: int | None = None
    seeds: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


_RUN: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("exercise_run", default=None)


def fixed_seed() -> int | None:
    """The seed that fixes a check's random cases: ``verdict(..., seed=)`` (tests), else ``COURSE_EXERCISE_SEED``
    (validated), else None (a fresh seed per call). Raises :class:`SeedError` for a value that is not a seed."""
    run = _RUN.get()
    if run is not None and run.seed is not None:
        return run.seed
    raw = os.environ.get(SEED_VAR)
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    fix = f"set it to a whole number from 0 to {SEED_MAX} (a failed check prints the seed it used), or unset it"
    if re.fullmatch(r"-\s*[0-9]+", text):
        raise SeedError(f"{SEED_VAR}={raw!r} is negative: {fix}")
    if not re.fullmatch(r"\+?[0-9]+", text):
        raise SeedError(f"{SEED_VAR}={raw!r} is not a whole number: {fix}")
    value = int(text)
    if value > SEED_MAX:
        raise SeedError(f"{SEED_VAR}={raw!r} is out of range: {fix}")
    return value


def observed(text: str) -> None:
    """A checker states what it saw (operators, dtypes, graph nodes, engine settings): the ✓ line lists it."""
    run = _RUN.get()
    if run is not None and text not in run.notes:
        run.notes.append(text)


def drew(seed: int) -> None:
    """A checker's random cases came from ``seed`` (the ✓ line names it, so a pass can be repeated too)."""
    run = _RUN.get()
    if run is not None and seed not in run.seeds:
        run.seeds.append(seed)


# ---- the time limit ---------------------------------------------------------------------------------------------
class ExerciseTimeout(BaseException):
    """A checker ran past its exercise's time limit (raised inside the learner's code by a timer signal).

    A BaseException, as KeyboardInterrupt is: a learner's ``except Exception`` retry loop does not swallow it. A bare
    ``except:`` does; then it is raised again (every :data:`REARM_S`, and at the next line of that handler).
    """


def learner_frame(frame: Any) -> bool:
    """A frame of the learner's code: not the course's, not the standard library's, not an installed package's."""
    name = frame.f_code.co_filename
    if name.startswith("<"):
        return not name.startswith("<frozen")  # a cell compiled from text is the learner's
    path = Path(name).resolve()
    return not any(path.is_relative_to(p) for p in (*_PACKAGES, *_LIBRARIES))


def _main_thread_cpu() -> float:
    """CPU seconds of the main thread (where a kernel runs the learner's code): its own work, not the spinning of
    OpenMP's worker threads (which would charge a 16-core machine 16 s a second), nor other programs' work."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(threading.main_thread().ident))  # type: ignore[arg-type]
    except (AttributeError, OSError, OverflowError, TypeError):  # no per-thread CPU clock here
        return time.process_time()


def _runqueue_wait() -> float | None:
    """Seconds the main thread waited for a free CPU while ready to run (Linux schedstat), None where unknown:
    what tells a busy machine from code that waits."""
    try:
        text = Path(f"/proc/self/task/{threading.main_thread().native_id}/schedstat").read_text()
        return int(text.split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _clocks() -> tuple[float, float, float | None]:
    """(main thread's CPU s, wall s, main thread's wait for a CPU s or None): the time limit's readings."""
    return _main_thread_cpu(), time.monotonic(), _runqueue_wait()


def _load_text() -> str:
    try:
        return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    except (AttributeError, OSError):
        return "its load unknown"


def _importing(frame: Any) -> str | None:
    """The module being imported when ``frame`` runs (the outermost import on the stack), None when no import is:
    a stop inside an import would leave the module half made, and every later check in the kernel broken."""
    found, machinery = None, False
    f = frame
    while f is not None:
        if f.f_code.co_filename.startswith("<frozen importlib"):
            machinery = True
        elif (
            f.f_code.co_name == "<module>"
            and f.f_back is not None
            and (f.f_back.f_code.co_filename.startswith("<frozen importlib"))
        ):
            found = f.f_globals.get("__name__", "?")
        f = f.f_back
    return found or ("a module" if machinery else None)


class _Clock:
    """The running limit of one check: the learner's CPU and wall time so far, less what :func:`untimed` held."""

    def __init__(self, limit: float, key: str) -> None:
        self.limit, self.wall_limit, self.key = limit, limit * WALL_FACTOR, key
        self.start = _clocks()
        self.off = [0.0, 0.0, 0.0]  # untimed CPU, wall, wait for a CPU
        self.depth = 0
        self.paused_at: tuple[float, float, float | None] | None = None
        self.lock = threading.Lock()

    def used(self) -> tuple[float, float, float | None]:
        """(CPU, wall, wait for a CPU) of the learner's code so far (frozen while paused)."""
        now = self.paused_at if self.depth and self.paused_at is not None else _clocks()
        cpu = now[0] - self.start[0] - self.off[0]
        wall = now[1] - self.start[1] - self.off[1]
        queue = None if now[2] is None or self.start[2] is None else now[2] - self.start[2] - self.off[2]
        return cpu, wall, queue

    def next_look(self) -> float:
        """Seconds of wall time until a limit can first be reached (CPU time never runs faster than wall time)."""
        cpu, wall, _ = self.used()
        return max(MIN_LOOK_S, min(self.limit - cpu, self.wall_limit - wall))

    def pause(self) -> None:
        with self.lock:
            if self.depth == 0:
                self.paused_at = _clocks()
            self.depth += 1
            if self.depth == 1:
                signal.setitimer(signal.ITIMER_REAL, UNTIMED_MAX_S - self.off[1])  # set-up that never ends

    def resume(self) -> None:
        with self.lock:
            if self.depth == 1 and self.paused_at is not None:
                now = _clocks()
                self.off[0] += now[0] - self.paused_at[0]
                self.off[1] += now[1] - self.paused_at[1]
                if now[2] is not None and self.paused_at[2] is not None:
                    self.off[2] += now[2] - self.paused_at[2]
                self.paused_at = None
            self.depth -= 1  # last: a timer firing in between still sees the clock paused
            if self.depth == 0:
                signal.setitimer(signal.ITIMER_REAL, self.next_look())

    def over(self) -> str | None:
        """Why the check must stop now (None: it may go on)."""
        if self.depth:
            assert self.paused_at is not None
            spent = self.off[1] + _clocks()[1] - self.paused_at[1]
            if spent < UNTIMED_MAX_S:
                return None
            return (
                f"stopped: the checker of {self.key}'s own set-up (imports, helper processes) ran {spent:.0f} s, "
                f"not counted against your code, and did not finish; this machine is busy ({_load_text()}) or a "
                "helper process did not come up. Run the cell again when the machine is quieter"
            )
        cpu, wall, queue = self.used()
        if cpu >= self.limit:
            return (
                f"stopped: your code used {cpu:.1f} s of CPU (limit {self.limit:g} s), and the checker of {self.key} "
                "normally finishes in seconds. Look for an endless loop or work far larger than asked, then run the "
                "cell again."
            )
        if wall < self.wall_limit:
            return None
        blocked = wall - cpu - (queue or 0.0)
        if queue is not None and queue >= blocked:
            return (
                f"this machine is busy: {wall:.0f} s of wall time, only {cpu:.1f} s of CPU for your code ({queue:.0f} "
                f"s waiting for a free CPU; {_load_text()}); the check of {self.key} could not finish. Nothing here "
                "says your code is wrong: run the cell again when the machine is quieter."
            )
        waited = f" ({blocked:.0f} s waiting, {queue:.0f} s waiting for a free CPU)" if queue is not None else ""
        return (
            f"stopped after {wall:.0f} s of wall time in which your code used only {cpu:.1f} s of CPU{waited}: it "
            "was waiting. Look for a wait that never ends (a DataLoader worker that is stuck, a queue nobody fills, "
            "a lock never released, a process that never answers), then run the cell again"
            + ("" if queue is not None else f"; if this machine is busy ({_load_text()}), run it when it is quieter")
            + "."
        )


_CLOCK: list[_Clock] = []  # the running check's clock (one check at a time: the main thread's)


@contextlib.contextmanager
def untimed() -> Iterator[None]:
    """Work of the checker itself that the exercise's time limit does not count, neither CPU nor wall time.

    A checker wraps its own set-up in it: its heavy first imports (``torch._dynamo``, transformers' lazy modules,
    litserve), starting helper processes and waiting until they are ready. The learner's code is then timed alone::

        with untimed():
            import torch._dynamo  # a first import can take a minute on a busy machine: not the learner's time

    Nested uses are fine, from any thread, and so is a use outside any check (it does nothing then). The check's
    clock is paused while any thread is inside, so keep the learner's code out of it. Set-up still bounded:
    :data:`UNTIMED_MAX_S` in all per check (a helper process that never comes up), with a message saying so;
    code inside should bound its own waits well below that.
    """
    clock = _CLOCK[-1] if _CLOCK else None
    if clock is None:
        yield
        return
    clock.pause()
    try:
        yield
    finally:
        clock.resume()


@contextlib.contextmanager
def time_limit(seconds: float, key: str) -> Iterator[None]:
    """Stop the code inside with :class:`ExerciseTimeout` once it has used ``seconds`` of CPU time, or waited
    ``seconds`` x :data:`WALL_FACTOR` of wall time (main thread only, as in a kernel).

    What is counted is the learner's work: the main thread's CPU time, so a busy machine (which stretches wall
    time, not CPU time) does not fail correct code; wall time only bounds waits that burn no CPU (a stuck
    DataLoader, a queue nobody fills). Work inside :func:`untimed` is not counted. The message says which limit
    stopped the code, with the numbers: CPU (an endless loop), a wait, or a machine too busy to finish.

    A real-time interval timer looks when a limit can first be reached: an endless Python loop or a blocked queue
    wait is interrupted; a single C call that never returns (rare) is interrupted when it comes back to Python. A
    stop never lands inside an import (it would leave the module half made and break every later check in the
    kernel): it waits for the import to finish (at most :data:`IMPORT_GRACE_S`, or the limit if longer). If the
    learner's code catches the stop and goes on, the timer fires again every :data:`REARM_S` and a trace function
    raises it once more at the next line of the learner's handler that swallowed it.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or seconds <= 0
        or not hasattr(signal, "setitimer")
        or _CLOCK
    ):
        yield
        return
    clock = _Clock(seconds, key)
    fired, traced, reason, postponed = [0], [], [""], [None]
    previous_trace = sys.gettrace()

    def message() -> str:
        text = reason[0]
        if fired[0] > 1:
            text += (
                " Your code caught the stop and went on (a bare `except:` or `except BaseException`), so it was "
                f"raised again ({fired[0]} times): catch only the errors you expect (`except torch.OutOfMemoryError:`)."
            )
        return text

    def again(frame: Any, event: str, arg: Any) -> Any:
        if (
            event == "line"
            and isinstance(sys.exc_info()[1], ExerciseTimeout)
            and learner_frame(frame)
            and _importing(frame) is None
        ):
            raise ExerciseTimeout(message())  # inside the handler that swallowed it: it leaves that try
        return again

    def expire(_signum: int, frame: Any) -> None:
        if not fired[0]:
            why = clock.over()
            if why is None:  # not yet (or paused): look again when a limit can first be reached
                if not clock.depth:
                    signal.setitimer(signal.ITIMER_REAL, clock.next_look())
                return
            module = _importing(frame)
            if module is not None:
                first = postponed[0] = postponed[0] or time.monotonic()
                if time.monotonic() - first < max(IMPORT_GRACE_S, seconds):
                    signal.setitimer(signal.ITIMER_REAL, IMPORT_POLL_S)  # stop right after the import
                    return
                why += (
                    f" The stop came inside the import of {module}, which ran {time.monotonic() - first:.0f} s past "
                    "the limit: restart the kernel before the next check (a half-done import breaks later ones)."
                )
            reason[0] = why
        elif _importing(frame) is not None:
            signal.setitimer(signal.ITIMER_REAL, IMPORT_POLL_S)
            return
        fired[0] += 1
        signal.setitimer(signal.ITIMER_REAL, REARM_S)  # again, in case this one is caught
        if fired[0] > 1:  # the last one was swallowed: watch the learner's handlers
            sys.settrace(again)
            f = frame
            while f is not None and Path(f.f_code.co_filename).resolve() != Path(__file__).resolve():
                if learner_frame(f):
                    f.f_trace = again
                    traced.append(f)
                f = f.f_back
        raise ExerciseTimeout(message())

    previous = signal.signal(signal.SIGALRM, expire)
    _CLOCK.append(clock)
    signal.setitimer(signal.ITIMER_REAL, clock.next_look())
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _CLOCK.remove(clock)
        signal.signal(signal.SIGALRM, previous)
        if fired[0] > 1:
            sys.settrace(previous_trace)
            for f in traced:
                f.f_trace = None


# ---- running a check --------------------------------------------------------------------------------------------
def _short(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    return text if len(text) <= limit else f"{text[:limit]} ... [{len(text) - limit} more characters not shown]"


def _is_placeholder(exc: NotImplementedError) -> bool:
    """True when ``exc`` is the exercise's own placeholder: a ``raise NotImplementedError`` line in the learner's
    code, not one raised deep inside torch or the course for arguments it does not support."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return True
    last = frames[-1]
    path = Path(last.filename).resolve()
    library = "site-packages" in last.filename or any(path.is_relative_to(p) for p in _PACKAGES)
    return not library and (last.line or "").lstrip().startswith("raise NotImplementedError")


def _where(exc: BaseException) -> str:
    """``file:line in function`` of the innermost frame of ``exc`` (where the learner should look)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    last = frames[-1]
    return f"{Path(last.filename).name}:{last.lineno} in {last.name}()"


def _warm_imports(ex: Exercise) -> None:
    """Import :data:`WARM_IMPORTS` (where torch is loaded) and the exercise's ``imports`` before its clock starts.
    An import that fails is left to the checker, which meets it where it needs the module and says so."""
    for name in (*(WARM_IMPORTS if "torch" in sys.modules else ()), *ex.imports):
        if name not in sys.modules:
            with contextlib.suppress(Exception):
                importlib.import_module(name)


@contextlib.contextmanager
def _one_check(seed: int | None) -> Iterator[_Run]:
    """The state of one checker run: the seed it must use (or None), the seeds it drew, what it observed."""
    token = _RUN.set(_Run(seed))
    try:
        yield _RUN.get()  # type: ignore[misc]
    finally:
        _RUN.reset(token)


def verdict(key: str, answer: Callable[..., Any], *, seed: int | None = None, **kwargs: Any) -> str:
    """Exercise ``key``'s checker on ``answer``: "accepted", or the checker's reason for rejecting it.

    The tests use it to show that each checker rejects wrong submissions, and why; ``seed`` fixes the random
    cases. A run past the exercise's time limit is a rejection too; other errors propagate.
    """
    ex = get(key)
    _warm_imports(ex)
    token = _RUN.set(_Run(seed))
    try:
        with time_limit(ex.time_limit, key), inside_check(key):
            ex.checker(answer, **kwargs)
    except (AssertionError, ExerciseTimeout) as exc:
        return _short(str(exc))
    finally:
        _RUN.reset(token)
    return "accepted"


def check(key: str, answer: Callable[..., Any]) -> None:
    """Run exercise ``key``'s self-check on the learner's function and print one verdict.

    * the exercise's own placeholder (``raise NotImplementedError`` in the learner's code) counts as not attempted:
      a hint is printed and the notebook goes on;
    * a rejection prints the checker's reason (cut to :data:`MAX_MESSAGE` characters);
    * any other error of the learner's code, a NotImplementedError raised deep inside a library included, is
      printed with where it happened, and the notebook goes on;
    * a checker still running after the exercise's time limit is stopped, with a message saying so;
    * a pass prints ✓ with what the checker observed (what it did not observe, it does not claim).
    """
    ex = get(key)
    try:
        fixed_seed()
    except SeedError as exc:
        print(f"✗  Exercise {key} not checked: {exc}.")
        return
    with _one_check(None) as run:
        _run_and_print(ex, answer, run)


def _run_and_print(ex: Exercise, answer: Callable[..., Any], run: _Run) -> None:
    key = ex.key
    _warm_imports(ex)
    try:
        with time_limit(ex.time_limit, key), inside_check(key):  # rows the answer records are marked
            ex.checker(answer)
    except NotImplementedError as exc:
        if _is_placeholder(exc):
            hint = f"Stuck? cu.exercises.show_solution('{key}')"
            print(f"✎  Exercise {key} not solved yet. {ex.prompt}\n   {hint}")
        else:
            print(
                f"✗  Exercise {key}: your code raised NotImplementedError at {_where(exc)}: "
                f"{_short(str(exc)) or '(no message)'}. This is not the exercise's placeholder: a call your code "
                "made is not implemented for those arguments (a misspelled method, a dtype or device it does not "
                "support)."
            )
    except AssertionError as exc:
        print(f"✗  Exercise {key}: not quite. {_short(str(exc))}")
    except ExerciseTimeout as exc:
        print(f"✗  Exercise {key}: {exc}")
    except Exception as exc:  # the learner's own bug: show it in one line, keep the notebook going
        print(f"✗  Exercise {key}: your code raised {type(exc).__name__} at {_where(exc)}: {_short(str(exc))}")
    else:
        seeds = f" (random cases of seed {', '.join(map(str, run.seeds))})" if run.seeds else ""
        seen = f" Observed: {'; '.join(run.notes)}." if run.notes else ""
        print(_short(f"✓  Exercise {key}: passed its self-check{seeds}.{seen}"))


def show_solution(key: str) -> None:
    """Print the reference solution's source code."""
    print(inspect.getsource(get(key).solution))
