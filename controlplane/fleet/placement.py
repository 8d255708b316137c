"""Placement: where the fleet's missing replicas go, and which surplus replicas stop.

Pure functions over the values in ``capacity``: no I/O, no clock, no randomness; the same input
always gives the same plan. ``plan_placement`` works in two phases:

1. **Free slots first.** Every missing replica goes into free GPU slots of an existing node
   (launched or still pending) when one fits: the pool's placement order first, then the
   least-used zone for pools that spread, then a node whose artifact cache holds the pool's
   checkpoint (the replica starts without the download), then best fit (the node with the
   fewest free GPUs that still fits, so packing stays tight), then node id. Free slots are
   indexed in buckets by node group and free count (:class:`FreeSlots`), so a lookup never
   scans the fleet; the nodes holding a checkpoint are indexed by it.
2. **The cheapest new nodes for the rest.** Each pool takes the first entry of its placement
   list that has a launchable offer (the operator's order is law), narrows the GPU types by
   profiled tokens/s per dollar when it has profiles, and the replicas of every pool in one
   market and dedication are bin-packed together onto the offers. Pools whose replicas need
   the same GPUs on the same offers and zones pack as one *kind*, by count, so a mass launch of
   thousands of pools costs about what a handful of kinds do: big counts are settled with
   full nodes of the cheapest shape per GPU, the rest by a memoised search over which shape
   hosts the largest replica left (the other replicas that fit fill the node's leftover
   slots), which is exact for the packing rules it explores and cheap on the handful of
   replicas a tick usually leaves.

Consolidation reuses :class:`FreeSlots`, :func:`pick_gpus` and the compatibility helpers.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from controlplane.fleet.capacity import (
    NewNode,
    NodeSlots,
    Offer,
    Placed,
    PlacementPlan,
    PlacementPref,
    PoolNeed,
)

__all__ = [
    "FreeSlots",
    "choose_surplus",
    "fits_node",
    "fits_offer",
    "offer_zones",
    "pick_gpus",
    "placement_rank",
    "plan_placement",
    "tokens_per_s",
]

_EPS = 1e-9
# The memoised search for new nodes runs on at most this many replicas of pools that may share
# nodes, with at most this many mixes of them (∏ (count + 1)); above, new nodes are chosen
# greedily one at a time (cheapest per GPU filled) until the rest is small enough.
_EXACT_ITEMS = 48
_SEARCH_STATES = 3000


# ------------------------------------------------------------------ compatibility
def placement_rank(placement: Sequence[PlacementPref], cloud: str, region: str, zone: str | None) -> int | None:
    """Index of the first entry of ``placement`` that allows (cloud, region, zone); None if none does.

    An empty list allows anything (rank 0). A node whose zone is not known yet (pending) is
    only allowed by an entry that pins no zone: it might still land outside the pinned ones.
    """
    if not placement:
        return 0
    for i, pref in enumerate(placement):
        if pref.cloud != cloud or (pref.region is not None and pref.region != region):
            continue
        if pref.zones and (zone is None or zone not in pref.zones):
            continue
        return i
    return None


def _gpu_ok(need: PoolNeed, gpu_type: str, memory_gb: float, gpus: int) -> bool:
    return (
        (not need.gpu_types or gpu_type in need.gpu_types)
        and memory_gb + _EPS >= need.gpu_memory_gb
        and gpus >= need.gpus_per_replica
    )


def fits_node(need: PoolNeed, node: NodeSlots, spot: bool | None = None) -> bool:
    """Whether a replica of ``need`` may ever run on ``node`` (free slots aside): same dedication
    (a shared pool only on shared nodes), an accepted GPU type with enough memory per GPU,
    enough GPUs in total, a place its placement list allows, and, when ``spot`` is given, that
    market. The market is the caller's: a pool places replicas in both."""
    if need.dedicated_tenant_id != node.dedicated_tenant_id:
        return False
    if spot is not None and node.spot != spot:
        return False
    if not _gpu_ok(need, node.gpu_type, node.gpu_memory_gb, node.gpus_total):
        return False
    return placement_rank(need.placement, node.cloud, node.region, node.zone) is not None


def fits_offer(need: PoolNeed, offer: Offer, spot: bool | None = None) -> bool:
    """Whether the offer's shape can host a replica of ``need`` in a region its placement allows
    (and, when ``spot`` is given, in that market). Launchability is separate: see
    :func:`offer_zones`, which also applies the zone pins."""
    if spot is not None and offer.spot != spot:
        return False
    if not _gpu_ok(need, offer.gpu_type, offer.gpu_memory_gb, offer.gpu_count):
        return False
    if not need.placement:
        return True
    return any(
        p.cloud == offer.cloud and (p.region is None or p.region == offer.region) for p in need.placement
    )


