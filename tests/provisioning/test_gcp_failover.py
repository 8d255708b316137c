"""GCP through the real google-cloud-compute client against the GCE REST double: launch, scale,
capacity/quota failover, the shared blocklist, capacity-unavailable with recovery, spot preemption."""

from __future__ import annotations

import asyncio
import datetime as dt

from sqlalchemy import select

from controlplane.db.engine import session_scope
from controlplane.fleet import sweeper
from controlplane.models import CapacityBlock, NodeState, OperationKind
from infra.bootstrap import parse_user_data
from tests.infra.gce_double import InjectedError
from tests.provisioning.celery_harness import celery_running
from tests.provisioning.conftest import Clouds, gcp_catalog, setup_pool
from tests.provisioning.helpers import converge, nodes, operations, pool_row, run_due, tick, wait_for

CENTRAL = [{"cloud": "gcp", "region": "us-central1"}]
BOTH = [*CENTRAL, {"cloud": "gcp", "region": "us-east4"}]


def capacity(zone: str, times: int = 1) -> InjectedError:
    return InjectedError(zone, "ZONE_RESOURCE_POOL_EXHAUSTED", f"The zone '{zone}' does not have enough resources",
                         times=times)


async def test_pool_launches_from_template_with_labels_and_user_data_then_scales_down(
    client, admin, settings, gce, gcp
):
    pool = await setup_pool(client, admin, gcp_catalog(), CENTRAL, min_replicas=2, max_replicas=2)
    converge(settings, Clouds(gcp=gcp))
    booted = nodes(settings, pool["id"], NodeState.booting)
    assert len(booted) == 2 and len(gce.instances) == 2
    for node in booted:
        zone, name = node.instance_id.split("/")
        resource = gce.instances[(zone, name)]
        labels = resource["labels"]
        assert labels["managed-by"] == "nimbus" and labels["nimbus-cluster"] == settings.cluster_name
        assert labels["nimbus-node-id"] == str(node.id) and labels["nimbus-pool-id"] == pool["id"]
        assert resource["sourceInstanceTemplate"].endswith("instanceTemplates/nimbus-gpu-1")
        metadata = {i["key"]: i["value"] for i in resource["metadata"]["items"]}
        config = parse_user_data(metadata["user-data"])
        assert config.node_id == str(node.id) and config.cloud == "gcp" and config.zone == zone
        assert metadata["enable-oslogin"] == "TRUE"  # the template's security metadata survives
    r = await client.patch(f"/admin/v1/pools/{pool['id']}", json={"min_replicas": 1, "max_replicas": 1},
                           headers=admin)
    assert r.status_code == 200
    converge(settings, Clouds(gcp=gcp))
    assert len(gce.instances) == 1
    assert len(nodes(settings, pool["id"], NodeState.terminated)) == 1


async def test_capacity_error_in_first_zone_launches_in_the_next(client, admin, settings, gce, gcp):
    gce.inject(capacity("us-central1-a"))
    pool = await setup_pool(client, admin, gcp_catalog(), CENTRAL, min_replicas=1, max_replicas=1)
    converge(settings, Clouds(gcp=gcp))
    [node] = nodes(settings, pool["id"], NodeState.booting)
    assert node.zone == "us-central1-b"
    [op] = operations(settings, pool["id"], OperationKind.launch)
    assert [(h["zone"], h["ok"], h["error_code"], h["error_scope"]) for h in op.history] == [
        ("us-central1-a", False, "ZONE_RESOURCE_POOL_EXHAUSTED", "zone"),
        ("us-central1-b", True, None, None),
    ]
    with session_scope(settings) as s:
        [block] = s.scalars(select(CapacityBlock)).all()
        assert (block.scope.value, block.zone) == ("zone", "us-central1-a")
        assert block.expires_at > dt.datetime.now(dt.UTC)
    # The block is shared: the next node skips the zone without asking the cloud.
    r = await client.patch(f"/admin/v1/pools/{pool['id']}", json={"min_replicas": 2, "max_replicas": 2},
                           headers=admin)
    assert r.status_code == 200
    converge(settings, Clouds(gcp=gcp))
    second = operations(settings, pool["id"], OperationKind.launch)[1]
    assert [h["zone"] for h in second.history] == ["us-central1-b"]


