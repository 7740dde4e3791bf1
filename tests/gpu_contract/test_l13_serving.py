"""Lesson 13's GPU section runs the lesson's own `load_server` against a server started with `accelerator="cuda"`.

On CPU CI the same function (executed from the lesson's tagged cell) drives a served LitAPI with
`accelerator="cpu"`: the server start, the closed- and open-loop load and the model-call record are the code the
GPU section runs; only the accelerator string differs.
"""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest
import torch

from course_utils.serve import load_generator, server_process
from tests.gpu_contract.lesson_code import lesson_namespace

COVERS = {
    "13.serve-gpu": "load_server (the lesson's cell) against a LitServe server, closed and open loop, call record"
}

API = textwrap.dedent(
    """
    import litserve as ls
    from pydantic import BaseModel


    class Req(BaseModel):
        text: str


    class Length(ls.LitAPI):
        def setup(self, device):
            self.device = device

        def decode_request(self, request: Req):
            return request.text

        def batch(self, texts):
            return list(texts)

        def predict(self, texts):
            return [len(t) for t in texts] if isinstance(texts, list) else len(texts)

        def unbatch(self, out):
            return list(out)

        def encode_response(self, n):
            return {"n": n, "device": str(self.device)}
    """
)


@pytest.fixture(scope="module")
def ns():
    return lesson_namespace("13", load_generator=load_generator, pd=pd, torch=torch, bodies=[{"text": "abc"}])


def test_load_server_rows(ns, tmp_path):
    path = tmp_path / "length_api.py"
    path.write_text(API)
    bodies = [{"text": "a" * i} for i in range(1, 9)]
    with server_process.serve(f"{path}:Length", max_batch_size=8, batch_timeout=0.01, accelerator="cpu") as srv:
        df = ns["load_server"](srv, bodies, [4], [50.0], n_requests=24, max_seconds=10, label="batched")
        code, ans = load_generator.post(srv.predict_url, {"text": "abcd"})
    assert code == 200 and ans["n"] == 4 and ans["device"] == "cpu"
    assert list(df["mode"]) == ["closed", "open"] and set(df["server"]) == {"batched"}
    assert (df["n_ok"] > 0).all() and (df["mean_batch"] >= 1).all()
    assert {"throughput", "p50_ms", "p99_ms", "model_busy_%", "n_not_sent"} <= set(df.columns)


def test_accelerator_reaches_litserver(tmp_path):
    """The knob the GPU section sets is passed to LitServer: an unknown accelerator fails the start, named."""
    path = tmp_path / "length_api.py"
    path.write_text(API)
    with pytest.raises(server_process.ServingError, match="did not start"):
        with server_process.serve(f"{path}:Length", accelerator="tpu", start_timeout=120):
            pass
