"""Sweeps (orphans, stale nodes), terminations retried to a deadline, and results dropped after a lost lease."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from typing import Any

from sqlalchemy import select

from controlplane.db.engine import session_scope
from controlplane.db.types import utcnow
from controlplane.fleet import launcher, sweeper, terminator
from controlplane.models import (
    NodeState,
    OperationKind,
    OperationState,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
)
from infra.provider import Instance, LaunchRequest
from tests.provisioning.conftest import Clouds, aws_catalog, setup_pool
from tests.provisioning.helpers import converge, node_operations, nodes, operations, run_due, tick

EAST = [{"cloud": "aws", "region": "us-east-1"}]


def live(ec2: Any, **tags: str) -> set[str]:
    filters = [{"Name": f"tag:{k}", "Values": [v]} for k, v in tags.items()]
    filters.append({"Name": "instance-state-name", "Values": ["pending", "running"]})
    return {i["InstanceId"] for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]}


def run_tagged(ec2: Any, image: str, **tags: str) -> str:
    return ec2.run_instances(
        ImageId=image, MinCount=1, MaxCount=1, InstanceType="g5.xlarge",
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
    )["Instances"][0]["InstanceId"]


async def test_sweep_terminates_only_untracked_vms_of_this_cluster(
    client, admin, settings, aws, ec2, aws_template, moto_ami
):
    pool = await setup_pool(client, admin, aws_catalog(aws_template), EAST, min_replicas=1, max_replicas=1)
    converge(settings, Clouds(aws=aws))
    [node] = nodes(settings, pool["id"])
    ours = {"managed-by": "nimbus", "nimbus-cluster": settings.cluster_name}
    orphan = run_tagged(ec2, moto_ami, **ours, **{"nimbus-node-id": str(uuid.uuid4())})
    duplicate = run_tagged(ec2, moto_ami, **ours, **{"nimbus-node-id": str(node.id)})
    foreign = run_tagged(ec2, moto_ami, **{"managed-by": "nimbus", "nimbus-cluster": "someone-else",
                                           "nimbus-node-id": str(uuid.uuid4())})
    result = sweeper.sweep(settings, Clouds(aws=aws))
    assert sorted(result.orphans) == sorted([orphan, duplicate])
    assert not result.lost and not result.stale and result.listed == [("aws", "us-east-1")]
    assert live(ec2, **{"nimbus-cluster": settings.cluster_name}) == {node.instance_id}
    assert foreign in live(ec2, **{"nimbus-cluster": "someone-else"})


async def test_node_without_heartbeat_is_replaced(client, admin, settings, aws, ec2, aws_template):
    pool = await setup_pool(client, admin, aws_catalog(aws_template), EAST, min_replicas=1, max_replicas=1)
    converge(settings, Clouds(aws=aws))
    [silent] = nodes(settings, pool["id"])
    later = utcnow() + dt.timedelta(seconds=settings.boot_timeout_s + 1)
    result = sweeper.sweep(settings, Clouds(aws=aws), clock=lambda: later)
    assert result.stale == [silent.id] and not result.lost
    converge(settings, Clouds(aws=aws))
    [old] = nodes(settings, pool["id"], NodeState.terminated)
    assert old.id == silent.id and old.error.startswith("stale: no heartbeat")
    [replacement] = nodes(settings, pool["id"], NodeState.booting)
    assert live(ec2, **{"nimbus-cluster": settings.cluster_name}) == {replacement.instance_id}
    # The replica went with its node; the pool's one replica was placed again, on the new node.
    with session_scope(settings) as s:
        states = {(r.node_id, r.state, r.desired_state) for r in s.scalars(
            select(Replica).where(Replica.pool_id == uuid.UUID(pool["id"])))}
    assert states == {(silent.id, ReplicaState.failed, ReplicaDesiredState.stopped),
                      (replacement.id, ReplicaState.pending, ReplicaDesiredState.running)}


class StubbornCloud:
    """Test double around a real provider: accepts terminate calls and ignores them."""

    def __init__(self, inner) -> None:
        self.inner, self.cloud, self.terminate_calls = inner, inner.cloud, 0

    def terminate(self, region: str, instance_id: str) -> None:
        self.terminate_calls += 1

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def test_termination_retries_until_its_deadline_then_the_sweeper_takes_over(
    client, admin, settings, aws, ec2, aws_template
):
    # A node left empty is released at once (no TTL), so scaling to zero terminates it on the next tick.
    settings = settings.model_copy(update={"terminate_deadline_s": 1.5, "retry_delay_s": 0.3, "empty_node_ttl_s": 0})
    pool = await setup_pool(client, admin, aws_catalog(aws_template), EAST, min_replicas=1, max_replicas=1)
    converge(settings, Clouds(aws=aws))
    [node] = nodes(settings, pool["id"])
    r = await client.patch(f"/admin/v1/pools/{pool['id']}", json={"kind": "scale_to_zero", "min_replicas": 0},
                           headers=admin)
    assert r.status_code == 200, r.text
    r = await client.patch(f"/admin/v1/pools/{pool['id']}", json={"max_replicas": 0}, headers=admin)
    assert r.status_code == 200, r.text
    stubborn = StubbornCloud(aws)
    result = tick(settings)
    assert (result.stopped, result.terminated) == (1, 1)  # the replica (never started) at once, then its node
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and nodes(settings, pool["id"], NodeState.terminating):
        run_due(settings, Clouds(aws=stubborn))
        await asyncio.sleep(0.1)
    [op] = node_operations(settings, node.id, OperationKind.terminate)
    assert (op.id, OperationKind.terminate) in result.operations
    assert op.state == OperationState.failed and "deadline" in op.error
    assert stubborn.terminate_calls >= 2 and len(op.history) == stubborn.terminate_calls
    assert all(h["ok"] is False for h in op.history)
    [failed] = nodes(settings, pool["id"])
    assert failed.state == NodeState.failed and node.instance_id in live(ec2, **{"nimbus-cluster": settings.cluster_name})
    result = sweeper.sweep(settings, Clouds(aws=aws))  # the VM of a failed node is an orphan
    assert result.orphans == [node.instance_id]
    assert not live(ec2, **{"nimbus-cluster": settings.cluster_name})


class OverlappingWorker:
    """Test double around a real provider: the first launch call stalls past the lease while a
    second worker runs the same operation to completion."""

    def __init__(self, inner, settings, op_id) -> None:
        self.inner, self.cloud = inner, inner.cloud
        self.settings, self.op_id = settings, op_id
        self.second: str | None = None

    def launch(self, req: LaunchRequest) -> Instance:
        if self.second is None:
            after_lease = utcnow() + dt.timedelta(seconds=self.settings.lease_seconds + 1)
            self.second = launcher.execute(self.settings, Clouds(aws=self.inner), self.op_id, clock=lambda: after_lease)
        return self.inner.launch(req)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def test_result_of_a_worker_that_lost_its_lease_is_dropped(client, admin, settings, aws, ec2, aws_template):
    pool = await setup_pool(client, admin, aws_catalog(aws_template), EAST, min_replicas=1, max_replicas=1)
    [(op_id, _)] = tick(settings).operations
    slow = OverlappingWorker(aws, settings, op_id)
    assert launcher.execute(settings, Clouds(aws=slow), op_id) == "lease lost"
    assert slow.second == "launched"
    [node] = nodes(settings, pool["id"])
    [op] = operations(settings, pool["id"], OperationKind.launch)
    assert op.state == OperationState.succeeded and op.attempts == 2 and op.lock_token is None
    assert [h["attempt"] for h in op.history] == [2]  # only the lease holder wrote history
    # Same operation, same candidate, same idempotency token: both calls got the one VM.
    assert live(ec2, **{"nimbus-node-id": str(node.id)}) == {node.instance_id}
    assert terminator.execute(settings, Clouds(aws=aws), op_id) == "skipped"  # wrong kind: never run
