"""Lesson 16's vLLM command lines use only flags and values that vLLM's own argument parsers accept.

vLLM does not install on a CPU machine, and its wheel (336 MB) cannot be read in CI. The flag lists in
``vllm_0_33_cli.json`` were read from vLLM 0.33.0's real parsers, built from its wheel's source on a CPU machine
(Dec 2026): ``pip download --no-deps vllm==0.33.0``, the wheel's ``vllm/`` Python files put on ``sys.path`` with
a few small dependencies installed beside them (cbor2, msgspec, pybase64, cachetools, py-cpuinfo, openai,
openai-harmony, aiohttp) and four optional ones stubbed (partial_json_parser, xgrammar, llguidance, einops),
``VLLM_TARGET_DEVICE=cpu``; then ``make_arg_parser(FlexibleArgumentParser())`` from
``vllm.entrypoints.common.cli_args`` (``vllm serve``) and ``vllm.benchmarks.serve.add_cli_args`` (``vllm bench
serve``), every option string of every action, and the choices of ``--dataset-name`` and ``--backend``. The
lesson's exact command lines were also parsed by those parsers then (``parse_args``: accepted, with
``enable_prefix_caching`` True/False and ``enable_chunked_prefill`` True). Regenerate the file for a new vLLM.
In vLLM's V1 engine both are on by default (``vllm/config/scheduler.py``: ``enable_chunked_prefill = True``;
``vllm/config/cache.py``: ``enable_prefix_caching = True``), so the lesson passes only ``--max-num-batched-tokens``
and ``--disable-prefix-caching`` for the run without caching; vLLM requires the token budget to be at least
``--max-num-seqs``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "16.vllm": "`vllm serve`/`vllm bench serve` command lines: every flag and choice against vLLM 0.33.0's own "
    "argument parsers (read from its wheel); API-checked only, vLLM does not install on CPU",
}

CLI = json.loads((Path(__file__).parent / "vllm_0_33_cli.json").read_text())


@pytest.fixture(scope="module")
def commands():
    ns = lesson_namespace("16", dataclass=dataclass, field=field, **{"__name__": __name__})
    return [
        ns["vllm_commands"]("/models/smollm2", 8016, prefix_caching=c, num_prompts=200, rate=16, result_dir="/tmp/x")
        for c in (False, True)
    ]


def flags(cmd):
    return [a for a in cmd if a.startswith("--")]


def value(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def test_serve_flags_exist_in_vllm(commands):
    for serve, _ in commands:
        assert serve[:3] == ["vllm", "serve", "/models/smollm2"]
        unknown = [f for f in flags(serve) if f not in CLI["serve_flags"]]
        assert not unknown, f"flags vLLM {CLI['vllm']}'s `vllm serve` does not accept: {unknown}"
        assert value(serve, "--host") == "127.0.0.1"
    # vLLM's V1 engine has chunked prefill and prefix caching on by default: the lesson sets only the token budget
    # and turns caching off for the comparison (the flag vLLM 0.33 accepts for that: --disable-prefix-caching)
    assert "--disable-prefix-caching" in commands[0][0] and "--disable-prefix-caching" not in commands[1][0]
    assert all(
        "--enable-chunked-prefill" not in serve and "--enable-prefix-caching" not in serve for serve, _ in commands
    )
    assert all(
        int(value(serve, "--max-num-batched-tokens")) >= int(value(serve, "--max-num-seqs")) for serve, _ in commands
    )


def test_bench_flags_and_choices_exist_in_vllm(commands):
    for _, bench in commands:
        assert bench[:3] == ["vllm", "bench", "serve"]
        unknown = [f for f in flags(bench) if f not in CLI["bench_serve_flags"]]
        assert not unknown, f"flags vLLM {CLI['vllm']}'s `vllm bench serve` does not accept: {unknown}"
        for flag in ("--dataset-name", "--backend"):
            assert value(bench, flag) in CLI["bench_serve_choices"][flag], flag
        assert value(bench, "--base-url").startswith("http://127.0.0.1:")


def test_the_flag_list_catches_a_misspelling():
    assert "--enable-prefix-caching" in CLI["serve_flags"]
    assert "--enable-prefix-cache" not in CLI["serve_flags"]
    assert "--request-rate" in CLI["bench_serve_flags"] and "--rate" not in CLI["bench_serve_flags"]
    assert len(CLI["serve_flags"]) > 300 and len(CLI["bench_serve_flags"]) > 80
