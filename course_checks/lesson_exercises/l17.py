"""Lesson 17 exercise: a row-parallel linear layer with its all-reduce, run on real gloo ranks.

``17.row-parallel``: ``row_parallel_linear(x, linear, group)`` runs in fresh rank processes (lesson 17's exported
``World``, 3 ranks; the sub-groups of the first 2 and of all 3), which receive the function's source. Every call
draws random layers and always includes the boundary cases: a square layer (a split along the wrong dimension runs
without a shape error there), a layer without bias, a 3-D input, a shard one feature wide (``in_features ==
world size``), on 2 and on 3 ranks, and a layer on a group of ranks 1 and 2 (a rank within the group is not the
process's rank). Inside each rank the checker computes the full layer first, then runs the
learner's function under an operator log (:class:`~course_checks.lesson_exercises.observe.OpLog`) with
``dist.all_reduce`` wrapped to record what it reduced. It judges every rank's returned output against the full
layer, and names the honest mistakes: no all-reduce, the all-reduce on another tensor than the partial output, the
bias added on every rank, the split along the wrong dimension, the whole layer computed on every rank (nothing
split), a reduction other than the sum, a collective over another group, the rank or world size of every process
instead of the group's, an ``async_op=True`` handle never waited on.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_checks.exercises import exercise, untimed
from course_checks.lesson_exercises.observe import MATMUL_OPS, OpLog, cases

TOL = 1e-4  # fp32, sums of up to 64 products of unit-scale values
START_S = 300.0  # the ranks' start-up (not counted against the learner: untimed), and gloo's collective timeout
TASK_S = 60.0  # the learner's function on every case, all ranks: a rank silent this long is stuck
CASES_PER_SIZE = 1  # random layers per world size, besides the three boundary cases


def _case_list(rng: Any) -> list[dict]:
    """Random layers for one call, the boundary cases of a row-parallel split included for both world sizes."""
    out = []
    for p in (2, 3):
        square = p * rng.randint(1, 6)
        out.append({"p": p, "in": square, "out": square, "lead": [rng.randint(1, 4)], "bias": True})  # square
        out.append({"p": p, "in": p, "out": rng.randint(2, 9), "lead": [2, rng.randint(1, 3)], "bias": True})  # width 1
        out.append({"p": p, "in": p * rng.randint(2, 5), "out": rng.randint(2, 9), "lead": [3], "bias": False})
        for _ in range(CASES_PER_SIZE):
            n_in = p * rng.randint(1, 8)
            n_out = rng.choice([n for n in range(2, 17) if n != n_in])
            lead = rng.choice([[1], [rng.randint(2, 5)], [rng.randint(1, 3), rng.randint(1, 4)]])
            out.append({"p": p, "in": n_in, "out": n_out, "lead": lead, "bias": rng.random() < 0.7})
    # a group of ranks 1 and 2: a rank within the group is not the process's rank (dist.get_rank() without group)
    n_in = 2 * rng.randint(1, 6)
    out.append({"p": 2, "ranks": [1, 2], "in": n_in, "out": rng.randint(2, 9), "lead": [rng.randint(1, 4)],
                "bias": True})  # fmt: skip
    for i, c in enumerate(out):
        c["seed"] = rng.randint(0, 2**31 - 1) + i
    return out


class _Work:
    """The handle of an ``all_reduce(async_op=True)``, recording whether it was waited on."""

    def __init__(self, work: Any, entry: dict) -> None:
        self._work, self._entry = work, entry

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._entry["waited"] = True
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _note(progress: str | None, line: str) -> None:
    """One line in this rank's progress file (read by the parent when the ranks stop answering: a deadlock)."""
    if progress:
        from course_utils.from_lessons.l17_beyond_one_device import STATE

        with open(f"{progress}/rank{STATE['rank']}", "a") as f:
            f.write(line + "\n")


