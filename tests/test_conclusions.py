"""Every conclusion a lesson prints comes from the sentence helpers, or from a branch on their verdict.

A lesson may say "faster", "does not fit", "no difference", "memory-bound", "pays off" ... only where the numbers
beside it decide it, through one set of helpers (``course_utils/measuring/intervals.py``): ``Ratio.says()`` (the
speed ratios of ``cu.compare``), ``accuracy_says``, ``tail_says``, ``memory_says``, ``prediction_says``,
``roof_says`` and ``ratio_from_bounds``. A hand-made ``"faster" if a < b else "slower"`` from two medians says
"faster" where the interval says "no difference"; this test finds such sentences in the lessons' code.

The rule. Every string literal and f-string in the code of ``lessons/NN_*.py`` is taken to reach the output (a
print, a display, a table, a plot, a results note, an exception), except docstrings, strings a condition compares
with (``r.verdict == "faster"``), subscript keys (``row["fits"]``), format specs, and the keys of a dict picked by a
verdict (``{"lower": ...}.get(tail.verdict)``). The lessons are parsed with ``ast``, so comments and the ``# ``
markdown cells are not read. An f-string is read as its literal text, its ``{...}`` parts replaced by "…" (strings
inside them are read on their own). A string whose text holds a word of :data:`CONCLUSION_WORDS` (whole words, any
case; or any "X-bound") is allowed when

(a) it is an argument of a helper call (:data:`HELPERS`: ``r.says(..., "the throughput of")``,
    ``roof_says("compute-bound matmul", ...)``), or
(b) it sits in a branch picked by a helper's verdict: the body or ``else`` of an ``if``/``elif`` or of a conditional
    expression, or the element of a comprehension, whose condition reads a verdict; or a value (or the default) of
    a dict indexed by a verdict. The nearest branch decides: inside a verdict's branch, a string under a further
    ``if peak < budget:`` is that comparison's conclusion, not the verdict's. A condition reads a verdict when it
    names one of :data:`VERDICT_ATTRS` (``.verdict``, ``.judge(...)``, ``.judge_within(...)``), or a name assigned
    from an expression that does (``tp_verdict = ratio.judge(2.0)``, ``kept = vs_best.verdict == "faster"``), or
    calls a function of the lesson that returns one (``fastest_threads(cmp)``), or
(c) it is listed in :data:`ALLOWED`: (lesson, a snippet of the string) with the reason it concludes nothing (a
    column header, a plot title, a note on method, an outcome that compares nothing). A snippet with a space
    matches every string that contains it; a one-word snippet ("fits", "gain") only the string that is exactly it.

Anything else fails, naming lesson, line and string: the table is a ratchet. An entry that matches nothing any more
fails too, so the table cannot rot.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

LESSONS_DIR = Path(__file__).resolve().parent.parent / "lessons"
LESSONS = sorted(p.name[:2] for p in LESSONS_DIR.glob("[0-9][0-9]_*.py"))

# Words that conclude: how a comparison came out, a fit, a target, what limits, a judgement, a gain.
CONCLUSION_WORDS = (
    # speed
    "faster", "fastest", "slower", "slowest", "quicker", "as fast as", "speeds up", "sped up", "slows down",
    "slowed down",
    # no effect
    "no difference", "makes no difference", "does not matter", "doesn't matter",
    # fitting
    "fit", "fits", "does not fit", "doesn't fit", "did not fit",
    # a target
    "met", "missed",
    # what limits (and any "X-bound": memory-bound, compute-bound; not "upper bound")
    "bound by", "bottleneck", "bottlenecks",
    # judgement
    "better", "best", "worse", "worst", "win", "wins", "won", "winner", "lose", "loses", "lost", "beat", "beats",
    "outperforms", "pay", "pays", "paid", "pays off", "paid off", "pay off", "worth it", "save", "saves", "saved",
    "saving", "savings", "helps", "helped", "hurt", "hurts", "improves", "improved", "improvement", "cheaper",
    "dearer", "gain", "gains",
)  # fmt: skip
CONCLUSION = re.compile(
    r"\b(?:" + "|".join(re.escape(w) for w in CONCLUSION_WORDS) + r")\b|\b[a-z]+-bound\b", re.IGNORECASE
)

# The sentence helpers: a string passed to one of them is phrased by it (rule a).
HELPERS = frozenset({
    "says", "accuracy_says", "tail_says", "memory_says", "prediction_says", "roof_says", "ratio_from_bounds",
})  # fmt: skip
# What a helper's verdict is read through (rule b).
VERDICT_ATTRS = frozenset({"verdict", "judge", "judge_within"})

LABEL = "a label (a column, axis, plot title, results note or comparison name), not a conclusion"
PICK = "names the variant with the highest interval low end (the surest gain); the Ratio beside it says the verdict"
DRAFT = "the name of a workload: a prompt the prompt-lookup draft can copy from"
ALLOWED: dict[tuple[str, str], str] = {  # (lesson, snippet of the string): why it concludes nothing
    ("00", "pays only with BF16 instructions"): "a capability note from the CPU's flags, before anything is measured",
    ("00", "expect little gain"): "a capability note from the CPU's flags, before anything is measured",
    ("00", " times: fastest "): "the smallest and largest of one set of timings, printed to show their spread",
    ("01", "single thread: no difference to show"): "says that no comparison was run (one thread), not a result",
    ("01", "(best matmul)"): "a label: the highest of the matmul rates measured, the peak used as a roof",
    ("02", "looks worse under it"): "the profiled total against the unprofiled calls' p10-p90 range, all printed "
    "beside it (no helper compares one value with a range); it states the profiler's per-call cost",
    ("03", "saved "): "a file was saved: its path",
    ("03", "use a faster model"): "advice when no batch size meets the budget: nothing is compared",
    ("03", "is the best under"): "'best under a budget' is the section's defined pick (top throughput, p90 within the "
    "budget); nothing else was timed, and the sentence says so and asks for a rerun",
    ("03", "the best batch is"): "'best under a budget' is the section's defined pick; its gain is phrased by .says()",
    ("03", "Throughput gain from batching"): LABEL,
    ("03", "largest batch that fit"): "what the capped sweep ran without running out of memory: an outcome, not a "
    "comparison",
    ("03", "best batch under budget"): LABEL,
    ("04", "best variant"): PICK,
    ("04", "so it rarely pays"): "explains what missing BF16 instructions mean, beside the measured ratios",
    ("04", "Best at batch"): PICK,
    ("05", "loses that much resolution"): "arithmetic of a quantization scale, computed, not measured",
    ("05", "missed (cosine below the target)"): "the accuracy gate of the target: the output cosine on fixed inputs "
    "against its threshold (deterministic, not timed); the speed part is judge()",
    ("05", "no memory gain"): "bytes of weights, counted exactly: no noise to take an interval of",
    ("06", "Best compiled setting here"): PICK,
    ("07", "best ORT level at batch 1"): PICK,
    ("07", "cheaper arithmetic in them"): "advice on what to try next, from the profile's shares printed beside it",
    ("07", "is paid once"): "says when the one-off times printed beside it are paid",
    ("08", "best engine ("): "names the engine with the lowest median; the target verdict beside it is judge() of the "
    "interval of that engine's median",
    ("08", "best against eager"): PICK,
    ("09", "bottleneck"): LABEL,
    ("09", "bottleneck="): "a results note: the column tail_says decided",
    ("09", "vs the best with at most"): "names the sweep's best setting within the cores; the Ratio beside it and the "
    "branch on its verdict conclude",
    ("09", " (best)"): LABEL,
    ("10", "best case s"): LABEL,
    ("10", "gain"): LABEL,
    ("10", "the stage times allow at best"): "the bound the stage times allow (computed), beside the Ratio",
    ("10", "; best case "): "a results note: the bound the stage times allow",
    ("10", "overlap could save at most"): "the most an overlap can save (arithmetic of the stage times), beside the "
    "Ratio",
    ("10", "gain vs one stream"): LABEL,
    ("10", "Best case for"): "the bound the stage times allow (computed), beside the measured medians",
    ("11", "fits"): "whether one run's peak stayed under the budget: what it did, not a comparison",
    ("11", "Largest batch checked to fit"): "the batch that ran under the budget: what it did, not a comparison",
    ("12", "Best structured pruning within"): PICK,
    ("13", "paid once, not per request"): "says when the start-up time printed beside it is paid",
    ("13", "this target cannot be met"): "the budget arithmetic that sets batch_timeout, printed beside it",
    ("14", "best so far: "): "the last step kept; try_step keeps a step only when its interval beats the best so far",
    ("14", "Best stack here: "): "the last step kept (each kept only when its interval beat the best so far); its "
    "Ratio is printed beside it",
    ("14", "your stack's best uses"): "names the stack's last kept step (kept only when its interval beat the best "
    "so far) and whether optimize()'s pick is part of it: a comparison of names",
    ("14", "optimize()'s best"): "optimize()'s pick and the stack's, each printed with its Ratio",
    ("14", "higher is better"): LABEL,
    ("14", "paid and were kept"): "counts the steps try_step kept (kept only when shown faster by the interval)",
    ("14", "a technique that helps on one model"): "a statement of method",
    ("14", "a server pays it at every start"): "says when the first-call time printed beside it is paid",
    ("15", "above the ridge (compute-bound here)"): "the roofline model's side of the ridge: counted FLOP per byte "
    "against the measured ridge, both printed beside it (a prediction, not a timing verdict)",
    ("15", "below the ridge (still memory-bound here)"): "the roofline model's side of the ridge, see above",
    ("15", "met"): "agreement_verdict: a share's exact (Clopper-Pearson) 95% interval against the target; no helper "
    "covers proportions",
    ("15", "missed"): "agreement_verdict, see 'met'",
    ("15", "the weights' memory gain"): "arithmetic on the config (hidden size and the packing's padding): a bound, "
    "not a measurement",
    ("15", "the same layout saves about half that"): "arithmetic: BF16 has half FP32's bytes; not measured here",
    ("15", "do not stream memory as fast as a plain copy"): "the reason printed when judge() misses the roof target",
    ("16", "target 'no worse than the copying version"): "the target's label; met or missed is branched on the "
    "Ratio's verdict right after it",
    ("16", "p99 TTFT (lower is better)"): LABEL,
    ("16", "p99 ITL (lower is better)"): LABEL,
    ("16", "nothing lost or changed"): "follows from the check asserted above it: every answer identical to generate",
    ("16", "TTFT vs no cache (lower is better above 1)"): LABEL,
    ("16", "copy (draft fits)"): DRAFT,
    ("16", "Draft fits, k="): DRAFT,
    ("16", "a pass pays for up to"): "arithmetic: a verify pass scores k + 1 positions",
    ("16", "--save-result"): "a flag of vLLM's benchmark, in a command line",
    ("16", "both versions pay for the batch's other sequences"): "follows from the key counts printed beside it: "
    "both score more keys per token than a paged kernel",
    ("16", "where the draft fits"): DRAFT,
    ("16", "draft fits"): DRAFT,
    ("17", "tokens that fit"): "a capacity computed from counted bytes (tokens_that_fit), not a measured comparison",
    ("17", "tokens of KV that fit per GPU"): LABEL,
    ("17", "the fit is FLAGGED"): "the fit of a line (least squares), not 'fits in memory'",
    ("17", "(the fit of the median sweep"): "the fit of a line (least squares), not 'fits in memory'",
    ("17", "predicted: at best"): "a prediction of the step-time model, labelled so",
    ("17", "slowest stage"): LABEL,
    ("17", "fastest stage"): LABEL,
    ("17", "slowest / fastest stage"): LABEL,
    ("17", "(the slowest stage took"): "names the stage by its time; the Ratio's interval is printed beside it",
    ("17", "the model fits one device"): "the decision table's 'when' column: guidance, not a measurement",
    ("17", "the model does not fit one device"): "the decision table's 'when' column: guidance, not a measurement",
}


# ---------------------------------------------------------------------------------------------------------------
# the scan
# ---------------------------------------------------------------------------------------------------------------

COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class Scan:
    """The strings of one lesson's code that reach its output, and which rule, if any, allows each."""

    def __init__(self, text: str):
        self.tree = ast.parse(text)
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.verdict_names: set[str] = set()
        self._find_verdict_names()

    def _find_verdict_names(self) -> None:
        """Names that hold a verdict's pick, to a fixed point (``a = r.verdict; b = a``): a name assigned (alone or
        unpacked; ``x[...] =`` and ``x.y =`` leave ``x`` alone) from an expression that reads a verdict, and a
        function of the lesson that returns one."""
        while True:
            before = len(self.verdict_names)
            for node in ast.walk(self.tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value:
                    if self.reads_verdict(node.value):
                        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                            elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
                            self.verdict_names |= {e.id for e in elts if isinstance(e, ast.Name)}
                elif isinstance(node, ast.FunctionDef):
                    returns = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value]
                    if any(self.reads_verdict(r) for r in returns):
                        self.verdict_names.add(node.name)
            if len(self.verdict_names) == before:
                return

    def reads_verdict(self, expr: ast.AST) -> bool:
        return any(
            (isinstance(n, ast.Attribute) and n.attr in VERDICT_ATTRS)
            or (isinstance(n, ast.Name) and n.id in self.verdict_names)
            for n in ast.walk(expr)
        )

    def _ancestors(self, node: ast.AST) -> Iterator[tuple[ast.AST, ast.AST]]:
        while node in self.parent:
            yield node, self.parent[node]
            node = self.parent[node]

    def _picked_by_verdict(self, d: ast.AST) -> bool:
        """``d`` is a dict literal indexed by a verdict: ``{...}[x.verdict]`` or ``{...}.get(x.verdict, ...)``."""
        if not isinstance(d, ast.Dict):
            return False
        up = self.parent.get(d)
        if isinstance(up, ast.Subscript) and up.value is d:
            return self.reads_verdict(up.slice)
        call = self.parent.get(up)
        return (
            isinstance(up, ast.Attribute) and up.attr == "get" and isinstance(call, ast.Call) and bool(call.args)
            and self.reads_verdict(call.args[0])
        )  # fmt: skip

    def _not_output(self, node: ast.AST) -> bool:
        """A docstring, a string compared with, a subscript key, a format spec, or a key of a verdict's dict."""
        for child, parent in self._ancestors(node):
            if isinstance(parent, ast.Compare):
                return True
            if isinstance(parent, ast.Subscript) and child is parent.slice:
                return True
            if isinstance(parent, ast.FormattedValue) and child is parent.format_spec:
                return True
            if isinstance(parent, ast.Dict) and child in parent.keys and self._picked_by_verdict(parent):
                return True
        up = self.parent.get(node)
        return isinstance(up, ast.Expr) and isinstance(self.parent.get(up), SCOPES) and self.parent[up].body[0] is up

    def rule(self, node: ast.AST) -> str:
        """'a' or 'b' when rule (a) or (b) allows the string, '' when neither does."""
        for child, parent in self._ancestors(node):
            if isinstance(parent, ast.Call) and child is not parent.func:
                name = parent.func.attr if isinstance(parent.func, ast.Attribute) else getattr(parent.func, "id", "")
                if name in HELPERS:
                    return "a"
                if child in parent.args[1:] and isinstance(parent.func, ast.Attribute):
                    if self._picked_by_verdict(parent.func.value):
                        return "b"  # the default of {...}.get(x.verdict, default)
            # the nearest branch decides: a string under `if x.verdict == ...:` and then `if n > 3:` is picked by
            # `n > 3`, not by the verdict, so it is not allowed by (b)
            if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
                return "b" if self.reads_verdict(parent.test) else ""
            if isinstance(parent, COMPREHENSIONS) and not isinstance(child, ast.comprehension):
                ifs = [c for g in parent.generators for c in g.ifs]
                if ifs:
                    return "b" if any(self.reads_verdict(c) for c in ifs) else ""
            if isinstance(parent, ast.Dict) and child in parent.values and self._picked_by_verdict(parent):
                return "b"
        return ""

    def strings(self) -> Iterator[tuple[int, str, ast.AST]]:
        """(line, text, node) of every string that reaches the output; an f-string's ``{...}`` parts read "…"."""
        for node in ast.walk(self.tree):
            up = self.parent.get(node)
            if isinstance(node, ast.JoinedStr) and not isinstance(up, ast.FormattedValue):
                text = "…".join(v.value for v in node.values if isinstance(v, ast.Constant))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and not isinstance(up, ast.JoinedStr):
                text = node.value
            else:
                continue
            if not self._not_output(node):
                yield node.lineno, text, node


