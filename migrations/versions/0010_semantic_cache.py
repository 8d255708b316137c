"""tenants.semantic_cache_models / semantic_cache_threshold: the semantic response cache, per tenant

A tenant opts into the edge's semantic cache per model (names as clients send them) and may set
its similarity threshold within the operator's bounds (``Settings.semantic_cache_threshold_*``;
null: the operator's default). Existing tenants have it off.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from controlplane.db.types import JSONType

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("semantic_cache_models", JSONType, nullable=False, server_default="[]"))
        batch_op.add_column(sa.Column("semantic_cache_threshold", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_column("semantic_cache_threshold")
        batch_op.drop_column("semantic_cache_models")
