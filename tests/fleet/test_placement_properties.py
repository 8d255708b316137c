"""Placement on random fleets: the rules always hold, and new nodes cost near the exact optimum."""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.fleet.capacity import (
    HostedReplica,
    NodeSlots,
    Offer,
    PlacementPlan,
    PlacementPref,
    PoolNeed,
)
from controlplane.fleet.placement import _Kind, _pack_component, plan_placement
from tests.fleet.milp import allowed_sites, exact_min_cost

MEMORY = {"l4": 24.0, "l40s": 48.0, "a100": 40.0, "h100": 80.0}
PER_GPU = {"l4": 0.80, "l40s": 2.60, "a100": 4.10, "h100": 6.90}
REGIONS = {
    ("aws", "us-east-1"): ("us-east-1a", "us-east-1b", "us-east-1c"),
    ("aws", "us-west-2"): ("us-west-2a", "us-west-2b"),
    ("gcp", "us-central1"): ("us-central1-a", "us-central1-b"),
}
SIZES = (1, 2, 4, 8)
TENANTS = (None, None, "t1", "t2")


@st.composite
def offers_st(draw, max_size: int = 5) -> list[Offer]:
    out = []
    for i in range(draw(st.integers(1, max_size))):
        cloud, region = draw(st.sampled_from(sorted(REGIONS)))
        gpu_type = draw(st.sampled_from(sorted(MEMORY)))
        count = draw(st.sampled_from(SIZES))
        # bigger shapes a little cheaper per GPU, as in real catalogs, with some noise
        factor = draw(st.sampled_from((0.85, 0.9, 0.95, 1.0, 1.05, 1.2))) * (1.0 - 0.01 * SIZES.index(count))
        zones = tuple(draw(st.lists(st.sampled_from(REGIONS[(cloud, region)]), unique=True, max_size=3)))
        if draw(st.integers(0, 4)) and not zones:
            zones = REGIONS[(cloud, region)][:1]  # mostly launchable
        out.append(Offer(cloud, region, f"{gpu_type}x{count}-{i}", gpu_type, count, MEMORY[gpu_type],
                         draw(st.booleans()), round(count * PER_GPU[gpu_type] * factor, 4), zones))
    return out


@st.composite
def pref_st(draw) -> PlacementPref:
    cloud, region = draw(st.sampled_from(sorted(REGIONS)))
    if not draw(st.integers(0, 3)):
        return PlacementPref(cloud)  # any region of the cloud
    pins = tuple(draw(st.lists(st.sampled_from(REGIONS[(cloud, region)]), unique=True, max_size=2)))
    return PlacementPref(cloud, region, pins if draw(st.integers(0, 2)) == 0 else ())


@st.composite
def needs_st(draw, max_pools: int = 4, max_missing: int = 4, tenants=TENANTS, profiles: bool = True) -> list[PoolNeed]:
    out = []
    for i in range(draw(st.integers(1, max_pools))):
        gpu_types = tuple(draw(st.lists(st.sampled_from(sorted(MEMORY)), unique=True, max_size=2)))
        tps = {}
        if profiles and gpu_types and draw(st.booleans()):
            tps = {t: float(draw(st.integers(100, 5000))) for t in gpu_types}
        out.append(PoolNeed(
            pool_id=f"p{i}",
            gpus_per_replica=draw(st.sampled_from(SIZES)),
            gpu_memory_gb=draw(st.sampled_from((8.0, 16.0, 24.0, 40.0, 80.0))),
            gpu_types=gpu_types,
            placement=tuple(draw(st.lists(pref_st(), max_size=2))),
            dedicated_tenant_id=draw(st.sampled_from(tenants)),
            missing_spot=draw(st.integers(0, max_missing)),
            missing_on_demand=draw(st.integers(0, max_missing)),
            spread_zones=draw(st.booleans()),
            tokens_per_s=tps,
        ))
    return out


@st.composite
def nodes_st(draw, pool_ids: list[str]) -> list[NodeSlots]:
    out = []
    for i in range(draw(st.integers(0, 8))):
        cloud, region = draw(st.sampled_from(sorted(REGIONS)))
        gpu_type = draw(st.sampled_from(sorted(MEMORY)))
        total = draw(st.sampled_from(SIZES))
        launched = draw(st.integers(0, 3)) > 0
        used = draw(st.lists(st.integers(0, total - 1), unique=True, max_size=total))
        replicas = tuple(
            HostedReplica(f"n{i}-r{j}", draw(st.sampled_from([*pool_ids, "other"])), (g,), ready=True)
            for j, g in enumerate(used)
        )
        out.append(NodeSlots(
            node_id=f"n{i}", cloud=cloud, region=region,
            zone=draw(st.sampled_from(REGIONS[(cloud, region)])) if launched else None,
            instance_type=f"{gpu_type}x{total}", gpu_type=gpu_type, gpus_total=total, spot=draw(st.booleans()),
            dedicated_tenant_id=draw(st.sampled_from(TENANTS)), price_per_hour=total * PER_GPU[gpu_type],
            replicas=replicas, launched=launched, gpu_memory_gb=MEMORY[gpu_type],
        ))
    return out


