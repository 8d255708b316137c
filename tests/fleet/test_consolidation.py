"""Consolidation: underused nodes empty into others (delete) or onto a cheaper one (replace)."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.fleet.capacity import ConsolidationAction, ConsolidationBudget, NodeSlots, PoolNeed
from controlplane.fleet.consolidation import plan_consolidation, underused
from tests.fleet.test_placement import H100_1, H100_8, node, offer, rep

NOW = 10_000.0
SETTLED = NOW - 600.0  # underused for ten minutes: past the default settle_s of 300
BUDGET = ConsolidationBudget(max_moves_per_pool=1, max_nodes_in_flight=1)


def pools_for(*nodes: NodeSlots, **kw) -> dict[str, PoolNeed]:
    out = {}
    for n in nodes:
        for r in n.replicas:
            out[r.pool_id] = PoolNeed(r.pool_id, len(r.gpu_ids), 40, **kw)
    return out


def third_used_fleet() -> list[NodeSlots]:
    """Three 8-GPU nodes, each about a third used by 1-GPU replicas of distinct pools: 2 + 3 + 3."""
    def n(nid: str, pools: str) -> NodeSlots:
        return node(nid, underused_since=SETTLED, replicas=tuple(rep(f"{p}-r", p, g) for g, p in enumerate(pools)))
    return [n("n1", "ab"), n("n2", "cde"), n("n3", "fgh")]


def apply(nodes: list[NodeSlots], actions: list[ConsolidationAction], budget=BUDGET) -> list[NodeSlots]:
    """What the fleet looks like once the actions' moves are done and the emptied nodes are gone."""
    gone = {a.node_id for a in actions}
    moved = {m.replica_id: m for a in actions for m in a.moves}
    arriving = defaultdict(list)
    by_id = {r.replica_id: r for n in nodes for r in n.replicas}
    for m in moved.values():
        arriving[m.to_node].append(dataclasses.replace(by_id[m.replica_id], gpu_ids=m.gpu_ids))
    out = []
    for n in nodes:
        if n.node_id in gone:
            continue
        n = dataclasses.replace(n, replicas=n.replicas + tuple(arriving[n.node_id]))
        out.append(dataclasses.replace(n, underused_since=n.underused_since if underused(n, budget) else None))
    return out


def assert_valid(nodes: list[NodeSlots], actions: list[ConsolidationAction]) -> None:
    emptied = {a.node_id for a in actions}
    used = {n.node_id: set(n.used) for n in nodes}
    for a in actions:
        for m in a.moves:
            assert m.to_node not in emptied, "a move onto a node emptied in the same plan"
            if a.kind == "delete":
                assert not used[m.to_node] & set(m.gpu_ids), f"GPU handed out twice on {m.to_node}"
                used[m.to_node] |= set(m.gpu_ids)


def test_underused():
    half = dataclasses.replace(BUDGET, underused_fraction=0.5)
    assert underused(node("n", replicas=(rep("r", "p", 0, 1, 2),)), half)  # 3/8 < 0.5
    assert not underused(node("n", replicas=(rep("r", "p", 0, 1, 2, 3),)), half)  # 4/8
    # By default every node with a free GPU is a candidate (the score decides), a full one is not.
    assert underused(node("n", replicas=(rep("r", "p", *range(7)),)), BUDGET)
    assert not underused(node("n", replicas=(rep("r", "p", *range(8)),)), BUDGET)
    assert not underused(node("n", launched=False, replicas=(rep("r", "p", 0),)), BUDGET)
    assert not underused(node("n", ready=False, replicas=(rep("r", "p", 0),)), BUDGET)


