"""The edge's side of the Batch API: ``/v1/files`` and ``/v1/batches`` are authenticated here and
forwarded to the control plane (an unreachable one costs a 503 in OpenAI's shape, never inference);
the batch runner's lines are accepted only with the edge token and a live key, run at batch
priority under the line's own request id. The whole workflow runs in tests/e2e/test_batches.py."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.edge.conftest import make_key, module_edge, sdk_client, standalone_config

KEY, OTHER = make_key("batcher"), make_key("other")
KEY_ID = "6f1c3f52-5d1e-4d8e-9f1a-0f7e3c2b1a00"
EDGE_TOKEN = "test-edge-token-" + "x" * 16
BODY = {"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def edge(sims, tmp_path_factory):
    cfg = standalone_config([sims[0].url], [{"name": "a", "keys": [{"dev_key": KEY, "id": KEY_ID}]},
                                            {"name": "b", "keys": [{"dev_key": OTHER}]}],
                            settings={"edge_token": EDGE_TOKEN, "control_plane_url": "http://127.0.0.1:9"})
    with module_edge(cfg, tmp_path_factory, "edge-batch") as proc:
        yield proc


def runner_headers(**over: str) -> dict[str, str]:
    return {"authorization": f"Bearer {EDGE_TOKEN}", "x-nimbus-on-behalf-of": KEY_ID,
            "x-nimbus-request-id": "batch_abc:7", **over}


def test_a_batch_line_runs_for_its_key_at_batch_priority_under_its_own_request_id(edge):
    r = httpx.post(edge.url + "/v1/chat/completions", json=BODY, headers=runner_headers(), timeout=30)
    assert r.status_code == 200 and r.headers["x-request-id"] == "batch_abc:7"
    metrics = httpx.get(edge.url + "/metrics").text
    assert any(line.startswith("nimbus_edge_requests_total") and 'priority="batch"' in line and 'status="ok"' in line
               for line in metrics.splitlines())


@pytest.mark.parametrize(("headers", "status"), [
    ({"authorization": "Bearer not-the-edge-token"}, 401),  # a wrong token is just an invalid key
    ({"x-nimbus-on-behalf-of": "00000000-0000-0000-0000-000000000000"}, 401),  # a key that is gone
    ({"x-nimbus-request-id": "has spaces"}, 400),
    ({"x-nimbus-request-id": "x" * 65}, 400),
])
def test_the_runner_path_refuses_what_it_cannot_trust(edge, headers, status):
    r = httpx.post(edge.url + "/v1/chat/completions", json=BODY, headers=runner_headers(**headers), timeout=30)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]


def test_a_tenant_cannot_set_its_own_request_id(edge):
    r = httpx.post(edge.url + "/v1/chat/completions", json=BODY, timeout=30,
                   headers={"authorization": f"Bearer {KEY}", "x-nimbus-request-id": "batch_abc:7",
                            "x-nimbus-on-behalf-of": KEY_ID})
    assert r.status_code == 200 and r.headers["x-request-id"].startswith("req_")


def test_an_unreachable_control_plane_costs_the_batch_api_a_503_and_inference_nothing(edge):
    client = sdk_client(edge, KEY)
    with pytest.raises(openai.InternalServerError) as exc:
        client.batches.list()
    assert exc.value.status_code == 503 and exc.value.body["code"] == "batch_api_unavailable"
    with pytest.raises(openai.InternalServerError):
        client.files.create(file=("in.jsonl", b'{"custom_id": "a"}\n'), purpose="batch")
    assert client.chat.completions.create(**BODY).choices


def test_the_batch_api_needs_a_key_and_uploads_get_their_own_size_limit(edge):
    assert httpx.get(edge.url + "/v1/batches").status_code == 401
    # An upload over the inference body limit (4 MiB) but under the file limit reaches the forwarder...
    big = b"x" * (5 << 20)
    r = httpx.post(edge.url + "/v1/files", files={"file": ("in.jsonl", big)}, data={"purpose": "batch"},
                   headers={"authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 503 and r.json()["error"]["code"] == "batch_api_unavailable"
    # ...while the same bytes to an inference route are refused for their size.
    r = httpx.post(edge.url + "/v1/chat/completions", content=big, timeout=60,
                   headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 413
