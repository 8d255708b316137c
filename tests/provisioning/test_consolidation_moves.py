"""Consolidation on the real pipeline (Postgres, the fleet tick, the launcher and terminator on the
moto EC2 server, the agent API): three nodes, each a quarter used, become one, make-before-break.

The agents are played by the test through the real agent API (``/internal/v1/agents/heartbeat``
with each node's credential): it reports what real agents report, when the test says so, so the
order of events in a move can be checked step by step. The same flow with real agents, engines
and traffic is in tests/e2e/test_consolidation.py.
"""

from __future__ import annotations

import uuid
from collections import defaultdict

from sqlalchemy import select

from controlplane.db.engine import session_scope
from controlplane.models import Node, NodeState, Replica, ReplicaDesiredState, ReplicaState
from controlplane.services.secrets import new_token
from tests.provisioning.conftest import Clouds
from tests.provisioning.helpers import converge, run_due, tick
from tests.provisioning.test_gpu_packing import (
    H100_4,
    assert_no_gpu_twice,
    catalog,
    live_instances,
    make_pool,
    set_desired,
)


class AgentsByHand:
    """Each node's agent as the agent API sees it: a credential, and reports of replica states."""

    def __init__(self, client, settings) -> None:
        self.client, self.settings = client, settings
        self.credentials: dict[uuid.UUID, str] = {}

    def _credential(self, node_id: uuid.UUID) -> str:
        if node_id not in self.credentials:
            credential, digest = new_token()  # what /register hands out (its exchange has its own tests)
            with session_scope(self.settings) as s:
                node = s.get(Node, node_id)
                node.credential_sha256 = digest
                node.agent_url = f"http://agent-{node_id}.test"
            self.credentials[node_id] = credential
        return self.credentials[node_id]

    async def heartbeat(self, node_id: uuid.UUID, reports: list[dict]) -> dict:
        r = await self.client.post("/internal/v1/agents/heartbeat", json={"replicas": reports},
                                   headers={"Authorization": f"Bearer {self._credential(node_id)}"})
        assert r.status_code == 200, r.text
        return r.json()

    async def obey(self) -> None:
        """One heartbeat per live node: every replica its list wants running is reported ready,
        every one it wants stopped is reported stopped (an agent that drained it)."""
        with session_scope(self.settings) as s:
            live = s.scalars(select(Node.id).where(Node.state.in_([NodeState.booting, NodeState.ready]))).all()
        for node_id in live:
            answer = await self.heartbeat(node_id, [])
            reports = [{"id": e["id"], "slot": e["gpu_ids"][0], "gpu_ids": e["gpu_ids"],
                        "state": "ready" if e["desired_state"] == "running" else "stopped",
                        "url": f"http://{node_id}:{30000 + e['gpu_ids'][0]}"} for e in answer["replicas"]]
            if reports:
                await self.heartbeat(node_id, reports)


def serving(settings) -> dict[uuid.UUID, list[Replica]]:
    """Ready replicas that take traffic, by pool: the pool's own, spares aside (spares serve too,
    but a pool's floor is its own replicas: ``fleet.spares``)."""
    out: dict[uuid.UUID, list[Replica]] = defaultdict(list)
    with session_scope(settings) as s:
        for r in s.scalars(select(Replica).where(Replica.state == ReplicaState.ready, Replica.spare.is_(False),
                                                 Replica.desired_state == ReplicaDesiredState.running)):
            out[r.pool_id].append(r)
    return out


def live_nodes(settings) -> list[Node]:
    with session_scope(settings) as s:
        return list(s.scalars(select(Node).where(Node.state.in_([NodeState.pending, NodeState.provisioning,
                                                                 NodeState.booting, NodeState.ready]))))


async def shrunk_pools(client, admin, settings, clouds: Clouds, agents: AgentsByHand, aws_template,
                       names: tuple[str, ...]) -> list[dict]:
    """One pool per name, each filling a 4-GPU node of its own and then shrunk to one replica:
    as many nodes as pools, each a quarter used, consolidation still off."""
    r = await client.post("/admin/v1/catalog/import", json=catalog(aws_template, H100_4), headers=admin)
    assert r.status_code == 200, r.text
    pools = []
    for name in names:
        pool = await make_pool(client, admin, settings, gpu_count=1, replicas=4, name=name)
        converge(settings, clouds)
        await agents.obey()
        pools.append(pool)
    for pool in pools:
        set_desired(settings, pool["id"], 1)
    tick(settings)
    await agents.obey()  # the surplus drains and stops
    tick(settings)
    assert len(live_nodes(settings)) == len(names)
    return pools