def warm_up() -> bool:
    """In every rank, before the learner's code is timed: the checker's own first imports (the operator log pulls
    in torch._dynamo and sympy: a minute on a busy machine), an operator log entered once, and the group of ranks
    1 and 2 (``new_group`` is a collective of every rank)."""
    import torch._dynamo  # noqa: F401 - imported here so that it is not imported inside the learner's time

    from course_utils.from_lessons.l17_beyond_one_device import STATE

    with OpLog():
        torch.ones(2) @ torch.ones(2)
    if "check_17_groups" not in STATE:
        STATE["check_17_groups"] = {(1, 2): dist.new_group([1, 2])}
    return True


def run_cases(source: str, name: str, cases_: list[dict], progress: str | None = None) -> list[dict]:
    """In a rank process: run the learner's function (its source) on each case this rank belongs to.

    With ``progress`` (a folder), each rank notes where it is: "i call" before a collective of case i, "i done"
    when the function returned (or raised), so a rank that skipped a collective the others wait in is named."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from course_utils.from_lessons.l17_beyond_one_device import STATE

    namespace: dict[str, Any] = {"torch": torch, "dist": dist, "F": F, "nn": torch.nn}
    exec(compile(source, "<your row_parallel_linear>", "exec"), namespace)  # noqa: S102 - the learner's own code
    fn = namespace[name]
    rank, results = STATE["rank"], []
    original = dist.all_reduce
    if "check_17_groups" not in STATE:  # made once per world, by every rank (new_group is collective)
        STATE["check_17_groups"] = {(1, 2): dist.new_group([1, 2])}
    for i, case in enumerate(cases_):
        if i and _stop_everywhere(results, cases_[i - 1]):  # every rank asks, also after a case it sat out
            break
        p, members = case["p"], case.get("ranks", list(range(case["p"])))
        if rank not in members:
            continue
        group = STATE["check_17_groups"][tuple(members)] if "ranks" in case else STATE["groups"][p]
        mine = members.index(rank)  # the rank within the group
        gen = torch.Generator().manual_seed(case["seed"])  # the same layer and input on every rank
        linear = torch.nn.Linear(case["in"], case["out"], bias=case["bias"])
        with torch.no_grad():
            linear.weight.copy_(torch.randn(linear.weight.shape, generator=gen))
            if linear.bias is not None:
                linear.bias.copy_(3 * torch.randn(linear.bias.shape, generator=gen))  # a bias counted twice shows
        x = torch.randn(*case["lead"], case["in"], generator=gen)
        with torch.no_grad():
            want = linear(x)
            k = case["in"] // p
            xs, ws = x[..., mine * k : (mine + 1) * k], linear.weight[:, mine * k : (mine + 1) * k]
            partial = xs @ ws.T
            bias = linear.bias if linear.bias is not None else torch.zeros(case["out"])
            global_size = _blocks(x, linear.weight, list(range(p)), case["in"] // STATE["world_size"]) + bias
            global_rank = _blocks(x, linear.weight, members, k) + bias
        reduced: list[dict] = []

        def watched(t, op=dist.ReduceOp.SUM, group=None, async_op=False, _g=group, _log=reduced, _i=i):
            _note(progress, f"{_i} call")
            entry = {"shape": tuple(t.shape), "ptr": t.data_ptr(), "op": str(op), "group_ok": group is _g}
            _log.append(entry)
            if group is not _g:
                raise AssertionError(
                    "your all_reduce was not over `group` (the ranks that share this layer): pass group=group; the "
                    "default group holds every process, so the call would wait for ranks outside the layer"
                )
            work = original(t, op=op, group=group, async_op=async_op)
            if not async_op:
                return work
            entry.update(work=work, waited=False)
            return _Work(work, entry)

        dist.all_reduce = watched
        row: dict[str, Any] = {"case": case, "rank": rank}
        try:
            with OpLog() as log:
                got = fn(x.clone(), linear, group)
            row["ops"] = [(op.name, op.in_shapes) for op in log.named(*MATMUL_OPS)]
        except AssertionError as exc:
            row["error"] = str(exc)
            row["kind"] = "group"
        except Exception as exc:  # noqa: BLE001 - the learner's bug, reported with where it happened
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["where"] = traceback.format_exc().strip().splitlines()[-3:]
            row["kind"] = "raised"
        finally:
            _note(progress, f"{i} done")
            dist.all_reduce = original
            for entry in reduced:  # a handle the function did not wait on: finished here, for the next case
                if "work" in entry:
                    work = entry.pop("work")
                    if not entry["waited"]:
                        work.wait()
        row["reduced"] = reduced
        if "error" not in row:
            if not isinstance(got, torch.Tensor):
                row["kind"], row["type"] = "type", type(got).__name__
            elif tuple(got.shape) != tuple(want.shape):
                row["kind"], row["shape"] = "shape", tuple(got.shape)
            else:
                got = got.detach().float()
                row["out_ptr"] = got.data_ptr()
                close = {
                    "right": want,
                    "partial": partial,
                    "partial+bias": partial + bias,
                    "bias on every rank": want + (p - 1) * bias,
                    "average": (want - bias) / p + bias,
                    "sum divided by p": want / p,
                    "wrong dimension": _rows_blocks(x, linear.weight, members, k, case["out"] // p) + bias,
                    "global size": global_size,
                    "global rank": global_rank,
                }
                row["matches"] = [n for n, v in close.items() if torch.allclose(got, v, atol=TOL, rtol=TOL)]
                if {"partial", "partial+bias"} & set(row["matches"]) and "global size" in row["matches"]:
                    # blocks of in // world_size summed can equal this rank's unsummed block (rank 0, in = 4 or 8
                    # on 2 ranks): this row cannot tell the two mistakes apart, another rank can
                    row["matches"].remove("global size")
                    row["ambiguous"] = True
                row["max_err"] = float((got - want).abs().max())
        if "matches" in row:
            widths = _inner_widths(row["ops"])
            row["bad"] = "right" not in row["matches"] or (case["in"] in widths and case["in"] // p not in widths)
        else:
            row["bad"] = True
        row["bad"] = row["bad"] or any(r.get("waited") is False for r in reduced)
        results.append(row)
    return results


def _rows_blocks(x: torch.Tensor, weight: torch.Tensor, index: list[int], width: int, rows: int) -> torch.Tensor:
    """The split along the wrong dimension, where it runs (a square layer): each rank's block of x times its block of
    the weight's ROWS (output features), summed. NaN where the shapes cannot multiply."""
    if width != rows or weight.shape[0] != weight.shape[1]:
        return torch.full(x.shape[:-1] + (weight.shape[0],), float("nan"))
    return sum(x[..., j * width : (j + 1) * width] @ weight[j * rows : (j + 1) * rows] for j in range(len(index)))


