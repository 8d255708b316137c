"""Reconcile: make each pool's nodes follow its ``desired_replicas``.

Reconciling touches only the database. Missing capacity becomes node rows (state
``pending``) plus ``launch`` operations *before* any cloud is called (the write-before-
launch rule: a VM can only exist for a row that already exists, so the sweeper can tell
ours from leaks). Surplus nodes are drained, then terminated, through operations: as soon
as their agent reports them drained, or when their drain deadline passes. The executors in
``launcher`` and ``terminator`` carry operations out against the clouds.

One replica per node for now (a node's GPUs ≥ the variant's ``gpu_count``); packing
several replicas per node is a later concern.

The autoscaler decides ``desired_replicas``; :func:`reconcile_pool` only reads it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, and_, case, exists, select, update
from sqlalchemy.orm import Session, lazyload

from controlplane.config import Settings
from controlplane.fleet.leases import claimable, lease_free, release
from controlplane.fleet.nodes import transition
from controlplane.models import (
    Node,
    NodeState,
    Operation,
    OperationKind,
    OperationState,
    Pool,
    Replica,
    ReplicaState,
    SpotPolicy,
)

S = NodeState
CAPACITY_UNAVAILABLE = "capacity_unavailable"
PREEMPTED = "preempted"

# Nodes that count toward the pool's size, in the order they are given up when it
# shrinks: a node that serves nothing yet is cheapest to lose.
REMOVAL_RANK: dict[NodeState, int] = {S.pending: 0, S.provisioning: 1, S.booting: 2, S.ready: 3}
# Everything reconcile looks at: the counted nodes plus those already draining.
RECONCILED_STATES = (*REMOVAL_RANK, S.draining)
# A replica in these states has no engine running: nothing can be in flight on it.
ENDED_REPLICA_STATES = (ReplicaState.stopped, ReplicaState.failed)


def launch_key(node_id: uuid.UUID) -> str:
    return f"launch:{node_id}"


def terminate_key(node_id: uuid.UUID) -> str:
    return f"terminate:{node_id}"


def drain_key(node_id: uuid.UUID) -> str:
    return f"drain:{node_id}"


# ---------------------------------------------------------------- planning (pure)
@dataclass(frozen=True)
class NodeView:
    id: uuid.UUID
    state: NodeState
    spot: bool  # pending: wants spot; launched: runs on spot
    created_at: dt.datetime
    drain_deadline_at: dt.datetime | None = None
    drained: bool = False  # draining, and its agent reported every replica ended


@dataclass(frozen=True)
class PoolPlan:
    launch: tuple[bool, ...] = ()  # one entry per node to add: launch it as spot?
    remove: tuple[uuid.UUID, ...] = ()


def markets_for_new_nodes(policy: SpotPolicy, base_on_demand: int, on_demand_now: int, count: int) -> list[bool]:
    """Spot (True) or on-demand for each new node: the pool keeps ``base_on_demand`` on-demand
    nodes as a floor that a spot reclaim cannot take away; the rest follows the policy."""
    if policy == SpotPolicy.on_demand:
        return [False] * count
    if policy == SpotPolicy.spot:
        return [True] * count
    need_on_demand = max(0, base_on_demand - on_demand_now)
    return [i >= need_on_demand for i in range(count)]


def plan_pool(
    desired: int, policy: SpotPolicy, base_on_demand: int, nodes: Iterable[NodeView]
) -> PoolPlan:
    counted = [n for n in nodes if n.state in REMOVAL_RANK]
    on_demand_now = sum(1 for n in counted if not n.spot)
    if len(counted) < desired:
        return PoolPlan(launch=tuple(markets_for_new_nodes(policy, base_on_demand, on_demand_now, desired - len(counted))))
    surplus = len(counted) - desired
    if surplus == 0:
        return PoolPlan()

    def cost_of_losing(n: NodeView) -> tuple[int, bool, float, str]:
        floor = policy != SpotPolicy.on_demand and not n.spot and on_demand_now <= base_on_demand
        # Not ready before ready, the on-demand floor last, newest first, then a stable tie-break.
        return (REMOVAL_RANK[n.state], floor, -n.created_at.timestamp(), str(n.id))

    return PoolPlan(remove=tuple(n.id for n in sorted(counted, key=cost_of_losing)[:surplus]))


# ---------------------------------------------------------------- node lifecycle (writes)
def add_node(session: Session, pool: Pool, now: dt.datetime, settings: Settings, *, spot: bool) -> tuple[Node, Operation]:
    """A pending node and its launch operation. The caller flushes nodes before operations."""
    node = Node(
        id=uuid.uuid4(),
        pool_id=pool.id,
        state=S.pending,
        spot=spot,
        launch_token=uuid.uuid4().hex,
        state_times={S.pending.value: now.isoformat()},
    )
    op = Operation(
        kind=OperationKind.launch,
        state=OperationState.pending,
        pool_id=pool.id,
        node_id=node.id,
        idempotency_key=launch_key(node.id),
        history=[],
        deadline_at=now + dt.timedelta(seconds=settings.launch_deadline_s),
    )
    session.add(node)
    return node, op


def begin_termination(
    session: Session, node: Node, now: dt.datetime, settings: Settings, *, reason: str, error: str | None = None
) -> Operation | None:
    """Move ``node`` to terminating and queue the operation that releases its VM.

    Returns the new operation (``None`` if the node is already on its way out). A node
    that failed *after* a terminate attempt re-arms the existing operation, keeping its
    history, since each node has exactly one terminate operation.
    """
    if node.state in (S.terminating, S.terminated):
        return None
    retried = node.state == S.failed and S.terminating.value in (node.state_times or {})
    transition(session, node, S.terminating, reason=reason, error=error)
    # Work on the node must stop now. Also keeps the changed columns identical for every node
    # a tick moves, so the ORM writes them all in one executemany.
    node.drain_deadline_at = now
    deadline = now + dt.timedelta(seconds=settings.terminate_deadline_s)
    if retried:
        op = session.scalar(select(Operation).where(Operation.idempotency_key == terminate_key(node.id)))
        if op is not None:
            op.state, op.deadline_at, op.next_attempt_at, op.finished_at = OperationState.pending, deadline, None, None
            return op
    op = Operation(
        kind=OperationKind.terminate,
        state=OperationState.pending,
        pool_id=node.pool_id,
        node_id=node.id,
        idempotency_key=terminate_key(node.id),
        history=[],
        deadline_at=deadline,
    )
    session.add(op)
    return op


def begin_drain(session: Session, node: Node, now: dt.datetime, settings: Settings) -> list[Operation]:
    """Stop sending work to a ready node; it is terminated once its agent reports it drained
    (see :func:`drain_finished`), or when its drain deadline passes."""
    if node.state != S.ready or settings.drain_timeout_s <= 0:
        op = begin_termination(session, node, now, settings, reason="scale down")
        return [op] if op else []
    transition(session, node, S.draining, reason="scale down")
    node.drain_deadline_at = now + dt.timedelta(seconds=settings.drain_timeout_s)
    op = Operation(
        kind=OperationKind.drain,
        state=OperationState.running,
        pool_id=node.pool_id,
        node_id=node.id,
        idempotency_key=drain_key(node.id),
        history=[],
        deadline_at=node.drain_deadline_at,
    )
    session.add(op)
    return [op]


# ---------------------------------------------------------------- reconcile
@dataclass
class PoolChanges:
    operations: list[Operation] = field(default_factory=list)
    launched: int = 0
    removed: int = 0
    draining_nodes: list[uuid.UUID] = field(default_factory=list)  # started draining this tick
    drained_nodes: list[uuid.UUID] = field(default_factory=list)  # finished draining this tick


def _drained() -> ColumnElement[bool]:
    """True for a draining node whose agent has reported every one of its replicas ended.

    The agent stops its engines only once their in-flight requests are done (or its own
    deadline passed), then reports them ``stopped`` and exits: from then on the VM serves
    nothing. A node with no replica on record has reported nothing, so it waits for its deadline.
    """
    of_node = Replica.node_id == Node.id  # indexed (ix_replicas_node_id)
    any_replica = exists().where(of_node).correlate(Node)
    running = exists().where(of_node, Replica.state.not_in(ENDED_REPLICA_STATES)).correlate(Node)
    # CASE, so that the subqueries run for the few draining nodes only, not for every node.
    # (Plain EXISTS rather than bool_and: the embedded platform runs on SQLite.)
    return case((Node.state == S.draining, and_(any_replica, ~running)), else_=False)


def node_views(session: Session, pool_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[NodeView]]:
    """The reconciled nodes of ``pool_ids`` as plain tuples: one query, no ORM objects, no locks.

    Only the few nodes a tick actually changes are loaded as objects (and locked) later.
    """
    views: dict[uuid.UUID, list[NodeView]] = defaultdict(list)
    rows = session.execute(
        select(Node.pool_id, Node.id, Node.state, Node.spot, Node.created_at, Node.drain_deadline_at,
               _drained()).where(Node.pool_id.in_(pool_ids), Node.state.in_(RECONCILED_STATES))
    )
    for pool_id, node_id, state, spot, created_at, drain_deadline_at, drained in rows:
        views[pool_id].append(NodeView(node_id, state, spot, created_at, drain_deadline_at, bool(drained)))
    return views


def drain_finished(view: NodeView, now: dt.datetime) -> str | None:
    """Why a draining node may be terminated now, or None while it must keep draining.

    Decided here, in the reconcile tick, rather than when the agent's report arrives: the tick
    already owns the draining → terminating move (pools claimed with SKIP LOCKED, the drain
    operation closed, the terminate operation fanned out to a worker right after commit), and
    it is where the deadline fallback must live anyway, for an agent that never reports (dead,
    partitioned, its last report lost). The agent API stays a write of the node's own rows.
    The cost is at most one reconcile interval (seconds) instead of the whole drain timeout.
    """
    if view.state != S.draining:
        return None
    if view.drained:
        return "drained: the agent reported every replica stopped"
    if view.drain_deadline_at is not None and view.drain_deadline_at <= now:
        return "drain deadline passed"
    return None


def _lock_nodes(session: Session, views: dict[uuid.UUID, NodeView]) -> dict[uuid.UUID, Node]:
    """Lock the nodes about to change; drop any whose state moved since it was read."""
    if not views:
        return {}
    locked = session.scalars(select(Node).where(Node.id.in_(list(views))).with_for_update())
    return {n.id: n for n in locked if n.state == views[n.id].state}


def reconcile_pools(
    session: Session, pools: Sequence[Pool], now: dt.datetime, settings: Settings,
    views: dict[uuid.UUID, list[NodeView]] | None = None,
) -> PoolChanges:
    """Bring each pool toward ``pool.desired_replicas`` (the only input that sizes it).

    New nodes are flushed before their launch operations (which reference them). The
    caller holds the pools' row locks and commits.
    """
    if views is None:
        views = node_views(session, [p.id for p in pools])
    changes = PoolChanges()
    plans: list[tuple[Pool, PoolPlan]] = []
    touched: dict[uuid.UUID, NodeView] = {}
    finishing: dict[uuid.UUID, str] = {}  # draining node → why it goes now
    for pool in pools:
        pool_views = views.get(pool.id, [])
        for v in pool_views:
            if reason := drain_finished(v, now):
                touched[v.id] = v
                finishing[v.id] = reason
        # A paused pool is not resized (no launch, no removal), but a node it was already retiring
        # still finishes its drain: left draining, it would hold its VM until someone resumed the pool.
        plan = PoolPlan() if pool.paused else plan_pool(
            pool.desired_replicas, pool.spot_policy, pool.spot_base_on_demand, pool_views)
        touched.update((v.id, v) for v in pool_views if v.id in plan.remove)
        plans.append((pool, plan))
    nodes = _lock_nodes(session, touched)
    for node_id in finishing.keys() & nodes.keys():
        if op := begin_termination(session, nodes[node_id], now, settings, reason=finishing[node_id]):
            changes.operations.append(op)
        changes.drained_nodes.append(node_id)
    launches: list[Operation] = []
    for pool, plan in plans:
        for spot in plan.launch:
            launches.append(add_node(session, pool, now, settings, spot=spot)[1])
        for node_id in plan.remove:
            if (node := nodes.get(node_id)) is None:
                continue  # changed under us; the next tick sees its new state
            changes.operations.extend(begin_drain(session, node, now, settings))
            changes.removed += 1
            if node.state == S.draining:
                changes.draining_nodes.append(node_id)
        changes.launched += len(plan.launch)
        settled = all(v.state in (S.booting, S.ready) for v in views.get(pool.id, []) if v.state in REMOVAL_RANK)
        if settled and not plan.launch and pool.capacity_status == CAPACITY_UNAVAILABLE:
            pool.capacity_status = None
        pool.last_reconciled_at = now
    session.flush()  # nodes first: the launch operations reference them
    session.add_all(launches)
    changes.operations.extend(launches)
    return changes


def reconcile_pool(session: Session, pool: Pool, now: dt.datetime, settings: Settings) -> PoolChanges:
    """One pool; the seam the autoscaler's executor uses after it has set ``desired_replicas``."""
    return reconcile_pools(session, [pool], now, settings)


