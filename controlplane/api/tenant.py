"""Tenant self-service API under /v1/tenant, authenticated by the tenant's own key ('manage' scope).

Routes pass ``principal.tenant_id`` to the services, which scope every query by it: a key of
tenant B asking for tenant A's key id gets 404, exactly as for an id that does not exist.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from typing import Annotated

from litestar import Controller, Request
from litestar.datastructures import State
from litestar.di import Provide
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api.admin.tenants import LimitParam, OffsetParam
from controlplane.api.deps import provide_tenant, tenant_guard
from controlplane.api.routing import delete, get, patch, post
from controlplane.db.types import utcnow
from controlplane.schemas.common import Page
from controlplane.schemas.tenancy import (
    CacheSettings,
    CacheSettingsOut,
    KeyCreate,
    KeyCreated,
    KeyOut,
    KeyUpdate,
    TenantOut,
)
from controlplane.schemas.usage import Granularity, TenantModelOut, UsageReport
from controlplane.services import caching, catalog_views, keys, tenants, usage
from controlplane.services.principal import Principal


class TenantSelfController(Controller):
    path = "/v1/tenant"
    tags = ["tenant"]
    guards = [tenant_guard]  # authenticates before any body is read
    dependencies = {"principal": Provide(provide_tenant)}
    security = [{"TenantKey": []}]

    @get("/me")
    async def me(self, db: AsyncSession, principal: Principal) -> TenantOut:
        return tenants.tenant_out(await tenants.get(db, principal.tenant_id))

    @get("/keys")
    async def list_keys(
        self,
        db: AsyncSession,
        principal: Principal,
        include_revoked: Annotated[bool, Parameter(default=False)] = False,
        limit: LimitParam = 50,
        offset: OffsetParam = 0,
    ) -> Page[KeyOut]:
        rows, total = await keys.list_for_tenant(
            db, principal.tenant_id, include_revoked=include_revoked, limit=limit, offset=offset
        )
        return Page(items=[keys.key_out(k) for k in rows], total=total, limit=limit, offset=offset)

    @post("/keys")
    async def create_key(self, db: AsyncSession, principal: Principal, data: KeyCreate) -> KeyCreated:
        key, secret = await keys.create(db, principal, principal.tenant_id, data)
        return KeyCreated(key=keys.key_out(key), secret=secret)

    @patch("/keys/{key_id:uuid}")
    async def update_key(self, db: AsyncSession, principal: Principal, key_id: uuid.UUID, data: KeyUpdate) -> KeyOut:
        return keys.key_out(await keys.change(db, principal, principal.tenant_id, key_id, data))

    @delete("/keys/{key_id:uuid}", status_code=200)
    async def revoke_key(self, request: Request, db: AsyncSession, principal: Principal, key_id: uuid.UUID) -> KeyOut:
        key = await keys.revoke(db, principal, principal.tenant_id, key_id)
        request.app.state.key_verifier.forget_all()
        return keys.key_out(key)

    @get("/cache")
    async def cache_settings(self, db: AsyncSession, state: State, principal: Principal) -> CacheSettingsOut:
        return caching.settings_out(await tenants.get(db, principal.tenant_id), state.settings)

    @patch("/cache")
    async def change_cache_settings(self, db: AsyncSession, state: State, principal: Principal,
                                    data: CacheSettings) -> CacheSettingsOut:
        tenant = await caching.change(db, principal, state.settings, principal.tenant_id, data)
        return caching.settings_out(tenant, state.settings)

    @delete("/cache", status_code=200)
    async def purge_cache(self, state: State, principal: Principal) -> dict[str, int]:
        """Clear my cache: every cached answer of this tenant, exact and semantic, in every region."""
        deleted = await asyncio.to_thread(caching.purge, state.settings.redis_url,
                                          state.settings.edge_redis_key_prefix, principal.tenant_id)
        return {"purged": deleted}

    @get("/models")
    async def models(self, db: AsyncSession, principal: Principal) -> list[TenantModelOut]:
        return await catalog_views.models_for_tenant(db, principal.tenant_id)

    @get("/usage")
    async def usage_report(
        self,
        db: AsyncSession,
        principal: Principal,
        start: Annotated[dt.datetime | None, Parameter(default=None)] = None,
        end: Annotated[dt.datetime | None, Parameter(default=None)] = None,
        granularity: Annotated[Granularity, Parameter(default="hour")] = "hour",
        model: Annotated[str | None, Parameter(max_length=128, default=None)] = None,
    ) -> UsageReport:
        end = end or utcnow()
        start = start or end - dt.timedelta(days=1)
        return await usage.report(db, principal.tenant_id, start=start, end=end, granularity=granularity, model=model)
