"""The real ``openai`` SDK through a real edge (subprocess) to real simulator replicas."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import redis as redis_sync

from dataplane.edge.process import EdgeProcess
from tests.edge.conftest import SHARED_REDIS, make_key, standalone_config
from tests.usage_events import stream_events

KEY = make_key("acme")
LIMITED = make_key("limited")
SUSPENDED = make_key("susp")
BROKE = make_key("broke")
CACHED = make_key("cached")
CACHED_LIMITED = make_key("cachedlim")
TENANTS = [
    {"name": "acme", "keys": [{"dev_key": KEY}]},
    {"name": "limited", "limits": {"requests_per_minute": 2}, "keys": [{"dev_key": LIMITED}]},
    {"name": "suspended", "status": "suspended", "keys": [{"dev_key": SUSPENDED}]},
    {"name": "broke", "limits": {"monthly_token_budget": 100, "monthly_tokens_used": 100},
     "keys": [{"dev_key": BROKE}]},
    {"name": "cached", "response_cache": True, "keys": [{"dev_key": CACHED}]},
    {"name": "cachedlim", "response_cache": True, "limits": {"requests_per_minute": 2},
     "keys": [{"dev_key": CACHED_LIMITED}]},
]


@pytest.fixture(scope="module")
def edge(sims, tmp_path_factory):
    import uuid

    stream = f"test:edge:usage:{uuid.uuid4().hex}"
    cfg = standalone_config([s.url for s in sims], TENANTS, context_length=4096)
    # a second tier served by one replica only
    cfg["models"][0]["tiers"].append({"tier": "fp8", "served_model_name": "demo", "context_length": 4096,
                                      "replicas": [sims[1].url]})
    state = tmp_path_factory.mktemp("edge-sdk")
    proc = EdgeProcess(cfg, state_dir=state, redis_url=SHARED_REDIS, log_path=state / "edge.log",
                       settings={"usage_stream": stream, "redis_key_prefix": f"test:{uuid.uuid4().hex}:"})
    proc.start()
    proc.usage_stream = stream
    yield proc
    proc.close()
    redis_sync.Redis.from_url(SHARED_REDIS).delete(stream)


def client(edge, key=KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=edge.url + "/v1", api_key=key, max_retries=0, timeout=30)


def usage_events(edge) -> dict[str, dict[str, str]]:
    r = redis_sync.Redis.from_url(SHARED_REDIS, decode_responses=True)
    return {e["request_id"]: e for e in stream_events(r, edge.usage_stream)}


def test_chat_completion_and_metering(edge):
    raw = client(edge).chat.completions.with_raw_response.create(
        model="demo", messages=[{"role": "system", "content": "You are terse."},
                                {"role": "user", "content": "Say hello."}], max_tokens=12)
    resp = raw.parse()
    assert resp.choices[0].message.content.strip()
    assert resp.usage.completion_tokens == 12 and resp.usage.prompt_tokens > 0
    request_id = raw.headers["x-request-id"]
    for _ in range(50):
        event = usage_events(edge).get(request_id)
        if event:
            break
        time.sleep(0.05)
    assert event["status"] == "ok" and event["http_status"] == "200"
    assert int(event["completion_tokens"]) == 12 and int(event["prompt_tokens"]) == resp.usage.prompt_tokens
    assert event["replica_id"] and event["variant_id"] and float(event["ttft_ms"]) > 0


def test_completions_plain_and_streamed(edge):
    c = client(edge)
    done = c.completions.create(model="demo", prompt="Once upon a time", max_tokens=8)
    assert done.choices[0].text.strip() and done.usage.completion_tokens == 8
    pieces = [ch.choices[0].text for ch in c.completions.create(model="demo", prompt="Once", max_tokens=6,
                                                                stream=True) if ch.choices]
    assert len("".join(pieces).split()) == 6


def test_streaming_chat_with_include_usage(edge):
    c = client(edge)
    chunks = list(c.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "count to five"}], max_tokens=10, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert len(text.split()) == 10
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    # without include_usage the client gets no usage chunk (the edge still meters it)
    plain = list(c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=5, stream=True))
    assert all(ch.usage is None for ch in plain) and all(ch.choices for ch in plain)


def _arrivals(url: str, key: str | None) -> list[float]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    arrivals = []
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=30, headers=headers,
                      json={"model": "demo", "messages": [{"role": "user", "content": "x"}], "max_tokens": 400,
                            "ignore_eos": True, "stream": True}) as resp:
        if key:
            assert resp.headers["x-accel-buffering"] == "no"
        for _ in resp.iter_raw():
            arrivals.append(time.monotonic())
    return arrivals


def test_stream_is_not_buffered(edge, sims):
    """Chunks reach the client spread over the generation as they do straight from the replica, not in a
    lump at the end."""
    direct = _arrivals(sims[0].url, None)
    proxied = _arrivals(edge.url, KEY)
    assert len(direct) > 100 and len(proxied) > 20  # reads coalesce at 20x speed; they still trickle
    assert proxied[-1] - proxied[0] > 0.6 * (direct[-1] - direct[0])


def test_tier_selects_the_variant(edge):
    raw = client(edge).chat.completions.with_raw_response.create(
        model="demo:fp8", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert raw.parse().usage.completion_tokens == 3
    with pytest.raises(openai.NotFoundError):
        client(edge).chat.completions.create(model="demo:int4", messages=[{"role": "user", "content": "x"}])


def test_error_classes(edge):
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError) as e401:
        client(edge, key="nmb_nobody00_wrong").chat.completions.create(model="demo", messages=msgs)
    assert e401.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.PermissionDeniedError):
        client(edge, key=SUSPENDED).chat.completions.create(model="demo", messages=msgs)
    with pytest.raises(openai.NotFoundError) as e404:
        client(edge).chat.completions.create(model="no-such-model", messages=msgs)
    assert e404.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e400:
        client(edge).chat.completions.create(model="demo", messages=[{"role": "robot", "content": "x"}])
    assert e400.value.body["param"] == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as ectx:
        client(edge).chat.completions.create(model="demo", messages=msgs, max_tokens=100_000)
    assert ectx.value.body["code"] == "context_length_exceeded"


def test_rate_limit_429_with_headers(edge):
    c = client(edge, key=LIMITED)
    msgs = [{"role": "user", "content": "hi"}]
    ok = c.chat.completions.with_raw_response.create(model="demo", messages=msgs, max_tokens=2)
    assert ok.headers["x-ratelimit-limit-requests"] == "2"
    assert ok.headers["x-ratelimit-remaining-requests"] == "1"
    c.chat.completions.create(model="demo", messages=msgs, max_tokens=2)
    with pytest.raises(openai.RateLimitError) as exc:
        c.chat.completions.create(model="demo", messages=msgs, max_tokens=2)
    headers = exc.value.response.headers
    assert int(headers["retry-after"]) >= 1 and headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s")


def test_budget_exhausted_is_429_do_not_retry(edge):
    with pytest.raises(openai.RateLimitError) as exc:
        client(edge, key=BROKE).chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["code"] == "insufficient_quota"
    assert exc.value.response.headers["x-should-retry"] == "false"


def test_models_lists_what_the_tenant_may_use(edge):
    ids = {m.id for m in client(edge).models.list()}
    assert ids == {"demo", "demo:fp8"}
    with pytest.raises(openai.AuthenticationError):
        client(edge, key="nmb_x_y").models.list()


def test_response_cache_is_opt_in_and_exact(edge):
    body = {"model": "demo", "messages": [{"role": "user", "content": "deterministic please"}],
            "max_tokens": 5, "temperature": 0}
    c = client(edge, key=CACHED)
    first = c.chat.completions.with_raw_response.create(**body)
    second = c.chat.completions.with_raw_response.create(**body)
    assert second.headers.get("x-nimbus-cache") == "hit"
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert first.headers.get("x-nimbus-cache") == "miss"
    other = c.chat.completions.with_raw_response.create(**{**body, "max_tokens": 6})
    assert other.headers.get("x-nimbus-cache") == "miss"
    sampled = c.chat.completions.with_raw_response.create(**{**body, "temperature": 0.7})
    assert sampled.headers.get("x-nimbus-cache") == "bypass"  # not deterministic: never from the cache
    # A streamed request is answered from the cache as the stream a live answer would be.
    raw = c.chat.completions.with_raw_response.create(**body, stream=True, stream_options={"include_usage": True})
    assert raw.headers.get("x-nimbus-cache") == "hit" and raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == \
        first.parse().choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens == 5
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    # a tenant without opt-in never gets cached answers
    plain = client(edge).chat.completions.with_raw_response.create(**body)
    again = client(edge).chat.completions.with_raw_response.create(**body)
    assert plain.headers.get("x-nimbus-cache") == "bypass" and again.headers.get("x-nimbus-cache") == "bypass"


def test_a_cache_hit_counts_against_the_request_rate(edge):
    body = {"model": "demo", "messages": [{"role": "user", "content": "cached and limited"}],
            "max_tokens": 3, "temperature": 0}
    c = client(edge, key=CACHED_LIMITED)
    assert c.chat.completions.with_raw_response.create(**body).headers["x-nimbus-cache"] == "miss"
    hit = c.chat.completions.with_raw_response.create(**body)
    assert hit.headers["x-nimbus-cache"] == "hit" and hit.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError):
        c.chat.completions.create(**body)  # a third request in the minute, cached or not


def test_client_disconnect_aborts_upstream(edge, sims):
    with httpx.stream("POST", edge.url + "/v1/chat/completions", timeout=30,
                      headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "demo:fp8", "messages": [{"role": "user", "content": "long"}],
                            "max_tokens": 3000, "stream": True}) as resp:
        it = resp.iter_raw()
        next(it)
        next(it)
    # the replica stops generating soon after the client left
    for _ in range(60):
        load = httpx.get(sims[1].url + "/get_load").json()[0]
        if load["num_reqs"] == 0:
            break
        time.sleep(0.05)
    assert load["num_reqs"] == 0


def test_metrics_endpoint(edge):
    client(edge).chat.completions.create(model="demo", messages=[{"role": "user", "content": "m"}], max_tokens=2)
    text = httpx.get(edge.url + "/metrics").text
    for name in ("nimbus_edge_ttft_seconds", "nimbus_edge_queue_seconds", "nimbus_edge_routing_decisions_total",
                 "nimbus_edge_estimated_prefix_hit_tokens_total", "nimbus_edge_requests_total"):
        assert name in text
