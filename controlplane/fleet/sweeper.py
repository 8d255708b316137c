"""Sweeps: what the clouds say against what the database says.

* **Orphans**: VMs carrying this cluster's ownership tags with no live node behind them
  (the row is gone, terminated or failed, or a second VM for a node that already has
  one) are terminated. Write-before-launch makes this safe: a VM is only ever launched
  for a node row that was committed first.
* **Lost nodes**: a node that should be running but whose VM is gone or stopped is
  marked failed (``preempted`` for spot, so its replacement avoids that zone) and its
  termination is queued; reconcile then launches a replacement.
* **Silent nodes**: no heartbeat within the boot or heartbeat timeout. Silence is missing
  evidence, not evidence: "the node stopped heartbeating" and "heartbeats stopped arriving"
  (the API is down or cut off, its database stalls) look the same from here, and evicting on
  the second takes capacity away from a data plane that still serves. So a silent node is
  evicted (failed, its termination queued, replaced by reconcile) only when all of these hold:

  1. *Its scope still reports.* Per region and for the whole fleet, the share of heartbeating
     nodes (those that ever reported) that are silent is below ``silent_scope_threshold``
     (0.55), or fewer than ``silent_scope_min_nodes`` (3) are silent and not all of them: the
     defaults and the rule are Kubernetes' node lifecycle controller's (unhealthy-zone
     threshold; a zone is partially disrupted with more than 2 unready nodes; it stops evicting
     in small disrupted zones and in "master disruption" when every zone is). In a disrupted
     scope nothing is evicted for silence, a ``fleet.evictions_paused`` audit event is written
     (``fleet.evictions_resumed`` when it reports again, and silence counts from then), the
     operator console's fleet and nodes pages say so, and the API's ``/metrics`` has
     ``nimbus_fleet_evictions_paused{scope} 1`` (``controlplane/console/stability.py``).
  2. *The cloud agrees.* Right before the verdict the VM is described through the provider:
     gone or stopped is the cloud's word (the node is *lost*, as the listing would say); stopping
     (shutting down) is broken; a VM the cloud reports running is evicted only once sweeps have
     seen it silent for ``silent_running_evict_s`` (600 s; when a sweep first saw the silence is
     kept in the node's ``metrics["silence"]``, so time in which no sweep ran — the worker or the
     database was down — or evictions were paused does not count): an agent wedged on a healthy
     VM must not hold GPUs for ever, but a short silence of a running VM is no verdict. A describe
     that fails is no verdict.
     A node that never reported (booting past the boot timeout) needs no more than a running VM:
     its agent never came up.
  3. *It is within the eviction rate.* At most ``evictions_per_sweep`` (2) per sweep and
     ``evictions_per_minute`` (6) in any 60 s, fleet-wide, oldest silence first; the rest wait for
     the next sweep. Each eviction writes a ``node.evicted`` audit event with its evidence.

  4. *The edges do not say it serves.* Edges publish per served model, not per replica, so
     this is the part they can tell: a node whose VM runs is kept while the edges report first
     tokens (their TTFT window, streamed requests) of a model whose every ready replica is on a
     silent node — those tokens came from silent nodes. Edges that are not publishing, or a
     Redis that cannot be read, say nothing either way.

Cloud listings and describes happen outside any transaction; a region that cannot be listed is
skipped entirely (its nodes are not judged on missing data).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.config import Settings
from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import blocklist, placement_catalog
from controlplane.fleet.clouds import Providers
from controlplane.fleet.edge_signals import read_edge_signals, redis_client
from controlplane.fleet.nodes import transition
from controlplane.fleet.provisioning import PREEMPTED, begin_termination
from controlplane.models import (
    AuditEvent,
    Model,
    ModelVariant,
    Node,
    NodeState,
    Operation,
    OperationKind,
    Replica,
    ReplicaState,
)
from controlplane.models.audit import (
    EVICTION_SCOPE,
    EVICTIONS_PAUSED,
    EVICTIONS_RESUMED,
    NODE_EVICTED,
    latest_eviction_scope_events,
)
from controlplane.services.edge_snapshot import served_model_name
from infra.provider import MANAGED_BY, MANAGED_BY_VALUE, TAG_CLUSTER, TAG_NODE_ID, Instance, InstanceState

log = logging.getLogger("nimbus.provisioning.sweep")

FLEET = "fleet"  # the scope of every node; regions are "<cloud>/<region>"
ACTOR = "system:sweeper"
MAX_DESCRIBES = 50  # describe calls per sweep; the rest are described on the next one
SILENT_NODES_GAUGE = Gauge("nimbus_fleet_silent_nodes", "Heartbeating nodes silent past the timeout, per scope",
                           ["scope"])
EVICTIONS = Counter("nimbus_fleet_evictions_total", "Nodes the sweeper failed for silence", ["evidence"])
EVICTIONS_HELD = Counter("nimbus_fleet_evictions_held_total",
                         "Silent nodes the sweeper kept, by why (counted once per sweep each)", ["why"])

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
    held: dict[uuid.UUID, str] = field(default_factory=dict)  # silent nodes kept, and why
    paused: list[str] = field(default_factory=list)  # scopes in which silence evicts nothing
    scopes: dict[str, ScopeHealth] = field(default_factory=dict)
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
    with session_scope(settings) as session:  # which silent nodes need the cloud's word (no lock)
        wanted = [n for n in _silent_candidates(session, settings, owned, clock())[:MAX_DESCRIBES]
                  if n.instance_id and n.cloud and n.region]
    described: dict[uuid.UUID, Described] = {}
    for node in wanted:  # outside any transaction
        try:
            described[node.id] = Described(providers(node.cloud).describe(node.region, node.instance_id))
        except Exception as exc:  # no verdict: the node is not judged on missing data
            described[node.id] = Described(None, error=str(exc)[:300])
    with session_scope(settings) as session:
        now = clock()
        orphans = find_orphans(session, owned)
        operations = judge_nodes(session, settings, owned, now, result, described=described)
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


@dataclass(frozen=True)
class Described:
    """The cloud's answer about one VM: the instance (``None``: the cloud no longer knows it), or
    the error that stopped the describe (no verdict)."""

    instance: Instance | None
    error: str | None = None


@dataclass
class ScopeHealth:
    """How many of a scope's heartbeating nodes (in a running state, reported at least once) are silent."""

    nodes: int = 0
    silent: int = 0

    @property
    def share(self) -> float:
        return self.silent / self.nodes if self.nodes else 0.0

    def disrupted(self, settings: Settings) -> bool:
        """Too many silent at once for silence to mean anything about one node (Kubernetes'
        ComputeZoneState: full disruption, or partial with enough nodes past the threshold)."""
        if not self.silent:
            return False
        if self.silent == self.nodes:
            return True
        return self.silent >= settings.silent_scope_min_nodes and self.share >= settings.silent_scope_threshold

    def as_dict(self, settings: Settings) -> dict:
        return {"silent": self.silent, "nodes": self.nodes, "share": round(self.share, 3),
                "threshold": settings.silent_scope_threshold, "min_nodes": settings.silent_scope_min_nodes}


