"""The rehearsal's stand-ins enforce what CUDA enforces: each rule, one right use and one planted mistake.

Also: every lesson's GPU section body lies within one cell (completion is decided per cell), and a section's
record says completed / failed / not-rehearsable only when its cell ends.
"""

from __future__ import annotations

import ast
import json

import numpy as np
import pytest
import torch

from course_utils.sections import gpu_sections
from course_utils.supply import modes
from fakegpu.standins import rehearsal
from fakegpu.standins.tensor import RehearsalError
from scripts import run_cells
from scripts.gpu_levels import ROOT

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the rehearsal stands in for a missing GPU")


def test_cuda_reads_as_a_gpu_and_goes_away(gpu):
    x = torch.ones(3, device="cuda")
    assert x.is_cuda and x.device == torch.device("cuda", 0) and gpu.is_available()
    assert gpu.get_device_capability() == (9, 0) and "stand-in" in gpu.get_device_name(0)
    assert float(x.sum()) == 3.0 and x.cpu().device.type == "cpu"
    with pytest.raises(TypeError, match="Tensor.cpu"):
        x.numpy()
    rehearsal.deactivate()
    assert not torch.cuda.is_available()


def test_placement_cpu_module_fed_a_cuda_tensor(gpu):
    lin = torch.nn.Linear(4, 2)
    x = torch.randn(3, 4)
    with pytest.raises(RehearsalError, match="Expected all tensors to be on the same device"):
        lin(x.cuda())
    model = lin.to("cuda")
    assert all(p.is_cuda and not p.requires_grad for p in model.parameters())
    with torch.inference_mode():
        torch.testing.assert_close(
            model(x.cuda()).cpu(), torch.nn.functional.linear(x, lin.weight.cpu(), lin.bias.cpu())
        )
    with pytest.raises(RehearsalError, match="same device"):
        model(x)
    assert rehearsal.checks()["placement violations"] == 2


def test_stream_order_missing_wait(gpu):
    side = gpu.Stream()
    a = torch.randn(64, device="cuda")
    with gpu.stream(side), pytest.raises(RehearsalError, match="stream order.*wait_stream"):
        a * 2  # the side stream reads what the default stream wrote, with no wait
    side.wait_stream(gpu.current_stream())
    with gpu.stream(side):
        b = a * 2
    with pytest.raises(RehearsalError, match="stream order"):
        b + 1  # back on the default stream, before waiting for the side stream
    gpu.current_stream().wait_stream(side)
    assert float((b + 1).sum()) == pytest.approx(float((a * 2 + 1).sum()))


def test_record_stream_missing_is_caught_at_reuse(gpu):
    side, main = gpu.Stream(), gpu.current_stream()
    for record in (True, False):
        side.wait_stream(main)
        with gpu.stream(side):
            x = torch.ones(1 << 16).pin_memory().to("cuda", non_blocking=True)  # allocated on the side stream
        main.wait_stream(side)
        if record:
            x.record_stream(main)
        y = x * 2  # used on the main stream
        del x
        with gpu.stream(side):
            if record:
                z = torch.empty(1 << 16, device="cuda")  # may reuse the block: fine, it was recorded
            else:
                with pytest.raises(RehearsalError, match="record_stream"):
                    for _ in range(50):  # the allocator hands the block out again sooner or later
                        z = torch.empty(1 << 16, device="cuda")
                        z.fill_(1.0)
        del y


def test_event_timing_needs_completion_and_enable_timing(gpu):
    start, end = gpu.Event(enable_timing=True), gpu.Event(enable_timing=True)
    start.record()
    torch.randn(256, 256, device="cuda").sum()
    end.record()
    with pytest.raises(RehearsalError, match="device not ready"):
        start.elapsed_time(end)
    end.synchronize()
    assert start.elapsed_time(end) >= 0
    with pytest.raises(RuntimeError, match="enable_timing"):
        gpu.Event().elapsed_time(end)


