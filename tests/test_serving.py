"""Tests of course_utils.serving: validation, the LitServe server's answers, batching isolation, clean shutdown."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch

from course_utils import serving as sv
from course_utils.compare import check_outputs
from course_utils.models import load_digits_model

SHAPE = sv.expected_shape("cnn")


# ---- pure functions (no server) ------------------------------------------------------------------------


def test_validate_payload_accepts_both_formats():
    x = np.random.rand(*SHAPE).astype(np.float32)
    for fmt in ("b64", "json"):
        arr = sv.validate_payload(json.loads(sv.make_payload(x, fmt=fmt)), SHAPE)
        assert arr.shape == SHAPE and arr.dtype == np.float32
        np.testing.assert_allclose(arr, x, rtol=1e-6)
    assert sv.validate_payload({"inputs": x[None].tolist()}, SHAPE).shape == SHAPE  # leading batch of 1


@pytest.mark.parametrize(
    "payload, words",
    [
        ([1, 2], "JSON object"),
        ({"inputs": [[1.0, 2.0]]}, "expected [1, 8, 8]"),
        ({"inputs": [[["a"] * 8] * 8]}, "numbers only"),
        ({"inputs": [[[True] * 8] * 8]}, "numbers only"),
        ({"inputs": [[[1.0] * 8] * 7 + [[1.0] * 3]]}, "ragged"),
        ({"b64": "!!notbase64"}, "not valid base64"),
        ({"b64": base64.b64encode(b"1234").decode()}, "expected 256"),
        ({"b64": base64.b64encode(bytes(256)).decode(), "dtype": "float16"}, "dtype must be 'float32'"),
        ({"inputs": [[[1.0] * 8] * 8], "b64": "AAAA"}, "exactly one"),
        ({"image": [1]}, "unknown key"),
        ({"inputs": [[[float("nan")] * 8] * 8]}, "NaN"),
    ],
)
def test_validate_payload_rejects_with_message(payload, words):
    with pytest.raises(ValueError, match=None) as info:
        sv.validate_payload(payload, SHAPE)
    assert words in str(info.value)


def test_make_payload_rejects_unknown_format():
    with pytest.raises(ValueError, match="fmt"):
        sv.make_payload(np.zeros(SHAPE), fmt="xml")


def test_expected_shape_lists_models():
    with pytest.raises(ValueError, match="resnet18"):
        sv.expected_shape("vgg")


def test_loopback_only():
    sv.check_loopback("http://127.0.0.1:8000/predict")
    sv.check_loopback("http://localhost:1/x")
    sv.check_loopback("http://[::1]:1/x")
    for url in ("http://10.0.0.1:8000/predict", "http://example.com/predict", "http://169.254.169.254/"):
        with pytest.raises(sv.LoopbackOnlyError):
            sv.run_load(url, [b"{}"], n_requests=1, concurrency=1)


def test_load_result_percentiles_and_pays_at():
    r = sv.LoadResult(4, 100, 0, 2.0, list(np.arange(1, 101, dtype=float)))
    assert r.throughput == 50.0 and r.p50_ms == pytest.approx(50.5) and r.p99_ms == pytest.approx(99.01)
    import pandas as pd

    df = pd.DataFrame({"server": ["a", "a", "b", "b"], "concurrency": [1, 8, 1, 8], "throughput": [5, 30, 10, 20]})
    assert sv.batching_pays_at(df, batched="a", unbatched="b") == 8
    assert sv.batching_pays_at(df, batched="a", unbatched="b", margin=2.0) is None


def test_payload_limit_middleware():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    app = FastAPI()

    @app.post("/p")
    async def p(body: dict) -> dict:
        return {"n": len(body)}

    app.add_middleware(sv.PayloadLimitMiddleware, max_bytes=100, hint="send less")
    client = TestClient(app)
    assert client.post("/p", json={"a": 1}).status_code == 200
    r = client.post("/p", content=b"x" * 500, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit of 100 bytes" in r.json()["detail"] and "send less" in r.json()["detail"]


# ---- a real server (one start shared by the tests below) ------------------------------------------------


class _Started:
    """One server for the module (a start costs seconds); the last test stops it through the error path."""

    def __init__(self) -> None:
        self.cm = sv.serve("cnn", max_batch_size=8, batch_timeout=0.2, start_timeout=120)
        self.srv = self.cm.__enter__()
        self.open = True

    def close(self, exc: BaseException | None = None) -> bool | None:
        self.open = False
        return self.cm.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)


@pytest.fixture(scope="module")
def started():
    s = _Started()
    try:
        yield s
    finally:
        if s.open:
            s.close()


@pytest.fixture
def server(started):
    return started.srv


def test_answers_match_direct_model_output(server):
    model = load_digits_model("cnn")
    x = torch.rand(6, *SHAPE)
    bodies = [sv.make_payload(x[i], fmt="b64" if i % 2 else "json") for i in range(len(x))]
    answers = sv.post_many(server.predict_url, bodies)
    assert all(code == 200 for code, _ in answers), answers
    got = torch.tensor([a["logits"] for _, a in answers])
    with torch.inference_mode():
        ref = model(x)
    check_outputs(got, ref, "fp32", label="served vs direct")
    assert [a["label"] for _, a in answers] == ref.argmax(1).tolist()


def test_invalid_requests_get_4xx_with_message(server):
    cases = [
        (b"{not json", 400, "not valid JSON"),
        (json.dumps({"inputs": [[1, 2]]}).encode(), 422, "expected [1, 8, 8]"),
        (json.dumps({"inputs": [[["x"] * 8] * 8]}).encode(), 422, "numbers only"),
        (json.dumps({"b64": "%%%"}).encode(), 422, "base64"),
        (json.dumps({"b64": base64.b64encode(bytes(256)).decode(), "dtype": "int8"}).encode(), 422, "float32"),
        (b"[" + b"0," * 200_000 + b"0]", 413, "exceeds the limit"),
    ]
    for body, status, words in cases:
        code, answer = sv.post(server.predict_url, body)
        assert code == status, (body[:40], code, answer)
        assert words in answer["detail"], answer
        assert "send" in answer["detail"]  # the message says what to send instead


def test_bad_request_in_a_batch_leaves_the_others_answered(server):
    good = [sv.make_payload(np.random.rand(*SHAPE)) for _ in range(7)]
    bad = json.dumps({"inputs": [1, 2, 3]}).encode()
    n0 = len(server.batch_stats())
    answers = sv.post_many(server.predict_url, good[:3] + [bad] + good[3:])
    codes = [c for c, _ in answers]
    assert codes == [200, 200, 200, 422, 200, 200, 200, 200], codes
    stats = server.batch_stats(since=n0)
    assert stats["batch_size"].sum() == 7 and stats["batch_size"].max() > 1  # the good ones were batched


def test_load_generator_counts_and_bounds(server):
    body = sv.make_payload(np.random.rand(*SHAPE))
    r = sv.run_load(server.predict_url, [body], n_requests=24, concurrency=4, max_seconds=30)
    assert r.n_ok == 24 and r.n_failed == 0 and r.throughput > 0 and r.p50_ms <= r.p99_ms
    r = sv.run_load(server.predict_url, [body], n_requests=10**6, concurrency=2, max_seconds=0.5)
    assert r.n_ok < 10**6 and r.wall_s < 30  # stopped by the time bound


def test_server_stopped_even_when_the_body_raises(started):
    """What ``with serve(...)`` does when its body raises: the exception propagates and the group is stopped."""
    srv = started.srv
    assert sv.group_pids(srv.pgid) and sv.port_open(srv.port)
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        with pytest.raises(RuntimeError, match="boom"):
            if not started.close(exc):  # __exit__ returns falsy: the exception is not swallowed
                raise
    assert sv.group_pids(srv.pgid) == []
    assert not sv.port_open(srv.port)
