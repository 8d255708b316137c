"""nodes.cached_models: the model paths a node's local artifact cache holds

The agent keeps every checkpoint it fetched on the node's local disk (``dataplane.agent.artifacts``)
and reports them in its heartbeat; placement prefers such a node for a replica of that model, which
then starts without the download (minutes of every GPU it holds, for a 70B checkpoint). Existing
nodes start with an empty list: their next heartbeat fills it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import controlplane.db.types

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cached_models", controlplane.db.types.JSONType, nullable=False,
                                      server_default=sa.text("'[]'")))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("cached_models")
