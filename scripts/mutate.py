"""Plant bugs in the lab bench one at a time and check that the tests catch each (a small mutation test).

Each :class:`Mutation` names a file of ``course_utils``, exact snippets of its source with their replacements,
what the planted bug means, and the fast tests that must fail because of it. The script copies ``course_utils/``
and ``tests/`` into a temporary folder (the rest of the repository is linked, read-only by convention), plants one
mutation at a time there, runs ``pytest -x -q -p no:cacheprovider`` on the mutation's tests with that copy first
on ``PYTHONPATH``, restores the file in a ``finally`` and reports caught/total and the survivors. The working tree
is never modified. First the tests of every mutation run on the unmutated copy: a test that already fails there
would make every mutation look caught, so it is deselected from the mutation runs (and named); a mutation left
with no test that passes unmutated is reported as not judged.

    python -m scripts.mutate                 # every mutation (several minutes: nice it)
    python -m scripts.mutate --only fp32-tolerance-100x sweep-ms-not-checked
    python -m scripts.mutate --list          # the mutations, one a line
    python -m scripts.mutate --check         # only check that every snippet is still in the sources

Exit status: 0 when the share caught reaches ``--target`` (default 0.8), 1 when it does not, 2 when a snippet
is stale (the other mutations still run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("course_utils", "fakegpu", "course_checks", "lessons", "tests")  # the three packages, the lessons, tests
NOT_LINKED = {".git", ".venv", "build", "results", "workspace", ".pytest_cache", ".ruff_cache", "__pycache__"}


@dataclass(frozen=True)
class Mutation:
    """One planted bug: in ``file``, each ``old`` snippet (present exactly once) becomes its ``new``."""

    id: str
    file: str
    edits: tuple[tuple[str, str], ...]
    tests: tuple[str, ...]
    what: str
    source: str = "own"  # "issue 22": a bug the issue lists; "own": one of this script's

    def apply(self, text: str) -> str:
        for old, new in self.edits:
            if text.count(old) != 1:
                raise StaleSnippet(f"{self.id}: snippet found {text.count(old)} times in {self.file}: {old[:60]!r}")
            text = text.replace(old, new)
        return text


class StaleSnippet(Exception):
    """A mutation's snippet is no longer in its file (exactly once): update the mutation list."""


def M(id: str, file: str, old: str, new: str, tests: str | tuple[str, ...], what: str, source: str = "own",
      more: tuple[tuple[str, str], ...] = ()) -> Mutation:  # fmt: skip
    tests = (tests,) if isinstance(tests, str) else tests
    path = file if file.split("/")[0] in ("fakegpu", "course_checks", "lessons") else f"course_utils/{file}"
    return Mutation(id, path, ((old, new), *more), tuple(f"tests/{t}" for t in tests), what, source)


ISSUE = "issue 22"
ISSUE32 = "issue 32"
ISSUE32_R2 = "issue 32 round 2"
ISSUE32_R3 = "issue 32 round 3"
ISSUE32_R4 = "issue 32 round 4"
ISSUE43 = "issue 43"  # the survivors of issue 43's held-out planted bugs
ISSUE43_R5 = "issue 43 round 5"  # modules no earlier round targeted: lessons 03-14's new checks, the stream guard
ISSUE44 = "issue 44"  # lesson 17's two-node torchrun launch: its loopback check and its clean-up
T_TIMING = ("test_timing.py",)
T_COMPARE = ("test_compare.py",)
T_RESULTS = ("test_results.py",)
T_LOAD = tuple(  # the load generator's and the guard's pinned tests, not the server starts (slow)
    f"test_serving.py::{t}"
    for t in (
        "test_load_result_percentiles_of_a_known_list",
        "test_open_loop_latency_counts_from_the_due_time",
        "test_open_loop_refuses_beyond_max_in_flight",
        "test_closed_loop_counts_every_answer",
        "test_streamed_line_times_count_from_the_due_time",
        "test_body_limit_is_on_the_total_over_many_small_chunks",
        "test_declared_length_is_refused_before_reading_only_above_the_limit",
        "test_nesting_limit_exact_boundary",
        "test_integer_digits_exact_boundary",
    )
)
T_PATHS = ("test_results.py", "test_paths.py")
T_ENGINES = ("test_tensorrt_engines.py",)
T_L01_TIMER = (
    "test_exercises_l01.py::test_timer_checker_names_each_mistake",
    "test_exercises_l01.py::test_timer_checker_accepts_the_correct_timer",
)
T_EX = (  # the machinery's tests, not every reference solution (slow)
    *(
        f"test_exercises.py::{t}"
        for t in (
            "test_check_prints_exactly_one_verdict",
            "test_a_not_implemented_error_from_inside_torch_is_shown_not_hidden",
            "test_other_errors_of_the_learner_are_one_line_with_the_place",
            "test_a_hung_answer_is_stopped_by_the_time_limit",
            "test_a_huge_message_is_cut",
            "test_random_cases_change_per_call_and_print_their_seed",
        )
    ),
    *T_L01_TIMER,
)
T_L01 = ("test_exercises_l01.py",)
T_L03 = ("test_exercises_l03.py",)  # the batch sweep lives in lesson 03; its checker guards it
T_MEMORY = ("test_memory.py",)
T_STREAMS = ("test_streamcheck.py",)
T_REHEARSAL = ("test_rehearsal.py", "test_rehearsal_async.py")  # the stand-ins' rules (about 25 s)
T_SECTIONS = ("test_modes.py", "test_rehearsal.py")  # the section record's life cycle
T_L16 = tuple(
    f"test_llm_serving.py::{t}"
    for t in (
        "test_idle_cached_blocks_are_evicted_tail_first",
        "test_admission_waits_for_free_blocks",
        "test_running_requests_go_in_order_so_decodes_come_before_prompt_chunks",
        "test_no_more_running_requests_than_slots",
    )
)  # not the server
T_L12 = tuple(
    f"test_exercises_l12.py::{t}"
    for t in (
        "test_reference_passes",
        "test_rejects_forgotten_batchnorm",
        "test_rejects_wrong_linear_columns",
        "test_rejects_stale_bn_statistics",
        "test_rejects_a_forgotten_conv_bias",
    )
)

