from __future__ import annotations

import uuid
from typing import Annotated

from litestar import Controller
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api.admin.tenants import LimitParam, OffsetParam
from controlplane.api.routing import get
from controlplane.models import NodeState, OperationState, ReplicaState
from controlplane.schemas.common import Page
from controlplane.schemas.fleet import AuditOut, NodeOut, OperationOut, ReplicaOut
from controlplane.services import fleet

OptUUID = Annotated[uuid.UUID | None, Parameter(default=None)]


class FleetController(Controller):
    """Read-only: nodes and replicas change only through the reconcile pipeline and agents."""

    path = "/"

    @get("/nodes")
    async def list_nodes(
        self, db: AsyncSession, pool_id: OptUUID = None,
        state_filter: Annotated[NodeState | None, Parameter(query="state", default=None)] = None,
        limit: LimitParam = 50, offset: OffsetParam = 0,
    ) -> Page[NodeOut]:
        rows, total = await fleet.list_nodes(db, pool_id=pool_id, state=state_filter.value if state_filter else None,
                                             limit=limit, offset=offset)
        return Page(items=[fleet.node_out(n) for n in rows], total=total, limit=limit, offset=offset)

    @get("/nodes/{node_id:uuid}")
    async def get_node(self, db: AsyncSession, node_id: uuid.UUID) -> NodeOut:
        return fleet.node_out(await fleet.get_node(db, node_id))

    @get("/replicas")
    async def list_replicas(
        self, db: AsyncSession, pool_id: OptUUID = None, node_id: OptUUID = None,
        state_filter: Annotated[ReplicaState | None, Parameter(query="state", default=None)] = None,
        limit: LimitParam = 50, offset: OffsetParam = 0,
    ) -> Page[ReplicaOut]:
        rows, total = await fleet.list_replicas(db, pool_id=pool_id, node_id=node_id,
                                                state=state_filter.value if state_filter else None, limit=limit, offset=offset)
        return Page(items=[fleet.replica_out(r) for r in rows], total=total, limit=limit, offset=offset)

    @get("/operations")
    async def list_operations(
        self, db: AsyncSession, pool_id: OptUUID = None, node_id: OptUUID = None,
        state_filter: Annotated[OperationState | None, Parameter(query="state", default=None)] = None,
        limit: LimitParam = 50, offset: OffsetParam = 0,
    ) -> Page[OperationOut]:
        rows, total = await fleet.list_operations(db, pool_id=pool_id, node_id=node_id,
                                                  state=state_filter.value if state_filter else None, limit=limit, offset=offset)
        return Page(items=[fleet.operation_out(o) for o in rows], total=total, limit=limit, offset=offset)

    @get("/operations/{operation_id:uuid}")
    async def get_operation(self, db: AsyncSession, operation_id: uuid.UUID) -> OperationOut:
        return fleet.operation_out(await fleet.get_operation(db, operation_id))

    @get("/audit")
    async def list_audit(
        self, db: AsyncSession, tenant_id: OptUUID = None,
        action: Annotated[str | None, Parameter(max_length=100, default=None)] = None,
        target_type: Annotated[str | None, Parameter(max_length=50, default=None)] = None,
        limit: LimitParam = 50, offset: OffsetParam = 0,
    ) -> Page[AuditOut]:
        rows, total = await fleet.list_audit(db, tenant_id=tenant_id, action=action, target_type=target_type,
                                             limit=limit, offset=offset)
        return Page(items=[fleet.audit_out(a) for a in rows], total=total, limit=limit, offset=offset)
