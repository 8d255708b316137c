"""AWS end to end: admin API → Celery beat/worker on Redis → moto server over HTTP, and back."""

from __future__ import annotations

import base64
from typing import Any

from controlplane.models import NodeState
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


async def test_pool_of_three_then_scale_to_one(
    client, admin, settings, aws, ec2, aws_template, tmp_path, celery_keys_cleanup
):
    pool = await setup_pool(client, admin, aws_catalog(aws_template), [{"cloud": "aws", "region": "us-east-1"}],
                            min_replicas=3, max_replicas=3)
    with celery_running(settings, Clouds(aws=aws), tmp_path):
        booted = wait_for(lambda: len(nodes(settings, pool["id"], NodeState.booting)) == 3 and
                          nodes(settings, pool["id"], NodeState.booting), timeout=60)
        live = instances(ec2, settings.cluster_name, "pending", "running")
        assert len(live) == 3
        by_node = {n.instance_id: n for n in booted}
        assert set(by_node) == {i["InstanceId"] for i in live}
        for inst in live:
            node = by_node[inst["InstanceId"]]
            tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
            assert tags["managed-by"] == "nimbus"
            assert tags["nimbus-cluster"] == settings.cluster_name
            assert tags["nimbus-node-id"] == str(node.id)
            assert tags["nimbus-pool-id"] == pool["id"]
            assert tags["aws:ec2launchtemplate:id"] == aws_template
            assert inst["InstanceType"] == "g5.xlarge"
            assert inst["Placement"]["AvailabilityZone"] == node.zone
            raw = ec2.describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")
            text = base64.b64decode(raw["UserData"]["Value"]).decode()
            config = parse_user_data(text)
            assert config is not None
            assert config.node_id == str(node.id) and config.pool_id == pool["id"]
            assert config.control_plane_url == settings.public_url
            assert config.variant == pool["variant_id"]
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
    assert [i["InstanceId"] for i in remaining] == [n.instance_id for n in nodes(settings, pool["id"], NodeState.booting)]
    # The newest nodes went first (none was ready, so age decides).
    survivor = nodes(settings, pool["id"], NodeState.booting)[0]
    assert all(survivor.created_at <= n.created_at for n in nodes(settings, pool["id"]))