# ------------------------------------------------------------------ the rules, restated independently
def allowed_at(need: PoolNeed, cloud: str, region: str, zone: str | None) -> bool:
    if not need.placement:
        return True
    for p in need.placement:
        if p.cloud == cloud and (p.region is None or p.region == region):
            if not p.zones or (zone is not None and zone in p.zones):
                return True
    return False


def gpu_fits(need: PoolNeed, gpu_type: str, memory: float, total: int) -> bool:
    return (not need.gpu_types or gpu_type in need.gpu_types) and memory >= need.gpu_memory_gb \
        and total >= need.gpus_per_replica


def check_plan(needs: list[PoolNeed], nodes: list[NodeSlots], offers: list[Offer], plan: PlacementPlan) -> None:
    by_pool = {n.pool_id: n for n in needs}
    by_node = {n.node_id: n for n in nodes}
    launches = {n.key: n for n in plan.launches}
    assert len(launches) == len(plan.launches)
    taken: dict[str, set[int]] = defaultdict(set)
    for n in nodes:
        for r in n.replicas:
            taken[n.node_id].update(r.gpu_ids)
    for p in plan.placed:
        need = by_pool[p.pool_id]
        assert len(p.gpu_ids) == need.gpus_per_replica
        if p.node_id in by_node:
            n = by_node[p.node_id]
            total, tenant, spot = n.gpus_total, n.dedicated_tenant_id, n.spot
            assert gpu_fits(need, n.gpu_type, n.gpu_memory_gb, n.gpus_total)
            assert allowed_at(need, n.cloud, n.region, n.zone)
        else:
            new = launches[p.node_id]
            o = new.offer
            total, tenant, spot = o.gpu_count, new.dedicated_tenant_id, o.spot
            assert o in offers
            assert gpu_fits(need, o.gpu_type, o.gpu_memory_gb, o.gpu_count)
            assert new.zones and set(new.zones) <= set(o.zones)
            assert all(allowed_at(need, o.cloud, o.region, z) for z in new.zones)
        assert tenant == need.dedicated_tenant_id
        assert spot == p.spot
        assert all(0 <= g < total for g in p.gpu_ids)
        assert not taken[p.node_id] & set(p.gpu_ids), f"GPU handed out twice on {p.node_id}"
        taken[p.node_id].update(p.gpu_ids)
    hosted = {p.node_id for p in plan.placed}
    assert set(launches) <= hosted, "a new node with nothing on it"
    # every missing replica is placed or reported
    got: Counter = Counter()
    for p in plan.placed:
        got[(p.pool_id, p.spot)] += 1
    unplaced: Counter = Counter()
    for pool_id, count, why in plan.unplaced:
        assert count > 0 and why
        unplaced[pool_id] += count
    for need in needs:
        assert got[(need.pool_id, True)] <= need.missing_spot
        assert got[(need.pool_id, False)] <= need.missing_on_demand
        assert got[(need.pool_id, True)] + got[(need.pool_id, False)] + unplaced[need.pool_id] == \
            need.missing_spot + need.missing_on_demand


@st.composite
def fleet_st(draw):
    needs = draw(needs_st())
    nodes = draw(nodes_st([n.pool_id for n in needs]))
    return needs, nodes, draw(offers_st())


@settings(max_examples=250, deadline=None)
@given(fleet_st())
def test_placement_rules_always_hold(fleet):
    needs, nodes, offers = fleet
    plan = plan_placement(needs, nodes, offers)
    check_plan(needs, nodes, offers, plan)
    assert plan_placement(needs, nodes, offers) == plan  # deterministic


def plan_cost(plan: PlacementPlan) -> float:
    return sum(n.offer.price_per_hour for n in plan.launches)


@st.composite
def small_st(draw):
    """≤ 3 pools, ≤ 6 replicas in all, ≤ 4 offers, no nodes: small enough for the exact MILP."""
    needs = draw(needs_st(max_pools=3, max_missing=3, profiles=False))
    budget = 6
    trimmed = []
    for n in needs:
        spot = min(n.missing_spot, budget)
        budget -= spot
        od = min(n.missing_on_demand, budget)
        budget -= od
        trimmed.append(PoolNeed(n.pool_id, n.gpus_per_replica, n.gpu_memory_gb, n.gpu_types, n.placement,
                                n.dedicated_tenant_id, spot, od, n.spread_zones))
    return trimmed, draw(offers_st(max_size=4))


@settings(max_examples=200, deadline=None)
@given(small_st())
def test_new_nodes_cost_within_ten_percent_of_the_exact_optimum(instance):
    needs, offers = instance
    plan = plan_placement(needs, [], offers)
    check_plan(needs, [], offers, plan)
    # the same replicas are placeable in both (the MILP's own statement of the rules)
    placeable = Counter()
    for n in needs:
        for spot, count in ((True, n.missing_spot), (False, n.missing_on_demand)):
            if count and allowed_sites(n, offers, spot):
                placeable[n.pool_id] += count
    assert Counter(p.pool_id for p in plan.placed) == placeable
    best = exact_min_cost(needs, offers)
    assert plan_cost(plan) <= 1.10 * best + 1e-6, (plan_cost(plan), best)