def offer_zones(need: PoolNeed, offer: Offer) -> list[tuple[int, tuple[str, ...]]]:
    """(placement rank, zones of the offer that entry allows) for each placement entry that names
    the offer's cloud and region, in order. An empty zones tuple: that entry cannot launch it now."""
    if not need.placement:
        return [(0, offer.zones)]
    out = []
    for i, p in enumerate(need.placement):
        if p.cloud != offer.cloud or (p.region is not None and p.region != offer.region):
            continue
        zones = tuple(z for z in offer.zones if z in p.zones) if p.zones else offer.zones
        out.append((i, zones))
    return out


def tokens_per_s(need: PoolNeed, gpu_type: str) -> float:
    """Profiled throughput of one replica on ``gpu_type``; a type without a profile counts as the
    slowest known one (never as free throughput). 1.0 for every type when nothing is profiled."""
    if not need.tokens_per_s:
        return 1.0
    got = need.tokens_per_s.get(gpu_type)
    return got if got is not None else min(need.tokens_per_s.values())


# ------------------------------------------------------------------ GPU indices
def pick_gpus(free: int | Iterable[int], total: int, k: int) -> tuple[int, ...] | None:
    """k of the free GPU indices (a bitmask or indices) of a ``total``-GPU node, or None.

    Tensor parallel wants neighbours, so an aligned contiguous block comes first (a 2-GPU replica
    on [2,3] rather than [1,2]); among those, the block inside the most-used larger aligned
    block, so whole big blocks stay free for big replicas (buddy allocation). Then any
    contiguous run, then any k free indices.
    """
    mask = free if isinstance(free, int) else sum(1 << g for g in free if 0 <= g < total)
    return _pick(mask & ((1 << total) - 1), total, k)