def _blocks(x: torch.Tensor, weight: torch.Tensor, index: list[int], width: int) -> torch.Tensor:
    """The sum of the partial products of these blocks of ``width`` input features (an empty block adds zeros)."""
    return sum(x[..., j * width : (j + 1) * width] @ weight[:, j * width : (j + 1) * width].T for j in index)


def _inner_widths(ops: list) -> set[int]:
    """The inner (summed-over) dimension of every matmul logged: how many input features each one read."""
    out = set()
    for name, shapes in ops:
        first = shapes[1] if ("addmm" in name or "baddbmm" in name) and len(shapes) > 1 else shapes[0]
        if first:
            out.add(first[-1])
    return out


def _stop_everywhere(rows: list[dict], case: dict) -> bool:
    """After a case, every rank learns whether any rank saw a mistake (one all-reduce over all ranks): all stop
    at the same case, so no rank waits in a collective the others never enter."""
    import torch.distributed as dist

    mine = rows[-1]["bad"] if rows and rows[-1]["case"] is case else False
    flag = torch.tensor([1.0 if mine else 0.0])
    dist.all_reduce(flag)
    return bool(flag.item())


def _diagnose(row: dict, k_full: int) -> str:
    """The message for one wrong rank output (empty when it was right and split)."""
    c = row["case"]
    members = c.get("ranks", list(range(c["p"])))
    where = (
        f"on {c['p']} ranks {members} (rank {row['rank']}), nn.Linear({c['in']}, {c['out']}, bias={c['bias']}), "
        f"x of shape {(*c['lead'], c['in'])}"
    )
    if row.get("kind") == "group":
        return f"{row['error']} ({where})"
    if row.get("kind") == "raised":
        hint = ""
        if any(w in row["error"] for w in ("shape", "size", "mat1", "mat2", "dimension")):
            hint = (
                " A matmul's shapes did not fit: a row-parallel layer splits the INPUT features, i.e. the columns "
                "`weight[:, start:stop]` of nn.Linear's (out_features, in_features) weight, the same block as "
                "`x[..., start:stop]` (split along the wrong dimension?)."
            )
        elif "NameError" in row["error"]:
            hint = (
                " The ranks are fresh processes: they get your function's source with torch, dist and F only; "
                "define everything it uses inside it."
            )
        return f"your function raised {row['error']} {where}.{hint}"
    if row.get("kind") == "type":
        return f"return the output tensor, got {row['type']} {where}"
    if row.get("kind") == "shape":
        want = (*c["lead"], c["out"])
        return (
            f"the output has shape {row['shape']}, the full layer's is {want} {where}: every rank returns the whole "
            "output (out_features wide); split the input features, not the output ones (wrong dimension?)"
        )
    matches, reduced = row["matches"], row["reduced"]
    if any(r.get("waited") is False for r in reduced):
        return (
            f"dist.all_reduce(..., async_op=True) returned a handle that was never waited on {where}: the sum may "
            "not have arrived when you used the tensor. Call .wait() on the handle before using the result (or "
            "leave async_op out)"
        )
    if "right" in matches:
        mm, widths = row["ops"], _inner_widths(row["ops"])
        if c["p"] > 1 and k_full in widths and c["in"] // c["p"] not in widths:
            return (
                f"the output is right but a matmul read all {k_full} input features on every rank {where}: nothing "
                "was split. Multiply only this rank's block of in_features // world_size features"
            )
        if not mm:
            return f"no matmul ran in your function {where}: compute this rank's partial output with its slices"
        return ""
    sums = [r for r in reduced if r["op"].endswith("SUM") or r["op"] == "ReduceOp.SUM" or "SUM" in r["op"]]
    if reduced and not sums:
        return (
            f"your all_reduce used dist.ReduceOp.{reduced[0]['op'].split('.')[-1]}, the partial outputs must be "
            f"added: dist.ReduceOp.SUM (the default) {where}"
        )
    if reduced and "global size" in matches:
        return (
            f"the blocks are in_features // dist.get_world_size(), and dist.get_world_size() without the group counts "
            f"every process, not the {c['p']} ranks of this layer {where}: pass the group, "
            "dist.get_world_size(group)"
        )
    if reduced and "global rank" in matches:
        return (
            f"the block each rank took follows dist.get_rank() without the group, the process's rank, not its rank "
            f"within the layer's group (the group holds ranks {members}) {where}: use dist.get_rank(group)"
        )
    if "partial" in matches or "partial+bias" in matches:
        if not reduced:
            return (
                f"no all_reduce: each rank returned only its own partial sum {where}. Sum the partial outputs over "
                "the group with dist.all_reduce(y, group=group) (in place)"
            )
        return (
            f"dist.all_reduce ran on another tensor (shape {reduced[0]['shape']}) than the partial output you "
            f"returned, which was never summed {where}: all_reduce works in place on the tensor you pass; pass the "
            "partial output itself (not a copy, not the input), then return it"
        )
    out_shape = (*c["lead"], c["out"])
    if reduced and all(r["shape"] != out_shape for r in reduced):
        return (
            f"dist.all_reduce ran on a tensor of shape {reduced[0]['shape']}, not on the partial output (shape "
            f"{out_shape}) {where}: summing the inputs (or anything else) is not the layer; all_reduce the "
            "partial product x_block @ W_block.T in place, then add the bias once"
        )
    if "bias on every rank" in matches:
        return (
            f"the bias was added on every rank before the sum, so it counts {c['p']} times {where}: add it once, "
            "after the all_reduce (or on one rank only)"
        )
    if "average" in matches or "sum divided by p" in matches:
        if sums:
            return (
                f"the summed output was divided by the number of ranks ({c['p']}) {where}: the partial outputs of a "
                "row-parallel layer add up to the output (each rank multiplied different input features); keep the "
                "sum, do not divide it"
            )
        return f"the partial outputs were averaged, not summed {where}: use dist.ReduceOp.SUM"
    if "wrong dimension" in matches:
        return (
            f"each rank multiplied its block of x by a block of the weight's ROWS (output features) {where}; on a "
            "square layer the shapes fit, the numbers do not. A row-parallel layer splits the input features: the "
            "columns `weight[:, start:stop]`, the same block as `x[..., start:stop]` (wrong dimension)"
        )
    return (
        f"every rank must return linear(x); the largest difference was {row['max_err']:.3g} {where}. Take this "
        "rank's block of x's last dimension and the same block of the weight's columns (`weight[:, start:stop]`), "
        "all_reduce the partial product over the group, add the bias once"
    )


