"""Bearer-key authentication against the snapshot (sha256 of the whole key string)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from dataplane.edge import errors
from dataplane.edge.catalog import ApiKey, Catalog, Tenant

INFERENCE_SCOPE = "inference"


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def authenticate(catalog: Catalog, authorization: str | None, now: datetime | None = None) -> tuple[Tenant, ApiKey]:
    """Return the tenant and key, or raise 401 (unknown/expired key) / 403 (suspended, wrong scope).

    Revocation is the key disappearing from the snapshot, so it lands within one poll interval."""
    token = bearer_token(authorization)
    if token is None:
        raise errors.unauthorized("Missing bearer API key. Send `Authorization: Bearer nmb_...`.")
    key = catalog.keys_by_hash.get(hashlib.sha256(token.encode()).hexdigest())
    if key is None:
        raise errors.unauthorized("Invalid API key.")
    if key.expires_at is not None and key.expires_at <= (now or datetime.now(UTC)):
        raise errors.unauthorized("This API key has expired.")
    tenant = catalog.tenants.get(key.tenant_id)
    if tenant is None:
        raise errors.unauthorized("Invalid API key.")
    if tenant.status != "active":
        raise errors.forbidden("This tenant is suspended.", code="tenant_suspended")
    if INFERENCE_SCOPE not in key.scopes:
        raise errors.forbidden("This API key may not call inference endpoints.", code="insufficient_scope")
    return tenant, key
