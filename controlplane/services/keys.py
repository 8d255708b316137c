"""API keys: create (secret returned once), list by prefix, revoke, and verify a presented secret."""

from __future__ import annotations

import time
import uuid

import msgspec
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.types import utcnow
from controlplane.models import ApiKey, Model, ModelVariant, Priority, Tenant, TenantStatus
from controlplane.schemas.tenancy import KeyCreate, KeyOut, KeyUpdate
from controlplane.services import audit
from controlplane.services.errors import FieldError, Forbidden, Invalid, NotFound, Unauthorized
from controlplane.services.pagination import paginate
from controlplane.services.principal import Principal
from controlplane.services.secrets import looks_like_api_key, new_api_key, sha256_hex

# last_used_at is written at most this often per key, so auth does not become a write path.
_LAST_USED_RESOLUTION_S = 60.0


def key_out(k: ApiKey) -> KeyOut:
    return KeyOut(
        id=k.id,
        tenant_id=k.tenant_id,
        name=k.name,
        prefix=k.prefix,
        scopes=list(k.scopes),
        priority=k.priority.value,
        created_at=k.created_at,
        expires_at=k.expires_at,
        revoked_at=k.revoked_at,
        last_used_at=k.last_used_at,
        allowed_models=list(k.allowed_models) if k.allowed_models is not None else None,
    )


async def checked_allowlist(session: AsyncSession, refs: list[str] | None) -> list[str] | None:
    """The allowlist as stored (deduplicated, sorted), or Invalid naming every entry that names no
    model ("name") or no tier of one ("name:tier"). None stays None: every model."""
    if refs is None:
        return None
    known: dict[str, set[str]] = {}
    for name, tier in await session.execute(select(Model.name, ModelVariant.tier).outerjoin(Model.variants)):
        known.setdefault(name, set()).update([tier] if tier is not None else [])
    problems = []
    for i, ref in enumerate(refs):
        name, _, tier = ref.partition(":")
        if name not in known:
            problems.append(FieldError(f"allowed_models[{i}]", f"no model named '{name}'"))
        elif tier and tier not in known[name]:
            problems.append(FieldError(f"allowed_models[{i}]", f"model '{name}' has no tier '{tier}'"))
    if problems:
        raise Invalid("allowed_models names models that do not exist", problems)
    return sorted(set(refs))


async def create(
    session: AsyncSession, principal: Principal, tenant_id: uuid.UUID, body: KeyCreate
) -> tuple[ApiKey, str]:
    if body.expires_at is not None:
        if body.expires_at.tzinfo is None:
            raise Invalid("expires_at needs a time zone", [FieldError("expires_at", "must include a UTC offset")])
        if body.expires_at <= utcnow():
            raise Invalid("expires_at is in the past", [FieldError("expires_at", "must be in the future")])
    if principal.kind == "tenant" and not set(body.scopes) <= principal.scopes:
        raise Forbidden("a key cannot grant scopes it does not hold itself")
    secret, prefix, digest = new_api_key()
    key = ApiKey(
        tenant_id=tenant_id,
        name=body.name,
        prefix=prefix,
        sha256=digest,
        scopes=sorted(set(body.scopes)),
        priority=Priority(body.priority),
        expires_at=body.expires_at,
        allowed_models=await checked_allowlist(session, body.allowed_models),
        created_by=principal.actor,
    )
    session.add(key)
    await session.flush()
    audit.record(session, principal, "key.create", key, after=audit.snapshot(key), tenant_id=tenant_id)
    return key, secret


async def change(session: AsyncSession, principal: Principal, tenant_id: uuid.UUID, key_id: uuid.UUID,
                 body: KeyUpdate) -> ApiKey:
    """Rename a key or change its model allowlist; it reaches the edges with their next snapshot."""
    key = await session.scalar(select(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant_id))
    if key is None:
        raise NotFound("key", key_id)
    if key.revoked_at is not None:
        raise Invalid("a revoked key cannot be changed", [FieldError("key_id", "revoked")])
    before = audit.snapshot(key)
    if body.name is not msgspec.UNSET:
        key.name = body.name
    if body.allowed_models is not msgspec.UNSET:
        key.allowed_models = await checked_allowlist(session, body.allowed_models)
    await session.flush()
    audit.record(session, principal, "key.update", key, before=before, after=audit.snapshot(key), tenant_id=tenant_id)
    return key


async def list_for_tenant(
    session: AsyncSession, tenant_id: uuid.UUID, *, include_revoked: bool, limit: int, offset: int
) -> tuple[list[ApiKey], int]:
    stmt = select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at, ApiKey.id)
    if not include_revoked:
        stmt = stmt.where(ApiKey.revoked_at.is_(None))
    return await paginate(session, stmt, limit, offset)


async def revoke(session: AsyncSession, principal: Principal, tenant_id: uuid.UUID, key_id: uuid.UUID) -> ApiKey:
    # Scoped by tenant: another tenant's key id is simply "not found".
    key = await session.scalar(select(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant_id))
    if key is None:
        raise NotFound("key", key_id)
    if key.revoked_at is None:
        before = audit.snapshot(key)
        key.revoked_at = utcnow()
        await session.flush()
        audit.record(session, principal, "key.revoke", key, before=before, after=audit.snapshot(key),
                     tenant_id=tenant_id)
    return key


class KeyVerifier:
    """Resolves a presented secret to a Principal, with a short positive cache.

    Revocation, suspension and expiry are re-checked from the database once the cache entry
    (``ttl`` seconds) lapses, so they take effect within ``ttl``.
    """

    def __init__(self, ttl: float = 5.0) -> None:
        self.ttl = ttl
        self._cache: dict[str, tuple[float, Principal]] = {}

    def forget_all(self) -> None:
        """Drop cached verdicts after a local revoke/suspend so it applies at once on this process."""
        self._cache.clear()

    async def verify(self, session: AsyncSession, secret: str | None, *, scope: str) -> Principal:
        if not secret or not looks_like_api_key(secret):
            raise Unauthorized("missing or malformed API key")
        digest = sha256_hex(secret)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached and now - cached[0] < self.ttl:
            principal = cached[1]
        else:
            principal = await self._load(session, digest)
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[digest] = (now, principal)
        if scope not in principal.scopes:
            raise Forbidden(f"this key lacks the '{scope}' scope")
        return principal

    async def _load(self, session: AsyncSession, digest: str) -> Principal:
        row = (
            await session.execute(
                select(ApiKey, Tenant).join(Tenant, Tenant.id == ApiKey.tenant_id).where(ApiKey.sha256 == digest)
            )
        ).first()
        if row is None:
            raise Unauthorized("invalid API key")
        key, tenant = row
        now = utcnow()
        if key.revoked_at is not None or tenant.deleted_at is not None:
            raise Unauthorized("this API key has been revoked")
        if key.expires_at is not None and key.expires_at <= now:
            raise Unauthorized("this API key has expired")
        if tenant.status != TenantStatus.active:
            raise Forbidden("this tenant is suspended")
        if key.last_used_at is None or (now - key.last_used_at).total_seconds() > _LAST_USED_RESOLUTION_S:
            await session.execute(update(ApiKey).where(ApiKey.id == key.id).values(last_used_at=now))
            await session.commit()
        return Principal(
            kind="tenant", tenant_id=tenant.id, key_id=key.id, key_prefix=key.prefix, scopes=frozenset(key.scopes)
        )