# fmt: off
MUTATIONS: list[Mutation] = [
    # ---------------------------------------------------------------------------------- the bugs issue 22 lists
    M("timing-no-end-sync", "measuring/timing.py", "            end.synchronize()\n", "", T_TIMING,
      "timing.measure: the CUDA end event's synchronize() dropped", ISSUE),
    M("sweep-ms-not-checked", "course_checks/lesson_exercises/l03.py", '        assert r.get("ms") == want, (',
      '        assert True or r.get("ms") == want, (', T_L03,
      "03.oom-sweep: a row's time no longer checked against what measure() returned (issue 22's ms_per_item bug, "
      "now that the sweep is the lesson's)", ISSUE),
    M("fp32-tolerance-100x", "measuring/outputs.py", '"fp32": {"max_rel": 1e-4,', '"fp32": {"max_rel": 1e-2,', T_COMPARE,
      "compare: the FP32 tolerance loosened 100x", ISSUE),
    M("record-p90-from-p10", "show/results.py", "            p90_ms=measurement.p90_ms,\n",
      "            p90_ms=measurement.p10_ms,\n", T_RESULTS, "results.record: p90 filled from p10", ISSUE),
    M("load-p90-is-p95", "serve/load_generator.py", "        return self.percentile(90)", "        return self.percentile(95)",
      T_LOAD, "load: p90 computed as p95", ISSUE),
    M("load-p90-is-p75", "serve/load_generator.py", "        return self.percentile(90)", "        return self.percentile(75)",
      T_LOAD, "load: p90 computed as p75", ISSUE),
    M("append-no-lock", "supply/paths.py", "            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)\n", "            pass\n",
      T_PATHS, "paths.append_text: file lock removed", ISSUE),
    M("guard-body-per-chunk", "serve/server_guard.py", "            total += len(chunk)\n",
      "            total = len(chunk)\n", T_LOAD, "server_guard: body size limited per chunk, not in total", ISSUE),
    M("json-depth-off-by-one", "serve/server_guard.py", "        if depth > max_depth:",
      "        if depth > max_depth + 1:", T_LOAD, "server_guard: JSON nesting limit off by one (one level more)",
      ISSUE),
    M("json-depth-off-by-one-strict", "serve/server_guard.py", "        if depth > max_depth:",
      "        if depth >= max_depth:", T_LOAD, "server_guard: JSON nesting limit off by one (the limit refused)",
      ISSUE),
    M("check-x-then-tick", "course_checks/exercises.py", "    else:\n        seeds = f\" (random cases of seed",
      "    finally:\n        seeds = f\" (random cases of seed", T_EX, "exercises.check: prints ✗ and then ✓",
      ISSUE),
    M("l01-checker-assert-deleted", "course_checks/lesson_exercises/l01.py", '    assert cold.calls >= 15, f"fn was called',
      '    assert True or cold.calls >= 15, f"fn was called', T_L01,
      "lesson_exercises/l01: the warm-up call-count assertion deleted", ISSUE),
    M("staleness-ignores-build", "techniques/tensorrt_engines.py", '"onnx_sha256", "build")', '"onnx_sha256")', T_ENGINES,
      "engines.engine_staleness ignores the build settings", ISSUE),
    M("open-loop-from-send", "serve/load_generator.py", "        async def one(i: int) -> None:\n            nonlocal in_flight\n",
      "        async def one(i: int) -> None:\n            nonlocal in_flight\n"
      "            sent = time.perf_counter()\n",
      T_LOAD, "load.open_loop: latency timed from the send instead of the due time", ISSUE,
      more=(("lat.append((time.perf_counter() - start - due[i]) * 1000)",
             "lat.append((time.perf_counter() - sent) * 1000)"),)),
    M("rel-error-no-abs", "measuring/outputs.py", "    scale = float(r.abs().max()) or 1.0",
      "    scale = float(r.max()) or 1.0", T_COMPARE, "compare: relative error scaled without abs", ISSUE),
    M("rel-error-no-abs-diff", "measuring/outputs.py", "    diff = (o - r).abs()", "    diff = o - r", T_COMPARE,
      "compare: the difference taken without abs", ISSUE),
    M("sweep-no-inference-mode", "course_checks/lesson_exercises/l03.py",
      "    off = sorted({b for b, inference in model.calls if not inference})", "    off = []", T_L03,
      "03.oom-sweep: a sweep run without inference_mode accepted", ISSUE),
    # ---------------------------------------------------------------------------------- timing
    M("timing-no-warmup", "measuring/timing.py", "    for _ in range(warmup):\n        fn()",
      "    for _ in range(0):\n        fn()", T_TIMING, "measure: the warm-up calls skipped"),
    M("timing-cpu-no-sync", "measuring/timing.py", "            synchronize(dev)\n            times.append(",
      "            times.append(", T_TIMING, "measure: no synchronize after each call on the CPU branch"),
    M("timing-median-is-mean", "measuring/timing.py", "return float(np.median(self.times_ms))",
      "return float(np.mean(self.times_ms))", T_TIMING, "Measurement.median_ms is the mean"),
    M("timing-p90-is-p95", "measuring/timing.py", "return float(np.percentile(self.times_ms, 90))",
      "return float(np.percentile(self.times_ms, 95))", T_TIMING, "Measurement.p90_ms is the 95th percentile"),
    M("timing-seconds", "measuring/timing.py", "            times.append((time.perf_counter() - t0) * 1000.0)",
      "            times.append((time.perf_counter() - t0) * 100.0)", T_TIMING, "measure: wrong unit (not ms)"),
    M("timing-one-extra-repeat", "measuring/timing.py",
      "            if len(times) >= min_repeats and time.perf_counter() - start_all >= min_time_s:\n"
      "                break\n    else:",
      "            if len(times) > min_repeats and time.perf_counter() - start_all >= min_time_s:\n"
      "                break\n    else:", T_TIMING, "measure (CUDA): one call more than min_repeats"),
    M("timing-throughput-at-mean", "measuring/timing.py", "return self.batch_size / (self.median_ms / 1000.0)",
      "return self.batch_size / (self.mean_ms / 1000.0)", T_TIMING, "Measurement.throughput at the mean time"),
    # ---------------------------------------------------------------------------------- compare
    M("cosine-bound-loosened", "measuring/outputs.py", '    if cosine < tol["cosine"]:',
      '    if cosine < tol["cosine"] - 0.01:', T_COMPARE, "compare: the cosine bound loosened by 0.01"),
    M("top1-not-checked", "measuring/outputs.py", '    if top1 is not None and top1 < tol["top1"]:',
      '    if False and top1 is not None and top1 < tol["top1"]:', T_COMPARE,
      "compare: top-1 agreement not judged"),
    M("int8-cosine-loosened", "measuring/outputs.py", '"int8": {"max_rel": 1.5e-1, "cosine": 0.99,',
      '"int8": {"max_rel": 1.5e-1, "cosine": 0.98,', T_COMPARE, "compare: the INT8 cosine bound loosened"),
    # ---------------------------------------------------------------------------------- results
    M("record-throughput-from-median", "show/results.py", "            throughput=measurement.throughput,\n",
      "            throughput=measurement.median_ms,\n", T_RESULTS,
      "record: throughput column filled from the median"),
    M("record-measurement-wins", "show/results.py", 'p90_ms=p90_ms if p90_ms is not None else row["p90_ms"],',
      'p90_ms=row["p90_ms"] if row["p90_ms"] is not None else p90_ms,', T_RESULTS,
      "record: the measurement overrides an explicit p90"),
    # ---------------------------------------------------------------------------------- load
    M("load-throughput-counts-failures", "serve/load_generator.py", "return self.n_ok / self.wall_s if",
      "return (self.n_ok + self.n_failed) / self.wall_s if", T_LOAD,
      "LoadResult.throughput counts failed answers"),
    M("load-in-flight-off-by-one", "serve/load_generator.py", "            if in_flight >= max_in_flight:",
      "            if in_flight > max_in_flight:", T_LOAD, "open_loop: one request more in flight than allowed"),
    M("load-p99-is-p95", "serve/load_generator.py", "        return self.percentile(99)", "        return self.percentile(95)",
      T_LOAD, "load: p99 computed as p95"),
    # ---------------------------------------------------------------------------------- server_guard
    M("guard-size-limit-inclusive", "serve/server_guard.py", "            if total > self.max_bytes:",
      "            if total >= self.max_bytes:", T_LOAD, "server_guard: a body of exactly max_bytes refused"),
    M("guard-int-digits-off-by-one", "serve/server_guard.py", 'if len(s.lstrip("-")) > max_int_digits:',
      'if len(s.lstrip("-")) > max_int_digits + 1:', T_LOAD,
      "server_guard: integers one digit longer than the limit allowed"),
    M("guard-declared-length-inclusive", "serve/server_guard.py", "if length.isdigit() and int(length) > self.max_bytes:",
      "if length.isdigit() and int(length) >= self.max_bytes:", T_LOAD,
      "server_guard: a declared length of exactly max_bytes refused"),
    # ---------------------------------------------------------------------------------- paths
    M("append-torn-line-kept", "supply/paths.py", 'keep, before = size, ("\\n" if size > 0 and', 'keep, before = size, ("" if size > 0 and',
      T_PATHS, "append_text: a torn last line is not ended before the next one"),
    M("append-header-always", "supply/paths.py", "(text(keep == 0) if callable(text) else text)",
      "(text(True) if callable(text) else text)", T_PATHS, "append_text: the header written on every append"),
    M("torn-tail-not-cut", "show/results_file.py", "    return end, \"\"\n", "    return len(data), \"\"\n", T_RESULTS,
      "results_file.complete_part: a torn tail is kept, so the next row lands inside it", source="issue 31"),
    M("reader-no-resync", "show/results_file.py", "                at = start + 1\n", "                pass\n",
      ("test_results.py",), "results_file.parse_rows: no re-synchronising after a torn row", source="issue 31"),
    M("llm-cache-deletes-foreign", "supply/llm.py", "    if MANIFEST not in names:\n        return names\n",
      "    if MANIFEST not in names:\n        return []\n", ("test_llm.py",),
      "llm: a folder without the manifest counts as the cache's own (and is rebuilt over)", source="issue 31"),
    # ---------------------------------------------------------------------------------- engines
    M("staleness-skips-profile", "techniques/tensorrt_engines.py", "        if stored.get(f) != expected.get(f):",
      '        if f != "profile" and stored.get(f) != expected.get(f):', T_ENGINES,
      "engine_staleness ignores the optimization profile"),
    M("build-default-tf32-off", "techniques/tensorrt_engines.py", '    "tf32": True,\n', '    "tf32": False,\n', T_ENGINES,
      "BUILD_DEFAULTS: the TF32 default wrong, so a default build gets another key"),
    M("profile-order-unchecked", "techniques/tensorrt_engines.py", "            if not (0 < a <= b <= c):",
      "            if not (0 < a and b <= c):", T_ENGINES, "Profile: min > opt accepted"),
    # ---------------------------------------------------------------------------------- code moved in the restructure
    M("install-id-ignores-machine", "show/machine_label.py", "if len(fields) == 2 and fields[1] == mine:",
      "if len(fields) == 2:", (
          "test_results.py::test_cloned_vms_with_the_same_install_id_file_get_distinct_labels",
          "test_results.py::test_install_id_is_renewed_when_the_machine_changes_and_kept_otherwise",
      ), "install_id: a cloned VM keeps its image's id"),
    M("dead-worker-unnoticed", "serve/server_watch.py", "gone = [pid for pid in pids if not pid_alive(pid)]",
      "gone = []", ("test_serving.py::test_a_dead_model_worker_fails_requests_fast_naming_the_log",),
      "WorkerWatch: a dead model worker is never noticed (requests wait for the client timeout)"),
    M("exported-runner-no-wait", "from_lessons/l08_tensorrt.py",
      "        self.stream.wait_stream(dev.current_stream())", "        pass", ("gpu_contract/test_l08_tensorrt.py",),
      "lesson 08's exported runner (optimize()'s) no longer waits for the input's stream"),
    # ---------------------------------------------------------------------------------- exercises
    M("check-placeholder-always", "course_checks/exercises.py", "    return not library and (last.line or",
      "    return True or (last.line or", T_EX,
      "check: every NotImplementedError taken for the learner's placeholder"),
    M("verdict-timeout-propagates", "course_checks/exercises.py",
      "    except (AssertionError, ExerciseTimeout) as exc:\n        return",
      "    except AssertionError as exc:\n        return", T_EX, "verdict: a timed-out answer is not a rejection"),
    M("l01-count-assert-deleted", "course_checks/lesson_exercises/l01.py", "    assert len(times) == repeats, f",
      "    assert True or len(times) == repeats, f", T_L01,
      "lesson_exercises/l01: the repeat-count assertion deleted"),
    M("l01-max-assert-deleted", "course_checks/lesson_exercises/l01.py", '    assert abs(float(out["max_ms"]) - srt[-1]) <= 1e-9',
      '    assert True or abs(float(out["max_ms"]) - srt[-1]) <= 1e-9', T_L01,
      "lesson_exercises/l01: max_ms no longer checked against the times"),
    M("l01-fast-calls-assert-deleted", "course_checks/lesson_exercises/l01.py", "    assert np.median(fast) < SLOW_MS / 3, (",
      "    assert True or np.median(fast) < SLOW_MS / 3, (", T_L01,
      "lesson_exercises/l01: the ordinary calls' times no longer checked"),
    # ---------------------------------------------------------------------------------- sweep (lesson 03)
    M("sweep-oom-not-stopping", "course_checks/lesson_exercises/l03.py",
      "    later = sorted({b for b, _ in model.calls if limit is not None and b > limit})", "    later = []", T_L03,
      "03.oom-sweep: a sweep that goes on past the out-of-memory accepted"),
    # ---------------------------------------------------------------------------------- memory
    M("memory-default-no-grad", "measuring/memory.py", '    mode: str = "inference_mode",\n) -> pd.DataFrame:',
      '    mode: str = "no_grad",\n) -> pd.DataFrame:', T_MEMORY, "peak_vs_batch: default mode no_grad"),
    M("memory-peak-not-extra", "measuring/memory.py", "return max(0.0, peak_rss_mb() - before), out",
      "return max(0.0, peak_rss_mb()), out", T_MEMORY, "cpu_peak_mb: the whole process, not the call's extra"),
    M("memory-input-size", "measuring/memory.py", '"input_mb": x.nelement() * x.element_size() / 2**20',
      '"input_mb": x.nelement() / 2**20', T_MEMORY, "peak_vs_batch: input size in elements, not bytes"),
    M("memory-no-grad-enables", "measuring/memory.py", '    if mode == "no_grad":\n        return torch.no_grad()',
      '    if mode == "no_grad":\n        return torch.enable_grad()', T_MEMORY,
      "grad_context('no_grad') leaves autograd on"),
    # ---------------------------------------------------------------------------------- streamcheck
    # (the snippets start at "join(": they hold whether the helper is called _join or join; {} joins nothing)
    M("streams-wait-event-ignored", "fakegpu/streamcheck.py", "join(self.clock, event.clock)", "join(self.clock, {})",
      T_STREAMS, "streamcheck: wait_event does not order the waiting stream"),
    M("streams-read-read-race", "fakegpu/ordering.py",
      "    return (a.write or b.write) and a.stream is not b.stream and not ordered(a, b)",
      "    return (a.write and b.write) and a.stream is not b.stream and not ordered(a, b)",
      (*T_STREAMS, "test_rehearsal.py::test_stream_order_missing_wait"),
      "conflict: only write-write pairs counted as races (both models)"),
    M("streams-sync-ignored", "fakegpu/streamcheck.py",
      "join(self.dev.host, self.clock)\n\n    def query(self) -> bool:\n        return True\n\n\nclass FakeEvent",
      "join(self.dev.host, {})\n\n    def query(self) -> bool:\n        return True\n\n\nclass FakeEvent", T_STREAMS,
      "streamcheck: Stream.synchronize orders nothing"),
    M("streams-event-sync-ignored", "fakegpu/streamcheck.py",
      "join(self.dev.host, self.clock)\n\n    def query(self) -> bool:\n        return True\n\n    def elapsed_time",
      "join(self.dev.host, {})\n\n    def query(self) -> bool:\n        return True\n\n    def elapsed_time",
      T_STREAMS, "streamcheck: Event.synchronize orders nothing"),
    M("streams-wait-stream-ignored", "fakegpu/streamcheck.py", "join(self.clock, other.clock)", "join(self.clock, {})",
      T_STREAMS, "streamcheck: wait_stream does not order the waiting stream"),
    # ---------------------------------------------------------------------------------- issue 32: device facts
    M("device-vnni-needs-both", "measuring/device.py", '"avx512_vnni" in flags or "avx_vnni" in flags',
      '"avx512_vnni" in flags and "avx_vnni" in flags', "test_device.py", "capabilities: VNNI only when both flags",
      ISSUE32),
    M("device-bf16-from-amx-tile", "measuring/device.py", '"cpu_bf16": bool({"avx512_bf16", "amx_bf16"} & flags)',
      '"cpu_bf16": bool({"avx512_bf16", "amx_tile"} & flags)', "test_device.py",
      "capabilities: BF16 read from the AMX tile flag, not amx_bf16", ISSUE32),
    M("device-cache-kb-not-kib", "measuring/device.py", '{"K": 2**10, "M": 2**20, "G": 2**30}',
      '{"K": 10**3, "M": 10**6, "G": 10**9}', "test_roofs.py", "last_level_cache_bytes: KB/MB, not KiB/MiB",
      ISSUE32),
    M("device-cache-smallest", "measuring/device.py", "    return max(sizes) if sizes else None",
      "    return min(sizes) if sizes else None", "test_roofs.py",
      "last_level_cache_bytes: the smallest cache level (L1), not the last", ISSUE32),
    M("device-bandwidth-no-cap", "measuring/device.py", "return int(min(max(multiple * cache, 64 * 2**20), 512 * 2**20))",
      "return int(max(multiple * cache, 64 * 2**20))", "test_roofs.py",
      "bandwidth_buffer_bytes: the 512 MiB upper bound dropped", ISSUE32),
    # ---------------------------------------------------------------------------------- issue 32: intervals
    M("ratio-met-from-estimate", "measuring/intervals.py", "        if self.low >= target:\n",
      "        if self.estimate >= target:\n", "test_comparing.py",
      "Ratio.judge: 'met' from the estimate, not the interval's low end", ISSUE32),
    M("ratio-resolution-dropped", "measuring/intervals.py", "        if self.low > 1.0 + RESOLUTION:",
      "        if self.low > 1.0:", "test_comparing.py", "Ratio.verdict: a 1.001x low end claimed as faster",
      ISSUE32),
    M("ratio-small-n-confidence", "measuring/intervals.py", "1.0 - 2.0 * 0.5**n", "1.0 - 0.5**n",
      "test_comparing.py", "median_interval: the whole range's confidence one-sided (97% at 5 rounds)", ISSUE32),
    M("ratio-within-missed-needs-both", "measuring/intervals.py", "        if self.high < low or self.low > high:",
      "        if self.high < low and self.low > high:", "test_comparing.py",
      "Ratio.judge_within: an interval wholly outside the band is 'not shown', never 'missed'", ISSUE32),
    # ---------------------------------------------------------------------------------- issue 32: compare
    M("compare-vs-inverted", "measuring/comparing.py",
      "per = theirs / np.maximum(mine, 1e-12) if lower_better else mine / np.maximum(theirs, 1e-12)",
      "per = mine / np.maximum(theirs, 1e-12) if lower_better else theirs / np.maximum(mine, 1e-12)",
      "test_comparing.py", "Comparison.ratio(name, vs=...): the ratio upside down", ISSUE32),
    M("compare-shared-drift-one-sided", "measuring/comparing.py", "    if abs(drift) <= half_width:",
      "    if drift <= half_width:", "test_comparing.py",
      "compare_runs: shared work that got faster under the variant not flagged", ISSUE32),
    M("compare-items-multiplied", "measuring/comparing.py", "/ per_item[n] for b in blocks[n]]",
      "* per_item[n] for b in blocks[n]]", "test_comparing.py", "compare(items=...): times per item multiplied",
      ISSUE32),
    # ---------------------------------------------------------------------------------- issue 32: plots, board
    M("plots-pareto-unsorted", "show/plots.py", "    front = df.sort_values(x)\n", "    front = df\n",
      "test_plots.py", "pareto: the front computed in the frame's row order, not by latency", ISSUE32),
    M("plots-whisker-from-zero", "show/plots.py", "xerr=[[v - r.low], [r.high - v]]", "xerr=[[r.low], [r.high]]",
      "test_comparing.py", "speedup_bars: the whisker drawn from the interval's bounds as lengths", ISSUE32),
    M("plots-hist-to-max", "show/plots.py", "np.percentile(all_vals, 99.5)", "all_vals.max()", "test_plots.py",
      "latency_distribution: the bins stretched to the largest outlier", ISSUE32),
    M("board-oldest-row-wins", "show/leaderboard.py", ".groupby(keys, dropna=False, as_index=False).tail(1)",
      ".groupby(keys, dropna=False, as_index=False).head(1)", "test_leaderboard.py",
      "leaderboard: the oldest row of a machine wins, not the newest", ISSUE32),
    M("board-negative-kept", "show/leaderboard.py", "                bad |= df[col] < 0",
      "                pass", "test_leaderboard.py::test_a_negative_change_against_the_baseline_is_kept_a_negative_time_is_not",
      "leaderboard: a negative value kept on the board", ISSUE32),
    # ---------------------------------------------------------------------------------- issue 32: data
    M("digits-scaled-by-15", "supply/data.py", "bunch.images / 16.0", "bunch.images / 15.0", "test_data_models.py",
      "load_digits_split: pixels scaled past 1.0", ISSUE32),
    M("checksum-case-sensitive", "supply/data.py", '= parts[0].lower()', "= parts[0]", "test_data_models.py",
      "recorded_checksums: an upper-case digest never matches", ISSUE32),
    M("checksum-star-kept", "supply/data.py", 'out[parts[1].lstrip("*").strip()]', "out[parts[1].strip()]",
      "test_data_models.py", "recorded_checksums: sha256sum's binary marker '*' kept in the name", ISSUE32),
    # ---------------------------------------------------------------------------------- issue 32: quantization
    M("quant-worst-from-best", "techniques/quantization.py", '.sort_values("cosine").head(n)',
      '.sort_values("cosine").tail(n)', "test_quant.py",
      "Sensitivity.worst: the least sensitive layers, not the most", ISSUE32),
    M("quant-greedy-least-first", "techniques/quantization.py",
      '    order = list(sensitivity.table.sort_values("cosine")["layer"])',
      '    order = list(sensitivity.table.sort_values("cosine", ascending=False)["layer"])', "test_quant.py",
      "greedy_keep_fp32: keeps the least sensitive layer first", ISSUE32),
    M("quant-knn-self-included", "techniques/quantization.py", '        sim.fill_diagonal_(-float("inf"))\n', "",
      "test_quant.py", "neighbour_agreement: each row its own nearest neighbour", ISSUE32),
    M("quant-flag-sign", "techniques/quantization.py", "    drop = (baseline - acc) * 100",
      "    drop = (acc - baseline) * 100", "test_quant.py", "accuracy_flag: the drop's sign flipped", ISSUE32),
    M("quant-per-channel-scales-4-bytes", "techniques/quantization.py", "t.q_per_channel_scales().numel() * 8",
      "t.q_per_channel_scales().numel() * 4", "test_quant.py",
      "tensor_bytes: per-channel scales counted as float32 (they are float64)", ISSUE32),
    # ---------------------------------------------------------------------------------- issue 32: pipeline
    M("timeline-bar-width-is-end", "techniques/pipeline.py", 'zip(g["start"], g["end"] - g["start"], strict=True)',
      'zip(g["start"], g["end"], strict=True)', "test_pipeline.py",
      "Timeline.plot: a bar's width is its end time, not its duration", ISSUE32),
    M("timeline-overlap-min-start", "techniques/pipeline.py", '- max(x["start"], y["start"]))',
      '- min(x["start"], y["start"]))', "test_pipeline.py", "Timeline.busy_overlap_s: from the earlier start",
      ISSUE32),
    M("jpeg-label-not-wrapped", "from_lessons/l09_data_pipeline.py", "        label = i % len(self.paths)",
      "        label = i", "test_pipeline.py",
      "lesson 09's PhotoDataset: the label is the index, not the photo it repeats", ISSUE32),
    M("overlap-bound-n-not-n-1", "techniques/pipeline.py", "prep_s + (n - 1) * max(prep_s, compute_s) + compute_s",
      "prep_s + n * max(prep_s, compute_s) + compute_s", "test_pipeline.py",
      "overlap_bound: one item too many at the slow stage's pace", ISSUE32),
    # ---------------------------------------------------------------------------------- issue 32: batching
    M("batch-sim-p99-is-p95", "techniques/batching_sim.py", "np.percentile(self.latencies_ms, 99)",
      "np.percentile(self.latencies_ms, 95)", "test_batching.py", "SimResult.p99_ms is the 95th percentile",
      ISSUE32),
    M("batch-sim-span-from-zero", "techniques/batching_sim.py", "span_ms=float(done[-1] - arr[0])",
      "span_ms=float(done[-1])", "test_batching.py", "simulate: throughput over time since 0, not the first arrival",
      ISSUE32),
    M("batch-capacity-one-item", "techniques/batching_sim.py",
      "    return max_batch_size * 1000.0 / service_ms(max_batch_size)",
      "    return 1000.0 / service_ms(max_batch_size)", "test_batching.py",
      "capacity: batches per second, not requests", ISSUE32),
    M("batch-full-off-by-one", "techniques/batching_sim.py", "        j_full = i + max_batch_size - 1\n",
      "        j_full = i + max_batch_size\n", "test_batching.py",
      "simulate: a full batch waits for one request more", ISSUE32),
    # ---------------------------------------------------------------------------------- issue 32: small techniques
    M("break-even-floor", "techniques/compilation.py", "    return math.ceil(extra_ms / saved_ms)",
      "    return math.floor(extra_ms / saved_ms)", "test_compilation.py",
      "break_even_calls: rounded down (one call short of paying back)", ISSUE32),
    M("param-bytes-no-buffers", "techniques/precision.py",
      "    tensors = list(model.parameters()) + list(model.buffers())", "    tensors = list(model.parameters())",
      "test_precision.py", "param_bytes: BatchNorm's running statistics not counted", ISSUE32),
    M("triton-preferred-equal-max-refused", "lessons/13_serving.py", "size > cfg.max_batch_size",
      "size >= cfg.max_batch_size", "test_triton.py::test_preferred_size_above_maximum_is_caught",
      "validate_config: a preferred batch size equal to the maximum refused", ISSUE32),
    # ---------------------------------------------------------------------------------- issue 32: optimize report
    M("report-paying-from-estimate", "capstone/optimizing/report.py",
      "low = [s.ratio.low if s.ratio is not None else s.speedup for s in self.steps]",
      "low = [s.ratio.estimate if s.ratio is not None else s.speedup for s in self.steps]", "test_optimize_report.py",
      "OptimizeReport.paying: a speed-up counted from its estimate, not its interval's low end", ISSUE32),
    M("report-paying-worst-first", "capstone/optimizing/report.py",
      'return df.sort_values("speedup", ascending=False)', 'return df.sort_values("speedup", ascending=True)',
      "test_optimize_report.py", "OptimizeReport.paying: the smallest speed-up first", ISSUE32),
    M("report-cumulative-outside-budget", "capstone/optimizing/report.py",
      'if r["applied"] and bool(r["within_budget"]) and pd.notna(r["speedup"]):',
      'if r["applied"] and pd.notna(r["speedup"]):', "test_optimize_report.py",
      "cumulative_speedup: a variant outside the accuracy budget counts", ISSUE32),
    # ---------------------------------------------------------------------------------- issue 32: serving, LLMs
    M("stream-times-from-send", "serve/stream_load.py",
      "    try:\n        async with client.stream(", "    sent = time.perf_counter()\n    try:\n"
      "        async with client.stream(", "test_serving.py::test_streamed_line_times_count_from_the_due_time",
      "open_loop_stream: line times counted from the send, not the due time", ISSUE32,
      more=(("time.perf_counter() - start - answer.due_s", "time.perf_counter() - sent"),)),
    M("closed-latency-from-start", "serve/load_generator.py", "lat.append((time.perf_counter() - t0) * 1000)",
      "lat.append((time.perf_counter() - start) * 1000)", "test_serving.py::test_closed_loop_counts_every_answer",
      "closed_loop: latency counted from the run's start, not the request's", ISSUE32),
    M("guard-connections-off-by-one", "serve/server_guard.py", "if len(self.connections) > self.max_connections:",
      "if len(self.connections) >= self.max_connections:", (
          "test_serving.py::test_slow_client_times_out_and_idle_connections_are_capped",),
      "server_guard: the connection cap one below its limit", ISSUE32),
    M("kv-admission-strict", "from_lessons/l16_llm_serving.py", "+ claimed <= self.blocks_free()",
      "+ claimed < self.blocks_free()", T_L16, "PagedKV.can_append: the last free block never used", ISSUE32),
    M("kv-slots-off-by-one", "from_lessons/l16_llm_serving.py", "len(self.running) < self.max_slots and budget > 0",
      "len(self.running) <= self.max_slots and budget > 0", T_L16, "Scheduler: one running request over max_slots",
      ISSUE32),
    M("kv-evict-newest", "from_lessons/l16_llm_serving.py", "self.idle.popitem(last=False)",
      "self.idle.popitem(last=True)", T_L16, "PagedKV: evicts the most recently used cached block", ISSUE32),
    M("tp-column-slice-by-rank", "from_lessons/l17_beyond_one_device.py",
      "    return weight[rank * n : (rank + 1) * n].clone()", "    return weight[rank : rank + n].clone()",
      "test_parallel.py::test_slices_pinned", "column_parallel: rank r's slice starts at row r, not r * n", ISSUE32),
    # ---------------------------------------------------------------------------------- issue 32: checkers
    M("l12-silenced-tolerance-loosened", "course_checks/lesson_exercises/l12.py", "        assert err < 1e-3, (",
      "        assert err < 1e-1, (", T_L12, "12.channel-prune: outputs compared 100x more loosely", ISSUE32),
    M("cases-tensors-fixed", "course_checks/lesson_exercises/observe.py",
      "        self.torch_gen = torch.Generator().manual_seed(seed)",
      "        self.torch_gen = torch.Generator().manual_seed(0)", ("test_exercises.py",),
      "observe.Cases: the random tensors the same for every seed (a table of answers passes)", ISSUE32),
    # ---------------------------------------------------------------------------------- issue 32 round 2: sections
    M("r2-strict-skips", "sections/gpu_sections.py", "        if is_strict_gpu():\n            raise GPURequiredError(",
      "        if False and is_strict_gpu():\n            raise GPURequiredError(", "test_modes.py",
      "gpu_section: in strict GPU mode a section that cannot run is skipped, not an error", ISSUE32_R2),
    M("r2-unmet-requires-runs", "sections/gpu_sections.py", "    if unmet and not problems:",
      "    if unmet and problems:", "test_modes.py",
      "gpu_section: a section whose requires= are unmet runs its body (and may be recorded completed)", ISSUE32_R2),
    M("r2-failed-cell-completed", "sections/gpu_sections.py", "        if success:\n            record_section(",
      "        if True:\n            record_section(", T_SECTIONS,
      "finish_cell: a section whose cell raised recorded as completed", ISSUE32_R2),
    M("r2-entered-as-completed", "sections/gpu_sections.py", 'path, status="entered", mode=mode, device=device)',
      'path, status="completed", mode=mode, device=device)', T_SECTIONS,
      "gpu_section: the section recorded completed when entered, before its body ran", ISSUE32_R2),
    M("r2-script-crash-completed", "sections/gpu_sections.py", "        finish_cell(False, value)\n",
      "        finish_cell(True, value)\n", T_SECTIONS,
      "plain script: a section whose body crashed the script recorded as completed", ISSUE32_R2),
    M("r2-settle-never", "sections/gpu_sections.py", '    if _PENDING and not _HOOKS.get("cells"):',
      '    if _PENDING and _HOOKS.get("cells"):', T_SECTIONS,
      "plain script: reaching the next section no longer settles the previous one", ISSUE32_R2),
    # ---------------------------------------------------------------------------------- issue 32 round 2: modes
    M("r2-switch-default-on", "supply/modes.py", '    raw = os.environ.get(name, "")', '    raw = os.environ.get(name, "1")',
      "test_modes.py", "switch: an unset switch read as on", ISSUE32_R2),
    M("r2-rehearse-on-real-gpu", "supply/modes.py", '    return switch("COURSE_REHEARSE") and no_real_gpu()',
      '    return switch("COURSE_REHEARSE")', ("test_modes.py", "test_rehearsal.py"),
      "rehearsing: the stand-ins replace a real GPU too", ISSUE32_R2),
    M("r2-outcomes-across-runs", "supply/modes.py",
      '        key = (row["run"], row["section"]) if row.get("run") else (None, row["section"], i)',
      '        key = row["section"]', ("test_modes.py", "test_gpu_levels.py"),
      "outcomes: one row per section over all runs (an earlier run's completion hidden by a later skip)", ISSUE32_R2),
    M("r2-summary-strict-from-smoke", "supply/modes.py", '        "strict GPU": is_strict_gpu(),',
      '        "strict GPU": is_smoke(),', "test_modes.py", "mode_summary: strict GPU read from the smoke switch",
      ISSUE32_R2),
    # ---------------------------------------------------------------------------------- issue 32 round 2: stand-ins
    M("r2-stream-sync-no-wait", "fakegpu/standins/streams.py",
      '        MODEL.host_sync(self.clock, "Stream.synchronize()", self.ready)',
      '        MODEL.host_sync(self.clock, "Stream.synchronize()")', T_REHEARSAL,
      "Stream.synchronize: the host does not wait for the stream's device time", ISSUE32_R2),
    M("r2-wait-event-no-time", "fakegpu/standins/streams.py", "        self.ready = max(self.ready, event.t)\n", "",
      T_REHEARSAL, "wait_event: the waiting stream's work may start before the event's time", ISSUE32_R2),
    M("r2-flush-skips-deps", "fakegpu/standins/streams.py", "                    if sid != stream.sid:\n",
      "                    if False:\n", T_REHEARSAL,
      "flush: work of other streams a queued item waited for does not run first", ISSUE32_R2),
    M("r2-sync-all-no-drain", "fakegpu/standins/streams.py",
      "        STATE.count(\"synchronizations\")\n        self.drain()\n", "        STATE.count(\"synchronizations\")\n",
      T_REHEARSAL, "torch.cuda.synchronize: the queued work is not run", ISSUE32_R2),
    M("r2-host-wait-no-sleep", "fakegpu/standins/clock.py", "        if left > 0:\n            time.sleep(left)\n", "",
      T_REHEARSAL, "DeviceClock.wait: the host does not wait for the device time (a synced timer reads the launch)",
      ISSUE32_R2),
    M("r2-kernel-cost-min", "fakegpu/standins/clock.py",
      'max(work / _rate(dtype, base), moved / RATES["bandwidth"])', 'min(work / _rate(dtype, base), moved / RATES["bandwidth"])',
      T_REHEARSAL, "kernel_cost: the shorter of arithmetic and memory time, not the longer", ISSUE32_R2),
    M("r2-pageable-copy-pinned-rate", "fakegpu/standins/clock.py", 'nbytes / RATES["pinned" if pinned else "pageable"]',
      'nbytes / RATES["pinned"]', T_REHEARSAL, "copy_cost: a pageable copy as fast as a pinned one", ISSUE32_R2),
    M("r2-side-stream-pageable-allowed", "fakegpu/standins/copies.py", "        if stream is not MODEL.default:\n",
      "        if False:\n", T_REHEARSAL,
      "to_device: a non_blocking pageable copy on a side stream no longer refused", ISSUE32_R2),
    M("r2-d2h-blocking-no-sync", "fakegpu/standins/copies.py",
      '    MODEL.host_sync(stream.clock, "a blocking device-to-host copy", stream.ready)\n', "", T_REHEARSAL,
      "to_host: a blocking copy to the host does not wait for the stream", ISSUE32_R2),
    M("r2-d2h-no-poison", "fakegpu/standins/copies.py", "        poison(dst)  # until", "        (dst)  # until",
      T_REHEARSAL, "to_host: a non_blocking copy's host buffer not poisoned until it lands", ISSUE32_R2),
    M("r2-capture-on-default", "fakegpu/standins/graphs.py", "        if MODEL.current is MODEL.default:\n",
      "        if False:\n", T_REHEARSAL, "capture_begin: a capture on the default stream accepted", ISSUE32_R2),
    M("r2-replay-freed-unchecked", "fakegpu/standins/graphs.py",
      "        freed = [k for k, gen in self.inputs.items() if STATE.live.get(k, [0, 0, -1])[2] != gen]",
      "        freed = []", T_REHEARSAL, "replay: a static input freed after capture not caught", ISSUE32_R2),
    M("r2-capture-cold-unchecked", "fakegpu/standins/graphs.py",
      "        cold = sorted(capture.families & _COMPUTE - MODEL.side_ops)", "        cold = []", T_REHEARSAL,
      "capture_end: kernels never warmed up on a side stream accepted", ISSUE32_R2),
    M("r2-pin-cache-never-reused", "fakegpu/standins/memory.py", "    if free.get(size):\n", "    if False:\n",
      T_REHEARSAL, "pin: a freed pinned block never reused", ISSUE32_R2),
    M("r2-pin-size-doubled", "fakegpu/standins/memory.py", "    size = 1 << (nbytes - 1).bit_length()",
      "    size = 1 << nbytes.bit_length()", T_REHEARSAL,
      "pin: a request of exactly a power of two rounded up to the next one", ISSUE32_R2),
    M("r2-switch-benchmark-unread", "fakegpu/standins/switches.py",
      '    "torch.backends.cudnn.benchmark": lambda: torch.backends.cudnn.benchmark,\n', "", T_REHEARSAL,
      "switches: cudnn.benchmark left changed no longer fails its section", ISSUE32_R2),
    M("r2-peak-stale-read-allowed", "fakegpu/standins/tensor.py",
      "        if self.peak_read and self.allocs_since_read and not self.peak_raised:",
      "        if False and self.peak_read and self.allocs_since_read and not self.peak_raised:", T_REHEARSAL,
      "read_peak: a stale peak read between variants no longer caught", ISSUE32_R2),
    M("r2-second-gpu-accepted", "fakegpu/standins/tensor.py", "not 0 <= dev.index < DEVICE_COUNT",
      "not 0 <= dev.index <= DEVICE_COUNT", T_REHEARSAL, "check_index: cuda:1 accepted on the one stand-in GPU",
      ISSUE32_R2),
    M("r2-ort-no-end-sync", "fakegpu/standins/ort.py", "        if not off:\n            MODEL.host_sync(",
      "        if off:\n            MODEL.host_sync(", T_REHEARSAL,
      "ORT run_with_iobinding: the end-of-run synchronize dropped", ISSUE32_R2),
    M("r2-ort-graph-address-unchecked", "fakegpu/standins/ort.py", "if old is not None and old != (shape, ptr):",
      "if old is not None and old[0] != shape:", T_REHEARSAL,
      "ORT CUDA graph: a replay with the input at a new address accepted", ISSUE32_R2),
    M("r2-pycuda-sync-no-wait", "fakegpu/standins/pycuda.py",
      '            MODEL.host_sync(self._standin.clock, "pycuda Stream.synchronize()", self._standin.ready)\n',
      "            pass\n", T_REHEARSAL, "pycuda Stream.synchronize: the stand-in stream's work not waited for",
      ISSUE32_R2),
    M("r2-trt-profile-max-refused", "fakegpu/standins/tensorrt_exec.py", "all(a <= s <= b for a, s, b in zip(mn, shape, mx",
      "all(a <= s < b for a, s, b in zip(mn, shape, mx", T_REHEARSAL,
      "fake TensorRT set_input_shape: the profile's max shape refused", ISSUE32_R2),
    # ---------------------------------------------------------------------------------- issue 32 round 2: optimize
    M("r2-optimize-default-record-in-smoke", "capstone/optimize.py", '("raise" if is_smoke() else "record")',
      '("record" if is_smoke() else "raise")', "test_optimize.py",
      "optimize: on_error's default flipped (a broken technique hides as a row in smoke runs)", ISSUE32_R2),
    M("r2-optimize-budget-sign", "capstone/optimize.py",
      "        within = cmp.within and base_acc - acc <= accuracy_budget + 1e-12",
      "        within = cmp.within and acc - base_acc <= accuracy_budget + 1e-12", "test_optimize.py",
      "optimize: the accuracy drop's sign flipped in within_budget", ISSUE32_R2),
    M("r2-optimize-outside-tol-timed", "capstone/optimize.py", "        if not cmp.within:\n            step.reason",
      "        if False:\n            step.reason", "test_optimize.py",
      "optimize: a variant outside the tolerance is timed anyway", ISSUE32_R2),
    M("r2-optimize-stack-worst", "capstone/optimize.py", "    _, v, s = max(others, key=lambda t: t[0])",
      "    _, v, s = min(others, key=lambda t: t[0])", "test_optimize.py",
      "optimize: batching stacked with the least paying technique, not the best", ISSUE32_R2),
    M("r2-optimize-bigger-batch-floor", "capstone/optimize.py", "    reps = math.ceil(target / example.shape[0])",
      "    reps = target // example.shape[0]", "test_optimize.py",
      "_bigger_batch: rounded down, so the batching step runs fewer items than asked", ISSUE32_R2),
    # ---------------------------------------------------------------------------------- issue 32 round 2: server
    M("r2-server-no-sigkill", "serve/server_process.py", "(signal.SIGTERM, grace), (signal.SIGKILL, 5.0)",
      "(signal.SIGTERM, grace),", "test_serving.py::test_stop_kills_a_group_that_ignores_sigterm",
      "stop: no SIGKILL after the grace period (a server ignoring SIGTERM lives on)", ISSUE32_R2),
    M("r2-server-zombie-alive", "serve/server_process.py", '    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")',
      '    return True', "test_serving.py::test_pid_alive_counts_a_zombie_as_dead",
      "pid_alive: a zombie counts as alive", ISSUE32_R2),
    M("r2-server-foreign-ready", "serve/server_process.py",
      '                    if r.status_code == 200 and r.json().get("id") == instance:',
      "                    if r.status_code == 200:", "test_serving.py::test_readiness_checks_the_instance_not_the_port",
      "_wait_ready: another program on the port taken for our server", ISSUE32_R2),
    M("r2-server-stale-dirs-of-live", "serve/server_process.py", "        if pid.isdigit() and _started(int(pid)) != started:",
      "        if pid.isdigit() and _started(int(pid)) == started:",
      "test_serving.py::test_a_run_folder_left_by_dead_server_and_kernel_is_removed_at_the_next_start",
      "_remove_stale_run_dirs: the folder of a live owner removed, a dead one's kept", ISSUE32_R2),
    # ---------------------------------------------------------------------------------- issue 32 round 3: ratios
    M("r3-judge-met-strict", "measuring/intervals.py", "        if self.low >= target:",
      "        if self.low > target:", "test_comparing.py::test_judge_uses_the_interval_not_the_estimate",
      "Ratio.judge: a low end exactly at the target is 'not shown'", ISSUE32_R3),
    M("r3-judge-missed-inclusive", "measuring/intervals.py", "        if self.high < target:\n",
      "        if self.high <= target:\n", "test_comparing.py::test_judge_at_the_exact_target_ends",
      "Ratio.judge: a high end exactly at the target is 'missed'", ISSUE32_R3),
    M("r3-judge-drift-judged", "measuring/intervals.py",
      '        if self.drifted:\n            return "not judged (drifted)"\n        if self.low >= target:',
      "        if self.low >= target:", "test_comparing.py::test_standin_and_drift_are_never_judged",
      "Ratio.judge: a drifted ratio judged", ISSUE32_R3),
    M("r3-within-either-end", "measuring/intervals.py", "if low <= self.low and self.high <= high:",
      "if low <= self.low or self.high <= high:", "test_comparing.py::test_judge_within_a_band",
      "Ratio.judge_within: one end inside is 'met'", ISSUE32_R3),
    M("r3-within-drift-judged", "measuring/intervals.py",
      '            return "not judged (drifted)"\n        if low <= self.low',
      "            pass\n        if low <= self.low",
      "test_comparing.py::test_a_band_is_never_judged_on_stand_in_or_drifted_numbers",
      "Ratio.judge_within: a drifted ratio judged", ISSUE32_R3),
    M("r3-half-width-full", "measuring/intervals.py", "(self.high - self.low) / 2 / self.estimate",
      "(self.high - self.low) / self.estimate",
      "test_comparing.py::test_half_width_is_half_the_interval_relative_to_the_estimate",
      "Ratio.half_width: the whole width", ISSUE32_R3),
    M("r3-fmt-ten-strict", "measuring/intervals.py", "    if abs(x) >= 10:", "    if abs(x) > 10:",
      "test_comparing.py::test_format_at_the_switch_points", "fmt: 10 printed with two decimals", ISSUE32_R3),
    M("r3-fmt-tenth-3g", "measuring/intervals.py", "    if abs(x) >= 0.1:", "    if abs(x) > 0.1:",
      "test_comparing.py::test_format_at_the_switch_points", "fmt: 0.1 printed with three significant digits",
      ISSUE32_R3),
    M("r3-rounds-nonfinite-kept", "measuring/intervals.py", "    per_round = per_round[np.isfinite(per_round)]\n", "",
      "test_comparing.py::test_rounds_that_are_not_finite_are_left_out",
      "ratio_from_rounds: an inf round (timed 0) kept", ISSUE32_R3),
    M("r3-estimate-mean", "measuring/intervals.py", "        estimate=float(np.median(per_round)),",
      "        estimate=float(np.mean(per_round)),",
      "test_comparing.py::test_interval_is_the_order_statistic_interval_of_the_median",
      "ratio_from_rounds: the estimate is the mean", ISSUE32_R3),
    M("r3-slower-resolution-wrong-side", "measuring/intervals.py", "        if self.high < 1.0 - RESOLUTION:",
      "        if self.high < 1.0 + RESOLUTION:",
      "test_comparing.py::test_a_difference_below_the_printed_precision_is_not_claimed",
      "Ratio.verdict: 1.003x high end 'slower'", ISSUE32_R3),
    M("r3-row-low-high-swapped", "measuring/intervals.py",
      '            f"{prefix}_low": self.low,\n            f"{prefix}_high": self.high,',
      '            f"{prefix}_low": self.high,\n            f"{prefix}_high": self.low,',
      "test_comparing.py::test_interval_is_the_order_statistic_interval_of_the_median",
      "Ratio.as_row: low and high swapped", ISSUE32_R3),
    M("r3-says-slower-as-faster", "measuring/intervals.py",
      '        if self.verdict == "faster":\n            return f"{variant} is {self.interval_text} {better}',
      '        if self.verdict != "faster":\n            return f"{variant} is {self.interval_text} {better}',
      ("test_comparing.py::test_slower_variant_reads_below_one", "test_comparing.py::test_says_phrases_each_verdict",),
      "Ratio.says: a slower variant phrased 'faster than'", ISSUE32_R3),
    M("r3-flags-standin-dropped", "measuring/intervals.py", "            out.append(STANDIN_FLAG)\n",
      "            pass\n", "test_comparing.py::test_standin_and_drift_are_never_judged",
      "Ratio.flags: the stand-in flag not printed", ISSUE32_R3),
    M("r3-drift-bound-inclusive", "measuring/comparing.py", "max(early, late) / min(early, late) <= 1 + BASELINE_DRIFT",
      "max(early, late) / min(early, late) < 1 + BASELINE_DRIFT",
      "test_comparing.py::test_baseline_drift_is_flagged_only_beyond_twice",
      "_baseline_drift: a baseline exactly 2x slower later flagged", ISSUE32_R3),
    M("r3-drift-bound-loosened", "measuring/comparing.py", "BASELINE_DRIFT = 1.0 ", "BASELINE_DRIFT = 2.0 ",
      ("test_comparing.py::test_load_change_between_rounds_cancels_in_the_ratio",
       "test_comparing.py::test_baseline_drift_is_flagged_only_beyond_twice"),
      "_baseline_drift: the baseline may move 3x before it is flagged", ISSUE32_R3),
    M("r3-drift-min-rounds", "measuring/comparing.py", '    if len(values) < 4:\n        return ""',
      '    if len(values) < 6:\n        return ""',
      "test_comparing.py::test_baseline_drift_is_flagged_only_beyond_twice",
      "_baseline_drift: 4 or 5 rounds never checked", ISSUE32_R3),
    M("r3-vs-drift-from-name", "measuring/comparing.py", "        drift = _baseline_drift(self.per_round[vs])",
      "        drift = _baseline_drift(self.per_round[name])",
      "test_comparing.py::test_ratio_vs_a_variant_checks_that_variant_for_drift",
      "Comparison.ratio(vs=...): drift checked on the variant, not the one it is compared against", ISSUE32_R3),
    M("r3-vs-standin-dropped", "measuring/comparing.py",
      "        standin = any(r.standin for r in self.ratios.values())\n", "        standin = False\n",
      "test_comparing.py::test_ratio_vs_a_variant_keeps_the_stand_in_label",
      "Comparison.ratio(vs=...): a stand-in ratio judged", ISSUE32_R3),
    M("r3-compare-no-warmup", "measuring/comparing.py", "        for _ in range(warmup):\n            variants[name]()",
      "        for _ in range(0):\n            variants[name]()",
      "test_comparing.py::test_warmup_rounds_and_calls_are_counted", "compare: the warm-up skipped", ISSUE32_R3),
    M("r3-compare-smoke-rounds", "measuring/comparing.py", "rounds = pick(full=15, smoke=7)",
      "rounds = pick(full=15, smoke=5)", "test_comparing.py::test_default_rounds_warmup_and_block_length",
      "compare: 5 default rounds in smoke (no 95% interval)", ISSUE32_R3),
    M("r3-compare-min-calls-ignored", "measuring/comparing.py", "min_repeats=min_calls,", "min_repeats=1,",
      "test_comparing.py::test_warmup_rounds_and_calls_are_counted", "compare: min_calls ignored", ISSUE32_R3),
    M("r3-compare-batch-ignores-items", "measuring/comparing.py", "batch_size=(items or {}).get(n, batch_size),",
      "batch_size=batch_size,", "test_comparing.py::test_items_make_the_ratio_per_item",
      "compare: a measurement's batch size ignores items=", ISSUE32_R3),
    M("r3-table-median-is-mean", "measuring/comparing.py", '                "median": m.median_ms,',
      '                "median": m.mean_ms,', "test_comparing.py::test_compare_runs_table_median_and_no_shared_work",
      "Comparison.table: the median column holds the mean", ISSUE32_R3),
    M("r3-runs-base-drift-dropped", "measuring/comparing.py", "r.half_width) or base_drift", "r.half_width)",
      "test_comparing.py::test_compare_runs_flags_a_drifting_baseline", "compare_runs: a drifting baseline not flagged",
      ISSUE32_R3),
    M("r3-runs-shared-missing-zero", "measuring/comparing.py",
      '        return float(out["value"]), None if shared is None else float(shared)',
      '        return float(out["value"]), 0.0 if shared is None else float(shared)',
      "test_comparing.py::test_compare_runs_table_median_and_no_shared_work",
      "compare_runs: a run without shared_s counted as 0 s of shared work", ISSUE32_R3),
    M("r3-rounds-zero-accepted", "measuring/comparing.py",
      '    if rounds < 1:\n        raise ValueError(f"rounds={rounds}: compare needs',
      '    if rounds < 0:\n        raise ValueError(f"rounds={rounds}: compare needs',
      "test_comparing.py::test_zero_rounds_is_refused", "compare: rounds=0 accepted", ISSUE32_R3),
    M("r3-table-baseline-standin-flag", "measuring/comparing.py",
      "            elif any(x.standin for x in self.ratios.values()):\n                flags.append(STANDIN_FLAG)\n",
      "", "test_comparing.py::test_standin_flag_under_the_rehearsal",
      "Comparison.table: the baseline's row not flagged stand-in", ISSUE32_R3),

    # ---------------------------------------------------------------------------------- issue 32 round 3: results
    M("r3-inside-env-not-restored", "show/results.py",
      "        if before is None:\n            os.environ.pop(INSIDE_CHECK_VAR, None)\n        else:\n            o"
      "s.environ[INSIDE_CHECK_VAR] = before", "        os.environ.pop(INSIDE_CHECK_VAR, None)",
      "test_results.py::test_nested_checks_mark_rows_with_the_inner_check_and_restore_the_outer",
      "inside_check: an outer check's variable dropped when an inner one ends", ISSUE32_R3),
    M("r3-inside-mark-outermost", "show/results.py", "check = _INSIDE[-1] if _INSIDE", "check = _INSIDE[0] if _INSIDE",
      "test_results.py::test_nested_checks_mark_rows_with_the_inner_check_and_restore_the_outer",
      "record: a row inside nested checks marked with the outer check", ISSUE32_R3),
    M("r3-neutralize-quote-prefix", "show/results.py",
      '    return "\'" + text if text.lstrip("\'").startswith(_FORMULA_START) else text',
      '    return "\'" + text if text.startswith(_FORMULA_START) else text',
      "test_results.py::test_formulas_are_neutralized_on_disk_and_shown_unchanged",
      "neutralize: text already starting with a quote before '=' gets no extra quote (not round-tripped)", ISSUE32_R3),
    M("r3-formula-at-missing", "show/results.py", '_FORMULA_START = ("=", "+", "-", "@", "\\t", "\\r")',
      '_FORMULA_START = ("=", "+", "-", "\\t", "\\r")',
      "test_results.py::test_formulas_are_neutralized_on_disk_and_shown_unchanged",
      "neutralize: a note starting with '@' not neutralized", ISSUE32_R3),
    M("r3-text-limit-inclusive", "show/results.py", "    if len(text) > TEXT_LIMIT:", "    if len(text) >= TEXT_LIMIT:",
      "test_results.py::test_a_field_is_cut_only_beyond_the_text_limit",
      "_safe_text: a field of exactly TEXT_LIMIT characters cut", ISSUE32_R3),
    M("r3-cr-order", "show/results.py", '.replace("\\x00", "").replace("\\r\\n", "\\n").replace("\\r", "\\n")',
      '.replace("\\x00", "").replace("\\r", "\\n")',
      "test_results.py::test_formulas_are_neutralized_on_disk_and_shown_unchanged",
      "_safe_text: a CRLF line end becomes two newlines", ISSUE32_R3),
    M("r3-load-machine-not-required", "show/results.py",
      'missing = {"lesson", "technique", "median_ms", "machine"} - set(df.columns)',
      'missing = {"lesson", "technique", "median_ms"} - set(df.columns)',
      "test_results.py::test_a_file_without_the_machine_column_is_skipped_naming_it",
      "load_results: a file without the machine column loaded", ISSUE32_R3),
    M("r3-reference-lesson-not-padded", "show/results.py",
      'df = df[df["lesson"].astype(str).str.zfill(2) == str(lesson).zfill(2)]',
      'df = df[df["lesson"].astype(str) == str(lesson)]',
      "test_results.py::test_show_reference_without_rows_says_not_executed",
      "reference_results: lesson '3' finds no row of lesson 03", ISSUE32_R3),
    M("r3-header-any-first-line", "show/results.py",
      'columns != COLUMNS and {"lesson", "technique"} <= set(columns) else None', "columns != COLUMNS else None",
      "test_results.py::test_only_a_results_header_is_taken_as_a_file_s_own_columns",
      "_existing_header: a garbage first line taken as the file's columns", ISSUE32_R3),
    M("r3-ratio-verdict-not-noted", "show/results.py",
      'notes = "; ".join(x for x in [notes, ratio.verdict, *ratio.flags] if x)',
      'notes = "; ".join(x for x in [notes, *ratio.flags] if x)',
      "test_comparing.py::test_record_keeps_the_interval_and_older_files_stay_readable",
      "record: a Ratio's verdict left out of the notes", ISSUE32_R3),
    M("r3-warn-more-count", "show/results.py", 'more = f" and {len(items) - 5} more" if len(items) > 5 else ""',
      'more = f" and {len(items)} more" if len(items) > 5 else ""',
      "test_results.py::test_the_warning_counts_the_skipped_rows_beyond_the_five_it_names",
      "read_rows: 'and N more' counts every bad row", ISSUE32_R3),
    M("r3-bad-line-number", "show/results_file.py", '            bad.append(f"line {start + 1}: {problem}")',
      '            bad.append(f"line {start}: {problem}")',
      "test_results.py::test_malformed_line_is_warned_and_skipped_not_the_whole_file",
      "parse_rows: a skipped row named by the line before it", ISSUE32_R3),
    M("r3-signed-nan-kept", "show/results_file.py", 'if fields[i].strip().lower().lstrip("+-") == "nan":',
      'if fields[i].strip().lower() == "nan":',
      "test_results.py::test_nan_spelled_out_is_dropped_from_its_row_which_is_kept",
      "parse_rows: '-nan' kept as a number", ISSUE32_R3),
    M("r3-blank-line-bad", "show/results_file.py", "        if not any(f.strip() for f in fields) or fields == header:",
      "        if fields == header:", "test_results.py::test_blank_lines_are_neither_rows_nor_errors",
      "parse_rows: a blank line reported as a malformed row", ISSUE32_R3),
    M("r3-board-lesson-not-padded", "show/leaderboard.py",
      '        df = df[df["lesson"].astype(str) == str(lesson).zfill(2)]\n        if df.empty:',
      '        df = df[df["lesson"].astype(str) == str(lesson)]\n        if df.empty:',
      "test_leaderboard.py::test_a_lesson_asked_as_a_number_finds_its_two_digit_rows",
      "leaderboard(lesson='3'): no row of lesson 03", ISSUE32_R3),
    M("r3-board-check-rows-kept", "show/leaderboard.py", "            df = df[~marked]\n", "",
      "test_leaderboard.py::test_rows_recorded_inside_an_exercise_check_stay_off_the_board",
      "pool: rows recorded inside an exercise check kept on the board", ISSUE32_R3),
    M("r3-best-technique-min", "show/leaderboard.py", '["speedup_vs_baseline"].idxmax()',
      '["speedup_vs_baseline"].idxmin()', "test_leaderboard.py::test_leaderboard_puts_machines_side_by_side",
      "best_technique: the slowest technique per machine", ISSUE32_R3),
    M("r3-label-smoke-dropped", "show/leaderboard.py", 'mode == "smoke" else "")', 'mode == "full" else "")',
      "test_leaderboard.py::test_labels_keep_identical_images_apart", "_label: smoke rows not labelled (smoke)",
      ISSUE32_R3),
    M("r3-attendee-name-unlimited", "show/leaderboard.py", ".strip()[:NAME_LIMIT]", ".strip()",
      "test_leaderboard.py::test_attendee_name_is_its_first_printable_line_cut_at_forty",
      "attendee_name: no 40-character limit", ISSUE32_R3),
    M("r3-attendee-name-unprintable", "show/leaderboard.py",
      'return "".join(c for c in first if c.isprintable()).strip()', "return first.strip()",
      "test_leaderboard.py::test_attendee_name_is_its_first_printable_line_cut_at_forty",
      "attendee_name: control characters kept", ISSUE32_R3),
    M("r3-machines-newest-min", "show/leaderboard.py", '"newest": g["time"].max(),', '"newest": g["time"].min(),',
      "test_leaderboard.py::test_machines_lists_rows_lessons_and_the_newest_time",
      "machines: the oldest time shown as newest", ISSUE32_R3),
    M("r3-speedup-limit-loosened", "show/leaderboard.py", 'PLAUSIBLE_MAX = {"speedup_vs_baseline": 1e4}',
      'PLAUSIBLE_MAX = {"speedup_vs_baseline": 1e6}',
      "test_leaderboard.py::test_speed_ups_past_ten_thousand_are_dropped_but_not_below",
      "_normalise: a 100,000x speed-up kept on the board", ISSUE32_R3),
    M("r3-install-id-in-machine-unanchored", "show/leaderboard.py",
      'm = re.search(r"_([0-9a-f]{6})$", str(machine or ""))', 'm = re.search(r"_([0-9a-f]{6})", str(machine or ""))',
      "test_leaderboard.py::test_install_id_is_the_machine_name_s_last_six_hex_digits_else_the_folder_s",
      "_install_id: six hex digits anywhere in the machine name taken as its install id", ISSUE32_R3),
    M("r3-reference-date-oldest", "show/leaderboard.py", 'str(df["time"].dropna().astype(str).max())[:10]',
      'str(df["time"].dropna().astype(str).min())[:10]',
      "test_leaderboard.py::test_a_reference_without_env_file_is_dated_by_its_newest_row",
      "references: labelled with the oldest row's date", ISSUE32_R3),
    M("r3-label-id-any-length", "show/leaderboard.py", 'len(parts) >= 3 and re.fullmatch(r"[0-9a-f]{6}", parts[-1])',
      'len(parts) >= 2 and re.fullmatch(r"[0-9a-f]+", parts[-1])',
      "test_leaderboard.py::test_labels_show_only_a_six_digit_install_id_after_host_and_hardware",
      "_label: any hex tail of a two-part machine name shown as an install id", ISSUE32_R3),
    M("r3-install-id-short", "show/machine_label.py", "found = secrets.token_hex(3)", "found = secrets.token_hex(2)",
      "test_results.py::test_identical_machine_images_keep_distinct_machines_and_labels",
      "install_id: 4 hex digits (the leaderboard reads 6)", ISSUE32_R3),
    M("r3-install-id-no-recheck", "show/machine_label.py",
      "        found = current()  # another process may have chosen it while we waited\n        if not found:",
      "        found = None\n        if not found:",
      "test_results.py::test_concurrent_first_writes_give_one_header_per_file",
      "install_id: the id not re-read under the lock (concurrent first calls disagree)", ISSUE32_R3),
    M("r3-machine-id-unsafe-chars", "show/machine_label.py", 're.sub(r"[^A-Za-z0-9._-]+", "-",', 're.sub(r"[/]+", "-",',
      "test_results.py::test_machine_id_is_file_safe", "machine_id: spaces and other characters kept in the file name",
      ISSUE32_R3),
    # ---------------------------------------------------------------------------------- issue 32 round 3: load
    M("r3-closed-only-200-ok", "serve/load_generator.py",
      "                if 200 <= code < 300:\n                    lat.append((time.perf_counter() - t0)",
      "                if code == 200:\n                    lat.append((time.perf_counter() - t0)",
      "test_serving.py::test_every_2xx_is_good_and_other_answers_are_failed",
      "closed_loop: a 201 answer counted as failed", ISSUE32_R3),
    M("r3-open-only-200-ok", "serve/load_generator.py",
      "            if 200 <= code < 300:\n                lat.append((time.perf_counter() - start - due[i])",
      "            if code == 200:\n                lat.append((time.perf_counter() - start - due[i])",
      "test_serving.py::test_every_2xx_is_good_and_other_answers_are_failed",
      "open_loop: a 201 answer counted as failed", ISSUE32_R3),
    M("r3-open-first-not-at-once", "serve/load_generator.py",
      "    due = np.cumsum(gaps) - gaps[0]  # the first request goes at once\n    limits = httpx.Limits(\n        m"
      "ax_connections=max_in_flight,",
      "    due = np.cumsum(gaps)\n    limits = httpx.Limits(\n        max_connections=max_in_flight,",
      "test_serving.py::test_the_first_open_loop_arrival_goes_at_once", "open_loop: the first request waits one gap",
      ISSUE32_R3),
    M("r3-closed-no-warmup", "serve/load_generator.py", "        for i in range(warmup):\n",
      "        for i in range(0):\n",
      "test_serving.py::test_closed_loop_sends_its_warmup_first_and_keeps_its_clients_busy",
      "closed_loop: the warm-up requests never sent", ISSUE32_R3),
    M("r3-zero-seconds-accepted", "serve/load_generator.py", "if n_requests < 1 or not bodies or max_seconds <= 0:",
      "if n_requests < 1 or not bodies or max_seconds < 0:", "test_serving.py::test_a_load_of_zero_seconds_is_refused",
      "_check: max_seconds=0 accepted (a load test that sends nothing)", ISSUE32_R3),
    M("r3-closed-failed-counts-all", "serve/load_generator.py",
      'return LoadResult("closed", concurrency, float("nan"), len(lat), sum(statuses.values()) - len(lat),',
      'return LoadResult("closed", concurrency, float("nan"), len(lat), sum(statuses.values()),',
      "test_serving.py::test_every_2xx_is_good_and_other_answers_are_failed",
      "closed_loop: every answer counted as failed too", ISSUE32_R3),
    M("r3-post-many-error-status", "serve/load_generator.py",
      '                        return 0, f"{type(exc).__name__}: {exc}"',
      '                        return 599, f"{type(exc).__name__}: {exc}"',
      "test_serving.py::test_post_many_gives_status_0_to_a_request_without_answer",
      "post_many: a request with no answer gets status 599, not 0", ISSUE32_R3),
    M("r3-closed-one-worker", "serve/load_generator.py",
      "tasks = [asyncio.create_task(worker()) for _ in range(min(concurrency, n_requests))]",
      "tasks = [asyncio.create_task(worker()) for _ in range(1)]",
      "test_serving.py::test_closed_loop_sends_its_warmup_first_and_keeps_its_clients_busy",
      "closed_loop: concurrency ignored (one client)", ISSUE32_R3),
    M("r3-stream-blank-lines-kept", "serve/stream_load.py", "                if raw.strip():\n",
      "                if True:\n",
      "test_serving.py::test_streamed_lines_skip_blanks_and_each_request_sends_its_own_body",
      "open_loop_stream: blank keep-alive lines recorded as lines", ISSUE32_R3),
    M("r3-stream-ok-ignores-error", "serve/stream_load.py", "return 200 <= self.status < 300 and not self.error",
      "return 200 <= self.status < 300",
      "test_serving.py::test_streamed_lines_skip_blanks_and_each_request_sends_its_own_body",
      "StreamedAnswer.ok: a stream cut short by an error counted ok", ISSUE32_R3),
    M("r3-stream-one-body", "serve/stream_load.py", "bodies[a.index % len(bodies)]", "bodies[0]",
      "test_serving.py::test_streamed_lines_skip_blanks_and_each_request_sends_its_own_body",
      "open_loop_stream: every request sends the first body", ISSUE32_R3),
    M("r3-stream-first-not-at-once", "serve/stream_load.py",
      "    due = np.cumsum(gaps) - gaps[0]  # the first request goes at once\n", "    due = np.cumsum(gaps)\n",
      "test_serving.py::test_the_first_open_loop_arrival_goes_at_once",
      "open_loop_stream: the first request waits one gap", ISSUE32_R3),
    # ---------------------------------------------------------------------------------- issue 32 round 4
    M("r4-prune-linear-rows-dropped", "lessons/12_pruning_distillation.py",
      "PRUNABLE = (torch.nn.Conv2d, torch.nn.Linear)", "PRUNABLE = (torch.nn.Conv2d,)",
      "test_pruning.py::test_sparsity_report_has_a_row_per_conv_and_linear_layer_and_a_weighted_total",
      "sparsity_report: the Linear layers' rows dropped", ISSUE32_R4),
    M("r4-prune-total-sparsity-mean", "lessons/12_pruning_distillation.py", '    df["sparsity"] = df["zeros"] / df["weights"]\n',
      '    df["sparsity"] = df["zeros"] / df["weights"]\n'
      '    df.loc[len(df) - 1, "sparsity"] = df["sparsity"][:-1].mean()\n',
      ("test_pruning.py::test_sparsity_report_counts_zeros",
       "test_pruning.py::test_sparsity_report_has_a_row_per_conv_and_linear_layer_and_a_weighted_total"),
      "sparsity_report: the total's sparsity is the mean of the layers' (not weighted)",
      ISSUE32_R4),
    M("r4-prune-keep-above-one", "lessons/12_pruning_distillation.py", "    if not 0.0 < keep_fraction <= 1.0:",
      "    if not 0.0 < keep_fraction <= 2.0:",
      "test_pruning.py::test_channel_prune_refuses_keeping_more_than_every_channel",
      "channel_prune_cnn: a keep_fraction above 1 accepted (tolerance loosened)", ISSUE32_R4),
    M("r4-prune-train-unseeded", "lessons/12_pruning_distillation.py", "        perm = torch.randperm(len(x), generator=g)",
      "        perm = torch.randperm(len(x))",
      "test_pruning.py::test_train_draws_its_batches_from_its_own_seed_not_the_global_generator",
      "train: batches drawn from the global generator (the seed ignored)", ISSUE32_R4),
    M("r4-prune-keep-smallest", "lessons/12_pruning_distillation.py", "    return norms.topk(keep).indices.sort().values",
      "    return norms.topk(keep, largest=False).indices.sort().values",
      "test_pruning.py::test_channel_prune_keeps_largest_filters",
      "keep_idx: the channels of smallest L1 norm kept", ISSUE32_R4),
    M("r4-opcalls-counts-profiler-steps", "techniques/profiling.py",
      'if e.key.startswith("ProfilerStep") or getattr(e, "is_user_annotation", False):',
      'if getattr(e, "is_user_annotation", False):',
      "test_profiling.py::test_op_calls_sums_the_counts_of_operator_rows_only",
      "op_calls: the schedule's ProfilerStep# rows counted as operators", ISSUE32_R4),
    M("r4-opcalls-one-per-name", "techniques/profiling.py", "            total += e.count", "            total += 1",
      ("test_profiling.py::test_op_calls_counts_operators_not_ranges",
       "test_profiling.py::test_op_calls_sums_the_counts_of_operator_rows_only"),
      "op_calls: one call per operator name, not its count", ISSUE32_R4),
    M("r4-break-even-zero-extra-never", "techniques/compilation.py", "    if extra_ms <= 0:", "    if extra_ms < 0:",
      "test_compilation.py::test_break_even_when_compiling_costs_nothing_and_saves_nothing",
      "break_even_calls: a compile that cost nothing and saves nothing never pays back",
      ISSUE32_R4),
    M("r4-break-even-extra-minus-eager", "techniques/compilation.py",
      "    extra_ms = first_call_s * 1000.0 - compiled_ms", "    extra_ms = first_call_s * 1000.0 - eager_ms",
      "test_compilation.py", "break_even_calls: the first call's extra time taken against the eager time",
      ISSUE32_R4),
    M("r4-channels-last-trivial", "techniques/precision.py",
      "t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()",
      "t.is_contiguous(memory_format=torch.channels_last)",
      "test_precision.py::test_a_tensor_contiguous_in_both_layouts_is_not_called_channels_last",
      "is_channels_last: a tensor contiguous in both layouts (C=1 or 1x1) called channels_last", ISSUE32_R4),
    M("r4-int8-share-boundary", "capstone/optimizing/techniques.py", "    if share < LINEAR_HEAVY_SHARE:",
      "    if share <= LINEAR_HEAVY_SHARE:",
      "test_optimize.py::test_linear_share_counts_weights_and_biases_and_int8_is_tried_at_exactly_half",
      "int8: a model with exactly half its parameters in Linear layers skipped", ISSUE32_R4),
    M("r4-batching-equal-batch-kept", "capstone/optimizing/techniques.py", "    if b >= big:", "    if b > big:",
      "test_optimize.py::test_batching_is_skipped_when_the_example_already_has_the_batching_batch",
      "batching: an example already at the batching step's batch still tried", ISSUE32_R4),
    M("r4-linear-share-weights-only", "capstone/optimizing/techniques.py",
      "for p in m.parameters(recurse=False))", "for p in [m.weight])",
      "test_optimize.py::test_linear_share_counts_weights_and_biases_and_int8_is_tried_at_exactly_half",
      "linear_share: the Linear layers' biases not counted",
      ISSUE32_R4),
    M("r4-weights-any-tensor", "supply/models.py",
      "not all(isinstance(v, torch.Tensor) for v in state.values())",
      "not any(isinstance(v, torch.Tensor) for v in state.values())",
      "test_data_models.py::test_load_weights_refuses_a_dict_mixing_tensors_and_other_values",
      "load_weights: a state dict with one tensor and other values accepted", ISSUE32_R4),
    M("r4-accuracy-last-batch-dropped", "supply/models.py", "        for i in range(0, len(x), batch_size):",
      "        for i in range(0, len(x) - batch_size + 1, batch_size):",
      "test_data_models.py::test_accuracy_counts_every_row_including_a_partial_last_batch",
      "accuracy: a partial last batch never evaluated", ISSUE32_R4),
    M("r4-render-no-type-name", "supply/errors.py", '        return [f"{type(self).__name__}: {self}"]',
      "        return [str(self)]", "test_device.py::test_a_course_error_renders_as_one_line_with_its_own_type_name",
      "CourseError._render_traceback_: the error's type not shown",
      ISSUE32_R4),
    M("r4-start-seed-ignored", "sections/lesson.py", "    torch.manual_seed(seed)", "    torch.manual_seed(0)",
      "test_modes.py::test_start_seeds_every_generator_with_the_seed_it_is_given",
      "start: torch seeded with 0, whatever seed is asked (wrong default)", ISSUE32_R4),
    M("r4-start-numpy-unseeded", "sections/lesson.py", "    np.random.seed(seed)\n", "",
      "test_modes.py::test_start_seeds_every_generator_with_the_seed_it_is_given",
      "start: numpy's generator not seeded", ISSUE32_R4),
    M("r4-validate-larger-dim-ok", "techniques/onnx_runtime.py", "if isinstance(want, int) and want != got:",
      "if isinstance(want, int) and want > got:", "test_backends.py::test_runner_bad_inputs_name_the_expected",
      "validate_input: a fixed dimension larger than the model's accepted", ISSUE32_R4),
    M("r4-count-nodes-ai-onnx-prefixed", "techniques/onnx_runtime.py", 'n.domain in ("", "ai.onnx")',
      'n.domain == ""', "test_backends.py::test_count_nodes_names_standard_ops_plainly_and_others_with_their_domain",
      "count_nodes: standard ops of domain 'ai.onnx' counted as a foreign domain", ISSUE32_R4),
    M("r4-onnx-io-batch-kept", "lessons/13_serving.py",
      'for d in t.shape.dim)[1:]', 'for d in t.shape.dim)',
      "test_triton.py::test_onnx_io_drops_only_the_batch_dimension_and_the_initializers",
      "onnx_io: the batch dimension kept in Triton's dims (off by one axis)", ISSUE32_R4),
    M("r4-rate-step-zero", "lessons/13_serving.py", "{max(1, (hi - lo) // 4)}", "{(hi - lo) // 4}",
      "test_triton.py::test_perf_analyzer_rate_step_is_at_least_one",
      "perf_analyzer_line: a request-rate step of 0 for a narrow range", ISSUE32_R4),
    M("r4-kv-truncate-floor", "from_lessons/l16_llm_serving.py", "        keep = -(-n // self.block_size)",
      "        keep = n // self.block_size",
      "test_llm_serving.py::test_blocks_needed_and_truncate_count_a_partly_filled_block",
      "PagedKV.truncate: the partly filled last block freed", ISSUE32_R4),
    M("r4-kv-blocks-needed-floor", "from_lessons/l16_llm_serving.py",
      "return max(0, -(-(have + n) // bs) - len(table)) + cow", "return max(0, (have + n) // bs - len(table)) + cow",
      "test_llm_serving.py::test_blocks_needed_and_truncate_count_a_partly_filled_block",
      "PagedKV.blocks_needed: a partly filled new block not counted", ISSUE32_R4),
    M("r4-kv-every-block-shared", "from_lessons/l16_llm_serving.py",
      "        return self.refs[block] > 1 or block in self.key_of",
      "        return self.refs[block] >= 1 or block in self.key_of",
      "test_llm_serving.py::test_a_block_only_one_uncached_sequence_holds_is_written_in_place",
      "PagedKV._shared: a block only this sequence holds copied on write", ISSUE32_R4),
    M("r4-best-token-tie-highest", "from_lessons/l17_beyond_one_device.py",
      "key=lambda t: (float(t[0]), -float(t[1])))", "key=lambda t: (float(t[0]), float(t[1])))",
      "test_parallel.py::test_best_token_takes_the_highest_score_and_on_a_tie_the_lowest_id",
      "Comm.best_token: a tie goes to the highest token id, not the lowest",
      ISSUE32_R4),
    M("r4-rms-norm-wrong-axis", "from_lessons/l17_beyond_one_device.py",
      "x32.pow(2).mean(-1, keepdim=True) + eps", "x32.pow(2).mean(1, keepdim=True) + eps",
      "test_parallel.py::test_rms_norm_scales_each_position_by_its_own_features",
      "rms_norm: the mean taken over the positions, not the features",
      ISSUE32_R4),
    M("r4-service-below-smallest-flat", "techniques/batching_sim.py", "            return float(ms[0]) * b / bs[0]",
      "            return float(ms[0])",
      "test_batching.py::test_service_time_fn_sorts_the_sweep_and_scales_below_its_smallest_batch",
      "service_time_fn: a batch below the smallest measured one costs that whole batch's time", ISSUE32_R4),
    M("r4-service-unsorted-sweep", "techniques/batching_sim.py", '    df = sweep_df.sort_values("batch_size")',
      "    df = sweep_df", "test_batching.py::test_service_time_fn_sorts_the_sweep_and_scales_below_its_smallest_batch",
      "service_time_fn: a sweep not in batch order interpolated as it is",
      ISSUE32_R4),
    M("r4-sim-throughput-per-ms", "techniques/batching_sim.py", "len(self.latencies_ms) / (self.span_ms / 1000.0)",
      "len(self.latencies_ms) / self.span_ms",
      "test_batching.py::test_summary_of_a_known_run",
      "SimResult.throughput: requests per millisecond (wrong unit)", ISSUE32_R4),
    M("r4-missing-standin-module", "supply/modes.py", "            found = name in sys.modules  # a stand-in",
      "            found = False  # a stand-in",
      "test_modes.py::test_a_stand_in_module_without_a_finder_is_not_missing",
      "missing_modules: a stand-in module without a finder (the rehearsal's tensorrt) called missing", ISSUE32_R4),
    M("r4-order-same-tick-unordered", "fakegpu/ordering.py",
      "    return clock.get(use.stream.sid, 0) >= use.clock[use.stream.sid]",
      "    return clock.get(use.stream.sid, 0) > use.clock[use.stream.sid]",
      ("test_rehearsal.py::test_stream_order_missing_wait", *T_STREAMS),
      "seen/ordered: a use exactly at the waited-for tick counted as unordered (off by one)", ISSUE32_R4),
    M("r4-order-read-after-write-ok", "fakegpu/ordering.py",
      "    return (a.write or b.write) and a.stream is not b.stream and not ordered(a, b)",
      "    return b.write and a.stream is not b.stream and not ordered(a, b)",
      ("test_rehearsal.py::test_stream_order_missing_wait", *T_STREAMS),
      "conflict: a read on another stream of memory written there, with no wait, not flagged", ISSUE32_R4),
    M("r4-order-record-stream-ignored", "fakegpu/ordering.py",
      "    if use.stream is made or use.stream.sid in recorded:", "    if use.stream is made:",
      ("test_rehearsal.py::test_record_stream_missing_is_caught_at_reuse", *T_STREAMS),
      "unsafe_to_reuse: a block used on another stream and given record_stream still flagged", ISSUE32_R4),
    M("ordering-tick-ignores-host", "fakegpu/ordering.py", "    clock = join(clock, host)", "    clock = dict(clock)",
      (*T_STREAMS, "test_rehearsal.py::test_mem_get_info_is_free_then_total_and_empty_cache_synchronizes"),
      "next_tick: work issued after a host synchronize is not ordered after what the host waited for"),
    M("r4-llm-sha-unchecked", "supply/llm.py", "        if _sha256(path) != digest:",
      "        if False and _sha256(path) != digest:", "test_llm.py::test_cache_problems_are_found",
      "_cache_problem: a cached file not matching its sha256 used", ISSUE32_R4),
    M("r4-llm-source-size-unchecked", "supply/llm.py", "    if data.get(\"source_size\") != gguf.stat().st_size:",
      "    if False:", "test_llm.py::test_cache_problems_are_found",
      "_cache_problem: a cache converted from another GGUF file used", ISSUE32_R4),
    M("r4-llm-foreign-more-count", "supply/llm.py", 'f" and {len(foreign) - 3} more"', 'f" and {len(foreign)} more"',
      "test_llm.py::test_a_refusal_names_three_foreign_files_and_counts_only_the_others",
      "_refuse_foreign: 'and N more' counts the three it names too", ISSUE32_R4),
    M("r4-cuda-sync-dropped", "fakegpu/standins/cuda.py",
      '    check_index(device, "torch.cuda.synchronize")\n    MODEL.sync_all()\n',
      '    check_index(device, "torch.cuda.synchronize")\n', "test_rehearsal.py::test_cuda_graph_rules_and_replay",
      "the stand-in torch.cuda.synchronize() does not wait for the streams", ISSUE32_R4),
    M("r4-cuda-mem-info-swapped", "fakegpu/standins/cuda.py",
      "    return STATE.total_memory - STATE.reserved(), STATE.total_memory",
      "    return STATE.total_memory, STATE.total_memory - STATE.reserved()",
      "test_rehearsal.py::test_mem_get_info_is_free_then_total_and_empty_cache_synchronizes",
      "mem_get_info: (total, free) instead of (free, total)", ISSUE32_R4),
    M("r4-cuda-empty-cache-no-sync", "fakegpu/standins/cuda.py",
      '    MODEL.sync_all("torch.cuda.empty_cache()")  # the caching allocator', "    pass  # the caching allocator",
      "test_rehearsal.py::test_mem_get_info_is_free_then_total_and_empty_cache_synchronizes",
      "empty_cache: frees the cache without synchronizing first", ISSUE32_R4),
    M("r4-sync-all-no-host-join", "fakegpu/standins/streams.py",
      "        for s in self.streams:\n            self.host = join(self.host, s.clock)\n        self.clock.wait(",
      "        self.clock.wait(", "test_rehearsal.py::test_mem_get_info_is_free_then_total_and_empty_cache_synchronizes",
      "sync_all: the host waits for the time but not for the streams' work (later launches unordered)", ISSUE32_R4),
    M("r4-trt-set-shape-opt-unchecked", "fakegpu/standins/tensorrt_build.py",
      "all(a <= b <= c for a, b, c in zip(mn, op, mx, strict=True))",
      "all(a <= c for a, b, c in zip(mn, op, mx, strict=True))", ("test_rehearsal.py::test_tensorrt_fake_needs_device_pointers_and_stream_order",
       "test_standin_answers.py::test_trt_set_shape_needs_opt_between_min_and_max"),
      "fake TensorRT set_shape: an opt outside [min, max] accepted", ISSUE32_R4),
    M("r4-trt-profile-index-from-one", "fakegpu/standins/tensorrt_build.py", "        return len(profiles) - 1\n",
      "        return len(profiles)\n", ("test_rehearsal.py::test_tensorrt_fake_needs_device_pointers_and_stream_order",
       "test_standin_answers.py::test_trt_profiles_are_numbered_from_zero_and_a_dynamic_input_needs_one"),
      "fake TensorRT add_optimization_profile: profile indices counted from 1", ISSUE32_R4),
    M("r4-trt-dynamic-without-profile-builds", "fakegpu/standins/tensorrt_build.py",
      "            if dynamic and not any(inp[\"name\"] in p for p in profiles):",
      "            if dynamic and profiles and not any(inp[\"name\"] in p for p in profiles):", ("test_rehearsal.py::test_tensorrt_fake_needs_device_pointers_and_stream_order",
       "test_standin_answers.py::test_trt_profiles_are_numbered_from_zero_and_a_dynamic_input_needs_one"),
      "fake TensorRT build: a dynamic input with no profile at all builds", ISSUE32_R4),
    M("r4-trt-fixed-dim-only-above", "fakegpu/standins/tensorrt_build.py",
      "isinstance(f, int) and f > 0 and f != s", "isinstance(f, int) and f > 0 and f < s", ("test_rehearsal.py::test_tensorrt_fake_needs_device_pointers_and_stream_order",
       "test_standin_answers.py::test_trt_a_profile_disagreeing_with_a_fixed_dim_fails_the_build"),
      "fake TensorRT build: a profile narrower than a fixed dim accepted (only wider refused)", ISSUE32_R4),
    M("r4-trt-parser-error-off-by-one", "fakegpu/standins/tensorrt_build.py",
      "        if not 0 <= int(index) < len(errors):", "        if not 0 <= int(index) <= len(errors):", ("test_rehearsal.py::test_tensorrt_fake_needs_device_pointers_and_stream_order",
       "test_standin_answers.py::test_trt_parser_errors_are_indexed_within_their_count"),
      "fake TensorRT get_error: index == num_errors not refused as out of range", ISSUE32_R4),
    M("r4-trt-tf32-default-off", "fakegpu/standins/tensorrt_build.py",
      'st(c).get("flags_set", {"TF32"})', 'st(c).get("flags_set", set())', ("test_rehearsal.py::test_tensorrt_fake_needs_device_pointers_and_stream_order",
       "test_standin_answers.py::test_trt_tf32_is_on_by_default_and_set_clear_flags"),
      "fake TensorRT get_flag: TF32 off on a fresh config (it is on by default)", ISSUE32_R4),
    M("r4-trt-enum-eq-ignores-enum", "fakegpu/standins/tensorrt_surface.py",
      "(other.enum, other.value) == (self.enum, self.value)", "other.value == self.value", ("test_rehearsal.py::test_tensorrt_fake_needs_device_pointers_and_stream_order",
       "test_standin_answers.py::test_trt_enum_members_of_different_enums_differ_and_removed_names_say_so"),
      "fake TensorRT enums: members of different enums with the same value compare equal", ISSUE32_R4),
    M("r4-trt-removed-hint-dropped", "fakegpu/standins/tensorrt_surface.py",
      '            hint = f" ({REMOVED[item]})" if item in REMOVED else ""', '            hint = ""', ("test_rehearsal.py::test_tensorrt_fake_needs_device_pointers_and_stream_order",
       "test_standin_answers.py::test_trt_enum_members_of_different_enums_differ_and_removed_names_say_so"),
      "fake TensorRT enums: a removed member's hint (what replaced it) dropped", ISSUE32_R4),
    M("r4-dispatch-0dim-scalar-refused", "fakegpu/standins/dispatch.py",
      "not isinstance(t, Rehearsed) and t.dim() > 0]", "not isinstance(t, Rehearsed) and t.dim() >= 0]", ("test_rehearsal.py::test_placement_cpu_module_fed_a_cuda_tensor",
       "test_standin_answers.py::test_a_0dim_cpu_scalar_meets_cuda_but_a_cuda_index_into_cpu_does_not"),
      "dispatch placement: a 0-dim CPU scalar meeting a CUDA tensor refused", ISSUE32_R4),
    M("r4-dispatch-cuda-index-into-cpu", "fakegpu/standins/dispatch.py",
      "    if base in _INDEX and args and not isinstance(args[0], Rehearsed):",
      "    if base in _INDEX and args and isinstance(args[0], Rehearsed):", ("test_rehearsal.py::test_placement_cpu_module_fed_a_cuda_tensor",
       "test_standin_answers.py::test_a_0dim_cpu_scalar_meets_cuda_but_a_cuda_index_into_cpu_does_not"),
      "dispatch placement: the CUDA-index-into-CPU check tests the wrong side", ISSUE32_R4),
    M("r4-mode-int-device-not-cuda", "fakegpu/standins/mode.py",
      "    if isinstance(device, int):\n        return True", "    if isinstance(device, int):\n        return False",
      ("test_rehearsal.py::test_cuda_reads_as_a_gpu_and_goes_away",
       "test_standin_answers.py::test_an_int_device_is_cuda_and_pin_batch_pins_nested_tensors"), "CudaMode: device=0 (an int) read as not CUDA", ISSUE32_R4),
    M("r4-mode-pin-batch-dict-unpinned", "fakegpu/standins/mode.py",
      "        return {k: pin_batch(v) for k, v in data.items()}", "        return dict(data)", ("test_rehearsal.py::test_cuda_reads_as_a_gpu_and_goes_away",
       "test_standin_answers.py::test_an_int_device_is_cuda_and_pin_batch_pins_nested_tensors"),
      "pin_batch: a dict batch's tensors left unpinned", ISSUE32_R4),
    M("r4-packages-tuple-provider-ignored", "fakegpu/standins/packages.py",
      "names = [p if isinstance(p, str) else p[0] for p in providers or []]",
      "names = [p for p in providers or []]", ("test_rehearsal.py::test_ort_cuda_provider_options_iobinding_and_graphs",
       "test_standin_answers.py::test_ort_cuda_provider_given_as_a_tuple_is_the_stand_in"),
      "ORT stand-in: a CUDA provider given as (name, options) gets the real CPU session", ISSUE32_R4),
    M("r4-packages-profiler-count-inverted", "fakegpu/standins/packages.py",
      "        if len(cpu_only) != len(wanted):", "        if len(cpu_only) == len(wanted):", ("test_rehearsal.py::test_cuda_reads_as_a_gpu_and_goes_away",
       "test_standin_answers.py::test_the_profiler_stands_in_only_for_the_cuda_activity"),
      "profiler stand-in: counts a dropped CUDA activity when none was asked for", ISSUE32_R4),
    M("r4-iobinding-no-sync", "techniques/onnx_runtime.py",
      "        torch.get_device_module(x.device).synchronize()  # the input must be written before ORT reads it\n",
      "", ("test_rehearsal.py::test_ort_cuda_provider_options_iobinding_and_graphs",
       "test_standin_answers.py::test_iobinding_runner_synchronizes_before_ort_reads_and_reuses_the_output"),
      "ort_iobinding_runner: no synchronize before ORT reads the bound input", ISSUE32_R4),
    M("r4-server-main-not-a-server-accepted", "serve/server_main.py",
      "    if not isinstance(server, ls.LitServer):\n", "    if False:\n",
      ("test_serving.py::test_workers_die_when_the_server_main_process_is_killed",
       "test_standin_answers.py::test_server_main_loads_a_litapi_class_and_refuses_a_target_that_is_not_a_server"),
      "server_main._load_target: a target returning something other than a LitServer accepted", ISSUE32_R4),
    M("r4-server-main-batch-knobs-swapped", "serve/server_main.py",
      "        api = obj(max_batch_size=a.max_batch_size, batch_timeout=a.batch_timeout)",
      "        api = obj(max_batch_size=a.workers_per_device, batch_timeout=a.batch_timeout)",
      ("test_serving.py::test_workers_die_when_the_server_main_process_is_killed",
       "test_standin_answers.py::test_server_main_loads_a_litapi_class_and_refuses_a_target_that_is_not_a_server"),
      "server_main._load_target: a LitAPI class gets workers_per_device as its max_batch_size", ISSUE32_R4),
    # ---------------------------------------------------------------------------------- issue 43: the survivors
    M("r5-optimize-baseline-at-big-batch", "capstone/optimize.py", 'batch_size=b, label="baseline"',
      'batch_size=big, label="baseline"',
      "test_optimize.py::test_the_baseline_is_timed_and_counted_at_the_examples_batch",
      "optimize: the baseline counted at the batching step's batch (8x or 32x its real items/s)", ISSUE43),
    M("r5-calls-seconds-under-ms", "serve/server_watch.py", "{(time.time() - self._t0) * 1000:.3f}",
      "{(time.time() - self._t0):.3f}",
      "test_serving.py::test_the_model_call_record_writes_milliseconds_under_its_ms_label",
      "CallRecorder: the model-call time written in seconds under the 'predict ms' label", ISSUE43),
    M("r5-digits-model-training-mode", "supply/models.py", "    return model.eval().to(device)\n\n\ndef accuracy",
      "    return model.to(device)\n\n\ndef accuracy", "test_data_models.py::test_shipped_digits_models_load_in_eval_mode",
      "load_digits_model: the model left in training mode (BatchNorm uses each batch's statistics)", ISSUE43),
    M("r5-llm-lock-never-taken", "supply/llm.py", "        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)\n",
      "        pass\n", "test_llm_lock.py", "llm._ensure_converted: the conversion lock file opened but never locked",
      ISSUE43),
    # ---------------------------------------------------------------------------------- issue 43 round 5: checks
    M("r5-oom-built-inside-unseen", "course_checks/lesson_exercises/l03.py", "        if built[0] > made:\n",
      "        if built[0] > made + 1:\n", "test_exercises_l03.py::test_a_batch_built_inside_the_timed_call_is_named",
      "03.oom-sweep: a batch built inside the timed call not seen", ISSUE43_R5),
    M("r5-pad-gpu-part-dropped", "course_checks/lesson_exercises/l06.py",
      "        with gpu() as device:\n            serve_on_device(fn, c, device)\n", "",
      "test_exercises_l06.py::test_the_full_check_serves_16_bit_requests_on_the_gpu",
      "06.pad-batch: only CPU float32 requests served (torch.zeros without device=/dtype= passes)", ISSUE43_R5),
    M("r5-pad-dtype-unchecked", "course_checks/lesson_exercises/l06.py", "        if x.dtype != self.dtype:\n",
      "        if False:\n", "test_exercises_l06.py::test_pad_batch_on_the_device_in_16_bits_over_200_seeds",
      "06.pad-batch: a chunk promoted to float32 reaches the 16-bit graph unnamed", ISSUE43_R5),
    M("r5-pad-cpu-padding-unnamed", "course_checks/lesson_exercises/l06.py", '        if "same device" not in str(exc):\n',
      '        if "same device" in str(exc):\n',
      "test_exercises_l06.py::test_pad_batch_on_the_device_in_16_bits_over_200_seeds",
      "06.pad-batch: padding made on the CPU for a GPU request not named", ISSUE43_R5),
    M("r5-fusion-ai-onnx-not-default", "course_checks/lesson_exercises/l07.py",
      '    return "" if d in ("", "ai.onnx") else d\n', "    return d\n",
      "test_exercises_l07.py::test_fusion_accepts_counts_keyed_by_domain_and_op_type",
      "07.fusion: the default domain written 'ai.onnx' taken for another domain", ISSUE43_R5),
    M("r5-fusion-domains-unjudged", "course_checks/lesson_exercises/l07.py",
      '        if qualified == getattr(want, "domains", None):\n', "        if qualified is not None:\n",
      ("test_exercises_l07.py::test_fusion_rejects[domain_keyed_input]",
       "test_exercises_l07.py::test_fusion_rejects[domain_keyed_wrong_domain]"),
      "07.fusion: any domain:op_type counter accepted", ISSUE43_R5),
    M("r5-trt-get-input-past-the-end", "fakegpu/standins/tensorrt_build.py", "        if not 0 <= i < len(io):\n",
      "        if not 0 <= i <= len(io):\n",
      "test_exercises_l08.py::test_the_fake_networks_inputs_and_outputs_are_the_parsed_models",
      "fake TensorRT: network.get_input(num_inputs) raises instead of returning None", ISSUE43_R5),
    M("r5-trt-dynamic-dim-zero", "fakegpu/standins/tensorrt_build.py", 'else -1 for v in d["dims"]]',
      'else 0 for v in d["dims"]]', "test_exercises_l08.py::test_the_fake_networks_inputs_and_outputs_are_the_parsed_models",
      "fake TensorRT: a network input's dynamic dimension reads 0, not -1", ISSUE43_R5),
    M("r5-trt-outputs-are-inputs", "fakegpu/standins/tensorrt_build.py",
      'lambda n, index: io_tensor(n, index, "outputs")', 'lambda n, index: io_tensor(n, index, "inputs")',
      "test_exercises_l08.py::test_the_fake_networks_inputs_and_outputs_are_the_parsed_models",
      "fake TensorRT: network.get_output(i) returns the i-th input", ISSUE43_R5),
    M("r5-pick-gain-within-budget", "course_checks/lesson_exercises/l14.py",
      "        up_drop = -round(budget + c.randint(1, 30) / 1000, 4)\n", "        up_drop = -round(budget / 2, 4)\n",
      "test_exercises_l14.py::test_boundary_picks_are_rejected_on_every_seed[abs-drop]",
      "14.pick: the negative drop drawn within the budget's size (abs(accuracy_drop) passes)", ISSUE43_R5),
    M("r5-pick-score-case-unseparated", "course_checks/lesson_exercises/l14.py",
      "        gap = c.randint(1, math.ceil((top_drop - near_drop) * 100 - 1e-9) - 1) / 100",
      "        gap = math.ceil((top_drop - near_drop) * 100 + 1) / 100",
      "test_exercises_l14.py::test_boundary_picks_are_rejected_on_every_seed[speedup-minus-drop]",
      "14.pick: the slower row's lead in accuracy too small to separate speedup - accuracy_drop", ISSUE43_R5),
    # ---------------------------------------------------------------------------------- round 5: stream guard
    M("r5-guard-bad-json-crashes", "serve/stream_guard.py", "        except ValueError as exc:  # json",
      "        except TypeError as exc:  # json", "test_stream_guard.py",
      "AdmissionGuard: a body that is not JSON (or fails the check) crashes instead of a 422", ISSUE43_R5),
    M("r5-guard-request-id-never-released", "serve/stream_guard.py",
      "                self._streaming.discard(str(rid))", "                pass", "test_stream_guard.py",
      "AdmissionGuard: a request_id stays 'still streaming' (409) after its stream ended", ISSUE43_R5),
    M("r5-guard-finished-stream-cancelled", "serve/stream_guard.py",
      "                state[\"ended\"] = True  # the whole answer went out", "                pass  # the whole answer",
      "test_stream_guard.py", "AdmissionGuard: a client leaving after its whole answer is reported as cancelled",
      ISSUE43_R5),
    M("r5-guard-conn-not-tagged", "serve/stream_guard.py", 'json.dumps({**body, "conn": conn})', "json.dumps(body)",
      "test_stream_guard.py", "AdmissionGuard: the admitted body not tagged with its connection id", ISSUE43_R5),
    M("r5-guard-status-500-allowed", "serve/stream_guard.py", "        if not 400 <= status < 500:",
      "        if not 400 <= status <= 500:", "test_stream_guard.py",
      "AdmissionGuard: a refusal status of 500 (a server error, not the client's) accepted", ISSUE43_R5),
    M("r5-parent-watch-never-waits", "supply/children.py", "    while os.getppid() == parent_pid:",
      "    while os.getppid() != parent_pid:", (
          "test_serving.py::test_server_dies_with_its_parent",
          "test_parallel.py::test_ranks_leave_when_their_starter_is_killed_even_while_they_import_torch",
      ), "wait_for_parent_gone: returns at once while the parent lives, never once it is gone", ISSUE43_R5),
    M("r5-profile-python-negative", "from_lessons/l16_llm_serving.py",
      "    groups[PYTHON_AND_WAITING] = max(0.0, span_ms - sum(groups.values()))",
      "    groups[PYTHON_AND_WAITING] = span_ms - sum(groups.values())",
      "test_llm_serving.py::test_python_time_is_never_negative_when_the_operators_outlast_the_span",
      "profile_groups: Python time below zero when the operators of several threads outlast the span", ISSUE43_R5),
    M("r5-sampling-bool-accepted", "from_lessons/l16_llm_serving.py",
      "        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):",
      "        if not isinstance(value, numbers.Real) or not math.isfinite(value):",
      "test_llm_serving.py::test_check_body_refuses_bad_sampling_settings_naming_the_fix",
      "check_sampling: temperature true (a bool) accepted as 1.0", ISSUE43_R5),
    M("r5-served-seed-dropped", "lessons/16_llm_serving.py", '                                    seed=body.get("seed"))',
      "                                    seed=None)",
      "test_llm_serving.py::test_served_sampling_settings_reach_the_engine_and_the_same_seed_gives_the_same_tokens",
      "the LitServe server drops the body's seed (every sampled request seeded by its id)", ISSUE43_R5),
    M("l17-loopback-check-blind", "lessons/17_beyond_one_device.py",
      "    return address.is_loopback or (mapped is not None and mapped.is_loopback)", "    return True", (
          "test_l17_multinode.py::test_on_loopback",
          "test_l17_multinode.py::test_the_check_flags_every_listener_beyond_loopback_in_any_process_of_the_launch",
      ), "lesson 17's launch check: every address counts as loopback", ISSUE44),
    M("l17-watch-not-recursive", "lessons/17_beyond_one_device.py",
      "now += [agent, *agent.children(recursive=True)]", "now += [agent, *agent.children()]",
      "test_l17_multinode.py::test_the_check_flags_every_listener_beyond_loopback_in_any_process_of_the_launch",
      "lesson 17's launch check misses the agents' grandchildren (the workers' children)", ISSUE44),
    M("l17-worker-outlives-agent", "lessons/17_beyond_one_device.py",
      "ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG", "pass  # PR_SET_PDEATHSIG",
      "test_l17_multinode.py::test_nothing_outlives_an_agent_or_the_notebook_killed_mid_launch",
      "a torchrun worker survives its SIGKILLed agent", ISSUE44),
    M("l17-agent-outlives-notebook", "lessons/17_beyond_one_device.py",
      "        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)\n", "        pass\n",
      "test_l17_multinode.py::test_agents_leave_with_a_notebook_killed_before_the_rendezvous",
      "torchrun agents outlive a notebook killed before the rendezvous", ISSUE44),
    M("l17-no-grace", "lessons/17_beyond_one_device.py",
      "                break  # a node failed and the others still run",
      "                pass  # a node failed and the others still run",
      "test_l17_multinode.py::test_a_node_that_never_joins_the_group_is_stopped_after_the_grace",
      "a failed node leaves the other agents waiting until the launch's timeout", ISSUE44),
    M("r5-ort-sessions-spin", "techniques/onnx_runtime.py",
      '    so.add_session_config_entry("session.intra_op.allow_spinning", "0")\n', "",
      "test_backends.py::test_sessions_do_not_spin_idle_threads",
      "ort_session: idle ORT threads spin and slow the eager calls a comparison interleaves", ISSUE43_R5),
    M("r5-guide-faster-called-not-shown", "capstone/optimizing/report.py",
      '            "faster": f"is faster than the baseline, but not shown {min_gain:.2f}x it",', "",
      "test_optimize_report.py::test_the_guide_names_the_best_paying_technique_first",
      "decision_guide: a technique shown faster (under min_gain) reported as 'not shown faster'", ISSUE43_R5),
    M("r5-tail-too-few-said-same", "measuring/intervals.py", "            return Finding(TOO_FEW,",
      "            return Finding(SAME_TAIL,", "test_verdicts.py",
      "tail_says: two quantiles with no upper end called 'no difference' instead of 'not told apart'", ISSUE43_R5),
]
# fmt: on


