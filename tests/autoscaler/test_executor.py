"""The autoscaler executor on Postgres: agents' metrics in the rows → decisions → desired state.

Replica rows are written here the way the agent API writes them (state, metrics from the
engine's /metrics); the agent itself is exercised in tests/agent and tests/e2e.
"""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from sqlalchemy import select

from controlplane.db.engine import session_scope
from controlplane.fleet.autoscaling import autoscale_pool, autoscale_tick, histogram_quantile
from controlplane.fleet.reconcile import fleet_tick
from controlplane.models import (
    AutoscalerDecision,
    Model,
    ModelVariant,
    Node,
    NodeState,
    Pool,
    PoolKind,
    Quota,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
    Tenant,
    UsageMinute,
)

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def make_pool(settings, *, kind=PoolKind.warm, min_replicas=1, max_replicas=4, replicas=1, metrics=None,
              idle_timeout_s=900, tenant_quota=None, gpu_count=1) -> uuid.UUID:
    with session_scope(settings) as s:
        variant = ModelVariant(tier="bf16", model_path="m", gpu_memory_gb=20, context_length=8192, gpu_count=gpu_count)
        s.add(Model(name=f"m-{uuid.uuid4().hex[:6]}", variants=[variant]))
        tenant_id = None
        if tenant_quota is not None:
            tenant = Tenant(name=f"t-{uuid.uuid4().hex[:6]}")
            s.add(tenant)
            s.flush()
            s.add(Quota(tenant_id=tenant.id, max_gpus=tenant_quota))
            tenant_id = tenant.id
        s.flush()
        pool = Pool(name=f"p-{uuid.uuid4().hex[:6]}", variant_id=variant.id, kind=kind, min_replicas=min_replicas,
                    max_replicas=max_replicas, desired_replicas=replicas, idle_timeout_s=idle_timeout_s,
                    ttft_slo_ms=1000, dedicated_tenant_id=tenant_id,
                    placement=[{"cloud": "local", "region": "local"}])
        s.add(pool)
        s.flush()
        for i in range(replicas):
            node = Node(state=NodeState.ready, launch_token=uuid.uuid4().hex, gpus_total=gpu_count,
                        cloud="local", region="local", zone="local-a", instance_id=f"local-{i}",
                        launch_spec={"cloud": "local", "region": "local", "gpu_count": gpu_count, "gpu_type": "sim"})
            s.add(node)
            s.flush()
            s.add(Replica(node_id=node.id, pool_id=pool.id, variant_id=variant.id, state=ReplicaState.ready,
                          gpu_ids=list(range(gpu_count)),
                          url=f"http://127.0.0.1:{30000 + i}", max_running_requests=32,
                          started_at=T0 - dt.timedelta(hours=1), ready_at=T0 - dt.timedelta(minutes=59),
                          model_ready_seconds=40.0, metrics=dict(metrics or {})))
        return pool.id


def tick(settings, pool_id, now) -> str:
    with session_scope(settings) as s:
        pool = s.get(Pool, pool_id)
        return autoscale_pool(s, pool, now, settings)


def pool_row(settings, pool_id) -> Pool:
    with session_scope(settings) as s:
        return s.get(Pool, pool_id)


SATURATED = {"num_running_reqs": 32, "num_queue_reqs": 60, "token_usage": 0.97,
             "num_requests_per_s": 20.0, "prompt_tokens_per_s": 20000.0, "generation_tokens_per_s": 2000.0,
             "histograms": {"time_to_first_token_seconds": {
                 "buckets": {"0.5": 2, "1.0": 5, "5.0": 40, "+Inf": 40}, "sum": 120.0, "count": 40}}}


def test_histogram_quantile() -> None:
    h = SATURATED["histograms"]["time_to_first_token_seconds"]
    assert histogram_quantile(h, 0.05) == 0.5
    assert histogram_quantile(h, 0.95) == 5.0
    assert histogram_quantile({"count": 0}, 0.95) is None


