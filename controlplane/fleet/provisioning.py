"""Node lifecycle writes and the operation helpers both executors share.

The fleet tick (``controlplane.fleet.reconcile``) decides; this module holds the writes every
path takes the same way: a node's move to ``terminating`` with its one terminate operation, the
check that a draining node's agent reported every replica stopped, and the operation queue
(due, claim, history, finish, retry) that the launcher and the terminator walk.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterable, Sequence

from sqlalchemy import ColumnElement, and_, case, exists, select
from sqlalchemy.orm import Session

from controlplane.config import Settings
from controlplane.fleet.leases import claimable, lease_free, release
from controlplane.fleet.nodes import transition
from controlplane.models import (
    Node,
    NodeState,
    Operation,
    OperationKind,
    OperationState,
    Replica,
    ReplicaState,
)

S = NodeState
CAPACITY_UNAVAILABLE = "capacity_unavailable"
PREEMPTED = "preempted"
# A replica in these states has no engine running: nothing can be in flight on it.
ENDED_REPLICA_STATES = (ReplicaState.stopped, ReplicaState.failed)


def launch_key(node_id: uuid.UUID) -> str:
    return f"launch:{node_id}"


def terminate_key(node_id: uuid.UUID) -> str:
    return f"terminate:{node_id}"


def drain_key(node_id: uuid.UUID) -> str:
    return f"drain:{node_id}"


# ---------------------------------------------------------------- node lifecycle (writes)
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
        node_id=node.id,
        idempotency_key=terminate_key(node.id),
        history=[],
        deadline_at=deadline,
    )
    session.add(op)
    return op


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


def drained_node_ids(session: Session, node_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """The draining nodes among ``node_ids`` whose agents reported every replica ended."""
    if not node_ids:
        return set()
    return set(session.scalars(select(Node.id).where(Node.id.in_(list(node_ids)), _drained())))


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
