"""Drains finish when the agent says so, not at their deadlines; the deadline stays the fallback for
an agent that still has work in flight or never reports.

Two kinds of drain: a replica told to stop (scale-down: the node stays, and is released once it
holds nothing) and a node drained as a whole (admin ``POST /admin/v1/nodes/{id}/drain``, or the
agent's SIGTERM). The agents are played through the real agent API with each node's credential,
and only ever report the replica ids the control plane listed for their node.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import select, update

from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import reconcile
from controlplane.models import (
    AuditEvent,
    Node,
    NodeState,
    Operation,
    OperationKind,
    OperationState,
    Pool,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
)
from controlplane.services.secrets import new_token
from tests.provisioning.conftest import Clouds, aws_catalog, setup_pool
from tests.provisioning.helpers import converge, nodes, tick
from tests.provisioning.test_sweeps_and_leases import EAST, live

DRAIN_S = 300  # the production default: a test passing "promptly" cannot be waiting it out


class Agents:
    """Each node's agent as the agent API sees it: a credential, its replica list, its reports."""

    def __init__(self, client, settings) -> None:
        self.client, self.settings = client, settings
        self.credentials: dict[uuid.UUID, str] = {}

    def headers(self, node_id: uuid.UUID) -> dict[str, str]:
        if node_id not in self.credentials:
            credential, digest = new_token()  # what /register hands out; the bootstrap exchange has its own tests
            with session_scope(self.settings) as s:
                node = s.get(Node, node_id)
                node.credential_sha256, node.agent_url = digest, f"http://{node_id}.agents.test:8081"
            self.credentials[node_id] = credential
        return {"Authorization": f"Bearer {self.credentials[node_id]}"}

    async def heartbeat(self, node_id: uuid.UUID, reports: list[dict] = (), **body: Any) -> dict:
        r = await self.client.post("/internal/v1/agents/heartbeat", json={"replicas": list(reports), **body},
                                   headers=self.headers(node_id))
        assert r.status_code == 200, r.text
        return r.json()

    async def report(self, node_id: uuid.UUID, reports: list[dict]) -> dict:
        """What the agent sends on every replica state change (and, stopped, just before it exits)."""
        r = await self.client.post("/internal/v1/agents/replicas", json={"replicas": reports},
                                   headers=self.headers(node_id))
        assert r.status_code == 200, r.text
        return r.json()

    async def listed(self, node_id: uuid.UUID) -> list[dict]:
        return (await self.heartbeat(node_id))["replicas"]


def report(entry: dict, state: str) -> dict:
    gpu = entry["gpu_ids"][0]
    return {"id": entry["id"], "slot": gpu, "gpu_ids": entry["gpu_ids"], "state": state,
            "url": f"http://127.0.0.1:{30000 + gpu}"}


async def serving_pool(client, admin, settings, aws, aws_template, replicas: int = 2) -> tuple[dict, Agents]:
    """A pool of ``replicas`` 1-GPU replicas on as many real VMs (moto), each reported ready by its agent."""
    pool = await setup_pool(client, admin, aws_catalog(aws_template), EAST, min_replicas=replicas,
                            max_replicas=replicas)
    converge(settings, Clouds(aws=aws))
    agents = Agents(client, settings)
    for node in nodes(settings, pool["id"]):
        [entry] = await agents.listed(node.id)  # the row placement wrote, with its GPUs
        assert entry["pool_id"] == pool["id"] and entry["desired_state"] == "running"
        await agents.heartbeat(node.id, [report(entry, "ready")])
    assert len(nodes(settings, pool["id"], NodeState.ready)) == replicas
    return pool, agents


async def shrink_to_one(client, admin, settings, pool: dict) -> Replica:
    r = await client.patch(f"/admin/v1/pools/{pool['id']}", json={"min_replicas": 1, "max_replicas": 1},
                           headers=admin)
    assert r.status_code == 200, r.text
    result = tick(settings)
    assert (result.stopped, result.placed, result.terminated) == (1, 0, 0)
    with session_scope(settings) as s:
        [victim] = s.scalars(select(Replica).where(Replica.pool_id == uuid.UUID(pool["id"]),
                                                   Replica.desired_state == ReplicaDesiredState.stopped)).all()
    assert victim.state == ReplicaState.draining  # out of the edge's routing already
    assert victim.drain_deadline_at > utcnow() + dt.timedelta(seconds=DRAIN_S - 10)
    return victim


def tick_at(settings, now: dt.datetime) -> reconcile.TickResult:
    with session_scope(settings) as s:
        return reconcile.fleet_tick(s, settings, now)


def termination_reasons(settings, node_id: uuid.UUID) -> list[str]:
    with session_scope(settings) as s:
        events = s.scalars(select(AuditEvent).where(AuditEvent.target_id == str(node_id),
                                                    AuditEvent.action == "node.terminating"))
        return [e.after.get("reason", "") for e in events]