def judge(rows: list[dict]) -> str:
    """'accepted', or the message naming the first mistake seen."""
    messages = [(row.get("ambiguous", False), _diagnose(row, row["case"]["in"]))
                for row in sorted(rows, key=lambda r: (r["case"]["p"], r["rank"]))]  # fmt: skip
    wrong = [m for m in messages if m[1]]
    return min(wrong, key=lambda m: m[0])[1] if wrong else "accepted"  # a row that tells the mistake apart first


def source_of(fn: Callable[..., Any]) -> tuple[str, str]:
    """The function's source (dedented) and name; the ranks receive the source, not the function object."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise AssertionError(
            f"the checker needs your function's source (the ranks are fresh processes): {exc}; write it with def"
        ) from None
    tree = ast.parse(source)
    if not tree.body or not isinstance(tree.body[0], ast.FunctionDef):
        raise AssertionError("write row_parallel_linear with def (a lambda's source cannot be sent to the ranks)")
    source = "\n".join(source.splitlines()[tree.body[0].lineno - 1 :])  # from the def line: no decorators
    first = tree.body[0].body[0]
    if isinstance(first, ast.Raise) and "NotImplementedError" in ast.unparse(first):
        fn(None, None, None)  # the exercise's placeholder: raised here, in the learner's own frame
    return source, tree.body[0].name


def check_in_world(world: Any, fn: Callable[..., Any], seed: int) -> str:
    """One checker call's cases (from ``seed``) on a running 3-rank world: 'accepted' or the mistake."""
    import random
    import tempfile

    from course_utils.from_lessons.l17_beyond_one_device import RankError

    source, name = source_of(fn)
    cases_ = _case_list(random.Random(seed))
    with tempfile.TemporaryDirectory(prefix="check17_") as progress:
        try:
            rows_per_rank = world.run(run_cases, source=source, name=name, cases_=cases_, progress=progress)
        except RankError as exc:
            silent = "no answer from ranks" in str(exc)
            stuck = _deadlock(progress, cases_, world.size) if silent else ""
            reached = _reached(progress, world.size) if silent else ""
            world.close(graceful=False)  # ranks stuck in a collective: stopped now, none left behind
            if stuck:
                return stuck
            if silent:
                import os

                load = f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
                return (
                    f"the ranks did not finish your function's {len(cases_)} cases in {world.timeout_s:.0f} s "
                    f"({reached}), and no rank was found waiting in a collective that another skipped. On a busy "
                    f"machine ({load}) this says nothing about your code: run the cell again when it is "
                    "quieter; if it repeats, look for a loop or a wait that never ends. The ranks were stopped"
                )
            return f"the rank processes failed while running your function: {str(exc).splitlines()[-1][:300]}"
    return judge([r for rows in rows_per_rank for r in rows])


