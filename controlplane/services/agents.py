"""Node agents: bootstrap-token exchange, node credentials, replica reports, heartbeats, drains.

The contract (endpoints, bodies, commands) is documented in ``controlplane/api/agents.py``.
Synchronous on purpose (called through ``run_sync``): node state changes go through
``services.nodes.transition``, which works on a sync session.

Security: a bootstrap token is short-lived and buys one node credential; only SHA-256 digests of
the token and of the credential are stored. A credential is scoped to its node: every write below
is limited to that node's own row and replicas.

Idempotent bootstrap: a register whose answer was lost (a timeout, a dropped connection, a request
that sat in a stopped API's backlog) is retried with the same token, and must get the *same*
credential back, or the agent would hold one the control plane no longer knows. The credential is
therefore derived, not stored: ``HMAC-SHA256(key=bootstrap token, "nimbus-node-credential:v1:" +
node id + ":" + salt)``, where the salt is random, written by the first register and not a secret
alone (the token is only ever stored as its digest). A retry within the grace period
(``bootstrap_retry_grace_s`` from the first register) derives the same credential, stores the same
digest and answers it again. The token stops working once the agent *uses* the credential: the
first authenticated call (resume, replicas or heartbeat) clears the token's digest, its expiry and
the salt, so the credential can no longer be derived by anyone, a later register with that token is
refused 401, and what remains at rest is the credential's digest, as before.

Every agent call is safe to repeat: register as above; heartbeat and replica reports set state
(never count or append), and a draining heartbeat keeps the first drain deadline; a resume that
carries the agent process's ``boot_id`` is applied once per process (a repeat stops no engine that
the first answer started). Without a ``boot_id`` a repeated resume sends the node's replicas back
to ``pending`` again, which the next reports correct.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import re
import secrets
import uuid
from typing import Any, Literal

import msgspec
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from controlplane.db.types import utcnow
from controlplane.fleet.nodes import transition
from controlplane.models import (
    Model,
    ModelVariant,
    Node,
    NodeState,
    Region,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
)
from controlplane.models.catalog import Cloud
from controlplane.services.edge_snapshot import served_model_name
from controlplane.services.errors import Conflict, NotFound, Unauthorized
from controlplane.services.secrets import sha256_hex

ReplicaStateName = Literal["pending", "starting", "ready", "draining", "stopped", "failed"]
_REFUSED = "bootstrap token or node credential is invalid, expired or already used"
# Nodes whose agent may still talk to us; a terminated node's credential is dead.
_AGENT_STATES = frozenset({NodeState.pending, NodeState.provisioning, NodeState.booting, NodeState.ready,
                           NodeState.draining, NodeState.terminating})
DEFAULT_DRAIN_S = 300.0
DEFAULT_REGISTER_GRACE_S = 1800.0  # Settings.bootstrap_retry_grace_s
MAX_METRICS_KEYS = 64
MAX_CACHED_MODELS = 256  # model paths a node's cache is reported to hold
MAX_MODEL_PATH_CHARS = 500  # ModelVariant.model_path's column


# ------------------------------------------------------------------ contract types
class AgentFacts(msgspec.Struct, forbid_unknown_fields=False):
    agent_url: str | None = None
    hostname: str | None = None
    gpus: list[int] = []
    engine: str | None = None
    version: str | None = None
    # Optional: one id per agent process. A resume with the id already recorded is a repeat (its
    # answer was lost, or it sat in a stopped API's backlog) and stops nothing.
    boot_id: str | None = None


class RegisterRequest(AgentFacts):
    node_id: uuid.UUID | None = None
    bootstrap_token: str = ""


class ReplicaReport(msgspec.Struct, forbid_unknown_fields=False):
    id: uuid.UUID
    state: ReplicaStateName
    url: str | None = None
    slot: int | None = None
    gpu_ids: list[int] = []
    restarts: int = 0
    last_exit_code: int | None = None
    last_restart_at: dt.datetime | None = None
    # Why the agent last restarted the engine: "killed by SIGKILL", "unresponsive: /health_generate
    # failed 3 times in a row …". Agent text: stored cleaned (restart_reason), shown escaped.
    last_restart_reason: str | None = None
    started_at: dt.datetime | None = None
    ready_at: dt.datetime | None = None
    model_ready_seconds: float | None = None
    ready_breakdown: dict[str, float] = {}
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    metrics: dict[str, Any] = {}


class ReplicasRequest(msgspec.Struct):
    replicas: list[ReplicaReport]


class HeartbeatRequest(msgspec.Struct, forbid_unknown_fields=False):
    replicas: list[ReplicaReport] = []
    draining: bool = False
    drain_deadline_s: float | None = None
    agent_url: str | None = None
    node_metrics: dict[str, Any] = {}


# ------------------------------------------------------------------ credentials
def _live_node(session: Session, node: Node | None) -> Node:
    if node is None or node.state not in _AGENT_STATES:
        raise Unauthorized(_REFUSED)
    return node


def derive_credential(bootstrap_token: str, node_id: uuid.UUID, salt: str) -> str:
    """The node credential a (token, node, salt) stands for; see the module docstring."""
    mac = hmac.new(bootstrap_token.encode(), f"nimbus-node-credential:v1:{node_id}:{salt}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()


def register(session: Session, body: RegisterRequest, *,
             grace_s: float = DEFAULT_REGISTER_GRACE_S) -> tuple[str, dict]:
    """Exchange a bootstrap token for the node's credential. Returns (credential, answer).

    Repeatable until the credential is first used (or the grace period after the first register
    ends): each repeat answers the same credential, and moves the node no further than the first."""
    if body.node_id is None or not body.bootstrap_token:
        raise Unauthorized(_REFUSED)
    node = session.get(Node, body.node_id, with_for_update=True)
    node = _live_node(session, node)
    now = utcnow()
    if (
        not node.bootstrap_token_sha256
        or not hmac.compare_digest(node.bootstrap_token_sha256, sha256_hex(body.bootstrap_token))
        or node.bootstrap_expires_at is None
        or node.bootstrap_expires_at <= now
    ):
        raise Unauthorized(_REFUSED)
    if node.bootstrap_salt is None:  # the first register: the retry window starts now
        # Compare-and-set, not only the row lock: SQLite has no FOR UPDATE, and two first registers
        # racing must still agree on one salt (the loser reads the winner's).
        session.execute(update(Node).where(Node.id == node.id, Node.bootstrap_salt.is_(None)).values(
            bootstrap_salt=secrets.token_hex(16), bootstrap_expires_at=now + dt.timedelta(seconds=grace_s)))
        session.refresh(node, ["bootstrap_salt", "bootstrap_expires_at"])
    credential = derive_credential(body.bootstrap_token, node.id, node.bootstrap_salt)
    node.credential_sha256 = sha256_hex(credential)
    _adopt(session, node, body, now)
    return credential, answer_for(session, node, now)


def authenticate(session: Session, credential: str | None, *, spend_bootstrap: bool = False) -> Node:
    """The node a credential belongs to. ``spend_bootstrap`` (set where the request's own
    transaction commits): the credential is in use, so its bootstrap token stops working."""
    if not credential:
        raise Unauthorized(_REFUSED)
    node = session.scalar(select(Node).where(Node.credential_sha256 == sha256_hex(credential)))
    node = _live_node(session, node)
    if spend_bootstrap and (node.bootstrap_token_sha256 is not None or node.bootstrap_salt is not None):
        node.bootstrap_token_sha256 = None  # spent: a replayed token is refused
        node.bootstrap_expires_at = None
        node.bootstrap_salt = None  # and the credential can no longer be derived
    return node


def resume(session: Session, node: Node, facts: AgentFacts) -> dict:
    """A restarted agent: its old engines died with it, so their replicas are stopped. A repeat
    from the same agent process (same ``boot_id``) is answered without that: its engines may be
    running by now, started from the first answer."""
    now = utcnow()
    recorded = ((node.metrics or {}).get("agent") or {}).get("boot_id")
    if facts.boot_id and facts.boot_id == recorded:
        _adopt(session, node, facts, now)
        return answer_for(session, node, now)
    for replica in _replicas(session, node):
        # Its engine died with the old agent; a replica still wanted starts again from the list.
        if replica.state not in (ReplicaState.stopped, ReplicaState.failed):
            replica.state = (ReplicaState.pending if replica.desired_state == ReplicaDesiredState.running
                             else ReplicaState.stopped)
    _adopt(session, node, facts, now)
    return answer_for(session, node, now)


def _adopt(session: Session, node: Node, facts: AgentFacts, now: dt.datetime) -> None:
    node.agent_url = facts.agent_url
    node.last_heartbeat_at = now
    node.metrics = {**(node.metrics or {}), "agent": {"hostname": facts.hostname, "gpus": facts.gpus,
                                                      "engine": facts.engine, "version": facts.version,
                                                      "boot_id": (facts.boot_id or "")[:64] or None}}
    if node.state == NodeState.pending:
        transition(session, node, NodeState.provisioning, reason="agent registered before launch was recorded")
    if node.state == NodeState.provisioning:
        transition(session, node, NodeState.booting, reason="agent registered")


def answer_for(session: Session, node: Node, now: dt.datetime | None = None) -> dict:
    """What the node should run: the register/resume answer (the heartbeat answer adds commands)."""
    return {
        "node_id": str(node.id),
        "node_state": node.state.value,
        "heartbeat_interval_s": None,  # the agent's own default
        "commands": commands_for(node, now or utcnow()),
        "replicas": replica_list(session, node, now or utcnow()),
    }


def replica_list(session: Session, node: Node, now: dt.datetime) -> list[dict]:
    """The replicas this node must run or stop, with everything the agent needs to start one.

    Listed: every replica placed here that is wanted, and every one told to stop that has not
    been reported stopped yet. A replica the agent runs but no longer finds here is stopped by it.
    """
    rows = session.execute(
        select(Replica, ModelVariant, Model.name)
        .join(ModelVariant, ModelVariant.id == Replica.variant_id)
        .join(Model, Model.id == ModelVariant.model_id)
        .where(Replica.node_id == node.id,
               (Replica.desired_state == ReplicaDesiredState.running)
               | Replica.state.not_in([ReplicaState.stopped, ReplicaState.failed]))
        .order_by(Replica.created_at, Replica.id)
    ).all()
    artifact_source = None
    if rows and node.cloud and node.region:
        artifact_source = session.scalar(
            select(Region.artifact_bucket).join(Cloud).where(Cloud.name == node.cloud, Region.name == node.region)
        )
    out = []
    for replica, variant, model_name in rows:
        running = replica.desired_state == ReplicaDesiredState.running and replica.state != ReplicaState.failed
        deadline = replica.drain_deadline_at
        out.append({
            "id": str(replica.id),
            "pool_id": str(replica.pool_id),
            "variant_id": str(variant.id),
            "model": model_name,
            "tier": variant.tier,
            "served_model_name": served_model_name(model_name, variant.tier),
            "model_path": variant.model_path,
            "quantization": variant.quantization,
            "context_length": variant.context_length,
            "engine_args": dict(variant.engine_args or {}),
            "gpu_ids": list(replica.gpu_ids or ()),
            "port": replica.port,
            "desired_state": "running" if running else "stopped",
            "drain_deadline_s": max(0.0, (deadline - now).total_seconds()) if deadline and not running
            else DEFAULT_DRAIN_S,
            "artifact_source": artifact_source,
        })
    return out


# ------------------------------------------------------------------ replicas and heartbeats
def _replicas(session: Session, node: Node) -> list[Replica]:
    return list(session.scalars(select(Replica).where(Replica.node_id == node.id)))


def report_replicas(session: Session, node: Node, reports: list[ReplicaReport], *, with_metrics: bool) -> int:
    """Apply the agent's reports to the node's replica rows. Returns how many were applied.

    Rows are made by placement, never by a report: a report of an id that is not placed on this
    node is ignored (the agent stops that engine, since its list no longer names it)."""
    now = utcnow()
    not_serving = node.state not in (NodeState.booting, NodeState.ready, NodeState.provisioning)
    ids = [rep.id for rep in reports]
    rows = {r.id: r for r in session.scalars(select(Replica).where(Replica.id.in_(ids)))} if ids else {}
    applied = 0
    for rep in reports:
        replica = rows.get(rep.id)
        if replica is None:
            continue
        if replica.node_id != node.id:
            raise Conflict("replica id belongs to another node")  # a credential only writes its own node
        state = ReplicaState(rep.state)
        if replica.state in (ReplicaState.stopped, ReplicaState.failed) and state not in (
                ReplicaState.stopped, ReplicaState.failed):
            # Written off (its drain deadline passed, its node left the fleet): its GPUs may be
            # handed out again, so a late report cannot bring it back.
            continue
        stopping = replica.desired_state == ReplicaDesiredState.stopped
        if state == ReplicaState.ready and (not_serving or stopping):
            state = ReplicaState.draining  # the control plane, not a lagging agent, decides about traffic
        if state == ReplicaState.starting and stopping:
            state = ReplicaState.draining
        if state == ReplicaState.failed:
            # The agent gave up on the engine (it restarts crashes itself, with backoff): so does the
            # control plane. Its GPUs are free, and the fleet tick places a replacement.
            replica.desired_state = ReplicaDesiredState.stopped
        replica.state = state
        replica.url = rep.url
        if rep.gpu_ids:
            replica.gpu_ids = list(rep.gpu_ids)
        replica.restarts = max(rep.restarts, 0)
        replica.started_at = rep.started_at
        replica.ready_at = rep.ready_at
        if rep.model_ready_seconds is not None:
            replica.model_ready_seconds = rep.model_ready_seconds
            replica.ready_breakdown = dict(rep.ready_breakdown)
        replica.max_running_requests = rep.max_running_requests
        replica.max_total_tokens = rep.max_total_tokens
        replica.last_heartbeat_at = now
        if rep.metrics or with_metrics:
            replica.metrics = dict(list(rep.metrics.items())[:MAX_METRICS_KEYS])
        applied += 1
    session.flush()
    _follow_replicas(session, node, reports)
    return applied


def _follow_replicas(session: Session, node: Node, reports: list[ReplicaReport]) -> None:
    """Node state and health derived from its replicas: ready once one serves; restarts on record."""
    if any(r.state == "ready" for r in reports) and node.state in (NodeState.provisioning, NodeState.booting):
        if node.state == NodeState.provisioning:
            transition(session, node, NodeState.booting, reason="agent reported replicas")
        transition(session, node, NodeState.ready, reason="a replica passed /health_generate")
    restarted = [r for r in reports if r.restarts and r.last_restart_at]
    health = {
        "replicas": {s: sum(r.state == s for r in reports) for s in ("starting", "ready", "draining", "stopped",
                                                                     "failed") if any(r.state == s for r in reports)},
        "restarts": sum(r.restarts for r in reports),
    }
    if restarted:
        last = max(restarted, key=lambda r: r.last_restart_at)
        health["last_restart"] = {"replica_id": str(last.id), **_restart_of(last)}
        # Per replica, so the console can say which engine restarted and why (bounded: one node's reports).
        health["replica_restarts"] = {str(r.id): _restart_of(r) for r in restarted[:MAX_METRICS_KEYS]}
    node.metrics = {**(node.metrics or {}), "health": health}
    if reports and all(r.state == "failed" for r in reports) and node.state in (
        NodeState.booting, NodeState.ready, NodeState.provisioning
    ):
        transition(session, node, NodeState.failed, reason="every engine failed", error="every engine failed")


_SECRETISH = (
    re.compile(r"(?i)\b(bearer)(\s+)\S+"),
    re.compile(r"(?i)\b(token|api[_-]?key|credential|password|secret)(\s*[=:]\s*)\S+"),
    re.compile(r"\bnmb_[A-Za-z0-9_-]{8,}"),  # an API key, in case an engine's error echoes one
    re.compile(r"(?<=://)[^/@\s]+(?=@)"),  # userinfo in a URL
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
MAX_REASON_CHARS = 300


def restart_reason(text: object) -> str | None:
    """An agent's restart reason as stored: one line, at most MAX_REASON_CHARS, anything that reads
    like a credential replaced. It is shown to operators (escaped by the templates)."""
    if not isinstance(text, str) or not text.strip():
        return None
    clean = _CONTROL.sub(" ", text).strip()
    for pattern in _SECRETISH:
        clean = pattern.sub(lambda m: (m.group(1) + m.group(2) + "[redacted]") if m.lastindex else "[redacted]", clean)
    return clean if len(clean) <= MAX_REASON_CHARS else clean[: MAX_REASON_CHARS - 1] + "…"


def _restart_of(r: ReplicaReport) -> dict:
    return {"slot": r.slot, "at": r.last_restart_at.isoformat() if r.last_restart_at else None,
            "exit_code": r.last_exit_code, "reason": restart_reason(r.last_restart_reason), "restarts": r.restarts}


def _agent_metrics(node_metrics: dict[str, Any]) -> dict[str, Any]:
    """The heartbeat's node metrics as stored; the agent's ``last_restart`` reason is cleaned."""
    out = dict(node_metrics)
    last = out.get("last_restart")
    if isinstance(last, dict) and "reason" in last:
        out["last_restart"] = {**last, "reason": restart_reason(last.get("reason"))}
    return out


def cached_models(node_metrics: dict[str, Any]) -> list[str] | None:
    """The model paths the agent reports in its local artifact cache (``artifacts``: model path →
    how it was fetched), sorted; None when the heartbeat does not say (an older agent). At most
    ``MAX_CACHED_MODELS`` of them, each a variant's model path (``ModelVariant.model_path``)."""
    artifacts = node_metrics.get("artifacts")
    if not isinstance(artifacts, dict):
        return None
    paths = sorted(p for p in artifacts if isinstance(p, str) and 0 < len(p) <= MAX_MODEL_PATH_CHARS)
    return paths[:MAX_CACHED_MODELS]


