"""Spare replicas as pure policy (``controlplane.fleet.spares``): which free slots they take,
which spares a growing pool promotes, when a surplus replica stays as one, what a placement evicts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.fleet import spares
from controlplane.fleet.capacity import HostedReplica, NodeSlots, PoolNeed
from controlplane.fleet.spares import has_spares, keep_as_spare, overlapping, plan_spares, promote


def node(node_id: str, total: int, held: dict[str, tuple[int, ...]] = (), *, gpu_type: str = "h100",
         dedicated: str | None = None, memory: float = 80.0, spot: bool = False, moving: bool = False) -> NodeSlots:
    hosted = tuple(HostedReplica(replica_id=f"{node_id}-{pool}-{i}", pool_id=pool, gpu_ids=gpus, ready=True,
                                 moving=moving)
                   for i, (pool, gpus) in enumerate(dict(held).items()))
    return NodeSlots(node_id=node_id, cloud="aws", region="us-east-1", zone="us-east-1a", instance_type="x",
                     gpu_type=gpu_type, gpus_total=total, spot=spot, dedicated_tenant_id=dedicated,
                     price_per_hour=10.0 * total, replicas=hosted, gpu_memory_gb=memory)


def need(pool_id: str, gpus: int = 1, *, types: tuple[str, ...] = ("h100",), tps: dict | None = None,
         dedicated: str | None = None, memory: float = 40.0) -> PoolNeed:
    return PoolNeed(pool_id=pool_id, gpus_per_replica=gpus, gpu_memory_gb=memory, gpu_types=types,
                    dedicated_tenant_id=dedicated, tokens_per_s=tps or {"h100": 1000.0})


def test_free_slots_go_to_the_pool_with_the_least_spare_capacity_for_its_size():
    # Pool a serves 4x what b serves: of four free GPUs each gets a first spare, then a gets the
    # rest (its spare capacity is the smaller share of its load).
    n = node("n1", 8, {"a": (0, 1, 2), "b": (3,)})
    pools = {"a": need("a"), "b": need("b")}
    out = plan_spares([n], pools, {"a": 4000.0, "b": 1000.0}, {}, max_ratio=2.0)
    got = sorted(s.pool_id for s in out)
    assert got == ["a", "a", "a", "b"]
    gpus = [g for s in out for g in s.gpu_ids]
    assert sorted(gpus) == [4, 5, 6, 7]  # exactly the free GPUs, each once


def test_a_pool_stops_at_its_ratio_and_pools_that_do_not_serve_get_none():
    n = node("n1", 8, {"a": (0,)})
    pools = {"a": need("a"), "idle": need("idle")}
    out = plan_spares([n], pools, {"a": 1000.0, "idle": 0.0}, {}, max_ratio=2.0)
    assert [s.pool_id for s in out] == ["a", "a"]  # 2x its serving capacity, then the slots stay free
    # Spares it already has count against the ratio.
    assert plan_spares([n], pools, {"a": 1000.0}, {"a": 2000.0}, max_ratio=2.0) == []
    # The first spare always fits, even past the ratio (a 4x-faster GPU type for a small pool).
    fast = node("n2", 2, {"a": (0,)}, gpu_type="b200")
    pools_fast = {"a": need("a", types=("h100", "b200"), tps={"h100": 1000.0, "b200": 4000.0})}
    assert [s.pool_id for s in plan_spares([fast], pools_fast, {"a": 1000.0}, {}, max_ratio=2.0)] == ["a"]


def test_spares_respect_gpu_type_memory_replica_size_and_dedication():
    shared = node("n1", 8, {"x": (0, 1, 2, 3, 4, 5)}, gpu_type="l40s", memory=48.0)
    pools = {
        "h100-only": need("h100-only"),
        "big": need("big", gpus=4, types=("l40s",), tps={"l40s": 500.0}),
        "hungry": need("hungry", types=("l40s",), tps={"l40s": 500.0}, memory=60.0),
        "theirs": need("theirs", types=("l40s",), tps={"l40s": 500.0}, dedicated="t1"),
        "pair": need("pair", gpus=2, types=("l40s",), tps={"l40s": 500.0}),
    }
    serving = {p: 1000.0 for p in pools}
    out = plan_spares([shared], pools, serving, {}, max_ratio=2.0)
    assert [(s.pool_id, s.gpu_ids) for s in out] == [("pair", (6, 7))]
    # A dedicated node takes its tenant's pools only.
    mine = node("n2", 2, {"theirs": (0,)}, gpu_type="l40s", memory=48.0, dedicated="t1")
    assert [s.pool_id for s in plan_spares([mine], pools, serving, {}, max_ratio=2.0)] == ["theirs"]


def test_promotion_takes_ready_spares_first_and_keeps_to_each_market():
    spares = [("s1", False, False), ("s2", False, True), ("s3", True, True), ("s4", False, True)]
    assert promote(spares, 0, 2) == ["s2", "s4"]
    assert promote(spares, 1, 3) == ["s2", "s3", "s4", "s1"]
    assert promote(spares, 0, 0) == []


def test_a_surplus_replica_stays_as_a_spare_only_where_it_saves_nothing_to_stop_it():
    assert keep_as_spare(True, True, 0, 3, 2.0)
    assert not keep_as_spare(False, True, 0, 3, 2.0)  # still loading: nothing warm to keep
    assert not keep_as_spare(True, False, 0, 3, 2.0)  # its node would go: stopping it saves the node
    assert not keep_as_spare(True, True, 0, 0, 2.0)  # a pool going to zero is off
    assert not keep_as_spare(True, True, 6, 3, 2.0)  # past max_ratio spares per replica
    # A dedicated pool has none: its tenant's GPU quota counts every replica it holds.
    assert has_spares(True, None) and not has_spares(True, "tenant-1") and not has_spares(False, None)


def test_a_placement_evicts_exactly_the_spares_on_its_gpus():
    spares = [("s1", (0,)), ("s2", (1, 2)), ("s3", (3,))]
    assert overlapping((2, 3), spares) == ["s2", "s3"]
    assert overlapping((4,), spares) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(0, 255)), min_size=1, max_size=6),
       st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.floats(0, 5000)), min_size=1, max_size=5),
       st.floats(0.5, 3.0))
def test_spares_never_take_a_gpu_that_is_held_or_handed_out_twice(shapes, pool_specs, ratio):
    nodes = []
    for i, (total, mask) in enumerate(shapes):
        held = tuple(g for g in range(total) if mask >> g & 1)
        nodes.append(node(f"n{i}", total, {"x": held} if held else {}))
    pools = {f"p{i}": need(f"p{i}", gpus) for i, (gpus, _) in enumerate(pool_specs)}
    serving = {f"p{i}": tps for i, (_, tps) in enumerate(pool_specs)}
    out = plan_spares(nodes, pools, serving, {}, max_ratio=ratio)
    by_node = {n.node_id: n for n in nodes}
    taken: dict[str, set[int]] = {n.node_id: set(n.used) for n in nodes}
    per_pool: dict[str, int] = {}
    for s in out:
        assert len(s.gpu_ids) == pools[s.pool_id].gpus_per_replica
        assert all(0 <= g < by_node[s.node_id].gpus_total for g in s.gpu_ids)
        assert not taken[s.node_id] & set(s.gpu_ids)
        taken[s.node_id] |= set(s.gpu_ids)
        assert serving[s.pool_id] > 0
        per_pool[s.pool_id] = per_pool.get(s.pool_id, 0) + 1
    for pool_id, count in per_pool.items():  # each spare is 1000 tok/s on h100: the ratio holds past the first
        assert count == 1 or count * 1000.0 <= ratio * serving[pool_id] + 1e-6


def reference_plan(nodes, pools, serving, spare, max_ratio):
    """The rule in its plainest form: per free slot, scan every pool (what ``plan_spares`` does
    with heaps, shared by nodes alike)."""
    from controlplane.fleet.placement import fits_node, pick_gpus, tokens_per_s
    have = dict(spare)
    out = []
    for n in sorted(nodes, key=lambda n: n.node_id):
        free = set(n.free_gpus)
        while free:
            best = None
            for pool_id in sorted(p for p, tps in serving.items() if tps > 0 and p in pools):
                need = pools[pool_id]
                if need.gpus_per_replica > len(free) or not fits_node(need, n):
                    continue
                tps = tokens_per_s(need, n.gpu_type)
                got = have.get(pool_id, 0.0)
                if tps <= 0 or (got > 0 and got + tps > max_ratio * serving[pool_id]):
                    continue
                gpus = pick_gpus(free, n.gpus_total, need.gpus_per_replica)
                if gpus is None:
                    continue
                key = (got / serving[pool_id], -serving[pool_id], pool_id)
                if best is None or key < best[0]:
                    best = (key, pool_id, gpus, tps)
            if best is None:
                break
            _, pool_id, gpus, tps = best
            out.append((pool_id, n.node_id, gpus))
            have[pool_id] = have.get(pool_id, 0.0) + tps
            free -= set(gpus)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(0, 255), st.sampled_from(["h100", "l40s"])),
                min_size=1, max_size=8),
       st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.floats(0, 5000), st.floats(0, 3000),
                          st.sampled_from([("h100",), ("l40s",), ("h100", "l40s")])), min_size=1, max_size=6),
       st.floats(0.5, 3.0))
def test_the_heaps_choose_exactly_what_scanning_every_pool_for_every_slot_chooses(shapes, pool_specs, ratio):
    nodes = [node(f"n{i}", total, {"x": tuple(g for g in range(total) if mask >> g & 1)} if mask % (1 << total)
                  else {}, gpu_type=gpu_type) for i, (total, mask, gpu_type) in enumerate(shapes)]
    pools = {f"p{i}": need(f"p{i}", gpus, types=types, tps={"h100": 1000.0, "l40s": 300.0})
             for i, (gpus, _, _, types) in enumerate(pool_specs)}
    serving = {f"p{i}": tps for i, (_, tps, _, _) in enumerate(pool_specs)}
    spare = {f"p{i}": s for i, (_, _, s, _) in enumerate(pool_specs)}
    got = [(s.pool_id, s.node_id, s.gpu_ids) for s in plan_spares(nodes, pools, serving, spare, max_ratio=ratio)]
    assert got == reference_plan(nodes, pools, serving, spare, ratio)


# ---------------------------------------------------------------- swaps: nodes emptied by promotion
EIGHT_B = {"h100": 9.6, "l40s": 2.7}


def test_a_node_whose_replicas_all_have_warm_spares_elsewhere_is_emptied_by_promotion():
    """An L40S node holds one replica of each 8B pool; an H100 node billed for a 70B replica
    holds a ready spare of each on its floor. The spares take over, the L40S replicas become
    spares, and the L40S node holds only spares: it goes, with no copy loaded anywhere."""
    small = node("l40s-1", 4, {"a": (0,), "b": (1,)}, gpu_type="l40s")
    big = node("h100-1", 8, {"70b": (0, 1, 2, 3)})
    pools = {p: need(p, types=("h100", "l40s"), tps=EIGHT_B) for p in ("a", "b")} | {"70b": need("70b", 4)}
    held = {"h100-1": [("sa", "a", True), ("sb", "b", True)]}
    assert sorted(spares.plan_swaps([small, big], held, pools), key=lambda s: s.spare_id) == [
        spares.Swap("sa", "l40s-1-a-0"), spares.Swap("sb", "l40s-1-b-1")]


def test_no_swap_unless_the_whole_node_empties():
    small = node("l40s-1", 4, {"a": (0,), "b": (1,)}, gpu_type="l40s")
    big = node("h100-1", 8, {"70b": (0, 1, 2, 3)})
    pools = {p: need(p, types=("h100", "l40s"), tps=EIGHT_B) for p in ("a", "b")} | {"70b": need("70b", 4)}
    # b has no spare: a's swap alone would relabel replicas and release nothing
    assert spares.plan_swaps([small, big], {"h100-1": [("sa", "a", True)]}, pools) == []


def test_a_swap_never_costs_throughput_markets_or_a_node_that_would_not_stay_billed():
    pools = {"a": need("a", types=("h100", "l40s"), tps=EIGHT_B), "x": need("x")}
    on_h100 = node("h100-1", 8, {"a": (0,)})
    on_l40s = node("l40s-1", 4, {"x": (0,)}, gpu_type="l40s")
    # the spare is on a slower GPU type: the pool would lose profiled throughput
    assert spares.plan_swaps([on_h100, on_l40s], {"l40s-1": [("sa", "a", True)]}, pools) == []
    # the spare is still loading
    donor = node("l40s-2", 4, {"a": (0,)}, gpu_type="l40s")
    host = node("h100-2", 8, {"x": (0,)})
    assert spares.plan_swaps([donor, host], {"h100-2": [("sa", "a", False)]}, pools) == []
    # the spare is on a spot node, the replica on demand
    spot_host = node("h100-3", 8, {"x": (0,)}, spot=True)
    assert spares.plan_swaps([donor, spot_host], {"h100-3": [("sa", "a", True)]}, pools) == []
    # the spare's node holds nothing else (it is empty itself), or a consolidation is emptying it
    bare = node("h100-4", 8)
    source = node("h100-5", 8, {"x": (0,)}, moving=True)
    assert spares.plan_swaps([donor, bare], {"h100-4": [("sa", "a", True)]}, pools) == []
    assert spares.plan_swaps([donor, source], {"h100-5": [("sa", "a", True)]}, pools, {"h100-5"}) == []
    # a replacement node filling with a move's copies stays: a fine host
    filling = node("h100-6", 8, {"x": (0,)}, moving=True)
    assert spares.plan_swaps([donor, filling], {"h100-6": [("sa", "a", True)]}, pools) == [spares.Swap("sa", "l40s-2-a-0")]
    # a replica that is moving is a consolidation's: left alone
    busy = node("l40s-3", 4, {"a": (0,)}, gpu_type="l40s", moving=True)
    assert spares.plan_swaps([busy, host], {"h100-2": [("sa", "a", True)]}, pools) == []
    # with everything right, it swaps
    assert spares.plan_swaps([donor, host], {"h100-2": [("sa", "a", True)]}, pools) == [spares.Swap("sa", "l40s-2-a-0")]


def test_a_node_that_takes_over_is_never_emptied_and_each_spare_stands_in_once():
    """Two half-used H100 nodes, each with a spare of the other's pool: emptying the first by
    promoting on the second makes the second stay, so only one swap happens; a spare promoted
    once is not promoted for another replica."""
    pools = {p: need(p) for p in ("a", "b")}
    n1 = node("n1", 8, {"a": (0,)})
    n2 = node("n2", 8, {"b": (0,), "b2": (1,)})
    pools["b2"] = need("b2")
    held = {"n1": [("sb", "b", True)], "n2": [("sa", "a", True)]}
    assert spares.plan_swaps([n1, n2], held, pools) == [spares.Swap("sa", "n1-a-0")]
    two = node("n3", 8, {"a": (0,), "a2": (1,)})
    pools["a2"] = need("a2")
    # one spare of a, two replicas needing one each (a and a2): a2 has none, so n3 stays
    assert spares.plan_swaps([two, n2], {"n2": [("sa", "a", True)]}, pools) == []
