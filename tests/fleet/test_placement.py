"""Placement examples: free slots first, the cheapest new nodes for the rest, which surplus goes."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

import pytest

from controlplane.fleet.capacity import (
    HostedReplica,
    NodeSlots,
    Offer,
    PlacementPlan,
    PlacementPref,
    PoolNeed,
)
from controlplane.fleet.placement import (
    choose_surplus,
    fits_node,
    fits_offer,
    pick_gpus,
    plan_placement,
)

EAST = PlacementPref("aws", "us-east-1")
WEST = PlacementPref("aws", "us-west-2")
CENTRAL = PlacementPref("gcp", "us-central1")
MEMORY = {"l4": 24.0, "l40s": 48.0, "a100": 80.0, "h100": 80.0}


def node(node_id: str, *, gpus: int = 8, gpu_type: str = "h100", spot: bool = False, tenant: str | None = None,
         cloud: str = "aws", region: str = "us-east-1", zone: str | None = "us-east-1a",
         price: float | None = None, replicas: tuple[HostedReplica, ...] = (), **kw) -> NodeSlots:
    return NodeSlots(
        node_id=node_id, cloud=cloud, region=region, zone=zone, instance_type=f"{gpu_type}x{gpus}",
        gpu_type=gpu_type, gpus_total=gpus, spot=spot, dedicated_tenant_id=tenant,
        price_per_hour=6.88 * gpus if price is None else price, replicas=replicas,
        gpu_memory_gb=MEMORY.get(gpu_type, 80.0), **kw,
    )


def offer(instance_type: str, gpu_type: str, gpus: int, price: float, *, spot: bool = False,
          cloud: str = "aws", region: str = "us-east-1",
          zones: tuple[str, ...] = ("us-east-1a", "us-east-1b", "us-east-1c")) -> Offer:
    return Offer(cloud=cloud, region=region, instance_type=instance_type, gpu_type=gpu_type, gpu_count=gpus,
                 gpu_memory_gb=MEMORY.get(gpu_type, 80.0), spot=spot, price_per_hour=price, zones=zones)


def rep(replica_id: str, pool_id: str, *gpu_ids: int, ready: bool = True, **kw) -> HostedReplica:
    return HostedReplica(replica_id=replica_id, pool_id=pool_id, gpu_ids=tuple(gpu_ids), ready=ready, **kw)


def gpus_by_node(plan: PlacementPlan, nodes=()) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for n in nodes:
        for r in n.replicas:
            out[n.node_id].extend(r.gpu_ids)
    for p in plan.placed:
        out[p.node_id].extend(p.gpu_ids)
    return out


def assert_no_gpu_twice(plan: PlacementPlan, nodes=()) -> None:
    for nid, gpus in gpus_by_node(plan, nodes).items():
        assert len(gpus) == len(set(gpus)), f"node {nid} hands out a GPU twice: {sorted(gpus)}"


def launch_cost(plan: PlacementPlan) -> float:
    return round(sum(n.offer.price_per_hour for n in plan.launches), 6)


# H100 shapes priced like a real catalog: bigger shapes slightly cheaper per GPU
# (p5.48xlarge h100×8 at $55.04/h is $6.88 per GPU-hour).
H100_1 = offer("h100x1", "h100", 1, 7.20)  # $7.20/GPU-h
H100_4 = offer("h100x4", "h100", 4, 28.00)  # $7.00/GPU-h
H100_8 = offer("p5.48xlarge", "h100", 8, 55.04)  # $6.88/GPU-h


# ------------------------------------------------------------------ free slots
def test_two_pools_share_one_node_and_gpu_indices_never_overlap():
    n1 = node("n1")
    needs = [PoolNeed("small", 1, 24, missing_on_demand=3), PoolNeed("tp2", 2, 80, missing_on_demand=2)]
    plan = plan_placement(needs, [n1], [H100_8])
    assert plan.launches == () and plan.unplaced == ()
    assert {p.node_id for p in plan.placed} == {"n1"}
    assert Counter(p.pool_id for p in plan.placed) == {"small": 3, "tp2": 2}
    assert_no_gpu_twice(plan)
    # tensor parallel replicas get aligned neighbours
    assert sorted(p.gpu_ids for p in plan.placed if p.pool_id == "tp2") == [(0, 1), (2, 3)]


def test_existing_replicas_keep_their_gpus_and_a_pair_takes_an_aligned_block():
    n1 = node("n1", gpus=4, replicas=(rep("r0", "x", 0),))
    plan = plan_placement([PoolNeed("tp2", 2, 80, missing_on_demand=1)], [n1], [])
    assert [p.gpu_ids for p in plan.placed] == [(2, 3)]  # not [1, 2]


def test_pick_gpus_prefers_aligned_blocks_and_keeps_big_blocks_whole():
    assert pick_gpus([1, 2, 3], 4, 2) == (2, 3)
    assert pick_gpus([0, 1, 3], 4, 1) == (3,)  # leaves [0,1] whole for a pair
    assert pick_gpus([1, 2], 4, 2) == (1, 2)  # no aligned block: contiguous
    assert pick_gpus([0, 2], 4, 2) == (0, 2)  # nothing contiguous: any two
    assert pick_gpus([0], 4, 2) is None


def test_best_fit_takes_the_fullest_node_that_fits():
    roomy = node("a-roomy")
    tight = node("b-tight", replicas=tuple(rep(f"r{g}", "x", g) for g in range(6)))
    plan = plan_placement([PoolNeed("p", 1, 80, missing_on_demand=2)], [roomy, tight], [])
    assert {p.node_id for p in plan.placed} == {"b-tight"}
    assert sorted(p.gpu_ids for p in plan.placed) == [(6,), (7,)]


def test_a_replica_goes_where_its_checkpoint_is_cached_before_best_fit():
    """A node whose artifact cache holds the pool's checkpoint starts the replica without the
    download: it wins over a tighter fit, but not over the placement order, and only with room."""
    tight = node("a-tight", replicas=tuple(rep(f"r{g}", "x", g) for g in range(6)))
    holder = node("b-holder", replicas=(rep("h0", "x", 0), rep("h1", "x", 1)),
                  cached_models=frozenset({"org/llama-70b", "org/other"}))
    need = PoolNeed("p", 2, 80, missing_on_demand=1, model_path="org/llama-70b")
    plan = plan_placement([need], [tight, holder], [])
    assert [(p.node_id, p.gpu_ids) for p in plan.placed] == [("b-holder", (2, 3))]
    # another checkpoint, or none: best fit as before
    for other in ("org/llama-8b", None):
        plan = plan_placement([dataclasses.replace(need, model_path=other)], [tight, holder], [])
        assert [p.node_id for p in plan.placed] == ["a-tight"]
    # the holder without room for the replica: the next node that fits
    full = node("b-holder", replicas=tuple(rep(f"h{g}", "x", g) for g in range(7)),
                cached_models=holder.cached_models)
    assert [p.node_id for p in plan_placement([need], [tight, full], []).placed] == ["a-tight"]
    # several replicas: the holder takes what it has room for first
    plan = plan_placement([dataclasses.replace(need, missing_on_demand=4)], [tight, holder], [])
    assert Counter(p.node_id for p in plan.placed) == {"b-holder": 3, "a-tight": 1}
    # the operator's placement order comes before the cache
    west_holder = node("b-holder", region="us-west-2", zone="us-west-2a", replicas=holder.replicas,
                       cached_models=holder.cached_models)
    ordered = dataclasses.replace(need, placement=(EAST, WEST))
    assert [p.node_id for p in plan_placement([ordered], [tight, west_holder], []).placed] == ["a-tight"]
    # an empty node (waiting out its TTL) is not kept billed to save a download while another fits…
    empty_holder = node("b-holder", cached_models=holder.cached_models)
    assert [p.node_id for p in plan_placement([need], [tight, empty_holder], []).placed] == ["a-tight"]
    # …but among empty nodes the one holding the checkpoint wins
    other_empty = node("a-empty")
    assert [p.node_id for p in plan_placement([need], [other_empty, empty_holder], []).placed] == ["b-holder"]


def test_pending_nodes_slots_can_be_promised():
    pending = node("pending", zone=None, launched=False, ready=False)
    plan = plan_placement([PoolNeed("p", 1, 80, missing_on_demand=1)], [pending], [H100_8])
    assert [p.node_id for p in plan.placed] == ["pending"] and plan.launches == ()
    # …but not to a pool that pins zones: the node may still land outside them
    pinned = PoolNeed("p", 1, 80, placement=(PlacementPref("aws", "us-east-1", ("us-east-1b",)),),
                      missing_on_demand=1)
    assert not fits_node(pinned, pending)


def test_markets_do_not_mix():
    od = node("od")
    plan = plan_placement([PoolNeed("p", 1, 80, missing_spot=1)], [od], [])
    assert plan.placed == () and plan.unplaced[0][:2] == ("p", 1)


def test_dedication_is_respected_both_ways():
    shared = node("shared")
    mine = node("mine", tenant="t1")
    plan = plan_placement(
        [PoolNeed("ded", 1, 80, dedicated_tenant_id="t1", missing_on_demand=1),
         PoolNeed("pub", 1, 80, missing_on_demand=1)],
        [shared, mine], [],
    )
    assert {(p.pool_id, p.node_id) for p in plan.placed} == {("ded", "mine"), ("pub", "shared")}
    # new nodes: carry the tenant, and two tenants never share one
    plan = plan_placement(
        [PoolNeed("t1-pool", 1, 80, dedicated_tenant_id="t1", missing_on_demand=1),
         PoolNeed("t2-pool", 1, 80, dedicated_tenant_id="t2", missing_on_demand=1),
         PoolNeed("pub", 1, 80, missing_on_demand=1)],
        [], [H100_8],
    )
    assert sorted(n.dedicated_tenant_id or "" for n in plan.launches) == ["", "t1", "t2"]
    tenant_of = {n.key: n.dedicated_tenant_id for n in plan.launches}
    assert {p.pool_id: tenant_of[p.node_id] for p in plan.placed} == {"t1-pool": "t1", "t2-pool": "t2", "pub": None}


def test_gpu_type_and_memory_are_respected():
    l4 = node("l4", gpu_type="l4", gpus=4)
    big_model = PoolNeed("big", 1, 40, missing_on_demand=1)  # 40 GB per GPU: an L4 has 24
    assert not fits_node(big_model, l4)
    h100_only = PoolNeed("h", 1, 16, gpu_types=("h100",), missing_on_demand=1)
    assert not fits_node(h100_only, l4) and not fits_offer(h100_only, offer("g6", "l4", 1, 0.8))
    plan = plan_placement([big_model, h100_only], [l4], [H100_8])
    assert {p.node_id for p in plan.placed} == {"new-0"} and len(plan.launches) == 1


# ------------------------------------------------------------------ placement order and zones
def test_existing_nodes_follow_the_placement_order_before_best_fit():
    east_tight = node("east", replicas=tuple(rep(f"r{g}", "x", g) for g in range(7)))
    west_roomy = node("west", region="us-west-2", zone="us-west-2a")
    need = PoolNeed("p", 1, 80, placement=(WEST, EAST), missing_on_demand=1)
    plan = plan_placement([need], [east_tight, west_roomy], [])
    assert [p.node_id for p in plan.placed] == ["west"]


def test_new_nodes_follow_the_placement_order_even_when_a_later_one_is_cheaper():
    gcp = offer("a3-highgpu-8g", "h100", 8, 88.0, cloud="gcp", region="us-central1",
                zones=("us-central1-a", "us-central1-b"))
    need = PoolNeed("p", 8, 80, placement=(CENTRAL, EAST), missing_on_demand=1)
    plan = plan_placement([need], [], [H100_8, gcp])
    assert [n.offer.instance_type for n in plan.launches] == ["a3-highgpu-8g"]
    # the first preference blocked (no zone can launch now): the next one
    blocked = offer("a3-highgpu-8g", "h100", 8, 88.0, cloud="gcp", region="us-central1", zones=())
    plan = plan_placement([need], [], [H100_8, blocked])
    assert [n.offer.instance_type for n in plan.launches] == ["p5.48xlarge"]


def test_zone_pins_filter_the_new_nodes_zones():
    need = PoolNeed("p", 8, 80, placement=(PlacementPref("aws", "us-east-1", ("us-east-1c", "us-east-1a")),),
                    missing_on_demand=1)
    plan = plan_placement([need], [], [H100_8])
    assert plan.launches[0].zones == ("us-east-1a", "us-east-1c")  # the offer's order, pins applied


def test_spread_zones_prefers_the_zone_with_fewest_replicas_of_the_pool():
    a = node("a", zone="us-east-1a", replicas=(rep("r1", "p", 0), rep("r2", "x", 1)))
    b = node("b", zone="us-east-1b")
    c = node("c", zone="us-east-1c")
    spread = PoolNeed("p", 1, 80, missing_on_demand=2, spread_zones=True)
    plan = plan_placement([spread], [a, b, c], [])
    assert sorted(p.node_id for p in plan.placed) == ["b", "c"]
    # without spreading, best fit packs them onto the fullest node
    plan = plan_placement([PoolNeed("p", 1, 80, missing_on_demand=2)], [a, b, c], [])
    assert [p.node_id for p in plan.placed] == ["a", "a"]


def test_spread_rotates_new_nodes_zones():
    # one replica per node (8 GPUs each): each new node starts from a different least-used zone
    a = node("a", zone="us-east-1a", replicas=(rep("r1", "p", *range(8)),))
    spread = PoolNeed("p", 8, 80, missing_on_demand=2, spread_zones=True)
    plan = plan_placement([spread], [a], [H100_8])
    assert [n.zones[0] for n in plan.launches] == ["us-east-1b", "us-east-1c"]


def test_blocked_offers_and_missing_shapes_are_reported_unplaced():
    blocked = offer("p5.48xlarge", "h100", 8, 55.04, zones=())
    plan = plan_placement([PoolNeed("p", 2, 80, missing_on_demand=3)], [], [blocked])
    assert plan.launches == () and plan.placed == ()
    assert plan.unplaced == (("p", 3, "every fitting offer is blocked in the zones its placement allows"),)
    plan = plan_placement(
        [PoolNeed("p", 2, 80, gpu_types=("h100",), placement=(EAST,), missing_on_demand=1)], [],
        [offer("g6.xlarge", "l4", 1, 0.8)],
    )
    assert plan.unplaced == (("p", 1, "no offer fits: needs 2× h100 80GB in aws/us-east-1 (on-demand)"),)


# ------------------------------------------------------------------ new nodes: the cheapest mix
def test_small_replicas_share_one_new_node():
    plan = plan_placement([PoolNeed("p", 1, 80, missing_on_demand=3)], [], [H100_8])
    assert len(plan.launches) == 1
    assert len(plan.placed) == 3 and {p.node_id for p in plan.placed} == {"new-0"}
    assert_no_gpu_twice(plan)


@pytest.mark.parametrize(
    ("gpus", "missing", "expected", "cost"),
    [
        # 13 GPUs: 8+4+1 = 55.04+28.00+7.20 = 90.24 (8+8 = 110.08, 8+5×1 = 91.04, 4+4+4+1 = 91.20)
        (1, 13, ["h100x1", "h100x4", "p5.48xlarge"], 90.24),
        # 7 GPUs: 4+3×1 = 28.00+21.60 = 49.60 beats one 8 (55.04, a GPU idle) and 4+4 (56.00)
        (1, 7, ["h100x1", "h100x1", "h100x1", "h100x4"], 49.60),
        # 16 GPUs: two 8s = 110.08 (per GPU the cheapest, nothing idle)
        (1, 16, ["p5.48xlarge", "p5.48xlarge"], 110.08),
        # three 2-GPU replicas = 6 GPUs: one 8 (55.04) beats 4+4 (56.00); a pair never fits a 1-GPU shape
        (2, 3, ["p5.48xlarge"], 55.04),
        # 4-GPU replicas ×3: 8+4 = 83.04 (three 4s = 84.00)
        (4, 3, ["h100x4", "p5.48xlarge"], 83.04),
    ],
)
def test_cheapest_mix_of_shapes(gpus, missing, expected, cost):
    plan = plan_placement([PoolNeed("p", gpus, 80, missing_on_demand=missing)], [], [H100_1, H100_4, H100_8])
    assert sorted(n.offer.instance_type for n in plan.launches) == expected
    assert launch_cost(plan) == pytest.approx(cost)
    assert len(plan.placed) == missing and plan.unplaced == ()
    assert_no_gpu_twice(plan)


def test_leftover_slots_of_a_new_node_take_other_pools():
    # tp2 needs h100s: 2×2 GPUs on one 8-GPU node; the 1-GPU pool could run on cheap L4s, but the
    # four idle H100s cost nothing more.
    tp2 = PoolNeed("tp2", 2, 80, gpu_types=("h100",), missing_on_demand=2)
    small = PoolNeed("small", 1, 16, missing_on_demand=4)
    plan = plan_placement([tp2, small], [], [H100_8, offer("g6.xlarge", "l4", 1, 0.80)])
    assert [n.offer.instance_type for n in plan.launches] == ["p5.48xlarge"]
    assert Counter(p.pool_id for p in plan.placed) == {"tp2": 2, "small": 4}
    assert_no_gpu_twice(plan)


def test_cheapest_gpu_type_by_price_without_profiles():
    need = PoolNeed("p", 1, 24, gpu_types=("l4", "h100"), missing_on_demand=1)
    plan = plan_placement([need], [], [H100_1, offer("g6.xlarge", "l4", 1, 0.80)])
    assert [n.offer.gpu_type for n in plan.launches] == ["l4"]


@pytest.mark.parametrize(
    ("l4_tps", "h100_tps", "sized_at", "expected"),
    [
        # per dollar: l4 1000/0.80 = 1250 tok/s/$ vs h100 5000/7.20 ≈ 694 → l4, however the count was sized
        (1000.0, 5000.0, None, "l4"),
        (1000.0, 5000.0, 5000.0, "l4"),
        # flipped: h100 12000/7.20 ≈ 1667 vs l4 1250 → h100, though it costs 9× more per hour, for
        # two replicas sized at the h100's rate (24,000 tokens/s: 2 × $7.20 against 24 × $0.80)
        (1000.0, 12000.0, 12000.0, "h100"),
        # but two sized at the l4's rate ask for 2000 tokens/s: two l4s ($1.60) beat one h100 ($7.20)
        (1000.0, 12000.0, None, "l4"),
    ],
)
def test_gpu_type_by_tokens_per_dollar(l4_tps, h100_tps, sized_at, expected):
    need = PoolNeed("p", 1, 24, gpu_types=("l4", "h100"), missing_on_demand=2,
                    tokens_per_s={"l4": l4_tps, "h100": h100_tps}, replica_tokens_per_s=sized_at)
    plan = plan_placement([need], [], [H100_1, offer("g6.xlarge", "l4", 1, 0.80)])
    assert {n.offer.gpu_type for n in plan.launches} == {expected}
    assert len(plan.placed) == 2


L40S_4 = offer("g6e.12xlarge", "l40s", 4, 15.00)


@pytest.mark.parametrize(("sized_at", "expected"), [(1000.0, "l40s"), (3500.0, "h100"), (None, "l40s")])
def test_a_gpu_type_is_priced_for_the_throughput_the_count_was_sized_at(sized_at, expected):
    """Five replicas sized at an L40S's 1000 tokens/s ask for 5000 tokens/s: five L40S replicas on
    two 4-GPU nodes ($30) carry it, or two H100 replicas on a whole p5 ($55.04): L40S. Pricing five
    H100 replicas instead (17,500 tokens/s for $55.04) valued a surplus nobody asked for, and put
    them on a p5 that consolidation then found underused. Sized at an H100's rate, the p5 carries
    17,500 tokens/s for less than the 18 L40S replicas that takes. Unsized: the slowest type's."""
    need = PoolNeed("p", 1, 24, gpu_types=("l40s", "h100"), missing_on_demand=5,
                    tokens_per_s={"l40s": 1000.0, "h100": 3500.0}, replica_tokens_per_s=sized_at)
    plan = plan_placement([need], [], [H100_8, L40S_4])
    assert {n.offer.gpu_type for n in plan.launches} == {expected}
    assert len(plan.placed) == 5  # the count stays the autoscaler's: it re-sizes once they run
    assert_no_gpu_twice(plan)


