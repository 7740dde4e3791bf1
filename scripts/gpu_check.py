"""Run the lessons' GPU sections on a CUDA machine (no network, no Jupyter needed) and save what completed.

Each lesson's text copy runs cell by cell (``scripts/run_cells.py``, no Jupyter or IPython needed: a minimal
``display`` stands in when IPython is missing). A GPU section counts only when its cell **completed**
(``sections.jsonl``: entered -> completed / failed / skipped). The most valuable lessons run first within
``--budget`` seconds: 01, 04, 06, 11, 03, 02, 10, then 15 and 16, then the rest; a lesson is not started with
less than 20 s left. Each lesson has a share of the budget (:func:`lesson_timeout`): half of every lesson's
weighted share (the priority lessons weigh twice the rest) is kept for it, so a slow lesson is stopped
("timeout", its completed sections kept) before it eats the time of the lessons after it, and time a fast lesson
leaves rolls over to the later ones. The exit status is 1 when any lesson failed, timed out or never ran for
want of time (listed at the end), 0 only when every lesson ran to its end or skipped for a missing package.

    python -m scripts.gpu_check --allow-missing --out /tmp/gpu          # the lent machine: skip what is missing
    python -m scripts.gpu_check --size full --budget 3600               # make gpu-test: strict, full sizes
    python -m scripts.gpu_check --wheels DIR ...                        # install carried wheels first (--no-deps)

It never installs torch (a carried torch/torchvision/triton wheel is refused). ``--allow-missing`` turns strict
GPU mode off, so a section whose package is missing here (TensorRT, torchao, ...) skips with the reason and
the lesson goes on; a lesson that cannot even start for a missing package is reported "skipped: missing X".
Into ``--out`` it writes, after every lesson (so a killed run keeps what it had): ``log/NN.log``,
``results/`` (rows, sections.jsonl), ``sections.md`` and ``sections.csv`` (one row per section: lesson,
status, reason, checks), ``lessons.csv`` and ``summary.json``. On a real GPU, unless ``--no-save``, the rows
and an ``.env.json`` naming GPU, driver, versions, date and the completed sections (``sections_ran``) go to
``data/reference/``, which ``scripts/gpu_levels.py`` turns into "executed". ``--allow-cpu`` runs it on a CPU
machine in rehearsal mode (``COURSE_REHEARSE=1``), to test this script (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRIORITY = ["01", "04", "06", "11", "03", "02", "10", "15", "16"]
NEVER_INSTALL = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia_)[-_]", re.IGNORECASE)


def install_wheels(folder: Path) -> list[str]:
    """Install the small wheels carried in ``folder`` with --no-deps (never torch); return their names."""
    wheels = sorted(folder.glob("*.whl"))
    refused = [w.name for w in wheels if NEVER_INSTALL.match(w.name)]
    for name in refused:
        print(f"refusing to install {name}: the machine's own torch stays")
    wheels = [w for w in wheels if w.name not in refused]
    if not wheels:
        print(f"no wheels to install in {folder}")
        return []
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *map(str, wheels)]
    print("installing carried wheels:", ", ".join(f"{w.name} ({w.stat().st_size / 2**20:.1f} MiB)" for w in wheels))
    subprocess.run(cmd, check=False)
    return [w.name for w in wheels]


def environment() -> dict[str, str]:
    """GPU name, driver, CUDA, torch, TensorRT and ONNX Runtime versions, and the date."""
    import torch

    env = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "cuda": str(torch.version.cuda)}
    env["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
        env["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown"
    except (OSError, IndexError):
        env["driver"] = "unknown"
    for mod in ("tensorrt", "onnxruntime", "torch_tensorrt", "torchao"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as exc:  # noqa: BLE001
            env[mod] = f"missing ({type(exc).__name__})"
    return env


def order(lessons: list[Path]) -> list[Path]:
    """Most valuable first (PRIORITY), then the rest in lesson order."""
    rank = {n: i for i, n in enumerate(PRIORITY)}
    return sorted(lessons, key=lambda p: (rank.get(p.name[:2], len(rank)), p.name))


MIN_START_S = 20.0  # a lesson is not started with less time than this
GUARANTEED = 0.5  # the part of each lesson's weighted share that the lessons before it cannot use
NOT_RUN = "not run (budget)"


def weight(path: Path) -> int:
    """A lesson's weight in the budget: 2 for the priority lessons (PRIORITY), 1 for the rest."""
    return 2 if path.name[:2] in PRIORITY else 1


def lesson_timeout(left: float, budget: float, later: list[Path], total_weight: int) -> float:
    """The seconds the next lesson may run: what is left, less the time kept for each lesson after it
    (GUARANTEED x its weighted share of the budget), and never less than MIN_START_S (when that much is left)."""
    kept = sum(GUARANTEED * budget * weight(p) / total_weight for p in later)
    return min(left, max(left - kept, MIN_START_S))


