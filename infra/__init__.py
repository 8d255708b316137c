"""Clouds behind one small protocol, plus the pure placement/failover policy.

The control plane uses only what is exported here (and :mod:`infra.catalog`,
:mod:`infra.bootstrap`); it must never import a cloud SDK. This package never imports
``controlplane``.

- :class:`Provider` / :class:`LaunchRequest` / :class:`Instance`: the cloud interface
  (``infra.aws``, ``infra.gcp``, ``infra.local`` implement it; :func:`get_provider`).
- :mod:`infra.errors`: typed failures with a blocking scope, and :func:`retry`.
- :mod:`infra.placement`: ordered candidates and blocklist entries (pure).
- :mod:`infra.failover`: the walk over candidates with its attempt history.
- :mod:`infra.bootstrap`: cloud-init user data for the node agent.
"""

from infra.errors import (
    CapacityError,
    ConfigError,
    ProviderError,
    QuotaError,
    RetryPolicy,
    TransientError,
    retry,
)
from infra.failover import Attempt, FailoverResult, launch_first_available
from infra.placement import (
    BlockEntry,
    Candidate,
    PlacementPreference,
    VariantNeeds,
    block_for,
    candidates,
)
from infra.provider import (
    Instance,
    InstanceState,
    LaunchRequest,
    Provider,
    ownership_tags,
)
from infra.registry import get_provider

__all__ = [
    "Attempt",
    "BlockEntry",
    "Candidate",
    "CapacityError",
    "ConfigError",
    "FailoverResult",
    "Instance",
    "InstanceState",
    "LaunchRequest",
    "PlacementPreference",
    "Provider",
    "ProviderError",
    "QuotaError",
    "RetryPolicy",
    "TransientError",
    "VariantNeeds",
    "block_for",
    "candidates",
    "get_provider",
    "launch_first_available",
    "ownership_tags",
    "retry",
]
