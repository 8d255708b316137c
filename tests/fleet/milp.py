"""The exact reference for new-node packing: the cheapest $/hour that hosts every missing replica.

A mixed-integer program solved by HiGHS through ``scipy.optimize.milp``. It is written apart from
``controlplane.fleet.placement`` (its own compatibility rules, no shared helpers) so that a test
comparing the two checks the heuristic against an independent statement of the problem.
Usable from tests and benches alike: no pytest in here.

The problem, per market and dedication (those never share a node):

* each pool's replicas may use the offers of the first entry of its placement list that has a
  launchable offer fitting them (GPU type, memory per GPU, GPU count, market), in the zones
  that entry allows; with no placement list, every fitting offer in every zone;
* a new node is one offer launched in one zone; replicas sharing it must all allow that zone;
* a node's replicas use at most its GPUs; minimise the summed price of the nodes.

Replicas that no offer can host are left out (every plan must report them unplaced), and
throughput profiles are ignored: this is the price optimum, the floor for any plan.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from controlplane.fleet.capacity import Offer, PoolNeed

__all__ = ["allowed_sites", "exact_min_cost"]


def allowed_sites(need: PoolNeed, offers: Sequence[Offer], spot: bool) -> dict[int, frozenset[str]]:
    """offer index → zones where a new node of that offer may host a replica of ``need``."""
    by_rank: dict[int, dict[int, frozenset[str]]] = defaultdict(dict)
    for o, offer in enumerate(offers):
        if offer.spot != spot or offer.gpu_count < need.gpus_per_replica:
            continue
        if offer.gpu_memory_gb < need.gpu_memory_gb or (need.gpu_types and offer.gpu_type not in need.gpu_types):
            continue
        if not need.placement:
            if offer.zones:
                by_rank[0][o] = frozenset(offer.zones)
            continue
        for rank, pref in enumerate(need.placement):
            if pref.cloud != offer.cloud or (pref.region is not None and pref.region != offer.region):
                continue
            zones = frozenset(z for z in offer.zones if not pref.zones or z in pref.zones)
            if zones:
                by_rank[rank].setdefault(o, zones)
    return dict(by_rank[min(by_rank)]) if by_rank else {}


def _divisible_chain(sizes: set[int]) -> bool:
    ordered = sorted(sizes)
    return all(b % a == 0 for a, b in pairwise(ordered))


def _group_min_cost(pools: list[tuple[int, int, dict[int, frozenset[str]]]], offers: Sequence[Offer],
                    time_limit: float | None) -> float:
    # Sites: (offer, set of pools that may share a node there). Zones with the same compatible
    # pools are interchangeable, so one site stands for all of them.
    sites: dict[tuple[int, frozenset[int]], None] = {}
    for o in sorted({o for _, _, allowed in pools for o in allowed}):
        zones = sorted({z for _, _, allowed in pools for z in allowed.get(o, ())})
        for z in zones:
            members = frozenset(p for p, (_, _, allowed) in enumerate(pools) if z in allowed.get(o, ()))
            sites[(o, members)] = None
    # Node variables. Where the replica sizes and the shape form a divisibility chain (1, 2, 4, 8
    # GPUs into 8), replicas whose GPUs add up to at most n nodes' GPUs always pack into n nodes
    # (largest first never leaves a gap), so one integer node count per site is exact. Elsewhere
    # one binary per possible node: at most as many nodes as replicas that could go there.
    nodes: list[tuple[int, frozenset[int], int, int]] = []  # (offer, members, copy, upper bound)
    for o, members in sites:
        cap = offers[o].gpu_count
        if _divisible_chain({pools[p][0] for p in members} | {cap}):
            gpus = sum(pools[p][0] * pools[p][1] for p in members)
            nodes.append((o, members, 0, -(-gpus // cap)))
        else:
            nodes.extend((o, members, u, 1) for u in range(sum(pools[p][1] for p in members)))
    n_y = len(nodes)
    x_index: dict[tuple[int, int], int] = {}
    for i, (_, members, _, _) in enumerate(nodes):
        for p in sorted(members):
            x_index[(p, i)] = n_y + len(x_index)
    n = n_y + len(x_index)
    cost = np.zeros(n)
    upper = np.ones(n)
    for i, (o, _, _, bound) in enumerate(nodes):
        cost[i] = offers[o].price_per_hour
        upper[i] = bound
    for (p, _), col in x_index.items():
        upper[col] = pools[p][1]
    rows, cols, vals, lo, hi = [], [], [], [], []

    def row(entries: list[tuple[int, float]], lb: float, ub: float) -> None:
        r = len(lo)
        for c, v in entries:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo.append(lb)
        hi.append(ub)

    by_pool: dict[int, list[int]] = defaultdict(list)
    for (p, _), col in x_index.items():
        by_pool[p].append(col)
    for p, (_, count, _) in enumerate(pools):  # every replica somewhere
        row([(col, 1.0) for col in by_pool[p]], count, count)
    for i, (o, members, u, _) in enumerate(nodes):  # the nodes' GPUs
        row([(x_index[(p, i)], float(pools[p][0])) for p in sorted(members)] + [(i, -offers[o].gpu_count)],
            -np.inf, 0.0)
        if u > 0:  # symmetry: the u-th node of a site is used only if the (u-1)-th is
            row([(i, 1.0), (i - 1, -1.0)], -np.inf, 0.0)
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), n))
    options = {"time_limit": time_limit} if time_limit else {}
    res = milp(cost, constraints=LinearConstraint(a, lo, hi), integrality=np.ones(n),
               bounds=Bounds(np.zeros(n), upper), options=options)
    if res.x is None or (res.status != 0 and not time_limit):
        raise RuntimeError(f"MILP not solved: {res.message}")
    return float(res.fun)


def exact_min_cost(needs: Sequence[PoolNeed], offers: Sequence[Offer], *, time_limit: float | None = None) -> float:
    """Minimal $/hour of new nodes hosting every missing replica of ``needs`` that any offer can host.

    With ``time_limit`` (seconds per market and dedication) a search cut short returns the best
    plan found by then, an upper bound on the optimum; without it the answer is exact.
    """
    groups: dict[tuple[bool, str | None], list[tuple[int, int, dict[int, frozenset[str]]]]] = defaultdict(list)
    for need in needs:
        for spot, count in ((True, need.missing_spot), (False, need.missing_on_demand)):
            if count <= 0:
                continue
            allowed = allowed_sites(need, offers, spot)
            if allowed:
                groups[(spot, need.dedicated_tenant_id)].append((need.gpus_per_replica, count, allowed))
    return sum(_group_min_cost(pools, offers, time_limit) for _, pools in sorted(groups.items(), key=str))
