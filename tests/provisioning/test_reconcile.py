"""The fleet tick on Postgres: write-before-launch, replica drains then node release, the fleet-wide
advisory lock, and a statement count that stays flat as pools and nodes grow.

The fleet is seeded straight into the database by the reconcile bench (bench/controlplane/reconcile.py):
ready nodes with live-looking agents, each hosting ready 1-GPU replicas of several pools.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random

import pytest
from sqlalchemy import func, select, update

from bench.controlplane.reconcile import bench_catalog, churn, measure_tick, reset, seed
from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import reconcile
from controlplane.fleet.provisioning import launch_key, terminate_key
from controlplane.models import (
    AuditEvent,
    Node,
    NodeState,
    Operation,
    OperationKind,
    OperationState,
    Pool,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
)
from controlplane.services import agents
from controlplane.services.catalog import import_catalog
from tests.provisioning.helpers import tick


def set_desired(settings, pool_id, n: int, **values) -> None:
    with session_scope(settings) as s:
        s.execute(update(Pool).where(Pool.id == pool_id).values(desired_replicas=n, **values))


def tick_at(settings, now: dt.datetime) -> reconcile.TickResult:
    with session_scope(settings) as s:
        return reconcile.fleet_tick(s, settings, now)


def all_nodes(settings) -> list[Node]:
    with session_scope(settings) as s:
        return list(s.scalars(select(Node).order_by(Node.created_at)))


def pool_replicas(settings, pool_id) -> list[Replica]:
    with session_scope(settings) as s:
        return list(s.scalars(select(Replica).where(Replica.pool_id == pool_id).order_by(Replica.created_at)))


def all_operations(settings) -> list[Operation]:
    with session_scope(settings) as s:
        return list(s.scalars(select(Operation).order_by(Operation.created_at)))


def test_missing_replicas_are_written_with_their_node_and_launch_operation_before_any_cloud_call(settings):
    seeded = seed(settings, 1, 0)  # the catalog (one 8-GPU shape) and a pool with nothing placed
    [pool_id] = seeded.pool_ids
    set_desired(settings, pool_id, 3)
    before = utcnow()
    result = tick(settings)  # no provider is passed anywhere: the tick cannot call a cloud
    assert (result.skipped, result.pools, result.placed, result.launched, result.stopped) == (False, 1, 3, 1, 0)
    [node] = all_nodes(settings)
    assert node.state == NodeState.pending and node.instance_id is None and node.launch_token
    assert node.gpus_total == 8 and not hasattr(node, "pool_id")  # a node belongs to no pool
    spec = node.launch_spec
    assert (spec["cloud"], spec["region"], spec["instance_type"], spec["spot"]) == (
        "aws", "us-east-1", "p5.48xlarge", False)
    assert spec["zones"] and set(spec["zones"]) <= {"us-east-1a", "us-east-1b"}
    replicas = pool_replicas(settings, pool_id)
    assert [(r.node_id, r.state, r.desired_state) for r in replicas] == [
        (node.id, ReplicaState.pending, ReplicaDesiredState.running)] * 3
    assert sorted(g for r in replicas for g in r.gpu_ids) == [0, 1, 2]
    [op] = all_operations(settings)
    assert (op.kind, op.state, op.node_id, op.idempotency_key) == (
        OperationKind.launch, OperationState.pending, node.id, launch_key(node.id))
    assert op.deadline_at > before and op.pool_id == pool_id
    assert result.operations == [(op.id, OperationKind.launch)]
    # The agent, once it registers, is told exactly these replicas (rows before the agent hears of them).
    with session_scope(settings) as s:
        listed = agents.replica_list(s, s.get(Node, node.id), utcnow())
    assert sorted(e["id"] for e in listed) == sorted(str(r.id) for r in replicas)
    assert {e["desired_state"] for e in listed} == {"running"}
    # Ticking again changes nothing: the pending node's replicas already count.
    again = tick(settings)
    assert (again.placed, again.launched, again.stopped, again.terminated, again.operations) == (0, 0, 0, 0, [])
    assert len(all_nodes(settings)) == 1 and len(pool_replicas(settings, pool_id)) == 3
    assert len(all_operations(settings)) == 1


def test_scale_down_drains_a_replica_then_its_emptied_node_is_released_after_the_ttl(settings):
    settings = settings.model_copy(update={"drain_timeout_s": 60, "empty_node_ttl_s": 120})
    seeded = seed(settings, 1, 2, gpus_per_node=1)  # two ready 1-GPU nodes, one ready replica each
    [pool_id] = seeded.pool_ids
    set_desired(settings, pool_id, 1)
    t0 = utcnow()
    result = tick_at(settings, t0)
    assert (result.stopped, result.placed, result.launched, result.terminated) == (1, 0, 0, 0)
    [victim] = [r for r in pool_replicas(settings, pool_id) if r.desired_state == ReplicaDesiredState.stopped]
    [keeper] = [r for r in pool_replicas(settings, pool_id) if r.desired_state == ReplicaDesiredState.running]
    # Out of routing at once, its GPU held until the agent confirms; the node itself stays.
    assert victim.state == ReplicaState.draining and keeper.state == ReplicaState.ready
    assert victim.drain_deadline_at == t0 + dt.timedelta(seconds=60)
    assert victim.stop_reason == "scale down"
    assert {n.state for n in all_nodes(settings)} == {NodeState.ready}
    assert all_operations(settings) == []
    with session_scope(settings) as s:  # what its agent hears on its next heartbeat
        [entry] = agents.replica_list(s, s.get(Node, victim.node_id), t0)
    assert (entry["id"], entry["desired_state"], entry["drain_deadline_s"]) == (str(victim.id), "stopped", 60.0)

    # Before its deadline nothing moves: the agent may still be finishing streams.
    result = tick_at(settings, t0 + dt.timedelta(seconds=59))
    assert (result.stopped, result.launched, result.terminated) == (0, 0, 0)
    with session_scope(settings) as s:
        assert s.get(Replica, victim.id).state == ReplicaState.draining
    # The agent never confirms: the deadline writes the replica off, its node is now empty …
    result = tick_at(settings, t0 + dt.timedelta(seconds=61))
    assert (result.launched, result.terminated) == (0, 0)  # the pool is at size: nothing replaces it
    with session_scope(settings) as s:
        assert s.get(Replica, victim.id).state == ReplicaState.stopped
        emptied = s.get(Node, victim.node_id)
        assert emptied.state == NodeState.ready and emptied.empty_since == t0 + dt.timedelta(seconds=61)
    # … and is released once it stayed empty for the TTL, not before.
    assert tick_at(settings, t0 + dt.timedelta(seconds=61 + 119)).terminated == 0
    result = tick_at(settings, t0 + dt.timedelta(seconds=61 + 120))
    assert result.terminated == 1 and result.launched == 0
    with session_scope(settings) as s:
        assert s.get(Node, victim.node_id).state == NodeState.terminating
        assert s.get(Node, keeper.node_id).state == NodeState.ready
        [op] = s.scalars(select(Operation).where(Operation.node_id == victim.node_id)).all()
        assert (op.kind, op.state, op.idempotency_key) == (
            OperationKind.terminate, OperationState.pending, terminate_key(victim.node_id))
        reasons = s.scalars(select(AuditEvent.after).where(AuditEvent.target_id == str(victim.node_id),
                                                           AuditEvent.action == "node.terminating")).all()
        assert [r["reason"] for r in reasons] == ["empty: no replica placed here"]
    assert result.operations == [(op.id, OperationKind.terminate)]


def test_while_one_transaction_holds_the_fleet_lock_another_tick_skips_and_writes_nothing(settings):
    seeded = seed(settings, 4, 1)
    for p in seeded.pool_ids:
        set_desired(settings, p, 2)
    with session_scope(settings) as holder:
        assert reconcile.try_fleet_lock(holder)  # a first worker, mid-tick
        result = tick(settings)  # a second worker
        assert result.skipped and (result.pools, result.placed, result.launched, result.operations) == (0, 0, 0, [])
        with session_scope(settings) as s:
            assert s.scalar(select(func.count()).select_from(Replica)) == 4
            assert s.scalar(select(func.count()).select_from(Node)) == 1
            assert s.scalar(select(func.count()).select_from(Operation)) == 0
            assert s.scalars(select(Pool.last_reconciled_at)).all() == [None] * 4
    # Released by the holder's commit: the next tick plans the whole fleet.
    result = tick(settings)
    assert not result.skipped and (result.pools, result.placed) == (4, 4)
    assert result.launched == 0  # the seeded node had four free GPUs
    with session_scope(settings) as s:
        assert None not in s.scalars(select(Pool.last_reconciled_at)).all()


def test_statement_count_stays_flat_as_pools_and_nodes_grow(settings):
    """Steady ticks: the same statements at 8 pools on 3 nodes as at 80 pools on 30 nodes. Churn
    ticks (a quarter of the pools grow by one replica, a quarter shrink by one) too: new nodes,
    their replicas and their launch operations are written in batches, so nothing grows per pool,
    replica, new or existing node."""
    rng = random.Random(7)
    small = seed(settings, 8, 3)
    few_steady = measure_tick(settings)
    reset(settings, small)
    churn(settings, small, 0.25, rng)  # two grow, two shrink
    few = measure_tick(settings)
    more = seed(settings, 72, 3, catalog=False)
    large = dataclasses.replace(small, pool_ids=small.pool_ids + more.pool_ids,
                                node_ids=small.node_ids + more.node_ids)  # reset drops rows since small.at
    reset(settings, large)
    many_steady = measure_tick(settings)
    reset(settings, large)
    churn(settings, large, 0.25, rng)  # twenty grow, twenty shrink
    many = measure_tick(settings)
    assert (few.pools, many.pools) == (8, 80)
    assert (len(small.node_ids), len(large.node_ids)) == (3, 30)
    # The shrinking pools' replicas stay as spares (their nodes stay billed for the others), and
    # the growing pools' new replicas take their GPUs (the spares stop first): no new node.
    assert (few.placed, few.demoted, many.placed, many.demoted) == (2, 2, 20, 20)
    assert (few.evicted, many.evicted, few.stopped, many.stopped) == (2, 20, 0, 0)
    assert (few.launched, many.launched) == (0, 0)
    assert many_steady.statements == few_steady.statements, (few_steady.by_verb, many_steady.by_verb)
    assert few_steady.statements <= 12, few_steady.by_verb
    assert many.by_verb == few.by_verb, (few.by_verb, many.by_verb)


def test_paused_pool_is_neither_grown_nor_shrunk(settings):
    seeded = seed(settings, 2, 2)  # four replicas on one 8-GPU node
    grow, shrink = seeded.pool_ids
    set_desired(settings, grow, 4, paused=True)
    set_desired(settings, shrink, 0, paused=True)
    result = tick(settings)
    assert (result.placed, result.launched, result.stopped, result.operations) == (0, 0, 0, [])
    assert [r.desired_state for r in pool_replicas(settings, grow) + pool_replicas(settings, shrink)] == [
        ReplicaDesiredState.running] * 4
    assert all_operations(settings) == []
    # Unpaused, both follow their desired size.
    set_desired(settings, grow, 4, paused=False)
    set_desired(settings, shrink, 0, paused=False)
    result = tick(settings)
    assert (result.placed, result.stopped, result.launched) == (2, 2, 0)


@pytest.mark.parametrize(("serving_on", "launched"), [("h100", "p5.48xlarge"), ("l40s", "g6e.12xlarge")])
def test_missing_replicas_go_where_the_throughput_they_were_sized_at_costs_least(settings, serving_on, launched):
    """The autoscaler sizes a pool in replicas of the profiled tokens/s of the GPU types it serves
    on; the tick hands placement that rate, and placement prices carrying it on each type. An 8B
    pool serving on H100 (3500 tokens/s a replica) that wants 5 more: one p5 ($55.04, 17,500
    tokens/s) beats the 18 L40S replicas (5 × $15) the same throughput takes there. Serving on
    L40S (1000 tokens/s a replica): 5 L40S replicas on two 4-GPU nodes ($30) beat a p5 (without
    the rate, placement would size both cases at the slowest type's and take L40S for both)."""
    gpus = 8 if serving_on == "h100" else 4
    seeded = seed(settings, 1, gpus, gpus_per_node=gpus, catalog=False)  # one full node of the pool's replicas
    [pool_id] = seeded.pool_ids
    l40s = {"name": "g6e.12xlarge", "gpu_type": "l40s", "gpu_count": 4, "gpu_memory_gb": 48,
            "on_demand_price": 15.0, "spot_price": None}
    with session_scope(settings) as s:
        catalog = bench_catalog()
        catalog["clouds"][0]["regions"][0]["instance_types"].append(l40s)
        import_catalog(s, catalog)
        variant = s.get(Pool, pool_id).variant
        variant.gpu_types = ["h100", "l40s"]
        variant.profiled_tokens_per_s = {"h100": 3500.0, "l40s": 1000.0}
        if serving_on == "l40s":
            for n in s.scalars(select(Node)):
                n.instance_type = "g6e.12xlarge"
                n.launch_spec = {**n.launch_spec, "instance_type": "g6e.12xlarge", "gpu_type": "l40s",
                                 "gpu_memory_gb": 48, "price_per_hour": 15.0}
    set_desired(settings, pool_id, gpus + 5)
    result = tick(settings)
    assert result.placed == 5
    new = [n for n in all_nodes(settings) if n.state == NodeState.pending]
    assert {n.launch_spec["instance_type"] for n in new} == {launched}
    assert len(new) == (1 if launched == "p5.48xlarge" else 2)


def test_a_new_replica_goes_to_the_node_whose_agent_reported_its_checkpoint_cached(settings):
    """The agent's heartbeat reports the model paths its local artifact cache holds; the tick reads
    them and places a replica of that model there (no download) over an equally good node, which
    the node-id order would otherwise pick."""
    seeded = seed(settings, 1, 2, gpus_per_node=1)  # two ready nodes, one replica of the pool each
    [pool_id] = seeded.pool_ids
    with session_scope(settings) as s:
        nodes = sorted(s.scalars(select(Node)), key=lambda n: str(n.id))
        for n in nodes:  # room for more on both: 3 free GPUs each
            n.gpus_total = 4
            n.launch_spec = {**n.launch_spec, "gpu_count": 4}
        model_path = s.get(Pool, pool_id).variant.model_path
        holder = nodes[-1]  # the one the node-id tie-break would not take
        agents.heartbeat(s, holder, agents.HeartbeatRequest(node_metrics={
            "artifacts": {model_path: {"source": "source", "download_s": 112.0}, "org/other": {}}}))
        holder_id, other_id = holder.id, nodes[0].id
    with session_scope(settings) as s:
        assert s.get(Node, holder_id).cached_models == sorted([model_path, "org/other"])
        assert s.get(Node, other_id).cached_models == []
    set_desired(settings, pool_id, 3)
    assert tick(settings).placed == 1
    [new] = [r for r in pool_replicas(settings, pool_id) if r.state == ReplicaState.pending and not r.spare]
    assert new.node_id == holder_id
    # a heartbeat that does not report the cache (an older agent) leaves the list as it was
    with session_scope(settings) as s:
        agents.heartbeat(s, s.get(Node, holder_id), agents.HeartbeatRequest(node_metrics={"in_flight": 0}))
    with session_scope(settings) as s:
        assert s.get(Node, holder_id).cached_models == sorted([model_path, "org/other"])