@dataclass
class TickResult:
    pools: int = 0
    launched: int = 0
    removed: int = 0
    operations: list[tuple[uuid.UUID, OperationKind]] = field(default_factory=list)  # to run now


def reconcile_tick(session: Session, settings: Settings, now: dt.datetime) -> TickResult:
    """Reconcile every pool no other worker is reconciling, in a constant number of statements.

    Pools are claimed with ``FOR UPDATE SKIP LOCKED`` (two workers ticking at once split the
    pools between them), their nodes are read in one query, only the nodes that change are
    loaded and locked, and all writes are flushed in batches. Commit is the caller's.
    """
    pools = session.scalars(
        claimable(Pool, now)  # paused pools too: their draining nodes must still finish
        .options(lazyload(Pool.variant))  # not needed here; a join would only slow the lock
        .order_by(Pool.last_reconciled_at.asc().nulls_first(), Pool.id)
        .limit(settings.reconcile_batch)
    ).all()
    if not pools:
        return TickResult()
    changes = reconcile_pools(session, pools, now, settings)
    set_replica_states(session, changes.draining_nodes, ReplicaState.draining)
    set_replica_states(session, changes.drained_nodes, ReplicaState.stopped)
    if changes.drained_nodes:
        session.execute(
            update(Operation)
            .where(Operation.idempotency_key.in_([drain_key(n) for n in changes.drained_nodes]))
            .values(state=OperationState.succeeded, finished_at=now)
        )
    session.flush()
    return TickResult(
        pools=len(pools),
        launched=changes.launched,
        removed=changes.removed,
        operations=[(op.id, op.kind) for op in changes.operations if op.state == OperationState.pending],
    )


