"""The exact response cache shared by a region's edges in Redis: a second edge (or a restarted
one) answers from what the first stored, hits are metered as cached responses, the store is
bounded (count, TTL, entry size), and a Redis outage means "bypass", never a 5xx."""

from __future__ import annotations

import asyncio
import time
import uuid

import redis.asyncio as aioredis

from controlplane.services.usage import aggregate
from dataplane.edge.response_cache import BYPASS, HIT, MISS, SharedResponseCache
from tests.edge.conftest import SHARED_REDIS, make_key, sdk_client, standalone_config
from tests.usage_events import stream_events

BODY = {"model": "demo", "messages": [{"role": "user", "content": "the same question, twice"}],
        "max_tokens": 5, "temperature": 0}


def cache_state(raw) -> str:
    return raw.headers.get("x-nimbus-cache")


def wait_for_hit(client, timeout: float = 5.0):
    """The miss's answer is stored off the response path: the other edge sees it moments later."""
    deadline = time.monotonic() + timeout
    while True:
        raw = client.chat.completions.with_raw_response.create(**BODY)
        if cache_state(raw) == HIT or time.monotonic() > deadline:
            return raw
        time.sleep(0.05)


def test_a_regions_edges_share_the_cache_and_meter_hits(edge_factory, private_redis, sims):
    key = make_key("shared")
    cfg = standalone_config([s.url for s in sims], [{"name": "shared", "response_cache": True,
                                                    "keys": [{"dev_key": key}]}])
    first = edge_factory(cfg, redis_url=private_redis.url)
    second = edge_factory(cfg, redis_url=private_redis.url)
    a, b = sdk_client(first, key), sdk_client(second, key)

    miss = a.chat.completions.with_raw_response.create(**BODY)
    assert cache_state(miss) == MISS
    hit = wait_for_hit(b)
    assert cache_state(hit) == HIT, "the second edge never saw the first edge's entry"
    assert hit.parse().choices[0].message.content == miss.parse().choices[0].message.content
    streamed = b.chat.completions.with_raw_response.create(**BODY, stream=True)
    assert cache_state(streamed) == HIT
    assert "".join(ch.choices[0].delta.content or "" for ch in streamed.parse() if ch.choices) == \
        miss.parse().choices[0].message.content

    # Every request is metered; the hits as cached responses without GPU tokens.
    r = private_redis.client()
    ids = {raw.headers["x-request-id"]: cache_state(raw) for raw in (miss, hit, streamed)}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        events = {e["request_id"]: e for e in stream_events(r, "nimbus:usage")}
        if set(ids) <= set(events):
            break
        time.sleep(0.1)
    mine = [events[i] for i in ids]
    for event, state in zip(mine, ids.values(), strict=True):
        assert event["cache"] == ("hit" if state == HIT else "")
        if state == HIT:
            assert event["completion_tokens"] == "0" and event["status"] == "ok"
    (bucket,) = aggregate(mine).values()
    assert bucket["requests"] == 3 and bucket["cached_responses"] == 2
    assert bucket["completion_tokens"] == 5  # only the miss went to an engine


