"""AWS end to end: admin API → Celery beat/worker on Redis → moto server over HTTP, and back.

The catalog has one 1-GPU shape, so a pool of three 1-GPU replicas needs three nodes (packing
several replicas onto one bigger node is tests/provisioning/test_gpu_packing.py)."""

from __future__ import annotations

import base64
import uuid
from typing import Any

from sqlalchemy import select

from controlplane.db.engine import session_scope
from controlplane.models import NodeState, Replica, ReplicaDesiredState, ReplicaState
from controlplane.services.secrets import sha256_hex
from infra.bootstrap import parse_user_data
from tests.provisioning.celery_harness import celery_running
from tests.provisioning.conftest import Clouds, aws_catalog, setup_pool
from tests.provisioning.helpers import nodes, wait_for


def instances(ec2: Any, cluster: str, *states: str) -> list[dict]:
    filters = [{"Name": "tag:nimbus-cluster", "Values": [cluster]}]
    if states:
        filters.append({"Name": "instance-state-name", "Values": list(states)})
    res = ec2.describe_instances(Filters=filters)
    return [i for r in res["Reservations"] for i in r["Instances"]]


def running_replicas(settings, pool_id: str) -> list[Replica]:
    with session_scope(settings) as s:
        return list(s.scalars(select(Replica).where(Replica.pool_id == uuid.UUID(pool_id),
                                                    Replica.desired_state == ReplicaDesiredState.running)))


async def test_pool_of_three_then_scale_to_one(
    client, admin, settings, aws, ec2, aws_template, tmp_path, celery_keys_cleanup
):
    settings = settings.model_copy(update={"empty_node_ttl_s": 1})  # emptied nodes go within a tick or two
    pool = await setup_pool(client, admin, aws_catalog(aws_template), [{"cloud": "aws", "region": "us-east-1"}],
                            min_replicas=3, max_replicas=3)
    with celery_running(settings, Clouds(aws=aws), tmp_path):
        booted = wait_for(lambda: len(nodes(settings, pool["id"], NodeState.booting)) == 3 and
                          nodes(settings, pool["id"], NodeState.booting), timeout=60)
        live = instances(ec2, settings.cluster_name, "pending", "running")
        assert len(live) == 3
        by_node = {n.instance_id: n for n in booted}
        assert set(by_node) == {i["InstanceId"] for i in live}
        placed = running_replicas(settings, pool["id"])
        assert sorted(r.node_id for r in placed) == sorted(n.id for n in booted)  # one replica per node
        assert all(r.gpu_ids == [0] for r in placed)
        for inst in live:
            node = by_node[inst["InstanceId"]]
            tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
            assert tags["managed-by"] == "nimbus"
            assert tags["nimbus-cluster"] == settings.cluster_name
            assert tags["nimbus-node-id"] == str(node.id)
            assert not any(k.startswith("nimbus-pool") for k in tags)  # a node belongs to no pool
            assert tags["aws:ec2launchtemplate:id"] == aws_template
            assert inst["InstanceType"] == "g5.xlarge"
            assert inst["Placement"]["AvailabilityZone"] == node.zone
            raw = ec2.describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")
            text = base64.b64decode(raw["UserData"]["Value"]).decode()
            config = parse_user_data(text)
            assert config is not None
            assert config.node_id == str(node.id)
            assert config.control_plane_url == settings.public_url
            # Which replicas to run comes over the agent API once it registers, not in user data.
            assert config.pool_id is None and config.variant == ""
            assert pool["id"] not in text and pool["variant_id"] not in text
            assert config.cluster == settings.cluster_name and config.zone == node.zone
            # Engine flags come over the authenticated agent API, never in user data.
            assert config.engine == "auto" and config.engine_args == ()
            assert config.artifact_source == "s3://nimbus-artifacts-us-east-1"
            # The one credential is the one-time token whose hash (only) the node row keeps.
            assert sha256_hex(config.bootstrap_token) == node.bootstrap_token_sha256
            assert config.bootstrap_token not in str(node.__dict__)
            assert settings.admin_token.get_secret_value() not in text
            assert node.gpus_total == 1 and node.spot is False

        r = await client.patch(f"/admin/v1/pools/{pool['id']}", json={"min_replicas": 1, "max_replicas": 1},
                               headers=admin)
        assert r.status_code == 200, r.text
        assert r.json()["desired_replicas"] == 1
        wait_for(lambda: len(nodes(settings, pool["id"], NodeState.terminated)) == 2, timeout=60)

    terminated = {n.instance_id for n in nodes(settings, pool["id"], NodeState.terminated)}
    assert {i["InstanceId"] for i in instances(ec2, settings.cluster_name, "terminated")} == terminated
    remaining = instances(ec2, settings.cluster_name, "pending", "running")
    [survivor] = nodes(settings, pool["id"], NodeState.booting)
    assert [i["InstanceId"] for i in remaining] == [survivor.instance_id]
    # Scale-down stopped two replicas (never started: at once); their emptied nodes were released,
    # and the one replica still wanted is the one on the node that stays.
    [kept] = running_replicas(settings, pool["id"])
    assert kept.node_id == survivor.id
    with session_scope(settings) as s:
        gone = s.scalars(select(Replica).where(Replica.pool_id == uuid.UUID(pool["id"]),
                                               Replica.desired_state == ReplicaDesiredState.stopped)).all()
    assert len(gone) == 2 and all(r.state == ReplicaState.stopped for r in gone)
    assert {r.node_id for r in gone} == {n.id for n in nodes(settings, pool["id"], NodeState.terminated)}
