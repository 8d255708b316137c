"""Tenants and their quotas. Every tenant-facing function takes the tenant id explicitly."""

from __future__ import annotations

import uuid

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import joinedload

from controlplane.db.types import utcnow
from controlplane.models import ApiKey, Quota, Tenant, TenantStatus
from controlplane.schemas.tenancy import QuotaBody, TenantCreate, TenantOut, TenantUpdate
from controlplane.services import audit
from controlplane.services.errors import Conflict, FieldError, NotFound
from controlplane.services.pagination import paginate
from controlplane.services.principal import Principal
from controlplane.services.secrets import hash_password

_QUOTA_FIELDS = tuple(QuotaBody.__struct_fields__)


def quota_out(quota: Quota | None) -> QuotaBody:
    if quota is None:
        return QuotaBody()
    return QuotaBody(**{f: getattr(quota, f) for f in _QUOTA_FIELDS})


def tenant_out(t: Tenant) -> TenantOut:
    return TenantOut(
        id=t.id,
        name=t.name,
        display_name=t.display_name,
        email=t.email,
        status=t.status.value,
        weight=t.weight,
        response_cache=t.response_cache,
        quota=quota_out(t.quota),
        created_at=t.created_at,
        updated_at=t.updated_at,
        suspended_at=t.suspended_at,
        semantic_cache_models=list(t.semantic_cache_models or []),
        semantic_cache_threshold=t.semantic_cache_threshold,
    )


def _live() -> select:
    return select(Tenant).where(Tenant.deleted_at.is_(None)).options(joinedload(Tenant.quota))


async def get(session: AsyncSession, tenant_id: uuid.UUID) -> Tenant:
    tenant = await session.scalar(_live().where(Tenant.id == tenant_id))
    if tenant is None:
        raise NotFound("tenant", tenant_id)
    return tenant


async def list_tenants(
    session: AsyncSession, *, status: str | None, name: str | None, limit: int, offset: int
) -> tuple[list[Tenant], int]:
    stmt = _live().order_by(Tenant.created_at, Tenant.id)
    if status:
        stmt = stmt.where(Tenant.status == TenantStatus(status))
    if name:
        stmt = stmt.where(Tenant.name.contains(name, autoescape=True))
    return await paginate(session, stmt, limit, offset)


async def _check_unique(session: AsyncSession, *, name: str | None, email: str | None, exclude=None) -> None:
    if name and await session.scalar(select(Tenant.id).where(Tenant.name == name, Tenant.id != exclude)):
        raise Conflict("tenant name already taken", [FieldError("name", "already taken")])
    if email and await session.scalar(select(Tenant.id).where(Tenant.email == email, Tenant.id != exclude)):
        raise Conflict("email already registered", [FieldError("email", "already registered")])


async def create(session: AsyncSession, principal: Principal, body: TenantCreate) -> Tenant:
    email = body.email.lower() if body.email else None
    await _check_unique(session, name=body.name, email=email)
    tenant = Tenant(
        name=body.name,
        display_name=body.display_name or body.name,
        email=email,
        password_hash=hash_password(body.password) if body.password else None,
        weight=body.weight,
        response_cache=body.response_cache,
        status=TenantStatus.active,
    )
    tenant.quota = Quota(**msgspec.structs.asdict(body.quota or QuotaBody()))
    session.add(tenant)
    await session.flush()
    audit.record(session, principal, "tenant.create", tenant, after=audit.snapshot(tenant), tenant_id=tenant.id)
    return tenant


async def update(session: AsyncSession, principal: Principal, tenant_id: uuid.UUID, body: TenantUpdate) -> Tenant:
    tenant = await get(session, tenant_id)
    before = audit.snapshot(tenant)
    email = body.email.lower() if body.email else None
    await _check_unique(session, name=None, email=email, exclude=tenant.id)
    for field in ("display_name", "weight", "response_cache"):
        value = getattr(body, field)
        if value is not None:
            setattr(tenant, field, value)
    if email is not None:
        tenant.email = email
    if body.password is not None:
        tenant.password_hash = hash_password(body.password)
    await session.flush()
    audit.record(session, principal, "tenant.update", tenant, before=before, after=audit.snapshot(tenant))
    return tenant


async def set_status(
    session: AsyncSession, principal: Principal, tenant_id: uuid.UUID, status: TenantStatus
) -> Tenant:
    tenant = await get(session, tenant_id)
    before = audit.snapshot(tenant)
    tenant.status = status
    tenant.suspended_at = utcnow() if status == TenantStatus.suspended else None
    await session.flush()
    audit.record(session, principal, f"tenant.{'suspend' if status == TenantStatus.suspended else 'resume'}",
                 tenant, before=before, after=audit.snapshot(tenant), tenant_id=tenant.id)
    return tenant


async def delete(session: AsyncSession, principal: Principal, tenant_id: uuid.UUID) -> None:
    """Soft delete: usage history stays for billing; every key is revoked at once."""
    tenant = await get(session, tenant_id)
    before = audit.snapshot(tenant)
    now = utcnow()
    tenant.deleted_at = now
    tenant.status = TenantStatus.suspended
    tenant.suspended_at = tenant.suspended_at or now
    for key in await session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant.id, ApiKey.revoked_at.is_(None))):
        key.revoked_at = now
    await session.flush()
    audit.record(session, principal, "tenant.delete", tenant, before=before, tenant_id=tenant.id)


async def put_quota(session: AsyncSession, principal: Principal, tenant_id: uuid.UUID, body: QuotaBody) -> Quota:
    tenant = await get(session, tenant_id)
    quota = tenant.quota or Quota(tenant_id=tenant.id)
    before = audit.snapshot(quota) if tenant.quota else None
    for field in _QUOTA_FIELDS:
        setattr(quota, field, getattr(body, field))
    if tenant.quota is None:
        session.add(quota)
        tenant.quota = quota
    await session.flush()
    audit.record(session, principal, "quota.update", quota, before=before, after=audit.snapshot(quota),
                 tenant_id=tenant.id)
    return quota
