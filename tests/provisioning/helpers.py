"""Drive the pipeline in-process (no Celery) and read the results back."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from sqlalchemy import select

from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import launcher, provisioning, reconcile, terminator
from controlplane.models import Node, NodeState, Operation, OperationKind, Pool, Replica

EXECUTORS = {OperationKind.launch: launcher.execute, OperationKind.terminate: terminator.execute}


def tick(settings: Settings) -> reconcile.TickResult:
    with session_scope(settings) as s:
        return reconcile.fleet_tick(s, settings, utcnow())


def run_due(settings: Settings, providers) -> list[str]:
    with session_scope(settings) as s:
        due = provisioning.due_operations(s, utcnow())
    return [EXECUTORS[kind](settings, providers, op_id) for op_id, kind in due]


def open_operations(settings: Settings) -> int:
    with session_scope(settings) as s:
        return len(s.scalars(select(Operation.id).where(Operation.state.in_(provisioning.OPEN_STATES),
                                                        Operation.kind != OperationKind.drain)).all())


def converge(settings: Settings, providers, *, timeout: float = 30.0) -> None:
    """Reconcile and run operations (waiting out their retry times) until none is left open."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tick(settings)
        ran = run_due(settings, providers)
        if not ran and not open_operations(settings):
            return
        if not ran:
            time.sleep(0.2)
    raise AssertionError("pipeline did not converge")


def wait_for(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.2) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def nodes(settings: Settings, pool_id: str | uuid.UUID | None, *states: NodeState) -> list[Node]:
    """Nodes hosting (or that hosted) a replica of the pool; every node for ``None``."""
    with session_scope(settings) as s:
        stmt = select(Node).order_by(Node.created_at)
        if pool_id is not None:
            stmt = stmt.where(Node.id.in_(select(Replica.node_id).where(Replica.pool_id == uuid.UUID(str(pool_id)))))
        if states:
            stmt = stmt.where(Node.state.in_(states))
        return list(s.scalars(stmt))


def operations(settings: Settings, pool_id: str | uuid.UUID, kind: OperationKind | None = None) -> list[Operation]:
    with session_scope(settings) as s:
        stmt = select(Operation).where(Operation.pool_id == uuid.UUID(str(pool_id))).order_by(Operation.created_at)
        if kind:
            stmt = stmt.where(Operation.kind == kind)
        return list(s.scalars(stmt))


def node_operations(settings: Settings, node_id: uuid.UUID, kind: OperationKind | None = None) -> list[Operation]:
    """A node's operations, oldest first (terminate operations name no pool: a node belongs to none)."""
    with session_scope(settings) as s:
        stmt = select(Operation).where(Operation.node_id == node_id).order_by(Operation.created_at)
        if kind:
            stmt = stmt.where(Operation.kind == kind)
        return list(s.scalars(stmt))


def pool_row(settings: Settings, pool_id: str | uuid.UUID) -> Pool:
    with session_scope(settings) as s:
        return s.get(Pool, uuid.UUID(str(pool_id)))
