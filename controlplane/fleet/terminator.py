"""Carry out one terminate operation: retried until the node's VMs are gone or a deadline passes.

"Gone" is checked, not assumed: after asking the cloud to delete, the node's VMs are
looked up again by id and by tag; an instance still shutting down means "try again
shortly". A node whose launch is still in flight under a live lease is left alone
until that launch has recorded its VM, so nothing it creates can slip past.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select

from controlplane.config import Settings
from controlplane.db.types import utcnow
from controlplane.fleet import executor
from controlplane.fleet.clouds import Providers
from controlplane.fleet.executor import ClaimedOperation
from controlplane.fleet.leases import held, stamp
from controlplane.fleet.nodes import transition
from controlplane.fleet.provisioning import (
    append_history,
    claim_operation,
    finish_operation,
    launch_key,
    retry_operation,
)
from controlplane.models import Node, NodeState, Operation, OperationKind, OperationState
from infra.errors import ProviderError
from infra.provider import MANAGED_BY, MANAGED_BY_VALUE, TAG_CLUSTER, TAG_NODE_ID, InstanceState

log = logging.getLogger("nimbus.provisioning.terminate")

S = NodeState
LAUNCH_WAIT = dt.timedelta(seconds=2)


@dataclass(frozen=True)
class TerminateJob(ClaimedOperation):
    known: tuple[str, str, str] | None  # (cloud, region, instance_id) recorded on the node
    places: tuple[tuple[str, str], ...]  # (cloud, region) where the node's VMs could be


def execute(
    settings: Settings, providers: Providers, op_id: uuid.UUID, clock: Callable[[], dt.datetime] = utcnow
) -> str:
    return executor.run(
        settings, clock,
        claim=lambda session, now: _claim(session, settings, op_id, now),
        act=lambda job: _act(settings, providers, job, clock),
        apply=lambda session, job, outcome, now: _apply(session, settings, job, *outcome, now),
    )


def _act(settings: Settings, providers: Providers, job: TerminateJob, clock: Callable[[], dt.datetime]
         ) -> tuple[bool, dict, str | None]:
    """(gone, history entry, error): the cloud step, every failure turned into a retry."""
    started = clock()
    try:
        gone, seen = _terminate(settings, providers, job)
        error = None
    except ProviderError as exc:
        gone, seen, error = False, [], f"{exc.code or type(exc).__name__}: {exc.message}"
    except Exception as exc:  # keep the worker alive; the operation retries
        log.exception("terminate %s failed", job.op_id)
        gone, seen, error = False, [], f"{type(exc).__name__}: {exc}"
    entry = {"attempt": job.attempt, "started_at": started.isoformat(), "ok": gone,
             "instances": seen, "message": error}
    return gone, entry, error


def _claim(session, settings: Settings, op_id: uuid.UUID, now: dt.datetime) -> TerminateJob | str:
    op = claim_operation(session, op_id, OperationKind.terminate, now)
    if op is None:
        return "skipped"
    node = session.scalar(select(Node).where(Node.id == op.node_id).with_for_update()) if op.node_id else None
    if node is None or node.state == S.terminated:
        finish_operation(op, OperationState.succeeded, now)
        return "already gone"
    if op.deadline_at is not None and op.deadline_at <= now:
        finish_operation(op, OperationState.failed, now, "terminate deadline passed; the sweeper keeps deleting the VM")
        transition(session, node, S.failed, reason="terminate deadline passed", error=op.error)
        return "expired"
    launching = session.scalar(
        select(Operation.id).where(
            Operation.idempotency_key == launch_key(node.id),
            Operation.state == OperationState.running,
            Operation.lock_expires_at > now,
        )
    )
    if launching is not None:
        op.next_attempt_at = now + LAUNCH_WAIT
        return "waiting for launch"
    lease = stamp([op], now, settings.lease_seconds)
    op.state = OperationState.running
    op.attempts += 1
    # Where the node's VM can be: where it was recorded, else where its launch was to go.
    spec = node.launch_spec or {}
    places = [(spec["cloud"], spec["region"])] if spec.get("cloud") and spec.get("region") else []
    if node.cloud and node.region and (node.cloud, node.region) not in places:
        places.append((node.cloud, node.region))
    known = (node.cloud, node.region, node.instance_id) if node.instance_id and node.cloud and node.region else None
    return TerminateJob(op.id, lease, op.attempts, node.id, known, tuple(places))


def _terminate(settings: Settings, providers: Providers, job: TerminateJob) -> tuple[bool, list[str]]:
    """Delete every VM of the node; True once none is left. Idempotent."""
    tags = {MANAGED_BY: MANAGED_BY_VALUE, TAG_CLUSTER: settings.cluster_name, TAG_NODE_ID: str(job.node_id)}
    targets: dict[str, tuple[str, str]] = {}
    if job.known:
        cloud, region, instance_id = job.known
        targets[instance_id] = (cloud, region)
    for cloud, region in job.places:
        for inst in providers(cloud).list_by_tag(region, tags):
            targets[inst.instance_id] = (cloud, region)
    for instance_id, (cloud, region) in targets.items():
        providers(cloud).terminate(region, instance_id)
    remaining = [
        instance_id
        for instance_id, (cloud, region) in targets.items()
        if (inst := providers(cloud).describe(region, instance_id)) is not None
        and inst.state != InstanceState.TERMINATED
    ]
    return not remaining, sorted(targets)


def _apply(session, settings: Settings, job: TerminateJob, gone: bool, entry: dict, error: str | None,
           now: dt.datetime) -> str:
    op = held(session, Operation, job.op_id, job.lease)
    if op is None:
        return "lease lost"
    append_history(op, [entry])
    if not gone:
        retry_operation(op, now + dt.timedelta(seconds=settings.retry_delay_s), error or "instances still shutting down")
        return "retry"
    node = session.scalar(select(Node).where(Node.id == job.node_id).with_for_update())
    if node is not None and node.state in (S.terminating, S.failed):
        transition(session, node, S.terminated, reason="instances gone")  # its replicas stop with it
    finish_operation(op, OperationState.succeeded, now)
    return "terminated"

