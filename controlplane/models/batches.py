"""The Batch API's rows: tenants' files (the bytes live in the region's object store), batches
and the per-line results a batch worker has recorded.

A batch's input file is immutable once uploaded, so the worker re-reads it instead of copying
its lines into Postgres; ``batch_results`` holds one row per answered line, keyed by
(batch, line), which is what makes a worker killed mid-batch harmless: its successor skips
every line already answered and the key refuses a second answer for the same line.
"""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import BigInteger, Boolean, ForeignKey, Index, Integer, String, Text, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db.base import Base, Timestamps
from controlplane.db.types import JSONType, UTCDateTime, utcnow
from controlplane.models.fleet import Leased


class BatchFile(Timestamps, Base):
    """An OpenAI file object. ``id`` is OpenAI-shaped (``file-…``), the object key is private."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("tenants.id", ondelete="CASCADE"))
    purpose: Mapped[str] = mapped_column(String(32))  # batch | batch_output | batch_error
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)
    object_key: Mapped[str] = mapped_column(String(512))
    # Set when the tenant deletes it: the row stays (a batch may still name it), the object goes.
    deleted_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_files_tenant_id_created_at", "tenant_id", "created_at"),)


class Batch(Timestamps, Leased, Base):
    """An OpenAI batch. Its status moves validating → in_progress → finalizing → completed, or to
    failed / expired / cancelling → cancelled; the batch worker is the only writer of moves after
    creation, except the tenant's cancel (→ cancelling)."""

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("tenants.id", ondelete="CASCADE"))
    # The key that created it: its allowlist and limits apply to every line, and usage names it.
    key_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("api_keys.id", ondelete="CASCADE"))
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[str] = mapped_column(String(64), ForeignKey("files.id", ondelete="RESTRICT"))
    completion_window: Mapped[str] = mapped_column(String(16), default="24h")
    status: Mapped[str] = mapped_column(String(16), default="validating", index=True)
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))
    # OpenAI's "errors" object (validation failures), or None.
    errors: Mapped[dict | None] = mapped_column(JSONType, nullable=True)
    request_total: Mapped[int] = mapped_column(Integer, default=0)
    request_completed: Mapped[int] = mapped_column(Integer, default=0)
    request_failed: Mapped[int] = mapped_column(Integer, default=0)
    batch_metadata: Mapped[dict | None] = mapped_column("metadata", JSONType, nullable=True)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    in_progress_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    finalizing_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    completed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    failed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    expired_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    cancelling_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    cancelled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_batches_tenant_id_created_at", "tenant_id", "created_at"),)


class BatchResult(Base):
    """One answered line of a batch: what goes to its output (``ok``) or error file."""

    __tablename__ = "batch_results"

    batch_id: Mapped[str] = mapped_column(String(64), ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True)
    line: Mapped[int] = mapped_column(Integer, primary_key=True)
    custom_id: Mapped[str] = mapped_column(String(512))
    ok: Mapped[bool] = mapped_column(Boolean)
    # The output line as OpenAI writes it (JSON text, written to the file verbatim).
    record: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