def test_a_mass_launch_of_many_small_pools_fills_whole_nodes():
    # 500 pools of three 1-GPU replicas and 100 pools of five pairs: 2500 GPUs, packed as two
    # kinds (not 600 pools), onto 312 full 8-GPU nodes and one 4-GPU node for the last 4 GPUs
    needs = [PoolNeed(f"p{i:04d}", 1, 80, missing_on_demand=3) for i in range(500)]
    needs += [PoolNeed(f"tp{i:03d}", 2, 80, gpu_types=("h100",), missing_on_demand=5) for i in range(100)]
    plan = plan_placement(needs, [], [H100_1, H100_4, H100_8, offer("g6.xlarge", "l4", 1, 0.80)])
    assert Counter(n.offer.instance_type for n in plan.launches) == {"p5.48xlarge": 312, "h100x4": 1}
    assert launch_cost(plan) == pytest.approx(312 * 55.04 + 28.00)
    assert Counter(p.pool_id for p in plan.placed) == {n.pool_id: n.missing_on_demand for n in needs}
    assert plan.unplaced == ()
    assert_no_gpu_twice(plan)
    # the pairs sit on aligned blocks
    assert all(p.gpu_ids[0] % 2 == 0 and p.gpu_ids[1] == p.gpu_ids[0] + 1 for p in plan.placed if len(p.gpu_ids) == 2)


