"""replicas.spare: replicas on GPUs the fleet pays for anyway, above what their pool asked for

A spare replica serves its pool's traffic like any other, but does not count toward the pool's
``desired_replicas``: the fleet tick keeps it on GPU slots of a node that stays billed for its
other replicas, promotes it when the pool grows (no cold start), and stops it the moment
placement or consolidation wants its GPUs. Existing replicas are regular ones.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.add_column(sa.Column("spare", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.drop_column("spare")
