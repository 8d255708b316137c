"""nodes.bootstrap_salt: a register retried with the same bootstrap token gets the same credential

The first register stores a random salt; the node credential is an HMAC of the salt and the node id
keyed by the bootstrap token (which no table holds, only its SHA-256), so a retry whose first answer
was lost derives the same credential again. The token, its expiry and the salt are cleared once the
agent uses the credential. Existing rows get none (their tokens are spent already).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("bootstrap_salt", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("bootstrap_salt")