def region_scope(node: Node) -> str:
    return f"{node.cloud or '?'}/{node.region or '?'}"


def scope_health(nodes: list[Node], settings: Settings, now: dt.datetime) -> dict[str, ScopeHealth]:
    """``{"fleet": …, "<cloud>/<region>": …}``. A node that never reported counts in neither
    figure: its silence says nothing about whether heartbeats arrive."""
    scopes: dict[str, ScopeHealth] = {FLEET: ScopeHealth()}
    for node in nodes:
        if node.state not in RUNNING_STATES or node.last_heartbeat_at is None:
            continue
        silent = (now - node.last_heartbeat_at).total_seconds() > settings.heartbeat_timeout_s
        for name in (FLEET, region_scope(node)):
            health = scopes.setdefault(name, ScopeHealth())
            health.nodes += 1
            health.silent += silent
    return scopes


def _silent_candidates(session: Session, settings: Settings, owned: dict[Place, list[Instance]],
                       now: dt.datetime) -> list[Node]:
    """Silent nodes outside disrupted scopes that the listing does not already call lost: the
    ones whose VM the cloud is asked about before the verdict. Oldest silence first."""
    nodes = list(session.scalars(select(Node).where(Node.state.in_(RUNNING_STATES))))
    scopes = scope_health(nodes, settings, now)
    resumed = _resumed_at(_scope_events(session))
    live = {(c, r, i.instance_id): i for (c, r), instances in owned.items() for i in instances}
    out = [n for n in nodes if not _lost(n, live, owned, now) and _stale(n, settings, now, _not_before(n, resumed))
           and not _guarded(n, scopes, settings)]
    return sorted(out, key=lambda n: _silent_since(n) or now)