def heartbeat(session: Session, node: Node, body: HeartbeatRequest) -> dict:
    """Record a heartbeat; answer with the commands the node must follow."""
    now = utcnow()
    node.last_heartbeat_at = now
    if body.agent_url:
        node.agent_url = body.agent_url
    node.metrics = {**(node.metrics or {}), "agent": {**(node.metrics or {}).get("agent", {}),
                                                      **_agent_metrics(body.node_metrics)}}
    cached = cached_models(body.node_metrics)
    if cached is not None and cached != list(node.cached_models or ()):
        node.cached_models = cached
    if body.draining and node.state in (NodeState.booting, NodeState.ready):
        deadline_s = body.drain_deadline_s if body.drain_deadline_s is not None else DEFAULT_DRAIN_S
        node.drain_deadline_at = now + dt.timedelta(seconds=deadline_s)
        transition(session, node, NodeState.draining, reason="agent is draining (SIGTERM)", actor=f"node:{node.id}")
    if body.replicas:
        report_replicas(session, node, body.replicas, with_metrics=True)
    return answer_for(session, node, now)


def commands_for(node: Node, now: dt.datetime) -> list[dict]:
    if node.state == NodeState.draining:
        deadline = node.drain_deadline_at or now
        return [{"type": "drain", "deadline_at": deadline.isoformat(),
                 "deadline_s": max(0.0, (deadline - now).total_seconds())}]
    if node.state in (NodeState.terminating, NodeState.terminated, NodeState.failed):
        return [{"type": "stop"}]
    return []


# ------------------------------------------------------------------ drains (admin / pipeline)
def request_drain(session: Session, node_id: uuid.UUID, *, deadline_s: float = DEFAULT_DRAIN_S,
                  actor: str = "admin", reason: str = "drain requested") -> Node:
    """Stop sending new work to a node at once and let its in-flight requests finish.

    Replicas turn ``draining`` right here (the next edge snapshot drops them); the agent learns
    on its next heartbeat, waits for in-flight requests up to the deadline, stops its engines,
    reports them stopped (which lets reconcile terminate the node at once) and exits. Idempotent: draining an already draining node keeps the earlier deadline.
    """
    node = session.get(Node, node_id, with_for_update=True)
    if node is None:
        raise NotFound("node", node_id)
    if node.state == NodeState.draining:
        return node
    if node.state not in (NodeState.booting, NodeState.ready):
        raise Conflict(f"a {node.state.value} node cannot be drained")
    node.drain_deadline_at = utcnow() + dt.timedelta(seconds=deadline_s)
    transition(session, node, NodeState.draining, reason=reason, actor=actor)
    for replica in _replicas(session, node):
        if replica.state in (ReplicaState.starting, ReplicaState.ready):
            replica.state = ReplicaState.draining
    session.flush()
    return node
