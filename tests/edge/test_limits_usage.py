"""Limits (Redis script and local store agree), fallback when Redis is gone, usage producer + spool."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from dataplane.edge.catalog import Limits, Tenant
from dataplane.edge.limits import (
    BUDGET,
    CONCURRENCY,
    OK,
    REQUESTS,
    TOKENS,
    Limiter,
    LocalStore,
    RedisStore,
    format_duration,
    to_error,
    wait_for_room,
)
from dataplane.edge.sse import SseSplitter, token_counts, usage_of_event
from dataplane.edge.usage import FIELDS, UsageRecorder, make_event
from tests.edge.conftest import SHARED_REDIS, port_is_closed
from tests.usage_events import stream_events, stream_events_async


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def tenant(**limits) -> Tenant:
    return Tenant(id=f"t-{uuid.uuid4().hex[:8]}", name="t", status="active", weight=1.0,
                  limits=Limits(**limits), response_cache=False)


@pytest_asyncio.fixture(params=["redis", "local"], loop_scope="function")
async def limiter(request):
    clock = Clock(1_800_000_000.0)  # start of a minute window
    if request.param == "redis":
        client = aioredis.from_url(SHARED_REDIS)
        prefix = f"test:edge:{uuid.uuid4().hex}:"
        lim = Limiter(RedisStore(client, prefix), clock=clock)
        yield lim, clock
        keys = [k async for k in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
    else:
        yield Limiter(None, clock=clock), clock


async def test_requests_per_minute_and_headers(limiter):
    lim, clock = limiter
    t = tenant(requests_per_minute=3)
    for i in range(3):
        d = await lim.admit(t, f"r{i}", 10)
        assert d.allowed and d.headers["x-ratelimit-remaining-requests"] == str(2 - i)
        await lim.settle(d.lease, 10)
    d = await lim.admit(t, "r3", 10)
    assert not d.allowed and d.reason == REQUESTS
    assert d.headers["x-ratelimit-limit-requests"] == "3"
    assert int(d.headers["retry-after"]) >= 1
    err = to_error(d)
    assert err.status == 429 and err.headers["retry-after"] == d.headers["retry-after"]
    # the sliding window: 90 s later the old minute weighs half, so 1.5 < 3 -> room again
    clock.t += 90
    assert (await lim.admit(t, "r4", 10)).allowed


async def test_tokens_are_reserved_then_reconciled(limiter):
    lim, _ = limiter
    t = tenant(tokens_per_minute=1000)
    d1 = await lim.admit(t, "a", 600)  # prompt + max_tokens reserved
    assert d1.allowed and d1.headers["x-ratelimit-remaining-tokens"] == "400"
    d2 = await lim.admit(t, "b", 600)
    assert not d2.allowed and d2.reason == TOKENS
    await lim.settle(d1.lease, 100)  # it really used 100: 500 go back
    assert (await lim.admit(t, "c", 600)).allowed


async def test_concurrency_slots_free_on_settle(limiter):
    lim, _ = limiter
    t = tenant(max_concurrent_requests=2)
    d1, d2 = await lim.admit(t, "a", 1), await lim.admit(t, "b", 1)
    d3 = await lim.admit(t, "c", 1)
    assert d1.allowed and d2.allowed and not d3.allowed and d3.reason == CONCURRENCY
    await lim.settle(d1.lease, 1)
    assert (await lim.admit(t, "c", 1)).allowed


async def test_monthly_budget_says_do_not_retry(limiter):
    lim, _ = limiter
    t = tenant(monthly_token_budget=1000, monthly_tokens_used=900)
    d = await lim.admit(t, "a", 50)
    assert d.allowed
    await lim.settle(d.lease, 150)  # now 900 (snapshot) vs 150 (metered): max is 900 < 1000
    assert (await lim.admit(t, "b", 50)).allowed
    spent = tenant(monthly_token_budget=1000, monthly_tokens_used=1000)
    d = await lim.admit(spent, "c", 1)
    assert not d.allowed and d.reason == BUDGET and d.headers["x-should-retry"] == "false"
    assert to_error(d).type == "insufficient_quota"


async def test_unlimited_tenants_skip_the_store(limiter):
    lim, _ = limiter
    d = await lim.admit(tenant(), "a", 10)
    assert d.allowed and d.lease is None and d.headers == {}


async def test_redis_down_falls_back_to_local_limits_without_failing():
    dead = aioredis.from_url(f"redis://127.0.0.1:{port_is_closed()}/0", socket_connect_timeout=0.2)
    lim = Limiter(RedisStore(dead), fail_mode="closed", retry_s=30)
    t = tenant(requests_per_minute=2)
    results = [await lim.admit(t, f"r{i}", 1) for i in range(3)]
    assert [r.allowed for r in results] == [True, True, False]  # local limits took over
    assert results[0].lease.store == "local" and not lim.redis_usable
    await lim.settle(results[0].lease, 1)
    open_lim = Limiter(RedisStore(dead), fail_mode="open", retry_s=30)
    assert all([(await open_lim.admit(t, f"r{i}", 1)).allowed for i in range(5)])
    await dead.aclose()


def test_local_share_scales_limits():
    lim = Limiter(None, local_share=0.5)
    t = tenant(requests_per_minute=4)
    outcomes = [asyncio.run(lim.admit(t, f"r{i}", 1)).allowed for i in range(3)]
    assert outcomes == [True, True, False]


def test_reset_formatting_and_waits():
    assert format_duration(0.25) == "250ms" and format_duration(1) == "1s" and format_duration(360) == "6m0s"
    assert wait_for_room(cur=0, prev=0, frac=0.5, need=1, limit=5) == 0
    assert 0 < wait_for_room(cur=1, prev=10, frac=0.5, need=1, limit=5) <= 30
    assert wait_for_room(cur=10, prev=0, frac=0.5, need=1, limit=5) >= 30


def test_local_store_verdict_order():
    store = LocalStore()
    limits = Limits(requests_per_minute=1, monthly_token_budget=10, monthly_tokens_used=10)
    assert store.admit("t", limits, "a", 1, 0.0).verdict == BUDGET
    assert store.admit("t", Limits(requests_per_minute=1), "a", 1, 0.0).verdict == OK


# ------------------------------------------------------------------ usage producer


async def test_usage_events_reach_the_stream(usage_stream, tmp_path):
    client = aioredis.from_url(SHARED_REDIS)
    rec = UsageRecorder(client, usage_stream, tmp_path / "spool.jsonl")
    await rec.start()
    for i in range(5):
        rec.record(make_event(request_id=f"req{i}", tenant_id="t", status="ok", prompt_tokens=3, ts=1.5))
    for _ in range(100):
        if len(await stream_events_async(client, usage_stream)) == 5:
            break
        await asyncio.sleep(0.02)
    events = await stream_events_async(client, usage_stream)
    assert [e["request_id"] for e in events] == [f"req{i}" for i in range(5)]
    assert set(events[0]) == set(FIELDS) and events[0]["key_id"] == ""
    # one stream entry for the batch: a reply per hundred events, not per event
    assert await client.xlen(usage_stream) == 1
    await rec.stop()
    await client.aclose()


async def test_usage_spools_while_redis_is_down_and_replays_in_order(private_redis, tmp_path):
    client = aioredis.from_url(private_redis.url, socket_connect_timeout=0.2, socket_timeout=0.5)
    spool = tmp_path / "spool.jsonl"
    rec = UsageRecorder(client, "nimbus:usage", spool, retry_s=0.1)
    await rec.start()
    rec.record(make_event(request_id="before", status="ok"))
    await asyncio.sleep(0.3)
    private_redis.stop()
    for i in range(3):
        rec.record(make_event(request_id=f"down{i}", status="ok"))
    for _ in range(100):
        if rec.spooled >= 3:
            break
        await asyncio.sleep(0.05)
    assert [json.loads(line)["request_id"] for line in spool.read_text().splitlines()] == ["down0", "down1", "down2"]
    private_redis.start()  # same port, empty server
    rec.record(make_event(request_id="after", status="ok"))
    sync = private_redis.client()
    for _ in range(100):
        if len(stream_events(sync, "nimbus:usage")) >= 4:
            break
        await asyncio.sleep(0.05)
    ids = [e["request_id"] for e in stream_events(sync, "nimbus:usage")]
    assert ids == ["down0", "down1", "down2", "after"]  # spool first, in order, nothing twice
    assert spool.read_text() == ""
    await rec.stop()
    await client.aclose()


def test_make_event_rejects_unknown_fields():
    with pytest.raises(ValueError):
        make_event(request_id="x", colour="blue")


# ------------------------------------------------------------------ SSE


def test_sse_splitter_handles_split_events_and_usage():
    s = SseSplitter()
    assert s.feed(b'data: {"a":1}\n') == []
    assert s.feed(b'\ndata: {"b"') == [b'data: {"a":1}\n\n']
    events = s.feed(b':2}\n\ndata: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,'
                    b'"prompt_tokens_details":{"cached_tokens":3}}}\n\ndata: [DONE]\n\n')
    assert len(events) == 3 and events[2] == b"data: [DONE]\n\n"
    usage, usage_only = usage_of_event(events[1])
    assert usage_only and token_counts(usage) == (5, 2, 3)
    assert usage_of_event(b'data: {"choices":[{}],"usage":null}\n\n') == (None, False)
