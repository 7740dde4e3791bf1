"""The floors pyproject.toml declares are versions the code works with: lesson 15's decode loops under transformers'
floor, from an overlay (``scripts/floors.py``; ``make test`` builds it from the package index, ~10 s once).

transformers 5.17 took the KV cache as ``past_key_values=`` and swallowed an unknown ``cache=`` silently (no
cache, other tokens than ``generate``); its ``StaticCache`` has no ``crop`` and its ``QuantizedCache`` no fp8
backend. The floor run repeats, in a process that imports the overlay's transformers, the tests that drive the
lesson's own loops (its cells tagged "contract") against ``generate`` and the two version shims of
``cu.llm``, plus the 15.kv-decode checker on its reference answer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import floors

ROOT = Path(__file__).resolve().parents[1]
# Each drives lesson 15's loops, or cu.llm's version shims, on a 2-layer model of SmolLM2's shape.
FLOOR_TESTS = [
    "tests/gpu_contract/test_l15_decode.py::test_every_loop_matches_generate",
    "tests/gpu_contract/test_l15_decode.py::test_bf16_batch_with_left_padding_matches_batched_generate",
    "tests/gpu_contract/test_l15_decode.py::test_hand_forward_logits_match_the_model",
    "tests/gpu_contract/test_l15_decode.py::test_decode_step_fn_decodes_at_the_same_position",
    "tests/test_llm_decoding.py::test_paired_decode_runs_both_loops_and_matches_generate",
    "tests/test_llm.py::test_cache_arg_reaches_the_installed_transformers_cache",
    "tests/test_llm.py::test_crop_cache_forgets_the_last_token_and_the_next_step_overwrites_it",
    "tests/test_version_floors.py::test_the_kv_decode_checker_accepts_its_reference",
]


def test_floor_is_parsed_from_pyproject(tmp_path):
    py = tmp_path / "pyproject.toml"
    py.write_text('[project]\ndependencies = ["torch==2.14.1", "transformers>=5.17,<6", "gguf>=0.19"]\n')
    assert floors.floor("transformers", py) == "5.17" and floors.floor("gguf", py) == "0.19"
    assert floors.exact("5.17") == "5.17.0" and floors.exact("5.17.1") == "5.17.1" and floors.exact("1") == "1.0.0"
    with pytest.raises(LookupError, match="no floor `torch>=X`"):
        floors.floor("torch", py)


def test_an_overlay_that_cannot_be_built_leaves_its_reason_for_the_skip(tmp_path, monkeypatch, capsys):
    """No index (pip fails) or offline set-up: build never fails, it records why; the floor test skips with it."""
    monkeypatch.setattr(floors, "FLOORS_DIR", tmp_path / "floors")
    failed = subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found for transformers==5.17.0")
    monkeypatch.setattr(floors, "_pip_target", lambda folder, specs: failed)
    assert floors.main(["build"]) == 0
    reason = floors.not_built_reason()
    assert reason.startswith("pip could not install transformers==") and "No matching distribution" in reason
    assert "tests/test_version_floors.py skips" in capsys.readouterr().out
    assert not list((tmp_path / "floors").glob("transformers-*"))  # no half-built overlay left
    assert floors.main(["build", "--offline"]) == 0
    assert "not built, set-up is offline (a wheelhouse)" in floors.not_built_reason()
    with pytest.raises(pytest.skip.Exception, match="set-up is offline"):
        test_transformers_floor_decodes_token_identical_to_generate()


def test_the_kv_decode_checker_accepts_its_reference():
    """Run in the floor's process too: lesson 15's checkers accept their references with that transformers (their
    reference loop and the real caches they measure pass the cache under its keyword) and still reject a loop
    that never hands the model its cache."""
    import torch

    from course_checks import exercises

    def no_cache(model, ids, n):
        new = []
        with torch.inference_mode():
            logits = model(ids).logits
            for _ in range(n):
                new.append(logits[:, -1:].argmax(-1))
                logits = model(new[-1]).logits
        return torch.cat(new, dim=1)

    for key in ("15.kv-decode", "15.kv-memory"):
        assert exercises.verdict(key, exercises.get(key).solution, seed=1) == "accepted", key
    assert "no cache reached the model" in exercises.verdict("15.kv-decode", no_cache, seed=1)


def test_transformers_floor_decodes_token_identical_to_generate():
    if os.environ.get("COURSE_FLOOR_RUN"):
        pytest.skip("this is the floor run itself")
    folder = floors.overlay_path("transformers")
    version = floors.exact(floors.floor("transformers"))
    if not (folder / floors.DONE).is_file():
        why = floors.not_built_reason() or "`make test` or `python -m scripts.floors build` builds it"
        pytest.skip(f"no overlay of transformers {version} in {folder}: {why}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(ROOT)]), COURSE_FLOOR_RUN="1")
    env.pop("PYTEST_XDIST_WORKER", None)
    probe = subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"],
                           env=env, capture_output=True, text=True, cwd=ROOT, timeout=120)  # fmt: skip
    assert probe.stdout.strip() == version, f"the overlay did not load: {probe.stdout}{probe.stderr[-2000:]}"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FLOOR_TESTS],
                         env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)  # fmt: skip
    tail = (run.stdout + run.stderr)[-3000:]
    assert run.returncode == 0, f"under transformers {version} (the floor):\n{tail}"
    summary = run.stdout.strip().splitlines()[-1]
    assert f"{len(FLOOR_TESTS) + 1} passed" in summary and "skipped" not in summary, tail  # crop_cache: 2 cases
