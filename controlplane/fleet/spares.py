"""Spare replicas: GPUs the fleet pays for anyway, put to work for the pools that may need them.

A node is billed whole. The GPU slots its replicas leave free (the packing floor of 2- and
4-GPU replicas on 8-GPU VMs, a scale-down that did not empty its node, a node kept for its other
replicas) cost the same whether they idle or serve. A *spare* is a replica on such slots above
what its pool asked for (``desired_replicas``):

* it serves its pool's traffic like any replica (the edge routes to it), so a burst or a ramp
  meets warm capacity instead of a cold start;
* it does not count toward the pool's size (the autoscaler sees a ready spare's load and
  capacity, not a replica of its target), and a scale-up **promotes** it (a replica ready at
  once) before anything is placed;
* a scale-down **demotes** a ready replica whose node stays billed for others, instead of
  stopping it: the GPUs are paid either way, and the replica stays warm;
* placement and consolidation do not see it: its slots are free to them, and when they take
  them the spare stops first (the agent starts the new engine once its GPUs are released);
* where every regular replica of a node has a ready spare of its pool on other billed nodes,
  the spares take over and the node's replicas become spares (``plan_swaps``): the node holds
  only spares and goes. A consolidation without a copy to load (bench/fleet: 1.236x -> 1.218x
  the clairvoyant bound at equal SLO over five days).

So spares never launch a VM, never keep one alive (a node holding only spares is empty) and
never stand in the way of packing. Where a pool's scale-down keeps its replica warm this way
(``scale_down_keeps_warm``), the hysteresis that keeps warm replicas around moves from the
autoscaler, where it costs a replica's GPUs, to the fleet, where it costs nothing.

Pure functions; ``controlplane.fleet.reconcile`` reads the rows and writes the answers.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from controlplane.fleet.capacity import NodeSlots, PoolNeed
from controlplane.fleet.placement import fits_node, pick_gpus, tokens_per_s


@dataclass(frozen=True)
class Spare:
    """A spare replica of ``pool_id`` to start on ``gpu_ids`` of node ``node_id``."""

    pool_id: str
    node_id: str
    gpu_ids: tuple[int, ...]


def plan_spares(nodes: Sequence[NodeSlots], pools: Mapping[str, PoolNeed], serving: Mapping[str, float],
                spare: Mapping[str, float], *, max_ratio: float) -> list[Spare]:
    """Spares for the free GPU slots of ``nodes``.

    ``nodes``: the nodes whose free slots may take spares (ready, billed for replicas of their
    own, not being emptied), every GPU-holding replica on them included, spares too.
    ``serving`` / ``spare``: each pool's profiled tokens/s in regular and in spare replicas now.
    Only pools that serve get spares (an idle scale-to-zero pool stays at zero).

    Each free slot goes to the pool with the least spare capacity for its size (spare /
    serving, lowest first; the larger pool on a tie): every serving pool that fits gets a first
    spare before any gets a second, and after that spare capacity grows in proportion to load,
    as bursts do. A pool's spares stop at ``max_ratio`` × its serving capacity (a 1.8-3x burst
    needs up to 2x), except for its first, which always fits.

    Nodes alike (everything ``fits_node`` reads) share one heap of their pools per replica size,
    so a tick on 10k nodes and 2,000 pools costs a heap operation per spare, not a scan of every
    pool per free slot; an entry whose pool got a spare since is re-ranked when it comes up."""
    have = {p: spare.get(p, 0.0) for p in serving}
    live = {p: pools[p] for p, tps in serving.items() if tps > 0 and p in pools}
    version: dict[str, int] = dict.fromkeys(live, 0)

    def rank(pool_id: str) -> tuple[float, float, str]:
        return have[pool_id] / serving[pool_id], -serving[pool_id], pool_id

    groups: dict[tuple, dict[int, list[tuple[tuple[float, float, str], int]]]] = {}
    out: list[Spare] = []
    for node in sorted(nodes, key=lambda n: n.node_id):
        key = (node.cloud, node.region, node.zone, node.gpu_type, node.gpu_memory_gb, node.gpus_total,
               node.dedicated_tenant_id)
        heaps = groups.get(key)
        if heaps is None:
            heaps = groups[key] = {}
            for pool_id, need in live.items():
                if fits_node(need, node) and tokens_per_s(need, node.gpu_type) > 0:
                    heaps.setdefault(need.gpus_per_replica, []).append((rank(pool_id), version[pool_id]))
            for heap in heaps.values():
                heapq.heapify(heap)
        free = set(node.free_gpus)
        while free:
            best: tuple[tuple[float, float, str], int, tuple[int, ...]] | None = None
            for size, heap in heaps.items():
                if size > len(free) or not heap:
                    continue
                gpus = pick_gpus(free, node.gpus_total, size)
                if gpus is None:
                    continue
                while heap:
                    (_, _, pool_id), seen = heap[0]
                    if seen == version[pool_id]:
                        tps = tokens_per_s(live[pool_id], node.gpu_type)
                        if have[pool_id] <= 0 or have[pool_id] + tps <= max_ratio * serving[pool_id]:
                            break
                        heapq.heappop(heap)  # at its ratio on this GPU type: spares only grow
                    else:  # it got a spare since this entry was ranked
                        heapq.heapreplace(heap, (rank(pool_id), version[pool_id]))
                if heap and (best is None or heap[0][0] < best[0]):
                    best = (heap[0][0], size, gpus)
            if best is None:
                break
            (_, _, pool_id), size, gpus = best
            out.append(Spare(pool_id, node.node_id, gpus))
            have[pool_id] += tokens_per_s(live[pool_id], node.gpu_type)
            version[pool_id] += 1
            heapq.heapreplace(heaps[size], (rank(pool_id), version[pool_id]))
            free -= set(gpus)
    return out


def promote(spares: Sequence[tuple[str, bool, bool]], missing_spot: int, missing_on_demand: int) -> list[str]:
    """The spares (``(id, on_spot, ready)``) that become regular replicas of a pool that grows,
    per market: ready ones first (capacity at once), then those still loading (a head start on
    a cold start)."""
    out: list[str] = []
    left = {True: missing_spot, False: missing_on_demand}
    for spare_id, on_spot, _ in sorted(spares, key=lambda s: (not s[2], s[0])):
        if left[on_spot] > 0:
            out.append(spare_id)
            left[on_spot] -= 1
    return out


def has_spares(enabled: bool, dedicated_tenant_id: object | None) -> bool:
    """Whether a pool gets spares (and keeps a scale-down's surplus as spares): where the
    operator enabled them, and not for a dedicated pool, whose tenant's GPU quota counts every
    replica it holds (a spare would take quota from the pool's own scale-ups)."""
    return enabled and dedicated_tenant_id is None


def scale_down_keeps_warm(ready: int, alone: int) -> bool:
    """Whether a pool's next scale-down would keep its replica warm as a spare, for a pool that
    ``has_spares``: ``ready`` of its replicas serve, ``alone`` of them on a node that holds no
    other replica of anyone's (spares aside). A scale-down takes the replica on the emptiest
    node first (``placement.choose_surplus``): one alone on its node stops, and its node goes.
    So only a pool none of whose replicas is alone gives up no warm capacity when it shrinks,
    and only there does the autoscaler's hysteresis move to the fleet (``PoolSpec.warm_surplus``)."""
    return ready > 0 and alone == 0


def keep_as_spare(ready: bool, node_stays: bool, spares_now: int, desired: int, max_ratio: float) -> bool:
    """Whether a surplus replica of a scale-down (of a pool that ``has_spares``) becomes a spare
    instead of stopping: it is warm, and its node stays billed for another replica (stopping it
    would save nothing). Not for a pool going to zero (idle, or an operator's 0: it is off), nor
    past ``max_ratio`` spares per replica the pool keeps."""
    return ready and node_stays and desired > 0 and spares_now + 1 <= max_ratio * desired


def overlapping(gpu_ids: Sequence[int], spares: Sequence[tuple[str, Sequence[int]]]) -> list[str]:
    """The spares (``(id, gpu_ids)`` on one node) that hold any of ``gpu_ids``: what must stop
    for a replica placed there."""
    wanted = set(gpu_ids)
    return [spare_id for spare_id, held in spares if wanted & set(held)]


@dataclass(frozen=True)
class Swap:
    """A warm spare that becomes a regular replica of its pool in place of ``regular_id``,
    which becomes a spare on the node it is on."""

    spare_id: str
    regular_id: str


def plan_swaps(nodes: Sequence[NodeSlots], spares_on: Mapping[str, Sequence[tuple[str, str, bool]]],
               pools: Mapping[str, PoolNeed], leaving: Set[str] = frozenset()) -> list[Swap]:
    """Nodes emptied by promotion: where every regular replica of a node has a ready spare of
    its pool on another node that stays billed, the spares take over and the node's replicas
    become spares, so the node holds only spares and goes (a node holding only spares is
    empty). A consolidation *delete* without a copy to load: the spares already serve, so
    nothing dips and no GPU is paid twice.

    ``nodes``: the live nodes as placement sees them (regular replicas only); ``spares_on``:
    each node's spares as (replica id, pool id, ready); ``pools``: the pools' profiles;
    ``leaving``: nodes a consolidation in flight is emptying. A spare stands in only for a
    replica of its own pool, in the same market, on a GPU type at least as fast (a swap never
    costs its pool profiled throughput), and only on a node that keeps a regular replica of its
    own (it stays billed) and is not itself leaving or being emptied here (a replacement node
    still filling with a move's copies is a fine host: it stays). The emptiest nodes go first
    (fewest regular GPUs, then the dearest); a node with a move under way is left to it."""
    by_id = {n.node_id: n for n in nodes}
    # Nodes that can give: launched, ready, every regular replica ready and not moving.
    candidates = [n for n in nodes if n.launched and n.ready and n.replicas
                  and all(r.ready and not r.moving for r in n.replicas)]
    candidates.sort(key=lambda n: (sum(len(r.gpu_ids) for r in n.replicas), -n.price_per_hour, n.node_id))
    free: dict[str, list[tuple[str, str]]] = {}  # pool -> [(spare id, node id)] still unclaimed
    for node_id, held in sorted(spares_on.items()):
        if node_id in by_id:
            for spare_id, pool_id, ready in sorted(held):
                if ready:
                    free.setdefault(pool_id, []).append((spare_id, node_id))
    emptied: set[str] = set()
    receiving: set[str] = set()
    out: list[Swap] = []
    for node in candidates:
        if node.node_id in receiving:
            continue
        claimed: list[tuple[str, str, str, str]] = []  # (spare id, its node, regular id, pool)
        taken: set[str] = set()
        for r in node.replicas:
            need = pools.get(r.pool_id)
            if need is None:
                break
            own = tokens_per_s(need, node.gpu_type)
            pick = None
            for spare_id, where in free.get(r.pool_id, ()):
                host = by_id[where]
                if (spare_id in taken or where == node.node_id or where in emptied or where in leaving
                        or not host.ready or host.spot != node.spot or not host.replicas
                        or tokens_per_s(need, host.gpu_type) < own):
                    continue
                pick = (spare_id, where)
                break
            if pick is None:
                break
            taken.add(pick[0])
            claimed.append((pick[0], pick[1], r.replica_id, r.pool_id))
        else:
            emptied.add(node.node_id)
            for spare_id, where, regular_id, pool_id in claimed:
                receiving.add(where)
                out.append(Swap(spare_id, regular_id))
                free[pool_id] = [(s, w) for s, w in free[pool_id] if s != spare_id]
    return out