def test_saturated_replica_scales_up_and_records_why(settings) -> None:
    pool_id = make_pool(settings, metrics=SATURATED)
    assert tick(settings, pool_id, T0) == "scale_up"
    pool = pool_row(settings, pool_id)
    assert 1 < pool.desired_replicas <= 4
    assert pool.autoscaler_state  # the policy's memory is persisted
    with session_scope(settings) as s:
        (d,) = s.scalars(select(AutoscalerDecision).where(AutoscalerDecision.pool_id == pool_id)).all()
        assert d.action == "scale_up" and d.target_replicas == pool.desired_replicas and d.current_replicas == 1
        assert d.reasons and d.signals  # the why is stored with the decision
        assert any("panic" in r or "scale up" in r.lower() or "need" in r for r in d.reasons), d.reasons


def test_idle_pool_shrinks_only_after_the_hold_and_the_fleet_stops_replicas_not_nodes(settings) -> None:
    idle = {"num_running_reqs": 0, "num_queue_reqs": 0, "token_usage": 0.01}
    pool_id = make_pool(settings, replicas=3, min_replicas=1, max_replicas=4, metrics=idle)
    assert tick(settings, pool_id, T0) in ("hold", "scale_down")
    first = pool_row(settings, pool_id).desired_replicas
    # within a minute nothing is taken away
    for k in range(1, 6):
        tick(settings, pool_id, T0 + dt.timedelta(seconds=10 * k))
    assert pool_row(settings, pool_id).desired_replicas == first == 3
    # after the scale-down hold the pool gives capacity back
    for k in range(1, 80):
        tick(settings, pool_id, T0 + dt.timedelta(seconds=60 + 10 * k))
    pool = pool_row(settings, pool_id)
    with session_scope(settings) as s:
        last = s.scalars(select(AutoscalerDecision).where(AutoscalerDecision.pool_id == pool_id)
                         .order_by(AutoscalerDecision.created_at.desc())).first()
        actions = s.scalars(select(AutoscalerDecision.action).where(AutoscalerDecision.pool_id == pool_id)).all()
    assert pool.desired_replicas < 3, (last.reasons, last.signals)
    assert "scale_down" in actions
    # The autoscaler only says how many; the fleet tick picks which replicas stop (by draining,
    # never killing), and leaves their nodes to the empty-node TTL.
    with session_scope(settings) as s:
        assert fleet_tick(s, settings, T0 + dt.timedelta(seconds=900)).stopped == 3 - pool.desired_replicas
    with session_scope(settings) as s:
        replicas = s.scalars(select(Replica).where(Replica.pool_id == pool_id)).all()
        stopping = [r for r in replicas if r.desired_state == ReplicaDesiredState.stopped]
        assert len(stopping) == 3 - pool.desired_replicas
        assert {r.state for r in stopping} == {ReplicaState.draining}
        assert all(r.drain_deadline_at is not None for r in stopping)
        nodes = s.scalars(select(Node).where(Node.id.in_([r.node_id for r in replicas]))).all()
        assert {n.state for n in nodes} == {NodeState.ready}  # no node is drained for a scale-down


def test_scale_to_zero_after_idle_timeout_and_back_on_activation(settings) -> None:
    idle = {"num_running_reqs": 0, "num_queue_reqs": 0, "token_usage": 0.0}
    pool_id = make_pool(settings, kind=PoolKind.scale_to_zero, min_replicas=0, max_replicas=2, replicas=1,
                        metrics=idle, idle_timeout_s=120)
    with session_scope(settings) as s:
        s.get(Pool, pool_id).last_request_at = T0
    tick(settings, pool_id, T0 + dt.timedelta(seconds=30))
    assert pool_row(settings, pool_id).desired_replicas == 1  # not idle long enough
    for k in range(0, 40):
        tick(settings, pool_id, T0 + dt.timedelta(seconds=130 + 10 * k))
    assert pool_row(settings, pool_id).desired_replicas == 0
    # the edge asks for the pool (a request is being held): it comes back
    now = T0 + dt.timedelta(seconds=1000)
    with session_scope(settings) as s:
        s.get(Pool, pool_id).activation_requested_at = now
    tick(settings, pool_id, now + dt.timedelta(seconds=1))
    assert pool_row(settings, pool_id).desired_replicas >= 1


