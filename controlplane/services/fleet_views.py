"""Operator views of the GPU fleet: who holds which GPU slot of a node, and what the fleet costs.

GPUs are the unit of capacity. A live node (pending … draining) bills all of its ``gpus_total``
slots; a replica holds its ``gpu_ids`` until its agent reports it stopped or failed, whatever its
desired state. Fragmentation is the billed GPUs no replica holds. A node's price per hour is split
over the replicas on it by the GPUs each holds; the free slots' share is "unallocated", so the pool
shares and the unallocated share add up to the fleet's $/hour.

The pure functions (``slot_map``, ``node_price``, ``node_use``, ``fleet_summary``) read plain
attributes and work on ORM rows and API structs alike; the async loaders below them gather rows for
the console pages. Read-only: nothing here writes.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.models import Cloud, InstanceType, Node, Pool, Region, Replica, Tenant
from controlplane.models.enums import NodeState, ReplicaDesiredState, ReplicaState
from controlplane.schemas.fleet import OperationOut
from controlplane.services import fleet

# What controlplane.fleet.nodes.LIVE_STATES bills, and the replica states whose GPUs are free.
_LIVE = (NodeState.pending, NodeState.provisioning, NodeState.booting, NodeState.ready, NodeState.draining)
_ENDED = (ReplicaState.stopped, ReplicaState.failed)
LIVE_NODE_STATES = frozenset(s.value for s in _LIVE)
ENDED_REPLICA_STATES = frozenset(s.value for s in _ENDED)
UNALLOCATED = "unallocated"

# (cloud, region, instance type) -> (on-demand, spot) USD per instance-hour, from the imported catalog.
CatalogPrices = Mapping[tuple[str, str, str], tuple[float | None, float | None]]


def _value(x: Any) -> str:
    return str(getattr(x, "value", x) or "")


def _short(x: Any) -> str:
    return str(x)[:8]


def holds_gpus(replica: Any) -> bool:
    return _value(replica.state) not in ENDED_REPLICA_STATES


def display_state(replica: Any) -> str:
    """The replica's reported state, except that one told to stop and still holding GPUs is draining."""
    state = _value(replica.state)
    if state not in ENDED_REPLICA_STATES and _value(replica.desired_state) == ReplicaDesiredState.stopped.value:
        return ReplicaState.draining.value
    return state


def node_gpus(node: Any) -> int:
    spec = node.launch_spec or {}
    return int(node.gpus_total or spec.get("gpu_count") or 0)


def node_where(node: Any) -> tuple[str, str, str]:
    """(cloud, region, instance type); a node not launched yet has them only in its launch spec."""
    spec = node.launch_spec or {}
    return (node.cloud or spec.get("cloud") or "?", node.region or spec.get("region") or "?",
            node.instance_type or spec.get("instance_type") or "?")


def market(node: Any) -> str:
    return "spot" if node.spot else "on-demand"


def node_price(node: Any, catalog: CatalogPrices) -> tuple[float | None, str]:
    """USD per hour and where it came from: the placement's launch spec, else the catalog's price of
    the node's market, else unknown (None)."""
    price = (node.launch_spec or {}).get("price_per_hour")
    if isinstance(price, int | float) and not isinstance(price, bool) and price >= 0:
        return float(price), "launch spec"
    on_demand, spot = catalog.get(node_where(node), (None, None))
    price = spot if node.spot else on_demand
    if price is not None:
        return float(price), "catalog"
    return None, "unknown"


# ---------------------------------------------------------------- slot map
@dataclass(frozen=True)
class Holder:
    """A replica holding a GPU slot."""

    replica_id: str
    pool_id: str
    pool_name: str
    state: str  # display state: a replica told to stop reads "draining"
    desired_state: str
    copy_of: str | None  # short id of the replica this consolidation copy replaces
    spare: bool = False  # above its pool's size on GPUs billed anyway (controlplane.fleet.spares)

    @property
    def short_id(self) -> str:
        return self.replica_id[:8]

    @property
    def stop_requested(self) -> bool:
        return self.desired_state == ReplicaDesiredState.stopped.value


@dataclass(frozen=True)
class Slot:
    index: int
    holders: tuple[Holder, ...]

    @property
    def free(self) -> bool:
        return not self.holders

    @property
    def conflict(self) -> bool:  # two replicas claim one GPU: a bug worth seeing
        # A spare told to stop for the replica placed on its GPUs is not one: that replica waits
        # on its agent until the spare's engine has let them go.
        return sum(1 for h in self.holders if not (h.spare and h.stop_requested)) > 1