def test_free_slots_come_before_new_nodes_and_the_rest_launches():
    n1 = node("n1", replicas=tuple(rep(f"r{g}", "x", g) for g in range(6)))
    plan = plan_placement([PoolNeed("p", 1, 80, missing_on_demand=3)], [n1], [H100_1, H100_8])
    assert Counter(p.node_id for p in plan.placed) == {"n1": 2, "new-0": 1}
    assert [n.offer.instance_type for n in plan.launches] == ["h100x1"]


def test_plan_is_deterministic():
    nodes = [node(f"n{i}", zone=f"us-east-1{'abc'[i % 3]}", replicas=(rep(f"r{i}", "x", i % 8),))
             for i in range(12)]
    needs = [PoolNeed(f"p{i}", 1 << (i % 3), 80, missing_on_demand=5, spread_zones=i % 2 == 0) for i in range(5)]
    offers = [H100_1, H100_4, H100_8]
    assert plan_placement(needs, nodes, offers) == plan_placement(needs, nodes, offers)


def test_nothing_missing_is_an_empty_plan():
    assert plan_placement([PoolNeed("p", 1, 80)], [node("n1")], [H100_8]) == PlacementPlan()


# ------------------------------------------------------------------ surplus
def test_choose_surplus_stops_not_ready_first_then_empties_the_emptiest_node():
    alone = node("alone", replicas=(rep("p-alone", "p", 0),))
    busy = node("busy", replicas=(rep("p-busy", "p", 0), rep("o1", "other", 1, 2), rep("o2", "other", 3)))
    booting = node("booting", replicas=(rep("p-boot", "p", 0, ready=False), rep("o3", "other", 1, 2, 3)))
    assert choose_surplus("p", 0, 1, [busy, alone, booting]) == ["p-boot"]
    assert choose_surplus("p", 0, 2, [busy, alone, booting]) == ["p-boot", "p-alone"]
    assert choose_surplus("p", 0, 5, [busy, alone, booting]) == ["p-boot", "p-alone", "p-busy"]


