"""Usage rolled up per tenant × variant × minute, and the ledger that makes ingestion exactly-once."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db.base import Base
from controlplane.db.types import UTCDateTime, utcnow


class UsageMinute(Base):
    __tablename__ = "usage_minutes"

    tenant_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    variant_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("model_variants.id", ondelete="CASCADE"), primary_key=True
    )
    minute: Mapped[dt.datetime] = mapped_column(UTCDateTime, primary_key=True)
    requests: Mapped[int] = mapped_column(Integer, default=0)
    errors: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    # Requests answered from the edge's response cache (no GPU tokens; counted in ``requests`` too).
    cached_responses: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    queue_ms_sum: Mapped[int] = mapped_column(BigInteger, default=0)
    ttft_ms_sum: Mapped[int] = mapped_column(BigInteger, default=0)
    duration_ms_sum: Mapped[int] = mapped_column(BigInteger, default=0)

    __table_args__ = (Index("ix_usage_minutes_tenant_id_minute", "tenant_id", "minute"),)


class UsageEventSeen(Base):
    """Request ids already counted, so a redelivered stream entry is never counted twice."""

    __tablename__ = "usage_events_seen"

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seen_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
