"""The Batch API: files, batches and per-line batch results

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlplane.db.types import JSONType, UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("object_key", sa.String(512), nullable=False),
        sa.Column("deleted_at", UTCDateTime(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_files_tenant_id_tenants", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_files"),
    )
    op.create_index("ix_files_tenant_id_created_at", "files", ["tenant_id", "created_at"])
    op.create_table(
        "batches",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("key_id", sa.Uuid(), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(64), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("output_file_id", sa.String(64), nullable=True),
        sa.Column("error_file_id", sa.String(64), nullable=True),
        sa.Column("errors", JSONType, nullable=True),
        sa.Column("request_total", sa.Integer(), nullable=False),
        sa.Column("request_completed", sa.Integer(), nullable=False),
        sa.Column("request_failed", sa.Integer(), nullable=False),
        sa.Column("metadata", JSONType, nullable=True),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("in_progress_at", UTCDateTime(), nullable=True),
        sa.Column("finalizing_at", UTCDateTime(), nullable=True),
        sa.Column("completed_at", UTCDateTime(), nullable=True),
        sa.Column("failed_at", UTCDateTime(), nullable=True),
        sa.Column("expired_at", UTCDateTime(), nullable=True),
        sa.Column("cancelling_at", UTCDateTime(), nullable=True),
        sa.Column("cancelled_at", UTCDateTime(), nullable=True),
        sa.Column("lock_token", sa.Uuid(), nullable=True),
        sa.Column("lock_expires_at", UTCDateTime(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], name="fk_batches_tenant_id_tenants", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["key_id"], ["api_keys.id"], name="fk_batches_key_id_api_keys", ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["input_file_id"], ["files.id"], name="fk_batches_input_file_id_files",
                                ondelete="RESTRICT"),
        sa.PrimaryKeyConstraint("id", name="pk_batches"),
    )
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_index("ix_batches_tenant_id_created_at", "batches", ["tenant_id", "created_at"])
    op.create_table(
        "batch_results",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.String(512), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("record", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["batch_id"], ["batches.id"], name="fk_batch_results_batch_id_batches",
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("batch_id", "line", name="pk_batch_results"),
    )


def downgrade() -> None:
    op.drop_table("batch_results")
    op.drop_index("ix_batches_tenant_id_created_at", table_name="batches")
    op.drop_index("ix_batches_status", table_name="batches")
    op.drop_table("batches")
    op.drop_index("ix_files_tenant_id_created_at", table_name="files")
    op.drop_table("files")