def test_dedicated_pool_never_exceeds_the_tenant_gpu_quota(settings) -> None:
    pool_id = make_pool(settings, metrics=SATURATED, max_replicas=8, tenant_quota=2)
    for k in range(5):
        tick(settings, pool_id, T0 + dt.timedelta(seconds=5 * k))
    assert pool_row(settings, pool_id).desired_replicas <= 2


def test_tick_covers_every_unpaused_pool(settings) -> None:
    busy = make_pool(settings, metrics=SATURATED)
    paused = make_pool(settings, metrics=SATURATED)
    with session_scope(settings) as s:
        s.get(Pool, paused).paused = True
    with session_scope(settings) as s:
        counts = autoscale_tick(s, settings, T0)
    assert counts.get("scale_up") == 1
    assert pool_row(settings, busy).desired_replicas > 1 and pool_row(settings, paused).desired_replicas == 1


@pytest.fixture
def settings(db_url, tmp_path):
    from controlplane.config import Settings

    return Settings(database_url=db_url, state_dir=tmp_path, drain_timeout_s=120)


def test_operator_overrides_reach_the_policy(db_url, tmp_path) -> None:
    from controlplane.config import Settings
    from controlplane.fleet.autoscaling import config_from

    assert config_from(Settings(database_url=db_url, autoscaler_overrides={"scale_down_hold_s": 42})).scale_down_hold_s == 42
    with pytest.raises(ValueError, match="scale_down_hold"):
        config_from(Settings(database_url=db_url, autoscaler_overrides={"scale_down_hold": 42}))


LIVE = {"num_running_reqs": 1, "num_requests_per_s": 2.0, "prompt_tokens_per_s": 30.0,
        "generation_tokens_per_s": 20.0}


def observe_with_usage(settings, minutes: list[tuple[dt.datetime, int, int]], now: dt.datetime,
                       output_token_weight: float | None = None):
    """One pool whose replica reports ``LIVE``, with usage minutes (start, prompt, completion
    tokens) rolled up for its variant: what ``observe`` makes of them."""
    from controlplane.fleet.autoscaling import observe

    pool_id = make_pool(settings, metrics=LIVE)
    with session_scope(settings) as s:
        pool = s.get(Pool, pool_id)
        pool.variant.output_token_weight = output_token_weight
        tenant = Tenant(name=f"t-{uuid.uuid4().hex[:6]}")
        s.add(tenant)
        s.flush()
        for minute, prompt, completion in minutes:
            s.add(UsageMinute(tenant_id=tenant.id, variant_id=pool.variant_id, minute=minute, requests=60,
                              prompt_tokens=prompt, completion_tokens=completion))
        s.flush()
        return pool_id, observe(s, pool, now)


def test_rate_history_holds_only_finished_minutes_and_ends_with_the_live_rate(settings) -> None:
    """The minute still running is not a rate yet: stamped at its end (in the future) with a
    partial count it put the history out of order, so the forecast's windows dropped the live
    sample after it and kept sizing the pool from minutes that were over."""
    now = T0 + dt.timedelta(minutes=2, seconds=30)
    _, seen = observe_with_usage(settings, [(T0 + dt.timedelta(minutes=1), 6000, 0),
                                            (T0 + dt.timedelta(minutes=2), 600, 0)], now)
    history = list(seen.obs.token_rate_history)
    assert history == [((T0 + dt.timedelta(minutes=2)).timestamp(), 100.0), (now.timestamp(), 50.0)]
    assert [t for t, _ in history] == sorted(t for t, _ in history)
    assert seen.obs.last_request_at == now.timestamp()  # busy now; the running minute still counts as use