def test_cuda_graph_rules_and_replay(gpu):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval().cuda()
    static_in = torch.randn(2, 8, device="cuda")
    with torch.inference_mode():
        g = gpu.CUDAGraph()
        with pytest.raises(RehearsalError, match="never ran on a side stream"), gpu.graph(g):
            model(static_in)  # no warm-up
        side = gpu.Stream()
        side.wait_stream(gpu.current_stream())
        with gpu.stream(side):
            model(static_in)
        gpu.current_stream().wait_stream(side)
        with pytest.raises(RehearsalError, match="capturing.*host read"), gpu.graph(gpu.CUDAGraph()):
            model(static_in).sum().item()
        with pytest.raises(RehearsalError, match="capturing.*synchronize"), gpu.graph(gpu.CUDAGraph()):
            gpu.synchronize()
        with pytest.raises(RehearsalError, match="non-default stream"):
            gpu.CUDAGraph().capture_begin()
        g = gpu.CUDAGraph()
        with gpu.graph(g):
            static_out = model(static_in)
        for _ in range(2):
            x = torch.randn(2, 8, device="cuda")
            static_in.copy_(x)
            g.replay()
            torch.testing.assert_close(static_out.cpu(), model(x).cpu())  # replay overwrote the static output


def test_memory_counters_follow_live_tensors(gpu):
    gpu.reset_peak_memory_stats()
    before = gpu.memory_allocated()
    t = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
    assert gpu.memory_allocated() - before == 4 << 20
    del t
    assert gpu.memory_allocated() == before and gpu.max_memory_allocated() >= before + (4 << 20)
    assert gpu.memory_reserved() >= before + (4 << 20)  # cached until empty_cache
    gpu.empty_cache()
    free, total = gpu.mem_get_info()
    assert 0 < free <= total == gpu.get_device_properties(0).total_memory
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(total + 1, dtype=torch.uint8, device="cuda")


def test_mem_get_info_is_free_then_total_and_empty_cache_synchronizes(gpu):
    t = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")
    free, total = gpu.mem_get_info()
    assert total == gpu.get_device_properties(0).total_memory
    assert free == total - gpu.memory_reserved() and free <= total - (4 << 20)
    del t
    side = gpu.Stream()
    side.wait_stream(gpu.current_stream())
    with gpu.stream(side):
        b = torch.ones(8, device="cuda") * 2
    before = rehearsal.checks().get("synchronizations", 0)
    gpu.empty_cache()  # the caching allocator synchronizes the device before it frees its blocks
    assert rehearsal.checks()["synchronizations"] == before + 1
    assert float((b + 1).sum()) == 24.0  # so the default stream may read the side stream's result
    with pytest.raises(RehearsalError, match="capturing.*empty_cache"), gpu.graph(gpu.CUDAGraph()):
        gpu.empty_cache()
    with gpu.stream(side):
        c = b * 3
    gpu.synchronize()  # the host waits for every stream: what it launches next comes after the side stream's work
    assert float((c + 1).sum()) == 56.0


def test_not_rehearsable_only_for_named_gpu_only_kernels(gpu):
    with pytest.raises(rehearsal.NotRehearsable, match="torch.compile/Inductor.*GPU-only kernel"):
        torch.compile(torch.nn.Linear(2, 2))
    w = torch.randn(64, 64, device="cuda")
    with pytest.raises(rehearsal.NotRehearsable, match="2:4 semi-structured sparse.*GPU-only kernel"):
        torch._cslt_compress(w)
    with pytest.raises(RehearsalError, match="no stand-in in the rehearsal .a gap of the stand-in"):
        gpu.make_graphed_callables(torch.nn.Linear(2, 2), (w[:2, :2],))


