"""console sessions

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import controlplane.db.types

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=True),
        sa.Column("signin_key_id", sa.Uuid(), nullable=True),
        sa.Column("signin_label", sa.String(length=100), nullable=False),
        sa.Column("scopes", controlplane.db.types.JSONType, nullable=False),
        sa.Column("csrf_token", sa.String(length=64), nullable=False),
        sa.Column("playground_key_id", sa.Uuid(), nullable=True),
        sa.Column("playground_key_sealed", sa.String(length=500), nullable=True),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("expires_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.CheckConstraint("kind IN ('tenant', 'operator')", name=op.f("ck_console_sessions_kind_known")),
        sa.CheckConstraint(
            "kind = 'operator' OR tenant_id IS NOT NULL", name=op.f("ck_console_sessions_tenant_session_has_tenant")
        ),
        sa.ForeignKeyConstraint(
            ["playground_key_id"], ["api_keys.id"], name=op.f("fk_console_sessions_playground_key_id_api_keys"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["signin_key_id"], ["api_keys.id"], name=op.f("fk_console_sessions_signin_key_id_api_keys"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_console_sessions_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_console_sessions")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_console_sessions_token_sha256")),
    )
    with op.batch_alter_table("console_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_console_sessions_expires_at"), ["expires_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_console_sessions_tenant_id"), ["tenant_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("console_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_console_sessions_tenant_id"))
        batch_op.drop_index(batch_op.f("ix_console_sessions_expires_at"))
    op.drop_table("console_sessions")