def _guarded(node: Node, scopes: dict[str, ScopeHealth], settings: Settings) -> str | None:
    for name in (region_scope(node), FLEET):
        if (health := scopes.get(name)) is not None and health.disrupted(settings):
            return name
    return None


def judge_nodes(
    session: Session, settings: Settings, owned: dict[Place, list[Instance]], now: dt.datetime, result: SweepResult,
    described: dict[uuid.UUID, Described] | None = None,
) -> list[Operation]:
    """Fail (and queue termination of) nodes whose VM is gone, and silent nodes the evidence
    condemns (see the module docstring); pause and resume evictions per scope."""
    described = described or {}
    operations: list[Operation] = []
    live = {(c, r, i.instance_id): i for (c, r), instances in owned.items() for i in instances}
    # The scopes are judged on every running node, locked or not (a plain read).
    everyone = session.execute(
        select(Node.id, Node.state, Node.cloud, Node.region, Node.last_heartbeat_at).where(Node.state.in_(RUNNING_STATES))
    ).all()
    scopes = scope_health(everyone, settings, now)  # type: ignore[arg-type]
    result.scopes = scopes
    result.paused = sorted(name for name, health in scopes.items() if health.disrupted(settings))
    resumed = _resumed_at(_record_scopes(session, settings, scopes, now))
    nodes = session.scalars(
        select(Node).where(Node.state.in_(RUNNING_STATES)).with_for_update(skip_locked=True)
    ).all()
    silent: list[tuple[Node, str, str]] = []  # (node, why silent, evidence) to evict, within the rate
    for node in sorted(nodes, key=lambda n: _silent_since(n) or now):
        if reason := _lost(node, live, owned, now):
            error = f"{PREEMPTED}: {reason}" if node.spot else f"instance lost: {reason}"
            result.lost.append(node.id)
        elif reason := _stale(node, settings, now, _not_before(node, resumed)):
            if scope := _guarded(node, scopes, settings):
                _hold(result, node, f"evictions paused in {scope}", "paused")
                continue
            verdict, evidence = _cloud_verdict(node, described.get(node.id), settings, now, _silence_seen(node, now))
            if verdict == "lost":
                error = f"instance lost: {evidence} (silent: {reason})"
                result.lost.append(node.id)
            elif verdict == "evict":
                silent.append((node, reason, evidence))
                continue
            else:
                _hold(result, node, evidence, "no_verdict")
                continue
        else:
            continue
        transition(session, node, S.failed, reason=error, error=error)
        if op := begin_termination(session, node, now, settings, reason=error):
            operations.append(op)
    silent = _not_served_per_edges(session, settings, silent, everyone, now, result)
    budget = _eviction_budget(session, settings, now)
    for i, (node, reason, evidence) in enumerate(silent):
        if i >= budget:
            _hold(result, node, "eviction rate limit", "rate_limit")
            continue
        error = f"stale: {reason}; {evidence}"
        result.stale.append(node.id)
        EVICTIONS.labels(_evidence_kind(evidence)).inc()
        session.add(AuditEvent(at=now, actor=ACTOR, action=NODE_EVICTED, target_type="nodes", target_id=str(node.id),
                               before={"state": node.state.value},
                               after={"reason": reason, "evidence": evidence, "scope": region_scope(node),
                                      "scopes": {name: scopes[name].as_dict(settings)
                                                 for name in (FLEET, region_scope(node)) if name in scopes}}))
        transition(session, node, S.failed, reason=error, error=error)
        if op := begin_termination(session, node, now, settings, reason=error):
            operations.append(op)
    return operations


