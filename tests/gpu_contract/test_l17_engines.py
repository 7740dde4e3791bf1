"""Lesson 17's engine configurations use only what the engines' own parsers accept.

* ``vllm serve`` command lines (tensor, pipeline and data parallel): every flag against vLLM 0.33.0's argument
  parsers (``vllm_0_33_cli.json``, read from its wheel; see ``test_l16_vllm_flags.py``).
* The Ray Serve LLM deployment: its fields against Ray 2.60's ``LLMConfig`` (``ray_2_60_llm_config.json``: read
  from the ray wheel on a CPU machine, Dec 2026, where ``ray.llm._internal.serve.core.configs.llm_config.LLMConfig``
  imports without vLLM; the lesson's exact config was validated there by ``LLMConfig.model_validate``). Ray is not
  started: its head contacts cloud metadata addresses. Its ``engine_kwargs`` are vLLM's engine arguments.
* Triton's vLLM backend: ``config.pbtxt`` parsed by Triton's own ``ModelConfig`` protobuf, ``model.json`` keys
  against vLLM's engine arguments.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gpu_contract.lesson_code import lesson_namespace

# No GPU section of its own: the engines' commands are printed, not run (see test_l17_nccl.py for 17.nccl-tp).
HERE = Path(__file__).parent
CLI = json.loads((HERE / "vllm_0_33_cli.json").read_text())
RAY = json.loads((HERE / "ray_2_60_llm_config.json").read_text())


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("17")


def engine_flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def flags(cmd):
    return [a for a in cmd if a.startswith("--")]


@pytest.mark.parametrize("split", [dict(tp=2), dict(tp=8, pp=2, backend="ray"), dict(dp=4)])
def test_vllm_parallel_flags_exist_in_vllm(ns, split):
    cmd = ns["vllm_parallel_command"]("/models/smollm2", 8017, **split)
    assert cmd[:3] == ["vllm", "serve", "/models/smollm2"]
    unknown = [f for f in flags(cmd) if f not in CLI["serve_flags"]]
    assert not unknown, f"flags vLLM {CLI['vllm']} does not accept: {unknown}"
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    for flag, key in (
        ("--tensor-parallel-size", "tp"),
        ("--pipeline-parallel-size", "pp"),
        ("--data-parallel-size", "dp"),
    ):
        assert cmd[cmd.index(flag) + 1] == str(split.get(key, 1))


def test_ray_llm_config_fields_exist_in_ray(ns):
    config = ns["ray_llm_config"]("/models/smollm2", tp=2, pp=1, min_replicas=1, max_replicas=4)
    assert set(config) <= set(RAY["llm_config_fields"]), set(config) - set(RAY["llm_config_fields"])
    assert set(config["model_loading_config"]) <= set(RAY["model_loading_config_fields"])
    assert set(config["deployment_config"]) <= set(RAY["deployment_config_fields"])
    assert set(config["deployment_config"]["autoscaling_config"]) <= set(RAY["autoscaling_config_fields"])
    assert config["accelerator_type"] in RAY["accelerator_types"]
    unknown = [k for k in config["engine_kwargs"] if engine_flag(k) not in CLI["serve_flags"]]
    assert not unknown, f"engine_kwargs that are not vLLM engine arguments: {unknown}"


def test_triton_vllm_backend_config_parses(ns):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    pbtxt, engine = ns["triton_vllm_model"]("/models/smollm2", tp=2)
    parsed = text_format.Parse(pbtxt, model_config_pb2.ModelConfig())
    assert parsed.backend == "vllm" and parsed.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_MODEL
    unknown = [k for k in engine if k != "model" and engine_flag(k) not in CLI["serve_flags"]]
    assert not unknown, f"model.json keys that are not vLLM engine arguments: {unknown}"
    with pytest.raises(text_format.ParseError):
        text_format.Parse(pbtxt.replace("backend", "backnd"), model_config_pb2.ModelConfig())


def test_the_snapshots_catch_a_misspelling():
    assert "--tensor-parallel-size" in CLI["serve_flags"] and "--tensor-parallel" not in CLI["serve_flags"]
    assert (
        "autoscaling_config" in RAY["deployment_config_fields"] and "num_replica" not in RAY["deployment_config_fields"]
    )
    assert "model_id" in RAY["model_loading_config_fields"] and "H100" in RAY["accelerator_types"]


def test_the_multi_node_flags_the_lesson_names_exist_in_vllm():
    from tests.gpu_contract.lesson_code import lesson_path

    text = lesson_path("17").read_text()
    for flag in ("--nnodes", "--node-rank", "--headless", "--enable-expert-parallel"):
        assert flag in text and flag in CLI["serve_flags"], flag