def holder(replica: Any, pool_names: Mapping[str, str]) -> Holder:
    pool_id = str(replica.pool_id)
    return Holder(
        replica_id=str(replica.id), pool_id=pool_id, pool_name=pool_names.get(pool_id, _short(pool_id)),
        state=display_state(replica), desired_state=_value(replica.desired_state) or "running",
        copy_of=_short(replica.replaces_id) if getattr(replica, "replaces_id", None) else None,
        spare=bool(getattr(replica, "spare", False)),
    )


def slot_map(gpus_total: int, replicas: Iterable[Any], pool_names: Mapping[str, str]) -> tuple[Slot, ...]:
    """One slot per GPU index 0..gpus_total-1 with the replicas (still holding GPUs) that name it."""
    held: dict[int, list[Holder]] = defaultdict(list)
    for r in replicas:
        if not holds_gpus(r):
            continue
        h = holder(r, pool_names)
        for g in sorted(set(r.gpu_ids or ())):
            if isinstance(g, int) and 0 <= g < gpus_total:
                held[g].append(h)
    return tuple(Slot(i, tuple(held.get(i, ()))) for i in range(gpus_total))


# ---------------------------------------------------------------- one node, the fleet
@dataclass(frozen=True)
class NodeUse:
    node_id: str
    state: str
    cloud: str
    region: str
    instance_type: str
    market: str
    gpus: int
    price_per_hour: float | None
    price_source: str
    slots: tuple[Slot, ...]

    @property
    def short_id(self) -> str:
        return self.node_id[:8]

    @property
    def allocated(self) -> int:
        return sum(1 for s in self.slots if not s.free)

    @property
    def free(self) -> int:
        return self.gpus - self.allocated

    @property
    def live(self) -> bool:
        return self.state in LIVE_NODE_STATES

    def cost_split(self) -> tuple[dict[str, float], float]:
        """The node's $/hour by pool id (split by GPUs held) and its unallocated share."""
        if self.price_per_hour is None:
            return {}, 0.0
        if self.gpus <= 0:
            return {}, self.price_per_hour
        per_gpu = self.price_per_hour / self.gpus
        by_pool: dict[str, float] = defaultdict(float)
        unallocated = 0.0
        for s in self.slots:
            if s.free:
                unallocated += per_gpu
            for h in s.holders:  # a contested slot is split between its claimants
                by_pool[h.pool_id] += per_gpu / len(s.holders)
        return dict(by_pool), unallocated


def node_use(node: Any, replicas: Iterable[Any], catalog: CatalogPrices, pool_names: Mapping[str, str]) -> NodeUse:
    cloud, region, instance_type = node_where(node)
    price, source = node_price(node, catalog)
    gpus = node_gpus(node)
    return NodeUse(
        node_id=str(node.id), state=_value(node.state), cloud=cloud, region=region, instance_type=instance_type,
        market=market(node), gpus=gpus, price_per_hour=price, price_source=source,
        slots=slot_map(gpus, replicas, pool_names),
    )


@dataclass(frozen=True)
class PoolCost:
    pool_id: str | None  # None: the unallocated share
    name: str
    gpus: int
    per_hour: float
    share: float | None  # of the fleet's $/hour


@dataclass(frozen=True)
class GroupRow:
    cloud: str
    region: str
    instance_type: str
    market: str
    nodes: tuple[NodeUse, ...]
    billed: int
    allocated: int
    per_hour: float
    unpriced: int  # nodes of the group with no known price (not in per_hour)


@dataclass(frozen=True)
class FleetSummary:
    nodes: tuple[NodeUse, ...]  # live nodes
    billed: int
    allocated: int
    per_hour: float
    by_pool: tuple[PoolCost, ...]  # most expensive first
    unallocated: PoolCost
    groups: tuple[GroupRow, ...]
    unpriced: tuple[NodeUse, ...]

    @property
    def free(self) -> int:
        return self.billed - self.allocated

    @property
    def fragmentation(self) -> float | None:
        return self.free / self.billed if self.billed else None