class _Lin(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _onnx(tmp_path):
    model = _Lin().eval()
    path = tmp_path / "m.onnx"
    torch.onnx.export(
        model,
        (torch.randn(2, 4),),
        path,
        dynamo=True,
        dynamic_shapes={"x": {0: "batch"}},
        input_names=["x"],
        output_names=["y"],
        external_data=False,
        verbose=False,
    )
    return model, path


def _bind(sess, x, out):
    io = sess.io_binding()
    io.bind_input("x", "cuda", 0, np.float32, tuple(x.shape), x.data_ptr())
    io.bind_output("y", "cuda", 0, np.float32, tuple(out.shape), out.data_ptr())
    sess.run_with_iobinding(io)
    return out


def test_ort_cuda_provider_options_iobinding_and_graphs(gpu, tmp_path):
    import onnxruntime as ort

    model, path = _onnx(tmp_path)
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with pytest.raises(RehearsalError, match="Unknown provider option"):
        ort.InferenceSession(str(path), providers=cuda, provider_options=[{"use_tf_32": 1}, {}])
    with pytest.raises(RehearsalError, match="cudnn_conv_algo_search"):
        ort.InferenceSession(str(path), providers=cuda, provider_options=[{"cudnn_conv_algo_search": "FAST"}, {}])
    sess = ort.InferenceSession(str(path), providers=cuda, provider_options=[{"use_tf32": 0}, {}])
    assert sess.get_providers()[0] == "CUDAExecutionProvider"
    x, out = torch.randn(2, 4, device="cuda"), torch.empty(2, 3, device="cuda")
    gpu.synchronize()  # ORT runs on its own stream: what torch wrote must be finished
    with torch.inference_mode():
        torch.testing.assert_close(_bind(sess, x, out).cpu(), model(x.cpu()))
    host = torch.randn(2, 4)
    with pytest.raises(RehearsalError, match="not a live CUDA buffer"):
        _bind(sess, host, out)  # a host pointer bound as CUDA memory
    graphed = ort.InferenceSession(str(path), providers=cuda, provider_options=[{"enable_cuda_graph": "1"}, {}])
    _bind(graphed, x, out)
    _bind(graphed, x, out)  # same shapes and addresses: replay is right
    x16, out16 = torch.randn(16, 4, device="cuda"), torch.empty(16, 3, device="cuda")
    gpu.synchronize()
    with pytest.raises(RehearsalError, match="ORT CUDA graph.*one session per input shape"):
        _bind(graphed, x16, out16)


def test_tensorrt_fake_needs_device_pointers_and_stream_order(gpu, tmp_path):
    from fakegpu.standins.tensorrt import fake_from_snapshot

    trt = fake_from_snapshot(device_pointers=True)
    model, path = _onnx(tmp_path)
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, trt.Logger(trt.Logger.WARNING))
    assert parser.parse_from_file(str(path))
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 4), (2, 4), (4, 4))
    config.add_optimization_profile(profile)
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(
        builder.build_serialized_network(network, config)
    )
    ctx = engine.create_execution_context()
    assert ctx.set_input_shape("x", (2, 4))
    x, y = torch.randn(2, 4, device="cuda"), torch.empty(2, 3, device="cuda")
    with pytest.raises(RuntimeError, match="not .* of live CUDA memory"):
        ctx.set_tensor_address("x", torch.randn(2, 4).data_ptr())  # a host pointer
    ctx.set_tensor_address("x", x.data_ptr())
    ctx.set_tensor_address("y", y.data_ptr())
    stream = gpu.Stream()
    with pytest.raises(RehearsalError, match="stream order.*TensorRT execute_async_v3 input 'x'"):
        ctx.execute_async_v3(stream.cuda_stream)  # x was written on the default stream: no wait_stream
    stream.wait_stream(gpu.current_stream())
    assert ctx.execute_async_v3(stream.cuda_stream)
    gpu.current_stream().wait_stream(stream)
    with torch.inference_mode():
        torch.testing.assert_close(y.cpu(), model(x.cpu()))