def conclusions(text: str) -> list[tuple[int, str, str]]:
    """(line, string, rule) of every string of ``text`` with a conclusion word; rule 'a', 'b', or '' for none."""
    scan = Scan(text)
    return sorted((line, s, scan.rule(node)) for line, s, node in scan.strings() if CONCLUSION.search(s))


def listed(snippet: str, string: str) -> bool:
    """An ALLOWED snippet with a space matches a string containing it; a one-word snippet only itself."""
    return snippet in string if " " in snippet else snippet == string


def offenders(path: Path) -> list[tuple[int, str]]:
    """(line, string) of the conclusions of a lesson file that no rule allows and :data:`ALLOWED` does not list."""
    snippets = [snippet for (nn, snippet) in ALLOWED if nn == path.name[:2]]
    found = conclusions(path.read_text(encoding="utf-8"))
    return [(line, s) for line, s, rule in found if not rule and not any(listed(a, s) for a in snippets)]


def _path(lesson: str) -> Path:
    (path,) = LESSONS_DIR.glob(f"{lesson}_*.py")
    return path


# ---------------------------------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_conclusion_comes_from_a_helper(lesson):
    bad = offenders(_path(lesson))
    assert not bad, (
        f"lesson {lesson} prints a conclusion that no helper phrased: build it with Ratio.says() or a *_says() "
        "helper of course_utils/measuring/intervals.py, or branch on its .verdict; a label that concludes nothing "
        "goes into ALLOWED in tests/test_conclusions.py with its reason:\n"
        + "\n".join(f"  lessons/{_path(lesson).name}:{line}: {s!r}" for line, s in bad)
    )