def _not_served_per_edges(session: Session, settings: Settings, candidates: list[tuple[Node, str, str]],
                          everyone: list, now: dt.datetime, result: SweepResult) -> list[tuple[Node, str, str]]:
    """Candidates minus the nodes whose VM runs and whose model's recent first tokens, as the edges
    report them, can only have come from silent nodes (condition 4 in the module docstring)."""
    running = [c for c in candidates if c[2].startswith("seen silent")]
    if not running:
        return candidates
    readout = read_edge_signals(redis_client(settings.redis_url), time.time(), prefix=settings.edge_signals_prefix)
    served = {name for name, signals in readout.items() if signals.ttft_samples > 0}
    if not served:
        return candidates
    reporting = {row.id for row in everyone if row.last_heartbeat_at is not None
                 and (now - row.last_heartbeat_at).total_seconds() <= settings.heartbeat_timeout_s}
    hosts: dict[str, set[uuid.UUID]] = {}
    for node_id, model, tier in session.execute(
        select(Replica.node_id, Model.name, ModelVariant.tier)
        .join(ModelVariant, ModelVariant.id == Replica.variant_id).join(Model, Model.id == ModelVariant.model_id)
        .where(Replica.state == ReplicaState.ready)
    ):
        hosts.setdefault(served_model_name(model, tier), set()).add(node_id)
    kept: list[tuple[Node, str, str]] = []
    for candidate in candidates:
        node = candidate[0]
        only_silent = sorted(m for m in served if node.id in hosts.get(m, ()) and not hosts[m] & reporting)
        if candidate in running and only_silent:
            _hold(result, node, f"the edges report first tokens of {', '.join(only_silent)}, served only by "
                                "silent nodes", "edges_serving")
            continue
        kept.append(candidate)
    return kept


def _evidence_kind(evidence: str) -> str:
    """A bounded label for the metrics."""
    for prefix, kind in (("seen silent", "running_vm_silent"), ("cloud:", "cloud_stopping"),
                         ("never reported", "never_reported")):
        if evidence.startswith(prefix):
            return kind
    return "other"


def _hold(result: SweepResult, node: Node, why: str, kind: str) -> None:
    result.held[node.id] = why
    EVICTIONS_HELD.labels(kind).inc()
    log.info("silent node %s kept: %s", node.id, why)


def _silence_seen(node: Node, now: dt.datetime) -> dt.datetime:
    """When a sweep first saw this silence (the node's current last heartbeat), recorded on the node.
    A sweep that did not run (the worker or the database was down) saw nothing: time the
    sweeper was not looking, or a pause, is no evidence of silence."""
    mark = (node.metrics or {}).get("silence") or {}
    beat = node.last_heartbeat_at.isoformat() if node.last_heartbeat_at else None
    if mark.get("heartbeat") == beat and mark.get("seen_at"):
        return dt.datetime.fromisoformat(mark["seen_at"])
    node.metrics = {**(node.metrics or {}), "silence": {"heartbeat": beat, "seen_at": now.isoformat()}}
    return now


def _cloud_verdict(node: Node, described: Described | None, settings: Settings, now: dt.datetime,
                   seen_at: dt.datetime | None = None) -> tuple[str, str]:
    """("lost" | "evict" | "hold", evidence) for a silent node in a scope that still reports."""
    if node.instance_id is None:
        return "hold", "no VM recorded: its launch decides"
    if described is None:
        return "hold", "not described by the cloud yet"
    if described.error is not None:
        return "hold", f"the cloud could not describe {node.instance_id}: {described.error}"
    instance = described.instance
    if instance is None:
        return "lost", f"the cloud no longer knows instance {node.instance_id}"
    if instance.state == InstanceState.TERMINATED:
        return "lost", f"the cloud reports instance {node.instance_id} {instance.state.value}"
    if instance.state == InstanceState.STOPPING:
        return "evict", f"cloud: instance {node.instance_id} is {instance.state.value}"
    if node.last_heartbeat_at is None:
        return "evict", f"never reported: instance {node.instance_id} is {instance.state.value}"
    observed_s = (now - (seen_at or now)).total_seconds()
    if observed_s >= settings.silent_running_evict_s:
        return "evict", (f"seen silent for {int(observed_s)} s: instance {node.instance_id} is "
                         f"{instance.state.value} but its agent does not report")
    return "hold", (f"the cloud reports instance {node.instance_id} {instance.state.value}; evicted once seen "
                    f"silent for {int(settings.silent_running_evict_s)} s ({int(observed_s)} s so far)")


