"""Server-side console sessions. The browser holds only a random token; the row holds its hash.

A session may own one short-lived inference key for the playground. Its secret is stored sealed
with a key derived from the browser's token, so neither a database dump nor the browser alone
reveals it, and it is never sent to the page.
"""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import CheckConstraint, ForeignKey, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from controlplane.db.base import Base, UUIDPrimaryKey
from controlplane.db.types import JSONType, UTCDateTime, utcnow


class ConsoleSession(UUIDPrimaryKey, Base):
    __tablename__ = "console_sessions"

    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16))  # "tenant" | "operator"
    tenant_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    # The API key a tenant signed in with (NULL for password sign-in): the session ends with it.
    signin_key_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, ForeignKey("api_keys.id", ondelete="CASCADE"))
    signin_label: Mapped[str] = mapped_column(String(100), default="")
    scopes: Mapped[list[str]] = mapped_column(JSONType, default=list)
    csrf_token: Mapped[str] = mapped_column(String(64))
    playground_key_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("api_keys.id", ondelete="SET NULL")
    )
    playground_key_sealed: Mapped[str | None] = mapped_column(String(500))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, index=True)

    __table_args__ = (
        CheckConstraint("kind IN ('tenant', 'operator')", name="kind_known"),
        CheckConstraint("kind = 'operator' OR tenant_id IS NOT NULL", name="tenant_session_has_tenant"),
    )