def fleet_summary(nodes: Iterable[Any], replicas: Iterable[Any], prices: CatalogPrices,
                  pool_names: Mapping[str, str] | None = None) -> FleetSummary:
    """Billed vs allocated GPUs, fragmentation and $/hour of the live fleet, by pool and node group.

    ``nodes`` may include nodes that are not live (they are left out); ``prices`` is the catalog's
    (see ``node_price``); ``pool_names`` names pools by id (a missing one shows its short id)."""
    names = dict(pool_names or {})
    on_node: dict[str, list[Any]] = defaultdict(list)
    for r in replicas:
        on_node[str(r.node_id)].append(r)
    uses = tuple(u for u in (node_use(n, on_node.get(str(n.id), ()), prices, names) for n in nodes) if u.live)

    cost: dict[str, float] = defaultdict(float)
    gpus: dict[str, int] = defaultdict(int)
    unallocated_cost = 0.0
    groups: dict[tuple[str, str, str, str], list[NodeUse]] = defaultdict(list)
    for u in uses:
        split, free_cost = u.cost_split()
        for pool_id, c in split.items():
            cost[pool_id] += c
        unallocated_cost += free_cost
        for s in u.slots:
            for h in s.holders:  # a contested slot counts for each claimant here (its cost is split)
                gpus[h.pool_id] += 1
        groups[(u.cloud, u.region, u.instance_type, u.market)].append(u)
    total = sum(u.price_per_hour for u in uses if u.price_per_hour is not None)
    billed = sum(u.gpus for u in uses)

    def share(c: float) -> float | None:
        return c / total if total > 0 else None

    by_pool = sorted(
        (PoolCost(pid, names.get(pid, _short(pid)), gpus[pid], cost.get(pid, 0.0), share(cost.get(pid, 0.0)))
         for pid in set(gpus) | set(cost)),
        key=lambda p: (-p.per_hour, p.name),
    )
    free = billed - sum(u.allocated for u in uses)
    return FleetSummary(
        nodes=uses, billed=billed, allocated=sum(u.allocated for u in uses), per_hour=total, by_pool=tuple(by_pool),
        unallocated=PoolCost(None, UNALLOCATED, free, unallocated_cost, share(unallocated_cost)),
        groups=tuple(
            GroupRow(cloud=k[0], region=k[1], instance_type=k[2], market=k[3], nodes=tuple(members),
                     billed=sum(u.gpus for u in members), allocated=sum(u.allocated for u in members),
                     per_hour=sum(u.price_per_hour or 0.0 for u in members),
                     unpriced=sum(1 for u in members if u.price_per_hour is None))
            for k, members in sorted(groups.items())
        ),
        unpriced=tuple(u for u in uses if u.price_per_hour is None),
    )


# ---------------------------------------------------------------- loaders for the console
async def catalog_prices(db: AsyncSession) -> dict[tuple[str, str, str], tuple[float | None, float | None]]:
    rows = await db.execute(
        select(Cloud.name, Region.name, InstanceType.name, InstanceType.on_demand_price, InstanceType.spot_price)
        .join(Region, Region.cloud_id == Cloud.id).join(InstanceType, InstanceType.region_id == Region.id)
    )
    return {(c, r, it): (od, sp) for c, r, it, od, sp in rows}


async def pool_names(db: AsyncSession, pool_ids: Iterable[Any]) -> dict[str, str]:
    ids = {uuid.UUID(str(p)) for p in pool_ids}
    if not ids:
        return {}
    rows = await db.execute(select(Pool.id, Pool.name).where(Pool.id.in_(ids)))
    return {str(pid): name for pid, name in rows}


async def _holding_replicas(db: AsyncSession, node_ids: Sequence[uuid.UUID]) -> list[Replica]:
    if not node_ids:
        return []
    return list(await db.scalars(
        select(Replica).where(Replica.node_id.in_(node_ids), Replica.state.not_in(_ENDED))
        .order_by(Replica.created_at, Replica.id)
    ))


async def load_fleet_summary(db: AsyncSession) -> FleetSummary:
    nodes = list(await db.scalars(
        select(Node).where(Node.state.in_(_LIVE)).order_by(Node.created_at, Node.id)
    ))
    replicas = await _holding_replicas(db, [n.id for n in nodes])
    return fleet_summary(nodes, replicas, await catalog_prices(db), await pool_names(db, {r.pool_id for r in replicas}))


async def node_uses(db: AsyncSession, nodes: Sequence[Any]) -> dict[str, NodeUse]:
    """Slot use and price of each given node (any state), by node id."""
    replicas = await _holding_replicas(db, [n.id for n in nodes])
    on_node: dict[str, list[Replica]] = defaultdict(list)
    for r in replicas:
        on_node[str(r.node_id)].append(r)
    prices, names = await catalog_prices(db), await pool_names(db, {r.pool_id for r in replicas})
    return {str(n.id): node_use(n, on_node.get(str(n.id), ()), prices, names) for n in nodes}