def test_three_third_used_nodes_become_one_one_action_per_call():
    nodes = third_used_fleet()
    pools = pools_for(*nodes)
    # first: the node with the fewest replicas (least disruption, same savings) goes first, into the
    # best fit (n2 and n3 tie on free GPUs; node id decides)
    actions = plan_consolidation(nodes, pools, [], NOW, BUDGET)
    assert [(a.kind, a.node_id) for a in actions] == [("delete", "n1")]
    assert {m.to_node for m in actions[0].moves} == {"n2"}
    assert actions[0].savings_per_hour == pytest.approx(55.04)
    # disruption: 2 replicas × 1 GPU × $6.88/GPU-h × 60 s
    assert actions[0].disruption_cost == pytest.approx(2 * 6.88 * 60 / 3600)
    assert "delete: its 2 replicas fit in free slots of node n2; saves $55.04/h" in actions[0].reason
    assert_valid(nodes, actions)
    # nothing more while that node is in flight
    assert plan_consolidation(nodes, pools, [], NOW, BUDGET, nodes_in_flight=1) == []

    nodes = apply(nodes, actions)
    actions = plan_consolidation(nodes, pools, [], NOW, BUDGET)
    assert [(a.kind, a.node_id) for a in actions] == [("delete", "n3")]
    assert {m.to_node for m in actions[0].moves} == {"n2"}
    assert_valid(nodes, actions)

    nodes = apply(nodes, actions)
    assert [n.node_id for n in nodes] == ["n2"] and len(nodes[0].used) == 8
    assert plan_consolidation(nodes, pools, [], NOW, BUDGET) == []


def test_two_actions_in_one_plan_share_the_free_slots_correctly():
    nodes = third_used_fleet()
    budget = dataclasses.replace(BUDGET, max_nodes_in_flight=3)
    actions = plan_consolidation(nodes, pools_for(*nodes), [], NOW, budget)
    # n1 into n2, then n3 into what n2 has left; n2 took replicas, so it is not emptied itself
    assert [a.node_id for a in actions] == ["n1", "n3"]
    assert {m.to_node for a in actions for m in a.moves} == {"n2"}
    assert_valid(nodes, actions)


def test_replace_onto_a_cheaper_smaller_offer():
    lone = node("big", underused_since=SETTLED, replicas=(rep("r", "p", 3),))
    actions = plan_consolidation([lone], pools_for(lone), [H100_8, H100_1], NOW, BUDGET)
    assert len(actions) == 1
    a = actions[0]
    assert a.kind == "replace" and a.new_node is not None
    assert a.new_node.offer.instance_type == "h100x1"
    assert a.savings_per_hour == pytest.approx(55.04 - 7.20)
    assert [(m.replica_id, m.to_node, m.gpu_ids) for m in a.moves] == [("r", a.new_node.key, (0,))]
    assert a.new_node.zones[0] == "us-east-1a"  # the source's zone first
    assert a.reason.startswith("replace: its 1 replica fit on one h100x1")


def test_replace_onto_a_slower_type_only_when_it_carries_the_throughput_for_less():
    """A replica may move to a slower GPU type only when that type's nodes carry the pool's
    profiled throughput (as many replicas as it takes) for less than the node: the savings count
    all of them, the move is one for one (the autoscaler adds the rest), and it may dent a pool's
    throughput by at most ``max_slower_dip`` until those are ready."""
    lone = node("big", underused_since=SETTLED, replicas=(rep("r", "p", 3),))
    # the pool's other 8 replicas fill a node of their own: the move takes 4100 of 45000 tokens/s (9 %)
    full = node("full", replicas=tuple(rep(f"p{g}", "p", g) for g in range(8)))
    pools = {"p": PoolNeed("p", 1, 16, tokens_per_s={"h100": 5000.0, "l4": 900.0})}
    # 5000 / 900 tokens/s: 6 L4 replicas carry one H100 replica; 6 × $9.50 > $55.04: no
    dear = offer("g6.xlarge", "l4", 1, 9.50)
    assert plan_consolidation([lone, full], pools, [dear], NOW, BUDGET) == []
    # 6 × $0.80 = $4.80 < $55.04: yes, saving $55.04 - $4.80 (not $55.04 - $0.80)
    slow = offer("g6.xlarge", "l4", 1, 0.80)
    # with a dip budget of 10 %, not for a pool whose only replica that is (it would lose 82 % of its
    # throughput until the replicas its autoscaler adds are ready); by default (no cap) it may
    capped = dataclasses.replace(BUDGET, max_slower_dip=0.1)
    assert plan_consolidation([lone], pools, [slow], NOW, capped) == []
    assert plan_consolidation([lone], pools, [slow], NOW, BUDGET)
    assert plan_consolidation([lone, full], pools, [slow], NOW, capped)  # 9 % of the pool's 45000
    [a] = plan_consolidation([lone, full], pools, [slow], NOW, BUDGET)
    assert a.kind == "replace" and a.new_node is not None and a.new_node.offer.gpu_type == "l4"
    assert a.savings_per_hour == pytest.approx(55.04 - 6 * 0.80)
    assert [(m.replica_id, m.gpu_ids) for m in a.moves] == [("r", (0,))]
    assert "counting the l4 replicas that carry its pools' throughput" in a.reason
    # on 4-GPU nodes of that type the 6 replicas need 2 nodes: 2 × $3.60 counted
    slow4 = offer("g6.12xlarge", "l4", 4, 3.60)
    [a] = plan_consolidation([lone, full], pools, [slow4], NOW, BUDGET)
    assert a.savings_per_hour == pytest.approx(55.04 - 2 * 3.60)
    # a faster-or-equal type saves the price difference, and wins over a slower one that saves less
    h100_1 = offer("h100x1", "h100", 1, 7.20)
    [a] = plan_consolidation([lone, full], pools, [dear, h100_1], NOW, BUDGET)
    assert a.new_node.offer.instance_type == "h100x1" and a.savings_per_hour == pytest.approx(55.04 - 7.20)
    [a] = plan_consolidation([lone, full], pools, [slow, h100_1], NOW, BUDGET)
    assert a.new_node.offer.gpu_type == "l4"  # $50.24/h saved against $47.84
    pools = {"p": PoolNeed("p", 1, 16)}  # no profile: any type with the memory will do, at its price
    [a] = plan_consolidation([lone], pools, [dear], NOW, BUDGET)
    assert a.kind == "replace" and a.savings_per_hour == pytest.approx(55.04 - 9.50)


