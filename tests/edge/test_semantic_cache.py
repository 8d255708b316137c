"""The semantic response cache through the edge, with the real openai SDK, the real embedding
model (all-MiniLM-L6-v2 on the CPU) and a real Redis: a paraphrase is answered from the cache,
nothing crosses tenants, models, system prompts or sampling parameters, near misses go to the
engine, a second edge shares the index, a purge clears it, and Redis going away is a bypass."""

from __future__ import annotations

import time
import uuid

import openai
import pytest

from controlplane.services.caching import purge
from dataplane.edge.response_cache import BYPASS, MISS
from dataplane.edge.semantic_cache import SEMANTIC
from tests.edge.conftest import add_tier, make_key, sdk_client, standalone_config
from tests.usage_events import stream_events

SEM, OTHER, PLAIN, LIMITED = make_key("sem"), make_key("other"), make_key("plain"), make_key("limited")
SEM_ID = str(uuid.uuid4())
SEMANTIC_ON = {"models": ["demo"], "threshold": 0.875}
ASKED = "What is the capital of France?"
PARAPHRASE = "Which city is the capital of France?"


def ask(client, question, *, system=None, model="demo", stream=False, **kw):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 6)
    return client.chat.completions.with_raw_response.create(model=model, messages=messages, stream=stream, **kw)


def state(raw) -> str:
    return raw.headers.get("x-nimbus-cache")


def until_semantic(client, question, timeout=60.0, **kw):
    """The embedding model loads in the background and the miss's answer is stored off the
    answer's path: ask until it is answered from the cache (or the time is up)."""
    deadline = time.monotonic() + timeout
    while True:
        raw = ask(client, question, **kw)
        if state(raw) == SEMANTIC or time.monotonic() > deadline:
            return raw
        time.sleep(0.2)


@pytest.fixture
def config(sims):
    cfg = standalone_config([s.url for s in sims], [
        {"id": SEM_ID, "name": "sem", "semantic_cache": SEMANTIC_ON, "keys": [{"dev_key": SEM}]},
        {"name": "other", "semantic_cache": SEMANTIC_ON, "keys": [{"dev_key": OTHER}]},
        {"name": "plain", "keys": [{"dev_key": PLAIN}]},
        {"name": "limited", "semantic_cache": SEMANTIC_ON, "limits": {"requests_per_minute": 2},
         "keys": [{"dev_key": LIMITED}]},
    ])
    return add_tier(cfg, "fp8", sims[0].url, served="demo-fp8")


