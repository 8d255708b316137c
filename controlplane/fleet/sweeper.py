"""Sweeps: what the clouds say against what the database says.

* **Orphans**: VMs carrying this cluster's ownership tags with no live node behind them
  (the row is gone, terminated or failed, or a second VM for a node that already has
  one) are terminated. Write-before-launch makes this safe: a VM is only ever launched
  for a node row that was committed first.
* **Lost nodes**: a node that should be running but whose VM is gone or stopped is
  marked failed (``preempted`` for spot, so its replacement avoids that zone) and its
  termination is queued; reconcile then launches a replacement.
* **Stale nodes**: no heartbeat within the boot or heartbeat timeout → failed and
  replaced the same way.

Cloud listings happen outside any transaction; a region that cannot be listed is
skipped entirely (its nodes are not judged on missing data).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import blocklist, placement_catalog
from controlplane.fleet.clouds import Providers
from controlplane.fleet.nodes import transition
from controlplane.fleet.provisioning import PREEMPTED, begin_termination
from controlplane.models import Node, NodeState, Operation, OperationKind
from infra.provider import MANAGED_BY, MANAGED_BY_VALUE, TAG_CLUSTER, TAG_NODE_ID, Instance, InstanceState

log = logging.getLogger("nimbus.provisioning.sweep")

S = NodeState
# A VM just launched may not show up in a tag listing yet (EC2 is eventually consistent).
LISTING_GRACE = dt.timedelta(seconds=60)
RUNNING_STATES = (S.booting, S.ready, S.draining)
# A node in these states may legitimately have a VM that is not recorded on it yet.
LAUNCHING_STATES = (S.pending, S.provisioning)

Place = tuple[str, str]  # (cloud, region)


@dataclass
class SweepResult:
    listed: list[Place] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    lost: list[uuid.UUID] = field(default_factory=list)
    stale: list[uuid.UUID] = field(default_factory=list)
    operations: list[tuple[uuid.UUID, OperationKind]] = field(default_factory=list)  # to run now
    errors: list[str] = field(default_factory=list)


def sweep(settings: Settings, providers: Providers, clock: Callable[[], dt.datetime] = utcnow) -> SweepResult:
    result = SweepResult()
    with session_scope(settings) as session:
        blocklist.prune_expired(session, clock())
        places = placement_catalog.all_regions(placement_catalog.load(session))
    owned: dict[Place, list[Instance]] = {}
    tags = {MANAGED_BY: MANAGED_BY_VALUE, TAG_CLUSTER: settings.cluster_name}
    for cloud, region in places:
        try:
            owned[(cloud, region)] = providers(cloud).list_by_tag(region, tags)
        except Exception as exc:  # one unreachable region must not stop the others
            result.errors.append(f"{cloud}/{region}: {exc}")
            log.warning("sweep cannot list %s/%s: %s", cloud, region, exc)
    result.listed = list(owned)
    with session_scope(settings) as session:
        now = clock()
        orphans = find_orphans(session, owned)
        operations = judge_nodes(session, settings, owned, now, result)
        session.flush()
        result.operations = [(op.id, op.kind) for op in operations]
    for (cloud, region), instance in orphans:
        try:
            providers(cloud).terminate(region, instance.instance_id)
            result.orphans.append(instance.instance_id)
        except Exception as exc:
            result.errors.append(f"terminate {instance.instance_id}: {exc}")
    return result


def find_orphans(session: Session, owned: dict[Place, list[Instance]]) -> list[tuple[Place, Instance]]:
    """Owned VMs that no live node accounts for."""
    by_node: dict[uuid.UUID, Node] = {}
    ids = {_node_id(i) for instances in owned.values() for i in instances} - {None}
    if ids:
        by_node = {n.id: n for n in session.scalars(select(Node).where(Node.id.in_(ids)))}
    orphans = []
    for place, instances in owned.items():
        for instance in instances:
            node = by_node.get(_node_id(instance))  # type: ignore[arg-type]
            if _is_orphan(instance, node):
                orphans.append((place, instance))
    return orphans


def _is_orphan(instance: Instance, node: Node | None) -> bool:
    if node is None or node.state in (S.terminated, S.failed):
        return True
    if node.state in LAUNCHING_STATES or node.state == S.terminating:
        return False  # its launch or terminate operation owns the VM
    # A running node owns exactly the VM recorded on it; anything else is a duplicate.
    return node.instance_id is not None and node.instance_id != instance.instance_id


def judge_nodes(
    session: Session, settings: Settings, owned: dict[Place, list[Instance]], now: dt.datetime, result: SweepResult
) -> list[Operation]:
    """Fail (and queue termination of) nodes whose VM is gone or that stopped reporting."""
    operations: list[Operation] = []
    live = {(c, r, i.instance_id): i for (c, r), instances in owned.items() for i in instances}
    nodes = session.scalars(
        select(Node).where(Node.state.in_(RUNNING_STATES)).with_for_update(skip_locked=True)
    ).all()
    for node in nodes:
        if reason := _lost(node, live, owned, now):
            error = f"{PREEMPTED}: {reason}" if node.spot else f"instance lost: {reason}"
            result.lost.append(node.id)
        elif reason := _stale(node, settings, now):
            error = f"stale: {reason}"
            result.stale.append(node.id)
        else:
            continue
        transition(session, node, S.failed, reason=error, error=error)
        if op := begin_termination(session, node, now, settings, reason=error):
            operations.append(op)
    return operations


def _lost(node: Node, live: dict, owned: dict[Place, list[Instance]], now: dt.datetime) -> str | None:
    place = (node.cloud or "", node.region or "")
    if node.instance_id is None or place not in owned:
        return None  # not launched, or its region could not be listed: no verdict
    instance = live.get((*place, node.instance_id))
    if instance is not None:
        return f"instance {node.instance_id} is {instance.state.value}" if instance.state == InstanceState.TERMINATED else None
    booted = _entered(node, S.booting)
    if booted is not None and now - booted < LISTING_GRACE:
        return None
    return f"instance {node.instance_id} no longer exists"


def _stale(node: Node, settings: Settings, now: dt.datetime) -> str | None:
    if node.state == S.booting:
        since = node.last_heartbeat_at or _entered(node, S.booting)
        limit = settings.boot_timeout_s
    else:
        since = node.last_heartbeat_at or _entered(node, S.ready) or _entered(node, S.booting)
        limit = settings.heartbeat_timeout_s
    if since is None or (now - since).total_seconds() <= limit:
        return None
    return f"no heartbeat for {int((now - since).total_seconds())} s in state {node.state.value}"


def _entered(node: Node, state: NodeState) -> dt.datetime | None:
    stamp = (node.state_times or {}).get(state.value)
    return dt.datetime.fromisoformat(stamp) if stamp else None


def _node_id(instance: Instance) -> uuid.UUID | None:
    try:
        return uuid.UUID(instance.tags.get(TAG_NODE_ID, ""))
    except ValueError:
        return None
