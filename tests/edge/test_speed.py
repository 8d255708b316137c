"""Each replica's own prefill and decode pace, learned from what it streams, relative to its peers."""

from __future__ import annotations

import random

import pytest

from dataplane.edge.speed import MIN_SAMPLES, SAME, ReplicaSpeeds
from tests.edge.test_routing import catalog, make_router, route


def test_a_mixed_fleet_learns_which_replicas_are_slower_than_their_peers():
    speeds = ReplicaSpeeds()
    rng = random.Random(1)
    # r0, r2 stream a token every ~6 ms (H100-like), r1, r3 every ~24 ms (L40S-like, 4x slower)
    # and prefill 2.7x slower; jitter of +-20 % on every sample
    for _ in range(40):
        for rid, tpot_ms, prefill_ms in (("r0", 6, 100), ("r1", 24, 270), ("r2", 6, 100), ("r3", 24, 270)):
            speeds.observe_decode(rid, "v", 101, 100 * tpot_ms / 1000 * rng.uniform(0.8, 1.2))
            speeds.observe_prefill(rid, "v", 2000, 150.0, prefill_ms * rng.uniform(0.8, 1.2))
    fast, slow = speeds.pace("r0"), speeds.pace("r1")
    # relative to the geometric mean of the four: 4x apart in decode, 2.7x in prefill
    assert slow.decode / fast.decode == pytest.approx(4.0, rel=0.15)
    assert slow.prefill / fast.prefill == pytest.approx(2.7, rel=0.15)
    assert fast.decode == pytest.approx(0.5, rel=0.15) and slow.decode == pytest.approx(2.0, rel=0.15)
    # a replica of another variant is measured against its own peers only
    speeds.observe_decode("other", "w", 101, 10.0)
    assert speeds.pace("other") == SAME


def test_paces_stay_neutral_until_there_is_enough_to_compare_and_follow_the_fleet_as_it_changes():
    speeds = ReplicaSpeeds()
    for _ in range(MIN_SAMPLES - 1):
        speeds.observe_decode("fast", "v", 101, 0.6)
        speeds.observe_decode("slow", "v", 101, 2.4)
    assert speeds.pace("slow") == SAME  # too few samples to say
    speeds.observe_decode("fast", "v", 101, 0.6)
    assert speeds.pace("slow") == SAME  # only one replica can be judged: nothing to compare it with
    speeds.observe_decode("slow", "v", 101, 2.4)
    assert speeds.pace("slow").decode == pytest.approx(2.0, rel=0.01)
    # short answers and small prefills say nothing about the GPU
    speeds.observe_decode("slow", "v", 3, 100.0)
    speeds.observe_prefill("slow", "v", 40, 1.0, 100.0)
    assert speeds.pace("slow").decode == pytest.approx(2.0, rel=0.01) and speeds.pace("slow").prefill == 1.0
    speeds.retain({"slow"})  # its only peer left: no reference any more
    assert speeds.pace("slow") == SAME


def test_a_uniformly_loaded_fleet_keeps_every_pace_near_one():
    """Samples from replicas of one GPU type, each busy in turn (a busy one's steps take up to 1.5x
    longer): no replica is singled out as slow, so load alone never steers traffic away."""
    speeds = ReplicaSpeeds()
    rng = random.Random(2)
    for step in range(400):
        for i, rid in enumerate(("a", "b", "c", "d")):
            busy = 1.5 if (step // 25) % 4 == i else 1.0
            speeds.observe_decode(rid, "v", 60, 59 * 0.008 * busy * rng.uniform(0.8, 1.2))
    for rid in "abcd":
        assert 0.75 < speeds.pace(rid).decode < 1.33


def test_one_stalled_request_does_not_make_a_replica_look_broken():
    speeds = ReplicaSpeeds()
    for _ in range(20):
        for rid in ("a", "b"):
            speeds.observe_prefill(rid, "v", 1000, 50.0, 50.0)
    speeds.observe_prefill("a", "v", 1000, 50.0, 60_000.0)  # a minute behind a full KV cache, once
    assert speeds.pace("a").prefill < 1.25


def test_the_router_scores_a_mixed_fleet_by_each_replicas_own_speed():
    """Through the router: replicas 0 and 2 stream 4x faster than 1 and 3. Once that is learned a
    cold prompt goes to a fast replica even when it runs a few more requests than a slow one, and
    the prediction of a slow replica's TTFT is its own."""
    cat = catalog(n=4, max_running=100)
    router = make_router(prefill_ms_per_token=0.05, decode_ms_per_running=2.0)
    now = 0.0
    ids = sorted(cat.replicas)
    for i in range(40):
        target = ids[i % 4]  # every replica serves its share while the speeds are learned
        _, ticket = route(router, cat, f"cold prompt {i} " * 100, now=now, exclude=set(ids) - {target})
        slow = target in ("rep1", "rep3")
        uncached = ticket.uncached_tokens
        router.first_byte(ticket, now + (0.002 + uncached * 0.05 / 1000) * (2.7 if slow else 1.0))
        router.release(ticket, True, now + 0.5 + 63 * (0.024 if slow else 0.006), reported=(uncached, 64, 0))
        now += 10.0  # one at a time: every sample is a settled one
    assert all(router.speeds.pace(f"rep{i}").decode > 1.5 for i in (1, 3))
    assert all(router.speeds.pace(f"rep{i}").decode < 0.75 for i in (0, 2))
    # a few more requests running on the fast replicas than on the slow ones
    loads = {rid: router.load(rid) for rid in ("rep0", "rep1", "rep2", "rep3")}
    loads["rep0"].inflight = loads["rep2"].inflight = 6
    loads["rep1"].inflight = loads["rep3"].inflight = 3
    decision, _ = route(router, cat, "a new tenant's long system prompt " * 120, now=now)
    assert decision.replica.id in ("rep0", "rep2")
    # the same fleet without learned speeds sends it to an idler, slower replica
    naive = make_router(prefill_ms_per_token=0.05, decode_ms_per_running=2.0)
    for rid, load in loads.items():
        naive.load(rid).inflight = load.inflight
    decision, _ = route(naive, cat, "a new tenant's long system prompt " * 120, now=now)
    assert decision.replica.id in ("rep1", "rep3")
