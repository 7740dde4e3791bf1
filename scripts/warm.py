"""Warm an attendee's caches the day before a workshop, and time each lesson while doing it.

    make warm [LESSONS="00 01 03 07 14"]     # = python -m scripts.warm --lessons ...

A lesson's first run on a laptop pays for what later runs find in caches: SmolLM2 converted from its GGUF file
(lessons 15-17; 100-190 s per process the first time, :func:`course_utils.supply.llm.load_smollm2`),
``torch.compile``'s on-disk Inductor cache (lessons 01, 05, 06, 11, 14, 15), the exported ONNX files and
Python's compiled bytecode of every package imported. This script converts SmolLM2 (when an LLM lesson is
chosen), then runs each chosen lesson once as a plain script, in the mode set-up will use (``COURSE_SMOKE=1``
for smoke sizes), so that every one of those caches holds what the lesson needs. Its measured rows go to a
scratch results folder (``build/warm/results``), never onto the room's board.

It prints and writes (``build/warm/times.csv``) each step's wall time with the machine, its cores, the load
average before and after, mode and date: the measured run times a workshop plan needs. ``--cold`` first
points the Inductor and SmolLM2 caches at an empty scratch folder (``build/warm/cache``; your own caches are
not touched) and ``--repeat 2`` then runs everything again on what the first pass left: cold and warm times
of the same lessons on the same machine. ``--cold --each`` measures lesson by lesson instead: the Inductor cache
emptied before each lesson, its cold run, then at once its warm run (a measurement cut short keeps whole pairs).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "warm"
LLM_LESSONS = {"15", "16", "17"}
FIELDS = ["step", "pass", "cache", "mode", "seconds", "status", "cpu", "cores", "load_before", "load_after", "date"]


def lessons(asked: list[str]) -> list[Path]:
    """The lesson scripts named by two-digit numbers (all of them when none is named); an unknown number is an
    error naming the lessons there are."""
    every = {p.name[:2]: p for p in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))}
    if not asked:
        return list(every.values())
    wrong = [a for a in asked if a not in every]
    if wrong:
        raise SystemExit(f"warm: no lesson {', '.join(wrong)}: give two-digit numbers of {', '.join(every)}")
    return [every[a] for a in asked]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return ""


def run_step(name: str, cmd: list[str], env: dict[str, str], log: Path, timeout: int) -> tuple[float, str]:
    """Run one step, its output into ``log``; (wall seconds, 'ok' or why not)."""
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
            status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode}; see {log})"
        except subprocess.TimeoutExpired:
            status = f"stopped after {timeout} s (see {log})"
    return time.perf_counter() - t0, status


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lessons", nargs="*", default=[], help="two-digit lesson numbers (default: all)")
    ap.add_argument("--cold", action="store_true", help="start from empty scratch caches (yours are untouched)")
    ap.add_argument("--repeat", type=int, default=1, help="passes over the lessons (2 with --cold: cold, warm)")
    ap.add_argument("--each", action="store_true", help="with --cold: each lesson cold, then warm, in turn")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per lesson before it counts as stopped")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    chosen = lessons([a.zfill(2) for a in args.lessons])
    out: Path = args.out
    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"warm: cannot write {out} ({exc.strerror}): give --out a folder you can write", file=sys.stderr)
        return 2
    env = dict(os.environ, MPLBACKEND="agg", COURSE_RESULTS_DIR=str(out / "results"), PYTHONUNBUFFERED="1")
    if args.cold:
        cache = out / "cache"
        shutil.rmtree(cache, ignore_errors=True)
        env.update(TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), COURSE_LLM_CACHE=str(cache / "llm"))
    mode = "smoke" if os.environ.get("COURSE_SMOKE") == "1" else "full"
    rows: list[dict] = []
    steps: list[tuple[str, list[str]]] = []
    if {p.name[:2] for p in chosen} & LLM_LESSONS:
        convert = "from course_utils.supply.llm import load_smollm2; load_smollm2()"
        steps.append(("SmolLM2 conversion", [sys.executable, "-c", convert]))
    steps += [(p.stem, [sys.executable, str(p.relative_to(ROOT))]) for p in chosen]
    passes = "cold then warm, step by step" if args.cold and args.each else f"{args.repeat} pass(es)"
    print(f"warm: {len(steps)} step(s), {mode} mode, {passes}; logs in {out / 'logs'}", flush=True)
    failed = 0
    if args.cold and args.each:
        order = [(n, step) for step in steps for n in (1, 2)]
    else:
        order = [(n, step) for n in range(1, args.repeat + 1) for step in steps]
    for n, (name, cmd) in order:
        cache_state = ("cold" if n == 1 else "warm") if args.cold else "as found"
        if args.cold and args.each and n == 1:
            shutil.rmtree(out / "cache" / "inductor", ignore_errors=True)
        before = load()
        seconds, status = run_step(name, cmd, env, out / "logs" / f"{name.replace(' ', '_')}.{n}.log", args.timeout)
        failed += status != "ok"
        row = dict(step=name, cache=cache_state, mode=mode, seconds=f"{seconds:.1f}", status=status,
                   cpu=cpu_name(), cores=os.cpu_count(), load_before=before, load_after=load(),
                   date=time.strftime("%Y-%m-%dT%H:%M:%S"), **{"pass": n})  # fmt: skip
        rows.append(row)
        print(f"  pass {n} {cache_state:>8}  {name:<28} {seconds:7.1f} s  load {before}->{row['load_after']}  "
              f"{status}", flush=True)  # fmt: skip
        with open(out / "times.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(rows)
    total = sum(float(r["seconds"]) for r in rows)
    print(f"warm: {total:.0f} s in all; {failed} step(s) not ok; times in {out / 'times.csv'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
