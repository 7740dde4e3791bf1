"""Run the whole course headless and render an HTML report: for instructors preparing a workshop machine.

    python -m scripts.run_course                 # every notebook, full sizes, into build/course/
    COURSE_SMOKE=1 python -m scripts.run_course  # smoke sizes (the environment decides the mode)
    python -m scripts.run_course --only 00 14    # some notebooks

Each notebook in ``notebooks/`` is executed with nbclient (outputs kept) into ``<out>/<name>.ipynb`` and
rendered to ``<out>/<name>.html``; results go to ``<out>/results/`` unless ``COURSE_RESULTS_DIR`` is set.
A notebook that fails is reported and the run goes on; the exit code is 1 at the end if any failed.
``<out>/index.html`` shows what ran, what was skipped (from the section record ``sections.jsonl``) and why,
each notebook's wall time, and the leaderboard (this run's results beside shipped GPU references).
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import os
import platform
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class NotebookRun:
    """What happened to one notebook: status, wall time, error, and its GPU-only / opt-in section outcomes."""

    name: str
    status: str = "not run"
    wall_s: float = 0.0
    error: str = ""
    sections: list[dict] = field(default_factory=list)
    figures: int = 0

    @property
    def skipped(self) -> list[dict]:
        return [s for s in self.sections if not s.get("ran")]


def _read_sections(path: Path) -> list[dict]:
    from course_utils.supply.modes import read_sections  # warns about and skips a torn line

    return read_sections(path)


def execute_notebook(src: Path, dest: Path, *, timeout: int, kernel: str | None, results: Path) -> NotebookRun:
    """Execute ``src`` into ``dest`` (outputs kept, partial outputs too on failure) and return the outcome."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    run = NotebookRun(src.stem)
    before = len(_read_sections(results / "sections.jsonl"))
    nb = nbformat.read(src, as_version=4)
    kwargs = {"kernel_name": kernel} if kernel else {}
    client = NotebookClient(nb, timeout=timeout, resources={"metadata": {"path": str(src.parent)}}, **kwargs)
    t0 = time.perf_counter()
    try:
        client.execute()
        run.status = "ok"
    except CellExecutionError as exc:
        run.status = "failed"
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        run.error = lines[-1][:300] if lines else type(exc).__name__
    except (CellTimeoutError, DeadKernelError, TimeoutError) as exc:
        run.status = "failed"
        run.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot start is a failure of this notebook only
        run.status = "failed"
        run.error = f"{type(exc).__name__}: {str(exc)[:300]}"
    run.wall_s = time.perf_counter() - t0
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    run.sections = _read_sections(results / "sections.jsonl")[before:]
    run.figures = count_figures(nb)
    return run


def count_figures(nb) -> int:
    """Image outputs (plots) in an executed notebook."""
    return sum(
        1
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if any(k.startswith("image/") for k in out.get("data", {}))
    )


def render_html(nb_path: Path) -> Path:
    """nbconvert's HTML of an executed notebook, beside it."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_filename(str(nb_path))
    out = nb_path.with_suffix(".html")
    out.write_text(body, encoding="utf-8")
    return out


def leaderboard_html(results: Path) -> str:
    """The leaderboard section of the report: machines, then lesson/technique rows side by side."""
    sys.path.insert(0, str(ROOT))
    from course_utils.show import leaderboard as lb

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = lb.load(results)
    notes = "".join(f"<li>{html.escape(str(w.message))}</li>" for w in caught)
    parts = ["<h2 id='leaderboard'>Leaderboard</h2>"]
    if notes:
        parts.append(f"<ul class='warn'>{notes}</ul>")
    if df.empty:
        parts.append("<p>No results were recorded in this run and no reference results are shipped.</p>")
        return "\n".join(parts)
    parts.append("<h3>Machines</h3>" + lb.machines(df).to_html(index=False, na_rep=""))
    table = lb.leaderboard(df, value="median_ms")
    parts.append("<h3>Median latency per call (ms, lower is better), newest row per machine</h3>")
    parts.append(table.to_html(float_format=lambda v: f"{v:.4g}", na_rep="") if not table.empty else "<p>none</p>")
    speed = lb.leaderboard(df, value="speedup_vs_baseline")
    if not speed.empty:
        parts.append("<h3>Speed-up vs each lesson's baseline (x, higher is better)</h3>")
        parts.append(speed.to_html(float_format=lambda v: f"{v:.3g}", na_rep=""))
    try:
        import matplotlib

        matplotlib.use("agg")
        sub = lb.leaderboard(df, lesson="14", value="speedup_vs_baseline")
        if not sub.empty:
            fig = lb.plot(sub, title="Lesson 14: speed-up per technique", xlabel="speed-up vs baseline (x)")
            buf = io.BytesIO()
            fig.savefig(buf, format="png", dpi=90)
            parts.append(f"<img alt='lesson 14 leaderboard' src='data:image/png;base64,"
                         f"{base64.b64encode(buf.getvalue()).decode()}'>")  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the plot is a bonus; the tables above carry the data
        parts.append(f"<p>(plot not drawn: {html.escape(str(exc))})</p>")
    return "\n".join(parts)


CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px} table{border-collapse:collapse;
font-size:0.9em;margin:0.5em 0} td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
.ok{color:#127012;font-weight:bold} .failed{color:#b00;font-weight:bold} .warn{color:#a60}"""