def test_every_allowed_entry_still_matches_a_string():
    stale = []
    for (lesson, snippet), why in ALLOWED.items():
        found = [s for _, s, rule in conclusions(_path(lesson).read_text(encoding="utf-8")) if not rule]
        if not why or not any(listed(snippet, s) for s in found):
            stale.append(f"({lesson!r}, {snippet!r})")
    assert not stale, "ALLOWED entries that match no conclusion any more (remove them): " + ", ".join(stale)


PLANTED = """\
# %% [markdown]
# INT8 is faster than FP32: a markdown cell is not code.

# %%
m_int8, m_fp32 = cu.measure(int8), cu.measure(fp32)  # faster? a comment is not code either
word = "faster" if m_int8.median_ms < m_fp32.median_ms else "slower"
print(f"INT8 was {word} than FP32")
print(f"INT8 is {m_fp32.median_ms / m_int8.median_ms:.2f}x faster than FP32")
if m_int8.median_ms > m_fp32.median_ms:
    print("INT8 does not pay off here")
"""

PLANTED_VIA_HELPERS = """\
# %%
cmp = cu.compare({"int8": int8, "fp32": fp32}, baseline="fp32")
r = cmp.ratio("int8")
print(r.says("INT8", "FP32", "faster than"))
word = "faster" if r.verdict == "faster" else "not shown faster"
print(f"INT8 was {word} than FP32")
if r.judge(1.5) == "missed":
    print("INT8 does not pay off here")
surely = [k for k, v in cmp.ratios.items() if v.verdict == "faster"]
print(f"surely faster: {surely}" if surely else "none shown faster")
tail = cu.intervals.tail_says("the loader", a, "the model", b, q=0.5)
print({"lower": "the loader is the bottleneck"}.get(tail.verdict, "neither is shown to be the bottleneck"))
"""


