"""Internal API for node agents, and the admin's drain command.

Agent API (``/internal/v1/agents``; JSON; errors are problem+json; ``401`` for every bad,
expired or used token so a caller learns nothing about which it was):

``POST /register`` (no auth header: the body carries the one-time bootstrap token)
    ``{"node_id", "bootstrap_token", "agent_url", "hostname", "gpus": [0, 1], "engine", "version"}``
    → ``200 {"credential": "<node credential>", "node_id", "node_state",
    "heartbeat_interval_s": null|s, "commands": [...], "replicas": [ReplicaEntry…]}``. The token
    works only before its expiry; the node moves provisioning → booting. Safe to retry: a register
    repeated with the same token (its answer was lost) gets the same credential back, until the
    agent first uses the credential (any call below) or ``bootstrap_retry_grace_s`` after the first
    register passes; after that the token is refused ``401``. Only digests are stored (see
    ``services/agents.py``).

All other calls send ``Authorization: Bearer <node credential>``; a credential is scoped to
its node (it can only write that node and its replicas) and dies when the node is terminated.

``POST /resume`` (same body as register, minus token) → the same answer without a credential.
    For a restarted agent: its old engines died with it, so the node's replicas return to
    ``pending`` (or ``stopped``, if no longer wanted) and are listed again to be started. Optional
    ``"boot_id"`` (register and resume; one per agent process): a resume repeating the recorded
    ``boot_id`` is a retry and changes no replica.
``POST /replicas`` ``{"replicas": [ReplicaReport…]}`` → ``{"applied": n}``. Sent on every
    replica state change (started, ready, restarting, draining, stopped, failed).
    On a draining node, a report with every replica ``stopped`` (or ``failed``) means drained:
    the next fleet tick terminates the node instead of waiting out its drain deadline.
``POST /heartbeat`` ``{"draining": bool, "drain_deadline_s"?, "agent_url", "node_metrics": {…},
    "replicas": [ReplicaReport…]}`` → the register answer's ``node_state``, ``commands`` and
    ``replicas``. Commands: ``{"type": "drain", "deadline_at", "deadline_s"}`` while the node is
    draining as a whole; ``{"type": "stop"}`` once it is terminating. ``draining: true`` from the
    agent (SIGTERM) moves a ready node to draining.

``ReplicaEntry`` (what the node must run; every answer carries the node's full list):
``{"id" (chosen by the control plane), "pool_id", "variant_id", "model", "tier",
"served_model_name", "model_path", "quantization", "context_length", "engine_args",
"gpu_ids": [2, 3], "port": null|int, "desired_state": "running"|"stopped", "drain_deadline_s",
"artifact_source"}``. The agent starts running entries it does not run yet (tp = len(gpu_ids),
``CUDA_VISIBLE_DEVICES`` = gpu_ids; port: the entry's, else the node's port base plus the lowest
GPU index), never on a GPU that a replica not yet stopped still holds (the entry waits). It drains
a replica marked stopped, or no longer listed, alone: reported ``draining``, then ``stopped`` once
its in-flight requests finish or ``drain_deadline_s`` passes; the node and its other replicas are
left alone. A replica it never ran is reported stopped; an index the machine lacks is reported
failed with ``error``. Unknown fields are ignored; a malformed entry is skipped.

``ReplicaReport``: ``{"id" (the control plane's replica id), "slot" (its lowest GPU index),
"state": starting|ready|draining|stopped|failed, "url", "gpu_ids", "restarts", "last_exit_code",
"last_restart_at", "started_at", "ready_at", "model_ready_seconds", "ready_breakdown":
{"download", "load", "warmup"}, "max_running_requests", "max_total_tokens", "metrics": {…},
"error"?}``. Reports of ids not placed on the node are ignored. A replica reported ``ready`` that
the control plane no longer wants, or on a node that is no longer serving, is stored as
``draining``; one reported ``failed`` is given up and placed again elsewhere.

Admin: ``POST /admin/v1/nodes/{node_id}/drain`` ``{"deadline_s": 300}`` → ``202`` with the node.
Its replicas stop taking new requests at once; the agent finishes in-flight work and exits.
"""

from __future__ import annotations

import uuid
from typing import Annotated

