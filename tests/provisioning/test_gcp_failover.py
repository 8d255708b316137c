"""GCP through the real google-cloud-compute client against the GCE REST double: launch, scale,
capacity/quota failover, the shared blocklist, capacity-unavailable with recovery, spot preemption.

A launch walks only the zones of the shape placement planned for its node (cloud, region, instance
type, market: the node's ``launch_spec``); a capacity error blocks that zone, a quota error the
region. Going to another region or market is placement's job on a later fleet tick: it drops the
offers that blocks cover."""

from __future__ import annotations

import asyncio
import datetime as dt

from sqlalchemy import select

from controlplane.db.engine import session_scope
from controlplane.fleet import sweeper
from controlplane.models import CapacityBlock, NodeState, OperationKind, Replica, ReplicaDesiredState
from infra.bootstrap import parse_user_data
from tests.controlplane.factories import create_pool, unique
from tests.infra.gce_double import InjectedError
from tests.provisioning.conftest import Clouds, gcp_catalog, setup_pool
from tests.provisioning.helpers import converge, node_operations, nodes, operations, pool_row, run_due, tick

CENTRAL = [{"cloud": "gcp", "region": "us-central1"}]
BOTH = [*CENTRAL, {"cloud": "gcp", "region": "us-east4"}]


def capacity(zone: str, times: int = 1) -> InjectedError:
    return InjectedError(zone, "ZONE_RESOURCE_POOL_EXHAUSTED", f"The zone '{zone}' does not have enough resources",
                         times=times)


async def test_pool_launches_from_template_with_labels_and_user_data_then_scales_down(
    client, admin, settings, gce, gcp
):
    settings = settings.model_copy(update={"empty_node_ttl_s": 0})
    pool = await setup_pool(client, admin, gcp_catalog(), CENTRAL, min_replicas=2, max_replicas=2)
    converge(settings, Clouds(gcp=gcp))
    booted = nodes(settings, pool["id"], NodeState.booting)
    assert len(booted) == 2 and len(gce.instances) == 2
    for node in booted:
        zone, name = node.instance_id.split("/")
        resource = gce.instances[(zone, name)]
        labels = resource["labels"]
        assert labels["managed-by"] == "nimbus" and labels["nimbus-cluster"] == settings.cluster_name
        assert labels["nimbus-node-id"] == str(node.id)
        assert not any(k.startswith("nimbus-pool") for k in labels)  # a node belongs to no pool
        assert resource["sourceInstanceTemplate"].endswith("instanceTemplates/nimbus-gpu-1")
        metadata = {i["key"]: i["value"] for i in resource["metadata"]["items"]}
        config = parse_user_data(metadata["user-data"])
        assert config.node_id == str(node.id) and config.cloud == "gcp" and config.zone == zone
        assert config.pool_id is None and config.variant == ""
        assert metadata["enable-oslogin"] == "TRUE"  # the template's security metadata survives
    r = await client.patch(f"/admin/v1/pools/{pool['id']}", json={"min_replicas": 1, "max_replicas": 1},
                           headers=admin)
    assert r.status_code == 200
    converge(settings, Clouds(gcp=gcp))
    assert len(gce.instances) == 1
    [gone] = nodes(settings, pool["id"], NodeState.terminated)
    [kept] = nodes(settings, pool["id"], NodeState.booting)
    assert {gone.id, kept.id} == {n.id for n in booted}
    with session_scope(settings) as s:
        assert s.scalar(select(Replica.desired_state).where(Replica.node_id == gone.id)) == (
            ReplicaDesiredState.stopped)
        assert s.scalar(select(Replica.desired_state).where(Replica.node_id == kept.id)) == (
            ReplicaDesiredState.running)


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


async def test_quota_error_blocks_the_region_and_later_placements_go_to_the_next_one(client, admin, settings, gce,
                                                                                      gcp):
    gce.inject(InjectedError("us-central1-a", "QUOTA_EXCEEDED", "Quota 'NVIDIA_L4_GPUS' exceeded in region us-central1"))
    first = await setup_pool(client, admin, gcp_catalog(), BOTH, min_replicas=1, max_replicas=1)
    assert [kind for _, kind in tick(settings).operations] == [OperationKind.launch]
    assert [n.launch_spec["region"] for n in nodes(settings, first["id"])] == ["us-central1"]  # the cheaper one
    assert run_due(settings, Clouds(gcp=gcp)) == ["retry"]
    [op] = operations(settings, first["id"], OperationKind.launch)
    # us-central1-b was never tried: the quota error blocked the whole region.
    assert [(h["zone"], h["error_code"], h["error_scope"]) for h in op.history] == [
        ("us-central1-a", "QUOTA_EXCEEDED", "region")]
    with session_scope(settings) as s:
        [block] = s.scalars(select(CapacityBlock)).all()
        assert (block.scope.value, block.region, block.zone) == ("region", "us-central1", None)
    # Placement drops the blocked region's offers: a replica placed now goes to the next region, and
    # so does the first pool's, whose planned shape can no longer launch anywhere.
    r = await client.post("/admin/v1/models", json={"name": unique("m"), "variants": [
        {"tier": "bf16", "model_path": "meta-llama/Llama-3.1-8B-Instruct", "gpu_memory_gb": 20,
         "context_length": 8192}]}, headers=admin)
    second = await create_pool(client, admin, r.json()["variants"][0]["id"], placement=BOTH, min_replicas=1,
                               max_replicas=1)
    result = tick(settings)
    assert (result.placed, result.launched, result.terminated) == (2, 2, 1)
    [node] = nodes(settings, second["id"])
    assert (node.launch_spec["region"], node.launch_spec["zones"]) == ("us-east4", ["us-east4-a"])
    assert "launched" in run_due(settings, Clouds(gcp=gcp))
    [node] = nodes(settings, second["id"], NodeState.booting)
    assert (node.region, node.zone) == ("us-east4", "us-east4-a")