def test_generated_tokens_weigh_what_the_profile_says_in_history_live_rate_and_decision(settings) -> None:
    """The variant's output_token_weight reaches every token rate the policy sizes with: the
    usage rollup's minutes and the engines' live rates (both count prompt and generated tokens
    apart), and the stored decision says the rate was weighted."""
    now = T0 + dt.timedelta(minutes=2, seconds=30)
    pool_id, seen = observe_with_usage(settings, [(T0 + dt.timedelta(minutes=1), 600, 300)], now,
                                       output_token_weight=4.0)
    # (600 + 4 × 300) / 60 s and 30 + 4 × 20: not the plain sums (15 and 50 tok/s).
    assert list(seen.obs.token_rate_history) == [((T0 + dt.timedelta(minutes=2)).timestamp(), 30.0),
                                                 (now.timestamp(), 110.0)]
    tick(settings, pool_id, now)
    with session_scope(settings) as s:
        decision = s.scalars(select(AutoscalerDecision).where(AutoscalerDecision.pool_id == pool_id)).one()
        assert decision.signals["output_token_weight"] == 4.0
        assert decision.signals["token_rate"] == 110.0


# ---------------------------------------------------------------- scheduled capacity
WEEKDAYS_9_TO_18 = [{"days": ["mon", "tue", "wed", "thu", "fri"], "start": "09:00", "end": "18:00",
                     "min_replicas": 3}]


def test_scheduled_floor_holds_the_pool_up_inside_its_window_and_says_so(settings) -> None:
    idle = {"num_running_reqs": 0, "num_queue_reqs": 0, "token_usage": 0.0}
    pool_id = make_pool(settings, replicas=1, min_replicas=1, max_replicas=4, metrics=idle)
    with session_scope(settings) as s:
        s.get(Pool, pool_id).schedule = WEEKDAYS_9_TO_18
    # T0 is Sunday 2026-11-29 12:00 UTC: no window applies, the pool stays at its minimum.
    assert tick(settings, pool_id, T0) == "hold"
    assert pool_row(settings, pool_id).desired_replicas == 1
    monday_noon = T0 + dt.timedelta(days=1)
    assert tick(settings, pool_id, monday_noon) == "scale_up"
    assert pool_row(settings, pool_id).desired_replicas == 3
    with session_scope(settings) as s:
        d = s.scalars(select(AutoscalerDecision).where(AutoscalerDecision.pool_id == pool_id)
                      .order_by(AutoscalerDecision.created_at.desc())).first()
    assert d.signals["scheduled_min_replicas"] == 3
    assert any(r.startswith("schedule: mon,tue,wed,thu,fri 09:00–18:00 min 3") for r in d.reasons), d.reasons


def test_scheduled_window_is_warm_before_it_opens(settings) -> None:
    """The floor applies one pre-warm horizon early (p90 model-ready time, 40 s here, plus a tick)."""
    pool_id = make_pool(settings, replicas=1, min_replicas=1, max_replicas=4,
                        metrics={"num_running_reqs": 0, "num_queue_reqs": 0})
    with session_scope(settings) as s:
        s.get(Pool, pool_id).schedule = WEEKDAYS_9_TO_18
    monday_9 = dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.UTC)
    tick(settings, pool_id, monday_9 - dt.timedelta(minutes=10))
    assert pool_row(settings, pool_id).desired_replicas == 1  # too early
    tick(settings, pool_id, monday_9 - dt.timedelta(seconds=30))
    assert pool_row(settings, pool_id).desired_replicas == 3  # ready by 09:00


