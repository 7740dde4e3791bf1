"""Lesson 17's GPU section (17.nccl-tp): the NCCL path of the same rank code, checked as far as a CPU allows.

The section runs ``l17.World(p, backend="nccl")`` with the tensor-parallel tasks the CPU part runs on gloo (their
results are tested in ``tests/test_parallel.py``). Here: the NCCL names exist in this torch, the rank code puts
each rank on its own GPU *before* joining the group and keeps its tensors on ``cuda:rank``, and the section
checks its tokens against the model's own ``generate`` on the GPU. NCCL itself cannot run without GPUs.
"""

from __future__ import annotations

import inspect

import torch.distributed as dist

from course_utils.from_lessons import l17_beyond_one_device as l17
from tests.gpu_contract.lesson_code import lesson_path

COVERS = {
    "17.nccl-tp": "the rank code's NCCL path (backend name in this torch, torch.cuda.set_device(rank) before "
    "init_process_group, tensors on cuda:rank, collectives timed with CUDA events, GPU tokens checked against "
    "generate); the tasks themselves run on "
    "gloo in tests/test_parallel.py; NCCL itself needs GPUs",
}


def test_nccl_is_a_backend_name_of_this_torch():
    assert dist.Backend.NCCL == "nccl" and hasattr(dist, "is_nccl_available")


def test_each_rank_takes_its_gpu_before_joining():
    src = inspect.getsource(l17.rank_main)
    assert src.index("torch.cuda.set_device(rank)") < src.index("dist.init_process_group(")
    assert 'torch.device("cuda", rank) if backend == "nccl"' in src


def test_the_section_checks_tokens_on_the_gpu():
    text = lesson_path("17").read_text()
    body = text[text.index('cu.gpu_section("17.nccl-tp"') :]
    body = body[: body.index("# %%")]
    assert 'backend="nccl"' in body and "generate(" in body and "assert all(" in body
    assert "copy.deepcopy(tp_model)" in body  # the CPU model is not moved in place


def test_collectives_on_a_gpu_are_timed_with_events_read_after_a_synchronize():
    """On NCCL the call returns once queued: Comm brackets it with CUDA events on the stream and reads them only
    after the step's torch.cuda.synchronize() (the rehearsal's rule for it: tests/test_parallel.py)."""
    timed = inspect.getsource(l17.Comm.timed)
    assert "torch.cuda.Event(enable_timing=True)" in timed and timed.index("if self.cuda") < timed.index("perf_counter")
    step = inspect.getsource(l17.tp_generate)
    assert step.index("torch.cuda.synchronize()") < step.index("comm.settle()") < step.index("step_ms.append")
    sweep = inspect.getsource(l17.allreduce_sweep)
    assert "comm.timed(dist.all_reduce" in sweep and sweep.index("torch.cuda.synchronize()") < sweep.index("settle()")