def schedule(lessons: list[Path], budget: float, run, after=lambda runs: None, clock=time.perf_counter) -> list[dict]:
    """Run ``lessons`` in order within ``budget`` seconds, each within :func:`lesson_timeout`: ``run(path,
    timeout_s)`` returns (status, wall seconds, tail); ``after(runs)`` is called after each lesson. A lesson with
    less than MIN_START_S left is recorded as NOT_RUN."""
    deadline, total = clock() + budget, sum(weight(p) for p in lessons) or 1
    runs: list[dict] = []
    for i, path in enumerate(lessons):
        left = deadline - clock()
        if left < MIN_START_S:
            runs.append({"lesson": path.name[:2], "stem": path.stem, "status": NOT_RUN, "seconds": 0,
                         "budget_s": 0, "tail": f"{max(left, 0):.0f} s were left"})  # fmt: skip
            continue
        timeout = lesson_timeout(left, budget, lessons[i + 1 :], total)
        status, wall, tail = run(path, timeout)
        print(f"{path.stem:<28} {status:<24} {wall:7.1f} s of {timeout:.0f} s", flush=True)
        if status != "ok":
            print("   " + tail.replace("\n", "\n   "))
        runs.append({"lesson": path.name[:2], "stem": path.stem, "status": status, "seconds": round(wall, 1),
                     "budget_s": round(timeout, 1), "tail": tail})  # fmt: skip
        after(runs)
    return runs


def exit_status(runs: list[dict]) -> int:
    """0 only when every lesson ran to its end ("ok") or skipped for a missing package; 1 when any failed, timed
    out or never ran for want of time (those are printed)."""
    unfinished = [r for r in runs if r["status"] != "ok" and not r["status"].startswith("skipped")]
    never = [r["lesson"] for r in runs if r["status"] == NOT_RUN]
    if never:
        print(f"{len(never)} lesson(s) never ran for want of time: {', '.join(never)} (raise --budget)")
    return 1 if unfinished else 0


