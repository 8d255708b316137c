"""The fleet's capacity model as plain values: what placement and consolidation read and answer.

GPUs are the unit of capacity. A node is a VM with ``gpus_total`` GPU slots, indexed 0…N-1. A
replica is one engine serving one pool's variant on ``gpus`` of one node's slots, named by index.
A node belongs to a *node group* (cloud, region, zone, instance type, market, and a tenant for
dedicated capacity), not to a pool: it hosts replicas of every pool whose placement and
dedication allow it.

Nothing here does I/O. ``controlplane.fleet.reconcile`` reads rows into these values, calls the
pure functions in ``placement`` and ``consolidation``, and writes their answers back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PlacementPref:
    """One entry of a pool's ordered placement list; ``None`` means any."""

    cloud: str
    region: str | None = None
    zones: tuple[str, ...] = ()  # empty: any zone of the region

    def allows(self, cloud: str, region: str, zone: str | None) -> bool:
        if cloud != self.cloud or (self.region is not None and region != self.region):
            return False
        return not self.zones or zone is None or zone in self.zones


@dataclass(frozen=True)
class Offer:
    """A launchable shape in one market of one region: a catalog instance type, priced.

    ``zones`` are the zones it may launch in now, best first (blocked zones already removed by
    the caller). An offer with no zones is not launchable.
    """

    cloud: str
    region: str
    instance_type: str
    gpu_type: str
    gpu_count: int
    gpu_memory_gb: float  # per GPU
    spot: bool
    price_per_hour: float  # USD per instance-hour in this market
    zones: tuple[str, ...]

    @property
    def price_per_gpu_hour(self) -> float:
        return self.price_per_hour / max(1, self.gpu_count)


@dataclass(frozen=True)
class PoolNeed:
    """One pool as placement sees it: what a replica needs and how many are missing per market."""

    pool_id: str
    gpus_per_replica: int
    gpu_memory_gb: float  # per GPU
    gpu_types: tuple[str, ...] = ()  # empty: any accelerator with enough memory
    placement: tuple[PlacementPref, ...] = ()  # ordered; empty: anywhere
    dedicated_tenant_id: str | None = None  # None: shared capacity only
    missing_spot: int = 0  # replicas to add on spot nodes
    missing_on_demand: int = 0  # replicas to add on on-demand nodes
    spread_zones: bool = False  # place replicas across zones for availability
    # Profiled decode throughput of one replica on each GPU type (tokens/s); compares GPU types by
    # tokens/s per dollar (Mélange). Missing types count as the slowest known.
    tokens_per_s: Mapping[str, float] = field(default_factory=dict)
    # The tokens/s one replica of the missing count stands for: the autoscaler sized the pool's
    # target in replicas of this throughput (the mean of its GPU types now). Placement compares GPU
    # types by what carrying ``missing × this`` costs on each. None: the slowest profiled type's.
    replica_tokens_per_s: float | None = None
    # The checkpoint its replicas load (the variant's model path): a node whose artifact cache
    # holds it starts a replica without the download (``NodeSlots.cached_models``).
    model_path: str | None = None


@dataclass(frozen=True)
class HostedReplica:
    replica_id: str
    pool_id: str
    gpu_ids: tuple[int, ...]
    ready: bool
    model_ready_s: float = 60.0  # how long a fresh copy takes to become ready (disruption cost)
    moving: bool = False  # already the source or target of a move in flight


@dataclass(frozen=True)
class NodeSlots:
    """One live node: its group, its GPU slots and the replicas that hold some of them."""

    node_id: str
    cloud: str
    region: str
    zone: str | None  # None until the VM is launched
    instance_type: str
    gpu_type: str
    gpus_total: int
    spot: bool
    dedicated_tenant_id: str | None
    price_per_hour: float
    replicas: tuple[HostedReplica, ...] = ()
    launched: bool = True  # False: pending/provisioning (its slots can still be promised)
    ready: bool = True  # agent registered and serving
    underused_since: float | None = None  # epoch s; None while the node is well used
    gpu_memory_gb: float = 0.0
    # Model paths the node's local artifact cache holds (its agent's heartbeat reports them)
    cached_models: frozenset[str] = frozenset()

    @property
    def used(self) -> frozenset[int]:
        return frozenset(g for r in self.replicas for g in r.gpu_ids)

    @property
    def free_gpus(self) -> tuple[int, ...]:
        used = self.used
        return tuple(g for g in range(self.gpus_total) if g not in used)