def test_choose_surplus_empties_a_node_it_has_started_on():
    # two replicas of p on n-two (2 of 8 used) and one on n-one with another pool (2 used): taking
    # one from n-two leaves 1 used there, so its second one follows and n-two empties.
    two = node("n-two", replicas=(rep("a", "p", 0), rep("b", "p", 1)))
    one = node("n-one", replicas=(rep("c", "p", 0), rep("o", "other", 1)))
    assert choose_surplus("p", 0, 2, [one, two]) == ["a", "b"]


def test_choose_surplus_per_market_and_never_a_moving_replica():
    spot = node("s", spot=True, replicas=(rep("s1", "p", 0), rep("s2", "p", 1, moving=True)))
    od = node("o", replicas=(rep("o1", "p", 0),))
    assert choose_surplus("p", 2, 0, [spot, od]) == ["s1"]
    assert choose_surplus("p", 1, 1, [spot, od]) == ["s1", "o1"]


def test_choose_surplus_takes_a_node_listed_once_per_replica():
    # callers may list a node once per replica of the pool on it
    two = node("n-two", replicas=(rep("a", "p", 0), rep("b", "p", 1)))
    assert choose_surplus("p", 0, 5, [two, two]) == ["a", "b"]


def test_a_node_being_emptied_takes_no_new_replica():
    leaving = node("leaving", replicas=(rep("r1", "x", 0, moving=True), rep("r2", "y", 1, moving=True)))
    receiving = node("receiving", replicas=(rep("r3", "x", 0), rep("copy", "x", 1, moving=True)))
    plan = plan_placement([PoolNeed("p", 1, 80, missing_on_demand=1)], [leaving, receiving], [])
    assert [p.node_id for p in plan.placed] == ["receiving"]
