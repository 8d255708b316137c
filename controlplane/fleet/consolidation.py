"""Consolidation: empty underused GPU nodes, Karpenter's delete-and-replace disruption made for GPUs.

A node that has used less than ``underused_fraction`` of its GPUs for ``settle_s`` is a
candidate. *Delete*: all its replicas move into free slots of other nodes (the same best-fit
rules as placement, through the same :class:`~controlplane.fleet.placement.FreeSlots`) and the
node goes, saving its whole price. *Replace*: failing that, all its replicas move onto one new
node of a cheaper offer, saving the difference; onto a slower GPU type only when that type's
nodes carry the same profiled throughput for less than the node costs. Every move is make-before-break, so it costs
the price of running both copies while the new one loads (GPUs × price per GPU-hour ×
model-ready time); an action is worth it only when the savings over the horizon pay for that
``min_score`` times over. Budgets cap the nodes being emptied fleet-wide and the moves in
flight per pool (a pool with none in flight may always have one node emptied, however many of
its replicas that node holds: make-before-break keeps the pool's ready floor either way).

Pure: no I/O, no clock (``now`` is an argument), deterministic.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence

from controlplane.fleet.capacity import (
    ConsolidationAction,
    ConsolidationBudget,
    HostedReplica,
    Move,
    NewNode,
    NodeSlots,
    Offer,
    PoolNeed,
)
from controlplane.fleet.placement import (
    FreeSlots,
    fits_offer,
    offer_zones,
    pick_gpus,
    placement_rank,
    plan_placement,
    tokens_per_s,
    zone_counts_of,
)

__all__ = ["plan_consolidation", "underused"]

_TINY = 1e-9


def underused(node: NodeSlots, budget: ConsolidationBudget) -> bool:
    """A launched, ready node using less than ``budget.underused_fraction`` of its GPUs (an empty
    node counts; plan_consolidation leaves those to the caller, which simply releases them)."""
    if not node.launched or not node.ready or node.gpus_total <= 0:
        return False
    return len(node.used) / node.gpus_total < budget.underused_fraction


def _disruption(node: NodeSlots) -> float:
    per_gpu_hour = node.price_per_hour / max(1, node.gpus_total)
    return sum(len(r.gpu_ids) * per_gpu_hour * r.model_ready_s / 3600.0 for r in node.replicas)


def _score(savings_per_hour: float, disruption: float, budget: ConsolidationBudget) -> float:
    return savings_per_hour * budget.horizon_s / 3600.0 / max(disruption, _TINY)


def _move_order(node: NodeSlots) -> list[HostedReplica]:
    # big replicas first: they have the fewest places to go
    return sorted(node.replicas, key=lambda r: (-len(r.gpu_ids), r.replica_id))


def _rank_of(need: PoolNeed, node: NodeSlots) -> int | None:
    """The source node's placement rank for ``need``: a move may go to as good a place or better,
    never down the operator's list. None (the node is outside the list): any allowed place."""
    return placement_rank(need.placement, node.cloud, node.region, node.zone)


def _no_slower(need: PoolNeed, gpu_type: str) -> PoolNeed:
    """The pool's need, restricted to GPU types on which a replica runs at least as fast as on
    ``gpu_type``: a move must not cost a pool throughput it has profiled (as for *replace*)."""
    if not need.tokens_per_s:
        return need
    floor = tokens_per_s(need, gpu_type) - _TINY
    allowed = tuple(t for t in (need.gpu_types or tuple(need.tokens_per_s)) if tokens_per_s(need, t) >= floor)
    return dataclasses.replace(need, gpu_types=allowed)


def _try_delete(node: NodeSlots, pools: Mapping[str, PoolNeed], slots: FreeSlots,
                zone_counts: dict[str, dict[str | None, int]]) -> list[Move] | None:
    """Moves of every replica of ``node`` into free slots of other nodes, taken from ``slots``;
    None (and ``slots`` untouched) if one of them has nowhere to go."""
    journal: list[tuple[str, int]] = []
    moves: list[Move] = []
    slots.take_out(node.node_id)
    for r in _move_order(node):
        need = _no_slower(pools[r.pool_id], node.gpu_type)
        zc = zone_counts.get(r.pool_id) if need.spread_zones else None
        if zc is not None:
            zc = dict(zc)
            zc[node.zone] = zc.get(node.zone, 0) - 1  # the copy leaves this zone
        target = slots.best(need, node.spot, len(r.gpu_ids), zone_counts=zc, max_rank=_rank_of(need, node))
        if target is None:
            slots.undo(journal)
            slots.put_back(node.node_id)
            return None
        gpus = slots.allocate(target, len(r.gpu_ids), journal)
        moves.append(Move(r.replica_id, r.pool_id, node.node_id, target, gpus))
    slots.put_back(node.node_id)  # the caller takes it out for good if it accepts the action
    return moves