async def test_three_quarter_used_nodes_become_one_without_dropping_below_the_floor(
        client, admin, settings, aws, ec2, aws_template):
    settings = settings.model_copy(update={"empty_node_ttl_s": 0, "consolidation_settle_s": 0,
                                           "consolidation_enabled": False})
    clouds = Clouds(aws=aws)
    agents = AgentsByHand(client, settings)
    pools = await shrunk_pools(client, admin, settings, clouds, agents, aws_template, ("a", "b", "c"))
    assert {len(v) for v in serving(settings).values()} == {1}

    settings = settings.model_copy(update={"consolidation_enabled": True})
    moves = 0
    for _ in range(20):
        result = tick(settings)
        moves += result.moves
        run_due(settings, clouds)
        # Make-before-break: between every step, each pool still has its one ready replica.
        assert all(len(serving(settings)[uuid.UUID(p["id"])]) >= 1 for p in pools)
        assert_no_gpu_twice(settings)
        await agents.obey()
        assert all(len(serving(settings)[uuid.UUID(p["id"])]) >= 1 for p in pools)
        if len(live_nodes(settings)) == 1 and not result.moves:
            break
    converge(settings, clouds)
    assert moves == 2  # two replicas moved, onto the node that stays
    [node] = live_nodes(settings)
    assert len(live_instances(ec2, settings.cluster_name)) == 1
    final = serving(settings)
    assert {p: len(v) for p, v in final.items()} == {uuid.UUID(p["id"]): 1 for p in pools}
    assert {r.node_id for v in final.values() for r in v} == {node.id}
    with session_scope(settings) as s:
        moved = s.scalars(select(Replica).where(Replica.replaces_id.is_not(None))).all()
        assert len(moved) == 2 and all(r.state == ReplicaState.ready for r in moved)
        originals = [s.get(Replica, r.replaces_id) for r in moved]
        assert all(o.state == ReplicaState.stopped for o in originals)


async def test_a_node_a_consolidation_emptied_goes_without_waiting_out_the_empty_node_ttl(
        client, admin, settings, aws, ec2, aws_template):
    """The empty-node TTL is for nodes a scale-down happened to empty; a node a consolidation
    emptied on purpose goes as soon as its last original stopped (bench.fleet: the TTL on those
    nodes was about half of the empty nodes' cost)."""
    settings = settings.model_copy(update={"empty_node_ttl_s": 3600, "consolidation_settle_s": 0,
                                           "consolidation_enabled": False})
    clouds = Clouds(aws=aws)
    agents = AgentsByHand(client, settings)
    pools = await shrunk_pools(client, admin, settings, clouds, agents, aws_template, ("a", "b"))

    settings = settings.model_copy(update={"consolidation_enabled": True})
    for _ in range(20):
        result = tick(settings)
        run_due(settings, clouds)
        assert all(len(serving(settings)[uuid.UUID(p["id"])]) >= 1 for p in pools)
        await agents.obey()
        if len(live_nodes(settings)) == 1 and not result.moves:
            break
    converge(settings, clouds)
    [node] = live_nodes(settings)  # the emptied one went, an hour-long TTL notwithstanding
    assert len(live_instances(ec2, settings.cluster_name)) == 1
    with session_scope(settings) as s:
        gone = s.scalars(select(Node).where(Node.id != node.id)).all()
        assert [n.state for n in gone] == [NodeState.terminated]
        assert (gone[0].metrics or {}).get("consolidation", {}).get("kind") == "delete"

    # a node a scale-down empties still waits out the TTL
    set_desired(settings, pools[0]["id"], 0)
    set_desired(settings, pools[1]["id"], 0)
    tick(settings)
    await agents.obey()
    tick(settings)
    run_due(settings, clouds)
    assert [n.id for n in live_nodes(settings)] == [node.id]
