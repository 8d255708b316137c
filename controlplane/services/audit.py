"""Audit log writes. Called inside the same transaction as the mutation it records."""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.models import AuditEvent
from controlplane.services.principal import Principal

# Never copied into audit rows.
_SECRET_COLUMNS = {"sha256", "password_hash", "bootstrap_token_sha256", "credential_sha256"}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID | enum.Enum):
        return str(value.value if isinstance(value, enum.Enum) else value)
    return value


def snapshot(obj: Any) -> dict[str, Any]:
    """Column values of an ORM object, secrets left out."""
    return {
        attr.key: _jsonable(getattr(obj, attr.key))
        for attr in inspect(obj).mapper.column_attrs
        if attr.key not in _SECRET_COLUMNS
    }


def record(
    session: AsyncSession,
    principal: Principal,
    action: str,
    target: Any,
    *,
    before: dict | None = None,
    after: dict | None = None,
    tenant_id: uuid.UUID | None = None,
) -> None:
    target_type = target.__tablename__ if hasattr(target, "__tablename__") else str(target)
    target_id = getattr(target, "id", None) or getattr(target, "tenant_id", None)
    session.add(
        AuditEvent(
            actor=principal.actor,
            action=action,
            target_type=target_type,
            target_id=str(target_id) if target_id is not None else None,
            tenant_id=tenant_id or principal.tenant_id,
            before=before,
            after=after,
        )
    )


def record_signin(
    session: AsyncSession,
    action: str,
    *,
    actor: str,
    kind: str,
    channel: str,
    address: str,
    account: str,
    target_id: str | None = None,
    tenant_id: uuid.UUID | None = None,
    **facts: Any,
) -> None:
    """A sign-in attempt: ``signin.success``, ``signin.failure`` or ``signin.locked`` (a failure that
    started a lock). ``account`` is a label that is never a secret (an email a tenant holds, a key's
    public prefix, "admin", or a digest of what was typed)."""
    session.add(
        AuditEvent(
            actor=actor[:200],
            action=action,
            target_type="signin",
            target_id=(target_id or account)[:100],
            tenant_id=tenant_id,
            after={"kind": kind, "channel": channel, "address": address, "account": account, **facts},
        )
    )
