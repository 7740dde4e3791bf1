"""Run every lesson's GPU paths on a CUDA machine in strict GPU mode, and save reference results.

Works on a GPU machine WITHOUT network access and without Jupyter: each lesson's text copy
(``lessons/NN_slug.py``, plain Python in percent format) runs as a script with ``COURSE_STRICT_GPU=1``, so a
GPU-only section that cannot run fails the lesson. Missing packages can be carried as wheels in a folder
(``--wheels DIR``: installed with ``pip install --no-index --find-links DIR``).

    python -m scripts.gpu_check                  # smoke sizes, 10-minute budget (fits one H200 lease)
    python -m scripts.gpu_check --size full      # full sizes (make gpu-test)
    python -m scripts.gpu_check --lessons 01,04,08 --wheels /path/to/wheels

At the end it prints a table (lesson, section, ran/skipped, key figures) and, unless ``--no-save``, writes
``data/reference/<gpu>_<date>.csv`` (the result rows) and ``.env.json`` (GPU, driver, CUDA, torch, TensorRT,
ONNX Runtime versions, date) so lessons can show them to learners without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def install_wheels(folder: Path) -> None:
    wheels = sorted(str(p) for p in folder.glob("*.whl"))
    if not wheels:
        print(f"no wheels in {folder}")
        return
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(folder), *wheels]
    print("installing carried wheels:", ", ".join(Path(w).name.split("-")[0] for w in wheels))
    subprocess.run(cmd, check=False)


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


def run_lesson(path: Path, env: dict[str, str], timeout_s: float) -> tuple[str, float, str]:
    """Run one lesson script; return (status, wall seconds, last lines of output)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, path.name], cwd=path.parent, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t0, ""
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
    return ("ok" if proc.returncode == 0 else "failed"), time.perf_counter() - t0, tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["smoke", "full"], default="smoke")
    ap.add_argument("--lessons", default="", help="comma-separated lesson numbers (default: all)")
    ap.add_argument("--budget", type=float, default=540, help="total seconds; later lessons are not started after")
    ap.add_argument("--wheels", type=Path, help="folder of wheels to install first (offline machines)")
    ap.add_argument("--no-save", action="store_true", help="do not write data/reference/")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "gpu-check")
    ap.add_argument("--allow-cpu", action="store_true", help="run even without a GPU (to test this script)")
    args = ap.parse_args(argv)

    if args.wheels:
        install_wheels(args.wheels)
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("No CUDA GPU here (torch.cuda.is_available() is False): the GPU check needs one.")
        return 2
    results_dir = args.out / "results"
    shutil.rmtree(args.out, ignore_errors=True)
    results_dir.mkdir(parents=True)
    env = dict(os.environ, COURSE_STRICT_GPU="1", COURSE_RESULTS_DIR=str(results_dir), MPLBACKEND="agg")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env["HF_HUB_OFFLINE"] = "1"
    if args.size == "smoke":
        env["COURSE_SMOKE"] = "1"
    else:
        env.pop("COURSE_SMOKE", None)

    wanted = {n.strip().zfill(2) for n in args.lessons.split(",") if n.strip()}
    lessons = [p for p in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py")) if not wanted or p.name[:2] in wanted]
    deadline = time.perf_counter() + args.budget
    runs = []
    for path in lessons:
        left = deadline - time.perf_counter()
        if left < 20:
            runs.append((path.name[:2], path.stem, "not run (budget)", 0.0, ""))
            continue
        status, wall, tail = run_lesson(path, env, left)
        print(f"{path.stem:<28} {status:<8} {wall:7.1f} s", flush=True)
        if status != "ok":
            print("   " + tail.replace("\n", "\n   "))
        runs.append((path.name[:2], path.stem, status, wall, tail))

    from course_utils import modes, results

    sections = modes.read_sections(results_dir / "sections.jsonl")  # a torn line is warned about, not fatal
    rows = []
    csvs = sorted(results_dir.glob("*.csv"))
    if csvs:
        rows_df = results.load_results(csvs)  # malformed rows skipped with a warning, good rows kept
        rows = rows_df.to_dict("records")

    print("\n| lesson | status | s | section | ran | key figures (GPU rows) |\n|---|---|---|---|---|---|")
    for num, _stem, status, wall, _ in runs:
        secs = [s for s in sections if s["section"].startswith(num + ".")]
        figs = [r for r in rows if str(r.get("lesson")) == num and str(r.get("device", "")).startswith("cuda")]
        fig_text = "; ".join(
            f"{r['technique']}: {r['median_ms']:.3g} ms" for r in figs[:4] if r.get("median_ms") == r.get("median_ms")
        )
        if not secs:
            print(f"| {num} | {status} | {wall:.0f} | (no GPU section) | | {fig_text} |")
        for i, s in enumerate(secs):
            ran = "ran" if s["ran"] else "SKIPPED: " + s["reason"]
            print(f"| {num} | {status} | {wall:.0f} | {s['section']} | {ran} | {fig_text if i == 0 else ''} |")

    info = environment()
    if not args.no_save and csvs and torch.cuda.is_available():
        ref = ROOT / "data" / "reference"
        ref.mkdir(parents=True, exist_ok=True)
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{info['gpu']}_{info['date']}_{args.size}")
        rows_df.to_csv(ref / f"{stem}.csv", index=False)
        ran = sorted({s["section"] for s in sections if s["ran"]})
        extra = {"lessons": [r[:4] for r in runs], "sections_ran": ran}  # read by scripts/gpu_levels.py
        (ref / f"{stem}.env.json").write_text(json.dumps(info | extra, indent=2))
        print(f"\nreference results written to {ref / stem}.csv (+ .env.json)")
    print(json.dumps(info))
    failed = [r for r in runs if r[2] not in {"ok"}]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