def _equivalent_cost(node: NodeSlots, pools: Mapping[str, PoolNeed], offer: Offer, zone: str,
                     offers: Sequence[Offer]) -> float:
    """$/h of the nodes that carry the profiled tokens/s ``node``'s replicas carry on ``offer``'s
    GPU type: one ``offer`` node in ``zone`` (where the replace launches it) holding the moved
    replicas, plus wherever placement would put the replicas each pool's autoscaler adds to make
    up for the slower type (per replica, the ratio of the two types' throughput, rounded up, less
    the moved one). Placement's own choice
    prices them, so that a replace is never taken for make-up replicas that placement then puts
    on a new node of the type the replace left (an 8-GPU H100 node replaced by a 4×L40S one, its
    make-up replicas placed onto a new 8-GPU H100 node, and round again)."""
    extra: Counter = Counter()
    for r in node.replicas:
        need = pools[r.pool_id]
        ratio = tokens_per_s(need, node.gpu_type) / max(tokens_per_s(need, offer.gpu_type), _TINY)
        extra[r.pool_id] += math.ceil(ratio - 1e-6) - 1
    if not any(extra.values()):
        return offer.price_per_hour
    used = sum(len(r.gpu_ids) for r in node.replicas)
    new = NodeSlots(node_id="replace", cloud=offer.cloud, region=offer.region, zone=zone,
                    instance_type=offer.instance_type, gpu_type=offer.gpu_type, gpus_total=offer.gpu_count,
                    spot=offer.spot, dedicated_tenant_id=node.dedicated_tenant_id,
                    price_per_hour=offer.price_per_hour, gpu_memory_gb=offer.gpu_memory_gb,
                    replicas=(HostedReplica("moved", "moved", tuple(range(used)), True),))
    needs = [dataclasses.replace(pools[p], missing_spot=n if node.spot else 0, missing_on_demand=0 if node.spot else n,
                                 replica_tokens_per_s=tokens_per_s(pools[p], offer.gpu_type))
             for p, n in sorted(extra.items()) if n > 0]
    plan = plan_placement(needs, [new], offers)
    if plan.unplaced:
        return math.inf
    return offer.price_per_hour + sum(n.offer.price_per_hour for n in plan.launches)