def test_section_records_completion_and_failure(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("COURSE_REHEARSE", "1")
    monkeypatch.setattr(gpu_sections, "_HOOKS", {})
    lesson = tmp_path / "50_demo.py"
    lesson.write_text(
        "# %%\nimport torch\nimport course_utils as cu\n"
        "# %%\nif cu.gpu_section('50.ok'):\n    x = torch.ones(2, device='cuda')\n    assert float(x.sum()) == 2\n"
        "# %%\nif cu.gpu_section('50.compile'):\n    torch.compile(torch.nn.Linear(2, 2))\n"
        "# %%\nif cu.gpu_section('50.bad'):\n    torch.nn.Linear(2, 2)(torch.ones(1, 2, device='cuda'))\n"
        "# %%\nprint('never reached')\n"
    )
    assert run_cells.run(lesson) == 1
    rows = {r["section"]: r for r in modes.read_sections()}
    assert rows["50.ok"]["status"] == "completed" and rows["50.ok"]["ran"] and rows["50.ok"]["mode"] == "rehearsal"
    assert rows["50.ok"]["checks"]["placement checks"] >= 1
    assert rows["50.compile"]["status"] == "not-rehearsable" and "torch.compile" in rows["50.compile"]["reason"]
    assert rows["50.bad"]["status"] == "failed" and not rows["50.bad"]["ran"]
    assert rows["50.bad"]["reason"].startswith("RehearsalError: Expected all tensors to be on the same device")
    raw = [r["status"] for r in modes.read_sections(raw=True) if r["section"] == "50.ok"]
    assert raw == ["entered", "completed"]
    assert "never reached" not in capsys.readouterr().out
    assert not rehearsal.active() and not torch.cuda.is_available()


def test_a_gap_of_the_stand_in_fails_the_section(monkeypatch, tmp_path):
    """A call the stand-ins do not model is a failure to fix in the stand-ins, never "not rehearsable"."""
    monkeypatch.setenv("COURSE_REHEARSE", "1")
    monkeypatch.setattr(gpu_sections, "_HOOKS", {})
    lesson = tmp_path / "51_gap.py"
    lesson.write_text("# %%\nimport torch\nimport course_utils as cu\n"
                      "# %%\nif cu.gpu_section('51.gap'):\n    torch.cuda.get_rng_state()\n")  # fmt: skip
    assert run_cells.run(lesson) == 1
    row = modes.read_sections()[-1]
    assert row["section"] == "51.gap" and row["status"] == "failed" and "gap of the stand-in" in row["reason"]


def _gpu_cells(path):
    for start, source in run_cells.cells(path.read_text()):
        if "gpu_section(" in source:
            yield start, source


@pytest.mark.parametrize("lesson", sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py")), ids=lambda p: p.stem)
def test_every_gpu_section_body_lies_within_one_cell(lesson):
    """Completion is decided when a cell ends: an ``if gpu_section(...):`` block must end in its own cell."""
    for start, source in _gpu_cells(lesson):
        tree = ast.parse(source)  # a body continued in the next cell would not parse alone
        tests = [n for n in ast.walk(tree) if isinstance(n, ast.If) and "gpu_section(" in ast.unparse(n.test)]
        assert tests, f"{lesson.name}:{start}: gpu_section(...) must be the condition of an `if` in its cell"
        for node in tests:
            assert node in tree.body, f"{lesson.name}:{start + node.lineno - 1}: the gpu_section `if` must be top-level"
            assert isinstance(node.test, ast.Call), (  # `gpu_section(...) and x` records a body that may never run
                f"{lesson.name}:{start + node.lineno - 1}: the `if` must be the gpu_section call alone; put other "
                "conditions in requires={...}, so a body that cannot run is skipped, never recorded completed"
            )


def test_plain_script_run_settles_sections_at_the_next_one(monkeypatch, tmp_path):
    """Without the cell runner, reaching the next section means the previous body completed."""
    monkeypatch.setattr(gpu_sections, "_HOOKS", {"installed": True})  # no atexit/excepthook inside pytest
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Fake GPU")
    assert gpu_sections.gpu_section("99.first") and gpu_sections.gpu_section("99.second")
    rows = [json.loads(line) for line in modes.sections_file().read_text().splitlines()]
    assert [(r["section"], r["status"]) for r in rows] == [
        ("99.first", "entered"),
        ("99.first", "completed"),
        ("99.second", "entered"),
    ]
    gpu_sections.finish_cell(False, ValueError("boom\nmore"))
    assert modes.read_sections()[-1] == {**modes.read_sections()[-1], "status": "failed", "reason": "ValueError: boom"}
