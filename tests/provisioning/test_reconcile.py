"""Reconcile on Postgres: write-before-launch, drain then terminate, SKIP LOCKED, flat statement count."""

from __future__ import annotations

import datetime as dt
import random
import uuid

from sqlalchemy import select, update

from bench.controlplane.reconcile import churn, measure_tick, seed
from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet.leases import claimable
from controlplane.fleet.provisioning import launch_key, reconcile_tick
from controlplane.models import (
    Node,
    NodeState,
    Operation,
    OperationKind,
    OperationState,
    Pool,
    Replica,
    ReplicaState,
)
from tests.provisioning.helpers import nodes, operations, tick


def set_desired(settings, pool_id, n: int) -> None:
    with session_scope(settings) as s:
        s.execute(update(Pool).where(Pool.id == pool_id).values(desired_replicas=n))


def test_missing_nodes_are_written_with_their_launch_operations_before_any_cloud_call(settings):
    [pool_id] = seed(settings, 1, 0)
    set_desired(settings, pool_id, 3)
    result = tick(settings)  # no provider is passed anywhere: reconcile cannot call a cloud
    assert (result.pools, result.launched, result.removed) == (1, 3, 0)
    pending = nodes(settings, pool_id)
    assert [n.state for n in pending] == [NodeState.pending] * 3
    assert all(n.instance_id is None and n.launch_token for n in pending)
    ops = operations(settings, pool_id, OperationKind.launch)
    assert {o.idempotency_key for o in ops} == {launch_key(n.id) for n in pending}
    assert all(o.state == OperationState.pending and o.deadline_at > utcnow() for o in ops)
    assert {op_id for op_id, _ in result.operations} == {o.id for o in ops}
    # Reconciling again changes nothing: the pending nodes already count.
    again = tick(settings)
    assert (again.launched, again.removed) == (0, 0)
    assert len(nodes(settings, pool_id)) == 3


def test_ready_node_drains_then_terminates_after_its_deadline(settings):
    settings = settings.model_copy(update={"drain_timeout_s": 60})
    [pool_id] = seed(settings, 1, 2)
    ready = nodes(settings, pool_id)
    with session_scope(settings) as s:
        for n in ready:
            s.add(Replica(node_id=n.id, pool_id=pool_id, variant_id=s.get(Pool, pool_id).variant_id,
                          state=ReplicaState.ready))
    set_desired(settings, pool_id, 1)
    assert tick(settings).removed == 1
    [draining] = nodes(settings, pool_id, NodeState.draining)
    assert draining.id == max(ready, key=lambda n: n.created_at).id  # the newest goes
    assert draining.drain_deadline_at > utcnow() + dt.timedelta(seconds=50)
    [drain_op] = operations(settings, pool_id, OperationKind.drain)
    assert drain_op.state == OperationState.running
    with session_scope(settings) as s:
        states = dict(s.execute(select(Replica.node_id, Replica.state)).all())
    assert states[draining.id] == ReplicaState.draining
    assert not operations(settings, pool_id, OperationKind.terminate)

    later = utcnow() + dt.timedelta(seconds=61)
    with session_scope(settings) as s:
        result = reconcile_tick(s, settings, later)
    assert result.launched == 0  # a draining node is already gone from the pool's count
    [terminating] = nodes(settings, pool_id, NodeState.terminating)
    assert terminating.id == draining.id
    assert [o.state for o in operations(settings, pool_id, OperationKind.terminate)] == [OperationState.pending]
    assert operations(settings, pool_id, OperationKind.drain)[0].state == OperationState.succeeded
    with session_scope(settings) as s:
        assert s.scalar(select(Replica.state).where(Replica.node_id == draining.id)) == ReplicaState.stopped


def test_pools_locked_by_one_worker_are_skipped_by_another(settings):
    pool_ids = seed(settings, 4, 1)
    for p in pool_ids:
        set_desired(settings, p, 2)
    with session_scope(settings) as holder:
        held = holder.scalars(claimable(Pool, utcnow()).where(Pool.id.in_(pool_ids[:3]))).all()
        assert len(held) == 3
        result = tick(settings)  # a second worker, while the first holds three pools
        assert result.pools == 1 and result.launched == 1
    assert tick(settings).launched == 3  # released: now the others are reconciled


def test_statement_count_does_not_grow_with_pools(settings):
    rng = random.Random(7)
    small = seed(settings, 4, 3)
    churn(settings, small, 3, 0.25, rng)  # one pool grows, one shrinks
    few = measure_tick(settings)
    churn(settings, small, 3, 0.0, rng)
    measure_tick(settings)  # settle back to size
    large = small + seed(settings, 36, 3)
    churn(settings, large, 3, 0.25, rng)  # ten grow, ten shrink
    many = measure_tick(settings)
    assert (few.pools, many.pools) == (4, 40)
    assert (few.launched, many.launched) == (1, 10) and (few.removed, many.removed) == (1, 10)
    assert many.statements == few.statements, (few.by_verb, many.by_verb)


def test_paused_pool_is_left_alone(settings):
    [pool_id] = seed(settings, 1, 1)
    with session_scope(settings) as s:
        s.execute(update(Pool).where(Pool.id == pool_id).values(desired_replicas=3, paused=True))
    result = tick(settings)  # visited (a draining node of a paused pool still finishes) but not resized
    assert (result.launched, result.removed, result.operations) == (0, 0, [])
    assert len(nodes(settings, pool_id)) == 1
    with session_scope(settings) as s:
        assert s.scalar(select(Operation.id).where(Operation.pool_id == pool_id)) is None
        assert s.get(Node, nodes(settings, pool_id)[0].id).state == NodeState.ready
    assert uuid.UUID(str(pool_id))