def _try_replace(node: NodeSlots, pools: Mapping[str, PoolNeed], offers: Sequence[Offer],
                 pool_tps: Mapping[str, float], max_dip: float) -> tuple[NewNode, list[Move], float] | None:
    """All replicas of ``node`` on one new node of the compatible offer that saves the most, and
    the savings ($/h).

    On a GPU type at least as fast for every pool it hosts, the savings are the price difference.
    A slower type (by the pools' throughput profiles) is taken only when the offer's nodes that
    carry the same profiled throughput, as many replicas as that takes, cost less than ``node``:
    the savings are counted against all of them. The move itself is one for one (make-before-
    break, onto one new node); the pool's autoscaler sees its replicas' lower profiled
    throughput and adds the replicas that make up for it, which placement puts into the new
    node's free slots first. Until those are ready the pool serves with less: the move may take
    at most ``max_dip`` of a pool's profiled throughput (``pool_tps``: all its replicas') away.
    (bench.fleet, sample catalog, where H100s only come as 8-GPU
    nodes: an H100 node left with a few 8B replicas goes for a 4×L40S one; seeds 1-3,
    fragmentation 10.3-10.9 % -> 7.9-8.6 % of billed GPU-hours, cost -0.4 %, SLO +0.1 pt; at half
    the load 15.1 % -> 11.6 %, cost -1.6 %, SLO -0.9 pt.)"""
    pool_ids = sorted({r.pool_id for r in node.replicas})
    best: tuple[tuple, NewNode, list[Move], float] | None = None
    for i, offer in enumerate(offers):
        if offer.spot != node.spot or not offer.zones or offer.price_per_hour >= node.price_per_hour - _TINY:
            continue
        zones = set(offer.zones)
        slower = False
        for pid in pool_ids:
            need = pools[pid]
            if not fits_offer(need, offer, node.spot):
                zones = set()
                break
            # a slower GPU type must carry the pool's profiled throughput for less (see below)
            slower = slower or tokens_per_s(need, offer.gpu_type) < tokens_per_s(need, node.gpu_type) - _TINY
            rank = _rank_of(need, node)
            allowed = {z for r, zs in offer_zones(need, offer) if rank is None or r <= rank for z in zs}
            zones &= allowed
            if not zones:
                break
        if not zones:
            continue
        if slower:
            lost: dict[str, float] = {}
            for r in node.replicas:
                need = pools[r.pool_id]
                lost[r.pool_id] = lost.get(r.pool_id, 0.0) + max(
                    0.0, tokens_per_s(need, node.gpu_type) - tokens_per_s(need, offer.gpu_type))
            if any(loss > max_dip * pool_tps.get(p, 0.0) + _TINY for p, loss in lost.items()):
                continue
        mask = (1 << offer.gpu_count) - 1
        key = f"replace-{node.node_id}"
        moves: list[Move] = []
        for r in _move_order(node):
            if len(r.gpu_ids) > offer.gpu_count:
                break
            gpus = pick_gpus(mask, offer.gpu_count, len(r.gpu_ids))
            if gpus is None:
                break
            mask &= ~sum(1 << g for g in gpus)
            moves.append(Move(r.replica_id, r.pool_id, node.node_id, key, gpus))
        if len(moves) != len(node.replicas):
            continue
        # the source's zone first, so the copies stay near their traffic when it can launch there
        order = sorted((z for z in offer.zones if z in zones), key=lambda z: z != node.zone)
        savings = node.price_per_hour - (_equivalent_cost(node, pools, offer, order[0], offers) if slower
                                         else offer.price_per_hour)
        if savings <= _TINY:
            continue
        new = NewNode(key=key, offer=offer, dedicated_tenant_id=node.dedicated_tenant_id, zones=tuple(order))
        rank_key = (-savings, offer.price_per_hour, i)
        if best is None or rank_key < best[0]:
            best = (rank_key, new, moves, savings)
    return None if best is None else (best[1], best[2], best[3])


def _money(x: float) -> str:
    return f"${x:,.2f}"