def check_snippets(root: Path = ROOT, mutations: list[Mutation] | None = None) -> list[str]:
    """Problems with the mutation list: stale snippets, a mutation that does not compile, missing test files."""
    problems = []
    for m in mutations or MUTATIONS:
        path = root / m.file
        try:
            text = path.read_text(encoding="utf-8")
            mutated = m.apply(text)
            compile(mutated, str(path), "exec")
            if mutated == text:
                problems.append(f"{m.id}: the mutation changes nothing")
        except StaleSnippet as exc:
            problems.append(str(exc))
        except (OSError, SyntaxError) as exc:
            problems.append(f"{m.id}: {type(exc).__name__}: {exc}")
        for t in m.tests:
            file, _, node = t.partition("::")
            if not (root / file).exists():
                problems.append(f"{m.id}: test file {t} does not exist")
            elif node and f"def {node.split('[')[0]}(" not in (root / file).read_text(encoding="utf-8"):
                problems.append(f"{m.id}: no test {t}")  # pytest would exit 4, which would look like a catch
    ids = [m.id for m in mutations or MUTATIONS]
    problems += [f"duplicate id {i}" for i in sorted({i for i in ids if ids.count(i) > 1})]
    return problems


def make_copy() -> Path:
    """A temporary tree: ``course_utils/`` and ``tests/`` copied, every other top-level entry linked."""
    work = Path(tempfile.mkdtemp(prefix="course-mutate-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPIED:
        shutil.copytree(ROOT / name, work / name, ignore=ignore)
    for entry in ROOT.iterdir():
        if entry.name not in COPIED and entry.name not in NOT_LINKED and not entry.name.endswith(".egg-info"):
            (work / entry.name).symlink_to(entry)
    return work


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(work), COURSE_SMOKE="1", MPLBACKEND="agg", PYTHONDONTWRITEBYTECODE="1",
               COURSE_RESULTS_DIR=str(work / "results"))  # fmt: skip
    env.pop("COURSE_STRICT_GPU", None)
    return env


def run_tests(work: Path, tests: tuple[str, ...], timeout: float, *, stop_first: bool = True,
              deselect: tuple[str, ...] = ()) -> tuple[bool, str, float]:  # fmt: skip
    """pytest on ``tests`` in ``work``: (passed, its output, seconds)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]
    cmd += ["-x"] if stop_first else []
    for node in deselect:
        cmd += ["--deselect", node]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=work, env=_env(work), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s", time.perf_counter() - t0
    return out.returncode == 0, (out.stdout + out.stderr).strip(), time.perf_counter() - t0


def failing_nodes(output: str) -> tuple[list[str], list[str]]:
    """(failed test ids, files that failed to collect) from pytest's ``-rfE`` summary."""
    failed, broken = [], []
    for line in output.splitlines():
        if line.startswith("FAILED "):
            failed.append(line[7:].split(" - ")[0].strip())
        elif line.startswith("ERROR "):
            node = line[6:].split(" - ")[0].strip()
            (failed if "::" in node else broken).append(node)
    return failed, broken


def run_mutation(work: Path, m: Mutation, timeout: float, deselect: tuple[str, ...] = (),
                 skip_files: frozenset[str] = frozenset()) -> tuple[bool | None, str, float]:  # fmt: skip
    """Plant ``m`` in the copy, run its tests, restore the file: (caught, last lines of output, seconds).

    ``caught`` is None when none of the mutation's test files can run (they fail to collect unmutated).
    """
    tests = tuple(t for t in m.tests if t.split("::")[0] not in skip_files)
    if not tests:
        return None, "no runnable test file", 0.0
    path = work / m.file
    original = path.read_text(encoding="utf-8")
    try:
        path.write_text(m.apply(original), encoding="utf-8")
        passed, out, secs = run_tests(work, tests, timeout, deselect=deselect)
    finally:
        path.write_text(original, encoding="utf-8")
    first_failure = [line for line in out.splitlines() if line.startswith(("FAILED ", "ERROR "))][:1]
    return not passed, "\n".join(first_failure + out.splitlines()[-1:]), secs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="ID", help="run only these mutations")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--check", action="store_true", help="only check that every snippet is still in the sources")
    ap.add_argument("-v", "--verbose", action="store_true", help="show how each caught mutation failed")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run (not recommended)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per test run (default 300)")
    ap.add_argument("--target", type=float, default=0.8, help="share to catch for exit status 0 (default 0.8)")
    args = ap.parse_args(argv)

    chosen = MUTATIONS
    if args.only:
        unknown = sorted(set(args.only) - {m.id for m in MUTATIONS})
        if unknown:
            ap.error(f"unknown mutation id(s) {unknown}; see --list")
        chosen = [m for m in MUTATIONS if m.id in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.id:32s} {m.file:38s} [{m.source}] {m.what}")
        return 0
    problems = check_snippets(ROOT, chosen)
    if problems:
        print("The mutation list is stale (update scripts/mutate.py):\n  " + "\n  ".join(problems))
        if args.check:
            return 2
        stale = {p.split(":")[0] for p in problems}
        chosen = [m for m in chosen if m.id not in stale]
        print(f"running the other {len(chosen)} mutations")
    elif args.check:
        print(f"all {len(chosen)} mutations apply to the current sources")
        return 0

    work = make_copy()
    try:
        deselect: tuple[str, ...] = ()
        broken: frozenset[str] = frozenset()
        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
            ok, out, secs = run_tests(work, tests, args.timeout * 3, stop_first=False)
            failed, broken_files = failing_nodes(out)
            deselect, broken = tuple(failed), frozenset(broken_files)
            state = "green" if ok else f"{len(failed)} failing test(s), {len(broken_files)} file(s) not collected"
            print(f"baseline: {len(tests)} test files on the unmutated copy: {state} ({secs:.0f} s)")
            for node in [*failed, *broken_files]:
                print(f"  left out of the mutation runs (fails unmutated): {node}")
            if not ok and not failed and not broken_files:
                print(
                    "  " + "\n  ".join(out.splitlines()[-5:]) + "\nThe baseline fails for an unknown reason: stopping."
                )
                return 2
        survivors, unjudged = [], []
        for i, m in enumerate(chosen, 1):
            caught, tail, secs = run_mutation(work, m, args.timeout, deselect, broken)
            mark = "caught  " if caught else "SURVIVED" if caught is False else "no test "
            print(f"[{i:2d}/{len(chosen)}] {mark} {m.id:32s} {secs:5.1f} s  {m.what}", flush=True)
            if args.verbose and caught:
                print("      " + "\n      ".join(line[:150] for line in tail.splitlines()))
            if caught is None:
                unjudged.append(m)
            elif not caught:
                survivors.append(m)
        judged = [m for m in chosen if m not in unjudged]
        caught_n = len(judged) - len(survivors)
        share = caught_n / len(judged) if judged else 0.0
        print(
            f"\ncaught {caught_n}/{len(judged)} ({share:.0%})" + (f"; {len(unjudged)} not judged" if unjudged else "")
        )
        for source in sorted({m.source for m in judged}):
            part = [m for m in judged if m.source == source]
            print(f"  {source}: {sum(m not in survivors for m in part)}/{len(part)}")
        if survivors:
            print("survivors:\n" + "\n".join(f"  {m.id} ({m.file}): {m.what}" for m in survivors))
        return 2 if problems else 0 if share >= args.target else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
