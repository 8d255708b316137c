"""The object store the Batch API's files live in, opened once per process from the settings."""

from __future__ import annotations

import functools

from controlplane.config import Settings
from infra.objectstore import ObjectStore, open_store


@functools.cache
def _open(url: str, endpoint_url: str | None, kms_key_id: str | None) -> ObjectStore:
    return open_store(url, endpoint_url=endpoint_url, kms_key_id=kms_key_id)


def batch_store(settings: Settings) -> ObjectStore:
    return _open(settings.resolved_batch_store_url, settings.batch_store_endpoint_url, settings.batch_store_kms_key_id)


def object_key(tenant_id: object, file_id: str) -> str:
    """Per tenant, so an operator can find (and a lifecycle rule can scope) one tenant's files."""
    return f"{tenant_id}/{file_id}"