def plan_consolidation(nodes: Sequence[NodeSlots], pools: Mapping[str, PoolNeed], offers: Sequence[Offer],
                       now: float, budget: ConsolidationBudget, *, scaling_up: frozenset[str] = frozenset(),
                       moves_in_flight: Mapping[str, int] | None = None,
                       nodes_in_flight: int = 0) -> list[ConsolidationAction]:
    """The consolidation actions to start now, best score first, within the budgets.

    ``nodes``: the live nodes (leave out draining ones); ``pools``: every pool with replicas on
    them (a node hosting a pool not in the mapping is left alone); ``scaling_up``: pools whose
    nodes must not be disrupted now; ``moves_in_flight``: moves already running per pool;
    ``nodes_in_flight``: nodes already being emptied.
    """
    room = budget.max_nodes_in_flight - nodes_in_flight
    if room <= 0:
        return []
    in_flight = Counter(moves_in_flight or {})

    def within_pool_budget(node: NodeSlots, planned: Counter) -> bool:
        # A pool with no move in flight may always have one node emptied, even when that node holds
        # more of its replicas than the budget: otherwise a node packed with one pool's replicas
        # could never be consolidated. Make-before-break keeps the pool's ready floor either way.
        per_pool = Counter(r.pool_id for r in node.replicas)
        return all(in_flight[p] + planned[p] == 0 or in_flight[p] + planned[p] + c <= budget.max_moves_per_pool
                   for p, c in per_pool.items())

    # Candidates, scored by their delete score: an upper bound (a replace saves less), exact once
    # the delete is known to be possible. Evaluated lazily, best first, so a tick with a budget of
    # one action simulates only the few candidates it needs.
    heap: list[tuple[float, str, int, object]] = []
    by_id: dict[str, NodeSlots] = {}
    for node in nodes:
        if not node.replicas or not underused(node, budget):
            continue
        if node.underused_since is None or now - node.underused_since < budget.settle_s:
            continue
        if any(r.moving or not r.ready or r.pool_id in scaling_up or r.pool_id not in pools
               for r in node.replicas):
            continue
        if not within_pool_budget(node, Counter()):
            continue
        disruption = _disruption(node)
        upper = _score(node.price_per_hour, disruption, budget)
        if upper < budget.min_score:
            continue
        by_id[node.node_id] = node
        heap.append((-upper, node.node_id, 0, None))
    if not heap:
        return []
    heapq.heapify(heap)

    # Targets: launched, ready nodes (a move onto a booting node would wait on the boot) with no
    # move in flight: a node whose replicas are moving may be the source of one, on its way out.
    slots = FreeSlots(n for n in nodes if n.launched and n.ready and not any(r.moving for r in n.replicas))
    spreading = {r.pool_id for n in by_id.values() for r in n.replicas if pools[r.pool_id].spread_zones}
    # each pool's profiled throughput over its ready replicas (what a slower replace may dent)
    candidate_pools = {r.pool_id for n in by_id.values() for r in n.replicas}
    pool_tps: dict[str, float] = defaultdict(float)
    for n in nodes:
        for r in n.replicas:
            if r.ready and r.pool_id in candidate_pools:
                pool_tps[r.pool_id] += tokens_per_s(pools[r.pool_id], n.gpu_type)
    zone_counts = zone_counts_of(nodes, spreading)
    planned: Counter = Counter()
    receivers: set[str] = set()  # took replicas in this plan: emptying them would move those twice
    actions: list[ConsolidationAction] = []
    while heap and len(actions) < room:
        neg, nid, stage, payload = heapq.heappop(heap)
        score = -neg
        if score < budget.min_score:
            break  # everything left scores lower still
        node = by_id[nid]
        if nid in receivers or not within_pool_budget(node, planned):
            continue
        disruption = _disruption(node)
        n = len(node.replicas)
        replicas = f"its {n} replica{'s' if n != 1 else ''}"
        if stage == 0:
            moves = _try_delete(node, pools, slots, zone_counts)
            if moves is None:
                got = _try_replace(node, pools, offers, pool_tps, budget.max_slower_dip)
                if got is not None:
                    heapq.heappush(heap, (-_score(got[2], disruption, budget), nid, 1, got))
                continue
            # the simulation's allocations stand: they are this action's moves
            targets = sorted({m.to_node for m in moves})
            savings = node.price_per_hour
            action = ConsolidationAction(
                kind="delete", node_id=nid, moves=tuple(moves), new_node=None, savings_per_hour=savings,
                disruption_cost=disruption, score=score,
                reason=(f"delete: {replicas} fit in free slots of node{'s' if len(targets) > 1 else ''} "
                        f"{', '.join(targets)}; saves {_money(savings)}/h for a {_money(disruption)} move "
                        f"(score {score:.1f})"),
            )
            receivers.update(targets)
            for m in moves:
                z = slots.nodes[m.to_node].zone
                if m.pool_id in zone_counts:
                    zone_counts[m.pool_id][node.zone] -= 1
                    zone_counts[m.pool_id][z] += 1
        else:
            new, moves, savings = payload  # type: ignore[misc]
            o = new.offer
            action = ConsolidationAction(
                kind="replace", node_id=nid, moves=tuple(moves), new_node=new, savings_per_hour=savings,
                disruption_cost=disruption, score=score,
                reason=(f"replace: {replicas} fit on one {o.instance_type} ({o.gpu_count}× {o.gpu_type}, "
                        f"{o.cloud}/{o.region}, {_money(o.price_per_hour)}/h) instead of "
                        f"{node.instance_type} at {_money(node.price_per_hour)}/h; saves {_money(savings)}/h "
                        + (f"(counting the {o.gpu_type} replicas that carry its pools' throughput) "
                           if savings < node.price_per_hour - o.price_per_hour - _TINY else "")
                        + f"for a {_money(disruption)} move (score {score:.1f})"),
            )
        slots.take_out(nid)  # being emptied: it takes no replica from a later action
        planned.update(r.pool_id for r in node.replicas)
        actions.append(action)
    return actions
