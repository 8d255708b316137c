"""Desired state (pools) and observed state (nodes, replicas) of the GPU fleet."""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import Boolean, CheckConstraint, Float, ForeignKey, Index, Integer, String, Uuid, false, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controlplane.db.base import Base, Timestamps, UUIDPrimaryKey
from controlplane.db.types import JSONType, UTCDateTime
from controlplane.models.catalog import ModelVariant
from controlplane.models.enums import (
    NodeState,
    PoolKind,
    ReplicaDesiredState,
    ReplicaState,
    SpotPolicy,
    db_enum,
)


class Leased:
    """Lease columns: a worker claims a row with SKIP LOCKED, writes its token, and applies
    results only while the token still matches (a stale worker's result is dropped)."""

    lock_token: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    lock_expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class Pool(UUIDPrimaryKey, Timestamps, Leased, Base):
    __tablename__ = "pools"

    name: Mapped[str] = mapped_column(String(63), unique=True)
    variant_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("model_variants.id", ondelete="RESTRICT"))
    dedicated_tenant_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[PoolKind] = mapped_column(db_enum(PoolKind), default=PoolKind.warm)
    min_replicas: Mapped[int] = mapped_column(Integer, default=1)
    max_replicas: Mapped[int] = mapped_column(Integer, default=1)
    desired_replicas: Mapped[int] = mapped_column(Integer, default=0)
    ttft_slo_ms: Mapped[int] = mapped_column(Integer, default=1000)
    # Ordered preferences: [{"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"]?}, …]
    placement: Mapped[list[dict]] = mapped_column(JSONType, default=list)
    spot_policy: Mapped[SpotPolicy] = mapped_column(db_enum(SpotPolicy), default=SpotPolicy.on_demand)
    spot_base_on_demand: Mapped[int] = mapped_column(Integer, default=0)
    idle_timeout_s: Mapped[int] = mapped_column(Integer, default=900)
    # Scheduled capacity: [{"days": ["mon", …], "start": "09:00", "end": "18:00", "min_replicas": 4}, …]
    # in ``schedule_timezone`` (controlplane/autoscaler/schedule.py); floors above min_replicas.
    schedule: Mapped[list[dict]] = mapped_column(JSONType, default=list)
    schedule_timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    # Why the pool is not at its desired size, e.g. "capacity_unavailable"; NULL when healthy.
    capacity_status: Mapped[str | None] = mapped_column(String(64))
    autoscaler_state: Mapped[dict] = mapped_column(JSONType, default=dict)
    last_request_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    activation_requested_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_reconciled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, index=True)

    variant: Mapped[ModelVariant] = relationship(lazy="joined")

    __table_args__ = (
        CheckConstraint(
            "min_replicas >= 0 AND max_replicas >= min_replicas AND max_replicas <= 1000", name="replica_bounds"
        ),
        CheckConstraint("ttft_slo_ms > 0 AND idle_timeout_s >= 0 AND spot_base_on_demand >= 0", name="positive"),
    )


