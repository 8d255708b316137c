"""GPUs are the unit of capacity: nodes leave pools, replicas get a desired state

* ``nodes.pool_id`` goes: a node belongs to a node group (its cloud, region, zone, instance type
  and market columns, plus ``dedicated_tenant_id``) and hosts replicas of any pool. A node's
  dedication is carried over from the pool it was launched for.
* ``nodes.launch_spec`` holds what placement decided to launch; ``empty_since`` and
  ``underused_since`` drive the empty-node TTL and consolidation's settle period.
* ``replicas`` gain ``desired_state`` (running/stopped), ``port``, ``replaces_id`` (a
  make-before-break move), ``drain_deadline_at`` and ``stop_reason``; ``state`` gains ``pending`` (placed, not yet
  started by its agent). Existing replicas that still run are desired running, the rest stopped.
* ``model_variants.profiled_tokens_per_s``: one replica's measured throughput per GPU type.
* ``pools.schedule`` / ``schedule_timezone``: minimum replicas by time of day and day of week.
* Launches that had not reached a cloud yet (``pending`` nodes) were planned a node per replica;
  they are failed here, with their launch operations, and the new placement plans them again.
  A ``provisioning`` node keeps going: its VM may exist, and the launcher still owns it. Its
  launch spec is rebuilt from the pool it was launched for.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import controlplane.db.types

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

OLD_REPLICA_STATES = ("starting", "ready", "draining", "stopped", "failed")
NEW_REPLICA_STATES = ("pending", *OLD_REPLICA_STATES)


def _replica_state(values: tuple[str, ...]) -> sa.Enum:
    return sa.Enum(*values, name="replicastate", native_enum=False, create_constraint=True, length=24)


def upgrade() -> None:
    bind = op.get_bind()
    with op.batch_alter_table("model_variants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("profiled_tokens_per_s", controlplane.db.types.JSONType, nullable=True))
    variants = sa.table("model_variants", sa.column("profiled_tokens_per_s", controlplane.db.types.JSONType))
    bind.execute(sa.update(variants).values(profiled_tokens_per_s={}))
    with op.batch_alter_table("model_variants", schema=None) as batch_op:
        batch_op.alter_column("profiled_tokens_per_s", existing_type=controlplane.db.types.JSONType, nullable=False)
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.add_column(sa.Column("schedule", controlplane.db.types.JSONType, nullable=False,
                                      server_default=sa.text("'[]'")))
        batch_op.add_column(sa.Column("schedule_timezone", sa.String(length=64), nullable=False,
                                      server_default="UTC"))
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("dedicated_tenant_id", sa.Uuid(), nullable=True))
        batch_op.add_column(sa.Column("launch_spec", controlplane.db.types.JSONType, nullable=True))
        batch_op.add_column(sa.Column("empty_since", controlplane.db.types.UTCDateTime(), nullable=True))
        batch_op.add_column(sa.Column("underused_since", controlplane.db.types.UTCDateTime(), nullable=True))
        batch_op.create_index(batch_op.f("ix_nodes_dedicated_tenant_id"), ["dedicated_tenant_id"], unique=False)

    nodes = sa.table(
        "nodes", sa.column("id", sa.Uuid()), sa.column("pool_id", sa.Uuid()), sa.column("state", sa.String()),
        sa.column("cloud", sa.String()), sa.column("region", sa.String()), sa.column("zone", sa.String()),
        sa.column("instance_type", sa.String()), sa.column("spot", sa.Boolean()),
        sa.column("gpus_total", sa.Integer()), sa.column("dedicated_tenant_id", sa.Uuid()),
        sa.column("launch_spec", controlplane.db.types.JSONType), sa.column("error", sa.String()),
    )
    pools = sa.table("pools", sa.column("id", sa.Uuid()), sa.column("dedicated_tenant_id", sa.Uuid()),
                     sa.column("placement", controlplane.db.types.JSONType))
    operations = sa.table("operations", sa.column("node_id", sa.Uuid()), sa.column("kind", sa.String()),
                          sa.column("state", sa.String()), sa.column("error", sa.String()))
    rows = bind.execute(
        sa.select(nodes.c.id, nodes.c.state, nodes.c.cloud, nodes.c.region, nodes.c.zone, nodes.c.instance_type,
                  nodes.c.spot, nodes.c.gpus_total, pools.c.dedicated_tenant_id, pools.c.placement)
        .select_from(nodes.outerjoin(pools, pools.c.id == nodes.c.pool_id))
    ).all()
    for node_id, state, cloud, region, zone, itype, spot, gpus, tenant, placement in rows:
        prefs = placement or []
        first = prefs[0] if prefs else {}
        spec = {"cloud": cloud or first.get("cloud"), "region": region or first.get("region"),
                "instance_type": itype, "gpu_count": gpus or None, "spot": bool(spot),
                "zones": [zone] if zone else list(first.get("zones") or [])}
        values: dict = {"dedicated_tenant_id": tenant, "launch_spec": spec}
        if state == "pending":
            values.update(state="failed", error="re-planned: launches are placed per GPU since migration 0004")
        bind.execute(sa.update(nodes).where(nodes.c.id == node_id).values(**values))
    failed_pending = sa.select(nodes.c.id).where(nodes.c.error.like("re-planned:%"))
    bind.execute(
        sa.update(operations)
        .where(operations.c.kind == "launch", operations.c.state.in_(["pending", "running"]),
               operations.c.node_id.in_(failed_pending))
        .values(state="failed", error="node re-planned by GPU placement (migration 0004)")
    )

    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.alter_column("launch_spec", existing_type=controlplane.db.types.JSONType, nullable=False)
        batch_op.drop_index("ix_nodes_pool_id_state")
        batch_op.drop_constraint("fk_nodes_pool_id_pools", type_="foreignkey")
        batch_op.drop_column("pool_id")

    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.add_column(sa.Column(
            "desired_state",
            sa.Enum("running", "stopped", name="replicadesiredstate", native_enum=False, create_constraint=True,
                    length=24),
            nullable=False, server_default="running"))
        batch_op.add_column(sa.Column("port", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("replaces_id", sa.Uuid(), nullable=True))
        batch_op.add_column(sa.Column("drain_deadline_at", controlplane.db.types.UTCDateTime(), nullable=True))
        batch_op.add_column(sa.Column("stop_reason", sa.String(length=200), nullable=True))
        batch_op.alter_column("state", existing_type=_replica_state(OLD_REPLICA_STATES),
                              type_=_replica_state(NEW_REPLICA_STATES), existing_nullable=False)
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.alter_column("desired_state", server_default=None)
    replicas = sa.table("replicas", sa.column("state", sa.String()), sa.column("desired_state", sa.String()))
    bind.execute(sa.update(replicas).where(replicas.c.state.in_(["draining", "stopped", "failed"]))
                 .values(desired_state="stopped"))


def downgrade() -> None:
    bind = op.get_bind()
    replicas = sa.table("replicas", sa.column("state", sa.String()))
    bind.execute(sa.update(replicas).where(replicas.c.state == "pending").values(state="stopped"))
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.alter_column("state", existing_type=_replica_state(NEW_REPLICA_STATES),
                              type_=_replica_state(OLD_REPLICA_STATES), existing_nullable=False)
        batch_op.drop_column("stop_reason")
        batch_op.drop_column("drain_deadline_at")
        batch_op.drop_column("replaces_id")
        batch_op.drop_column("port")
        batch_op.drop_constraint("replicadesiredstate", type_="check")
        batch_op.drop_column("desired_state")

    # A node's pool is the pool of one of its replicas; a node that hosts none cannot be mapped
    # back to the one-pool model and is dropped with its replicas' rows.
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pool_id", sa.Uuid(), nullable=True))
    nodes = sa.table("nodes", sa.column("id", sa.Uuid()), sa.column("pool_id", sa.Uuid()))
    reps = sa.table("replicas", sa.column("node_id", sa.Uuid()), sa.column("pool_id", sa.Uuid()))
    bind.execute(sa.update(nodes).values(
        pool_id=sa.select(reps.c.pool_id).where(reps.c.node_id == nodes.c.id).limit(1).scalar_subquery()))
    bind.execute(sa.delete(nodes).where(nodes.c.pool_id.is_(None)))
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.alter_column("pool_id", existing_type=sa.Uuid(), nullable=False)
        batch_op.create_foreign_key("fk_nodes_pool_id_pools", "pools", ["pool_id"], ["id"], ondelete="CASCADE")
        batch_op.create_index("ix_nodes_pool_id_state", ["pool_id", "state"], unique=False)
        batch_op.drop_index(batch_op.f("ix_nodes_dedicated_tenant_id"))
        batch_op.drop_column("underused_since")
        batch_op.drop_column("empty_since")
        batch_op.drop_column("launch_spec")
        batch_op.drop_column("dedicated_tenant_id")
    with op.batch_alter_table("model_variants", schema=None) as batch_op:
        batch_op.drop_column("profiled_tokens_per_s")
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.drop_column("schedule_timezone")
        batch_op.drop_column("schedule")