async def test_quota_error_moves_to_the_next_region(client, admin, settings, gce, gcp, tmp_path, celery_keys_cleanup):
    gce.inject(InjectedError("us-central1-a", "QUOTA_EXCEEDED", "Quota 'NVIDIA_L4_GPUS' exceeded in region us-central1"))
    pool = await setup_pool(client, admin, gcp_catalog(), BOTH, min_replicas=1, max_replicas=1)
    with celery_running(settings, Clouds(gcp=gcp), tmp_path):  # a real worker and beat, Redis broker
        [node] = wait_for(lambda: nodes(settings, pool["id"], NodeState.booting), timeout=60)
    assert (node.region, node.zone) == ("us-east4", "us-east4-a")
    [op] = operations(settings, pool["id"], OperationKind.launch)
    # us-central1-b was never tried: the quota error blocked the whole region.
    assert [(h["zone"], h["error_scope"]) for h in op.history] == [("us-central1-a", "region"), ("us-east4-a", None)]


async def test_everything_blocked_reports_capacity_unavailable_and_recovers(client, admin, settings, gce, gcp):
    settings = settings.model_copy(update={"block_zone_s": 2.0})
    for zone in ("us-central1-a", "us-central1-b", "us-east4-a"):
        gce.inject(capacity(zone))
    pool = await setup_pool(client, admin, gcp_catalog(), BOTH, min_replicas=1, max_replicas=1)
    tick(settings)
    assert run_due(settings, Clouds(gcp=gcp)) == ["retry"]
    r = await client.get(f"/admin/v1/pools/{pool['id']}", headers=admin)
    assert r.json()["capacity_status"] == "capacity_unavailable"
    r = await client.get("/admin/v1/operations", params={"pool_id": pool["id"]}, headers=admin)
    [op] = r.json()["items"]
    assert op["state"] == "pending" and op["kind"] == "launch"
    assert [(h["zone"], h["error_code"]) for h in op["history"]] == [
        ("us-central1-a", "ZONE_RESOURCE_POOL_EXHAUSTED"),
        ("us-central1-b", "ZONE_RESOURCE_POOL_EXHAUSTED"),
        ("us-east4-a", "ZONE_RESOURCE_POOL_EXHAUSTED"),
    ]
    # While every zone is blocked nothing is retried against the cloud.
    assert run_due(settings, Clouds(gcp=gcp)) == []
    assert nodes(settings, pool["id"], NodeState.provisioning)
    await asyncio.sleep(2.2)  # the blocks expire; the operation's next attempt is due exactly then
    assert run_due(settings, Clouds(gcp=gcp)) == ["launched"]
    assert pool_row(settings, pool["id"]).capacity_status is None
    [node] = nodes(settings, pool["id"], NodeState.booting)
    assert node.zone == "us-central1-a"
    r = await client.get(f"/admin/v1/operations/{op['id']}", headers=admin)
    assert r.json()["state"] == "succeeded" and r.json()["history"][-1]["ok"] is True


async def test_preempted_spot_node_is_replaced_in_another_zone(client, admin, settings, gce, gcp):
    pool = await setup_pool(client, admin, gcp_catalog(), CENTRAL, min_replicas=1, max_replicas=1,
                            spot_policy="spot")
    converge(settings, Clouds(gcp=gcp))
    [first] = nodes(settings, pool["id"], NodeState.booting)
    assert first.spot and first.zone == "us-central1-a"
    gce.preempt(*first.instance_id.split("/"))
    later = dt.datetime.now(dt.UTC) + sweeper.LISTING_GRACE + dt.timedelta(seconds=1)
    result = sweeper.sweep(settings, Clouds(gcp=gcp), clock=lambda: later)
    assert result.lost == [first.id] and not result.orphans
    converge(settings, Clouds(gcp=gcp))
    [gone] = nodes(settings, pool["id"], NodeState.terminated)
    assert gone.id == first.id and gone.error.startswith("preempted")
    [replacement] = nodes(settings, pool["id"], NodeState.booting)
    assert replacement.zone == "us-central1-b" and replacement.spot


async def test_spot_exhausted_everywhere_falls_back_to_on_demand(client, admin, settings, gce, gcp):
    for zone in ("us-central1-a", "us-central1-b"):
        gce.inject(capacity(zone))  # one refusal per zone: the spot attempts
    pool = await setup_pool(client, admin, gcp_catalog(), CENTRAL, min_replicas=1, max_replicas=1,
                            spot_policy="spot_with_fallback")
    converge(settings, Clouds(gcp=gcp))
    [node] = nodes(settings, pool["id"], NodeState.booting)
    assert node.spot is False and node.zone == "us-central1-a"
    [op] = operations(settings, pool["id"], OperationKind.launch)
    assert [(h["zone"], h["spot"], h["ok"]) for h in op.history] == [
        ("us-central1-a", True, False), ("us-central1-b", True, False), ("us-central1-a", False, True)]
    zone, name = node.instance_id.split("/")
    assert "scheduling" not in gce.instances[(zone, name)] or \
        gce.instances[(zone, name)]["scheduling"].get("provisioningModel") != "SPOT"