def terminate_op(settings, node_id: uuid.UUID) -> Operation | None:
    with session_scope(settings) as s:
        return s.scalar(select(Operation).where(Operation.node_id == node_id,
                                                Operation.kind == OperationKind.terminate))


def node_row(settings, node_id: uuid.UUID) -> Node:
    with session_scope(settings) as s:
        return s.get(Node, node_id)


def replica_row(settings, replica_id: uuid.UUID) -> Replica:
    with session_scope(settings) as s:
        return s.get(Replica, replica_id)


# ---------------------------------------------------------------- replica drains (scale-down)
async def test_replica_reported_stopped_releases_its_emptied_node_at_the_next_tick_not_its_deadline(
    client, admin, settings, aws, ec2: Any, aws_template
):
    settings = settings.model_copy(update={"drain_timeout_s": DRAIN_S, "empty_node_ttl_s": 0})
    pool, agents = await serving_pool(client, admin, settings, aws, aws_template)
    victim = await shrink_to_one(client, admin, settings, pool)
    # Its agent is told to stop it, with the time it has to finish its streams.
    [entry] = await agents.listed(victim.node_id)
    assert (entry["id"], entry["desired_state"]) == (str(victim.id), "stopped")
    assert DRAIN_S - 10 < entry["drain_deadline_s"] <= DRAIN_S
    assert node_row(settings, victim.node_id).state == NodeState.ready  # the node is not drained
    # What the agent sends once its last stream finished and the engine stopped.
    assert await agents.report(victim.node_id, [report(entry, "stopped")]) == {"applied": 1}
    assert replica_row(settings, victim.id).state == ReplicaState.stopped

    result = tick(settings)  # now, ~300 s before the replica's deadline
    assert (result.terminated, result.launched, result.placed) == (1, 0, 0)
    assert node_row(settings, victim.node_id).state == NodeState.terminating
    op = terminate_op(settings, victim.node_id)
    assert (op.id, OperationKind.terminate) in result.operations  # fanned out right after commit
    assert termination_reasons(settings, victim.node_id) == ["empty: no replica placed here"]

    converge(settings, Clouds(aws=aws))
    gone = node_row(settings, victim.node_id)
    assert gone.state == NodeState.terminated
    assert gone.instance_id not in live(ec2, **{"nimbus-cluster": settings.cluster_name})
    stopped_at = victim.drain_deadline_at - dt.timedelta(seconds=DRAIN_S)
    terminated_at = dt.datetime.fromisoformat(gone.state_times["terminated"])
    assert (terminated_at - stopped_at).total_seconds() < 30, gone.state_times  # the deadline was 300 s away
    [survivor] = nodes(settings, pool["id"], NodeState.ready)  # the other one serves on
    assert survivor.id != victim.node_id and survivor.instance_id in live(ec2, **{"nimbus-node-id": str(survivor.id)})


async def test_replica_with_work_in_flight_keeps_its_node_until_its_deadline(
    client, admin, settings, aws, ec2: Any, aws_template
):
    settings = settings.model_copy(update={"drain_timeout_s": DRAIN_S, "empty_node_ttl_s": 0})
    pool, agents = await serving_pool(client, admin, settings, aws, aws_template)
    victim = await shrink_to_one(client, admin, settings, pool)
    [entry] = await agents.listed(victim.node_id)
    # Still streaming: the agent reports it draining, and a "ready" from a lagging agent stays draining.
    await agents.heartbeat(victim.node_id, [report(entry, "ready")], node_metrics={"in_flight": 3})
    assert replica_row(settings, victim.id).state == ReplicaState.draining
    for now in (utcnow(), victim.drain_deadline_at - dt.timedelta(seconds=1)):
        result = tick_at(settings, now)
        assert (result.terminated, result.launched) == (0, 0)
        assert node_row(settings, victim.node_id).state == NodeState.ready
        assert replica_row(settings, victim.id).state == ReplicaState.draining
    assert terminate_op(settings, victim.node_id) is None

    # The agent goes silent (partitioned, or dead mid-drain): the deadline writes the replica off,
    # and its node, now empty, is released (TTL 0) in the same tick.
    result = tick_at(settings, victim.drain_deadline_at + dt.timedelta(seconds=1))
    assert replica_row(settings, victim.id).state == ReplicaState.stopped
    assert (result.terminated, result.launched) == (1, 0)
    assert node_row(settings, victim.node_id).state == NodeState.terminating
    assert (terminate_op(settings, victim.node_id).id, OperationKind.terminate) in result.operations
    # A late report cannot bring a written-off replica back (its GPU may be handed out again).
    await agents.report(victim.node_id, [report(entry, "ready")])
    assert replica_row(settings, victim.id).state == ReplicaState.stopped