def _eviction_budget(session: Session, settings: Settings, now: dt.datetime) -> int:
    recent = session.scalar(select(func.count()).select_from(AuditEvent).where(
        AuditEvent.action == NODE_EVICTED, AuditEvent.at > now - dt.timedelta(seconds=60))) or 0
    return max(0, min(settings.evictions_per_sweep, settings.evictions_per_minute - recent))


def _scope_events(session: Session) -> dict[str, tuple[str, dt.datetime]]:
    """Each scope's latest pause/resume event: ``{scope: (action, at)}``."""
    latest: dict[str, tuple[str, dt.datetime]] = {}
    for target_id, action, at, _after in session.execute(latest_eviction_scope_events()):
        latest.setdefault(target_id, (action, at))
    return latest


def _resumed_at(latest: dict[str, tuple[str, dt.datetime]]) -> dict[str, dt.datetime]:
    return {name: at for name, (action, at) in latest.items() if action == EVICTIONS_RESUMED}


def _not_before(node: Node, resumed: dict[str, dt.datetime]) -> dt.datetime | None:
    """Silence counts from the last time the node's scope resumed evicting, at the earliest: a
    backlog of heartbeats takes a while to arrive after an outage, and silence during a pause was
    no evidence (Kubernetes likewise resets its probe times when it leaves disruption mode)."""
    stamps = [at for name in (FLEET, region_scope(node)) if (at := resumed.get(name)) is not None]
    return max(stamps) if stamps else None


def _record_scopes(session: Session, settings: Settings, scopes: dict[str, ScopeHealth],
                   now: dt.datetime) -> dict[str, tuple[str, dt.datetime]]:
    """Audit each scope's pause and resume once (the latest event per scope is its state) and set
    the gauges. Returns each scope's latest event, those written here included."""
    latest = _scope_events(session)
    for name in sorted(set(scopes) | set(latest)):
        health = scopes.get(name, ScopeHealth())
        paused = health.disrupted(settings)
        was_paused = latest.get(name, ("", now))[0] == EVICTIONS_PAUSED
        SILENT_NODES_GAUGE.labels(name).set(health.silent)
        if paused == was_paused:
            continue
        action = EVICTIONS_PAUSED if paused else EVICTIONS_RESUMED
        if paused:
            log.warning("evictions paused in %s: %d of %d heartbeating nodes silent (threshold %.0f%%); "
                        "heartbeats may not be reaching the control plane", name, health.silent, health.nodes,
                        settings.silent_scope_threshold * 100)
        else:
            log.warning("evictions resumed in %s: %d of %d nodes silent", name, health.silent, health.nodes)
        session.add(AuditEvent(at=now, actor=ACTOR, action=action, target_type=EVICTION_SCOPE, target_id=name,
                               after={**health.as_dict(settings), "since": now.isoformat()}))
        latest[name] = (action, now)
    return latest


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


def _silent_since(node: Node) -> dt.datetime | None:
    return node.last_heartbeat_at or _entered(node, S.ready) or _entered(node, S.booting)


def _stale(node: Node, settings: Settings, now: dt.datetime, not_before: dt.datetime | None = None) -> str | None:
    if node.state == S.booting:
        since = node.last_heartbeat_at or _entered(node, S.booting)
        limit = settings.boot_timeout_s
    else:
        since = node.last_heartbeat_at or _entered(node, S.ready) or _entered(node, S.booting)
        limit = settings.heartbeat_timeout_s
    if since is not None and not_before is not None:
        since = max(since, not_before)
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
