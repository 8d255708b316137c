"""A draining node is terminated as soon as its agent reports it drained, not at its deadline;
the deadline stays the fallback for an agent that still has work in flight or never reports.

The never-reporting case without any agent at all is
``test_reconcile.py::test_ready_node_drains_then_terminates_after_its_deadline``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import select, update

from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet.provisioning import reconcile_tick
from controlplane.models import AuditEvent, Node, NodeState, OperationKind, OperationState, Pool
from controlplane.services.secrets import new_token
from tests.provisioning.conftest import Clouds, aws_catalog, setup_pool
from tests.provisioning.helpers import converge, nodes, operations, tick
from tests.provisioning.test_sweeps_and_leases import EAST, live

DRAIN_S = 300  # the production default: a test passing "promptly" cannot be waiting it out


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def replica(state: str) -> dict:
    return {"id": str(uuid.uuid4()), "slot": 0, "state": state, "url": "http://127.0.0.1:30000", "gpu_ids": [0]}


async def draining_node(client, admin, settings, aws, aws_template) -> tuple[dict, Node, str, dict]:
    """A pool of two ready nodes (real VMs in moto, replicas reported through the agent API)
    shrunk to one: returns (pool, the draining node, its agent's credential, its replica)."""
    pool = await setup_pool(client, admin, aws_catalog(aws_template), EAST, min_replicas=2, max_replicas=2)
    converge(settings, Clouds(aws=aws))
    agents: dict[uuid.UUID, tuple[str, dict]] = {}
    for node in nodes(settings, pool["id"]):
        credential, digest = new_token()  # what /register hands out; the bootstrap exchange has its own tests
        with session_scope(settings) as s:
            s.get(Node, node.id).credential_sha256 = digest
        ready = replica("ready")
        r = await client.post("/internal/v1/agents/heartbeat", json={"replicas": [ready]}, headers=bearer(credential))
        assert r.status_code == 200, r.text
        agents[node.id] = (credential, ready)
    assert len(nodes(settings, pool["id"], NodeState.ready)) == 2
    with session_scope(settings) as s:
        s.execute(update(Pool).where(Pool.id == uuid.UUID(pool["id"])).values(min_replicas=1, desired_replicas=1))
    assert tick(settings).removed == 1
    [node] = nodes(settings, pool["id"], NodeState.draining)
    assert node.drain_deadline_at > utcnow() + dt.timedelta(seconds=DRAIN_S - 10)
    return pool, node, *agents[node.id]


def tick_at(settings, now: dt.datetime):
    with session_scope(settings) as s:
        return reconcile_tick(s, settings, now)


def termination_reasons(settings, node_id: uuid.UUID) -> list[str]:
    with session_scope(settings) as s:
        events = s.scalars(select(AuditEvent).where(AuditEvent.target_id == str(node_id),
                                                    AuditEvent.action == "node.terminating"))
        return [e.after.get("reason", "") for e in events]


async def test_node_reported_drained_is_terminated_at_the_next_tick_not_its_deadline(
    client, admin, settings, aws, ec2: Any, aws_template
):
    settings = settings.model_copy(update={"drain_timeout_s": DRAIN_S})
    pool, node, credential, rep = await draining_node(client, admin, settings, aws, aws_template)
    # What the agent sends once its last stream finished and its engines stopped, just before it
    # exits (dataplane/agent/agent.py, NodeAgent._drain): every replica stopped.
    r = await client.post("/internal/v1/agents/replicas", json={"replicas": [{**rep, "state": "stopped"}]},
                          headers=bearer(credential))
    assert r.status_code == 200 and r.json() == {"applied": 1}

    result = tick(settings)  # now, ~300 s before the deadline
    [terminating] = nodes(settings, pool["id"], NodeState.terminating)
    assert terminating.id == node.id
    [terminate] = operations(settings, pool["id"], OperationKind.terminate)
    assert (terminate.id, OperationKind.terminate) in result.operations  # fanned out right after commit
    assert operations(settings, pool["id"], OperationKind.drain)[0].state == OperationState.succeeded
    assert termination_reasons(settings, node.id) == ["drained: the agent reported every replica stopped"]

    converge(settings, Clouds(aws=aws))
    [gone] = nodes(settings, pool["id"], NodeState.terminated)
    assert gone.id == node.id and node.instance_id not in live(ec2, **{"nimbus-cluster": settings.cluster_name})
    times = {k: dt.datetime.fromisoformat(v) for k, v in gone.state_times.items()}
    drain_to_terminated = (times["terminated"] - times["draining"]).total_seconds()
    assert drain_to_terminated < 30, gone.state_times  # the deadline was 300 s away
    assert [n.state for n in nodes(settings, pool["id"])].count(NodeState.ready) == 1  # the other one serves on


async def test_node_with_work_in_flight_drains_until_its_deadline_then_is_terminated(
    client, admin, settings, aws, ec2: Any, aws_template
):
    settings = settings.model_copy(update={"drain_timeout_s": DRAIN_S})
    pool, node, credential, rep = await draining_node(client, admin, settings, aws, aws_template)
    # One engine is done, another still streams: the node is not drained.
    streaming = replica("draining")
    r = await client.post("/internal/v1/agents/heartbeat", json={
        "draining": True, "node_metrics": {"in_flight": 3},
        "replicas": [{**rep, "state": "stopped"}, streaming]}, headers=bearer(credential))
    assert r.status_code == 200 and r.json()["commands"][0]["type"] == "drain"

    for now in (utcnow(), node.drain_deadline_at - dt.timedelta(seconds=1)):
        tick_at(settings, now)
        assert [n.id for n in nodes(settings, pool["id"], NodeState.draining)] == [node.id]
    assert not operations(settings, pool["id"], OperationKind.terminate)
    assert termination_reasons(settings, node.id) == []

    # The agent goes silent (partitioned, or dead mid-drain): the deadline still ends the drain.
    result = tick_at(settings, node.drain_deadline_at + dt.timedelta(seconds=1))
    [terminating] = nodes(settings, pool["id"], NodeState.terminating)
    assert terminating.id == node.id
    [terminate] = operations(settings, pool["id"], OperationKind.terminate)
    assert (terminate.id, OperationKind.terminate) in result.operations
    assert termination_reasons(settings, node.id) == ["drain deadline passed"]


async def test_paused_pool_is_not_resized_but_its_drained_node_still_goes(
    client, admin, settings, aws, ec2: Any, aws_template
):
    settings = settings.model_copy(update={"drain_timeout_s": DRAIN_S})
    pool, node, credential, rep = await draining_node(client, admin, settings, aws, aws_template)
    with session_scope(settings) as s:
        # Paused mid-drain, and asked for more nodes than it has: a paused pool must not act on that.
        s.execute(update(Pool).where(Pool.id == uuid.UUID(pool["id"])).values(paused=True, desired_replicas=2))
    r = await client.post("/internal/v1/agents/replicas", json={"replicas": [{**rep, "state": "stopped"}]},
                          headers=bearer(credential))
    assert r.status_code == 200

    result = tick(settings)
    assert result.launched == 0 and result.removed == 0
    [terminating] = nodes(settings, pool["id"], NodeState.terminating)
    assert terminating.id == node.id
    assert termination_reasons(settings, node.id) == ["drained: the agent reported every replica stopped"]
    converge(settings, Clouds(aws=aws))
    assert [n.state for n in nodes(settings, pool["id"])].count(NodeState.ready) == 1  # still not resized
    assert node.instance_id not in live(ec2, **{"nimbus-cluster": settings.cluster_name})
