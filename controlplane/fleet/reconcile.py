"""The fleet tick: make the GPU fleet follow every pool's ``desired_replicas``, a GPU at a time.

One tick, one transaction, one worker at a time fleet-wide (a transaction-scoped advisory lock:
placement hands out GPU slots of shared nodes, so two planners at once could promise a slot
twice). The tick only touches the database; the launcher and terminator carry its operations
out against the clouds after commit. Its steps:

1. **Read** the live fleet: pools, nodes with their GPU slots, the replicas that hold them, as
   plain rows of the columns the tick uses (``fleet.reads``; no ORM object per row).
2. **Finish moves and drains**: a make-before-break copy that is ready retires its original; a
   copy that failed or timed out is given up (the original keeps serving); a replica told to stop
   whose agent never confirmed it is written off at its deadline.
3. **Size**: per pool and market (the spot/on-demand mix, decided once, in ``fleet.markets``),
   missing replicas are *placed* (``fleet.placement``: free slots first, the cheapest new shapes
   for the rest); surplus ones are told to stop (replica drains, never a node drain).
4. **Nodes**: a node that holds no replica is released after ``empty_node_ttl_s`` (0 by default:
   at once; at once whatever the setting if it never launched, or if a consolidation emptied it);
   underused nodes are timed for consolidation.
5. **Consolidate** (``fleet.consolidation``): delete or replace underused nodes by moving their
   replicas make-before-break, within the disruption budgets.

Row writes go through :mod:`controlplane.fleet.writes`, so every state change has one author; the
changes to the rows read are recorded there and written in batches (``writes.RowWrites``), so a
steady tick issues the same ten statements at every fleet size.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gc
import uuid
import zlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.orm import Session

from controlplane.config import Settings
from controlplane.fleet import blocklist, markets, placement_catalog, spares, writes
from controlplane.fleet.capacity import (
    ConsolidationBudget,
    HostedReplica,
    NodeSlots,
    Offer,
    PoolNeed,
    profiled_throughput,
    serving_gpu_types,
)
from controlplane.fleet.consolidation import plan_consolidation
from controlplane.fleet.leases import claimable
from controlplane.fleet.placement import choose_surplus, fits_offer, plan_placement, tokens_per_s
from controlplane.fleet.provisioning import (
    CAPACITY_UNAVAILABLE,
    OPEN_STATES,
    drained_node_ids,
    finish_operation,
    launch_key,
)
from controlplane.fleet.reads import (
    ENDED,
    FLEET_NODE_STATES,  # noqa: F401 (where the tick's callers have always found it)
    PLACEABLE_NODE_STATES,
    Fleet,
    NodeRow,
    PoolRow,
    ReplicaRow,
    load_node_metrics,
    read_fleet,
)
from controlplane.fleet.writes import RowWrites
from controlplane.models import (
    NodeState,
    Operation,
    OperationKind,
    OperationState,
    ReplicaDesiredState,
    ReplicaState,
)

S = NodeState
R = ReplicaState
RUN, STOP = ReplicaDesiredState.running, ReplicaDesiredState.stopped
FLEET_LOCK = zlib.crc32(b"nimbus.fleet.tick")  # the advisory lock's key


def try_fleet_lock(session: Session) -> bool:
    """True when this transaction may plan the fleet. Postgres: a transaction-scoped advisory
    lock, released by commit or rollback (a killed worker cannot keep it). SQLite (the embedded
    platform) serializes writers itself."""
    if session.bind.dialect.name != "postgresql":
        return True
    return bool(session.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": FLEET_LOCK}))


@dataclass
class TickResult:
    skipped: bool = False  # another worker holds the fleet lock
    pools: int = 0
    placed: int = 0
    launched: int = 0  # new nodes
    stopped: int = 0  # replicas told to stop (scale-down)
    terminated: int = 0  # nodes released
    moves: int = 0  # consolidation copies started
    spares: int = 0  # spare replicas started on free GPU slots (fleet.spares)
    promoted: int = 0  # spares that became regular replicas (a scale-up without a cold start)
    demoted: int = 0  # surplus replicas kept as spares (their node stays billed)
    evicted: int = 0  # spares stopped because placement or a move took their GPUs
    swapped: int = 0  # spares that took over from a regular replica so that its node empties
    unplaced: dict[str, str] = field(default_factory=dict)  # pool id → why
    operations: list[tuple[uuid.UUID, OperationKind]] = field(default_factory=list)  # to run now


# ---------------------------------------------------------------- the fleet as placement sees it
def holds_gpus(r: ReplicaRow) -> bool:
    return r.state not in ENDED


def counts_for_pool(r: ReplicaRow, by_id: dict[uuid.UUID, ReplicaRow]) -> bool:
    """A replica that counts toward its pool's size: wanted, on a serving node, and not a move's
    copy whose original still serves (the pair is one replica until the copy takes over)."""
    if r.desired_state != RUN or r.state in ENDED:
        return False
    if r.replaces_id is not None and (orig := by_id.get(r.replaces_id)) is not None and orig.desired_state == RUN:
        return False
    return True


def move_ends(replicas: Sequence[ReplicaRow], by_id: dict[uuid.UUID, ReplicaRow] | None = None) -> set[uuid.UUID]:
    """Both ends of every move under way: copies whose original still serves, and those originals
    (``by_id``: the same replicas by id, if the caller has them)."""
    if by_id is None:
        by_id = {r.id: r for r in replicas}
    ends: set[uuid.UUID] = set()
    for r in replicas:
        if (r.replaces_id is not None and r.desired_state == RUN and holds_gpus(r)
                and (orig := by_id.get(r.replaces_id)) is not None and orig.desired_state == RUN):
            ends.update((r.id, orig.id))
    return ends


def moves_under_way(replicas: Sequence[ReplicaRow], by_id: dict[uuid.UUID, ReplicaRow],
                    in_flight: set[uuid.UUID]) -> list[tuple[ReplicaRow, ReplicaRow]]:
    """(copy, original) of every move under way (``in_flight``: ``move_ends``). Both must be ends:
    a copy keeps ``replaces_id`` after its move, and when it is moved again it is an end of the new
    move while the original it once replaced, stopped but maybe still draining, is not."""
    return [(c, by_id[c.replaces_id]) for c in replicas
            if c.replaces_id is not None and c.id in in_flight and c.replaces_id in in_flight]


def node_slots(node: NodeRow, replicas: Sequence[ReplicaRow], shapes: placement_catalog.Shapes,
               in_flight: set[uuid.UUID] = frozenset(), *, with_spares: bool = False) -> NodeSlots:
    spec = node.launch_spec or {}
    # Nodes launched before placement wrote GPU type, memory and price into the launch spec (rows
    # carried over by migration 0004) take them from the catalog.
    shape = shapes.get((node.cloud or spec.get("cloud"), node.region or spec.get("region"),
                        node.instance_type or spec.get("instance_type")))
    # Spares hold their GPUs only until something else wants them (``fleet.spares``): placement
    # and consolidation see those slots free, and whatever they put there stops the spare first.
    # ``with_spares`` is the view that fills slots with spares: every GPU held is taken.
    hosted = tuple(
        HostedReplica(
            replica_id=r.key, pool_id=r.pool_key, gpu_ids=tuple(r.gpu_ids or ()), ready=r.state == R.ready,
            model_ready_s=float(r.model_ready_seconds or 60.0),
            moving=r.desired_state != RUN or (bool(in_flight) and r.id in in_flight),
        )
        for r in replicas if r.state not in ENDED and (with_spares or not r.spare)
    )
    return NodeSlots(
        node_id=node.key, cloud=node.cloud or spec.get("cloud") or "", region=node.region or spec.get("region") or "",
        zone=node.zone, instance_type=node.instance_type or spec.get("instance_type") or "",
        gpu_type=spec.get("gpu_type") or (shape.gpu_type if shape else ""),
        gpus_total=node.gpus_total or int(spec.get("gpu_count") or 0),
        spot=node.spot, dedicated_tenant_id=str(node.dedicated_tenant_id) if node.dedicated_tenant_id else None,
        price_per_hour=float(spec.get("price_per_hour") or (shape.price(node.spot) if shape else 0.0)),
        replicas=hosted,
        launched=node.instance_id is not None, ready=node.state == S.ready,
        underused_since=node.underused_since.timestamp() if node.underused_since else None,
        gpu_memory_gb=float(spec.get("gpu_memory_gb") or (shape.gpu_memory_gb if shape else 0.0)),
        cached_models=frozenset(node.cached_models or ()),
    )


def pool_need(pool: PoolRow, missing_spot: int = 0, missing_on_demand: int = 0) -> PoolNeed:
    return PoolNeed(
        pool_id=str(pool.id), gpus_per_replica=max(1, pool.gpu_count), gpu_memory_gb=float(pool.gpu_memory_gb or 0),
        gpu_types=tuple(pool.gpu_types or ()), placement=placement_catalog.placement_prefs(pool.placement or []),
        dedicated_tenant_id=str(pool.dedicated_tenant_id) if pool.dedicated_tenant_id else None,
        missing_spot=missing_spot, missing_on_demand=missing_on_demand,
        tokens_per_s=dict(pool.profiled_tokens_per_s or {}), model_path=pool.model_path,
    )


# ---------------------------------------------------------------- the tick
@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a while (left as it was found after). A tick
    allocates several objects per row it reads (over 100k at 10k replicas), nearly all acyclic
    and alive until it returns, so the collector's passes find nothing to free; they were about
    40 % of a steady tick's CPU at 1,000 pools × 10 replicas. What the tick leaves behind is
    collected by the next pass after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def fleet_tick(session: Session, settings: Settings, now: dt.datetime) -> TickResult:
    if not try_fleet_lock(session):
        return TickResult(skipped=True)
    with collector_paused():
        return _tick(session, settings, now)


def _tick(session: Session, settings: Settings, now: dt.datetime) -> TickResult:
    fleet = read_fleet(session)
    result = TickResult(pools=len(fleet.pools))
    by_id = fleet.by_id
    changes = RowWrites()  # the column changes to the rows read, written in batches

    finish_moves_and_drains(session, changes, fleet, by_id, now, settings)
    spares_on = settings.spare_replicas_enabled
    catalog = placement_catalog.load(session)
    blocks = blocklist.active_blocks(session, now)
    offers = placement_catalog.offers(catalog, blocks, now)
    launches: dict[str, NodeRow] = {}
    launch_ops: list[Operation] = []  # added after the new nodes are flushed (they reference them)
    terminations: list[Operation] = []
    result.terminated += give_up_stranded_launches(session, changes, fleet, offers, now, settings, terminations)

    # 3. size every pool, per market
    shapes = placement_catalog.shapes(catalog)
    in_flight = move_ends(fleet.replicas, by_id)
    slots = {n.id: node_slots(n, by_node, shapes, in_flight) for n, by_node in _nodes_with_replicas(fleet)}
    sized = (slots, in_flight, len(fleet.replicas))  # what consolidation may reuse (consolidation_slots)
    needs: list[PoolNeed] = []
    scaling_up: set[str] = set()
    # Each pool's counted replicas (and those on spot nodes), grouped in one pass (a scan per pool
    # would be pools × replicas).
    counted: dict[uuid.UUID, list[ReplicaRow]] = defaultdict(list)
    counted_spot: dict[uuid.UUID, list[ReplicaRow]] = defaultdict(list)
    spare_rows: dict[uuid.UUID, list[ReplicaRow]] = defaultdict(list)  # wanted spares, per pool
    loading_copies: dict[uuid.UUID, list[tuple[uuid.UUID, str | None]]] = defaultdict(list)  # per pool
    changed_on: set[uuid.UUID] = set()  # nodes where a replica became or stopped being a spare this tick
    for r in fleet.replicas:
        # counts_for_pool, with its common case (a wanted replica that is no move's copy) inline
        if (r.desired_state == RUN and r.state not in ENDED and (r.replaces_id is None or counts_for_pool(r, by_id))
                and (node := fleet.nodes[r.node_id]).state in PLACEABLE_NODE_STATES):
            if r.spare:
                spare_rows[r.pool_id].append(r)
                continue
            counted[r.pool_id].append(r)
            if node.spot:
                counted_spot[r.pool_id].append(r)
        elif (r.replaces_id is not None and r.desired_state == RUN and r.state in (R.pending, R.starting)
              and r.node_id in slots):
            loading_copies[r.pool_id].append((r.replaces_id, slots[r.node_id].gpu_type))
    # Each node's regular replicas that stay: a surplus replica is kept as a spare only where its
    # node stays billed for another one.
    staying: dict[uuid.UUID, set[uuid.UUID]] = defaultdict(set)
    for rows in counted.values():
        for r in rows:
            staying[r.node_id].add(r.id)
    spot_blocks = [(b.cloud, b.region, b.expires_at) for b in blocks if b.spot is not False]
    cheapest: dict[tuple, float | None] = {}  # pools that need alike share their cheapest prices
    pool_needs: dict[uuid.UUID, PoolNeed] = {}  # what consolidation reads too
    for pool in fleet.pools.values():
        if pool.paused:
            continue
        ours = counted.get(pool.id, [])
        spot_now = counted_spot.get(pool.id, [])
        if spare_rows.get(pool.id) and (pool.desired_replicas == 0
                                        or not spares.has_spares(spares_on, pool.dedicated_tenant_id)):
            # A pool at zero is off (idle, or an operator's 0), and spares turned off are off: they go.
            why = "pool scaled to zero" if pool.desired_replicas == 0 else "spare replicas are turned off"
            for r in spare_rows.pop(pool.id):
                writes.stop_replica(r, fleet.nodes, now, settings, reason=why, changes=changes)
                result.stopped += 1
        need = pool_needs[pool.id] = pool_need(pool)
        mix = markets.split_by_capacity_type(
            pool.spot_policy.value, pool.spot_base_on_demand, pool.desired_replicas,
            spot_price=_cheapest(offers, need, spot=True, memo=cheapest),
            on_demand_price=_cheapest(offers, need, spot=False, memo=cheapest),
            spot_unavailable_until=markets.spot_unavailable_until(spot_blocks, pool.placement or [], now),
            now=now.timestamp(), ready_spot=sum(1 for r in spot_now if r.state == R.ready))
        missing_spot = mix.spot - len(spot_now)
        missing_od = mix.on_demand - (len(ours) - len(spot_now))
        if (missing_spot > 0 or missing_od > 0) and spare_rows.get(pool.id):
            promoted = spares.promote(
                [(r.key, fleet.nodes[r.node_id].spot, r.state == R.ready) for r in spare_rows[pool.id]],
                max(0, missing_spot), max(0, missing_od))
            for replica_id in promoted:
                r = by_id[uuid.UUID(replica_id)]
                changes.set(r, spare=False)
                staying[r.node_id].add(r.id)
                changed_on.add(r.node_id)
                missing_spot -= fleet.nodes[r.node_id].spot
                missing_od -= not fleet.nodes[r.node_id].spot
            result.promoted += len(promoted)
        if missing_spot > 0 or missing_od > 0:
            # sized as the autoscaler sized the target (autoscaling.observe): placement compares
            # GPU types by what carrying that throughput costs on each
            serving = serving_gpu_types({r.id: slots[r.node_id].gpu_type for r in ours if r.node_id in slots},
                                        loading_copies.get(pool.id, ()))
            needs.append(dataclasses.replace(need, missing_spot=max(0, missing_spot),
                                             missing_on_demand=max(0, missing_od),
                                             replica_tokens_per_s=profiled_throughput(need.tokens_per_s, serving)))
            scaling_up.add(str(pool.id))
        if missing_spot < 0 or missing_od < 0:
            victims = choose_surplus(str(pool.id), max(0, -missing_spot), max(0, -missing_od),
                                     [slots[r.node_id] for r in ours if r.node_id in slots])
            for replica_id in victims:
                victim = by_id[uuid.UUID(replica_id)]
                staying[victim.node_id].discard(victim.id)
                if spares.has_spares(spares_on, pool.dedicated_tenant_id) and spares.keep_as_spare(
                        victim.state == R.ready, bool(staying[victim.node_id]), len(spare_rows[pool.id]),
                        pool.desired_replicas, settings.spare_max_ratio):
                    changes.set(victim, spare=True)  # its GPUs stay billed: it stays warm
                    spare_rows[pool.id].append(victim)
                    changed_on.add(victim.node_id)
                    result.demoted += 1
                    continue
                writes.stop_replica(victim, fleet.nodes, now, settings, reason="scale down", changes=changes)
                result.stopped += 1
    if changed_on:  # placement sees the spares' slots as they are now
        on_node = fleet.on_node()
        for node_id in changed_on:
            slots[node_id] = node_slots(fleet.nodes[node_id], on_node.get(node_id, []), shapes, in_flight)
    if needs:
        plan = plan_placement(needs, list(slots.values()), offers)
        for new in plan.launches:
            node, op = writes.add_node(session, new, now, settings, pool_id=_first_pool(plan, new.key))
            launches[new.key] = node
            fleet.nodes[node.id] = node
            launch_ops.append(op)
        for placed in plan.placed:
            node = launches.get(placed.node_id) or fleet.nodes[uuid.UUID(placed.node_id)]
            result.evicted += evict_spares(fleet, node, placed.gpu_ids, now, settings, changes,
                                           reason=f"evicted: its GPUs were placed for pool {placed.pool_id}")
            fleet.add_replica(writes.add_replica(session, fleet.pools[uuid.UUID(placed.pool_id)], node,
                                                 placed.gpu_ids, now))
            result.placed += 1
        for pool_id, count, why in plan.unplaced:
            changes.set(fleet.pools[uuid.UUID(pool_id)], capacity_status=CAPACITY_UNAVAILABLE)
            result.unplaced[pool_id] = f"{count} replica(s): {why}"
        result.launched = len(plan.launches)
        placed_on = {placed.node_id for placed in plan.placed}
    else:
        placed_on = set()
    if spares_on:
        result.swapped = swap_spares(fleet, changes, slots, spare_rows, pool_needs, placed_on, in_flight)
    placed_pools = {p for p in fleet.pools if str(p) not in result.unplaced}
    launching = _launching_pools(fleet)
    for pool_id in placed_pools:
        pool = fleet.pools[pool_id]
        if pool.capacity_status == CAPACITY_UNAVAILABLE and pool_id not in launching:
            changes.set(pool, capacity_status=None)
        changes.set(pool, last_reconciled_at=now)

    # 4. nodes: release the empty ones, time the underused ones
    session.flush()  # the new nodes and replicas
    changes.flush(session)  # the replicas told to stop, the pools' stamps
    by_node = fleet.on_node()
    budget = consolidation_budget(settings)
    drained = drained_node_ids(session, [n.id for n in fleet.nodes.values() if n.state == S.draining])
    releases: list[tuple[NodeRow, str]] = []
    maybe_consolidated: list[NodeRow] = []  # empty nodes whose consolidation record decides
    for node in list(fleet.nodes.values()):
        # holds_gpus, spares aside: a node that holds only spares is empty (they never keep one billed)
        held = [r for r in by_node.get(node.id, ()) if r.state not in ENDED and not r.spare]
        if node.state == S.draining:
            if reason := _drain_finished(node, node.id in drained, now):
                releases.append((node, reason))
            continue
        if held:
            changes.set(node, empty_since=None)
            used = sum(len(r.gpu_ids or ()) for r in held)
            is_under = node.state == S.ready and node.gpus_total > 0 and used / node.gpus_total < (
                budget.underused_fraction)
            if not is_under:
                changes.set(node, underused_since=None)
            elif node.underused_since is None:
                changes.set(node, underused_since=now)
            continue
        changes.set(node, underused_since=None)
        if node.empty_since is None:
            changes.set(node, empty_since=now)
        never_launched = node.state in (S.pending, S.provisioning) and node.instance_id is None
        if never_launched or (now - node.empty_since).total_seconds() >= settings.empty_node_ttl_s:
            releases.append((node, "empty: no replica placed here"))
        else:
            maybe_consolidated.append(node)
    if maybe_consolidated:
        load_node_metrics(session, maybe_consolidated)  # one statement for all of them
        releases += [(node, "empty: a consolidation moved its replicas away") for node in maybe_consolidated
                     if emptied_by_consolidation(node, now, settings)]
    releases = drain_spares_first(releases, by_node, fleet, now, settings, changes)
    # Released in the order the nodes were walked.
    order = {node_id: i for i, node_id in enumerate(fleet.nodes)}
    releases.sort(key=lambda item: order[item[0].id])
    ops = writes.release_nodes(session, changes, releases, fleet.replicas, now, settings)
    terminations += ops
    result.terminated += len(ops)

    # 5. consolidate
    if settings.consolidation_enabled:
        result.moves = consolidate(session, changes, fleet, offers, shapes, budget, scaling_up, now, settings, result,
                                   launch_ops, pool_needs=pool_needs, sized=sized)
    if spares_on:
        result.spares = fill_spares(session, changes, fleet, shapes, pool_needs, settings, now,
                                    released={node.id for node, _ in releases})
    session.flush()  # every new node (with its replicas) first: the launch operations reference them
    changes.flush(session)
    session.add_all(launch_ops)
    session.flush()
    # A terminate operation gets its id at the flush (begin_termination only adds it).
    result.operations += [(op.id, op.kind) for op in (*launch_ops, *terminations)]
    return result


def give_up_stranded_launches(session: Session, changes: RowWrites, fleet: Fleet, offers: Sequence[Offer],
                              now: dt.datetime, settings: Settings, terminations: list[Operation]) -> int:
    """A node not launched yet whose planned shape has no launchable zone left (every one blocked
    by capacity, quota or config errors) is given up, so that its replicas are placed again this
    tick on whatever offer placement finds next (another region, cloud or market), instead of
    waiting out the blocks on a shape that cannot launch. Its VM, if a launch in flight still
    makes one, is found by its tags and terminated."""
    launchable = {(o.cloud, o.region, o.instance_type, o.spot): set(o.zones) for o in offers}
    stranded: list[NodeRow] = []
    for node in list(fleet.nodes.values()):
        spec = node.launch_spec or {}
        if node.instance_id is not None or node.state not in (S.pending, S.provisioning) or not spec.get(
                "instance_type"):
            continue
        zones = launchable.get((spec.get("cloud"), spec.get("region"), spec["instance_type"], bool(spec.get("spot"))),
                               set())
        if not zones & set(spec.get("zones") or zones):
            stranded.append(node)
    if not stranded:
        return 0
    # Their launch operations end here, unless a launcher holds one right now (it then finds the
    # node terminating and stops); waiting for the next attempt would only hold the queue open.
    for op in session.scalars(claimable(Operation, now, Operation.idempotency_key.in_(
            [launch_key(n.id) for n in stranded]), Operation.state.in_(OPEN_STATES))):
        finish_operation(op, OperationState.failed, now, "cancelled: every zone of the planned shape is blocked; "
                                                        "its replicas were placed again")
    ops = writes.release_nodes(session, changes, [
        (node, "re-planned: every zone of its planned shape is blocked") for node in stranded],
        fleet.replicas, now, settings)
    terminations += ops
    return len(stranded)


def _nodes_with_replicas(fleet: Fleet):
    by_node = fleet.on_node()
    for node in fleet.nodes.values():
        if node.state in PLACEABLE_NODE_STATES:
            yield node, by_node.get(node.id, [])


def _first_pool(plan, key: str) -> uuid.UUID | None:
    return next((uuid.UUID(p.pool_id) for p in plan.placed if p.node_id == key), None)


def _launching_pools(fleet: Fleet) -> set[uuid.UUID]:
    """Pools with a replica on a node still being launched (the replicas of those nodes only)."""
    by_node = fleet.on_node()
    return {r.pool_id for node in fleet.nodes.values() if node.state in (S.pending, S.provisioning)
            for r in by_node.get(node.id, ())}


def _cheapest(offers: Sequence[Offer], need: PoolNeed, *, spot: bool, memo: dict | None = None) -> float | None:
    """The pool's cheapest price per replica-hour in a market: what the spot split compares. It
    depends on what ``fits_offer`` reads only, so pools alike share one answer through ``memo``."""
    key = (need.gpus_per_replica, need.gpu_memory_gb, need.gpu_types, need.placement, spot)
    if memo is not None and key in memo:
        return memo[key]
    prices = [o.price_per_gpu_hour * need.gpus_per_replica for o in offers
              if o.spot == spot and o.zones and fits_offer(need, o)]
    found = min(prices) if prices else None
    if memo is not None:
        memo[key] = found
    return found


def _drain_finished(node: NodeRow, drained: bool, now: dt.datetime) -> str | None:
    """A node drained as a whole (admin drain, SIGTERM) goes once its agent reported every replica
    stopped, or at its drain deadline for an agent that never reports."""
    if drained:
        return "drained: the agent reported every replica stopped"
    if node.drain_deadline_at is not None and node.drain_deadline_at <= now:
        return "drain deadline passed"
    return None


# ---------------------------------------------------------------- moves and drains in flight
def finish_moves_and_drains(session: Session, changes: RowWrites, fleet: Fleet, by_id: dict[uuid.UUID, ReplicaRow],
                            now: dt.datetime, settings: Settings) -> None:
    for r in list(fleet.replicas):
        if r.desired_state == STOP:
            node = fleet.nodes[r.node_id]
            # Nothing can run on a node that never got a VM; elsewhere the agent confirms the stop,
            # or its deadline writes the replica off (a dead agent's node is swept separately).
            if node.instance_id is None and node.state in (S.pending, S.provisioning) and node.agent_url is None:
                changes.set(r, state=R.stopped)
            elif r.drain_deadline_at is not None and r.drain_deadline_at <= now:
                changes.set(r, state=R.stopped)
            continue
        if r.replaces_id is None:
            if r.state in (R.pending, R.starting) and _age(r, now) > settings.replica_start_deadline_s:
                writes.stop_replica(r, fleet.nodes, now, settings, reason="not ready by its start deadline",
                                    changes=changes)
            continue
        original = by_id.get(r.replaces_id)
        if original is None or original.desired_state != RUN:
            continue  # the move is over (the original is retiring or gone)
        if r.state == R.ready:
            writes.stop_replica(original, fleet.nodes, now, settings, reason=f"moved to replica {r.id}",
                                changes=changes)
        elif r.state == R.failed or _age(r, now) > settings.replica_start_deadline_s:
            # Roll back: the original never stopped serving; the copy goes.
            writes.stop_replica(r, fleet.nodes, now, settings, reason="move rolled back: the copy never became ready",
                                changes=changes)


def _age(r: ReplicaRow, now: dt.datetime) -> float:
    return (now - r.created_at).total_seconds() if r.created_at else 0.0


# ---------------------------------------------------------------- consolidation
def emptied_by_consolidation(node: NodeRow, now: dt.datetime, settings: Settings) -> bool:
    """Whether an empty node is empty because a consolidation moved its replicas away: it was
    emptied on purpose (its replicas serve elsewhere, and placement puts nothing on a node being
    emptied), so it goes at once instead of waiting out the empty-node TTL, which is there for
    nodes a scale-down happened to empty. A consolidation begun longer ago than a move and its
    drain can take (start deadline + drain timeout) no longer counts: the node has lived since.
    Reads the node's metrics (not read with the fleet: ``reads.load_node_metrics``), so call it
    for empty nodes only."""
    record = (node.metrics or {}).get("consolidation") or {}
    try:
        began = dt.datetime.fromisoformat(record["at"])
    except (KeyError, TypeError, ValueError):
        return False
    if began.tzinfo is None:
        began = began.replace(tzinfo=dt.UTC)
    window = settings.replica_start_deadline_s + settings.drain_timeout_s
    return node.empty_since is not None and began <= node.empty_since and (now - began).total_seconds() <= window


def consolidation_budget(settings: Settings) -> ConsolidationBudget:
    return ConsolidationBudget(
        settle_s=settings.consolidation_settle_s, max_moves_per_pool=settings.consolidation_moves_per_pool,
        max_nodes_in_flight=settings.consolidation_nodes_in_flight, min_score=settings.consolidation_min_score,
        underused_fraction=settings.consolidation_underused_fraction,
        max_slower_dip=settings.consolidation_max_slower_dip,
    )


def consolidation_slots(fleet: Fleet, shapes: placement_catalog.Shapes, in_flight: set[uuid.UUID],
                        sized: tuple[dict[uuid.UUID, NodeSlots], set[uuid.UUID], int] | None = None,
                        touched: set[uuid.UUID] = frozenset()) -> list[NodeSlots]:
    """Every placeable node's slots as consolidation reads them, after placement and the node
    step. ``sized``: the slots sizing built this tick, the move ends they saw, and how many
    replicas the fleet held then; those of a node nothing changed on since are taken as they
    are. A node changed if its row or one of its replicas' rows was changed (``touched``, from
    ``RowWrites``), if it got a replica since (the replicas past that count), or if a replica on it
    became or stopped being a move's end. Equal to building every node's slots afresh."""
    by_node = fleet.on_node()
    before, dirty = {}, set()
    if sized is not None:
        before, flight_before, count = sized
        by_id = fleet.by_id
        dirty = {r.node_id for r in fleet.replicas[count:]}
        for row_id in touched | (in_flight ^ flight_before):
            if row_id in fleet.nodes:
                dirty.add(row_id)
            elif (r := by_id.get(row_id)) is not None:
                dirty.add(r.node_id)
    slots = []
    for n in fleet.nodes.values():
        if n.state in PLACEABLE_NODE_STATES:
            s = before.get(n.id) if n.id not in dirty else None
            slots.append(s if s is not None else node_slots(n, by_node.get(n.id, []), shapes, in_flight))
    return slots


def consolidate(session: Session, changes: RowWrites, fleet: Fleet, offers: Sequence[Offer],
                shapes: placement_catalog.Shapes, budget: ConsolidationBudget, scaling_up: set[str],
                now: dt.datetime, settings: Settings, result: TickResult, launch_ops: list[Operation], *,
                pool_needs: dict[uuid.UUID, PoolNeed] | None = None,
                sized: tuple[dict[uuid.UUID, NodeSlots], set[uuid.UUID], int] | None = None) -> int:
    # Moves under way: a copy whose original still serves. A copy that took over long ago is just a
    # replica; counting it would hold its pool's move budget forever.
    by_id = fleet.by_id
    in_flight = move_ends(fleet.replicas, by_id)
    moves_in_flight: dict[str, int] = defaultdict(int)
    source_nodes: set[uuid.UUID] = set()
    for copy, original in moves_under_way(fleet.replicas, by_id, in_flight):
        moves_in_flight[str(copy.pool_id)] += 1
        source_nodes.add(original.node_id)
    slots = consolidation_slots(fleet, shapes, in_flight, sized, changes.touched)
    pool_needs = pool_needs or {}
    pools = {str(p.id): pool_needs.get(p.id) or pool_need(p) for p in fleet.pools.values()}
    paused = {str(p.id) for p in fleet.pools.values() if p.paused}
    actions = plan_consolidation(slots, pools, offers, now.timestamp(), budget,
                                 scaling_up=frozenset(scaling_up | paused), moves_in_flight=moves_in_flight,
                                 nodes_in_flight=len(source_nodes))
    if actions:
        # Each action's node gets a consolidation record next to its metrics: read them all at once.
        load_node_metrics(session, [fleet.nodes[uuid.UUID(a.node_id)] for a in actions])
    started = 0
    for action in actions:
        target_nodes: dict[str, NodeRow] = {}
        if action.new_node is not None:
            node, op = writes.add_node(session, action.new_node, now, settings, pool_id=None,
                                       reason=action.reason)
            target_nodes[action.new_node.key] = node
            fleet.nodes[node.id] = node
            launch_ops.append(op)
            result.launched += 1
        for move in action.moves:
            original = by_id[uuid.UUID(move.replica_id)]
            node = target_nodes.get(move.to_node) or fleet.nodes[uuid.UUID(move.to_node)]
            result.evicted += evict_spares(fleet, node, move.gpu_ids, now, settings, changes,
                                           reason=f"evicted: its GPUs were taken by a move of replica {original.id}")
            copy = writes.add_replica(session, fleet.pools[original.pool_id], node, move.gpu_ids, now,
                                      replaces=original)
            fleet.add_replica(copy)
            started += 1
        source = fleet.nodes[uuid.UUID(action.node_id)]
        # Its spares drain while the copies load: by the time the originals stop, the node is empty
        # and goes at once (a node waiting on spares would still look free to the next moves).
        for spare in [r for r in fleet.on_node().get(source.id, ()) if r.spare and r.desired_state == RUN]:
            writes.stop_replica(spare, fleet.nodes, now, settings, reason="its node is being emptied by a consolidation",
                                changes=changes)
        writes.record_consolidation(session, changes, source, action, fleet.pools, now)
    return started


# ---------------------------------------------------------------- spares
def swap_spares(fleet: Fleet, changes: RowWrites, slots: dict[uuid.UUID, NodeSlots],
                spare_rows: dict[uuid.UUID, list[ReplicaRow]], pool_needs: dict[uuid.UUID, PoolNeed],
                placed_on: set[str], in_flight: set[uuid.UUID]) -> int:
    """Empty nodes by promotion (``spares.plan_swaps``): a ready spare takes over from a regular
    replica of its pool, which stays on as a spare; a node left with only spares is empty and
    goes after the empty-node TTL, its spares draining first. Not on a node that got a replica
    this tick (``slots`` does not show it yet)."""
    spares_on: dict[str, list[tuple[str, str, bool]]] = defaultdict(list)
    for pool_id, rows in spare_rows.items():
        for r in rows:
            if r.desired_state == RUN and r.state not in ENDED:  # not evicted this tick
                spares_on[str(r.node_id)].append((r.key, str(pool_id), r.state == R.ready))
    if not spares_on:
        return 0
    by_id = fleet.by_id
    # the sources of the moves under way: a consolidation is emptying them
    leaving = {str(original.node_id) for _, original in moves_under_way(fleet.replicas, by_id, in_flight)}
    nodes = [n for node_id, n in slots.items() if str(node_id) not in placed_on]
    swaps = spares.plan_swaps(nodes, spares_on, {str(p): need for p, need in pool_needs.items()}, leaving)
    for swap in swaps:
        promoted, demoted = by_id[uuid.UUID(swap.spare_id)], by_id[uuid.UUID(swap.regular_id)]
        changes.set(promoted, spare=False)
        changes.set(demoted, spare=True)
        spare_rows[promoted.pool_id].remove(promoted)
        spare_rows[demoted.pool_id].append(demoted)
    return len(swaps)


def drain_spares_first(releases: list[tuple[NodeRow, str]], by_node: dict[uuid.UUID, list[ReplicaRow]],
                       fleet: Fleet, now: dt.datetime, settings: Settings,
                       changes: RowWrites) -> list[tuple[NodeRow, str]]:
    """An empty node that still holds spares is not released under them: they serve traffic
    (the edge routes to them until its next snapshot), so they drain like any replica told to
    stop, and the node goes at a later tick, once they have. A node drained as a whole has
    drained them already."""
    kept = []
    for node, reason in releases:
        spares_left = [r for r in by_node.get(node.id, ()) if r.spare and r.state not in ENDED]
        if node.state == S.draining or not spares_left:
            kept.append((node, reason))
            continue
        for r in spares_left:
            writes.stop_replica(r, fleet.nodes, now, settings, reason=f"its node is released ({reason})",
                                changes=changes)
    return kept


def evict_spares(fleet: Fleet, node: NodeRow, gpu_ids: Sequence[int], now: dt.datetime, settings: Settings,
                 changes: RowWrites, *, reason: str) -> int:
    """Stop the spares on ``node`` that hold any of ``gpu_ids``: a replica was just placed there.
    The agent starts the new engine once the spare's engine has let its GPUs go."""
    on_node = [r for r in fleet.on_node().get(node.id, ()) if r.spare and r.state not in ENDED
               and r.desired_state == RUN]
    victims = spares.overlapping(gpu_ids, [(r.key, r.gpu_ids or ()) for r in on_node])
    by_key = {r.key: r for r in on_node}
    for key in victims:
        writes.stop_replica(by_key[key], fleet.nodes, now, settings, reason=reason, changes=changes)
    return len(victims)


