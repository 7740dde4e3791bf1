"""Every ratio a lesson prints comes from the comparison helper (``cu.compare`` / ``compare_runs``, a Ratio).

The scan reads the lessons' source: a division of one timing by another (``a.median_ms / b.median_ms``,
``r[True] / r[False]`` of rates, ``speedup = ...``) or a number formatted as a ratio (``{x:.2f}x``) is a print
site that bypasses the helper. The few that are not comparisons of timed variants (sizes, bytes, a simulation's
output) are listed in ``EXEMPT`` with the reason; each entry must still match a line, so the list cannot rot.
Every lesson but 00 is scanned, found in ``lessons/``.
"""

import re
from pathlib import Path

import pytest

LESSONS_DIR = Path(__file__).resolve().parent.parent / "lessons"
# every lesson but 00 (which times nothing), derived from lessons/ so that a new lesson is scanned too
LESSONS = sorted(p.name[:2] for p in LESSONS_DIR.glob("[0-9][0-9]_*.py") if p.name[:2] != "00")

TIMING = (
    r"(?:median_ms|mean_ms|p\d\d_ms|_ms\b|\bms\b|throughput|images/s|img/s|req/s|tokens/s|speedup|\bgain\b"
    r"|_ips\b|\bips\b|\bseq\b|\bovl\b)"
)
# a timing quantity divided by another one (within one expression on one line)
TIMING_DIVISION = re.compile(TIMING + r"[\w\"'\]\[\.\)]*\s*/\s*[\w\"'\[\.\(, ]{0,40}?" + TIMING)
# a number printed as a ratio without the helper: {expr:.2f}x
RATIO_FORMAT = re.compile(r"\{[^{}]*:\.\d+[fg]\}x")

EXEMPT = {  # (lesson, text on the line): why it is not a comparison of timed variants
    ("15", "{4 * hidden / padded:.1f}x"): "arithmetic on the config: INT4's padding bound, nothing timed",
    ("02", 'table["share"] = table["ms"] / table["ms"].sum()'): "each stage's share of one profile's total",
    ("16", 'row[f"{n}: share %"] = 100 * prof_ms[n][cat] / sum(prof_ms[n].values())'): "each category's share of one "
    "profile's total",
    ("16", "{ch[pool, when]:.2f}x, {ch90[pool, when]:.2f}x"): "blocks a slice spans over blocks a batch uses: counts",
    ("03", "long.p99_ms / short.p99_ms"): "output of the batching simulation: what not to do past saturation",
    ("07", 'per_op["share"] = (per_op["total ms"] / per_op["total ms"].sum())'): "each operator's share of one profile",
    ("09", 'err = (e2e["measured img/s"] / e2e["predicted img/s"] - 1)'): "a measurement against its prediction",
    ("05", "({lin_ratio_mlp:.2f}x smaller"): "bytes of weights, counted, not timed",
    ("05", "{lin_ratio_mlp:.2f}x smaller on the MLP"): "bytes of weights, counted, not timed",
    ("05", "{s_out / scale:.0f}x larger"): "quantization scales, computed, not timed",
    ("05", "{lw['fp32'] / lw['torchao int8']:.2f}x smaller"): "bytes of weights, counted, not timed",
    ("05", "fewer bytes than INT8"): "bytes of weights, counted, not timed",
    ("05", "MORE bytes than INT8"): "bytes of weights, counted, not timed",
    ("08", "({fp32_mib / fp16_mib:.2f}x smaller)"): "file sizes, not timed",
    ("09", "({ref_batch.nbytes / u8_batch.nbytes:.0f}x fewer)"): "bytes per batch, counted, not timed",
    ("12", "cuts parameters {param_cut:.1f}x"): "parameter counts, not timed",
    ("17", "({kv1 / kv3:.1f}x smaller)"): "KV bytes per token and tokens that fit, computed, not timed",
    ("12", "{n_teacher / count_params(s_kd):.0f}x"): "parameter counts, not timed",
}


def print_sites(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every timing ratio computed or a number formatted as a ratio, comments left out."""
    hits = []
    for i, line in enumerate(text.splitlines(), 1):
        code = line.split("  #", 1)[0] if not line.lstrip().startswith("#") else ""
        if TIMING_DIVISION.search(code) or RATIO_FORMAT.search(code):
            hits.append((i, line.strip()))
    return hits


def _source(lesson: str) -> str:
    (path,) = LESSONS_DIR.glob(f"{lesson}_*.py")
    return path.read_text()


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_ratio_print_goes_through_the_helper(lesson):
    exempt = [text for (nn, text) in EXEMPT if nn == lesson]
    bad = [(i, line) for i, line in print_sites(_source(lesson)) if not any(t in line for t in exempt)]
    assert not bad, (
        f"lesson {lesson} computes or formats a ratio without cu.compare (print the Ratio, its .says() or "
        f".interval_text; record it with speedup_vs_baseline=ratio): "
        + "; ".join(f"line {i}: {line[:120]}" for i, line in bad)
    )


@pytest.mark.parametrize("lesson", LESSONS)
def test_lessons_that_time_variants_compare_them(lesson):
    text = _source(lesson)
    if "cu.measure(" not in text and "compare(" not in text:
        pytest.skip(f"lesson {lesson} times nothing")
    assert re.search(r"\bcu\.compare\(|compare_runs\(|compare_models\(", text), f"lesson {lesson} has no comparison"


def test_every_exemption_still_matches_a_line():
    for (lesson, text), why in EXEMPT.items():
        assert why and any(text in line for _, line in print_sites(_source(lesson))), (lesson, text)


@pytest.mark.parametrize(
    "line",
    [
        'print(f"{m_dense.median_ms / m_sparse.median_ms:.2f}x the dense speed")',
        "speedup = eager[b].median_ms / m.median_ms",
        'gain = u8["images/s"].iloc[1] / u8["images/s"].iloc[0]',
        'print(f"ran at {r[True] / r[False]:.2f}x the rate")',
        "ratio = thread_table.median_ms.iloc[0] / thread_table.median_ms.iloc[-1]",
    ],
)
def test_the_scan_catches_a_planted_ratio(line):
    assert print_sites(line), line


@pytest.mark.parametrize(
    "line",
    [
        'print(f"{cmp.ratio(name)} vs eager")',
        "per_op_us = m_tiny.median_ms * 1000 / ops",
        'print(f"{2 * n**3 / (m.median_ms / 1000) / 1e9:.1f} GFLOP/s")',
        "# a comment: a.median_ms / b.median_ms",
    ],
)
def test_the_scan_leaves_other_arithmetic_alone(line):
    assert not print_sites(line), line
