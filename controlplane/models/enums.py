"""String enums stored as VARCHAR with a CHECK constraint (portable across Postgres and SQLite)."""

from __future__ import annotations

import enum

from sqlalchemy import Enum


class TenantStatus(enum.StrEnum):
    active = "active"
    suspended = "suspended"


class Priority(enum.StrEnum):
    interactive = "interactive"
    batch = "batch"


class PoolKind(enum.StrEnum):
    warm = "warm"
    scale_to_zero = "scale_to_zero"


class SpotPolicy(enum.StrEnum):
    on_demand = "on_demand"
    spot = "spot"
    spot_with_fallback = "spot_with_fallback"


class NodeState(enum.StrEnum):
    pending = "pending"  # row written, no cloud call made yet
    provisioning = "provisioning"  # launch call in flight or instance starting
    booting = "booting"  # instance running, agent not registered yet
    ready = "ready"  # agent registered, replicas serving
    draining = "draining"  # no new requests; in-flight finishing
    terminating = "terminating"  # terminate requested, waiting until gone
    terminated = "terminated"
    failed = "failed"


class ReplicaState(enum.StrEnum):
    pending = "pending"  # placed by the control plane; its agent has not started it yet
    starting = "starting"
    ready = "ready"
    draining = "draining"
    stopped = "stopped"
    failed = "failed"


class ReplicaDesiredState(enum.StrEnum):
    """What the control plane wants of a replica; ``state`` is what its agent last reported."""

    running = "running"
    stopped = "stopped"  # drain it, then stop its engine; its GPUs stay held until it is stopped


class OperationKind(enum.StrEnum):
    launch = "launch"
    terminate = "terminate"
    drain = "drain"


class OperationState(enum.StrEnum):
    pending = "pending"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


class BlockScope(enum.StrEnum):
    zone = "zone"
    region = "region"
    cloud = "cloud"


def db_enum(enum_cls: type[enum.StrEnum]) -> Enum:
    return Enum(
        enum_cls,
        name=enum_cls.__name__.lower(),
        native_enum=False,
        create_constraint=True,
        length=24,
        values_callable=lambda e: [m.value for m in e],
        validate_strings=True,
    )
