"""The edges' signals in the policy: their backlog is demand, their client-side TTFT is what the
SLO is judged on, and every decision names them."""

from __future__ import annotations

import math

from controlplane.autoscaler import AutoscalerState, EdgeSignals, PoolObservation, decide

from .conftest import Driver, make_replica, make_spec, pool_at

SLO = 2.0


def edge(**kw) -> EdgeSignals:
    base = dict(edges=2, queue_depth=0, inflight=0, ttft_p90_s=0.5, ttft_samples=200, window_s=30.0)
    base.update(kw)
    return EdgeSignals(**base)


def settled_pool(n: int = 4, engine_ttft: float = 0.8):
    """n ready replicas at 60% of their batch slots, engines' p95 TTFT well inside the SLO."""
    return pool_at(n, 0.6, ttft=engine_ttft)


def test_slo_breach_seen_only_at_the_edge_grows_the_pool():
    spec = make_spec(ttft_slo_s=SLO)
    replicas = settled_pool()
    breached, _ = decide(spec, PoolObservation(now=0.0, replicas=replicas, edge=edge(ttft_p90_s=3.1)),
                         AutoscalerState())
    assert breached.target_replicas > 4
    assert any(r == "edge TTFT p90 3.10s > SLO 2.00s" for r in breached.reasons), breached.reasons
    assert breached.signals["slo_ttft_source"] == "edge_ttft_p90_s"
    assert breached.signals["edge_ttft_p90_s"] == 3.1
    assert "slo_breach:edge_ttft_p90_s" in breached.signals["acted_on"]


def test_edge_ttft_within_the_slo_holds_even_when_the_engines_look_slow():
    spec = make_spec(ttft_slo_s=SLO)
    # The engines' p95 breaches, but clients see 1.5 s at the edge: the edge's view wins.
    replicas = settled_pool(engine_ttft=3.0)
    fine, _ = decide(spec, PoolObservation(now=0.0, replicas=replicas, edge=edge(ttft_p90_s=1.5)),
                     AutoscalerState())
    assert fine.target_replicas == 4
    assert not any("TTFT" in r for r in fine.reasons), fine.reasons
    assert fine.signals["slo_ttft_s"] == 1.5


def test_without_edge_signals_the_engines_ttft_is_judged():
    spec = make_spec(ttft_slo_s=SLO)
    calm, _ = decide(spec, PoolObservation(now=0.0, replicas=settled_pool()), AutoscalerState())
    assert calm.target_replicas == 4 and calm.signals["slo_ttft_source"] == "engine_ttft_p95_s"
    assert calm.signals["edges"] == 0 and calm.signals["edge_queue"] is None
    slow, _ = decide(spec, PoolObservation(now=0.0, replicas=settled_pool(engine_ttft=3.0)), AutoscalerState())
    assert slow.target_replicas > 4
    assert any(r.startswith("engine TTFT p95 3.00s") for r in slow.reasons), slow.reasons
    # An edge p90 of a handful of requests is noise: the engines' p95 is used instead.
    few, _ = decide(spec, PoolObservation(now=0.0, replicas=settled_pool(),
                                          edge=edge(ttft_p90_s=9.0, ttft_samples=5)), AutoscalerState())
    assert few.target_replicas == 4 and few.signals["slo_ttft_source"] == "engine_ttft_p95_s"


def test_breach_waits_while_replicas_are_starting():
    spec = make_spec(ttft_slo_s=SLO)
    replicas = (*settled_pool(), make_replica(9, state="starting", started_at=0.0))
    state = AutoscalerState(target=5)
    decision, _ = decide(spec, PoolObservation(now=0.0, replicas=replicas, edge=edge(ttft_p90_s=3.1)), state)
    assert decision.target_replicas == 5  # the starting replica is the answer already on its way
    assert not any("TTFT" in r for r in decision.reasons)


def test_a_breach_is_judged_on_the_window_its_ttft_covers():
    """The edges' p90 covers their 30-s window: for that long after a panic it still holds the
    burst's TTFT, even where the engines' query range (``ttft_window_s``) is shorter. A pool
    scaled down soon after a burst used to read it as a breach and grow again."""
    from controlplane.autoscaler import AutoscalerConfig

    config = AutoscalerConfig(ttft_window_s=10.0)
    spec = make_spec(ttft_slo_s=SLO)
    state = AutoscalerState(target=4, panic_since=-60.0, panic_until=0.0, last_scale_up_at=-300.0)
    obs = lambda t: PoolObservation(now=t, replicas=settled_pool(), edge=edge(ttft_p90_s=3.1, window_s=30.0))  # noqa: E731
    within, _ = decide(spec, obs(20.0), state, config)
    after, _ = decide(spec, obs(31.0), state, config)
    assert within.target_replicas == 4 and not any("TTFT" in r for r in within.reasons), within.reasons
    assert after.target_replicas > 4 and "slo_breach:edge_ttft_p90_s" in after.signals["acted_on"], after.reasons


