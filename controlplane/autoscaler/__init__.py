"""Pool autoscaler: pure policy from observed signals to a scaling decision.

No database, no Celery: the executor builds the inputs, calls :func:`decide`, persists the
returned state and decision, and turns the decision into provisioning operations.
"""

from controlplane.autoscaler.config import AutoscalerConfig
from controlplane.autoscaler.decision import AddReplica, Decision, Move
from controlplane.autoscaler.policy import decide
from controlplane.autoscaler.signals import (
    AutoscalerState,
    NodeSignal,
    PoolObservation,
    PoolSpec,
    ReplicaSignal,
)

__all__ = [
    "AddReplica",
    "AutoscalerConfig",
    "AutoscalerState",
    "Decision",
    "Move",
    "NodeSignal",
    "PoolObservation",
    "PoolSpec",
    "ReplicaSignal",
    "decide",
]
