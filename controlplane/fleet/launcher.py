"""Carry out one launch operation: claim it, walk the candidates on the clouds, apply under lease.

Three short transactions around the cloud calls, none open while a cloud answers:

1. claim: lease the operation (``SKIP LOCKED``), move the node to ``provisioning``, and
   snapshot everything the walk needs (catalog, active blocks, recently preempted zones);
2. just before launching a new VM: store the sha256 of a fresh bootstrap token, only if
   the lease is still ours;
3. apply: write new blocks (facts about the clouds, kept whoever holds the lease), then,
   only if the operation still carries our token, the failover history and the result.

A retry first looks for a VM already launched for the node (tags) and adopts it, so a
worker that died after the cloud accepted the launch never causes a second VM; the
idempotency token per (operation, candidate) covers a retry of the very same call.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import blocklist, executor, node_bootstrap, placement_catalog
from controlplane.fleet.clouds import Providers
from controlplane.fleet.executor import ClaimedOperation
from controlplane.fleet.leases import held, stamp
from controlplane.fleet.nodes import transition
from controlplane.fleet.provisioning import (
    CAPACITY_UNAVAILABLE,
    PREEMPTED,
    append_history,
    begin_termination,
    claim_operation,
    finish_operation,
    retry_operation,
)
from controlplane.models import (
    Node,
    NodeState,
    Operation,
    OperationKind,
    OperationState,
    Pool,
)
from controlplane.services.secrets import new_token
from infra.catalog import Catalog
from infra.errors import ProviderError
from infra.failover import Attempt, attempt_token, find_launched, launch_first_available
from infra.placement import BlockEntry, Candidate, VariantNeeds, candidates
from infra.provider import Instance, LaunchRequest, ownership_tags

log = logging.getLogger("nimbus.provisioning.launch")

S = NodeState
# A node whose VM is not recorded yet. Its agent may already have registered (booting, even
# ready) when a worker died after the cloud call: the retry then only records the VM.
WANTS_LAUNCH = (S.pending, S.provisioning, S.booting, S.ready)
MIN_RETRY = dt.timedelta(seconds=1)


@dataclass(frozen=True)
class LaunchJob(ClaimedOperation):
    """A claimed launch, detached from the session that claimed it."""

    pool_id: uuid.UUID | None  # the pool whose placement asked for this node (capacity status)
    placement: list[dict[str, Any]]  # the planned cloud/region and zones to walk, from the launch spec
    market_policy: str  # "spot" or "on_demand": the fleet tick chose the market
    instance_type: str | None  # the planned shape; None only for a pre-0004 launch spec
    needs: VariantNeeds
    catalog: Catalog
    blocks: list[BlockEntry]
    avoid_zones: tuple[str, ...]
    failures: Mapping[tuple, int]  # recorded failed attempts per candidate (see idempotency_token)
    agent_seen: bool = False  # the node's agent registered: its VM exists, never launch another


@dataclass
class Outcome:
    instance: Instance | None = None
    candidate: Candidate | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    new_blocks: list[BlockEntry] = field(default_factory=list)
    error: str | None = None
    capacity_exhausted: bool = False  # nothing launchable: blocked or refused everywhere


def cooldowns(settings: Settings) -> dict[str, dt.timedelta]:
    return {
        "zone": dt.timedelta(seconds=settings.block_zone_s),
        "region": dt.timedelta(seconds=settings.block_region_s),
        "cloud": dt.timedelta(seconds=settings.block_cloud_s),
    }


def execute(
    settings: Settings, providers: Providers, op_id: uuid.UUID, clock: Callable[[], dt.datetime] = utcnow
) -> str:
    """Run one launch operation if it is due and unclaimed. Returns what happened, for logs."""
    return executor.run(
        settings, clock,
        claim=lambda session, now: _claim(session, settings, op_id, now),
        act=lambda job: _walk(settings, providers, job, clock),
        apply=lambda session, job, outcome, now: _apply(session, settings, job, outcome, now),
    )


# ---------------------------------------------------------------- 1. claim
def _claim(session: Session, settings: Settings, op_id: uuid.UUID, now: dt.datetime) -> LaunchJob | str:
    op = claim_operation(session, op_id, OperationKind.launch, now)
    if op is None:
        return "skipped"
    # Lock order everywhere: operation, then pool, then node.
    pool = session.scalar(select(Pool).where(Pool.id == op.pool_id).with_for_update(of=Pool)) if op.pool_id else None
    node = session.scalar(select(Node).where(Node.id == op.node_id).with_for_update()) if op.node_id else None
    if node is None or node.state not in WANTS_LAUNCH:
        finish_operation(op, OperationState.failed, now, "cancelled: the node is gone or no longer wanted")
        return "cancelled"
    if node.instance_id is not None:
        finish_operation(op, OperationState.succeeded, now)
        return "already launched"
    if op.deadline_at is not None and op.deadline_at <= now:
        finish_operation(op, OperationState.failed, now, "launch deadline passed")
        transition(session, node, S.failed, reason="launch deadline passed", error=op.error)
        # An earlier attempt may have left a VM: terminating finds it by its tags.
        begin_termination(session, node, now, settings, reason="launch deadline passed")
        return "expired"
    lease = stamp([op], now, settings.lease_seconds)
    op.state = OperationState.running
    op.attempts += 1
    if node.state == S.pending:
        transition(session, node, S.provisioning, reason="launch claimed")
    spec = dict(node.launch_spec or {})
    return LaunchJob(
        op_id=op.id,
        lease=lease,
        attempt=op.attempts,
        node_id=node.id,
        pool_id=pool.id if pool is not None else None,
        placement=[{"cloud": spec.get("cloud"), "region": spec.get("region"), "zones": list(spec.get("zones") or [])}]
        if spec.get("cloud") else [],
        market_policy="spot" if spec.get("spot", node.spot) else "on_demand",
        instance_type=spec.get("instance_type"),
        needs=VariantNeeds(gpu_count=max(1, int(spec.get("gpu_count") or 1)), gpu_memory_gb=0.0,
                           gpu_types=(spec["gpu_type"],) if spec.get("gpu_type") else ()),
        catalog=placement_catalog.load(session),
        blocks=blocklist.active_blocks(session, now),
        avoid_zones=recently_preempted_zones(session, spec, now, settings),
        agent_seen=node.state in (S.booting, S.ready),
        failures=Counter(_candidate_key(h) for h in op.history or [] if h.get("ok") is False and "zone" in h),
    )


def _candidate_key(entry: Mapping[str, Any]) -> tuple:
    return (entry["cloud"], entry["region"], entry["zone"], entry["instance_type"], entry["spot"])


def idempotency_token(job: LaunchJob, c: Candidate) -> str:
    """Stable while an attempt on ``c`` has no recorded outcome, fresh after a recorded failure.

    A worker that dies mid-call retries with the same token, so the cloud answers with the
    VM it already made; but once a failure is on record, reusing the token would only make
    GCE replay that failed operation, so the next try on the same candidate gets a new one.
    """
    n = job.failures.get((c.cloud, c.region, c.zone, c.instance_type, c.spot), 0)
    return attempt_token(f"{job.op_id}-{n}", c)


def recently_preempted_zones(
    session: Session, spec: Mapping[str, Any], now: dt.datetime, settings: Settings
) -> tuple[str, ...]:
    """Zones where spot nodes of this shape were preempted lately: a replacement tries elsewhere first."""
    if not spec.get("spot") or not spec.get("cloud"):
        return ()
    since = now - dt.timedelta(seconds=settings.preemption_memory_s)
    zones = session.scalars(
        select(Node.zone)
        .where(
            Node.cloud == spec["cloud"],
            Node.region == spec.get("region"),
            Node.instance_type == spec.get("instance_type"),
            Node.spot.is_(True),
            Node.error.like(f"{PREEMPTED}%"),
            Node.updated_at >= since,
            Node.zone.is_not(None),
        )
        .distinct()
    )
    return tuple(sorted(zones))


# ---------------------------------------------------------------- 2. the cloud walk (no transaction)
def _walk(
    settings: Settings, providers: Providers, job: LaunchJob, clock: Callable[[], dt.datetime]
) -> Outcome | None:
    now = clock()
    cluster = settings.cluster_name
    try:
        places = [(providers(c), r) for c, r in placement_catalog.regions_of(job.catalog, job.placement)]
        adopted = find_launched(places, cluster, str(job.node_id))
        if adopted is not None:
            entry = {"attempt": job.attempt, "started_at": now.isoformat(), "ok": True, "adopted": True,
                     "cloud": adopted.cloud, "region": adopted.region, "zone": adopted.zone,
                     "instance_type": adopted.instance_type, "spot": adopted.spot, "instance_id": adopted.instance_id}
            return Outcome(instance=adopted, history=[entry])
        if job.agent_seen:
            return _failed(job, now, "the node's agent registered but its VM is not listed yet")
        ordered = [c for c in candidates(
            job.catalog,
            placement_catalog.preferences(job.placement),
            job.needs,
            job.market_policy,  # type: ignore[arg-type]
            job.blocks,
            now,
            avoid_zones=job.avoid_zones,
        ) if job.instance_type is None or c.instance_type == job.instance_type]
        if not ordered:
            return _nothing_to_try(job, now)
        token, token_sha = new_token()
        expires = now + dt.timedelta(seconds=settings.bootstrap_token_ttl_s)
        if not _store_bootstrap_hash(settings, job, token_sha, expires):
            return None

        def launch(c: Candidate) -> Instance:
            request = LaunchRequest(
                node_id=str(job.node_id),
                cluster=cluster,
                region=c.region,
                zone=c.zone,
                instance_type=c.instance_type,
                spot=c.spot,
                template_id=c.template_id,
                user_data=node_bootstrap.user_data(
                    settings, node_id=job.node_id, candidate=c, catalog=job.catalog, bootstrap_token=token,
                    token_expires_at=expires, now=clock(),
                ),
                tags=ownership_tags(cluster, str(job.node_id)),
                idempotency_token=idempotency_token(job, c),
                subnet=c.subnet,
            )
            return providers(c.cloud).launch(request)

        result = launch_first_available(ordered, launch, clock, cooldown=cooldowns(settings))
    except ProviderError as exc:
        return _failed(job, now, f"{exc.code or type(exc).__name__}: {exc.message}")
    except Exception as exc:  # a bug or bad configuration: record it, retry later, keep the worker alive
        log.exception("launch %s failed", job.op_id)
        return _failed(job, now, f"{type(exc).__name__}: {exc}")
    history = [{"attempt": job.attempt, **a.as_dict()} for a in result.attempts]
    exhausted = result.instance is None and all(a.error_scope not in (None, "none") for a in result.attempts)
    return Outcome(
        instance=result.instance,
        candidate=result.candidate,
        history=history,
        new_blocks=result.new_blocks,
        error=None if result.instance else _summary(result.attempts),
        capacity_exhausted=exhausted,
    )


def _nothing_to_try(job: LaunchJob, now: dt.datetime) -> Outcome:
    active = [b for b in job.blocks if b.active(now)]
    message = f"no launchable candidate: {len(active)} active block(s)"
    if active:
        message += f", first lifts at {min(b.expires_at for b in active).isoformat()}"
    entry = {"attempt": job.attempt, "started_at": now.isoformat(), "ok": False,
             "error_code": "NoCandidates", "error_scope": None, "message": message}
    return Outcome(history=[entry], error=message, capacity_exhausted=True)


def _failed(job: LaunchJob, now: dt.datetime, message: str) -> Outcome:
    entry = {"attempt": job.attempt, "started_at": now.isoformat(), "ok": False,
             "error_code": "Error", "error_scope": None, "message": message[:500]}
    return Outcome(history=[entry], error=message)


def _summary(attempts: list[Attempt]) -> str:
    tried = ", ".join(f"{a.candidate.zone}/{a.candidate.instance_type}: {a.error_code}" for a in attempts)
    return f"every candidate failed ({tried})"[:2000]


def _store_bootstrap_hash(settings: Settings, job: LaunchJob, sha: str, expires: dt.datetime) -> bool:
    with session_scope(settings) as session:
        if held(session, Operation, job.op_id, job.lease) is None:
            return False
        node = session.scalar(select(Node).where(Node.id == job.node_id).with_for_update())
        if node is None:
            return False
        node.bootstrap_token_sha256, node.bootstrap_expires_at = sha, expires
        return True


# ---------------------------------------------------------------- 3. apply under lease
def _apply(session: Session, settings: Settings, job: LaunchJob, outcome: Outcome, now: dt.datetime) -> str:
    blocklist.add_blocks(session, outcome.new_blocks)
    op = held(session, Operation, job.op_id, job.lease)
    if op is None:
        # Another worker owns it now; it will adopt any VM we made (find_launched).
        return "lease lost"
    pool = session.scalar(select(Pool).where(Pool.id == job.pool_id).with_for_update(of=Pool)) if job.pool_id else None
    node = session.scalar(select(Node).where(Node.id == job.node_id).with_for_update())
    append_history(op, outcome.history)
    if outcome.instance is not None:
        _record_instance(node, outcome.instance, outcome.candidate, job.catalog)
        if node.state == S.provisioning:
            transition(session, node, S.booting, reason=f"launched {outcome.instance.instance_id}")
        finish_operation(op, OperationState.succeeded, now)
        if pool is not None and pool.capacity_status == CAPACITY_UNAVAILABLE:
            pool.capacity_status = None
        return "launched"
    retry_operation(op, _next_attempt(settings, job, outcome, now), outcome.error)
    if outcome.capacity_exhausted and pool is not None:
        pool.capacity_status = CAPACITY_UNAVAILABLE
    return "retry"


def _next_attempt(settings: Settings, job: LaunchJob, outcome: Outcome, now: dt.datetime) -> dt.datetime:
    """Soon after a transient failure; when the first block lifts if every candidate is blocked."""
    retry = now + dt.timedelta(seconds=settings.retry_delay_s)
    if not outcome.capacity_exhausted:
        return retry
    lifts = blocklist.earliest_expiry([*job.blocks, *outcome.new_blocks], now)
    return max(lifts, now + MIN_RETRY) if lifts else retry


def _record_instance(node: Node, instance: Instance, candidate: Candidate | None, catalog: Catalog) -> None:
    node.cloud, node.region, node.zone = instance.cloud, instance.region, instance.zone or (
        candidate.zone if candidate else None
    )
    node.instance_type = instance.instance_type or (candidate.instance_type if candidate else None)
    # The market we asked for is authoritative; emulators do not always report it back.
    node.spot = candidate.spot if candidate is not None else instance.spot
    node.instance_id = instance.instance_id
    node.private_ip = instance.private_ip
    node.gpus_total = placement_catalog.gpus_of(catalog, node.cloud, node.region, node.instance_type or "")

