from __future__ import annotations

import uuid
from typing import Annotated

from litestar import Controller, Request
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api.routing import delete, get, patch, post, put
from controlplane.models import TenantStatus
from controlplane.schemas.common import Page
from controlplane.schemas.tenancy import (
    KeyCreate,
    KeyCreated,
    KeyOut,
    KeyUpdate,
    QuotaBody,
    TenantCreate,
    TenantOut,
    TenantUpdate,
)
from controlplane.services import keys, tenants
from controlplane.services.principal import Principal

LimitParam = Annotated[int, Parameter(ge=1, le=500, default=50)]
OffsetParam = Annotated[int, Parameter(ge=0, le=10_000_000, default=0)]


class TenantController(Controller):
    path = "/tenants"

    @get("/")
    async def list_tenants(
        self,
        db: AsyncSession,
        status: Annotated[TenantStatus | None, Parameter(default=None)] = None,
        name: Annotated[str | None, Parameter(max_length=63, default=None)] = None,
        limit: LimitParam = 50,
        offset: OffsetParam = 0,
    ) -> Page[TenantOut]:
        rows, total = await tenants.list_tenants(
            db, status=status.value if status else None, name=name, limit=limit, offset=offset
        )
        return Page(items=[tenants.tenant_out(t) for t in rows], total=total, limit=limit, offset=offset)

    @post("/")
    async def create_tenant(self, db: AsyncSession, principal: Principal, data: TenantCreate) -> TenantOut:
        return tenants.tenant_out(await tenants.create(db, principal, data))

    @get("/{tenant_id:uuid}")
    async def get_tenant(self, db: AsyncSession, tenant_id: uuid.UUID) -> TenantOut:
        return tenants.tenant_out(await tenants.get(db, tenant_id))

    @patch("/{tenant_id:uuid}")
    async def update_tenant(
        self, db: AsyncSession, principal: Principal, tenant_id: uuid.UUID, data: TenantUpdate
    ) -> TenantOut:
        return tenants.tenant_out(await tenants.update(db, principal, tenant_id, data))

    @delete("/{tenant_id:uuid}")
    async def delete_tenant(self, request: Request, db: AsyncSession, principal: Principal, tenant_id: uuid.UUID) -> None:
        await tenants.delete(db, principal, tenant_id)
        request.app.state.key_verifier.forget_all()

    @post("/{tenant_id:uuid}/suspend", status_code=200)
    async def suspend_tenant(
        self, request: Request, db: AsyncSession, principal: Principal, tenant_id: uuid.UUID
    ) -> TenantOut:
        tenant = await tenants.set_status(db, principal, tenant_id, TenantStatus.suspended)
        request.app.state.key_verifier.forget_all()
        return tenants.tenant_out(tenant)

    @post("/{tenant_id:uuid}/resume", status_code=200)
    async def resume_tenant(self, db: AsyncSession, principal: Principal, tenant_id: uuid.UUID) -> TenantOut:
        return tenants.tenant_out(await tenants.set_status(db, principal, tenant_id, TenantStatus.active))

    @get("/{tenant_id:uuid}/quota")
    async def get_quota(self, db: AsyncSession, tenant_id: uuid.UUID) -> QuotaBody:
        return tenants.quota_out((await tenants.get(db, tenant_id)).quota)

    @put("/{tenant_id:uuid}/quota")
    async def put_quota(self, db: AsyncSession, principal: Principal, tenant_id: uuid.UUID, data: QuotaBody) -> QuotaBody:
        return tenants.quota_out(await tenants.put_quota(db, principal, tenant_id, data))

    @get("/{tenant_id:uuid}/keys")
    async def list_keys(
        self,
        db: AsyncSession,
        tenant_id: uuid.UUID,
        include_revoked: Annotated[bool, Parameter(default=False)] = False,
        limit: LimitParam = 50,
        offset: OffsetParam = 0,
    ) -> Page[KeyOut]:
        await tenants.get(db, tenant_id)
        rows, total = await keys.list_for_tenant(
            db, tenant_id, include_revoked=include_revoked, limit=limit, offset=offset
        )
        return Page(items=[keys.key_out(k) for k in rows], total=total, limit=limit, offset=offset)

    @post("/{tenant_id:uuid}/keys")
    async def create_key(self, db: AsyncSession, principal: Principal, tenant_id: uuid.UUID, data: KeyCreate) -> KeyCreated:
        await tenants.get(db, tenant_id)
        key, secret = await keys.create(db, principal, tenant_id, data)
        return KeyCreated(key=keys.key_out(key), secret=secret)

    @patch("/{tenant_id:uuid}/keys/{key_id:uuid}")
    async def update_key(
        self, db: AsyncSession, principal: Principal, tenant_id: uuid.UUID, key_id: uuid.UUID, data: KeyUpdate
    ) -> KeyOut:
        return keys.key_out(await keys.change(db, principal, tenant_id, key_id, data))

    @delete("/{tenant_id:uuid}/keys/{key_id:uuid}", status_code=200)
    async def revoke_key(
        self, request: Request, db: AsyncSession, principal: Principal, tenant_id: uuid.UUID, key_id: uuid.UUID
    ) -> KeyOut:
        key = await keys.revoke(db, principal, tenant_id, key_id)
        request.app.state.key_verifier.forget_all()
        return keys.key_out(key)