def test_a_replace_onto_a_slower_type_counts_its_make_up_replicas_where_placement_puts_them():
    """An H100 node holds three 8B replicas (3500 tokens/s each; 1000 on an L40S). Replaced by a
    4-GPU L40S node, the pool's autoscaler adds 9 replicas to carry the same throughput: one in the
    new node's free slot, eight on two more L40S nodes. The savings count what placement will do
    with those 9, and placement, asked for them at the L40S rate they were sized at, does exactly
    that: it launches the two L40S nodes the savings counted, not a new p5 that consolidation would
    find underused and replace again."""
    from controlplane.fleet.placement import plan_placement
    from tests.fleet.test_placement import L40S_4

    big = node("big", underused_since=SETTLED, replicas=tuple(rep(f"r{g}", "p", g) for g in range(3)))
    tps = {"h100": 3500.0, "l40s": 1000.0}
    pools = {"p": PoolNeed("p", 1, 16, gpu_types=("h100", "l40s"), tokens_per_s=tps)}
    [a] = plan_consolidation([big], pools, [H100_8, L40S_4], NOW, BUDGET)
    assert a.kind == "replace" and a.new_node.offer.instance_type == "g6e.12xlarge"
    assert a.savings_per_hour == pytest.approx(55.04 - 3 * 15.00)
    after = node(a.new_node.key, gpus=4, gpu_type="l40s", price=15.00,
                 replicas=tuple(rep(m.replica_id, "p", *m.gpu_ids) for m in a.moves))
    make_up = dataclasses.replace(pools["p"], missing_on_demand=9, replica_tokens_per_s=tps["l40s"])
    plan = plan_placement([make_up], [after], [H100_8, L40S_4])
    assert [n.offer.instance_type for n in plan.launches] == ["g6e.12xlarge"] * 2
    assert Counter(p.node_id for p in plan.placed)[after.node_id] == 1


def test_delete_is_preferred_to_replace():
    small = node("a-small", underused_since=SETTLED, replicas=(rep("r", "p", 0),))
    host = node("b-host", replicas=tuple(rep(f"x{g}", "x", g) for g in range(4)))
    actions = plan_consolidation([small, host], pools_for(small, host), [H100_1], NOW, BUDGET)
    assert [(a.kind, a.node_id) for a in actions] == [("delete", "a-small")]
    assert actions[0].moves[0].to_node == "b-host" and actions[0].moves[0].gpu_ids == (4,)


def test_nothing_before_settle_s():
    nodes = [dataclasses.replace(n, underused_since=NOW - 100) for n in third_used_fleet()]
    assert plan_consolidation(nodes, pools_for(*nodes), [], NOW, BUDGET) == []
    nodes = [dataclasses.replace(n, underused_since=None) for n in nodes]
    assert plan_consolidation(nodes, pools_for(*nodes), [], NOW, BUDGET) == []


