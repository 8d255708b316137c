from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Literal

import msgspec

from controlplane.schemas.common import Name

PoolKindName = Literal["warm", "scale_to_zero"]
SpotPolicyName = Literal["on_demand", "spot", "spot_with_fallback"]
Replicas = Annotated[int, msgspec.Meta(ge=0, le=1000)]
CloudName = Literal["aws", "gcp", "local"]
ShortStr = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class Placement(msgspec.Struct, forbid_unknown_fields=True):
    cloud: CloudName
    region: ShortStr
    zones: list[ShortStr] | None = None


class ScheduleWindow(msgspec.Struct, forbid_unknown_fields=True):
    """Minimum replicas on some days between two times of day (see controlplane/autoscaler/schedule.py)."""

    days: Annotated[list[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]], msgspec.Meta(min_length=1)]
    start: Annotated[str, msgspec.Meta(pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$")]
    end: Annotated[str, msgspec.Meta(pattern=r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$")]
    min_replicas: Annotated[int, msgspec.Meta(ge=0, le=1000)]


class PoolCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    variant_id: uuid.UUID
    placement: Annotated[list[Placement], msgspec.Meta(min_length=1, max_length=50)]
    kind: PoolKindName = "warm"
    min_replicas: Replicas = 1
    max_replicas: Replicas = 1
    ttft_slo_ms: Annotated[int, msgspec.Meta(ge=1, le=600_000)] = 1000
    spot_policy: SpotPolicyName = "on_demand"
    spot_base_on_demand: Replicas = 0
    idle_timeout_s: Annotated[int, msgspec.Meta(ge=0, le=7 * 86400)] = 900
    dedicated_tenant_id: uuid.UUID | None = None
    schedule: Annotated[list[ScheduleWindow], msgspec.Meta(max_length=50)] = []
    schedule_timezone: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "UTC"


class PoolUpdate(msgspec.Struct, forbid_unknown_fields=True):
    placement: Annotated[list[Placement], msgspec.Meta(min_length=1, max_length=50)] | None = None
    kind: PoolKindName | None = None
    min_replicas: Replicas | None = None
    max_replicas: Replicas | None = None
    ttft_slo_ms: Annotated[int, msgspec.Meta(ge=1, le=600_000)] | None = None
    spot_policy: SpotPolicyName | None = None
    spot_base_on_demand: Replicas | None = None
    idle_timeout_s: Annotated[int, msgspec.Meta(ge=0, le=7 * 86400)] | None = None
    paused: bool | None = None
    schedule: Annotated[list[ScheduleWindow], msgspec.Meta(max_length=50)] | None = None
    schedule_timezone: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None


class PoolOut(msgspec.Struct):
    id: uuid.UUID
    name: str
    variant_id: uuid.UUID
    model: str
    tier: str
    kind: str
    min_replicas: int
    max_replicas: int
    desired_replicas: int
    ttft_slo_ms: int
    placement: list[Placement]
    spot_policy: str
    spot_base_on_demand: int
    idle_timeout_s: int
    dedicated_tenant_id: uuid.UUID | None
    paused: bool
    capacity_status: str | None
    replicas_by_state: dict[str, int]
    created_at: dt.datetime
    updated_at: dt.datetime
    schedule: list[ScheduleWindow] = []
    schedule_timezone: str = "UTC"
    scheduled_min_replicas: int | None = None  # the floor the schedule sets right now, if any


class NodeOut(msgspec.Struct):
    id: uuid.UUID
    state: str
    dedicated_tenant_id: uuid.UUID | None
    cloud: str | None
    region: str | None
    zone: str | None
    instance_type: str | None
    spot: bool
    gpus_total: int
    instance_id: str | None
    private_ip: str | None
    last_heartbeat_at: dt.datetime | None
    state_times: dict[str, Any]
    metrics: dict[str, Any]
    error: str | None
    created_at: dt.datetime
    launch_spec: dict[str, Any] = {}
    cached_models: list[str] = []  # model paths its local artifact cache holds (placement prefers it for them)


class ReplicaOut(msgspec.Struct):
    id: uuid.UUID
    node_id: uuid.UUID
    pool_id: uuid.UUID
    variant_id: uuid.UUID
    state: str
    url: str | None
    gpu_ids: list[int]
    restarts: int
    started_at: dt.datetime | None
    ready_at: dt.datetime | None
    model_ready_seconds: float | None
    ready_breakdown: dict[str, Any]
    last_heartbeat_at: dt.datetime | None
    metrics: dict[str, Any]
    desired_state: str = "running"
    port: int | None = None
    replaces_id: uuid.UUID | None = None  # a consolidation move's copy of that replica
    stop_reason: str | None = None  # why it was told to stop (scale down, moved, …)
    spare: bool = False  # serves above the pool's size on GPUs billed anyway (controlplane.fleet.spares)


class OperationOut(msgspec.Struct):
    id: uuid.UUID
    kind: str
    state: str
    pool_id: uuid.UUID | None
    node_id: uuid.UUID | None
    idempotency_key: str
    attempts: int
    error: str | None
    history: list[dict[str, Any]]
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None


class DecisionOut(msgspec.Struct):
    id: uuid.UUID
    pool_id: uuid.UUID
    created_at: dt.datetime
    current_replicas: int
    target_replicas: int
    action: str
    reasons: list[str]
    signals: dict[str, Any]


class AuditOut(msgspec.Struct):
    id: uuid.UUID
    at: dt.datetime
    actor: str
    action: str
    target_type: str
    target_id: str | None
    tenant_id: uuid.UUID | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None
