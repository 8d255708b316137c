"""The one interface every cloud adapter implements, and the values it trades in.

The control plane only ever sees these types: it never imports boto3 or
google-cloud-compute. Instances are described by *ownership tags* so that a sweeper
can always find what Nimbus launched, even if the database row that asked for it is
gone (a crashed worker, a restored backup).

Tag/label convention (``OWNERSHIP_TAGS``):

``managed-by=nimbus``     everything Nimbus launched
``nimbus-cluster``        the Nimbus deployment (several may share an account)
``nimbus-node-id``        the control plane's node row
``nimbus-pool-id``        the pool the node serves

GCP labels only allow lower-case letters, digits, ``-`` and ``_`` (max 63 chars);
the GCP adapter converts keys and values with :func:`infra.gcp.to_label` (lower-cases
and replaces anything else with ``-``). Use lower-case ids and the values round-trip
unchanged on both clouds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

MANAGED_BY = "managed-by"
MANAGED_BY_VALUE = "nimbus"
TAG_CLUSTER = "nimbus-cluster"
TAG_NODE_ID = "nimbus-node-id"
TAG_POOL_ID = "nimbus-pool-id"
OWNERSHIP_TAGS = (MANAGED_BY, TAG_CLUSTER, TAG_NODE_ID, TAG_POOL_ID)


def ownership_tags(cluster: str, node_id: str, pool_id: str | None = None) -> dict[str, str]:
    """The tags every Nimbus node carries; merge extra tags on top of these."""
    tags = {MANAGED_BY: MANAGED_BY_VALUE, TAG_CLUSTER: cluster, TAG_NODE_ID: node_id}
    if pool_id is not None:
        tags[TAG_POOL_ID] = pool_id
    return tags


class InstanceState(enum.StrEnum):
    """Cloud lifecycle reduced to what the control plane acts on.

    ``terminated`` covers every state in which the VM no longer runs and will not come
    back by itself (stopped, terminated, preempted). A VM that is gone entirely is
    reported as ``None`` by :meth:`Provider.describe`.
    """

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    TERMINATED = "terminated"


@dataclass(frozen=True)
class LaunchRequest:
    """Everything needed to create one node.

    ``idempotency_token`` must be stable across retries of the same *attempt* (same
    operation, same candidate) and different for the next failover candidate: EC2
    ``ClientToken`` and GCE ``requestId`` are derived from it, so a retried Celery task
    never creates a second VM, while EC2 rejects a reused token with other parameters
    and GCE answers it with the first attempt's (failed) operation. Use
    :func:`infra.failover.attempt_token`. ``tags`` should include :func:`ownership_tags`; adapters add ``managed-by``,
    ``nimbus-cluster`` and ``nimbus-node-id`` from the request themselves anyway.
    """

    node_id: str
    cluster: str
    region: str
    zone: str
    instance_type: str
    spot: bool
    template_id: str
    user_data: str
    tags: Mapping[str, str]
    idempotency_token: str
    subnet: str | None = None

    def all_tags(self) -> dict[str, str]:
        """Request tags with the ownership tags enforced (they win over caller tags)."""
        return {**self.tags, **ownership_tags(self.cluster, self.node_id, self.tags.get(TAG_POOL_ID))}


@dataclass(frozen=True)
class Instance:
    """A VM as the cloud reports it. ``instance_id`` is opaque: store it, pass it back."""

    cloud: str
    region: str
    zone: str
    instance_id: str
    instance_type: str
    state: InstanceState
    spot: bool
    private_ip: str | None = None
    public_ip: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    launched_at: datetime | None = None


@runtime_checkable
class Provider(Protocol):
    """A cloud that can launch, describe, terminate and find Nimbus VMs.

    All methods are synchronous and safe to call from Celery workers; they raise
    :class:`infra.errors.ProviderError` subclasses and nothing else for cloud failures.
    """

    cloud: str

    def launch(self, req: LaunchRequest) -> Instance:
        """Create the VM, or return the one already created for ``req.idempotency_token``."""
        ...

    def describe(self, region: str, instance_id: str) -> Instance | None:
        """Current state, or ``None`` when the cloud no longer knows the instance."""
        ...

    def terminate(self, region: str, instance_id: str) -> None:
        """Ask the cloud to delete the VM. Terminating a gone instance is not an error."""
        ...

    def list_by_tag(self, region: str, tags: Mapping[str, str]) -> list[Instance]:
        """Instances in ``region`` carrying all of ``tags`` that the cloud has not yet deleted.

        Stopped VMs are included (with state ``terminated``) because they still cost
        money and the sweeper must delete them.
        """
        ...