def test_nothing_for_a_pool_scaling_up():
    nodes = third_used_fleet()
    actions = plan_consolidation(nodes, pools_for(*nodes), [], NOW, BUDGET, scaling_up=frozenset({"a"}))
    assert [a.node_id for a in actions] == ["n2"]  # n1 hosts pool a; the next best is n2 (into n3)
    assert not any(m.pool_id == "a" for a in actions for m in a.moves)


def test_disruption_score_gates_the_move():
    nodes = third_used_fleet()
    slow = [dataclasses.replace(n, replicas=tuple(dataclasses.replace(r, model_ready_s=1e6) for r in n.replicas))
            for n in nodes]
    # 2 × $6.88 × 1e6 s / 3600 ≈ $3822 to move vs $55.04 saved over the hour
    assert plan_consolidation(slow, pools_for(*slow), [], NOW, BUDGET) == []
    # a longer horizon pays for it
    patient = dataclasses.replace(BUDGET, horizon_s=3600 * 24 * 365)
    assert len(plan_consolidation(slow, pools_for(*slow), [], NOW, patient)) == 1


def test_per_pool_move_budget():
    nodes = third_used_fleet()
    pools = pools_for(*nodes)
    # pool a already has a move in flight: n1 (hosting a) waits, n2 goes instead
    actions = plan_consolidation(nodes, pools, [], NOW, BUDGET, moves_in_flight={"a": 1})
    assert [a.node_id for a in actions] == ["n2"]
    # a pool with nothing in flight may have one node emptied even when that node holds more of
    # its replicas than the budget (else a node packed with one pool could never go) …
    twins = node("twins", underused_since=SETTLED, replicas=(rep("t1", "t", 0), rep("t2", "t", 1)))
    host = node("host", replicas=tuple(rep(f"x{g}", "x", g) for g in range(4)))
    pools = pools_for(twins, host)
    assert [a.node_id for a in plan_consolidation([twins, host], pools, [], NOW, BUDGET)] == ["twins"]
    # … but not while one of its moves is in flight, unless the budget has room for both
    assert plan_consolidation([twins, host], pools, [], NOW, BUDGET, moves_in_flight={"t": 1}) == []
    roomy = dataclasses.replace(BUDGET, max_moves_per_pool=3)
    assert [a.node_id for a in plan_consolidation([twins, host], pools, [], NOW, roomy,
                                                  moves_in_flight={"t": 1})] == ["twins"]
    # within one plan: the second node of a pool waits for the first one's moves
    twins2 = node("twins2", underused_since=SETTLED, replicas=(rep("t3", "t", 0),))
    budget = dataclasses.replace(BUDGET, max_nodes_in_flight=3)
    actions = plan_consolidation([twins, twins2, host], pools_for(twins, twins2, host), [], NOW, budget)
    assert [a.node_id for a in actions] == ["twins2"]


def test_never_a_replica_that_is_not_ready_or_already_moving():
    nodes = third_used_fleet()
    n1 = nodes[0]
    not_ready = dataclasses.replace(n1, replicas=(dataclasses.replace(n1.replicas[0], ready=False), n1.replicas[1]))
    actions = plan_consolidation([not_ready, *nodes[1:]], pools_for(*nodes), [], NOW, BUDGET)
    assert [a.node_id for a in actions] == ["n2"]
    assert all(m.replica_id != n1.replicas[0].replica_id for a in actions for m in a.moves)
    moving = dataclasses.replace(n1, replicas=(dataclasses.replace(n1.replicas[0], moving=True), n1.replicas[1]))
    actions = plan_consolidation([moving, *nodes[1:]], pools_for(*nodes), [], NOW, BUDGET)
    assert [a.node_id for a in actions] == ["n2"]


def test_never_onto_a_node_emptied_in_the_same_plan():
    a = node("a", underused_since=SETTLED, replicas=(rep("ra", "p", 0),))
    b = node("b", underused_since=SETTLED, replicas=(rep("rb", "q", 0),))
    budget = dataclasses.replace(BUDGET, max_nodes_in_flight=2)
    actions = plan_consolidation([a, b], pools_for(a, b), [], NOW, budget)
    # a empties into b; b cannot then empty into a (nor anywhere else)
    assert [(x.node_id, x.moves[0].to_node) for x in actions] == [("a", "b")]
    assert_valid([a, b], actions)


