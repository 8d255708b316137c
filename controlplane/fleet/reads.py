"""The fleet tick's reads: the live fleet as plain rows, the columns the tick uses and nothing else.

The tick reads every pool, every live node and every replica that holds GPUs or is wanted, on
every tick: at 1,000 pools × 10 replicas that is over 11,000 rows. Loaded as ORM objects they
cost the most of the tick (instance state, identity map, attribute instrumentation, and the
flush's change scan over all of them); read here as column tuples into slotted dataclasses they
are a few times cheaper and leave the session empty. A row is changed only through
:class:`controlplane.fleet.writes.RowWrites`, which records what changed and writes it in
batches; a node the tick releases is loaded as an ORM object then, since its state changes only
through ``fleet.nodes.transition``.

Each row class names its table (``table``) and holds its key in ``id``: what ``RowWrites`` needs.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sqlalchemy import Table, Text, cast, select
from sqlalchemy.orm import Session

from controlplane.models import (
    ModelVariant,
    Node,
    NodeState,
    Pool,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
    SpotPolicy,
)

S = NodeState
R = ReplicaState
# Nodes that can take new replicas (a pending node's slots can be promised before it launches).
PLACEABLE_NODE_STATES = (S.pending, S.provisioning, S.booting, S.ready)
# Nodes whose replicas the tick looks after: the placeable ones plus those draining as a whole.
FLEET_NODE_STATES = (*PLACEABLE_NODE_STATES, S.draining)
ENDED = (R.stopped, R.failed)  # no engine runs: the replica's GPUs are free


@dataclass(slots=True, eq=False)
class PoolRow:
    """A pool with what its variant needs from the hardware (the tick never reads the rest)."""

    table: ClassVar[Table] = Pool.__table__
    id: uuid.UUID
    variant_id: uuid.UUID
    desired_replicas: int
    paused: bool
    spot_policy: SpotPolicy
    spot_base_on_demand: int
    placement: list[dict]
    dedicated_tenant_id: uuid.UUID | None
    capacity_status: str | None
    last_reconciled_at: dt.datetime | None
    # the variant's needs
    gpu_count: int
    gpu_memory_gb: float | None
    gpu_types: list[str] | None
    profiled_tokens_per_s: dict | None
    model_path: str


@dataclass(slots=True, eq=False)
class NodeRow:
    """A live node. ``metrics`` (heartbeat metrics, the bulk of the row) is not read with the
    fleet: ``load_node_metrics`` fills it for the few nodes whose consolidation record is read or
    written."""

    table: ClassVar[Table] = Node.__table__
    id: uuid.UUID
    state: NodeState
    cloud: str | None
    region: str | None
    zone: str | None
    instance_type: str | None
    spot: bool
    gpus_total: int
    dedicated_tenant_id: uuid.UUID | None
    launch_spec: dict | None
    instance_id: str | None
    agent_url: str | None
    empty_since: dt.datetime | None
    underused_since: dt.datetime | None
    drain_deadline_at: dt.datetime | None
    cached_models: frozenset[str] | list[str] | None  # a frozenset as read, a list on a new row
    metrics: dict | None = None
    metrics_loaded: bool = False
    key: str = ""  # str(id), as placement names nodes

    def __post_init__(self) -> None:
        self.key = str(self.id)


@dataclass(slots=True, eq=False)
class ReplicaRow:
    table: ClassVar[Table] = Replica.__table__
    id: uuid.UUID
    node_id: uuid.UUID
    pool_id: uuid.UUID
    state: ReplicaState
    desired_state: ReplicaDesiredState
    gpu_ids: tuple[int, ...] | list[int] | None  # a tuple as read (never mutated), a list on a new row
    replaces_id: uuid.UUID | None
    model_ready_seconds: float | None
    created_at: dt.datetime | None
    drain_deadline_at: dt.datetime | None
    stop_reason: str | None = None
    spare: bool = False  # above the pool's desired_replicas, on GPUs billed anyway (fleet.spares)
    # str(id) and str(pool_id), as placement and consolidation name them (set by the readers).
    key: str = ""
    pool_key: str = ""


# The columns read, in the rows' field order. Table columns, not ORM attributes: the statements
# run as Core selects, without the ORM's per-row loading machinery.
P, V, N, RT = Pool.__table__.c, ModelVariant.__table__.c, Node.__table__.c, Replica.__table__.c
POOL_COLUMNS = (P.id, P.variant_id, P.desired_replicas, P.paused, P.spot_policy, P.spot_base_on_demand, P.placement,
                P.dedicated_tenant_id, P.capacity_status, P.last_reconciled_at,
                V.gpu_count, V.gpu_memory_gb, V.gpu_types, V.profiled_tokens_per_s, V.model_path)
NODE_COLUMNS = (N.id, N.state, N.cloud, N.region, N.zone, N.instance_type, N.spot, N.gpus_total,
                N.dedicated_tenant_id, N.launch_spec, N.instance_id, N.agent_url, N.empty_since, N.underused_since,
                N.drain_deadline_at, N.cached_models)
REPLICA_COLUMNS = (RT.id, RT.node_id, RT.pool_id, RT.state, RT.desired_state, RT.gpu_ids, RT.replaces_id,
                   RT.model_ready_seconds, RT.created_at, RT.drain_deadline_at, RT.stop_reason, RT.spare)
# JSON columns whose values repeat across rows are read as their JSON text and parsed once per
# distinct text per tick (``_Parsed``), where the driver would decode every row's: a fleet holds few
# distinct GPU index lists ([0], [2, 3], …), a variant's needs repeat on each of its pools' rows, and
# the nodes that serve the same pools hold the same few sets of cached models.
# The parsed values are shared between rows, so the tick never mutates them (``gpu_ids`` becomes
# a tuple).
_POOL_JSON = (P.placement, V.gpu_types, V.profiled_tokens_per_s)
_POOL_SELECT = tuple(cast(c, Text) if c in _POOL_JSON else c for c in POOL_COLUMNS)
_POOL_JSON_AT = tuple(POOL_COLUMNS.index(c) for c in _POOL_JSON)
_REPLICA_SELECT = tuple(cast(c, Text) if c is RT.gpu_ids else c for c in REPLICA_COLUMNS)
_NODE_SELECT = tuple(cast(c, Text) if c is N.cached_models else c for c in NODE_COLUMNS)
_CACHED_MODELS_AT = NODE_COLUMNS.index(N.cached_models)
_GPU_IDS_AT = REPLICA_COLUMNS.index(RT.gpu_ids)


class _Parsed(dict):
    """JSON text → its value, parsed on first use (``None`` stays ``None``)."""

    def __init__(self, convert=None) -> None:
        super().__init__({None: None})
        self.convert = convert

    def __missing__(self, text: str) -> Any:
        value = json.loads(text)
        value = self[text] = self.convert(value) if self.convert else value
        return value


@dataclass
class Fleet:
    """The fleet as read, and what the tick adds to it (``add_replica``, ``nodes[id] = row``)."""

    pools: dict[uuid.UUID, PoolRow]
    nodes: dict[uuid.UUID, NodeRow]
    replicas: list[ReplicaRow]  # every replica on a fleet node that still holds GPUs or is wanted
    by_id: dict[uuid.UUID, ReplicaRow] = field(init=False)
    _by_node: defaultdict[uuid.UUID, list[ReplicaRow]] = field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {r.id: r for r in self.replicas}
        self._by_node = defaultdict(list)
        for r in self.replicas:
            self._by_node[r.node_id].append(r)

    def add_replica(self, r: ReplicaRow) -> None:
        self.replicas.append(r)
        self.by_id[r.id] = r
        self._by_node[r.node_id].append(r)

    def on_node(self) -> dict[uuid.UUID, list[ReplicaRow]]:
        """Each node's replicas, in the order of ``replicas`` (kept up to date by ``add_replica``;
        read it with ``get``)."""
        return self._by_node


def read_fleet(session: Session) -> Fleet:
    """Every pool, every live node and every replica on one that holds GPUs or is wanted, in
    three statements, ordered as the ORM reads were (pools and replicas by id)."""
    parsed = _Parsed()
    pools: dict[uuid.UUID, PoolRow] = {}
    for row in session.execute(select(*_POOL_SELECT).join_from(Pool.__table__, ModelVariant.__table__,
                                                               P.variant_id == V.id).order_by(P.id)).all():
        values = list(row)
        for i in _POOL_JSON_AT:
            values[i] = parsed[values[i]]
        pools[row[0]] = PoolRow(*values)
    cached_sets = _Parsed(frozenset)
    nodes: dict[uuid.UUID, NodeRow] = {}
    for row in session.execute(select(*_NODE_SELECT).where(N.state.in_(FLEET_NODE_STATES))).all():
        node = nodes[row[0]] = NodeRow(*row)
        node.cached_models = cached_sets[row[_CACHED_MODELS_AT]]
    replicas: list[ReplicaRow] = []
    if nodes:
        pool_keys: dict[uuid.UUID, str] = {pool_id: str(pool_id) for pool_id in pools}
        gpu_lists = _Parsed(tuple)
        rows = session.execute(select(*_REPLICA_SELECT).where(RT.node_id.in_(list(nodes)), RT.state.not_in(ENDED))
                               .order_by(RT.id)).all()
        node_ids = {node_id: node_id for node_id in nodes}  # one id object per node and pool: dict
        pool_ids = {pool_id: pool_id for pool_id in pools}  # lookups by them then match by identity
        for row in rows:
            r = ReplicaRow(*row)
            r.node_id = node_ids.get(r.node_id, r.node_id)
            r.pool_id = pool_ids.get(r.pool_id, r.pool_id)
            r.gpu_ids = gpu_lists[row[_GPU_IDS_AT]]
            r.key = str(r.id)
            r.pool_key = pool_keys.get(r.pool_id) or str(r.pool_id)
            replicas.append(r)
    return Fleet(pools, nodes, replicas)


def load_node_metrics(session: Session, nodes: Iterable[NodeRow]) -> None:
    """Fill ``metrics`` of the nodes that lack it, in one statement."""
    missing = {n.id: n for n in nodes if not n.metrics_loaded}
    if not missing:
        return
    for node_id, metrics in session.execute(select(N.id, N.metrics).where(N.id.in_(list(missing)))):
        missing[node_id].metrics = metrics
    for n in missing.values():
        n.metrics_loaded = True


def node_row(node: Node) -> NodeRow:
    """The row of a node the tick itself just wrote (a planned node), read off its ORM object."""
    return NodeRow(*(getattr(node, c.key) for c in NODE_COLUMNS), metrics=node.metrics, metrics_loaded=True)


def replica_row(replica: Replica) -> ReplicaRow:
    """The row of a replica the tick itself just wrote (a placed replica or a move's copy)."""
    return ReplicaRow(*(getattr(replica, c.key) for c in REPLICA_COLUMNS), key=str(replica.id),
                      pool_key=str(replica.pool_id))
