"""Audit log: every mutation, who made it, and the state before and after."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import Index, Select, String, Uuid, select
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db.base import Base, UUIDPrimaryKey
from controlplane.db.types import JSONType, UTCDateTime, utcnow


class AuditEvent(UUIDPrimaryKey, Base):
    __tablename__ = "audit_events"

    at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    actor: Mapped[str] = mapped_column(String(200))  # "admin", "tenant:<id> key:<prefix>", "system"
    action: Mapped[str] = mapped_column(String(100))  # "tenant.create", "key.revoke", …
    target_type: Mapped[str] = mapped_column(String(50))
    target_id: Mapped[str | None] = mapped_column(String(100))
    tenant_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    before: Mapped[dict | None] = mapped_column(JSONType)
    after: Mapped[dict | None] = mapped_column(JSONType)

    __table_args__ = (Index("ix_audit_events_at", "at"), Index("ix_audit_events_target", "target_type", "target_id"))


# The sweeper's eviction guard (controlplane/fleet/sweeper.py) records, per scope ("fleet" or
# "<cloud>/<region>"), when it stops and resumes evicting silent nodes; the operator console and the
# API's /metrics read the latest event per scope. Each node it evicts for silence gets a NODE_EVICTED
# event, which is also what its fleet-wide rate limit counts.
EVICTION_SCOPE = "eviction_scope"
EVICTIONS_PAUSED = "fleet.evictions_paused"
EVICTIONS_RESUMED = "fleet.evictions_resumed"
NODE_EVICTED = "node.evicted"


def latest_eviction_scope_events(limit: int = 500) -> Select:
    """Newest first: the first row per ``target_id`` is that scope's current state."""
    return (select(AuditEvent.target_id, AuditEvent.action, AuditEvent.at, AuditEvent.after)
            .where(AuditEvent.target_type == EVICTION_SCOPE)
            .order_by(AuditEvent.at.desc()).limit(limit))