def test_moves_go_only_to_launched_ready_nodes_of_the_same_market():
    src = node("src", underused_since=SETTLED, replicas=(rep("r", "p", 0),))
    booting = node("booting", ready=False)
    pending = node("pending", launched=False, zone=None)
    spot = node("spot", spot=True)
    actions = plan_consolidation([src, booting, pending, spot], pools_for(src), [], NOW, BUDGET)
    assert actions == []


def test_moves_never_go_down_the_placement_order():
    from controlplane.fleet.capacity import PlacementPref

    east = node("east", underused_since=SETTLED, replicas=(rep("r", "p", 0),))
    west = node("west", region="us-west-2", zone="us-west-2a", replicas=(rep("x", "x", 0, 1, 2, 3),))
    order = (PlacementPref("aws", "us-east-1"), PlacementPref("aws", "us-west-2"))
    pools = {"p": PoolNeed("p", 1, 40, placement=order), "x": PoolNeed("x", 4, 40)}
    assert plan_consolidation([east, west], pools, [], NOW, BUDGET) == []
    pools["p"] = PoolNeed("p", 1, 40, placement=order[::-1])
    assert [a.node_id for a in plan_consolidation([east, west], pools, [], NOW, BUDGET)] == ["east"]


def test_empty_nodes_and_unknown_pools_are_left_to_the_caller():
    empty = node("empty", underused_since=SETTLED)
    stray = node("stray", underused_since=SETTLED, replicas=(rep("r", "unknown", 0),))
    host = node("host")
    assert plan_consolidation([empty, stray, host], {}, [H100_1], NOW, BUDGET) == []


# ------------------------------------------------------------------ random fleets


@st.composite
def fleet_st(draw):
    nodes = []
    for i in range(draw(st.integers(1, 8))):
        total = draw(st.sampled_from((2, 4, 8, 8)))
        free = list(range(total))
        reps = []
        # half the nodes underused (less than half their GPUs), the others filled at random
        room = (total - 1) // 2 if draw(st.booleans()) else total
        for j in range(draw(st.integers(0, total))):
            k = draw(st.sampled_from([s for s in (1, 2, 4) if s <= len(free) - (total - room)] or [0]))
            if not k:
                break
            gpus, free = tuple(free[:k]), free[k:]
            reps.append(rep(f"n{i}-r{j}", f"p{k}-{draw(st.integers(0, 5))}", *gpus, ready=draw(st.integers(0, 9)) > 0,
                            moving=draw(st.integers(0, 9)) == 0, model_ready_s=draw(st.sampled_from((30.0, 600.0)))))
        nodes.append(node(f"n{i}", gpus=total, spot=draw(st.booleans()), price=total * 6.88,
                          zone=draw(st.sampled_from(("us-east-1a", "us-east-1b"))), replicas=tuple(reps),
                          underused_since=draw(st.sampled_from((None, SETTLED, SETTLED, SETTLED, NOW - 10)))))
    offers = [H100_1, offer("h100x2", "h100", 2, 14.0), H100_8, offer("h100x1s", "h100", 1, 3.0, spot=True)]
    budget = ConsolidationBudget(max_moves_per_pool=draw(st.integers(1, 3)),
                                 max_nodes_in_flight=draw(st.integers(1, 4)))
    in_flight = {f"p1-{i}": draw(st.integers(0, 2)) for i in range(2)}
    return nodes, offers, budget, in_flight