def _reached(progress: str, size: int) -> str:
    """Where each rank was when they stopped answering (from their progress files)."""
    from pathlib import Path

    where = []
    for r in range(size):
        f = Path(progress) / f"rank{r}"
        lines = f.read_text().splitlines() if f.exists() else []
        where.append(f"rank {r}: " + (f"case {lines[-1].split()[0]}" if lines else "not started"))
    return ", ".join(where)


def _deadlock(progress: str, cases_: list[dict], size: int) -> str:
    """From the ranks' progress files: which ranks wait in a collective that a rank of their group never called."""
    from pathlib import Path

    notes = {}
    for r in range(size):
        f = Path(progress) / f"rank{r}"
        notes[r] = [tuple(line.split()) for line in f.read_text().splitlines()] if f.exists() else []
    for i, case in enumerate(cases_):
        members = case.get("ranks", list(range(case["p"])))
        waiting = [r for r in members if notes[r] and notes[r][-1] == (str(i), "call")]
        skipped = [r for r in members if (str(i), "done") in notes[r] and (str(i), "call") not in notes[r]]
        if waiting and skipped:
            c = case
            return (
                f"ranks {waiting} waited in dist.all_reduce while rank(s) {skipped} returned from your function "
                f"without calling it (on {c['p']} ranks {members}, nn.Linear({c['in']}, {c['out']}, "
                f"bias={c['bias']})): a collective waits until EVERY rank of the group calls it, so all of them must "
                "call the same collectives in the same order (no `if rank == 0:` around it, no early return on some "
                "ranks). The ranks were stopped"
            )
    return ""


