"""ORM models. Importing this package registers every table on ``Base.metadata``."""

from controlplane.db.base import Base
from controlplane.models.audit import AuditEvent
from controlplane.models.batches import Batch, BatchFile, BatchResult
from controlplane.models.catalog import Cloud, InstanceType, Model, ModelVariant, Region, Zone
from controlplane.models.console import ConsoleSession
from controlplane.models.enums import (
    BlockScope,
    NodeState,
    OperationKind,
    OperationState,
    PoolKind,
    Priority,
    ReplicaDesiredState,
    ReplicaState,
    SpotPolicy,
    TenantStatus,
)
from controlplane.models.fleet import Node, Pool, Replica
from controlplane.models.operations import AutoscalerDecision, CapacityBlock, Operation
from controlplane.models.tenancy import ApiKey, Quota, Tenant
from controlplane.models.usage import UsageEventSeen, UsageMinute

__all__ = [
    "ApiKey",
    "AuditEvent",
    "AutoscalerDecision",
    "Base",
    "Batch",
    "BatchFile",
    "BatchResult",
    "BlockScope",
    "CapacityBlock",
    "Cloud",
    "ConsoleSession",
    "InstanceType",
    "Model",
    "ModelVariant",
    "Node",
    "NodeState",
    "Operation",
    "OperationKind",
    "OperationState",
    "Pool",
    "PoolKind",
    "Priority",
    "Quota",
    "Region",
    "Replica",
    "ReplicaDesiredState",
    "ReplicaState",
    "SpotPolicy",
    "Tenant",
    "TenantStatus",
    "UsageEventSeen",
    "UsageMinute",
    "Zone",
]