def test_the_scan_finds_a_planted_conclusion_and_passes_the_same_one_from_a_helper(tmp_path):
    planted = tmp_path / "99_planted.py"
    planted.write_text(PLANTED)
    assert offenders(planted) == [
        (6, "faster"),
        (6, "slower"),
        (8, "INT8 is …x faster than FP32"),
        (10, "INT8 does not pay off here"),
    ]
    planted.write_text(PLANTED_VIA_HELPERS)
    assert offenders(planted) == []


@pytest.mark.parametrize(
    ("snippet", "string", "matches"),
    [("fits", "fits", True), ("fits", "the model fits", False), ("model fits", "the model fits one GPU", True)],
)
def test_a_one_word_snippet_allows_only_that_word(snippet, string, matches):
    assert listed(snippet, string) is matches


NESTED = """\
# %%
r = cmp.ratio("int8")
if r.verdict == "faster":
    print("INT8 is faster")
    if m_int8.median_ms < 1.0:
        print("so it is worth it on small inputs")
word = "kept" if r.verdict == "faster" else "it fits" if peak < budget else "over"
"""


def test_the_nearest_branch_decides_not_an_outer_verdict(tmp_path):
    """A branch on a raw number inside a verdict's branch is that number's conclusion, not the verdict's."""
    planted = tmp_path / "98_nested.py"
    planted.write_text(NESTED)
    assert offenders(planted) == [(6, "so it is worth it on small inputs"), (7, "it fits")]
