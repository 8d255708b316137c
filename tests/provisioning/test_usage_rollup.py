"""Usage rollup: Redis stream (consumer group) → minute buckets, exactly once, nothing lost to a dead consumer."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import redis.asyncio as aioredis
from sqlalchemy import select

from controlplane.db.engine import session_scope
from controlplane.models import UsageMinute
from controlplane.services import usage, usage_rollup
from dataplane.edge.usage import UsageRecorder, make_event
from tests.controlplane.factories import create_model, create_tenant
from tests.provisioning.celery_harness import celery_running
from tests.provisioning.conftest import REDIS_URL
from tests.provisioning.helpers import wait_for

T0 = dt.datetime(2026, 11, 29, 12, 0, 10, tzinfo=dt.UTC)


async def tenant_and_variant(client, admin) -> tuple[str, str]:
    tenant = await create_tenant(client, admin)
    model = await create_model(client, admin, tiers=("bf16",))
    return tenant["id"], model["variants"][0]["id"]


def event(tenant: str, variant: str, seconds: float, *, prompt: int = 100, status: str = "ok",
          request_id: str | None = None) -> dict[str, str]:
    return make_event(request_id=request_id or uuid.uuid4().hex, tenant_id=tenant, variant_id=variant,
                      prompt_tokens=prompt, completion_tokens=10, cached_tokens=prompt // 2, queue_ms=5,
                      ttft_ms=50, duration_ms=400, status=status, ts=(T0 + dt.timedelta(seconds=seconds)).timestamp())


def buckets(settings) -> dict[dt.datetime, tuple[int, int, int]]:
    with session_scope(settings) as s:
        return {r.minute: (r.requests, r.errors, r.prompt_tokens) for r in s.scalars(select(UsageMinute))}


def rollup(settings, redis_client, consumer: str, min_idle_ms: int = 60_000):
    return usage_rollup.rollup(redis_client, lambda: session_scope(settings), settings.usage_stream,
                               consumer=consumer, min_idle_ms=min_idle_ms)


async def test_events_become_minute_buckets_through_the_celery_task(
    client, admin, settings, redis_client, tmp_path, celery_keys_cleanup
):
    settings = settings.model_copy(update={"usage_rollup_interval_s": 0.5})
    tenant, variant = await tenant_and_variant(client, admin)
    for seconds, status in [(0, "ok"), (20, "ok"), (45, "error"), (61, "ok"), (100, "ok")]:
        redis_client.xadd(settings.usage_stream, event(tenant, variant, seconds, status=status))
    with celery_running(settings, providers=None, schedule_dir=tmp_path):  # beat sends nimbus.rollup_usage
        wait_for(lambda: sum(b[0] for b in buckets(settings).values()) == 5, timeout=30)
    minute = T0.replace(second=0)
    assert buckets(settings) == {minute: (3, 1, 300), minute + dt.timedelta(minutes=1): (2, 0, 200)}
    assert redis_client.xlen(settings.usage_stream) == 0  # acknowledged and deleted
    assert redis_client.xpending(settings.usage_stream, usage_rollup.GROUP)["pending"] == 0


async def test_redelivered_and_duplicate_events_count_once(client, admin, settings, redis_client, celery_keys_cleanup):
    tenant, variant = await tenant_and_variant(client, admin)
    events = [event(tenant, variant, s) for s in (1, 2, 3)]
    for e in [*events, events[0]]:  # the edge's spool replay may write an event twice
        redis_client.xadd(settings.usage_stream, e)
    usage_rollup.ensure_group(redis_client, settings.usage_stream)
    # A consumer commits the batch and dies before XACK: the entries stay pending.
    taken = redis_client.xreadgroup(usage_rollup.GROUP, "dead", {settings.usage_stream: ">"}, count=10)[0][1]
    with session_scope(settings) as s:
        assert usage.ingest(s, [fields for _, fields in taken]) == 3
    await asyncio.sleep(0.05)
    result = rollup(settings, redis_client, "alive", min_idle_ms=10)
    assert (result.reclaimed, result.read, result.counted) == (4, 4, 0)
    assert buckets(settings) == {T0.replace(second=0): (3, 0, 300)}
    assert redis_client.xlen(settings.usage_stream) == 0


async def test_consumer_killed_before_ack_loses_nothing(client, admin, settings, redis_client, celery_keys_cleanup):
    tenant, variant = await tenant_and_variant(client, admin)
    for s in range(6):
        redis_client.xadd(settings.usage_stream, event(tenant, variant, s * 8))
    usage_rollup.ensure_group(redis_client, settings.usage_stream)
    redis_client.xreadgroup(usage_rollup.GROUP, "dead", {settings.usage_stream: ">"}, count=4)  # then killed
    assert rollup(settings, redis_client, "alive").counted == 2  # dead's entries are not idle long enough yet
    await asyncio.sleep(0.05)
    result = rollup(settings, redis_client, "alive", min_idle_ms=10)
    assert (result.reclaimed, result.counted) == (4, 4)
    assert buckets(settings) == {T0.replace(second=0): (6, 0, 600)}
    assert redis_client.xpending(settings.usage_stream, usage_rollup.GROUP)["pending"] == 0


async def test_the_edges_batched_entries_and_single_events_both_count(
    client, admin, settings, redis_client, tmp_path, celery_keys_cleanup
):
    """The edge's recorder writes a hundred events to a stream entry; an entry of one event (an
    older edge) still counts, and an entry whose batch cannot be read counts nothing."""
    tenant, variant = await tenant_and_variant(client, admin)
    producer = aioredis.from_url(REDIS_URL)
    recorder = UsageRecorder(producer, settings.usage_stream, tmp_path / "spool.jsonl")
    await recorder.start()
    for i in range(250):
        recorder.record(event(tenant, variant, i % 40))
    await recorder.stop()  # its last drain writes what is queued
    await producer.aclose()
    assert recorder.written == 250
    assert redis_client.xlen(settings.usage_stream) == 3  # 100 + 100 + 50
    redis_client.xadd(settings.usage_stream, event(tenant, variant, 30))
    redis_client.xadd(settings.usage_stream, {"events": "[{not json"})
    result = rollup(settings, redis_client, "alive")
    assert (result.read, result.counted) == (5, 251)
    assert buckets(settings) == {T0.replace(second=0): (251, 0, 25_100)}
    assert redis_client.xlen(settings.usage_stream) == 0
