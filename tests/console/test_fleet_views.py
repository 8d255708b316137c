"""The fleet views' math, on plain values: slot maps, billed vs allocated GPUs, fragmentation, and
each node's price split over pools by GPUs held."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest

from controlplane.models.enums import NodeState, ReplicaDesiredState, ReplicaState
from controlplane.services import fleet_views
from controlplane.services.fleet_views import fleet_summary, node_price, slot_map

CATALOG = {("aws", "us-east-1", "g6.xlarge"): (0.8, 0.3), ("aws", "us-east-1", "p5.48xlarge"): (98.3, 40.0)}
POOL_A, POOL_B = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002"
NAMES = {POOL_A: "chat", POOL_B: "batch"}


def node(gpus=8, state=NodeState.ready, price=None, instance_type="p5.48xlarge", spot=False, **kw):
    spec = {"price_per_hour": price} if price is not None else {}
    return SimpleNamespace(id=uuid.uuid4(), state=state, gpus_total=gpus, cloud="aws", region="us-east-1",
                           instance_type=instance_type, spot=spot, launch_spec=kw.pop("launch_spec", spec), **kw)


def replica(n, pool, gpus, state=ReplicaState.ready, desired=ReplicaDesiredState.running, replaces=None,
            spare=False):
    return SimpleNamespace(id=uuid.uuid4(), node_id=n.id, pool_id=pool, gpu_ids=list(gpus), state=state,
                           desired_state=desired, replaces_id=replaces, spare=spare)


def test_slot_map_names_holders_and_free_slots():
    n = node(gpus=4)
    a = replica(n, POOL_A, [0, 1])
    b = replica(n, POOL_B, [2], desired=ReplicaDesiredState.stopped)  # told to stop, still holding
    gone = replica(n, POOL_B, [3], state=ReplicaState.stopped)  # its GPU is free again
    copy = replica(n, POOL_A, [3, 9], state=ReplicaState.starting, replaces=uuid.uuid4())  # 9: out of range
    slots = slot_map(4, [a, b, gone, copy], NAMES)
    assert [s.index for s in slots] == [0, 1, 2, 3]
    assert [h.pool_name for h in slots[0].holders] == ["chat"] and slots[1].holders[0].replica_id == str(a.id)
    assert slots[2].holders[0].state == "draining" and slots[2].holders[0].stop_requested
    assert slots[3].holders[0].copy_of == str(copy.replaces_id)[:8] and slots[3].holders[0].state == "starting"
    assert not any(s.free for s in slots)
    assert slot_map(2, [gone], NAMES)[1].free
    clash = slot_map(1, [replica(n, POOL_A, [0]), replica(n, POOL_B, [0])], NAMES)[0]
    assert clash.conflict and not clash.free
    # A spare told to stop for the replica placed on its GPU is no clash (that one waits for it);
    # a spare that is not stopping is.
    evicted = replica(n, POOL_B, [0], desired=ReplicaDesiredState.stopped, spare=True)
    handover = slot_map(1, [evicted, replica(n, POOL_A, [0], state=ReplicaState.pending)], NAMES)[0]
    assert not handover.conflict and [h.spare for h in handover.holders] == [True, False]
    assert slot_map(1, [replica(n, POOL_B, [0], spare=True), replica(n, POOL_A, [0])], NAMES)[0].conflict


def test_prices_come_from_the_launch_spec_then_the_catalog_market():
    assert node_price(node(price=50.0), CATALOG) == (50.0, "launch spec")
    assert node_price(node(price=0), CATALOG) == (0.0, "launch spec")
    assert node_price(node(), CATALOG) == (98.3, "catalog")
    assert node_price(node(spot=True), CATALOG) == (40.0, "catalog")
    assert node_price(node(instance_type="x9.huge"), CATALOG) == (None, "unknown")
    # a node not launched yet has its where only in the launch spec
    pending = node(gpus=0, instance_type=None, state=NodeState.pending)
    pending.cloud = pending.region = None
    pending.launch_spec = {"cloud": "aws", "region": "us-east-1", "instance_type": "g6.xlarge", "gpu_count": 1}
    assert node_price(pending, CATALOG) == (0.8, "catalog") and fleet_views.node_gpus(pending) == 1


def test_fragmentation_and_cost_by_pool():
    big = node(gpus=8, price=80.0)  # 10 $/GPU-hour
    small = node(gpus=1, instance_type="g6.xlarge")  # catalog: 0.8
    spare = node(gpus=1, instance_type="g6.xlarge", spot=True, state=NodeState.pending)  # catalog spot 0.3, empty
    dead = node(gpus=8, price=80.0, state=NodeState.terminated)  # not billed
    replicas = [
        replica(big, POOL_A, [0, 1]),
        replica(big, POOL_B, [2, 3, 4], state=ReplicaState.draining),
        replica(big, POOL_B, [5], state=ReplicaState.failed),  # failed: GPU 5 is free
        replica(small, POOL_A, [0], state=ReplicaState.pending),  # pending holds its GPU
        replica(dead, POOL_A, [0, 1, 2]),
    ]
    s = fleet_summary([big, small, spare, dead], replicas, CATALOG, NAMES)
    assert len(s.nodes) == 3
    assert (s.billed, s.allocated, s.free) == (10, 6, 4)
    assert s.fragmentation == pytest.approx(0.4)
    assert s.per_hour == pytest.approx(81.1)
    costs = {p.name: (p.gpus, round(p.per_hour, 4)) for p in s.by_pool}
    assert costs == {"chat": (3, 20.8), "batch": (3, 30.0)}
    assert [p.name for p in s.by_pool] == ["batch", "chat"]  # most expensive first
    assert (s.unallocated.gpus, round(s.unallocated.per_hour, 4)) == (4, 30.3)
    assert sum(p.per_hour for p in s.by_pool) + s.unallocated.per_hour == pytest.approx(s.per_hour)
    assert s.unallocated.share == pytest.approx(30.3 / 81.1)
    groups = {(g.instance_type, g.market): (len(g.nodes), g.billed, g.allocated, round(g.per_hour, 4))
              for g in s.groups}
    assert groups == {("p5.48xlarge", "on-demand"): (1, 8, 5, 80.0), ("g6.xlarge", "on-demand"): (1, 1, 1, 0.8),
                      ("g6.xlarge", "spot"): (1, 1, 0, 0.3)}


def test_a_node_with_no_price_is_billed_but_not_costed():
    priced = node(gpus=2, price=10.0)
    unpriced = node(gpus=4, instance_type="x9.huge")
    s = fleet_summary([priced, unpriced], [replica(priced, POOL_A, [0]), replica(unpriced, POOL_B, [0, 1])],
                      CATALOG, NAMES)
    assert (s.billed, s.allocated, s.free) == (6, 3, 3)
    assert s.per_hour == pytest.approx(10.0)
    assert [u.node_id for u in s.unpriced] == [str(unpriced.id)]
    by_pool = {p.name: (p.gpus, p.per_hour) for p in s.by_pool}
    assert by_pool["chat"] == (1, pytest.approx(5.0)) and by_pool["batch"] == (2, 0.0)  # GPUs still counted
    assert s.unallocated.per_hour == pytest.approx(5.0) and s.unallocated.gpus == 3
    (group,) = [g for g in s.groups if g.instance_type == "x9.huge"]
    assert group.unpriced == 1 and group.per_hour == 0.0


def test_empty_fleet_and_unknown_pool_names():
    s = fleet_summary([], [], CATALOG)
    assert (s.billed, s.allocated, s.per_hour, s.fragmentation, s.by_pool) == (0, 0, 0.0, None, ())
    n = node(gpus=0, price=3.0)  # no slots known: the whole price is unallocated
    other = node(gpus=2, price=2.0)
    s = fleet_summary([n, other], [replica(other, POOL_A, [1])], CATALOG)
    assert s.by_pool[0].name == POOL_A[:8] and s.unallocated.per_hour == pytest.approx(4.0)
    # a contested GPU is split between the replicas that claim it; the sum still holds
    clash = node(gpus=1, price=1.0)
    s = fleet_summary([clash], [replica(clash, POOL_A, [0]), replica(clash, POOL_B, [0])], CATALOG, NAMES)
    assert s.allocated == 1 and {p.name: p.per_hour for p in s.by_pool} == {"chat": 0.5, "batch": 0.5}
