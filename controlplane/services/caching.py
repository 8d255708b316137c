"""A tenant's response caches: its settings (the semantic threshold within the operator's bounds)
and the purge ("clear my cache"), which deletes its entries from the edges' shared store.

The edges keep the entries (``dataplane/edge/response_cache.py``, ``semantic_cache.py``): exact and
semantic answers under ``{prefix}rcache:{region}:{tenant}:…`` and the semantic index in each
region's log stream ``{prefix}scache:{region}:log``. A purge deletes the answers (which already
makes every lookup of them a miss) and appends a purge record to every region's log, so each
edge also drops the tenant's vectors from its index.
"""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.config import Settings
from controlplane.models import Tenant
from controlplane.schemas.tenancy import CacheSettings, CacheSettingsOut
from controlplane.services import audit
from controlplane.services.errors import FieldError, Invalid
from controlplane.services.principal import Principal
from controlplane.services.tenants import get


def threshold_in_force(tenant: Tenant, settings: Settings) -> float:
    return tenant.semantic_cache_threshold if tenant.semantic_cache_threshold is not None \
        else settings.semantic_cache_threshold_default


def settings_out(tenant: Tenant, settings: Settings) -> CacheSettingsOut:
    return CacheSettingsOut(
        response_cache=tenant.response_cache,
        semantic_cache_models=list(tenant.semantic_cache_models or []),
        semantic_cache_threshold=threshold_in_force(tenant, settings),
        threshold_bounds=(settings.semantic_cache_threshold_min, settings.semantic_cache_threshold_max),
    )


async def change(session: AsyncSession, principal: Principal, settings: Settings, tenant_id: uuid.UUID,
                 body: CacheSettings) -> Tenant:
    low, high = settings.semantic_cache_threshold_min, settings.semantic_cache_threshold_max
    if body.semantic_cache_threshold is not None and not low <= body.semantic_cache_threshold <= high:
        raise Invalid("semantic_cache_threshold is outside the operator's bounds",
                      [FieldError("semantic_cache_threshold", f"must be between {low} and {high}")])
    tenant = await get(session, tenant_id)
    before = audit.snapshot(tenant)
    if body.response_cache is not None:
        tenant.response_cache = body.response_cache
    if body.semantic_cache_models is not None:
        tenant.semantic_cache_models = sorted(set(body.semantic_cache_models))
    if body.semantic_cache_threshold is not None:
        tenant.semantic_cache_threshold = body.semantic_cache_threshold
    await session.flush()
    audit.record(session, principal, "tenant.cache_settings", tenant, before=before, after=audit.snapshot(tenant))
    return tenant


def purge(redis_url: str, prefix: str, tenant_id: uuid.UUID) -> int:
    """Delete the tenant's cached answers in every region; returns how many. Blocking (run it in
    a thread): a SCAN over the cache keys, then one purge record per region's semantic log."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        deleted = 0
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}rcache:*:{tenant_id}:*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += client.delete(*batch)
                batch = []
        if batch:
            deleted += client.delete(*batch)
        for log in client.scan_iter(match=f"{prefix}scache:*:log", count=100):
            client.xadd(log, {"op": "purge", "tenant": str(tenant_id)})
        return deleted
    finally:
        client.close()
