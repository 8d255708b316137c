"""Edge signals for the autoscaler: the edge's recorder and publisher (dataplane/edge/signals.py)
and the control plane's reader (controlplane/fleet/edge_signals.py), on the real Redis with a
private key prefix per test, and end to end through a real edge whose per-replica cap binds."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import uuid

import openai
import pytest
import redis as redis_sync
import redis.asyncio as aioredis

from controlplane.fleet import edge_signals as reader
from controlplane.fleet.edge_signals import combine, read_edge_signals
from dataplane.edge.signals import (
    ModelGauges,
    SignalPublisher,
    SignalRecorder,
    build_payloads,
    hash_key,
    histogram_quantile,
    index_key,
)
from dataplane.sim.process import SimProcess
from tests.edge.conftest import SHARED_REDIS, cp_snapshot, make_key, port_is_closed, standalone_config

KEY = make_key("signals")


@pytest.fixture
def prefix():
    """A private key prefix on the shared Redis; everything under it is deleted afterwards."""
    p = f"test:edge-signals:{uuid.uuid4().hex}:"
    yield p
    client = redis_sync.Redis.from_url(SHARED_REDIS)
    keys = list(client.scan_iter(match=p + "*"))
    if keys:
        client.delete(*keys)
    client.close()


def sync_client() -> redis_sync.Redis:
    return redis_sync.Redis.from_url(SHARED_REDIS)


# ---------------------------------------------------------------- recorder and payloads (pure)


def test_recorder_keeps_one_window_and_payloads_carry_histograms():
    rec = SignalRecorder(window_s=3.0, interval_s=1.0)
    for s in (0.0, 0.0, 0.4, 1.2, 4.0):
        rec.queue_wait("m", s)
    for s in (0.3, 0.6, 2.5):
        rec.ttft("m", s)
    rec.rejected("m", "503/queue_timeout")
    rec.rejected("m", "429/tokens")
    rec.holding("cold", 1)
    payloads = build_payloads(rec.window(), {"m": ModelGauges(queue_depth=7, inflight=3, variant_id="v1")},
                              rec.held, bounds=rec.bounds, edge_id="e1", region="r", ts=100.0, ttl_s=3.0,
                              window_s=rec.window_s)
    assert set(payloads) == {"m", "cold"}
    m = json.loads(payloads["m"])
    assert (m["queue_depth"], m["inflight"], m["activation_waiting"], m["variant_id"]) == (7, 3, 0, "v1")
    assert sum(m["queue_wait"]["counts"]) == 5 and sum(m["ttft"]["counts"]) == 3
    assert m["queue_wait"]["p50"] == histogram_quantile(rec.bounds, m["queue_wait"]["counts"], 0.5)
    assert 0.35 < m["queue_wait"]["p50"] <= 0.5  # the middle sample, 0.4 s, in its bucket
    assert m["rejections"] == {"429/tokens": 1, "503/queue_timeout": 1}
    assert (m["ts"], m["ttl_s"], m["window_s"]) == (100.0, 3.0, 3.0)
    assert json.loads(payloads["cold"])["activation_waiting"] == 1
    # The window is three slots: after three rotations the counts above are gone...
    for _ in range(3):
        rec.rotate()
    assert not any(sum(w.queue_wait) for w in rec.window().values())
    rec.holding("cold", -1)
    # ...and a model with nothing to report is left out.
    assert build_payloads(rec.window(), {}, rec.held, bounds=rec.bounds, edge_id="e1", region="r", ts=1.0,
                          ttl_s=3.0, window_s=3.0) == {}


def test_edge_and_reader_quantiles_agree():
    rng = random.Random(7)
    bounds = [0.1, 0.5, 1.0, 2.0, 5.0]
    for _ in range(200):
        counts = [rng.randint(0, 9) for _ in range(len(bounds) + 1)]
        for q in (0.5, 0.9):
            assert histogram_quantile(bounds, counts, q) == reader.histogram_quantile(bounds, counts, q)
    assert histogram_quantile(bounds, [0] * 6, 0.9) is None
    assert histogram_quantile(bounds, [0, 0, 0, 0, 0, 4], 0.9) == 5.0  # all in +Inf: the top bound


def _payload(queue_depth=0, inflight=0, waits=(), ttfts=(), rejections=None, ts=1000.0, ttl_s=15.0,
             bounds=(0.1, 0.5, 1.0, 2.0, 5.0)):
    rec = SignalRecorder(window_s=30.0, interval_s=5.0, bounds=bounds)
    for w in waits:
        rec.queue_wait("m", w)
    for t in ttfts:
        rec.ttft("m", t)
    for reason, n in (rejections or {}).items():
        for _ in range(n):
            rec.rejected("m", reason)
    out = build_payloads(rec.window(), {"m": ModelGauges(queue_depth, inflight)}, {}, bounds=rec.bounds,
                         edge_id="e", region="r", ts=ts, ttl_s=ttl_s, window_s=30.0)
    return json.loads(out["m"])


def test_combine_sums_edges_and_merges_their_histograms():
    a = _payload(queue_depth=30, inflight=64, ttfts=[0.3] * 8 + [4.0] * 2, rejections={"503/queue_timeout": 2})
    b = _payload(queue_depth=7, inflight=64, ttfts=[0.3] * 10, rejections={"503/queue_timeout": 1, "429/tokens": 5})
    merged = combine([{"m": a}, {"m": b}])["m"]
    assert (merged.edges, merged.queue_depth, merged.inflight, merged.waiting) == (2, 37, 128, 37)
    assert merged.rejections == {"429/tokens": 5, "503/queue_timeout": 3} and merged.capacity_rejections == 3
    assert merged.ttft_samples == 20
    # Merged before the quantile: 2 slow requests in 20 are not above the p90, while edge a alone,
    # with 2 in 10, has its p90 among them.
    assert merged.ttft_p90_s is not None and merged.ttft_p90_s <= 0.5
    assert reader.histogram_quantile(a["ttft"]["le"], a["ttft"]["counts"], 0.9) > 0.5
    # Edges with other bucket bounds cannot be merged: the worst quantile any reported counts.
    other = _payload(ttfts=[3.0] * 10, bounds=(1.0, 4.0))
    mixed = combine([{"m": b}, {"m": other}])["m"]
    assert mixed.ttft_p90_s == reader.histogram_quantile(other["ttft"]["le"], other["ttft"]["counts"], 0.9)


# ---------------------------------------------------------------- publisher → Redis → reader


async def _publish(prefix: str, edge_id: str, payload_gauges: dict, *, clock=time.time, interval_s=5.0,
                   ttfts=()) -> SignalPublisher:
    client = aioredis.from_url(SHARED_REDIS)
    rec = SignalRecorder(window_s=30.0, interval_s=interval_s)
    for t in ttfts:
        rec.ttft("m", t)
    pub = SignalPublisher(client, rec, lambda: payload_gauges, edge_id=edge_id, region="r", prefix=prefix,
                          interval_s=interval_s, clock=clock)
    assert await pub.publish_once()
    return pub


async def test_two_edges_are_summed_and_a_stale_one_is_ignored(prefix):
    now = time.time()
    a = await _publish(prefix, "edge-a", {"m": ModelGauges(queue_depth=30, inflight=64)}, ttfts=[0.4] * 25)
    b = await _publish(prefix, "edge-b", {"m": ModelGauges(queue_depth=7, inflight=60)})
    # An edge whose last publish is 100 s old (it died without withdrawing; its hash has not expired yet).
    await _publish(prefix, "edge-old", {"m": ModelGauges(queue_depth=500)}, clock=lambda: now - 100)
    client = sync_client()
    got = read_edge_signals(client, now, prefix=prefix)
    assert got.error is None and (got.live_edges, got.stale_edges) == (2, 1)
    m = got["m"]
    assert (m.edges, m.queue_depth, m.inflight, m.ttft_samples) == (2, 37, 124, 25)
    assert m.ttft_p90_s is not None and 0.35 < m.ttft_p90_s <= 0.5
    # The hash expires on its own a few intervals after the edge stops publishing.
    assert 0 < client.ttl(hash_key(prefix, "edge-a")) <= 15
    # A stricter max age leaves everything out; a looser one lets the old edge back in.
    assert read_edge_signals(client, now + 60, prefix=prefix) == {}
    assert read_edge_signals(client, now, prefix=prefix, max_age_s=200)["m"].queue_depth == 537
    # A stopped edge withdraws at once.
    await a.stop()
    assert client.zscore(index_key(prefix), "edge-a") is None
    assert read_edge_signals(client, now, prefix=prefix)["m"].queue_depth == 7
    await b.stop()
    for pub in (a, b):
        await pub.redis.aclose()
    client.close()


async def test_an_idle_edge_counts_as_live_with_nothing_to_report(prefix):
    pub = await _publish(prefix, "idle", {})
    got = read_edge_signals(sync_client(), time.time(), prefix=prefix)
    assert got == {} and got.live_edges == 1 and got.error is None
    await pub.stop()
    await pub.redis.aclose()


async def test_redis_down_never_raises_on_either_side(caplog):
    dead = f"redis://127.0.0.1:{port_is_closed()}/0"
    client = aioredis.from_url(dead, socket_connect_timeout=0.25, socket_timeout=0.5)
    rec = SignalRecorder()
    rec.ttft("m", 0.5)
    results: list[bool] = []
    pub = SignalPublisher(client, rec, lambda: {"m": ModelGauges(queue_depth=3)}, edge_id="e", region="r",
                          prefix="test:", interval_s=0.05, on_result=results.append)
    assert await pub.publish_once() is False
    await pub.start()
    await asyncio.sleep(0.3)
    await pub.stop()  # the withdraw fails too, quietly
    assert pub.failures >= 2 and set(results) == {False}
    await client.aclose()
    reader._last_warning.clear()
    with caplog.at_level("WARNING", logger="nimbus.fleet.edge_signals"):
        for _ in range(3):
            got = read_edge_signals(reader.redis_client(dead), time.time())
            assert got == {} and got.error is not None and "redis" in got.error
    # Said once, not on every tick.
    assert len([r for r in caplog.records if "edge signals unavailable" in r.message]) == 1


# ---------------------------------------------------------------- end to end through a real edge


@pytest.fixture(scope="module")
def slow_sim():
    with SimProcess(served_model_name="demo", extra_args=["--time-scale", "5"], ready_delay=0.0) as sim:
        yield sim


def _stream(edge, max_tokens: int, out: list, errors: list) -> None:
    c = openai.OpenAI(base_url=edge.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    try:
        for _ in c.completions.create(model="demo", prompt="x", max_tokens=max_tokens, stream=True,
                                      extra_body={"ignore_eos": True}):
            pass
        out.append(1)
    except openai.APIStatusError as exc:
        errors.append(exc.status_code)


def _read_until(prefix: str, predicate, timeout: float = 10.0):
    client = sync_client()
    deadline = time.monotonic() + timeout
    got = None
    while time.monotonic() < deadline:
        got = read_edge_signals(client, time.time(), prefix=prefix)
        if predicate(got):
            return got
        time.sleep(0.05)
    raise AssertionError(f"edge signals never matched: {got!r}")


def test_the_edge_publishes_the_backlog_its_cap_holds(edge_factory, slow_sim, prefix):
    cfg = standalone_config([slow_sim.url], [{"name": "t", "keys": [{"dev_key": KEY}]}], settings={
        "max_inflight_per_replica": 1, "health_interval_s": 600, "signals_interval_s": 0.1,
        "redis_key_prefix": prefix, "edge_id": "edge-e2e", "queue_timeout_s": 20})
    edge = edge_factory(cfg, redis_url=SHARED_REDIS)
    done: list = []
    errors: list = []
    threads = [threading.Thread(target=_stream, args=(edge, 600, done, errors)) for _ in range(6)]
    for t in threads:
        t.start()
    # One request runs on the single slot; the engine sees one, the edge holds the rest.
    during = _read_until(prefix, lambda g: "demo" in g and g["demo"].queue_depth >= 3)
    assert during["demo"].inflight == 1 and during["demo"].edges == 1 and during.live_edges == 1
    for t in threads:
        t.join(60)
    assert len(done) == 6 and not errors
    after = _read_until(prefix, lambda g: "demo" in g and g["demo"].ttft_samples >= 6 and g["demo"].queue_depth == 0)
    m = after["demo"]
    # Queued requests waited for the ones before them: the client-side TTFT includes that wait.
    assert m.queue_wait_p90_s is not None and m.queue_wait_p90_s > 0.2
    assert m.ttft_p90_s is not None and m.ttft_p90_s >= m.queue_wait_p90_s
    # The edge's /metrics shows its publishes.
    import urllib.request

    metrics = urllib.request.urlopen(edge.url + "/metrics", timeout=5).read().decode()
    assert 'nimbus_edge_signals_publishes_total{result="ok"}' in metrics


def test_queue_timeouts_are_published_as_rejections(edge_factory, slow_sim, prefix):
    cfg = standalone_config([slow_sim.url], [{"name": "t", "keys": [{"dev_key": KEY}]}], settings={
        "max_inflight_per_replica": 1, "health_interval_s": 600, "signals_interval_s": 0.1,
        "redis_key_prefix": prefix, "queue_timeout_s": 0.3})
    edge = edge_factory(cfg, redis_url=SHARED_REDIS)
    done: list = []
    errors: list = []
    blocker = threading.Thread(target=_stream, args=(edge, 2000, done, errors))
    blocker.start()
    _read_until(prefix, lambda g: "demo" in g and g["demo"].inflight == 1)  # the one slot is taken
    late = [threading.Thread(target=_stream, args=(edge, 1, done, errors)) for _ in range(3)]
    for t in late:
        t.start()
    for t in [blocker, *late]:
        t.join(60)
    assert errors == [503, 503, 503]
    got = _read_until(prefix, lambda g: "demo" in g and g["demo"].rejections.get("503/queue_timeout") == 3)
    assert got["demo"].capacity_rejections == 3


def test_requests_held_for_a_cold_pool_are_published(edge_factory, control_plane, prefix):
    key = make_key("cold")
    cp = control_plane(cp_snapshot([], [key], pool_kind="scale_to_zero"))  # no replica: nothing to route to
    edge = edge_factory(None, control_plane_url=cp.url, env={"NIMBUS_EDGE_TOKEN": cp.token}, redis_url=SHARED_REDIS,
                        settings={"activation_timeout_s": 3, "signals_interval_s": 0.1, "redis_key_prefix": prefix})
    errors: list = []

    def call() -> None:
        c = openai.OpenAI(base_url=edge.url + "/v1", api_key=key, max_retries=0, timeout=30)
        try:
            c.completions.create(model="demo", prompt="wake up", max_tokens=1)
        except openai.APIStatusError as exc:
            errors.append(exc.response.json()["error"]["code"])

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    held = _read_until(prefix, lambda g: "demo" in g and g["demo"].activation_waiting == 3)
    assert held["demo"].waiting == 3 and held["demo"].queue_depth == 0
    for t in threads:
        t.join(30)
    assert errors == ["model_cold_start"] * 3  # nothing came up within the activation timeout
    after = _read_until(prefix, lambda g: "demo" in g and g["demo"].activation_waiting == 0)
    assert after["demo"].rejections == {"503/model_cold_start": 3}
