"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import controlplane.db.types

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("action", sa.String(length=100), nullable=False),
        sa.Column("target_type", sa.String(length=50), nullable=False),
        sa.Column("target_id", sa.String(length=100), nullable=True),
        sa.Column("tenant_id", sa.Uuid(), nullable=True),
        sa.Column("before", controlplane.db.types.JSONType, nullable=True),
        sa.Column("after", controlplane.db.types.JSONType, nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_events")),
    )
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.create_index("ix_audit_events_at", ["at"], unique=False)
        batch_op.create_index("ix_audit_events_target", ["target_type", "target_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_audit_events_tenant_id"), ["tenant_id"], unique=False)

    op.create_table(
        "capacity_blocks",
        sa.Column(
            "scope",
            sa.Enum(
                "zone",
                "region",
                "cloud",
                name="blockscope",
                native_enum=False,
                create_constraint=True,
                length=24,
            ),
            nullable=False,
        ),
        sa.Column("cloud", sa.String(length=16), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=True),
        sa.Column("zone", sa.String(length=64), nullable=True),
        sa.Column("instance_type", sa.String(length=64), nullable=True),
        sa.Column("spot", sa.Boolean(), nullable=True),
        sa.Column("reason", sa.String(length=500), nullable=False),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("expires_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_capacity_blocks")),
    )
    with op.batch_alter_table("capacity_blocks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_capacity_blocks_expires_at"), ["expires_at"], unique=False)

    op.create_table(
        "clouds",
        sa.Column("name", sa.String(length=16), nullable=False),
        sa.Column("project", sa.String(length=200), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_clouds")),
        sa.UniqueConstraint("name", name=op.f("uq_clouds_name")),
    )
    op.create_table(
        "models",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("display_name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.String(length=2000), nullable=False),
        sa.Column("default_tier", sa.String(length=16), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("name", name=op.f("uq_models_name")),
    )
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("display_name", sa.String(length=200), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=True),
        sa.Column("password_hash", sa.String(length=255), nullable=True),
        sa.Column(
            "status",
            sa.Enum(
                "active",
                "suspended",
                name="tenantstatus",
                native_enum=False,
                create_constraint=True,
                length=24,
            ),
            nullable=False,
        ),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("response_cache", sa.Boolean(), nullable=False),
        sa.Column("suspended_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("deleted_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.CheckConstraint("weight > 0", name=op.f("ck_tenants_weight_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("email", name=op.f("uq_tenants_email")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tenants_deleted_at"), ["deleted_at"], unique=False)

    op.create_table(
        "usage_events_seen",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("seen_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_usage_events_seen")),
    )
    with op.batch_alter_table("usage_events_seen", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_usage_events_seen_seen_at"), ["seen_at"], unique=False)

    op.create_table(
        "api_keys",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("scopes", controlplane.db.types.JSONType, nullable=False),
        sa.Column(
            "priority",
            sa.Enum(
                "interactive", "batch", name="priority", native_enum=False, create_constraint=True, length=24
            ),
            nullable=False,
        ),
        sa.Column("expires_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("revoked_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("last_used_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("created_by", sa.String(length=100), nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_api_keys_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("prefix", name=op.f("uq_api_keys_prefix")),
        sa.UniqueConstraint("sha256", name=op.f("uq_api_keys_sha256")),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index("ix_api_keys_tenant_id_created_at", ["tenant_id", "created_at"], unique=False)

    op.create_table(
        "model_variants",
        sa.Column("model_id", sa.Uuid(), nullable=False),
        sa.Column("tier", sa.String(length=16), nullable=False),
        sa.Column("quantization", sa.String(length=32), nullable=True),
        sa.Column("model_path", sa.String(length=500), nullable=False),
        sa.Column("engine_args", controlplane.db.types.JSONType, nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("gpu_memory_gb", sa.Float(), nullable=False),
        sa.Column("gpu_types", controlplane.db.types.JSONType, nullable=True),
        sa.Column("context_length", sa.Integer(), nullable=False),
        sa.Column("size_gb", sa.Float(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "gpu_count >= 1 AND context_length >= 1 AND gpu_memory_gb > 0",
            name=op.f("ck_model_variants_sane_needs"),
        ),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_model_variants_model_id_models"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_variants")),
        sa.UniqueConstraint("model_id", "tier", name=op.f("uq_model_variants_model_id_tier")),
    )
    op.create_table(
        "quotas",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("requests_per_minute", sa.Integer(), nullable=True),
        sa.Column("tokens_per_minute", sa.Integer(), nullable=True),
        sa.Column("max_concurrent_requests", sa.Integer(), nullable=True),
        sa.Column("max_gpus", sa.Integer(), nullable=True),
        sa.Column("monthly_token_budget", sa.Integer(), nullable=True),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.CheckConstraint(
            "coalesce(requests_per_minute, 0) >= 0 AND coalesce(tokens_per_minute, 0) >= 0 AND coalesce(max_concurrent_requests, 0) >= 0 AND coalesce(max_gpus, 0) >= 0 AND coalesce(monthly_token_budget, 0) >= 0",
            name=op.f("ck_quotas_non_negative"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_quotas_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_quotas")),
    )
    op.create_table(
        "regions",
        sa.Column("cloud_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("edge_url", sa.String(length=500), nullable=True),
        sa.Column("artifact_bucket", sa.String(length=500), nullable=True),
        sa.Column("template_kind", sa.String(length=32), nullable=False),
        sa.Column("template_id", sa.String(length=500), nullable=False),
        sa.Column("template_name", sa.String(length=200), nullable=True),
        sa.Column("template_version", sa.String(length=64), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cloud_id"], ["clouds.id"], name=op.f("fk_regions_cloud_id_clouds"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_regions")),
        sa.UniqueConstraint("cloud_id", "name", name=op.f("uq_regions_cloud_id_name")),
    )
    op.create_table(
        "instance_types",
        sa.Column("region_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("gpu_type", sa.String(length=32), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("gpu_memory_gb", sa.Float(), nullable=False),
        sa.Column("vcpus", sa.Integer(), nullable=True),
        sa.Column("memory_gb", sa.Float(), nullable=True),
        sa.Column("on_demand_price", sa.Float(), nullable=False),
        sa.Column("spot_price", sa.Float(), nullable=True),
        sa.Column("zones", controlplane.db.types.JSONType, nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.CheckConstraint("gpu_count >= 1", name=op.f("ck_instance_types_gpu_count_positive")),
        sa.ForeignKeyConstraint(
            ["region_id"],
            ["regions.id"],
            name=op.f("fk_instance_types_region_id_regions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance_types")),
        sa.UniqueConstraint("region_id", "name", name=op.f("uq_instance_types_region_id_name")),
    )
    op.create_table(
        "pools",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("variant_id", sa.Uuid(), nullable=False),
        sa.Column("dedicated_tenant_id", sa.Uuid(), nullable=True),
        sa.Column(
            "kind",
            sa.Enum(
                "warm", "scale_to_zero", name="poolkind", native_enum=False, create_constraint=True, length=24
            ),
            nullable=False,
        ),
        sa.Column("min_replicas", sa.Integer(), nullable=False),
        sa.Column("max_replicas", sa.Integer(), nullable=False),
        sa.Column("desired_replicas", sa.Integer(), nullable=False),
        sa.Column("ttft_slo_ms", sa.Integer(), nullable=False),
        sa.Column("placement", controlplane.db.types.JSONType, nullable=False),
        sa.Column(
            "spot_policy",
            sa.Enum(
                "on_demand",
                "spot",
                "spot_with_fallback",
                name="spotpolicy",
                native_enum=False,
                create_constraint=True,
                length=24,
            ),
            nullable=False,
        ),
        sa.Column("spot_base_on_demand", sa.Integer(), nullable=False),
        sa.Column("idle_timeout_s", sa.Integer(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("capacity_status", sa.String(length=64), nullable=True),
        sa.Column("autoscaler_state", controlplane.db.types.JSONType, nullable=False),
        sa.Column("last_request_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("activation_requested_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("last_reconciled_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("lock_token", sa.Uuid(), nullable=True),
        sa.Column("lock_expires_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.CheckConstraint(
            "min_replicas >= 0 AND max_replicas >= min_replicas AND max_replicas <= 1000",
            name=op.f("ck_pools_replica_bounds"),
        ),
        sa.CheckConstraint(
            "ttft_slo_ms > 0 AND idle_timeout_s >= 0 AND spot_base_on_demand >= 0",
            name=op.f("ck_pools_positive"),
        ),
        sa.ForeignKeyConstraint(
            ["dedicated_tenant_id"],
            ["tenants.id"],
            name=op.f("fk_pools_dedicated_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["variant_id"],
            ["model_variants.id"],
            name=op.f("fk_pools_variant_id_model_variants"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pools")),
        sa.UniqueConstraint("name", name=op.f("uq_pools_name")),
    )
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_pools_dedicated_tenant_id"), ["dedicated_tenant_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_pools_last_reconciled_at"), ["last_reconciled_at"], unique=False)

    op.create_table(
        "usage_minutes",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("variant_id", sa.Uuid(), nullable=False),
        sa.Column("minute", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("queue_ms_sum", sa.BigInteger(), nullable=False),
        sa.Column("ttft_ms_sum", sa.BigInteger(), nullable=False),
        sa.Column("duration_ms_sum", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_usage_minutes_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["variant_id"],
            ["model_variants.id"],
            name=op.f("fk_usage_minutes_variant_id_model_variants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "variant_id", "minute", name=op.f("pk_usage_minutes")),
    )
    with op.batch_alter_table("usage_minutes", schema=None) as batch_op:
        batch_op.create_index("ix_usage_minutes_tenant_id_minute", ["tenant_id", "minute"], unique=False)

    op.create_table(
        "zones",
        sa.Column("region_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("subnet", sa.String(length=500), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["region_id"], ["regions.id"], name=op.f("fk_zones_region_id_regions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_zones")),
        sa.UniqueConstraint("region_id", "name", name=op.f("uq_zones_region_id_name")),
    )
    op.create_table(
        "autoscaler_decisions",
        sa.Column("pool_id", sa.Uuid(), nullable=False),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("current_replicas", sa.Integer(), nullable=False),
        sa.Column("target_replicas", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("reasons", controlplane.db.types.JSONType, nullable=False),
        sa.Column("signals", controlplane.db.types.JSONType, nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["pool_id"], ["pools.id"], name=op.f("fk_autoscaler_decisions_pool_id_pools"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autoscaler_decisions")),
    )
    with op.batch_alter_table("autoscaler_decisions", schema=None) as batch_op:
        batch_op.create_index(
            "ix_autoscaler_decisions_pool_id_created_at", ["pool_id", "created_at"], unique=False
        )

    op.create_table(
        "nodes",
        sa.Column("pool_id", sa.Uuid(), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "pending",
                "provisioning",
                "booting",
                "ready",
                "draining",
                "terminating",
                "terminated",
                "failed",
                name="nodestate",
                native_enum=False,
                create_constraint=True,
                length=24,
            ),
            nullable=False,
        ),
        sa.Column("cloud", sa.String(length=16), nullable=True),
        sa.Column("region", sa.String(length=64), nullable=True),
        sa.Column("zone", sa.String(length=64), nullable=True),
        sa.Column("instance_type", sa.String(length=64), nullable=True),
        sa.Column("spot", sa.Boolean(), nullable=False),
        sa.Column("gpus_total", sa.Integer(), nullable=False),
        sa.Column("launch_token", sa.String(length=64), nullable=False),
        sa.Column("instance_id", sa.String(length=128), nullable=True),
        sa.Column("private_ip", sa.String(length=64), nullable=True),
        sa.Column("agent_url", sa.String(length=500), nullable=True),
        sa.Column("bootstrap_token_sha256", sa.String(length=64), nullable=True),
        sa.Column("bootstrap_expires_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("credential_sha256", sa.String(length=64), nullable=True),
        sa.Column("last_heartbeat_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("metrics", controlplane.db.types.JSONType, nullable=False),
        sa.Column("state_times", controlplane.db.types.JSONType, nullable=False),
        sa.Column("error", sa.String(length=2000), nullable=True),
        sa.Column("drain_deadline_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("lock_token", sa.Uuid(), nullable=True),
        sa.Column("lock_expires_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["pool_id"], ["pools.id"], name=op.f("fk_nodes_pool_id_pools"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("credential_sha256", name=op.f("uq_nodes_credential_sha256")),
        sa.UniqueConstraint("launch_token", name=op.f("uq_nodes_launch_token")),
    )
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_nodes_instance_id"), ["instance_id"], unique=False)
        batch_op.create_index("ix_nodes_pool_id_state", ["pool_id", "state"], unique=False)
        batch_op.create_index("ix_nodes_state_lock_expires_at", ["state", "lock_expires_at"], unique=False)

    op.create_table(
        "operations",
        sa.Column(
            "kind",
            sa.Enum(
                "launch",
                "terminate",
                "drain",
                name="operationkind",
                native_enum=False,
                create_constraint=True,
                length=24,
            ),
            nullable=False,
        ),
        sa.Column(
            "state",
            sa.Enum(
                "pending",
                "running",
                "succeeded",
                "failed",
                name="operationstate",
                native_enum=False,
                create_constraint=True,
                length=24,
            ),
            nullable=False,
        ),
        sa.Column("pool_id", sa.Uuid(), nullable=True),
        sa.Column("node_id", sa.Uuid(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=128), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.String(length=2000), nullable=True),
        sa.Column("history", controlplane.db.types.JSONType, nullable=False),
        sa.Column("next_attempt_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("deadline_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("finished_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("lock_token", sa.Uuid(), nullable=True),
        sa.Column("lock_expires_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_operations_node_id_nodes"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["pool_id"], ["pools.id"], name=op.f("fk_operations_pool_id_pools"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operations")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_operations_idempotency_key")),
    )
    with op.batch_alter_table("operations", schema=None) as batch_op:
        batch_op.create_index("ix_operations_pool_id_created_at", ["pool_id", "created_at"], unique=False)
        batch_op.create_index(
            "ix_operations_state_next_attempt_at", ["state", "next_attempt_at"], unique=False
        )

    op.create_table(
        "replicas",
        sa.Column("node_id", sa.Uuid(), nullable=False),
        sa.Column("pool_id", sa.Uuid(), nullable=False),
        sa.Column("variant_id", sa.Uuid(), nullable=False),
        sa.Column(
            "state",
            sa.Enum(
                "starting",
                "ready",
                "draining",
                "stopped",
                "failed",
                name="replicastate",
                native_enum=False,
                create_constraint=True,
                length=24,
            ),
            nullable=False,
        ),
        sa.Column("url", sa.String(length=500), nullable=True),
        sa.Column("gpu_ids", controlplane.db.types.JSONType, nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("max_running_requests", sa.Integer(), nullable=True),
        sa.Column("max_total_tokens", sa.Integer(), nullable=True),
        sa.Column("started_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("ready_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("model_ready_seconds", sa.Float(), nullable=True),
        sa.Column("ready_breakdown", controlplane.db.types.JSONType, nullable=False),
        sa.Column("last_heartbeat_at", controlplane.db.types.UTCDateTime(), nullable=True),
        sa.Column("metrics", controlplane.db.types.JSONType, nullable=False),
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.Column("updated_at", controlplane.db.types.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_replicas_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["pool_id"], ["pools.id"], name=op.f("fk_replicas_pool_id_pools"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["variant_id"],
            ["model_variants.id"],
            name=op.f("fk_replicas_variant_id_model_variants"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replicas")),
    )
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.create_index("ix_replicas_pool_id_state", ["pool_id", "state"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("replicas", schema=None) as batch_op:
        batch_op.drop_index("ix_replicas_pool_id_state")

    op.drop_table("replicas")
    with op.batch_alter_table("operations", schema=None) as batch_op:
        batch_op.drop_index("ix_operations_state_next_attempt_at")
        batch_op.drop_index("ix_operations_pool_id_created_at")

    op.drop_table("operations")
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_index("ix_nodes_state_lock_expires_at")
        batch_op.drop_index("ix_nodes_pool_id_state")
        batch_op.drop_index(batch_op.f("ix_nodes_instance_id"))

    op.drop_table("nodes")
    with op.batch_alter_table("autoscaler_decisions", schema=None) as batch_op:
        batch_op.drop_index("ix_autoscaler_decisions_pool_id_created_at")

    op.drop_table("autoscaler_decisions")
    op.drop_table("zones")
    with op.batch_alter_table("usage_minutes", schema=None) as batch_op:
        batch_op.drop_index("ix_usage_minutes_tenant_id_minute")

    op.drop_table("usage_minutes")
    with op.batch_alter_table("pools", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pools_last_reconciled_at"))
        batch_op.drop_index(batch_op.f("ix_pools_dedicated_tenant_id"))

    op.drop_table("pools")
    op.drop_table("instance_types")
    op.drop_table("regions")
    op.drop_table("quotas")
    op.drop_table("model_variants")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_api_keys_tenant_id_created_at")

    op.drop_table("api_keys")
    with op.batch_alter_table("usage_events_seen", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_usage_events_seen_seen_at"))

    op.drop_table("usage_events_seen")
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tenants_deleted_at"))

    op.drop_table("tenants")
    op.drop_table("models")
    op.drop_table("clouds")
    with op.batch_alter_table("capacity_blocks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_capacity_blocks_expires_at"))

    op.drop_table("capacity_blocks")
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_events_tenant_id"))
        batch_op.drop_index("ix_audit_events_target")
        batch_op.drop_index("ix_audit_events_at")

    op.drop_table("audit_events")