def fill_spares(session: Session, changes: RowWrites, fleet: Fleet, shapes: placement_catalog.Shapes,
                pool_needs: dict[uuid.UUID, PoolNeed], settings: Settings, now: dt.datetime, *,
                released: set[uuid.UUID]) -> int:
    """Start spares on the free GPU slots of ready nodes that stay billed for replicas of their
    own (``spares.plan_spares``). Not on a node being emptied by a consolidation (its slots
    are about to go), nor for paused pools or those without spares (``spares.has_spares``)."""
    by_node = fleet.on_node()
    by_id = fleet.by_id
    in_flight = move_ends(fleet.replicas, by_id)
    emptying = {original.node_id for _, original in moves_under_way(fleet.replicas, by_id, in_flight)}
    eligible = {str(p.id): pool_needs[p.id] for p in fleet.pools.values()
                if p.id in pool_needs and not p.paused and spares.has_spares(True, p.dedicated_tenant_id)}
    serving: dict[str, float] = defaultdict(float)
    spare_tps: dict[str, float] = defaultdict(float)
    nodes: list[NodeSlots] = []
    for node in fleet.nodes.values():
        if node.state not in PLACEABLE_NODE_STATES or node.id in released:
            continue
        rows = [r for r in by_node.get(node.id, ()) if r.state not in ENDED]
        slots = node_slots(node, rows, shapes, in_flight, with_spares=True)
        for r in rows:
            if r.desired_state != RUN or r.pool_key not in eligible:
                continue
            tps = tokens_per_s(eligible[r.pool_key], slots.gpu_type)
            if r.spare:
                spare_tps[r.pool_key] += tps
            elif r.replaces_id is None or counts_for_pool(r, by_id):
                serving[r.pool_key] += tps
        anchored = any(not r.spare and r.desired_state == RUN for r in rows)
        if node.state == S.ready and anchored and node.id not in emptying and slots.free_gpus:
            nodes.append(slots)
    planned = spares.plan_spares(nodes, eligible, serving, spare_tps, max_ratio=settings.spare_max_ratio)
    for spare in planned:
        node = fleet.nodes[uuid.UUID(spare.node_id)]
        fleet.add_replica(writes.add_replica(session, fleet.pools[uuid.UUID(spare.pool_id)], node, spare.gpu_ids,
                                             now, spare=True))
    return len(planned)