def run_lesson(path: Path, env: dict[str, str], timeout_s: float, log: Path) -> tuple[str, float, str]:
    """Run one lesson cell by cell; return (status, wall seconds, last lines). The whole output goes to ``log``."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "scripts.run_cells", path.name]
    try:
        proc = subprocess.run(cmd, cwd=path.parent, env=env, capture_output=True, text=True, timeout=timeout_s)
        text, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        text, code = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMEOUT after {timeout_s:.0f} s", None
        text = text if isinstance(text, str) else text.decode(errors="replace")
    log.write_text(text)
    tail = "\n".join(text.strip().splitlines()[-6:])
    if code is None:
        status = "timeout"
    elif code == 0:
        status = "ok"
    else:
        missing = missing_package(text)
        status = f"skipped: missing {missing}" if missing else "failed"
    return status, time.perf_counter() - t0, tail


_MISSING = (
    r"ModuleNotFoundError: No module named '([\w.]+)'",  # an import
    r"MissingBackendError: .*?pip install (?:--no-deps )?([\w.-]+)",  # a course error naming the package to install
    r"package `([\w.-]+)` is not installed",
)


def missing_package(text: str) -> str | None:
    """The package whose absence ended the run: read from the last failing cell's error line only (an import
    error a lesson caught and reported earlier does not count)."""
    lines = [line for line in text.splitlines() if re.match(r"cell at line \d+ of .* failed: ", line)]
    if not lines:
        return None
    for pattern in _MISSING:
        found = re.search(pattern, lines[-1])
        if found:
            return found.group(1).split(".")[0]
    return None


def section_table(results_dir: Path, runs: list[dict] | None = None) -> list[dict]:
    """One row per section and run: its final status (completed only when its cell completed); with ``runs``,
    also a row "not reached" for every section of a lesson that ran whose cell was never reached."""
    sys.path.insert(0, str(ROOT))
    from course_utils.supply import modes
    from scripts.gpu_levels import lesson_sections

    rows = []
    for r in modes.read_sections(results_dir / "sections.jsonl"):  # a torn line is warned about, not fatal
        checks = r.get("checks") or {}
        rows.append({"lesson": r["section"][:2], "section": r["section"], "status": r.get("status", "?"),
                     "mode": r.get("mode", ""), "reason": r.get("reason", ""),
                     "checks": "; ".join(f"{k} {v}" for k, v in sorted(checks.items()))})  # fmt: skip
    seen = {r["section"] for r in rows}
    ran = {r["lesson"]: r["status"] for r in runs or [] if not r["status"].startswith("not run")}
    for key in sorted(lesson_sections(ROOT)):
        if key not in seen and key[:2] in ran:
            rows.append({"lesson": key[:2], "section": key, "status": "not reached", "mode": "",
                         "reason": f"the lesson ended before it ({ran[key[:2]]})", "checks": ""})  # fmt: skip
    return rows


def write_outputs(out: Path, runs: list[dict], sections: list[dict], info: dict) -> None:
    """lessons.csv, sections.csv, sections.md and summary.json in ``out`` (rewritten after every lesson)."""
    tables = {
        "lessons.csv": (runs, ["lesson", "stem", "status", "seconds", "budget_s", "tail"]),
        "sections.csv": (sections, ["lesson", "section", "status", "mode", "reason", "checks"]),
    }
    for name, (rows, fields) in tables.items():
        with open(out / name, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
    lines = ["| lesson | section | status | reason / checks |", "|---|---|---|---|"]
    status = {r["lesson"]: r["status"] for r in runs}
    for s in sections:
        note = (s["reason"] or s["checks"]).replace("|", "/")
        lines.append(
            f"| {s['lesson']} ({status.get(s['lesson'], 'not run')}) | {s['section']} | {s['status']} | {note} |"
        )
    (out / "sections.md").write_text("\n".join(lines) + "\n")
    counts: dict[str, int] = {}
    for s in sections:
        counts[s["status"]] = counts.get(s["status"], 0) + 1
    summary = {"environment": info, "lessons": runs, "section_counts": counts,
               "completed": sorted({s["section"] for s in sections if s["status"] == "completed"})}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["smoke", "full"], default="smoke")
    ap.add_argument("--lessons", default="", help="comma-separated lesson numbers (default: all, priority order)")
    ap.add_argument("--budget", type=float, default=540,
                    help="total seconds, shared among the lessons; no lesson starts with < 20 s left")  # fmt: skip
    ap.add_argument("--wheels", type=Path, help="folder of small wheels to install first (--no-deps, never torch)")
    ap.add_argument("--allow-missing", action="store_true", help="not strict: missing packages skip with the reason")
    ap.add_argument("--no-save", action="store_true", help="do not write data/reference/")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "gpu-check")
    ap.add_argument("--allow-cpu", action="store_true", help="run without a GPU, in rehearsal mode (tests this script)")
    args = ap.parse_args(argv)

    if args.wheels:
        install_wheels(args.wheels)
    import torch

    gpu = torch.cuda.is_available()
    if not gpu and not args.allow_cpu:
        print("No CUDA GPU here (torch.cuda.is_available() is False): the GPU check needs one (--allow-cpu rehearses).")
        return 2
    results_dir, logs = args.out / "results", args.out / "log"
    shutil.rmtree(args.out, ignore_errors=True)
    results_dir.mkdir(parents=True)
    logs.mkdir()
    env = dict(os.environ, COURSE_RESULTS_DIR=str(results_dir), MPLBACKEND="agg", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env["COURSE_STRICT_GPU"] = "0" if args.allow_missing or not gpu else "1"
    env["COURSE_REHEARSE"] = "0" if gpu else "1"
    if args.size == "smoke":
        env["COURSE_SMOKE"] = "1"
    else:
        env.pop("COURSE_SMOKE", None)

    wanted = {n.strip().zfill(2) for n in args.lessons.split(",") if n.strip()}
    lessons = order([p for p in (ROOT / "lessons").glob("[0-9][0-9]_*.py") if not wanted or p.name[:2] in wanted])
    info = environment()
    runs = schedule(
        lessons,
        args.budget,
        lambda path, timeout: run_lesson(path, env, timeout, logs / f"{path.name[:2]}.log"),
        after=lambda runs: write_outputs(args.out, runs, section_table(results_dir, runs), info),
    )
    sections = section_table(results_dir, runs)
    write_outputs(args.out, runs, sections, info)
    print("\n" + (args.out / "sections.md").read_text())

    csvs = sorted(p for p in results_dir.glob("*.csv"))
    completed = sorted({s["section"] for s in sections if s["status"] == "completed"})
    if not args.no_save and csvs and gpu:
        from course_utils.show import results

        rows_df = results.load_results(csvs)  # malformed rows skipped with a warning, good rows kept
        ref = ROOT / "data" / "reference"
        ref.mkdir(parents=True, exist_ok=True)
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{info['gpu']}_{info['date']}_{args.size}")
        rows_df.to_csv(ref / f"{stem}.csv", index=False)
        extra = {"lessons": [[r["lesson"], r["stem"], r["status"]] for r in runs], "sections_ran": completed}
        (ref / f"{stem}.env.json").write_text(json.dumps(info | extra, indent=2))  # read by scripts/gpu_levels.py
        print(f"reference results written to {ref / stem}.csv (+ .env.json)")
    print(json.dumps(info))
    return exit_status(runs)


if __name__ == "__main__":
    sys.exit(main())