import msgspec
from litestar import Controller, Request, Router
from litestar.connection import ASGIConnection
from litestar.di import Provide
from litestar.handlers import BaseRouteHandler
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api.bodies import AGENT_MAX_BODY_BYTES
from controlplane.api.deps import admin_guard, bearer, provide_admin
from controlplane.api.routing import post
from controlplane.config import Settings
from controlplane.console import stability
from controlplane.models import Node
from controlplane.schemas.fleet import NodeOut
from controlplane.services import agents, fleet
from controlplane.services.errors import Unauthorized
from controlplane.services.principal import Principal


async def node_guard(connection: ASGIConnection, _handler: BaseRouteHandler) -> None:
    """The node credential is checked before the body is read (guards run first)."""
    credential = bearer(connection)
    if not credential:
        raise Unauthorized("node credential required")
    async with connection.app.state.sessionmaker() as session:
        await session.run_sync(agents.authenticate, credential)


async def provide_node(request: Request, db: AsyncSession) -> Node:
    # Loaded again in the request's own session (node_guard's session is closed by now). This
    # transaction commits with the handler: the credential is in use, so its bootstrap token dies.
    credential = bearer(request)
    return await db.run_sync(lambda s: agents.authenticate(s, credential, spend_bootstrap=True))


class AgentController(Controller):
    path = "/internal/v1/agents"
    tags = ["internal"]
    include_in_schema = False

    # No header: the one-time bootstrap token is in the body, so this body is read unauthenticated;
    # it is small (size cap) and depth-checked before it is decoded.
    @post("/register", status_code=200, request_max_body_size=AGENT_MAX_BODY_BYTES)
    async def register(self, db: AsyncSession, settings: Settings, data: agents.RegisterRequest) -> dict:
        grace_s = settings.bootstrap_retry_grace_s
        credential, answer = await db.run_sync(lambda s: agents.register(s, data, grace_s=grace_s))
        return {"credential": credential, **answer}

    @post("/resume", status_code=200, guards=[node_guard], dependencies={"node": Provide(provide_node)},
          request_max_body_size=AGENT_MAX_BODY_BYTES)
    async def resume(self, db: AsyncSession, node: Node, data: agents.AgentFacts) -> dict:
        return await db.run_sync(agents.resume, node, data)

    @post("/replicas", status_code=200, guards=[node_guard], dependencies={"node": Provide(provide_node)},
          request_max_body_size=AGENT_MAX_BODY_BYTES)
    async def replicas(self, db: AsyncSession, node: Node, data: agents.ReplicasRequest) -> dict:
        applied = await db.run_sync(lambda s: agents.report_replicas(s, node, data.replicas, with_metrics=False))
        return {"applied": applied}

    @post("/heartbeat", status_code=200, guards=[node_guard], dependencies={"node": Provide(provide_node)},
          request_max_body_size=AGENT_MAX_BODY_BYTES)
    async def heartbeat(self, db: AsyncSession, settings: Settings, node: Node, data: agents.HeartbeatRequest) -> dict:
        stability.PAUSED.bind(settings)  # the API's /metrics reports where the sweeper paused evictions
        return await db.run_sync(agents.heartbeat, node, data)


class DrainRequest(msgspec.Struct, forbid_unknown_fields=True):
    deadline_s: Annotated[float, msgspec.Meta(ge=0, le=86400)] = agents.DEFAULT_DRAIN_S


class NodeDrainController(Controller):
    path = "/admin/v1/nodes"
    guards = [admin_guard]
    dependencies = {"principal": Provide(provide_admin)}
    tags = ["admin"]
    security = [{"AdminToken": []}]

    @post("/{node_id:uuid}/drain", status_code=202)
    async def drain(self, db: AsyncSession, principal: Principal, node_id: uuid.UUID,
                    data: DrainRequest | None = None) -> NodeOut:
        deadline_s = data.deadline_s if data else agents.DEFAULT_DRAIN_S
        node = await db.run_sync(lambda s: agents.request_drain(s, node_id, deadline_s=deadline_s,
                                                                actor=principal.actor))
        return fleet.node_out(node)


agents_router = Router(path="/", route_handlers=[AgentController, NodeDrainController])
