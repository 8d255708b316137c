"""model_variants.output_token_weight: what a generated token costs a replica, in prompt tokens

The autoscaler sizes a pool by its token rate over a replica's profiled tokens/s. Counting a
generated token like a prompt token sizes by request rate × length, and misses a shift towards
long outputs (a decode step per token) or long prompts (a whole prompt per prefill step). With
the weight the token rate is prompt + weight × generated tokens/s, in the profile's own unit.
Existing variants get none: their profiles were measured in plain tokens.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("model_variants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("output_token_weight", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("model_variants", schema=None) as batch_op:
        batch_op.drop_column("output_token_weight")
