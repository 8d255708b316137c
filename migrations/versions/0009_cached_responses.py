"""usage_minutes.cached_responses: requests answered from the response cache

A cache hit is a request (it counts in ``requests`` and against the tenant's request rate) that
used no GPU tokens. Counting it apart lets tenants and operators see how much of their traffic the
cache answered. Existing rows had no hits counted: 0.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage_minutes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cached_responses", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("usage_minutes", schema=None) as batch_op:
        batch_op.drop_column("cached_responses")
