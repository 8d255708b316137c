"""Pool autoscaler: pure policy from observed signals to how many replicas a pool needs.

No database, no Celery: the executor builds the inputs, calls :func:`decide`, persists the
returned state and decision, and sets the pool's desired replicas; the fleet loop places them.
"""

from controlplane.autoscaler.config import AutoscalerConfig
from controlplane.autoscaler.decision import Decision
from controlplane.autoscaler.policy import decide
from controlplane.autoscaler.signals import (
    AutoscalerState,
    EdgeSignals,
    PoolObservation,
    PoolSpec,
    ReplicaSignal,
)

__all__ = [
    "AutoscalerConfig",
    "AutoscalerState",
    "Decision",
    "EdgeSignals",
    "PoolObservation",
    "PoolSpec",
    "ReplicaSignal",
    "decide",
]