def set_replica_states(session: Session, node_ids: Sequence[uuid.UUID], state: ReplicaState) -> None:
    if node_ids:
        session.execute(update(Replica).where(Replica.node_id.in_(node_ids)).values(state=state))


# ---------------------------------------------------------------- operations (shared by the executors)
MAX_HISTORY = 200  # entries kept per operation; a long outage must not grow rows without bound
OPEN_STATES = (OperationState.pending, OperationState.running)


def _due(now: dt.datetime) -> ColumnElement[bool]:
    return (Operation.next_attempt_at.is_(None)) | (Operation.next_attempt_at <= now)


def due_operations(session: Session, now: dt.datetime, limit: int = 500) -> list[tuple[uuid.UUID, OperationKind]]:
    """Launch/terminate operations ready to run (no live lease, retry time reached), oldest first."""
    rows = session.execute(
        select(Operation.id, Operation.kind)
        .where(
            Operation.kind.in_([OperationKind.launch, OperationKind.terminate]),
            Operation.state.in_(OPEN_STATES),
            _due(now),
            lease_free(Operation, now),
        )
        .order_by(Operation.created_at)
        .limit(limit)
    )
    return [(op_id, kind) for op_id, kind in rows]


def claim_operation(session: Session, op_id: uuid.UUID, kind: OperationKind, now: dt.datetime) -> Operation | None:
    """The operation, locked, if it is open, due and nobody holds it (``SKIP LOCKED``)."""
    return session.scalar(
        claimable(Operation, now, Operation.id == op_id, Operation.kind == kind, Operation.state.in_(OPEN_STATES),
                  _due(now))
    )


def append_history(op: Operation, entries: Iterable[dict]) -> None:
    op.history = [*(op.history or []), *entries][-MAX_HISTORY:]


def finish_operation(op: Operation, state: OperationState, now: dt.datetime, error: str | None = None) -> None:
    op.state = state
    op.finished_at = now
    op.next_attempt_at = None
    if error is not None:
        op.error = error[:2000]
    release(op)


def retry_operation(op: Operation, at: dt.datetime, error: str | None) -> None:
    """Back to pending until ``at``; the lease is given up so any worker may take it then."""
    op.state = OperationState.pending
    op.error = error[:2000] if error else None
    op.next_attempt_at = at
    release(op)