@settings(max_examples=150, deadline=None)
@given(fleet_st())
def test_consolidation_rules_always_hold(fleet):
    nodes, offers, budget, in_flight = fleet
    pools = pools_for(*nodes)
    actions = plan_consolidation(nodes, pools, offers, NOW, budget, moves_in_flight=in_flight)
    assert len(actions) <= budget.max_nodes_in_flight
    assert_valid(nodes, actions)
    by_id = {n.node_id: n for n in nodes}
    moves_per_pool: Counter = Counter()
    for a in actions:
        src = by_id[a.node_id]
        assert src.replicas and underused(src, budget) and a.score >= budget.min_score
        assert src.underused_since is not None and NOW - src.underused_since >= budget.settle_s
        assert {m.replica_id for m in a.moves} == {r.replica_id for r in src.replicas}
        assert all(r.ready and not r.moving for r in src.replicas)
        for m in a.moves:
            moves_per_pool[m.pool_id] += 1
            if a.kind == "delete":
                dst = by_id[m.to_node]
                assert dst.spot == src.spot and dst.launched and dst.ready and dst.node_id != src.node_id
                assert not any(r.moving for r in dst.replicas)
        if a.kind == "replace":
            assert a.new_node is not None and a.new_node.offer.spot == src.spot
            assert a.new_node.offer.price_per_hour < src.price_per_hour
    for p, c in moves_per_pool.items():
        # a pool with nothing in flight may have one node emptied whatever it holds; beyond that, the budget
        assert in_flight.get(p, 0) == 0 or in_flight.get(p, 0) + c <= budget.max_moves_per_pool


def test_delete_never_moves_a_replica_onto_a_slower_gpu_type() -> None:
    """A replica on an H100 does not move into a free L40S slot when the pool's profile says it runs
    slower there (a delete must not cost throughput, as a replace must not); onto another H100 it may."""
    fast = node("h", underused_since=SETTLED, replicas=(rep("r", "p", 0),))
    l40s = node("l", gpu_type="l40s", gpus=4, price=10.49, replicas=(rep("x", "q", 0),))
    pools = {"p": PoolNeed("p", 1, 40, gpu_types=("h100", "l40s"), tokens_per_s={"h100": 9000.0, "l40s": 3000.0}),
             "q": PoolNeed("q", 1, 40, gpu_types=("l40s",))}
    assert plan_consolidation([fast, l40s], pools, [], NOW, BUDGET) == []
    other_h100 = node("h2", replicas=(rep("y", "q2", 0),))
    pools["q2"] = PoolNeed("q2", 1, 40)
    [action] = plan_consolidation([fast, l40s, other_h100], pools, [], NOW, BUDGET)
    assert action.kind == "delete" and {m.to_node for m in action.moves} == {"h2"}


def test_a_node_a_consolidation_emptied_skips_the_empty_node_ttl() -> None:
    """reconcile.emptied_by_consolidation: an empty node whose replicas a consolidation moved away
    goes at once; the TTL is for nodes a scale-down happened to empty."""
    import datetime as dt

    from controlplane.config import Settings
    from controlplane.fleet.reconcile import emptied_by_consolidation
    from controlplane.models import Node

    settings = Settings()
    now = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    began = now - dt.timedelta(seconds=200)

    def empty_node(record: dict | None, empty_for_s: float = 10.0) -> Node:
        return Node(metrics={"consolidation": record} if record is not None else {},
                    empty_since=now - dt.timedelta(seconds=empty_for_s))

    assert emptied_by_consolidation(empty_node({"at": began.isoformat(), "kind": "delete"}), now, settings)
    assert not emptied_by_consolidation(empty_node(None), now, settings)  # a scale-down emptied it
    assert not emptied_by_consolidation(empty_node({"kind": "delete"}), now, settings)  # no time: not ours
    # empty since before the consolidation began (a record written later does not date its emptiness)
    assert not emptied_by_consolidation(empty_node({"at": began.isoformat()}, empty_for_s=300), now, settings)
    # a consolidation longer ago than a move and its drain can take: the node has lived since
    old = now - dt.timedelta(seconds=settings.replica_start_deadline_s + settings.drain_timeout_s + 60)
    assert not emptied_by_consolidation(empty_node({"at": old.isoformat()}, empty_for_s=10), now, settings)
    assert emptied_by_consolidation(Node(metrics={"consolidation": {"at": began.replace(tzinfo=None).isoformat()}},
                                         empty_since=now), now, settings)  # a naive time is UTC


def test_the_slower_type_dip_cap_is_an_operator_setting(tmp_path) -> None:
    from pydantic import ValidationError

    from controlplane.config import Settings
    from controlplane.fleet.reconcile import consolidation_budget

    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert consolidation_budget(Settings(database_url=url)).max_slower_dip == ConsolidationBudget.max_slower_dip
    assert consolidation_budget(Settings(database_url=url, consolidation_max_slower_dip=0.35)).max_slower_dip == 0.35
    with pytest.raises(ValidationError):
        Settings(database_url=url, consolidation_max_slower_dip=1.5)
