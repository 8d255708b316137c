"""GPUs are the unit of capacity, on the real pipeline: Postgres, the fleet tick, the launcher and
the terminator against the moto EC2 server.

A pool's ``desired_replicas`` counts replicas, never nodes; replicas are packed into the GPU slots
of shared nodes and the rest goes onto the cheapest mix of shapes.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from sqlalchemy import select, update

from controlplane.db.engine import session_scope
from controlplane.models import Node, NodeState, Pool, Replica, ReplicaDesiredState, ReplicaState
from tests.controlplane.factories import unique
from tests.infra.conftest import AWS_REGION
from tests.provisioning.conftest import Clouds, _itype
from tests.provisioning.helpers import converge, tick

H100_8 = _itype("p5.48xlarge", "h100", 8, 80, 55.04, None)
H100_4 = _itype("p5.24xlarge", "h100", 4, 80, 28.20, None)  # 7.05 per GPU-hour
H100_1 = _itype("p5.4xlarge", "h100", 1, 80, 7.57, None)


def catalog(template: str, *types: dict) -> dict:
    return {"version": 1, "generated_by": "tests", "clouds": [{"name": "aws", "regions": [{
        "name": AWS_REGION, "template": {"kind": "aws_launch_template", "id": template},
        "zones": [{"name": "us-east-1a"}, {"name": "us-east-1b"}], "instance_types": list(types)}]}]}


async def make_pool(client, admin, settings, gpu_count: int, replicas: int, name: str | None = None) -> dict:
    model = {"name": unique(name or "m"), "variants": [{
        "tier": "bf16", "model_path": "meta-llama/Llama-3.1-8B-Instruct", "gpu_memory_gb": 40,
        "gpu_count": gpu_count, "gpu_types": ["h100"], "context_length": 8192}]}
    r = await client.post("/admin/v1/models", json=model, headers=admin)
    assert r.status_code == 201, r.text
    body = {"name": unique("pool"), "variant_id": r.json()["variants"][0]["id"],
            "placement": [{"cloud": "aws", "region": AWS_REGION}], "min_replicas": 0, "max_replicas": 16}
    r = await client.post("/admin/v1/pools", json=body, headers=admin)
    assert r.status_code == 201, r.text
    pool = r.json()
    set_desired(settings, pool["id"], replicas)
    return pool


def set_desired(settings, pool_id: str, n: int) -> None:
    with session_scope(settings) as s:
        s.execute(update(Pool).where(Pool.id == uuid.UUID(pool_id)).values(desired_replicas=n))


def live_instances(ec2: Any, cluster: str) -> list[dict]:
    res = ec2.describe_instances(Filters=[{"Name": "tag:nimbus-cluster", "Values": [cluster]},
                                          {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    return [i for r in res["Reservations"] for i in r["Instances"]]


def replicas(settings, pool_id: str | None = None) -> list[Replica]:
    with session_scope(settings) as s:
        stmt = select(Replica).where(Replica.desired_state == ReplicaDesiredState.running)
        if pool_id:
            stmt = stmt.where(Replica.pool_id == uuid.UUID(pool_id))
        return list(s.scalars(stmt))


def assert_no_gpu_twice(settings) -> None:
    """No GPU is held by two replicas, but for one case: a spare told to stop because a replica
    was placed on its GPUs (``fleet.spares``), while that replica has not started (its agent
    starts it once the spare's engine has let the GPUs go: tests/agent cover the wait)."""
    with session_scope(settings) as s:
        held = s.execute(select(Replica.node_id, Replica.gpu_ids, Replica.spare, Replica.desired_state, Replica.state)
                         .where(Replica.state.not_in([ReplicaState.stopped, ReplicaState.failed]))).all()
        totals = dict(s.execute(select(Node.id, Node.gpus_total)).all())
    seen: dict[uuid.UUID, set[int]] = {}
    evicted: dict[uuid.UUID, set[int]] = {}
    waiting: dict[uuid.UUID, set[int]] = {}
    for node_id, gpus, spare, desired, state in held:
        assert all(0 <= g < totals[node_id] for g in gpus)
        if spare and desired == ReplicaDesiredState.stopped:
            evicted.setdefault(node_id, set()).update(gpus)
            continue
        taken = seen.setdefault(node_id, set())
        assert not taken & set(gpus), f"GPU handed out twice on node {node_id}: {gpus} vs {taken}"
        taken.update(gpus)
        if state == ReplicaState.pending:
            waiting.setdefault(node_id, set()).update(gpus)
    for node_id, gpus in evicted.items():
        shared = gpus & seen.get(node_id, set())
        assert shared <= waiting.get(node_id, set()), f"a stopping spare's GPUs {shared} run another engine"


async def test_three_one_gpu_replicas_on_eight_gpu_shapes_launch_one_instance(
        client, admin, settings, aws, ec2, aws_template):
    r = await client.post("/admin/v1/catalog/import", json=catalog(aws_template, H100_8), headers=admin)
    assert r.status_code == 200, r.text
    pool = await make_pool(client, admin, settings, gpu_count=1, replicas=3)
    converge(settings, Clouds(aws=aws))
    [instance] = live_instances(ec2, settings.cluster_name)
    assert instance["InstanceType"] == "p5.48xlarge"
    placed = replicas(settings, pool["id"])
    assert len(placed) == 3  # exactly three engines, not 8 per node
    assert len({r.node_id for r in placed}) == 1
    assert sorted(g for r in placed for g in r.gpu_ids) == [0, 1, 2]
    assert_no_gpu_twice(settings)
    # Ticking again changes nothing: the placed replicas count, whatever their state.
    again = tick(settings)
    assert (again.placed, again.launched, again.stopped) == (0, 0, 0)


async def test_one_and_two_gpu_pools_share_one_node(client, admin, settings, aws, ec2, aws_template):
    r = await client.post("/admin/v1/catalog/import", json=catalog(aws_template, H100_8), headers=admin)
    assert r.status_code == 200, r.text
    small = await make_pool(client, admin, settings, gpu_count=1, replicas=2, name="small")
    large = await make_pool(client, admin, settings, gpu_count=2, replicas=2, name="large")
    converge(settings, Clouds(aws=aws))
    assert len(live_instances(ec2, settings.cluster_name)) == 1
    both = replicas(settings, small["id"]) + replicas(settings, large["id"])
    assert len({r.node_id for r in both}) == 1
    assert Counter(len(r.gpu_ids) for r in both) == {1: 2, 2: 2}
    assert_no_gpu_twice(settings)
    # The 2-GPU replicas sit on aligned pairs (tensor parallel wants neighbours).
    assert all(r.gpu_ids[0] % 2 == 0 and r.gpu_ids[1] == r.gpu_ids[0] + 1
               for r in replicas(settings, large["id"]))


async def test_cheapest_shape_mix(client, admin, settings, aws, ec2, aws_template):
    """Six 1-GPU replicas: 8 GPUs cost $55.04, 4+1+1 $43.34, 4+4 $56.40, six 1-GPU $45.42."""
    r = await client.post("/admin/v1/catalog/import", json=catalog(aws_template, H100_1, H100_4, H100_8),
                          headers=admin)
    assert r.status_code == 200, r.text
    pool = await make_pool(client, admin, settings, gpu_count=1, replicas=6)
    converge(settings, Clouds(aws=aws))
    launched = Counter(i["InstanceType"] for i in live_instances(ec2, settings.cluster_name))
    assert launched == {"p5.24xlarge": 1, "p5.4xlarge": 2}
    assert len(replicas(settings, pool["id"])) == 6
    assert_no_gpu_twice(settings)


async def test_scale_down_stops_a_replica_not_its_node(client, admin, settings, aws, ec2, aws_template):
    settings = settings.model_copy(update={"empty_node_ttl_s": 0})
    r = await client.post("/admin/v1/catalog/import", json=catalog(aws_template, H100_8), headers=admin)
    assert r.status_code == 200, r.text
    pool = await make_pool(client, admin, settings, gpu_count=1, replicas=3)
    converge(settings, Clouds(aws=aws))
    [node_id] = {r.node_id for r in replicas(settings, pool["id"])}
    set_desired(settings, pool["id"], 2)
    result = tick(settings)
    assert result.stopped == 1 and result.terminated == 0
    with session_scope(settings) as s:
        node = s.get(Node, node_id)
        assert node.state in (NodeState.booting, NodeState.ready)
        stopping = s.scalars(select(Replica).where(Replica.desired_state == ReplicaDesiredState.stopped)).all()
    assert len(stopping) == 1
    assert len(replicas(settings, pool["id"])) == 2
    # The node goes only once it holds nothing. No agent ever ran these replicas (no engine to
    # drain), so scaling to zero empties the node at once, and with a zero TTL it is released.
    set_desired(settings, pool["id"], 0)
    result = tick(settings)
    assert (result.stopped, result.terminated) == (2, 1)
    converge(settings, Clouds(aws=aws))
    assert live_instances(ec2, settings.cluster_name) == []