def test_a_paraphrase_is_answered_from_the_cache_and_nothing_crosses_a_scope(edge_factory, private_redis, config,
                                                                           tmp_path):
    edge = edge_factory(config, redis_url=private_redis.url)
    sem, other, plain = sdk_client(edge, SEM), sdk_client(edge, OTHER), sdk_client(edge, PLAIN)

    # The first ask fills the cache (a miss once the model is loaded; a bypass before).
    deadline = time.monotonic() + 60
    while state(first := ask(sem, ASKED)) != MISS and time.monotonic() < deadline:
        time.sleep(0.2)
    assert state(first) == MISS
    hit = until_semantic(sem, PARAPHRASE)
    assert state(hit) == SEMANTIC
    assert hit.parse().choices[0].message.content == first.parse().choices[0].message.content
    streamed = ask(sem, PARAPHRASE, stream=True)
    assert state(streamed) == SEMANTIC
    assert "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices) == \
        first.parse().choices[0].message.content

    # Never across a scope: another tenant, another model or tier, another system prompt,
    # other sampling parameters; never for a sampled request; never a near miss.
    assert state(ask(other, PARAPHRASE)) == MISS
    assert state(ask(sem, PARAPHRASE, model="demo:fp8")) == BYPASS  # not opted in under that name
    assert state(ask(sem, PARAPHRASE, system="Answer in French.")) == MISS
    assert state(ask(sem, PARAPHRASE, max_tokens=7)) == MISS
    assert state(ask(sem, PARAPHRASE, temperature=0.7)) == BYPASS
    assert state(ask(sem, "Which city is the capital of Germany?")) == MISS
    assert state(ask(sem, "What is the population of France?")) == MISS
    assert state(ask(plain, PARAPHRASE)) == BYPASS  # no opt-in

    # Metered as cached responses.
    r = private_redis.client()
    ids = {first.headers["x-request-id"]: "", hit.headers["x-request-id"]: SEMANTIC,
           streamed.headers["x-request-id"]: SEMANTIC}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        events = {e["request_id"]: e for e in stream_events(r, "nimbus:usage")}
        if set(ids) <= set(events):
            break
        time.sleep(0.1)
    assert {i: events[i]["cache"] for i in ids} == ids
    assert events[hit.headers["x-request-id"]]["completion_tokens"] == "0"

    # A second edge of the region replays the log: it starts with the index warm, and what either
    # edge stores the other finds.
    second = sdk_client(edge_factory(config, redis_url=private_redis.url), SEM)
    assert state(until_semantic(second, PARAPHRASE)) == SEMANTIC
    assert state(ask(second, ASKED, system="Be brief.")) == MISS
    assert state(until_semantic(sem, PARAPHRASE, system="Be brief.")) == SEMANTIC

    # "Clear my cache": the control plane's purge empties it on every edge. (Each edge asks in a
    # scope of its own: a miss stores its answer again, which the other edge would then find.)
    assert purge(private_redis.url, "nimbus:", uuid.UUID(SEM_ID)) >= 2
    assert state(ask(sem, PARAPHRASE)) == MISS
    assert state(ask(second, PARAPHRASE, system="Be brief.")) == MISS
    # Following the region's log while it is quiet is not a failure (a blocking read that outlived
    # the socket timeout used to log one every second).
    assert "log unavailable" not in (tmp_path / "edge0.log").read_text()


def test_a_semantic_hit_is_a_request_for_the_limits(edge_factory, private_redis, config):
    edge = edge_factory(config, redis_url=private_redis.url)
    sem, limited = sdk_client(edge, SEM), sdk_client(edge, LIMITED, timeout=20)
    until_semantic(sem, ASKED)  # the model is loaded (this tenant's own scope)
    assert state(ask(limited, ASKED)) == MISS
    # The answer is stored off the response path: once the region's log has it, a paraphrase hits...
    log, deadline = private_redis.client(), time.monotonic() + 10
    while not any(f.get(b"tenant", b"").decode() != SEM_ID for _, f in log.xrange("nimbus:scache:local:log")):
        assert time.monotonic() < deadline, "the limited tenant's answer never reached the log"
        time.sleep(0.05)
    time.sleep(0.1)  # and the edge has read it back (it also indexes its own entries at once)
    hit = ask(limited, PARAPHRASE)
    assert state(hit) == SEMANTIC and hit.headers["x-ratelimit-remaining-requests"] == "0"
    # ...which used the minute's second request: a third is refused, cached or not.
    with pytest.raises(openai.RateLimitError):
        limited.chat.completions.create(model="demo", messages=[{"role": "user", "content": PARAPHRASE}],
                                        temperature=0, max_tokens=6)


def test_redis_down_means_bypass_not_an_error(edge_factory, private_redis, config):
    edge = edge_factory(config, redis_url=private_redis.url, settings={"redis_retry_s": 0.3})
    sem = sdk_client(edge, SEM, timeout=20)
    ask(sem, ASKED)
    assert state(until_semantic(sem, PARAPHRASE)) == SEMANTIC
    private_redis.stop()
    for stream in (False, True):
        raw = ask(sem, PARAPHRASE, stream=stream)
        assert raw.status_code == 200 and state(raw) == BYPASS
        if not stream:
            assert raw.parse().usage.completion_tokens == 6  # answered by an engine


def test_without_the_model_the_cache_is_bypassed(edge_factory, private_redis, config):
    """An edge whose embedding model cannot load (unknown name: as a missing extra would) serves
    every request from the engines and says so."""
    edge = edge_factory(config, redis_url=private_redis.url, settings={"semantic_cache_model": "no-such-model"})
    sem = sdk_client(edge, SEM)
    for _ in range(2):
        raw = ask(sem, ASKED)
        assert raw.status_code == 200 and state(raw) == BYPASS
