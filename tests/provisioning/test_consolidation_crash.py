"""A consolidation *replace* survives a SIGKILL of the Celery worker that launches the cheaper node:
no duplicate replica, no missing replica, no leaked VM.

The fleet tick runs in this process (it only writes rows); the launch of the replacement node runs
in a real ``celery worker`` subprocess, which is killed while moto holds the RunInstances answer
(the VM exists, the worker never hears of it). The agents are played through the real agent API
(see test_consolidation_moves.py).
"""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter

from sqlalchemy import select

from controlplane.db.engine import session_scope
from controlplane.models import Node, NodeState, Replica, ReplicaDesiredState, ReplicaState
from tests.provisioning.conftest import Clouds
from tests.provisioning.helpers import converge, nodes, tick, wait_for
from tests.provisioning.slow_proxy import SlowProxy
from tests.provisioning.test_consolidation_moves import AgentsByHand, live_nodes, serving
from tests.provisioning.test_crash_safety import celery_worker, sender  # noqa: F401 (fixture)
from tests.provisioning.test_crash_safety import live_instances as tagged_instances
from tests.provisioning.test_gpu_packing import H100_4, H100_8, assert_no_gpu_twice, catalog, make_pool


def running_replicas(settings, pool_id: str) -> list[Replica]:
    """The pool's own replicas wanted running (spares on the nodes' free slots aside)."""
    with session_scope(settings) as s:
        return list(s.scalars(select(Replica).where(Replica.pool_id == uuid.UUID(pool_id), Replica.spare.is_(False),
                                                    Replica.desired_state == ReplicaDesiredState.running)))


async def test_sigkill_while_launching_the_replacement_node(
        client, admin, settings, aws, ec2, aws_template, moto_endpoint, sender, tmp_path):  # noqa: F811
    settings = settings.model_copy(update={"empty_node_ttl_s": 0, "consolidation_settle_s": 0,
                                           "lease_seconds": 4.0})
    clouds = Clouds(aws=aws)
    agents = AgentsByHand(client, settings)
    # Two 1-GPU replicas on the only shape there is: an 8-GPU node, a quarter used.
    r = await client.post("/admin/v1/catalog/import", json=catalog(aws_template, H100_8), headers=admin)
    assert r.status_code == 200, r.text
    pool = await make_pool(client, admin, settings, gpu_count=1, replicas=2)
    converge(settings.model_copy(update={"consolidation_enabled": False}), clouds)
    await agents.obey()
    [big] = live_nodes(settings)
    # A 4-GPU shape appears in the catalog: replacing the node saves $26.84/h.
    r = await client.post("/admin/v1/catalog/import", json=catalog(aws_template, H100_8, H100_4), headers=admin)
    assert r.status_code == 200, r.text
    result = tick(settings)
    assert result.moves == 2 and result.launched == 1
    [(op_id, _)] = [op for op in result.operations]
    new = next(n for n in live_nodes(settings) if n.id != big.id)
    assert new.launch_spec["instance_type"] == "p5.24xlarge"

    proxy = SlowProxy(moto_endpoint, hold_when=b"Action=RunInstances").start()
    try:
        with celery_worker(settings, proxy.url, tmp_path / "worker-1.log") as worker:
            sender.send_task("nimbus.execute_operation", args=(str(op_id), "launch"))
            assert proxy.forwarded.wait(timeout=60), (tmp_path / "worker-1.log").read_text()[-3000:]
            os.kill(worker.pid, signal.SIGKILL)  # the VM exists; its launch was never recorded
            worker.wait(timeout=10)
        proxy.holding = False
        proxy.release.set()
        assert len(tagged_instances(ec2, **{"nimbus-node-id": str(new.id)})) == 1
        # Mid-move: the originals still serve, the copies wait on a node that is not recorded yet.
        assert len(serving(settings)[uuid.UUID(pool["id"])]) == 2
        assert len(running_replicas(settings, pool["id"])) == 4

        with celery_worker(settings, moto_endpoint, tmp_path / "worker-2.log"):
            def booted():
                sender.send_task("nimbus.dispatch_operations")  # what beat does every few seconds
                return [n for n in nodes(settings, None, NodeState.booting) if n.id == new.id]

            [new] = wait_for(booted, timeout=60, interval=1.0)
        assert [v["InstanceId"] for v in tagged_instances(ec2, **{"nimbus-node-id": str(new.id)})] == [
            new.instance_id]
    finally:
        proxy.stop()

    # The copies come up, take over, the originals drain and stop, the old node goes.
    for _ in range(10):
        await agents.obey()
        tick(settings)
        converge(settings, clouds)
        assert len(serving(settings)[uuid.UUID(pool["id"])]) >= 2  # never below the floor
        assert_no_gpu_twice(settings)
        if [n.id for n in live_nodes(settings)] == [new.id]:
            break
    assert [n.id for n in live_nodes(settings)] == [new.id]
    final = running_replicas(settings, pool["id"])
    assert len(final) == 2 and {r.node_id for r in final} == {new.id}  # no duplicate, none missing
    assert all(r.state == ReplicaState.ready for r in final)
    with session_scope(settings) as s:
        assert s.get(Node, big.id).state in (NodeState.terminating, NodeState.terminated)
    vms = tagged_instances(ec2, **{"nimbus-cluster": settings.cluster_name})
    assert [v["InstanceId"] for v in vms] == [new.instance_id]  # no leaked VM
    assert Counter(v["InstanceType"] for v in vms) == {"p5.24xlarge": 1}
