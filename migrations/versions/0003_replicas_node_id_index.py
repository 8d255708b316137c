"""index replicas by node

Every agent heartbeat reads its node's replicas, the reconcile tick checks a draining node's
replicas, and deleting a node cascades to them: without an index each is a scan of the table.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_replicas_node_id", "replicas", ["node_id"])


def downgrade() -> None:
    op.drop_index("ix_replicas_node_id", table_name="replicas")