def test_a_replica_moving_to_a_slower_gpu_type_counts_at_that_types_throughput_from_the_moves_start(settings) -> None:
    """Consolidation moves replica A from an H100 node to an L40S one (its copy still loading): the
    pool's per-replica throughput is already the mean over (L40S, H100), so the autoscaler adds
    the replicas the slower type needs beside the copy, not a model-ready time after A stopped.
    A ready copy is observed as a replica of its own, so the substitution ends with the load."""
    from controlplane.fleet.autoscaling import observe

    pool_id = make_pool(settings, replicas=2)
    with session_scope(settings) as s:
        pool = s.get(Pool, pool_id)
        pool.variant.profiled_tokens_per_s = {"h100": 9000.0, "l40s": 3000.0}
        a, b = s.scalars(select(Replica).where(Replica.pool_id == pool_id).order_by(Replica.url)).all()
        for r in (a, b):
            r.node.launch_spec = {**r.node.launch_spec, "gpu_type": "h100"}
        target = Node(state=NodeState.booting, launch_token=uuid.uuid4().hex, gpus_total=4, cloud="local",
                      region="local", zone="local-a", instance_id="local-l40s",
                      launch_spec={"cloud": "local", "region": "local", "gpu_count": 4, "gpu_type": "l40s"})
        s.add(target)
        s.flush()
        s.add(Replica(node_id=target.id, pool_id=pool_id, variant_id=a.variant_id, state=ReplicaState.starting,
                      gpu_ids=[0], replaces_id=a.id, max_running_requests=32, metrics={}))
        s.flush()
        assert observe(s, pool, T0).spec.replica_tokens_per_s == pytest.approx((3000.0 + 9000.0) / 2)
        copy = s.scalars(select(Replica).where(Replica.replaces_id == a.id)).one()
        copy.state = ReplicaState.ready  # it takes over; A drains
        a.state = ReplicaState.draining
        s.flush()
        # The ready copy is a row of its own (L40S) beside A (H100, draining) and B (H100).
        assert observe(s, pool, T0).spec.replica_tokens_per_s == pytest.approx((9000.0 + 9000.0 + 3000.0) / 3)


def test_serving_gpu_types_substitutes_only_the_moving_replicas() -> None:
    from controlplane.fleet.capacity import serving_gpu_types

    assert serving_gpu_types({"a": "h100", "b": "h100", "c": None}, [("a", "l40s"), ("z", "l4")]) == ["l40s", "h100", None]
    assert serving_gpu_types({}, [("a", "l40s")]) == []


def test_only_a_pool_whose_scale_down_keeps_its_replica_warm_gets_the_fleets_hysteresis(settings) -> None:
    idle = {"num_running_reqs": 0, "num_queue_reqs": 0, "token_usage": 0.01}
    alone = make_pool(settings, replicas=3, max_replicas=4, metrics=idle)  # each replica on a node of its own
    shared = make_pool(settings, replicas=3, max_replicas=4, metrics=idle)
    with session_scope(settings) as s:  # the same three replicas on one 8-GPU node
        replicas = s.scalars(select(Replica).where(Replica.pool_id == shared)).all()
        node = s.get(Node, replicas[0].node_id)
        node.gpus_total, node.launch_spec = 8, {**node.launch_spec, "gpu_count": 8}
        for i, r in enumerate(replicas):
            r.node_id, r.gpu_ids = node.id, [i]
    for pool_id in (alone, shared):
        tick(settings, pool_id, T0)
    with session_scope(settings) as s:
        signals = {p: s.scalars(select(AutoscalerDecision.signals).where(AutoscalerDecision.pool_id == p)).one()
                   for p in (alone, shared)}
    # Alone, a scale-down stops the replica and its VM goes: the policy holds it 300 s.
    assert (signals[alone]["warm_surplus"], signals[alone]["scale_down_hold_s"]) == (False, 300.0)
    # Sharing, it would stay as a spare on a node billed anyway: the fleet holds it.
    assert (signals[shared]["warm_surplus"], signals[shared]["scale_down_hold_s"]) == (True, 180.0)
    off = settings.model_copy(update={"spare_replicas_enabled": False})
    with session_scope(off) as s:
        autoscale_pool(s, s.get(Pool, shared), T0 + dt.timedelta(seconds=60), off)
    with session_scope(settings) as s:
        last = s.scalars(select(AutoscalerDecision).where(AutoscalerDecision.pool_id == shared)
                         .order_by(AutoscalerDecision.created_at.desc())).first()
    assert last.signals["warm_surplus"] is False  # no spares, no warm surplus