def test_exact_reference_packs_replicas_not_pooled_gpus():
    # three 2-GPU replicas on 3-GPU shapes: 6 GPUs would fit two nodes' GPUs, but a pair never
    # shares a node, so three nodes it is (the MILP must not pool GPUs where sizes do not divide)
    odd = Offer("aws", "us-east-1", "x3", "h100", 3, 80.0, False, 10.0, ("us-east-1a",))
    need = PoolNeed("p", 2, 40.0, missing_on_demand=3)
    assert exact_min_cost([need], [odd]) == 30.0
    assert plan_cost(plan_placement([need], [], [odd])) == 30.0
    # with divisible sizes the pooled count is exact: four pairs and four singles on 4-GPU shapes
    quad = Offer("aws", "us-east-1", "x4", "h100", 4, 80.0, False, 10.0, ("us-east-1a",))
    needs = [PoolNeed("pairs", 2, 40.0, missing_on_demand=4), PoolNeed("ones", 1, 40.0, missing_on_demand=4)]
    assert exact_min_cost(needs, [quad]) == 30.0
    assert plan_cost(plan_placement(needs, [], [quad])) == 30.0


# ------------------------------------------------------------------ packing by counts
@st.composite
def kinds_st(draw) -> tuple[list[_Kind], list[Offer]]:
    """Kinds of replicas (some with big counts) on launchable offers of one market."""
    offers = [o for o in draw(offers_st(max_size=5)) if o.zones]
    if not offers:
        offers = [Offer("aws", "us-east-1", "h100x8", "h100", 8, 80.0, False, 55.0, ("us-east-1a",))]
    kinds = []
    for _ in range(draw(st.integers(1, 5))):
        k = draw(st.sampled_from(SIZES))
        fitting = [o for o, offer in enumerate(offers) if offer.gpu_count >= k]
        if not fitting:
            continue
        chosen = draw(st.lists(st.sampled_from(fitting), min_size=1, unique=True))
        cands = {o: frozenset(draw(st.lists(st.sampled_from(offers[o].zones), min_size=1, unique=True)))
                 for o in chosen}
        kinds.append(_Kind(k, draw(st.sampled_from((1, 2, 3, 7, 20, 45, 130, 400))), cands))
    if not kinds:
        kinds.append(_Kind(1, 30, {0: frozenset(offers[0].zones)}))
    return kinds, offers


@settings(max_examples=300, deadline=None)
@given(kinds_st())
def test_packing_by_counts_holds_every_replica_once_on_allowed_nodes(instance):
    # kinds with hundreds of replicas: each node's take is counts per kind, and every replica of
    # every kind is on exactly one node that fits it, in zones it allows, with no GPU overcommitted
    kinds, offers = instance
    bins = _pack_component(kinds, offers)
    assert _pack_component(kinds, offers) == bins  # deterministic
    held: Counter = Counter()
    for o, zones, take in bins:
        assert take and all(t > 0 for _, t in take)
        assert zones and all(o in kinds[j].cands and zones <= kinds[j].cands[o] for j, _ in take)
        assert sum(kinds[j].k * t for j, t in take) <= offers[o].gpu_count
        for j, t in take:
            held[j] += t
    assert held == {j: kind.n for j, kind in enumerate(kinds)}


@st.composite
def split_st(draw):
    """One pool's replicas, and the same replicas split over many pools that pack alike."""
    need = draw(needs_st(max_pools=1, max_missing=40, profiles=False))[0]
    parts = draw(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=30))
    pools = [PoolNeed(f"{need.pool_id}-{i}", need.gpus_per_replica, need.gpu_memory_gb, need.gpu_types,
                      need.placement, need.dedicated_tenant_id, spot, od, draw(st.booleans()))
             for i, (spot, od) in enumerate(parts)]
    whole = PoolNeed(need.pool_id, need.gpus_per_replica, need.gpu_memory_gb, need.gpu_types, need.placement,
                     need.dedicated_tenant_id, sum(s for s, _ in parts), sum(o for _, o in parts))
    return whole, pools, draw(offers_st())


@settings(max_examples=150, deadline=None)
@given(split_st())
def test_many_pools_that_pack_alike_buy_what_one_pool_would(instance):
    # A mass launch of many pools with the same needs is packed as one kind of replica: the
    # nodes bought do not depend on how the replicas are split over pools.
    whole, pools, offers = instance
    plan = plan_placement(pools, [], offers)
    check_plan(pools, [], offers, plan)
    alone = plan_placement([whole], [], offers)
    assert sorted(n.offer.instance_type for n in plan.launches) == \
        sorted(n.offer.instance_type for n in alone.launches)
    assert len(plan.placed) == len(alone.placed)