# ---------------------------------------------------------------- node drains (admin, SIGTERM)
async def test_admin_drain_replaces_the_nodes_replicas_and_terminates_it_once_its_agent_reports_them_stopped(
    client, admin, settings, aws, ec2: Any, aws_template
):
    settings = settings.model_copy(update={"drain_timeout_s": DRAIN_S})
    pool, agents = await serving_pool(client, admin, settings, aws, aws_template)
    node, other = nodes(settings, pool["id"], NodeState.ready)
    [entry] = await agents.listed(node.id)
    r = await client.post(f"/admin/v1/nodes/{node.id}/drain", json={"deadline_s": DRAIN_S}, headers=admin)
    assert r.status_code == 202, r.text
    assert node_row(settings, node.id).state == NodeState.draining
    assert replica_row(settings, uuid.UUID(entry["id"])).state == ReplicaState.draining  # out of routing now

    # A draining node's replicas no longer count: the pool gets a replacement elsewhere at once.
    result = tick(settings)
    assert (result.placed, result.launched, result.terminated) == (1, 1, 0)
    answer = await agents.heartbeat(node.id)
    assert answer["commands"][0]["type"] == "drain" and answer["commands"][0]["deadline_s"] > DRAIN_S - 10
    # The agent finishes its streams, stops its engine and says so.
    await agents.heartbeat(node.id, [report(entry, "stopped")])
    result = tick(settings)  # ~300 s before the node's drain deadline
    assert node_row(settings, node.id).state == NodeState.terminating
    assert (terminate_op(settings, node.id).id, OperationKind.terminate) in result.operations
    assert termination_reasons(settings, node.id) == ["drained: the agent reported every replica stopped"]

    converge(settings, Clouds(aws=aws))
    assert node_row(settings, node.id).state == NodeState.terminated
    assert node.instance_id not in live(ec2, **{"nimbus-cluster": settings.cluster_name})
    assert node_row(settings, other.id).state == NodeState.ready
    with session_scope(settings) as s:
        wanted = s.scalars(select(Replica).where(Replica.pool_id == uuid.UUID(pool["id"]),
                                                 Replica.desired_state == ReplicaDesiredState.running,
                                                 Replica.state.not_in([ReplicaState.stopped]))).all()
        assert len(wanted) == 2 and node.id not in {r.node_id for r in wanted}
        [replacement] = [s.get(Node, r.node_id) for r in wanted if r.node_id != other.id]
        assert replacement.state == NodeState.booting and replacement.instance_id


async def test_sigterm_drain_without_a_report_ends_at_its_deadline(
    client, admin, settings, aws, ec2: Any, aws_template
):
    pool, agents = await serving_pool(client, admin, settings, aws, aws_template)
    node, _ = nodes(settings, pool["id"], NodeState.ready)
    [entry] = await agents.listed(node.id)
    # The VM is being shut down under the agent (SIGTERM): it drains on its own and says so.
    answer = await agents.heartbeat(node.id, [report(entry, "draining")], draining=True, drain_deadline_s=120)
    assert answer["commands"][0]["type"] == "drain"
    deadline = node_row(settings, node.id).drain_deadline_at
    assert node_row(settings, node.id).state == NodeState.draining
    for now in (utcnow(), deadline - dt.timedelta(seconds=1)):
        tick_at(settings, now)
        assert node_row(settings, node.id).state == NodeState.draining
    assert terminate_op(settings, node.id) is None and termination_reasons(settings, node.id) == []
    # The agent never reports again: the deadline still ends the drain.
    result = tick_at(settings, deadline + dt.timedelta(seconds=1))
    assert node_row(settings, node.id).state == NodeState.terminating
    assert (terminate_op(settings, node.id).id, OperationKind.terminate) in result.operations
    assert termination_reasons(settings, node.id) == ["drain deadline passed"]
    assert terminate_op(settings, node.id).state == OperationState.pending


async def test_paused_pool_is_not_resized_but_its_drained_node_still_goes(
    client, admin, settings, aws, ec2: Any, aws_template
):
    settings = settings.model_copy(update={"drain_timeout_s": DRAIN_S})
    pool, agents = await serving_pool(client, admin, settings, aws, aws_template)
    node, other = nodes(settings, pool["id"], NodeState.ready)
    [entry] = await agents.listed(node.id)
    with session_scope(settings) as s:
        # Paused, and asked for more replicas than it has: a paused pool must not act on that.
        s.execute(update(Pool).where(Pool.id == uuid.UUID(pool["id"])).values(paused=True, desired_replicas=3))
    r = await client.post(f"/admin/v1/nodes/{node.id}/drain", json={"deadline_s": DRAIN_S}, headers=admin)
    assert r.status_code == 202, r.text
    await agents.report(node.id, [report(entry, "stopped")])

    result = tick(settings)
    assert (result.placed, result.launched, result.stopped) == (0, 0, 0)  # not even the drained one is replaced
    assert node_row(settings, node.id).state == NodeState.terminating
    assert termination_reasons(settings, node.id) == ["drained: the agent reported every replica stopped"]
    converge(settings, Clouds(aws=aws))
    assert node.instance_id not in live(ec2, **{"nimbus-cluster": settings.cluster_name})
    assert [n.id for n in nodes(settings, pool["id"], NodeState.ready)] == [other.id]