# ---------------------------------------------------------------- answers
@dataclass(frozen=True)
class Placed:
    """A new replica of ``pool_id`` on GPUs ``gpu_ids`` of an existing (or planned) node."""

    pool_id: str
    node_id: str  # an existing node's id, or a NewNode.key
    gpu_ids: tuple[int, ...]
    spot: bool


@dataclass(frozen=True)
class NewNode:
    key: str  # a planning id ("new-0", …); the caller gives the node row its real id
    offer: Offer
    dedicated_tenant_id: str | None
    zones: tuple[str, ...]  # where to try to launch, best first (a subset of offer.zones)


@dataclass(frozen=True)
class PlacementPlan:
    placed: tuple[Placed, ...] = ()
    launches: tuple[NewNode, ...] = ()
    # (pool_id, count, why) for replicas that could go nowhere: no offer fits, all blocked, …
    unplaced: tuple[tuple[str, int, str], ...] = ()


@dataclass(frozen=True)
class Move:
    """Make-before-break: start a copy of ``replica_id`` on ``to_node`` GPUs ``gpu_ids``; the
    original drains only once the copy is ready and taking traffic."""

    replica_id: str
    pool_id: str
    from_node: str
    to_node: str  # an existing node's id, or a NewNode.key (a *replace*)
    gpu_ids: tuple[int, ...]


@dataclass(frozen=True)
class ConsolidationAction:
    kind: str  # "delete" (moves into free slots elsewhere) or "replace" (onto one cheaper new node)
    node_id: str  # the node to empty and remove
    moves: tuple[Move, ...]
    new_node: NewNode | None  # set for "replace"
    savings_per_hour: float
    disruption_cost: float  # USD: GPUs × price per GPU-hour × model-ready time, summed over moves
    score: float  # savings over the horizon / disruption cost
    reason: str = ""


@dataclass(frozen=True)
class ConsolidationBudget:
    """Karpenter-style disruption budgets and thresholds."""

    settle_s: float = 300.0  # a node must have been underused this long
    max_moves_per_pool: int = 1  # moves in flight per pool
    max_nodes_in_flight: int = 1  # nodes being emptied fleet-wide
    horizon_s: float = 3600.0  # savings counted over this horizon
    min_score: float = 1.0  # savings over the horizon ≥ min_score × disruption cost
    # A node using less than this share of its GPUs is a candidate. 1.0: every node with a free GPU,
    # as in Karpenter (whose utilization threshold went away); the score decides whether a move pays.
    underused_fraction: float = 1.0
    # A replace onto a slower GPU type (see consolidation._try_replace) may take at most this share
    # of a pool's profiled throughput away until the replicas its autoscaler adds for it are ready.
    # 1.0: no cap; the autoscaler's headroom absorbs the dip. bench.fleet (sample seeds 1-3 + fine
    # seed 1, nimbus): 1.0 -> fragmentation 7.9-8.6 % on sample, SLO as without slower replaces
    # (at half the load 0.9 points lower);
    # 0.35 -> 8.9-10.6 %; 0.1 -> no slower replace happens (10.2-10.5 %). With no headroom at all
    # (the nimbus-oracle diagnostic) 1.0 costs an 8B pool 7.6 SLO points on seed 1 (0.35: 0.5 on
    # seed 1, 2.7 points of the whole day on seed 2): lower it for pools run without headroom.
    max_slower_dip: float = 1.0


def serving_gpu_types(replicas: Mapping[Any, str | None], copies: Iterable[tuple[Any, str | None]]) -> list[str | None]:
    """The GPU type each replica (``replicas``: replica → its node's type) will serve on: a replica
    that consolidation is moving serves on its copy's type (``copies``: (original, type) for the
    copies still loading). Counted from the move's start, a move onto a slower type lowers the pool's
    throughput per replica while the copy loads, so the autoscaler's extra replicas start beside
    it instead of a model-ready time after the original stopped (the dent a replace left)."""
    moving_to = dict(copies)
    return [moving_to.get(replica, gpu_type) for replica, gpu_type in replicas.items()]


def profiled_throughput(profile: Mapping[str, float], gpu_types: Sequence[str | None]) -> float | None:
    """One replica's profiled tokens/s on the GPU types the pool runs on now (their mean), or on
    its slowest profiled type before any replica runs: capacity is never assumed from the best."""
    known = [float(profile[t]) for t in gpu_types if t in profile]
    if known:
        return sum(known) / len(known)
    return min((float(v) for v in profile.values()), default=None)
