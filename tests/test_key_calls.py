"""The lesson is the code: each lesson's key calls (COURSE.md, "The lesson is the code") stand in its
notebook's code cells, not only inside course_utils.

A lesson whose rewrite has not landed yet is listed in PENDING and marked expected-to-fail (strict: once it
passes, it must leave PENDING). Comment lines do not count.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Patterns per lesson (kept in step with ../shared/hooks/key_calls.py).
KEY_CALLS = {
    "00": [
        r"torch\.cuda\.is_available",
        r"get_device_properties|get_device_capability",
        r"get_cpu_capability|parallel_info",
        r"get_available_providers",
    ],
    "01": [
        r"torch\.cuda\.synchronize|\.synchronize\(\)",
        r"torch\.cuda\.Event|Event\(enable_timing",
        r"elapsed_time",
        r"perf_counter",
        r"benchmark\.Timer|utils\.benchmark",
        r"set_num_threads",
    ],
    "02": [
        r"torch\.profiler\.profile|profiler import .*profile|\bprofile\(",
        r"record_function",
        r"export_chrome_trace",
        r"key_averages",
        r"schedule\(",
    ],
    "03": [r"OutOfMemoryError", r"empty_cache", r"inference_mode", r"for \w+ in .*batch"],
    "04": [r"torch\.autocast", r"bfloat16", r"channels_last", r"allow_tf32|fp32_precision", r"\.half\(\)|float16"],
    "05": [
        r"quantize_dynamic",
        r"quantize_\(",
        r"Int8DynamicActivationInt8WeightConfig|Int8WeightOnlyConfig",
        r"prepare_pt2e",
        r"convert_pt2e",
        r"X86InductorQuantizer",
        r"prepare_qat_pt2e",
        r"torch\.export\.export|export\.export\(",
    ],
    "06": [
        r"torch\.compile",
        r"torch\.export\.export|export\.export\(",
        r"CUDAGraph|torch\.cuda\.graph",
        r"torch\.jit\.trace",
        r"mark_dynamic|dynamic=",
        r"explain|TORCH_LOGS|fullgraph",
    ],
    "07": [
        r"torch\.onnx\.export",
        r"InferenceSession",
        r"SessionOptions",
        r"graph_optimization_level",
        r"optimized_model_filepath",
        r"io_binding",
        r"quantize_static|quantize_dynamic",
        r"intra_op_num_threads",
    ],
    "08": [
        r"trt\.Builder|tensorrt\.Builder",
        r"create_network",
        r"OnnxParser",
        r"parse_from_file|\.parse\(",
        r"create_builder_config",
        r"set_memory_pool_limit",
        r"create_optimization_profile",
        r"set_shape",
        r"add_optimization_profile",
        r"build_serialized_network",
        r"deserialize_cuda_engine",
        r"create_execution_context",
        r"set_input_shape",
        r"set_tensor_address",
        r"execute_async_v3",
        r"num_io_tensors|get_tensor_name",
    ],
    "09": [
        r"\bDataset\b",
        r"DataLoader\(",
        r"num_workers",
        r"pin_memory",
        r"non_blocking",
        r"persistent_workers",
        r"decode_jpeg",
    ],
    "10": [
        r"torch\.cuda\.Stream|torch\.Stream|\.Stream\(",
        r"\.stream\(",
        r"wait_stream",
        r"Event\(",
        r"record_stream|wait_event",
        r"pin_memory",
    ],
    "11": [
        r"memory_allocated",
        r"memory_reserved",
        r"max_memory_allocated",
        r"reset_peak_memory_stats",
        r"empty_cache",
        r"inference_mode",
        r"mem_get_info|memory_summary",
    ],
    "12": [
        r"l1_unstructured|global_unstructured",
        r"prune\.remove",
        r"ln_structured",
        r"kl_div|KLDivLoss",
        r"sparsify_",
        r"apply_fake_sparsity",
    ],
    "13": [
        r"LitAPI",
        r"LitServer",
        r"max_batch_size",
        r"batch_timeout",
        r"def batch|def unbatch",
        r"model_config_pb2|text_format",
    ],
    "14": [
        r"torch\.compile",
        r"autocast|bfloat16",
        r"InferenceSession|onnx\.export",
        r"quantize_\(|quantize_dynamic",
        r"profile",
    ],
    "15": [
        r"from_pretrained\([^)]*gguf_file=",
        r"\bcache=",
        r"DynamicCache\(",
        r"StaticCache\(",
        r"scaled_dot_product_attention\(",
        r"sdpa_kernel\(",
        r"torch\.compile\(",
        r"quantize_\(",
        r"Int8WeightOnlyConfig\(|Int4WeightOnlyConfig\(",
    ],
    "16": [
        r"waiting\.pop\(0\)|\.popleft\(",
        r"\.release\(",
        r"\byield\b",
        r"tables\[",
        r"pos // self\.block_size",
        r"heappop\(self\.free\)|self\.free\.pop\(",
        r"token_budget",
        r"def preempt\(|\.preempt\(",
        r"match_prefix\(",
        r"copy-on-write|\.copies \+= 1",
        r"ContinuousBatchingLoop",
        r"def step\(self, prev_outputs\)",
        r"lookup_draft\(",
        r"\.truncate\(",
        r"\"vllm\",\s*\"serve\"",
        r"\"vllm\",\s*\"bench\",\s*\"serve\"",
    ],
    "17": [
        r"init_process_group",
        r"all_reduce",
        r"destroy_process_group",
        r"multiprocessing|torchrun|mp\.spawn",
        r"(?i)row.?parallel|RowParallel",
        r"(?i)column.?parallel|ColumnParallel",
        r"tensor-parallel-size",
    ],
}

# Lessons whose rewrite has not landed: expected to fail until then (remove a line when its lesson passes).
PENDING: set[str] = set()  # every rewrite has landed


def code_lines(lesson: str) -> str:
    """The code cells of ``notebooks/NN_*.ipynb``."""
    (path,) = sorted((ROOT / "notebooks").glob(f"{lesson}_*.ipynb"))
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def missing_calls(lesson: str, code: str | None = None) -> list[str]:
    """The key-call patterns of ``lesson`` not found in its code cells (comment lines do not count)."""
    code = code_lines(lesson) if code is None else code
    code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith("#"))
    return [p for p in KEY_CALLS[lesson] if not re.search(p, code)]


@pytest.mark.parametrize(
    "lesson",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="rewrite pending")) if n in PENDING else n
        for n in sorted(KEY_CALLS)
    ],
)
def test_key_calls_stand_in_the_lesson(lesson):
    missing = missing_calls(lesson)
    print(f"lesson {lesson}: {len(KEY_CALLS[lesson]) - len(missing)}/{len(KEY_CALLS[lesson])} key calls in its cells")
    assert not missing, f"lesson {lesson}: key calls not in its code cells: {missing}"


def test_missing_calls_detects_absent_and_commented_calls():
    assert missing_calls("00", "x = 1\n# torch.cuda.is_available()") == KEY_CALLS["00"]
    full = "torch.cuda.is_available()\ntorch.cuda.get_device_capability()\ntorch.backends.cpu.get_cpu_capability()\n"
    assert missing_calls("00", full) == [r"get_available_providers"]