def test_a_streamed_miss_fills_the_cache(edge_factory, private_redis, sims):
    """Most chat traffic streams: a streamed answer fills the cache as the whole answer it adds up
    to, and comes back streamed or not."""
    key = make_key("streamed")
    cfg = standalone_config([s.url for s in sims], [{"name": "streamed", "response_cache": True,
                                                    "keys": [{"dev_key": key}]}])
    c = sdk_client(edge_factory(cfg, redis_url=private_redis.url), key)
    body = {**BODY, "messages": [{"role": "user", "content": "streamed first"}], "temperature": 0.8, "seed": 7}
    live = c.chat.completions.with_raw_response.create(**body, stream=True, stream_options={"include_usage": True})
    assert cache_state(live) == MISS
    chunks = list(live.parse())
    texts = {0: "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)}
    usage = chunks[-1].usage
    deadline = time.monotonic() + 5
    while cache_state(again := c.chat.completions.with_raw_response.create(**body)) != HIT:
        assert time.monotonic() < deadline, "the streamed answer never reached the cache"
        time.sleep(0.05)
    whole = again.parse()
    assert {ch.index: ch.message.content for ch in whole.choices} == texts
    assert whole.usage.completion_tokens == usage.completion_tokens and whole.choices[0].finish_reason == "length"
    replayed = c.chat.completions.with_raw_response.create(**body, stream=True)
    assert cache_state(replayed) == HIT
    assert "".join(ch.choices[0].delta.content or "" for ch in replayed.parse()
                   if ch.choices and ch.choices[0].index == 0) == texts[0]


def test_redis_down_means_bypass_not_an_error(edge_factory, private_redis, sims):
    key = make_key("outage")
    cfg = standalone_config([s.url for s in sims], [{"name": "outage", "response_cache": True,
                                                    "keys": [{"dev_key": key}]}],
                            settings={"redis_retry_s": 0.3})
    edge = edge_factory(cfg, redis_url=private_redis.url)
    c = sdk_client(edge, key, timeout=20)
    assert cache_state(c.chat.completions.with_raw_response.create(**BODY)) == MISS
    assert cache_state(wait_for_hit(c)) == HIT
    private_redis.stop()
    for stream in (False, True, False):
        raw = c.chat.completions.with_raw_response.create(**BODY, stream=stream)
        assert raw.status_code == 200 and cache_state(raw) == BYPASS  # answered by an engine
        if stream:
            assert "".join(ch.choices[0].delta.content or "" for ch in raw.parse() if ch.choices)
        else:
            assert raw.parse().usage.completion_tokens == 5
    private_redis.start()  # empty: the entries died with it
    time.sleep(0.4)  # past redis_retry_s: the edge tries the cache again
    assert cache_state(wait_for_hit(c)) == HIT


def run(coro):
    return asyncio.run(coro)


async def _with_cache(**kw):
    client = aioredis.from_url(SHARED_REDIS)
    prefix = f"test:rcache:{uuid.uuid4().hex}:"
    return client, prefix, SharedResponseCache(client, prefix, "r1", **kw)


async def _cleanup(client, prefix: str) -> None:
    keys = [k async for k in client.scan_iter(match=prefix + "*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def test_the_store_is_bounded_by_count_keeping_the_recently_used():
    async def go():
        client, prefix, cache = await _with_cache(max_entries=3, ttl_s=60)
        try:
            for k in "abc":
                await cache.store(k, k.encode(), "t")
                await asyncio.sleep(0.002)
            assert (await cache.lookup("a", "t")) == (HIT, b"a")  # a is now the most recently used
            await asyncio.sleep(0.002)
            await cache.store("d", b"d", "t")
            await asyncio.sleep(0.002)
            await cache.store("e", b"e", "t")
            states = {k: (await cache.lookup(k, "t"))[0] for k in "abcde"}
            assert states == {"a": HIT, "b": MISS, "c": MISS, "d": HIT, "e": HIT}
            assert await client.zcard(prefix + "rcache:r1:lru") == 3
        finally:
            await _cleanup(client, prefix)
    run(go())


def test_entries_expire_and_large_answers_are_not_stored():
    async def go():
        client, prefix, cache = await _with_cache(ttl_s=0.2, max_entry_bytes=64)
        try:
            assert await cache.store("small", b"x" * 64, "t")
            assert not await cache.store("large", b"x" * 65, "t")
            assert (await cache.lookup("small", "t"))[0] == HIT
            assert (await cache.lookup("large", "t"))[0] == MISS
            await asyncio.sleep(0.3)
            assert (await cache.lookup("small", "t"))[0] == MISS  # a hit does not extend the TTL
        finally:
            await _cleanup(client, prefix)
    run(go())


def test_regions_do_not_share_entries():
    async def go():
        client, prefix, here = await _with_cache()
        there = SharedResponseCache(client, prefix, "r2")
        try:
            await here.store("k", b"answer", "t")
            assert (await here.lookup("k", "t")) == (HIT, b"answer")
            assert (await there.lookup("k", "t"))[0] == MISS
        finally:
            await _cleanup(client, prefix)
    run(go())
