"""Writers of one results file killed at random, for tests/test_results.py (run as a script).

``python -m tests.results_writers FOLDER DONE ROUNDS SEED``: each round forks 4 processes that call
``results.record`` in a loop (rows with long quoted notes: commas, quotes, newlines, non-ASCII) and kills them
at random moments; in 1 round of 3 one of them writes part of a row while holding the file lock and dies there.
After each ``record`` returns, the writer notes the row's name in DONE: those rows are complete and must load.
A process of its own (without torch: the machine fields are fixed) keeps each fork to milliseconds; the test
process, with torch and everything else loaded, took about 100 ms per fork on a loaded machine.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

from course_utils.show import results

WRITERS = 4


def note(name: str) -> str:
    """A note with what tears badly; 1 in 8 long enough to take several write calls, so a kill lands inside."""
    rng = random.Random(name)
    unit = f'{name}, "quoted", café ✓\n'
    return unit * (rng.randint(300, 600) if rng.random() < 0.125 else rng.randint(1, 4))


def _writer(who: int, rnd: int, done: str, tear_at: int | None, seed: int) -> None:
    rng = random.Random(seed)
    fd = os.open(done, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    real = results.append_text

    def tearing(path, text, **kw):
        def cut(empty: bool) -> str:
            data = text(empty).encode()
            with open(path, "ab") as raw:  # under the lock append_text holds, after its recovery of the tail
                raw.write(data[: rng.randint(1, len(data) - 1)])
            os.kill(os.getpid(), signal.SIGKILL)
            return ""

        real(path, cut, **kw)

    for k in range(10_000):
        if k == tear_at:
            results.append_text = tearing
        name = f"w{who}-r{rnd:03d}-k{k:04d}"
        results.record("99", name, median_ms=float(k + 1), notes=note(name))
        os.write(fd, f"{name}\n".encode())


def main(folder: str, done: str, rounds: int, seed: int) -> None:
    os.environ["COURSE_RESULTS_DIR"] = folder
    fixed = {"machine": "killed-writers", "gpu": "", "cpu": "cpu", "torch": "-", "mode": "smoke", "time": "t"}
    results._machine_fields = lambda: dict(fixed)  # what is tested is the file, not the machine's name
    results.record("99", "first", median_ms=1.0, notes=note("first"))  # pandas' lazy imports, before forking
    with open(done, "a") as fh:
        fh.write("first\n")
    rng = random.Random(seed)
    for rnd in range(rounds):
        tear = rng.randrange(WRITERS) if rng.random() < 1 / 3 else None
        pids = []
        for w in range(WRITERS):
            args = (w, rnd, done, rng.randint(0, 3) if w == tear else None, rng.randrange(1 << 30))
            pid = os.fork()
            if pid == 0:
                try:
                    _writer(*args)
                finally:
                    os._exit(0)
            pids.append(pid)
        time.sleep(rng.uniform(0.01, 0.06))
        for pid in rng.sample(pids, len(pids)):
            time.sleep(rng.uniform(0, 0.01))
            os.kill(pid, signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