def saturated(n: int, slots: int = 32):
    """n ready replicas each running exactly its batch slots: the edge's per-replica cap binds,
    so the engines report no queue at all."""
    return tuple(make_replica(i, running=slots, max_running=slots, kv=0.5, ttft=0.9) for i in range(n))


def test_a_backlog_only_the_edge_sees_is_sized_in_one_decision():
    spec = make_spec(max_replicas=40)
    replicas = saturated(4)
    backlog = edge(queue_depth=96, inflight=128, queue_wait_p90_s=4.2, ttft_p90_s=4.8)
    blind, _ = decide(spec, PoolObservation(now=0.0, replicas=replicas), AutoscalerState())
    seen, _ = decide(spec, PoolObservation(now=0.0, replicas=replicas, edge=backlog), AutoscalerState())
    # The 128 running plus the 96 waiting need (128 + 96) / 32 = 7 replicas' batch slots, 8.2 at
    # the planned utilization: all of it in this decision, not one replica per tick.
    needed = math.ceil((128 + 96) / 32 / 0.85)
    assert seen.target_replicas >= needed
    assert seen.target_replicas <= 2 * needed
    # Without the edge the same pool looks merely full: its headroom, well short of the backlog.
    assert blind.target_replicas < needed
    assert seen.signals["edge_queue"] == 96 and seen.signals["queue_total"] == 96
    assert seen.signals["engine_queue"] == 0
    assert "edge_queue" in seen.signals["acted_on"]
    assert any(r.startswith("edge queue 96 waiting on 2 edge(s), queue wait p90 4.20s") for r in seen.reasons), \
        seen.reasons


def test_a_backlog_is_added_to_the_served_token_rate():
    capacity = 1000.0  # tok/s per replica inside the SLO (profiled)
    spec = make_spec(max_replicas=40, replica_tokens_per_s=capacity)
    history = [(float(t), 4 * capacity) for t in range(-60, 1, 5)]  # the 4 replicas serve their full rate
    obs = PoolObservation(now=0.0, replicas=saturated(4), token_rate_history=history,
                          edge=edge(queue_depth=96, inflight=128))
    decision, _ = decide(spec, obs, AutoscalerState())
    assert decision.signals["rate_units"] == 4.0
    assert decision.signals["edge_backlog_units"] == round(96 / 32 / 0.85, 3)
    assert decision.target_replicas >= math.ceil(4 + 96 / 32 / 0.85)


def test_a_standing_edge_backlog_does_not_add_a_replica_per_tick():
    """While the new replicas start, the same backlog must not grow the target again each tick."""
    spec = make_spec(max_replicas=40)
    driver = Driver(spec)
    backlog = edge(queue_depth=96, inflight=128)
    first = driver.tick(PoolObservation(now=0.0, replicas=saturated(4), edge=backlog))
    grown = first.target_replicas
    starting = tuple(make_replica(100 + i, state="starting", started_at=0.0) for i in range(grown - 4))
    targets = [driver.tick(PoolObservation(now=5.0 * k, replicas=saturated(4) + starting, edge=backlog)).target_replicas
               for k in range(1, 12)]
    assert set(targets) == {grown}, targets


def test_requests_at_the_edge_keep_a_scale_to_zero_pool_up():
    spec = make_spec(kind="scale_to_zero", idle_timeout_s=60.0)
    one = pool_at(1, 0.0)
    quiet, _ = decide(spec, PoolObservation(now=1000.0, replicas=one, last_request_at=0.0, edge=edge()),
                      AutoscalerState())
    assert quiet.target_replicas == 0
    held, _ = decide(spec, PoolObservation(now=1000.0, replicas=one, last_request_at=0.0,
                                           edge=edge(inflight=2)), AutoscalerState())
    assert held.target_replicas == 1


def test_capacity_rejections_are_cited():
    spec = make_spec()
    rejected = edge(queue_depth=10, inflight=64, rejections={"503/queue_timeout": 7, "503/overloaded": 2,
                                                              "429/tokens": 40})
    decision, _ = decide(spec, PoolObservation(now=0.0, replicas=saturated(2), edge=rejected), AutoscalerState())
    assert decision.signals["edge_rejections"]["429/tokens"] == 40
    assert "edge rejected 9 for capacity over 30s (2 503/overloaded, 7 503/queue_timeout)" in decision.reasons