class Node(UUIDPrimaryKey, Timestamps, Leased, Base):
    """A VM with ``gpus_total`` GPU slots. Its state changes only through fleet.nodes.transition().

    A node belongs to a node group (cloud, region, zone, instance type, market, and a tenant for
    dedicated capacity), not to a pool: it hosts replicas of every pool placement allows there.
    """

    __tablename__ = "nodes"

    # Dedicated capacity: only that tenant's dedicated pools are placed here. No foreign key on
    # purpose: deleting the tenant must not delete the row of a VM that still runs (it empties,
    # and the fleet loop terminates it).
    dedicated_tenant_id: Mapped[uuid.UUID | None] = mapped_column(Uuid, index=True)
    # What placement decided to launch: {"cloud", "region", "instance_type", "gpu_type", "gpu_count",
    # "spot", "zones": [best first], "price_per_hour"}. The launcher walks exactly this.
    launch_spec: Mapped[dict] = mapped_column(JSONType, default=dict)
    # Since when the node has held no replica (released after a TTL) / used under the consolidation
    # threshold (a consolidation candidate after its settle period). NULL otherwise.
    empty_since: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    underused_since: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    state: Mapped[NodeState] = mapped_column(db_enum(NodeState), default=NodeState.pending)
    cloud: Mapped[str | None] = mapped_column(String(16))
    region: Mapped[str | None] = mapped_column(String(64))
    zone: Mapped[str | None] = mapped_column(String(64))
    instance_type: Mapped[str | None] = mapped_column(String(64))
    spot: Mapped[bool] = mapped_column(Boolean, default=False)
    gpus_total: Mapped[int] = mapped_column(Integer, default=0)
    # Idempotency token for the cloud launch call (EC2 ClientToken / GCE requestId).
    launch_token: Mapped[str] = mapped_column(String(64), unique=True)
    instance_id: Mapped[str | None] = mapped_column(String(128), index=True)
    private_ip: Mapped[str | None] = mapped_column(String(64))
    agent_url: Mapped[str | None] = mapped_column(String(500))
    bootstrap_token_sha256: Mapped[str | None] = mapped_column(String(64))
    bootstrap_expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # Set by the first register, cleared once the credential is used: with the bootstrap token (which
    # only the node and no table holds) it derives the same node credential again for a retried
    # register (services/agents.py). Not a secret alone.
    bootstrap_salt: Mapped[str | None] = mapped_column(String(64))
    credential_sha256: Mapped[str | None] = mapped_column(String(64), unique=True)
    last_heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    metrics: Mapped[dict] = mapped_column(JSONType, default=dict)
    # Model paths the node's local artifact cache holds (sorted), as its agent last reported them:
    # placement prefers such a node for a replica of that model (it skips the download).
    cached_models: Mapped[list] = mapped_column(JSONType, default=list, server_default=text("'[]'"))
    # {"pending": iso, "provisioning": iso, …}: when the node entered each state.
    state_times: Mapped[dict] = mapped_column(JSONType, default=dict)
    error: Mapped[str | None] = mapped_column(String(2000))
    drain_deadline_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    replicas: Mapped[list[Replica]] = relationship(back_populates="node", cascade="all, delete-orphan")

    __table_args__ = (
        Index("ix_nodes_state_lock_expires_at", "state", "lock_expires_at"),
    )


class Replica(UUIDPrimaryKey, Timestamps, Base):
    """One engine process serving one pool's variant on ``gpu_ids`` of one node.

    Rows are written by placement (``desired_state`` running, ``state`` pending) before the agent
    hears of them; the agent starts the engine and reports ``state``. A replica's GPUs are held
    until it is reported stopped or failed, whatever its desired state.
    """

    __tablename__ = "replicas"

    node_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("nodes.id", ondelete="CASCADE"))
    pool_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("pools.id", ondelete="CASCADE"))
    variant_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("model_variants.id", ondelete="RESTRICT"))
    state: Mapped[ReplicaState] = mapped_column(db_enum(ReplicaState), default=ReplicaState.pending)
    desired_state: Mapped[ReplicaDesiredState] = mapped_column(
        db_enum(ReplicaDesiredState), default=ReplicaDesiredState.running
    )
    url: Mapped[str | None] = mapped_column(String(500))
    gpu_ids: Mapped[list[int]] = mapped_column(JSONType, default=list)
    port: Mapped[int | None] = mapped_column(Integer)
    # Consolidation: this replica is the make-before-break copy of that one, which drains only once
    # this one is ready. No foreign key: the original's row may go first.
    replaces_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    # A spare: placed by the fleet on GPUs its node pays for anyway, above the pool's
    # ``desired_replicas``. It serves like any replica, is promoted when the pool grows and stops
    # first when placement or consolidation wants its GPUs (``controlplane.fleet.spares``).
    spare: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # When a replica told to stop is given up on if its agent never reports it stopped.
    drain_deadline_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    stop_reason: Mapped[str | None] = mapped_column(String(200))  # why it was told to stop
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    max_running_requests: Mapped[int | None] = mapped_column(Integer)
    max_total_tokens: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    ready_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # Model-ready time and its parts (download, load, warm-up), seconds.
    model_ready_seconds: Mapped[float | None] = mapped_column(Float)
    ready_breakdown: Mapped[dict] = mapped_column(JSONType, default=dict)
    last_heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    metrics: Mapped[dict] = mapped_column(JSONType, default=dict)

    node: Mapped[Node] = relationship(back_populates="replicas")

    __table_args__ = (
        Index("ix_replicas_pool_id_state", "pool_id", "state"),
        # Every agent heartbeat reads its node's replicas, and deleting a node cascades to them.
        Index("ix_replicas_node_id", "node_id"),
    )
