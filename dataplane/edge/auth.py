"""Bearer-key authentication against the snapshot (sha256 of the whole key string)."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from datetime import UTC, datetime

from dataplane.edge import errors
from dataplane.edge.catalog import ApiKey, Catalog, Tenant

INFERENCE_SCOPE = "inference"
# The control plane's batch runner sends each line with the edge token, the id of the key the batch
# was created with, and the line's own request id (the same on every retry: usage counts it once).
ON_BEHALF_OF = "x-nimbus-on-behalf-of"
REQUEST_ID = "x-nimbus-request-id"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


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
    return admit(catalog, key, now)


def admit(catalog: Catalog, key: ApiKey, now: datetime | None = None) -> tuple[Tenant, ApiKey]:
    """A known key's tenant, unless the key expired, the tenant is suspended or the scope is missing."""
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


def is_internal(authorization: str | bytes | None, edge_token: str) -> bool:
    """Does this Authorization header carry the edge token (constant-time)?"""
    if not edge_token or not authorization:
        return False
    value = authorization if isinstance(authorization, str) else authorization.decode("latin-1")
    token = bearer_token(value)
    return token is not None and hmac.compare_digest(token.encode(), edge_token.encode())


def batch_caller(catalog: Catalog, headers: Mapping[str, str], edge_token: str) -> tuple[Tenant, ApiKey, str] | None:
    """The batch runner's call: (tenant, key, request id), or None when this is not one.

    The key must still be valid: a key revoked or expired mid-batch fails the rest of its lines
    (401 in the error file) instead of running on under a credential the tenant withdrew."""
    key_id = headers.get(ON_BEHALF_OF)
    if key_id is None or not is_internal(headers.get("authorization"), edge_token):
        return None
    key = catalog.keys_by_id.get(key_id)
    if key is None:
        raise errors.unauthorized("The API key this batch was created with no longer exists.")
    rid = headers.get(REQUEST_ID, "")
    if not _REQUEST_ID.match(rid):
        raise errors.bad_request(f"{REQUEST_ID} must be 1-64 characters of [A-Za-z0-9_.:-].", code="invalid_request_id")
    tenant, key = admit(catalog, key)
    return tenant, key, rid
