"""Provisioning operations, the shared capacity blocklist and autoscaler decisions."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db.base import Base, Timestamps, UUIDPrimaryKey
from controlplane.db.types import JSONType, UTCDateTime, utcnow
from controlplane.models.enums import BlockScope, OperationKind, OperationState, db_enum
from controlplane.models.fleet import Leased


class Operation(UUIDPrimaryKey, Timestamps, Leased, Base):
    """Every provisioning action, retried under a lease until it succeeds or its deadline passes."""

    __tablename__ = "operations"

    kind: Mapped[OperationKind] = mapped_column(db_enum(OperationKind))
    state: Mapped[OperationState] = mapped_column(db_enum(OperationState), default=OperationState.pending)
    pool_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, ForeignKey("pools.id", ondelete="SET NULL"))
    node_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, ForeignKey("nodes.id", ondelete="SET NULL"))
    idempotency_key: Mapped[str] = mapped_column(String(128), unique=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(String(2000))
    # One entry per attempt/candidate: {"at", "cloud", "region", "zone", "instance_type", "spot", "error", "scope"}
    history: Mapped[list[dict]] = mapped_column(JSONType, default=list)
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    deadline_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("ix_operations_state_next_attempt_at", "state", "next_attempt_at"),
        Index("ix_operations_pool_id_created_at", "pool_id", "created_at"),
    )


class CapacityBlock(UUIDPrimaryKey, Base):
    """A zone, region or whole cloud that recently refused capacity; shared by every worker."""

    __tablename__ = "capacity_blocks"

    scope: Mapped[BlockScope] = mapped_column(db_enum(BlockScope))
    cloud: Mapped[str] = mapped_column(String(16))
    region: Mapped[str | None] = mapped_column(String(64))
    zone: Mapped[str | None] = mapped_column(String(64))
    # Capacity is per zone × instance type × market: a spot shortage must not block the
    # on-demand fallback in the same zone. NULL means "every type" / "both markets".
    instance_type: Mapped[str | None] = mapped_column(String(64))
    spot: Mapped[bool | None] = mapped_column(Boolean)
    reason: Mapped[str] = mapped_column(String(500), default="")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, index=True)


class AutoscalerDecision(UUIDPrimaryKey, Base):
    __tablename__ = "autoscaler_decisions"

    pool_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("pools.id", ondelete="CASCADE"))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    current_replicas: Mapped[int] = mapped_column(Integer)
    target_replicas: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(32))  # hold | scale_up | scale_down | consolidate
    reasons: Mapped[list[str]] = mapped_column(JSONType, default=list)
    signals: Mapped[dict] = mapped_column(JSONType, default=dict)

    __table_args__ = (Index("ix_autoscaler_decisions_pool_id_created_at", "pool_id", "created_at"),)
