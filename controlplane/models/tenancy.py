"""Tenants, their API keys and quotas."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import Boolean, CheckConstraint, Float, ForeignKey, Index, Integer, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.db.base import Base, Timestamps, UUIDPrimaryKey
from controlplane.db.types import JSONType, UTCDateTime
from controlplane.models.enums import Priority, TenantStatus, db_enum


class Tenant(UUIDPrimaryKey, Timestamps, Base):
    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(63), unique=True)
    display_name: Mapped[str] = mapped_column(String(200), default="")
    email: Mapped[str | None] = mapped_column(String(320), unique=True)
    # scrypt hash for console sign-in by email; null means key sign-in only.
    password_hash: Mapped[str | None] = mapped_column(String(255))
    status: Mapped[TenantStatus] = mapped_column(db_enum(TenantStatus), default=TenantStatus.active)
    # Fair-share weight used by the edge's virtual token counter.
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    response_cache: Mapped[bool] = mapped_column(Boolean, default=False)
    # The edge's semantic cache: the models it is on for, and the tenant's similarity threshold
    # (None: the operator's default; always within the operator's bounds).
    semantic_cache_models: Mapped[list[str]] = mapped_column(JSONType, default=list, server_default="[]")
    semantic_cache_threshold: Mapped[float | None] = mapped_column(Float, nullable=True)
    suspended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    deleted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, index=True)

    keys: Mapped[list[ApiKey]] = relationship(back_populates="tenant", cascade="all, delete-orphan")
    quota: Mapped[Quota | None] = relationship(back_populates="tenant", cascade="all, delete-orphan")

    __table_args__ = (CheckConstraint("weight > 0", name="weight_positive"),)


class ApiKey(UUIDPrimaryKey, Timestamps, Base):
    """A tenant credential. Only a SHA-256 of the secret is stored; the secret is shown once."""

    __tablename__ = "api_keys"

    tenant_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100), default="")
    # Displayable, non-secret identifier: "nmb_" + 8 chars. Unique so it can name the key.
    prefix: Mapped[str] = mapped_column(String(16), unique=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSONType, default=lambda: ["inference"])
    # Models the key may call: "name" (every tier) or "name:tier"; NULL: every model its tenant may use.
    # Enforced by the edge (the snapshot carries it), where a model outside it does not exist.
    allowed_models: Mapped[list[str] | None] = mapped_column(JSONType, nullable=True, default=None)
    priority: Mapped[Priority] = mapped_column(db_enum(Priority), default=Priority.interactive)
    expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    created_by: Mapped[str] = mapped_column(String(100), default="admin")

    tenant: Mapped[Tenant] = relationship(back_populates="keys")

    __table_args__ = (Index("ix_api_keys_tenant_id_created_at", "tenant_id", "created_at"),)


class Quota(Timestamps, Base):
    """Per-tenant limits; NULL means unlimited."""

    __tablename__ = "quotas"

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    requests_per_minute: Mapped[int | None] = mapped_column(Integer)
    tokens_per_minute: Mapped[int | None] = mapped_column(Integer)
    max_concurrent_requests: Mapped[int | None] = mapped_column(Integer)
    max_gpus: Mapped[int | None] = mapped_column(Integer)
    monthly_token_budget: Mapped[int | None] = mapped_column(Integer)

    tenant: Mapped[Tenant] = relationship(back_populates="quota")

    __table_args__ = (
        CheckConstraint(
            "coalesce(requests_per_minute, 0) >= 0 AND coalesce(tokens_per_minute, 0) >= 0 "
            "AND coalesce(max_concurrent_requests, 0) >= 0 AND coalesce(max_gpus, 0) >= 0 "
            "AND coalesce(monthly_token_budget, 0) >= 0",
            name="non_negative",
        ),
    )
