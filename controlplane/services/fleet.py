"""Read-only views of the fleet for operators: nodes, replicas, operations, decisions, audit."""

from __future__ import annotations

import uuid

from sqlalchemy import exists, select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.models import (
    AuditEvent,
    AutoscalerDecision,
    Node,
    NodeState,
    Operation,
    OperationState,
    Replica,
    ReplicaState,
)
from controlplane.schemas.fleet import AuditOut, DecisionOut, NodeOut, OperationOut, ReplicaOut
from controlplane.services.errors import NotFound
from controlplane.services.pagination import paginate


def node_out(n: Node) -> NodeOut:
    return NodeOut(
        id=n.id, state=n.state.value, dedicated_tenant_id=n.dedicated_tenant_id, cloud=n.cloud, region=n.region, zone=n.zone,
        instance_type=n.instance_type, spot=n.spot, gpus_total=n.gpus_total, instance_id=n.instance_id,
        private_ip=n.private_ip, last_heartbeat_at=n.last_heartbeat_at, state_times=dict(n.state_times or {}),
        metrics=dict(n.metrics or {}), error=n.error, created_at=n.created_at, launch_spec=dict(n.launch_spec or {}),
        cached_models=list(n.cached_models or ()),
    )


def replica_out(r: Replica) -> ReplicaOut:
    return ReplicaOut(
        id=r.id, node_id=r.node_id, pool_id=r.pool_id, variant_id=r.variant_id, state=r.state.value, url=r.url,
        gpu_ids=list(r.gpu_ids or []), restarts=r.restarts, started_at=r.started_at, ready_at=r.ready_at,
        model_ready_seconds=r.model_ready_seconds, ready_breakdown=dict(r.ready_breakdown or {}),
        last_heartbeat_at=r.last_heartbeat_at, metrics=dict(r.metrics or {}), desired_state=r.desired_state.value,
        port=r.port, replaces_id=r.replaces_id, stop_reason=r.stop_reason, spare=bool(r.spare),
    )


def operation_out(o: Operation) -> OperationOut:
    return OperationOut(
        id=o.id, kind=o.kind.value, state=o.state.value, pool_id=o.pool_id, node_id=o.node_id,
        idempotency_key=o.idempotency_key, attempts=o.attempts, error=o.error, history=list(o.history or []),
        created_at=o.created_at, updated_at=o.updated_at, finished_at=o.finished_at,
    )


def decision_out(d: AutoscalerDecision) -> DecisionOut:
    return DecisionOut(
        id=d.id, pool_id=d.pool_id, created_at=d.created_at, current_replicas=d.current_replicas,
        target_replicas=d.target_replicas, action=d.action, reasons=list(d.reasons or []),
        signals=dict(d.signals or {}),
    )


def audit_out(a: AuditEvent) -> AuditOut:
    return AuditOut(
        id=a.id, at=a.at, actor=a.actor, action=a.action, target_type=a.target_type, target_id=a.target_id,
        tenant_id=a.tenant_id, before=a.before, after=a.after,
    )


async def list_nodes(session: AsyncSession, *, pool_id, state: str | None, limit: int, offset: int):
    stmt = select(Node).order_by(Node.created_at.desc(), Node.id)
    if pool_id:  # nodes that host (or hosted) a replica of the pool: nodes are shared
        stmt = stmt.where(exists().where(Replica.node_id == Node.id, Replica.pool_id == pool_id))
    if state:
        stmt = stmt.where(Node.state == NodeState(state))
    return await paginate(session, stmt, limit, offset)


async def get_node(session: AsyncSession, node_id: uuid.UUID) -> Node:
    node = await session.get(Node, node_id)
    if node is None:
        raise NotFound("node", node_id)
    return node


async def list_replicas(session: AsyncSession, *, pool_id, node_id, state: str | None, limit: int, offset: int):
    stmt = select(Replica).order_by(Replica.created_at.desc(), Replica.id)
    if pool_id:
        stmt = stmt.where(Replica.pool_id == pool_id)
    if node_id:
        stmt = stmt.where(Replica.node_id == node_id)
    if state:
        stmt = stmt.where(Replica.state == ReplicaState(state))
    return await paginate(session, stmt, limit, offset)


async def list_operations(session: AsyncSession, *, pool_id, node_id, state: str | None, limit: int, offset: int):
    stmt = select(Operation).order_by(Operation.created_at.desc(), Operation.id)
    if pool_id:
        stmt = stmt.where(Operation.pool_id == pool_id)
    if node_id:
        stmt = stmt.where(Operation.node_id == node_id)
    if state:
        stmt = stmt.where(Operation.state == OperationState(state))
    return await paginate(session, stmt, limit, offset)


async def get_operation(session: AsyncSession, op_id: uuid.UUID) -> Operation:
    op = await session.get(Operation, op_id)
    if op is None:
        raise NotFound("operation", op_id)
    return op


async def list_decisions(session: AsyncSession, *, pool_id: uuid.UUID, limit: int, offset: int):
    stmt = (
        select(AutoscalerDecision)
        .where(AutoscalerDecision.pool_id == pool_id)
        .order_by(AutoscalerDecision.created_at.desc(), AutoscalerDecision.id)
    )
    return await paginate(session, stmt, limit, offset)


async def list_audit(session: AsyncSession, *, tenant_id, action: str | None, target_type: str | None,
                     limit: int, offset: int):
    stmt = select(AuditEvent).order_by(AuditEvent.at.desc(), AuditEvent.id)
    if tenant_id:
        stmt = stmt.where(AuditEvent.tenant_id == tenant_id)
    if action:
        stmt = stmt.where(AuditEvent.action == action)
    if target_type:
        stmt = stmt.where(AuditEvent.target_type == target_type)
    return await paginate(session, stmt, limit, offset)
