"""Calibrate ``cu.compare`` on workloads of known cost ratio: a benchmark that reports, not a test that fails.

    python -m scripts.calibrate_compare                  # quiet, then beside 6 CPU burners; 20 repeats each
    python -m scripts.calibrate_compare --burners 0      # only the machine as it is
    COURSE_SMOKE=1 python -m scripts.calibrate_compare   # the smoke defaults the tests run with

Two pairs, each compared ``--repeats`` times with ``cu.compare``'s defaults: one matmul against the same matmul
(true speed ratio 1) and one matmul against two of them (true ratio 2: the 2x variant is the baseline). For each
pair and load it prints how often the 95% interval covered the true ratio, how wide the interval was, the
verdicts, and how often the comparison flagged itself as drifted. The load is stated as ``os.getloadavg()``
before and after each condition; the burners (``while True: pass`` processes, started here) are stopped in a
``finally``, whatever happens.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import pandas as pd
import torch

import course_utils as cu


def _workloads(n: int) -> dict[str, object]:
    a = torch.randn(n, n)
    out = torch.empty(n, n)

    def one() -> None:
        torch.matmul(a, a, out=out)

    def two() -> None:
        torch.matmul(a, a, out=out)
        torch.matmul(a, a, out=out)

    return {"one": one, "two": two}


def _condition(name: str, repeats: int, n: int, statistic: str) -> list[dict[str, object]]:
    w = _workloads(n)
    pairs = {"1x vs 1x": ({"base": w["one"], "same": w["one"]}, "same", 1.0),
             "1x vs 2x": ({"base": w["two"], "half": w["one"]}, "half", 2.0)}  # fmt: skip
    load_before = os.getloadavg()[0]
    rows = []
    for pair, (variants, variant, truth) in pairs.items():
        for i in range(repeats):
            r = cu.compare(variants, baseline="base", device="cpu", label=pair, statistic=statistic).ratio(variant)
            rows.append({"condition": name, "pair": pair, "repeat": i, "true ratio": truth, "estimate": r.estimate,
                         "low": r.low, "high": r.high, "covered": r.low <= truth <= r.high, "verdict": r.verdict,
                         "drifted": r.drifted})  # fmt: skip
    load_after = os.getloadavg()[0]
    for row in rows:
        row["load (1-min avg) before/after"] = f"{load_before:.1f} / {load_after:.1f}"
    return rows


def _start_burners(k: int) -> list[subprocess.Popen]:
    code = "import time\nend = time.time() + 900\nwhile time.time() < end: pass"  # stops by itself too
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(k)]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def summarize(rows: list[dict[str, object]]) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df["width %"] = (df["high"] / df["low"] - 1) * 100
    g = df.groupby(["condition", "pair"], sort=False)
    return pd.DataFrame({
        "load before/after": g["load (1-min avg) before/after"].first(),
        "repeats": g.size(),
        "covered": g["covered"].sum().astype(int),
        "median estimate": g["estimate"].median(),
        "estimate range": g["estimate"].agg(lambda s: f"{s.min():.3f}-{s.max():.3f}"),
        "median width %": g["width %"].median(),
        "max width %": g["width %"].max(),
        "verdicts": g["verdict"].agg(lambda s: ", ".join(f"{k} {v}" for k, v in s.value_counts().items())),
        "drift flags": g["drifted"].sum().astype(int),
    })  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20, help="comparisons per pair and condition (default 20)")
    ap.add_argument("--burners", type=int, default=6, help="CPU burners for the loaded condition (0: none)")
    ap.add_argument("--n", type=int, default=256, help="matmul size (default 256)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--statistic", choices=["mean", "median"], default="mean", help="per-round statistic")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    mode = "smoke" if cu.is_smoke() else "full"
    print(f"cu.compare calibration: {args.n}x{args.n} matmul, {args.threads} torch thread(s), {mode} defaults, "
          f"{os.cpu_count()} CPUs ({cu.device.cpu_model()})")  # fmt: skip
    t0 = time.perf_counter()
    rows = _condition("as found (quiet?)", args.repeats, args.n, args.statistic)
    if args.burners:
        burners = _start_burners(args.burners)
        try:
            time.sleep(5)  # let the load average rise
            rows += _condition(f"beside {args.burners} CPU burners", args.repeats, args.n, args.statistic)
        finally:
            _stop(burners)
    table = summarize(rows)
    with pd.option_context("display.max_columns", None, "display.width", 250):
        print(table.round(3).to_string())
    print(f"({time.perf_counter() - t0:.0f} s; true ratio covered = the 95% interval contained it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