@lru_cache(maxsize=8192)
def _pick(mask: int, total: int, k: int) -> tuple[int, ...] | None:
    if k <= 0 or mask.bit_count() < k:
        return None
    block = (1 << k) - 1
    best: tuple[tuple[int, ...], int] | None = None
    for start in range(0, total - k + 1, k):
        if (mask >> start) & block != block:
            continue
        levels = []
        size = 2 * k
        while size <= 2 * total:
            lo = (start // size) * size
            hi = min(lo + size, total)
            levels.append(((mask >> lo) & ((1 << (hi - lo)) - 1)).bit_count())
            size *= 2
        key = (tuple(levels), start)
        if best is None or key < best:
            best = key
    if best is not None:
        return tuple(range(best[1], best[1] + k))
    for start in range(total - k + 1):
        if (mask >> start) & block == block:
            return tuple(range(start, start + k))
    return tuple(g for g in range(total) if mask >> g & 1)[:k]


def _used_mask(node: NodeSlots) -> int:
    m = 0
    for r in node.replicas:
        for g in r.gpu_ids:
            m |= 1 << g
    return m


# ------------------------------------------------------------------ free-slot index
class _Group:
    """Nodes that are interchangeable for compatibility: one node group, bucketed by free count."""

    __slots__ = ("buckets", "cloud", "gpu_type", "memory", "region", "spot", "tenant", "total", "zone")

    def __init__(self, node: NodeSlots) -> None:
        self.spot, self.tenant = node.spot, node.dedicated_tenant_id
        self.gpu_type, self.memory, self.total = node.gpu_type, node.gpu_memory_gb, node.gpus_total
        self.cloud, self.region, self.zone = node.cloud, node.region, node.zone
        # buckets[f]: ids (sorted) of the nodes with exactly f free GPUs
        self.buckets: list[list[str]] = [[] for _ in range(node.gpus_total + 1)]


def _group_key(n: NodeSlots) -> tuple:
    return (n.spot, n.dedicated_tenant_id, n.gpu_type, n.gpu_memory_gb, n.gpus_total, n.cloud, n.region, n.zone)


class FreeSlots:
    """The free GPUs of a set of nodes, kept up to date while a plan takes them.

    Nodes are grouped by everything compatibility looks at (market, dedication, GPU type and
    memory, size, cloud/region/zone) and each group keeps its nodes in buckets by free GPU
    count, so a best-fit lookup costs (compatible groups × GPU sizes), not (nodes). Every
    allocation can be journaled and undone, which is how consolidation tries a move and takes
    it back.
    """

    def __init__(self, nodes: Iterable[NodeSlots]) -> None:
        self.nodes: dict[str, NodeSlots] = {}
        self.mask: dict[str, int] = {}  # free GPUs as a bitmask
        self._group: dict[str, _Group] = {}
        self._groups: dict[tuple, _Group] = {}
        self._out: set[str] = set()  # taken out of the buckets (being emptied)
        self._cands: dict[tuple[str, bool], list[tuple[int, _Group]]] = {}
        # (model path, group) -> buckets by free count of the group's nodes whose cache holds it
        self._holding_buckets: dict[tuple[str, _Group], list[list[str]]] = {}
        for n in nodes:
            if n.gpus_total <= 0 or n.node_id in self.nodes:  # a node listed twice counts once
                continue
            g = self._groups.get(key := _group_key(n))
            if g is None:
                g = self._groups[key] = _Group(n)
            self.nodes[n.node_id] = n
            self._group[n.node_id] = g
            self.mask[n.node_id] = ((1 << n.gpus_total) - 1) & ~_used_mask(n)
        for nid in sorted(self.nodes):  # appending in id order keeps every bucket sorted
            g = self._group[nid]
            g.buckets[self.mask[nid].bit_count()].append(nid)
            for model in self.nodes[nid].cached_models:
                self._holding_of(model, g)[self.mask[nid].bit_count()].append(nid)

    def _holding_of(self, model: str, g: _Group) -> list[list[str]]:
        got = self._holding_buckets.get((model, g))
        if got is None:
            got = self._holding_buckets[(model, g)] = [[] for _ in range(g.total + 1)]
        return got

    # -- bucket bookkeeping
    def _unbucket(self, nid: str) -> None:
        g, f = self._group[nid], self.mask[nid].bit_count()
        for lst in (g.buckets[f], *(self._holding_of(m, g)[f] for m in self.nodes[nid].cached_models)):
            del lst[bisect.bisect_left(lst, nid)]

    def _bucket(self, nid: str) -> None:
        g, f = self._group[nid], self.mask[nid].bit_count()
        bisect.insort(g.buckets[f], nid)
        for m in self.nodes[nid].cached_models:
            bisect.insort(self._holding_of(m, g)[f], nid)

    def take_out(self, nid: str) -> None:
        """No lookup returns ``nid`` until :meth:`put_back` (a node being emptied takes nothing)."""
        if nid in self.nodes and nid not in self._out:
            self._unbucket(nid)
            self._out.add(nid)

    def put_back(self, nid: str) -> None:
        if nid in self._out:
            self._out.discard(nid)
            self._bucket(nid)

    def set_mask(self, nid: str, mask: int) -> None:
        if nid not in self._out:
            self._unbucket(nid)
        self.mask[nid] = mask
        if nid not in self._out:
            self._bucket(nid)

    def allocate(self, nid: str, k: int, journal: list[tuple[str, int]] | None = None) -> tuple[int, ...]:
        """Takes k free GPUs of ``nid`` (see :func:`pick_gpus`) and returns their indices."""
        node, mask = self.nodes[nid], self.mask[nid]
        gpus = _pick(mask, node.gpus_total, k)
        if gpus is None:
            raise ValueError(f"node {nid} has no {k} free GPUs")
        if journal is not None:
            journal.append((nid, mask))
        self.set_mask(nid, mask & ~sum(1 << g for g in gpus))
        return gpus

    def undo(self, journal: list[tuple[str, int]]) -> None:
        for nid, mask in reversed(journal):
            self.set_mask(nid, mask)
        journal.clear()

    # -- lookups
    def _candidates(self, need: PoolNeed, spot: bool) -> list[tuple[int, _Group]]:
        key = (need.pool_id, spot)
        got = self._cands.get(key)
        if got is None:
            got = []
            for g in self._groups.values():
                if g.spot != spot or g.tenant != need.dedicated_tenant_id:
                    continue
                if not _gpu_ok(need, g.gpu_type, g.memory, g.total):
                    continue
                rank = placement_rank(need.placement, g.cloud, g.region, g.zone)
                if rank is not None:
                    got.append((rank, g))
            got.sort(key=lambda rg: rg[0])
            self._cands[key] = got
        return got

    def best(self, need: PoolNeed, spot: bool, k: int | None = None, *,
             zone_counts: Mapping[str | None, int] | None = None, max_rank: int | None = None) -> str | None:
        """The node a k-GPU replica of ``need`` should take: placement rank, then (with
        ``zone_counts``, for pools that spread) the zone holding fewest of the pool's replicas,
        then a node whose artifact cache holds the pool's checkpoint (see :meth:`_holding`),
        then fewest free GPUs that still fit, then node id. None when no node has room."""
        k = need.gpus_per_replica if k is None else k
        best: tuple | None = None
        for rank, g in self._candidates(need, spot):
            if max_rank is not None and rank > max_rank:
                break
            if best is not None and rank > best[0]:
                break
            zc = zone_counts.get(g.zone, 0) if zone_counts is not None else 0
            if best is not None and (rank, zc) > best[:2]:
                continue
            for f in range(k, g.total + 1):
                b = g.buckets[f]
                if b:
                    key = (rank, zc, f, b[0])
                    if best is None or key < best:
                        best = key
                    break
        if best is None:
            return None
        holder = self._holding(need, spot, k, zone_counts, best) if need.model_path else None
        return best[3] if holder is None else holder

    def _holding(self, need: PoolNeed, spot: bool, k: int, zone_counts: Mapping[str | None, int] | None,
                 best: tuple) -> str | None:
        """The best-fitting node whose cache holds ``need``'s checkpoint among those as good as
        ``best`` on placement rank and zone spread, if any. Why before best fit: the download it
        saves is minutes of every GPU the replica holds (a 70B checkpoint is 140 GB, 112 s at
        10 Gb/s), while packing is consolidation's to restore. But not an empty node while
        ``best`` holds replicas: that would keep a whole VM billed (its empty-node TTL starts
        over) to save one download."""
        rank_, zc_ = best[0], best[1]
        best_empty = best[2] == self.nodes[best[3]].gpus_total
        found: tuple | None = None
        for rank, g in self._candidates(need, spot):
            if rank > rank_:
                break
            buckets = self._holding_buckets.get((need.model_path, g))
            if buckets is None or (zone_counts is not None and zone_counts.get(g.zone, 0) != zc_):
                continue
            for f in range(k, g.total + (1 if best_empty else 0)):
                if buckets[f]:
                    if found is None or (f, buckets[f][0]) < found:
                        found = (f, buckets[f][0])
                    break
        return None if found is None else found[1]


def zone_counts_of(nodes: Iterable[NodeSlots], pool_ids: set[str]) -> dict[str, dict[str | None, int]]:
    """Replicas per zone of each pool in ``pool_ids`` (for pools that spread across zones)."""
    out: dict[str, dict[str | None, int]] = {p: defaultdict(int) for p in pool_ids}
    if not pool_ids:
        return out
    for n in nodes:
        for r in n.replicas:
            if r.pool_id in out:
                out[r.pool_id][n.zone] += 1
    return out


# ------------------------------------------------------------------ new nodes
@dataclass
class _Item:
    """All replicas of one pool in one market that need new nodes."""

    need: PoolNeed
    spot: bool
    n: int
    cands: dict[int, frozenset[str]]  # offer index → zones the pool allows it in

    @property
    def k(self) -> int:
        return self.need.gpus_per_replica


@dataclass
class _Kind:
    """Replicas that pack alike, of one pool or several: the same GPU count on the same offers in
    the same zones. The packing looks at nothing else, so a mass launch of thousands of pools
    with a handful of shapes between them packs a handful of kinds, by count."""

    k: int
    n: int
    cands: dict[int, frozenset[str]]


# What a new node holds: (index, replicas) for each kind (or item) on it, by index. Sparse, since a
# node holds a few of possibly many.
_Take = tuple[tuple[int, int], ...]
# A new node in a packing: (offer index, zones every replica on it allows, what it holds).
_Bin = tuple[int, frozenset[str], _Take]


def _fill(kinds: Sequence[_Kind], offers: Sequence[Offer], left: Sequence[int], anchor: int, o: int,
          order: Sequence[int]) -> tuple[_Take, frozenset[str], int]:
    """One new node of offer ``o`` holding a replica of ``anchor``, its free slots then filled in
    ``order`` (the kinds that may use ``o``) with every remaining replica that fits it: a bought
    GPU left empty is wasted. Reads ``left`` (replicas left per kind) without changing it;
    returns what the node takes, its zones, and the GPUs it fills."""
    free = offers[o].gpu_count - kinds[anchor].k
    zones = kinds[anchor].cands[o]
    take = {anchor: 1}
    for j in order:
        if not free:
            break
        kind = kinds[j]
        avail = left[j] - take.get(j, 0)  # the anchor's own replica is taken already
        if not avail or kind.k > free:
            continue
        z = zones & kind.cands[o]
        if not z:
            continue
        n = min(avail, free // kind.k)
        take[j] = take.get(j, 0) + n
        free -= n * kind.k
        zones = z
    return tuple(sorted(take.items())), zones, offers[o].gpu_count - free


def _components(kinds: Sequence[_Kind]) -> list[list[int]]:
    """Kinds that can never share a node (no common offer and zone) are packed apart: the search
    stays small and the answer is the same."""
    parent = list(range(len(kinds)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[int, str], int] = {}
    for j, kind in enumerate(kinds):
        for o, zones in kind.cands.items():
            for z in zones:
                other = first.setdefault((o, z), j)
                parent[root(j)] = root(other)
    groups: dict[int, list[int]] = defaultdict(list)
    for j in range(len(kinds)):
        groups[root(j)].append(j)
    return sorted(groups.values())


def _kinds_of(items: Sequence[_Item]) -> tuple[list[_Kind], list[list[int]]]:
    """The kinds of ``items`` (in order of their first item) and the items of each, in order."""
    kinds: list[_Kind] = []
    members: list[list[int]] = []
    index: dict[tuple, int] = {}
    for j, it in enumerate(items):
        key = (it.k, frozenset(it.cands.items()))
        c = index.get(key)
        if c is None:
            c = index[key] = len(kinds)
            kinds.append(_Kind(it.k, 0, it.cands))
            members.append([])
        kinds[c].n += it.n
        members[c].append(j)
    return kinds, members


def _pack(items: Sequence[_Item], offers: Sequence[Offer]) -> list[_Bin]:
    """New nodes for all of ``items`` (replicas of one market and dedication), cheapest first.

    Items are packed as kinds (see :class:`_Kind`): the packing cannot tell their replicas
    apart, and it works on counts, so its cost follows the number of kinds and of distinct new
    nodes, not of pools or replicas. Each node's share of a kind is then dealt out to the kind's
    items in order, each item's replicas before the next one's.
    """
    kinds, members = _kinds_of(items)
    left = [it.n for it in items]
    nxt = [0] * len(kinds)  # members[c][nxt[c]]: the next item of kind c with replicas to deal out
    bins: list[_Bin] = []
    for comp in _components(kinds):
        for o, zones, take in _pack_component([kinds[c] for c in comp], offers):
            dealt = []
            for i, t in take:
                c = comp[i]
                while t:
                    j = members[c][nxt[c]]
                    got = min(t, left[j])
                    dealt.append((j, got))
                    left[j] -= got
                    t -= got
                    if not left[j]:
                        nxt[c] += 1
            bins.append((o, zones, tuple(sorted(dealt))))
    return bins


def _mixes(counts: Iterable[int]) -> int:
    """∏ (count + 1): how many states the search could visit. Stops multiplying once past
    :data:`_SEARCH_STATES`: it is only ever compared with it."""
    n = 1
    for c in counts:
        if c:
            n *= c + 1
            if n > _SEARCH_STATES:
                break
    return n


def _searchable(total: int, counts: Iterable[int]) -> bool:
    return total <= _EXACT_ITEMS and _mixes(counts) <= _SEARCH_STATES


def _pack_component(kinds: Sequence[_Kind], offers: Sequence[Offer]) -> list[_Bin]:
    """Three steps, each cheap where the next would be expensive:

    1. while a kind alone still needs several nodes, a full node of its cheapest shape per GPU;
    2. while many replicas are left (or too many mixes of them to search), the node, over the
       shapes for the largest replica left, with the lowest price per GPU it fills;
    3. otherwise a memoised search over the rest: which shape hosts the largest replica left,
       each node's leftover slots filled in one of three orders (largest first, most
       constrained first, dearest to host elsewhere first); exact over the mixes it explores.

    The state is a count per kind and a node lists how many of which kinds it takes, so a step
    costs (shapes × kinds), never (replicas) or (pools).
    """
    m = len(kinds)
    state = [kind.n for kind in kinds]
    bins: list[_Bin] = []
    for j, kind in enumerate(kinds):

        def per_gpu(o: int, k: int = kind.k) -> tuple:
            per = offers[o].gpu_count // k
            return (offers[o].price_per_hour / (per * k), offers[o].price_per_hour, o)

        o = min(kind.cands, key=per_gpu)
        per = offers[o].gpu_count // kind.k
        reserve = 2 * max(offers[s].gpu_count for s in kind.cands)  # left for the search to mix
        full = max(0, (state[j] * kind.k - reserve) // (per * kind.k))
        if full:
            bins.extend([(o, kind.cands[o], ((j, per),))] * full)
            state[j] -= full * per

    anchor_order = sorted(range(m), key=lambda j: (-kinds[j].k, len(kinds[j].cands), j))
    by_constraint = sorted(range(m), key=lambda j: (len(kinds[j].cands), -kinds[j].k, j))
    shapes = [sorted(kind.cands) for kind in kinds]

    # Per GPU it fills, what each kind's cheapest shape would cost it: a node's leftover slots are
    # worth most to the kinds that are dearest to host elsewhere.
    def unit_price(j: int, o: int) -> float:
        return offers[o].price_per_hour / ((offers[o].gpu_count // kinds[j].k) * kinds[j].k)

    unit = [sorted((unit_price(j, o), o) for o in kind.cands) for j, kind in enumerate(kinds)]
    order_cache: dict[int, tuple[list[int], ...]] = {}

    def orders(o: int) -> tuple[list[int], ...]:
        got = order_cache.get(o)
        if got is None:
            def alternative(j: int) -> float:
                return next((p for p, other in unit[j] if other != o), float("inf"))

            users = [j for j in range(m) if o in kinds[j].cands]
            by_value = sorted(users, key=lambda j: (-alternative(j), -kinds[j].k, j))
            got = order_cache[o] = (
                [j for j in anchor_order if o in kinds[j].cands],
                [j for j in by_constraint if o in kinds[j].cands],
                by_value,
            )
        return got

    def anchor_of(st: Sequence[int]) -> int:
        return next(j for j in anchor_order if st[j])

    def greedy_step(st: Sequence[int], a: int) -> _Bin:
        best = None
        for o in shapes[a]:
            for v, order in enumerate(orders(o)):
                take, zones, used = _fill(kinds, offers, st, a, o, order)
                key = (offers[o].price_per_hour / used, offers[o].price_per_hour, o, v)
                if best is None or key < best[0]:
                    best = (key, (o, zones, take))
        assert best is not None
        return best[1]

    total = sum(state)
    pos = 0  # anchor_order[pos] is the largest kind left: counts only fall in step 2
    while total and not _searchable(total, state):
        while not state[anchor_order[pos]]:
            pos += 1
        b = greedy_step(state, anchor_order[pos])
        bins.append(b)
        for j, t in b[2]:
            state[j] -= t
            total -= t

    # At most _mixes(state) ≤ _SEARCH_STATES states, each tried with every shape of its anchor.
    memo: dict[tuple[int, ...], tuple[float, int, tuple[int, ...] | None, _Bin | None]] = {}

    def solve(st: tuple[int, ...]) -> tuple[float, int, tuple[int, ...] | None, _Bin | None]:
        got = memo.get(st)
        if got is not None:
            return got
        if not any(st):
            memo[st] = (0.0, 0, None, None)
            return memo[st]
        a = anchor_of(st)
        best = None
        seen = set()
        for o in shapes[a]:
            for order in orders(o):
                take, zones, _ = _fill(kinds, offers, st, a, o, order)
                after = list(st)
                for j, t in take:
                    after[j] -= t
                nxt = tuple(after)
                if (o, nxt) in seen:
                    continue
                seen.add((o, nxt))
                cost, nodes, _, _ = solve(nxt)
                key = (round(cost + offers[o].price_per_hour, 9), nodes + 1)
                if best is None or key < best[0]:
                    best = (key, nxt, (o, zones, take))
        assert best is not None
        memo[st] = (best[0][0], best[0][1], best[1], best[2])
        return memo[st]

    start = tuple(state)
    solve(start)
    st: tuple[int, ...] | None = start
    while st is not None and any(st):
        _, _, nxt, b = memo[st]
        assert b is not None
        bins.append(b)
        st = nxt
    return bins


def _where(need: PoolNeed) -> str:
    if not need.placement:
        return "any region"
    return ", ".join(
        f"{p.cloud}/{p.region or '*'}" + (f" [{','.join(p.zones)}]" if p.zones else "") for p in need.placement
    )


def _needs_text(need: PoolNeed, spot: bool) -> str:
    types = "/".join(need.gpu_types) or "any GPU"
    return (f"{need.gpus_per_replica}× {types} {need.gpu_memory_gb:g}GB in {_where(need)} "
            f"({'spot' if spot else 'on-demand'})")


def _new_node_item(need: PoolNeed, spot: bool, n: int, offers: Sequence[Offer],
                   alone_cost: dict[tuple, float] | None = None) -> _Item | str:
    """The offers (and zones) new replicas of ``need`` may launch on, or why there are none.

    The first placement entry with a launchable fitting offer wins (the operator's order is
    law); within it, a pool with throughput profiles keeps only the GPU types that carry the
    throughput asked (n replicas of ``need.replica_tokens_per_s``) for the fewest dollars
    (Mélange), a pool without compares types by price alone, which the packing does.
    ``alone_cost`` memoises what k replicas cost packed alone on some offers: many pools of a
    mass launch ask the same.
    """
    by_rank: dict[int, dict[int, frozenset[str]]] = defaultdict(dict)
    fitting = False
    for o, offer in enumerate(offers):
        if not fits_offer(need, offer, spot):
            continue
        fitting = True
        for rank, zones in offer_zones(need, offer):
            if zones and o not in by_rank[rank]:
                by_rank[rank][o] = frozenset(zones)
    if not by_rank:
        if fitting:
            return "every fitting offer is blocked in the zones its placement allows"
        return f"no offer fits: needs {_needs_text(need, spot)}"
    cands = by_rank[min(by_rank)]
    if need.tokens_per_s:
        by_type: dict[str, dict[int, frozenset[str]]] = defaultdict(dict)
        for o, z in cands.items():
            by_type[offers[o].gpu_type][o] = z
        # The count was sized in replicas of ``sized`` tokens/s: on each type, price the replicas
        # that carry that throughput (more on a slower type, fewer on a faster one). Pricing n
        # replicas of every type instead valued a faster type's surplus as if it were wanted, and
        # put five 8B replicas sized at an L40S's rate on a new 8-GPU H100 node (3.3x the
        # throughput asked for), which consolidation then replaced by L40S nodes, and round again.
        sized = need.replica_tokens_per_s or min(need.tokens_per_s.values())
        value = {}
        for t, sub in by_type.items():
            k = max(1, math.ceil(n * sized / tokens_per_s(need, t) - 1e-6))
            key = (need.gpus_per_replica, k, frozenset(sub.items()))
            cost = None if alone_cost is None else alone_cost.get(key)
            if cost is None:
                cost = sum(offers[b[0]].price_per_hour for b in _pack([_Item(need, spot, k, sub)], offers))
                if alone_cost is not None:
                    alone_cost[key] = cost
            # the throughput asked, per dollar of exactly the nodes that carry it on that type alone
            value[t] = n * sized / max(cost, _EPS)
        top = max(value.values())
        cands = {o: z for t, sub in by_type.items() if value[t] >= top * (1 - 1e-9) for o, z in sub.items()}
    return _Item(need, spot, n, cands)


def _plan_new_nodes(rest: Sequence[tuple[PoolNeed, bool, int]], offers: Sequence[Offer],
                    zone_counts: dict[str, dict[str | None, int]]
                    ) -> tuple[list[Placed], list[NewNode], list[tuple[str, int, str]]]:
    groups: dict[tuple[bool, str | None], list[_Item]] = defaultdict(list)
    unplaced: list[tuple[str, int, str]] = []
    alone_cost: dict[tuple, float] = {}
    for need, spot, n in rest:
        item = _new_node_item(need, spot, n, offers, alone_cost)
        if isinstance(item, str):
            unplaced.append((need.pool_id, n, item))
        else:
            groups[(spot, need.dedicated_tenant_id)].append(item)
    placed: list[Placed] = []
    launches: list[NewNode] = []
    for (_, tenant), items in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1] or "")):
        for o, zones, take in _pack(items, offers):
            offer = offers[o]
            key = f"new-{len(launches)}"
            order = [z for z in offer.zones if z in zones]
            spreading = [(j, t) for j, t in take if items[j].need.spread_zones]
            if spreading:
                # least-used zone of the spreading pools first; the next new node then sees it used
                counts = [zone_counts[items[j].need.pool_id] for j, _ in spreading]
                order.sort(key=lambda z: sum(c[z] for c in counts))
                for (_, t), c in zip(spreading, counts, strict=True):
                    c[order[0]] += t
            launches.append(NewNode(key=key, offer=offer, dedicated_tenant_id=tenant, zones=tuple(order)))
            take = sorted(take, key=lambda jt: (-items[jt[0]].k, jt[0]))  # big replicas pick GPUs first
            gpus = iter(_layout(offer.gpu_count, tuple(items[j].k for j, t in take for _ in range(t))))
            for j, t in take:
                for _ in range(t):
                    placed.append(Placed(items[j].need.pool_id, key, next(gpus), items[j].spot))
    return placed, launches, unplaced


@lru_cache(maxsize=4096)
def _layout(total: int, sizes: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The GPU indices of replicas of ``sizes`` GPUs, in that order, on an empty ``total``-GPU node
    (see :func:`pick_gpus`). A mass launch buys many nodes holding the same sizes: computed once."""
    mask = (1 << total) - 1
    out = []
    for k in sizes:
        gpus = _pick(mask, total, k)
        assert gpus is not None
        mask &= ~sum(1 << g for g in gpus)
        out.append(gpus)
    return tuple(out)


# ------------------------------------------------------------------ public
def _being_emptied(node: NodeSlots) -> bool:
    return bool(node.replicas) and all(r.moving for r in node.replicas)


def plan_placement(needs: Sequence[PoolNeed], nodes: Sequence[NodeSlots], offers: Sequence[Offer]) -> PlacementPlan:
    """Where every missing replica of ``needs`` goes: free slots of ``nodes`` first, then the
    cheapest new nodes from ``offers``; what can go nowhere is reported in ``unplaced``.

    ``nodes`` are the live nodes (pending ones included: their slots can be promised); leave
    out draining ones. A node whose every replica is moving is skipped: it is being emptied by
    a consolidation in flight (or is a replacement still filling), and a new replica there
    would keep a node alive that is on its way out.

    Spreading pools get the least-used zone among existing nodes and their new nodes' zones
    ordered least-used first, but spreading never buys extra nodes: replicas that fit one new
    node share it.
    """
    wanted = [n for n in needs if n.missing_spot > 0 or n.missing_on_demand > 0]
    if not wanted:
        return PlacementPlan()
    slots = FreeSlots(n for n in nodes if not _being_emptied(n))
    spreading = {n.pool_id for n in wanted if n.spread_zones}
    zone_counts = zone_counts_of(nodes, spreading)
    placed: list[Placed] = []
    rest: list[tuple[PoolNeed, bool, int]] = []
    # Big replicas first: they fit in fewer places, small ones can take what is left.
    for need in sorted(wanted, key=lambda n: (-n.gpus_per_replica, n.pool_id)):
        zc = zone_counts.get(need.pool_id)
        for spot, missing in ((True, need.missing_spot), (False, need.missing_on_demand)):
            left = max(0, missing)
            while left:
                nid = slots.best(need, spot, zone_counts=zc)
                if nid is None:
                    break
                placed.append(Placed(need.pool_id, nid, slots.allocate(nid, need.gpus_per_replica), spot))
                if zc is not None:
                    zc[slots.nodes[nid].zone] += 1
                left -= 1
            if left:
                rest.append((need, spot, left))
    new_placed, launches, unplaced = _plan_new_nodes(rest, offers, zone_counts)
    return PlacementPlan(placed=tuple(placed + new_placed), launches=tuple(launches), unplaced=tuple(unplaced))


def choose_surplus(pool_id: str, surplus_spot: int, surplus_on_demand: int, nodes: Sequence[NodeSlots]) -> list[str]:
    """The replica ids of ``pool_id`` to stop: ``surplus_spot`` on spot nodes and
    ``surplus_on_demand`` on on-demand nodes.

    Not-ready replicas go first (they serve nothing yet), then those on the emptiest nodes
    (fewest GPUs used once the replica is gone, so nodes empty out and can be released), then
    replica id. A replica already moving is never chosen: a move in flight owns it.
    """
    out: list[str] = []
    for spot, want in ((True, surplus_spot), (False, surplus_on_demand)):
        if want <= 0:
            continue
        used: dict[str, int] = {}
        mine: dict[str, list] = defaultdict(list)
        for n in nodes:
            if n.spot != spot:
                continue
            reps = [r for r in n.replicas if r.pool_id == pool_id and not r.moving]
            if reps:
                used[n.node_id] = sum(len(r.gpu_ids) for r in n.replicas)
                mine[n.node_id] = reps
        heap = []
        for nid, reps in mine.items():
            for r in reps:
                heap.append((r.ready, used[nid] - len(r.gpu_ids), r.replica_id, nid, len(r.gpu_ids)))
        heapq.heapify(heap)
        chosen: set[str] = set()
        while heap and want > 0:
            _ready, after, rid, nid, k = heapq.heappop(heap)
            if rid in chosen:
                continue
            if after != used[nid] - k:  # stale: its node emptied further since it was pushed
                continue
            chosen.add(rid)
            out.append(rid)
            want -= 1
            used[nid] -= k
            # its neighbours on that node just got better: push their new keys (old ones go stale)
            for r in mine[nid]:
                if r.replica_id not in chosen:
                    heapq.heappush(heap, (r.ready, used[nid] - len(r.gpu_ids), r.replica_id, nid, len(r.gpu_ids)))
    return out