def _check(fn: Callable[..., Any], seed: int | None = None) -> None:
    from course_utils.from_lessons.l17_beyond_one_device import World

    source_of(fn)  # the placeholder and lambdas are answered before any process starts
    with cases("17.row-parallel") as c:
        seed = c.seed if seed is None else seed
        world = World(3, timeout_s=START_S)
        try:
            with untimed():  # three processes importing torch and joining a group: the checker's time, not yours
                world.__enter__()
                world.run(warm_up)  # the checker's own imports in the ranks, also not yours
            world.timeout_s = TASK_S  # the learner's function: every rank answers within this, or it is stuck
            verdict = check_in_world(world, fn, seed)
        finally:
            with untimed():
                world.close(graceful=False)
        assert verdict == "accepted", f"{verdict} [random case seed {seed}]"
    print(
        "✓ observed: on 2 and 3 gloo ranks and on a group of ranks 1 and 2, random layers (square, no bias, 3-D "
        "input, one-feature shards): every rank's output equals the full nn.Linear within 1e-4, no matmul read all "
        "input features, and every all_reduce was over the group and finished before the output was returned."
    )


@exercise(
    "17.row-parallel",
    "rank, p = dist.get_rank(group), dist.get_world_size(group); k = linear.in_features // p; y = x[..., rank*k:"
    "(rank+1)*k] @ linear.weight[:, rank*k:(rank+1)*k].T; dist.all_reduce(y, group=group); add the bias once.",
    _check,
    time_limit=120,
)
def row_parallel_linear(x: torch.Tensor, linear: torch.nn.Linear, group: Any) -> torch.Tensor:
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    k = linear.in_features // size
    block = slice(rank * k, (rank + 1) * k)  # this rank's input features
    y = F.linear(x[..., block], linear.weight[:, block])  # a partial sum of the full output
    dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)  # every rank now holds the whole sum
    return y if linear.bias is None else y + linear.bias  # the bias once, after the sum
