from __future__ import annotations

import uuid
from typing import Annotated

from litestar import Controller
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api.admin.tenants import LimitParam, OffsetParam
from controlplane.api.routing import delete, get, patch, post
from controlplane.schemas.common import Page
from controlplane.schemas.fleet import DecisionOut, PoolCreate, PoolOut, PoolUpdate
from controlplane.services import fleet, pools
from controlplane.services.principal import Principal


class PoolController(Controller):
    path = "/pools"

    @get("/")
    async def list_pools(
        self,
        db: AsyncSession,
        variant_id: Annotated[uuid.UUID | None, Parameter(default=None)] = None,
        tenant_id: Annotated[uuid.UUID | None, Parameter(default=None)] = None,
        limit: LimitParam = 50,
        offset: OffsetParam = 0,
    ) -> Page[PoolOut]:
        rows, total = await pools.list_pools(db, variant_id=variant_id, tenant_id=tenant_id, limit=limit, offset=offset)
        counts = await pools.replicas_by_state(db, [p.id for p in rows])
        return Page(items=[pools.pool_out(p, counts[p.id]) for p in rows], total=total, limit=limit, offset=offset)

    @post("/")
    async def create_pool(self, db: AsyncSession, principal: Principal, data: PoolCreate) -> PoolOut:
        return pools.pool_out(await pools.create(db, principal, data))

    @get("/{pool_id:uuid}")
    async def get_pool(self, db: AsyncSession, pool_id: uuid.UUID) -> PoolOut:
        pool = await pools.get(db, pool_id)
        return pools.pool_out(pool, (await pools.replicas_by_state(db, [pool.id]))[pool.id])

    @patch("/{pool_id:uuid}")
    async def update_pool(self, db: AsyncSession, principal: Principal, pool_id: uuid.UUID, data: PoolUpdate) -> PoolOut:
        pool = await pools.update(db, principal, pool_id, data)
        return pools.pool_out(pool, (await pools.replicas_by_state(db, [pool.id]))[pool.id])

    @delete("/{pool_id:uuid}")
    async def delete_pool(self, db: AsyncSession, principal: Principal, pool_id: uuid.UUID) -> None:
        await pools.delete(db, principal, pool_id)

    @get("/{pool_id:uuid}/decisions")
    async def list_decisions(
        self, db: AsyncSession, pool_id: uuid.UUID, limit: LimitParam = 50, offset: OffsetParam = 0
    ) -> Page[DecisionOut]:
        await pools.get(db, pool_id)
        rows, total = await fleet.list_decisions(db, pool_id=pool_id, limit=limit, offset=offset)
        return Page(items=[fleet.decision_out(d) for d in rows], total=total, limit=limit, offset=offset)