def render_index(out: Path, runs: list[NotebookRun], results: Path, mode: str, total_s: float) -> Path:
    """Write ``out/index.html``: summary table, skipped sections with reasons, links, leaderboard."""
    sys.path.insert(0, str(ROOT))
    from course_utils.measuring.device import describe

    rows = []
    for r in runs:
        skipped = "; ".join(f"{s['section']} ({s.get('kind', '')}): {s.get('reason', '')}" for s in r.skipped)
        ran = sum(1 for s in r.sections if s.get("ran"))
        rows.append(
            f"<tr><td style='text-align:left'><a href='{html.escape(r.name)}.html'>{html.escape(r.name)}</a></td>"
            f"<td class='{r.status}'>{r.status}</td><td>{r.wall_s:.1f}</td><td>{ran}</td><td>{len(r.skipped)}</td>"
            f"<td style='text-align:left'>{html.escape(r.error)}</td>"
            f"<td style='text-align:left'>{html.escape(skipped)}</td></tr>"
        )
    failed = sum(r.status != "ok" for r in runs)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Course run report</title>
<style>{CSS}</style></head><body>
<h1>GPU inference course: headless run</h1>
<p>Machine: {html.escape(describe())} · Python {platform.python_version()} · mode: {html.escape(mode)} ·
{len(runs)} notebooks, {failed} failed · total {total_s:.0f} s · {time.strftime("%Y-%m-%d %H:%M")}</p>
<p>Results folder: {html.escape(str(results))}</p>
<h2>Notebooks</h2>
<table><tr><th>notebook</th><th>status</th><th>wall s</th><th>GPU/opt-in sections run</th><th>skipped</th>
<th>error</th><th>skipped sections and why</th></tr>
{"".join(rows)}</table>
{leaderboard_html(results)}
</body></html>"""
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notebooks", type=Path, default=ROOT / "notebooks", help="folder of .ipynb to run")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "course", help="where outputs and the report go")
    ap.add_argument("--only", nargs="*", default=None, help="run only notebooks whose name starts with these")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per cell before it counts as failed")
    ap.add_argument("--kernel", default=None, help="kernel name (default: each notebook's own kernelspec)")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    from course_utils.supply import modes, paths

    set_dir = os.environ.get("COURSE_RESULTS_DIR", "").strip()
    results = paths.resolve_results_dir(set_dir) if set_dir else (out / "results").resolve()
    results.mkdir(parents=True, exist_ok=True)
    os.environ["COURSE_RESULTS_DIR"] = str(results)  # the kernels inherit the environment
    # Kernels keep Jupyter's inline backend, so the executed notebooks hold their plots (agg would drop them).
    os.environ.pop("MPLBACKEND", None)
    mode = "smoke (COURSE_SMOKE=1)" if modes.is_smoke() else "full"  # the kernels parse it the same way

    notebooks = sorted(args.notebooks.glob("*.ipynb"))
    if args.only:
        notebooks = [p for p in notebooks if any(p.stem.startswith(o) for o in args.only)]
    if not notebooks:
        print(f"no notebooks found in {args.notebooks}" + (f" matching {args.only}" if args.only else ""))
        return 2
    print(f"Running {len(notebooks)} notebook(s) in {mode} mode; outputs in {out}, results in {results}")
    runs: list[NotebookRun] = []
    t_all = time.perf_counter()
    bar = tqdm(notebooks, unit="nb", file=sys.stdout)
    for nb in bar:
        bar.set_description(nb.stem)
        run = execute_notebook(nb, out / nb.name, timeout=args.timeout, kernel=args.kernel, results=results)
        try:
            render_html(out / nb.name)
        except Exception as exc:  # noqa: BLE001
            run.error = (run.error + "; " if run.error else "") + f"HTML rendering failed: {exc}"
        runs.append(run)
        tqdm.write(f"{run.status:>6}  {nb.stem}  {run.wall_s:7.1f} s  {run.error}", file=sys.stdout)
    total = time.perf_counter() - t_all

    print("\nSummary")
    width = max(len(r.name) for r in runs)
    for r in runs:
        ran = sum(bool(s.get("ran")) for s in r.sections)
        print(
            f"  {r.name:<{width}}  {r.status:<7} {r.wall_s:8.1f} s  {r.figures:3d} figure(s)  "
            f"ran {ran} / skipped {len(r.skipped)} section(s)"
        )
        for s in r.skipped:
            print(f"      skipped {s['section']} ({s.get('kind', '')}): {s.get('reason', '')}")
        if r.error:
            print(f"      error: {r.error}")
    (out / "summary.json").write_text(json.dumps([asdict(r) for r in runs], indent=1))
    index = render_index(out, runs, results, mode, total)
    failed = [r.name for r in runs if r.status != "ok"]
    figures = sum(r.figures for r in runs)
    print(
        f"\n{len(runs) - len(failed)} ok, {len(failed)} failed, {figures} figures, {total:.0f} s in all. "
        f"Report: {index}"
    )
    if failed:
        print("Failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