async def test_a_launch_whose_region_is_blocked_fails_over_to_the_next_region_on_the_next_tick(
        client, admin, settings, gce, gcp):
    gce.inject(InjectedError("us-central1-a", "QUOTA_EXCEEDED", "Quota 'NVIDIA_L4_GPUS' exceeded in region us-central1"))
    pool = await setup_pool(client, admin, gcp_catalog(), BOTH, min_replicas=1, max_replicas=1)
    tick(settings)
    assert run_due(settings, Clouds(gcp=gcp)) == ["retry"]  # us-central1 is blocked as a whole now
    # The next tick: the stranded node is given up and its replica goes where placement can still
    # launch, without waiting out the region's block.
    result = tick(settings)
    assert (result.placed, result.launched, result.terminated) == (1, 1, 1)
    assert "launched" in run_due(settings, Clouds(gcp=gcp))
    [node] = nodes(settings, pool["id"], NodeState.booting)
    assert (node.region, node.zone) == ("us-east4", "us-east4-a")
    assert len(gce.instances) == 1


async def test_everything_blocked_reports_capacity_unavailable_and_recovers(client, admin, settings, gce, gcp):
    settings = settings.model_copy(update={"block_zone_s": 2.0})
    for zone in ("us-central1-a", "us-central1-b"):
        gce.inject(capacity(zone))
    pool = await setup_pool(client, admin, gcp_catalog(), CENTRAL, min_replicas=1, max_replicas=1)
    tick(settings)
    assert run_due(settings, Clouds(gcp=gcp)) == ["retry"]
    r = await client.get(f"/admin/v1/pools/{pool['id']}", headers=admin)
    assert r.json()["capacity_status"] == "capacity_unavailable"
    r = await client.get("/admin/v1/operations", params={"pool_id": pool["id"]}, headers=admin)
    [op] = r.json()["items"]
    assert op["state"] == "pending" and op["kind"] == "launch"
    # Only the zones of the planned region and shape are walked.
    assert [(h["zone"], h["error_code"]) for h in op["history"]] == [
        ("us-central1-a", "ZONE_RESOURCE_POOL_EXHAUSTED"),
        ("us-central1-b", "ZONE_RESOURCE_POOL_EXHAUSTED"),
    ]
    # The next tick finds no launchable zone left for the planned shape: the node, which never
    # launched, is given up, and placement has nowhere else to put anything: both pools are unplaced.
    other = await setup_pool(client, admin, gcp_catalog(), CENTRAL, min_replicas=1, max_replicas=1)
    result = tick(settings)
    assert (result.placed, result.launched, result.terminated) == (0, 0, 1)
    assert set(result.unplaced) == {pool["id"], other["id"]}
    assert run_due(settings, Clouds(gcp=gcp)) == ["terminated"]  # its launch operation ended in the tick
    assert gce.instances == {}
    for p in (pool, other):
        assert pool_row(settings, p["id"]).capacity_status == "capacity_unavailable"
    await asyncio.sleep(2.2)  # the blocks expire
    result = tick(settings)
    assert (result.placed, result.launched, result.unplaced) == (2, 2, {})
    assert run_due(settings, Clouds(gcp=gcp)) == ["launched", "launched"]
    tick(settings)
    for p in (pool, other):
        assert pool_row(settings, p["id"]).capacity_status is None
        [node] = nodes(settings, p["id"], NodeState.booting)
        assert node.region == "us-central1"
    r = await client.get(f"/admin/v1/operations/{op['id']}", headers=admin)
    assert r.json()["state"] == "failed" and "cancelled" in r.json()["error"]


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
    tick(settings)
    [spot_node] = nodes(settings, pool["id"])
    assert spot_node.spot and spot_node.launch_spec["spot"] is True
    assert run_due(settings, Clouds(gcp=gcp)) == ["retry"]
    [spot_op] = node_operations(settings, spot_node.id, OperationKind.launch)
    assert [(h["zone"], h["spot"], h["ok"]) for h in spot_op.history] == [
        ("us-central1-a", True, False), ("us-central1-b", True, False)]
    # The next tick sees spot blocked in every zone: the spot node, which never launched, is given up
    # with its replica, and the replica is placed again on the on-demand market.
    result = tick(settings)
    assert (result.stopped, result.placed, result.launched, result.terminated) == (0, 1, 1, 1)
    assert sorted(run_due(settings, Clouds(gcp=gcp))) == ["launched", "terminated"]
    [node] = nodes(settings, pool["id"], NodeState.booting)
    assert node.spot is False and node.zone == "us-central1-a"
    [op] = node_operations(settings, node.id, OperationKind.launch)
    assert [(h["zone"], h["spot"], h["ok"]) for h in op.history] == [("us-central1-a", False, True)]
    assert [n.id for n in nodes(settings, pool["id"], NodeState.terminated)] == [spot_node.id]
    zone, name = node.instance_id.split("/")
    assert len(gce.instances) == 1
    assert "scheduling" not in gce.instances[(zone, name)] or \
        gce.instances[(zone, name)]["scheduling"].get("provisioningModel") != "SPOT"