@dataclass(frozen=True)
class NodeBrief:
    """What a replica row says about its node."""

    node_id: str
    state: str
    instance_type: str
    zone: str | None

    @property
    def short_id(self) -> str:
        return self.node_id[:8]


async def node_briefs(db: AsyncSession, node_ids: Iterable[uuid.UUID]) -> dict[str, NodeBrief]:
    ids = set(node_ids)
    if not ids:
        return {}
    rows = await db.scalars(select(Node).where(Node.id.in_(ids)))
    return {str(n.id): NodeBrief(str(n.id), _value(n.state), node_where(n)[2], n.zone) for n in rows}


@dataclass(frozen=True)
class ReplicaRow:
    replica_id: str
    pool_id: str
    pool_name: str
    state: str  # display state
    reported_state: str
    desired_state: str
    gpu_ids: tuple[int, ...]
    copy_of: str | None
    url: str | None
    ready_at: dt.datetime | None
    holds_gpus: bool
    spare: bool = False  # above its pool's size on GPUs billed anyway (controlplane.fleet.spares)

    @property
    def short_id(self) -> str:
        return self.replica_id[:8]


@dataclass(frozen=True)
class NodePage:
    use: NodeUse
    zone: str | None
    gpu_type: str | None
    dedicated_tenant: str | None  # the tenant's name (or id if it is gone); None: shared capacity
    instance_id: str | None
    private_ip: str | None
    error: str | None
    times: tuple[tuple[str, dt.datetime | None], ...]  # created, heartbeat, empty/underused since, …
    state_history: tuple[tuple[str, dt.datetime], ...]  # (state, entered at), oldest first
    replicas: tuple[ReplicaRow, ...]  # every replica the node hosts or hosted, newest first
    consolidation: dict | None  # the last consolidation record (kind, reason, savings_per_hour, score, …)
    operations: tuple[OperationOut, ...]
    cached_models: tuple[str, ...] = ()  # model paths its agent reports on local disk


def _parse_time(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value
    try:
        return dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None


def state_history(state_times: Mapping[str, Any] | None) -> tuple[tuple[str, dt.datetime], ...]:
    parsed = [(state, t) for state, raw in (state_times or {}).items() if (t := _parse_time(raw)) is not None]
    return tuple(sorted(parsed, key=lambda x: x[1]))


async def load_node_page(db: AsyncSession, node_id: uuid.UUID, replica_limit: int = 200) -> NodePage:
    node = await fleet.get_node(db, node_id)
    replicas = list(await db.scalars(
        select(Replica).where(Replica.node_id == node.id).order_by(Replica.created_at.desc(), Replica.id)
        .limit(replica_limit)
    ))
    holding = await _holding_replicas(db, [node.id])  # the slot map never misses one past the list's limit
    names = await pool_names(db, {r.pool_id for r in (*replicas, *holding)})
    use = node_use(node, holding, await catalog_prices(db), names)
    tenant = None
    if node.dedicated_tenant_id is not None:
        t = await db.get(Tenant, node.dedicated_tenant_id)
        tenant = (t.display_name or t.name) if t is not None else f"{node.dedicated_tenant_id} (deleted)"
    ops, _ = await fleet.list_operations(db, pool_id=None, node_id=node.id, state=None, limit=50, offset=0)
    record = (node.metrics or {}).get("consolidation")
    spec = node.launch_spec or {}
    return NodePage(
        use=use, zone=node.zone, gpu_type=spec.get("gpu_type"), dedicated_tenant=tenant,
        instance_id=node.instance_id, private_ip=node.private_ip, error=node.error,
        times=(("Created", node.created_at), ("Last heartbeat", node.last_heartbeat_at),
               ("Empty since", node.empty_since), ("Underused since", node.underused_since),
               ("Drain deadline", node.drain_deadline_at)),
        state_history=state_history(node.state_times),
        replicas=tuple(
            ReplicaRow(
                replica_id=str(r.id), pool_id=str(r.pool_id), pool_name=names.get(str(r.pool_id), _short(r.pool_id)),
                state=display_state(r), reported_state=_value(r.state), desired_state=_value(r.desired_state),
                gpu_ids=tuple(r.gpu_ids or ()), copy_of=_short(r.replaces_id) if r.replaces_id else None, url=r.url,
                ready_at=r.ready_at, holds_gpus=holds_gpus(r), spare=bool(getattr(r, "spare", False)),
            )
            for r in replicas
        ),
        consolidation=record if isinstance(record, dict) else None,
        operations=tuple(fleet.operation_out(o) for o in ops),
        cached_models=tuple(node.cached_models or ()),
    )
