"""The fleet simulation: nodes, replicas, billing, and the contenders that drive them.

Time advances in steps of ``DT`` (10 s) from ``-WARMUP_S`` (an hour of the previous evening, not
accounted, so the day does not start from an empty fleet) to the end of the day. Each step:

1. the fleet advances: booted nodes become ready, loaded replicas become ready, a move's copy
   that is ready retires its original, stopped replicas free their GPUs after ``DRAIN_S``;
2. the contender decides (autoscaler and placement, or SkyServe's rule) from what the pools
   reported in the previous steps;
3. every pool's arrivals of [t, t + DT) are served by its ready replicas (``fluid.PoolQueue``).

A new VM takes ``BOOT_S`` (120 s) to boot; a replica then takes its model-ready time on that GPU
type (``dataplane.sim.timing.model_ready_seconds``: download, load, warm-up: 26-152 s here). A
replica placed into free slots of a ready node only loads its model, and skips the download
where the node's artifact cache already holds the checkpoint (an earlier replica of the variant
fetched it there: ``dataplane.agent.artifacts``). VMs are billed per second from launch to release.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

import numpy as np

from bench.autoscale.engine import ReplicaProfile
from bench.autoscale.simulate import follow_target
from bench.autoscale.trace import poisson_trace
from bench.fleet.fluid import PoolQueue
from bench.fleet.models import Variant
from bench.fleet.profiles import MIX, Capacity
from controlplane.autoscaler.baselines import SkyServeConfig, SkyServeState, skyserve_decide
from controlplane.autoscaler.config import AutoscalerConfig
from controlplane.autoscaler.policy import decide
from controlplane.autoscaler.signals import AutoscalerState, PoolObservation, PoolSpec, ReplicaSignal
from controlplane.config import Settings
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
from controlplane.fleet.placement import choose_surplus, plan_placement, tokens_per_s
from controlplane.fleet.spares import (
    has_spares,
    keep_as_spare,
    overlapping,
    plan_spares,
    plan_swaps,
    promote,
    scale_down_keeps_warm,
)
from dataplane.sim import timing

DT = 10.0
WARMUP_S = 3600.0
BOOT_S = 120.0
DRAIN_S = 20.0  # a stopped replica finishes its in-flight requests, then frees its GPUs
EMPTY_NODE_TTL_S = Settings.model_fields["empty_node_ttl_s"].default
# reconcile.emptied_by_consolidation: a node a consolidation emptied is released at once (False: the
# behaviour before it, for comparisons)
RELEASE_CONSOLIDATED = True
SPARE_MAX_RATIO = Settings.model_fields["spare_max_ratio"].default
MAX_RUNNING = 128  # bench.autoscale.engine.ReplicaProfile.max_running_requests
# Tokens per request of the mix (prompt + output): the token-rate history and the KV gauge.
MEAN_TOKENS = poisson_trace(MIX, 50.0, 2000.0, 7).mean_tokens()


# ---------------------------------------------------------------- fleet state and billing
@dataclass(eq=False)
class Node:
    node_id: str
    offer: Offer
    zone: str
    launched_at: float
    ready_at: float
    released_at: float | None = None
    empty_since: float | None = None
    underused_since: float | None = None
    consolidated_at: float | None = None  # when a consolidation began emptying it
    replicas: dict[str, Replica] = field(default_factory=dict)
    # the agent's node-local artifact cache: checkpoint -> when its download completes there
    # (dataplane.agent.artifacts; nothing is evicted: the GPU shapes' local disks hold every model here)
    weights: dict[str, float] = field(default_factory=dict)

    def used_gpus(self) -> int:
        return sum(len(r.gpu_ids) for r in self.replicas.values())


@dataclass(eq=False)
class Replica:
    replica_id: str
    pool_id: str
    node: Node
    gpu_ids: tuple[int, ...]
    cap: Capacity
    copies: int  # data-parallel copies serving behind it (SkyServe-style VMs); 1 for Nimbus
    placed_at: float
    ready_at: float
    state: str = "starting"  # starting | ready | stopping | ended
    replaces: str | None = None  # a move's copy, while its original still serves
    moving: bool = False  # the original of a move in flight
    move_copy: bool = False  # placed as a move's copy (kept after the move is over: the accounting)
    spare: bool = False  # above its pool's target on GPUs billed anyway (controlplane.fleet.spares)
    stop_at: float | None = None
    stopped_at: float | None = None  # when it was told to stop

    @property
    def gpu_type(self) -> str:
        return self.node.offer.gpu_type


@dataclass(frozen=True)
class Checkpoint:
    """A variant's weights as the agent's artifact cache keys and fetches them."""

    key: str
    download_s: float  # at the calibration's download speed (part of ``Capacity.model_ready_s``)


@cache
def checkpoint_of(v: Variant) -> Checkpoint:
    size = timing.weight_bytes(timing.get_model(v.model), v.quantization)
    return Checkpoint(f"{v.model}:{v.quantization or 'bf16'}", size * 8 / (ReplicaProfile.download_gbps * 1e9))


@dataclass
class Totals:
    cost: float = 0.0
    billed_gpu_s: float = 0.0
    allocated_gpu_s: float = 0.0
    nodes_launched: int = 0
    replicas_placed: int = 0
    migrations: int = 0
    consolidation_actions: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    spares_placed: int = 0  # controlplane.fleet.spares: started on free slots
    spares_promoted: int = 0  # became regular replicas on a scale-up
    spares_demoted: int = 0  # a scale-down's surplus kept as spares
    spares_evicted: int = 0  # stopped for a replica placed on their GPUs
    spares_swapped: int = 0  # took over from a regular replica whose node then went (plan_swaps)
    unplaced: int = 0
    peak_nodes: int = 0
    peak_gpus: int = 0
    tick_s: list[float] = field(default_factory=list)
    cost_by_shape: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    gpu_s_by_pool_type: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    # $ of the GPUs replicas held, by phase: loading (placed -> ready), serving, draining
    held_cost: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    pool_cost: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # GPUs held, $ per pool
    # GPU-seconds no replica holds, by node fill ("<GPUs held>/<GPUs>", "empty/<GPUs>")
    idle_gpu_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    # $ of the GPUs no replica holds, by why: "empty" (waiting out the empty-node TTL), "empty-consolidated"
    # (the same, for a node a consolidation emptied), "booting" (a node not ready yet), "emptying" (a
    # consolidation source), "partial" (the rest); "floor" (not a part of the sum): the share of all of
    # it that no packing of the same replicas on the same shapes avoids
    idle_cost: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    idle_gpu_s_by_cause: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # the same in GPU-s
    # $ replicas held above what the same capacity (req/s × time) costs on the pool's cheapest GPU
    # type per req/s (price per GPU of the cheapest offer of each type): the GPU-type choice
    type_premium: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    # ready capacity (req/s × s) and requests per pool: ready capacity over demand = the headroom
    ready_qps_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))


class Fleet:
    def __init__(self, start: float, end: float):
        self.start, self.end = start, end
        self.nodes: dict[str, Node] = {}
        self.replicas: dict[str, Replica] = {}
        self.by_pool: dict[str, dict[str, Replica]] = defaultdict(dict)
        self.totals = Totals()
        self.ready_samples: dict[str, list[float]] = defaultdict(list)
        self.cold_starts: dict[str, list[float]] = defaultdict(list)  # placed -> ready, replicas ready in the day
        self.best_per_qps: dict[str, float] = {}  # pool -> cheapest $/h per req/s of capacity (set by the contender)
        self.checkpoints: dict[str, Checkpoint] = {}  # pool -> its weights (set by the contender)
        self._ids = 0

    def _id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}{self._ids:06d}"

    def _window(self, a: float, b: float) -> float:
        return max(0.0, min(b, self.end) - max(a, self.start))

    def launch(self, offer: Offer, zone: str | None, t: float) -> Node:
        node = Node(self._id("n"), offer, zone or (offer.zones[0] if offer.zones else ""), t, t + BOOT_S)
        self.nodes[node.node_id] = node
        if t >= self.start:
            self.totals.nodes_launched += 1
        return node

    def place(self, pool_id: str, node: Node, gpu_ids: tuple[int, ...], cap: Capacity, t: float, *,
              copies: int = 1, replaces: str | None = None) -> Replica:
        r = Replica(self._id("r"), pool_id, node, tuple(gpu_ids), cap, copies, t, self.ready_time(pool_id, node, cap, t),
                    replaces=replaces, move_copy=replaces is not None)
        assert not set(r.gpu_ids) & {g for x in node.replicas.values() for g in x.gpu_ids}, "GPU handed out twice"
        assert max(r.gpu_ids) < node.offer.gpu_count
        node.replicas[r.replica_id] = r
        node.empty_since = None
        node.consolidated_at = None  # a node that takes a replica again is not on its way out
        self.replicas[r.replica_id] = r
        self.by_pool[pool_id][r.replica_id] = r
        if t >= self.start:
            self.totals.replicas_placed += 1
        return r

    def ready_time(self, pool_id: str, node: Node, cap: Capacity, t: float) -> float:
        """When a replica placed at ``t`` is ready: after the VM boots, the checkpoint's download
        (skipped where the node's cache holds it, shared with a download of it in progress, as the
        agent's fetch is), then loading and warm-up."""
        begin = max(t, node.ready_at)
        ckpt = self.checkpoints.get(pool_id)
        if ckpt is None:
            return begin + cap.model_ready_s
        on_disk = node.weights.get(ckpt.key)
        if on_disk is None:
            on_disk = node.weights[ckpt.key] = begin + ckpt.download_s
        return max(begin, on_disk) + cap.model_ready_s - ckpt.download_s

    def stop(self, r: Replica, t: float) -> None:
        if r.state == "starting":
            self._end(r, t)
        elif r.state == "ready":
            r.state = "stopping"
            r.stop_at = t + DRAIN_S
            r.stopped_at = t
        for c in list(self.by_pool[r.pool_id].values()):
            if c.replaces == r.replica_id:  # a copy of a replica that stops is not wanted either
                self._end(c, t)

    def evict(self, node: Node, gpu_ids: Sequence[int], t: float) -> float:
        """Stop the spares on ``node`` that hold any of ``gpu_ids`` (a replica is placed there);
        returns how long the new replica waits for them to let the GPUs go: a ready spare drains
        first (``DRAIN_S``), as the agent waits for its engine to exit."""
        spares = [(r.replica_id, r.gpu_ids) for r in node.replicas.values() if r.spare]
        wait = 0.0
        for rid in overlapping(gpu_ids, spares):
            r = self.replicas[rid]
            if r.state == "ready":
                wait = DRAIN_S
            self._end(r, t)
            if t >= self.start:
                self.totals.spares_evicted += 1
        return wait

    def _end(self, r: Replica, at: float) -> None:
        held = self._window(r.placed_at, at) * len(r.gpu_ids)
        self.totals.allocated_gpu_s += held
        self.totals.gpu_s_by_pool_type[f"{r.pool_id}@{r.gpu_type}"] += held
        per_gpu_s = r.node.offer.price_per_gpu_hour / 3600 * len(r.gpu_ids)
        ready = min(r.ready_at, at)
        stopped = at if r.stopped_at is None else min(r.stopped_at, at)
        for phase, a, b in (("loading", r.placed_at, ready), ("serving", ready, stopped), ("draining", stopped, at)):
            self.totals.held_cost[phase] += self._window(a, b) * per_gpu_s
            # the same split for consolidation moves: a copy loading, an original draining after its move
            if (phase == "loading" and r.move_copy) or (phase == "draining" and r.moving):
                self.totals.held_cost[f"{phase}-move"] += self._window(a, b) * per_gpu_s
        self.totals.pool_cost[r.pool_id] += held / len(r.gpu_ids) * per_gpu_s
        best = self.best_per_qps.get(r.pool_id)
        if best is not None:
            served = self._window(r.placed_at, at)
            self.totals.type_premium[r.pool_id] += served * (per_gpu_s - best * r.copies * r.cap.qps / 3600)
        r.state = "ended"
        del r.node.replicas[r.replica_id]
        del self.replicas[r.replica_id]
        del self.by_pool[r.pool_id][r.replica_id]
        if r.replaces is None:
            for other in self.by_pool[r.pool_id].values():
                if other.replaces == r.replica_id:
                    other.replaces = None

    def release(self, node: Node, t: float) -> None:
        for r in list(node.replicas.values()):
            self._end(r, t)
        span = self._window(node.launched_at, t)
        self.totals.cost += span * node.offer.price_per_hour / 3600
        o = node.offer
        self.totals.cost_by_shape[f"{o.cloud}/{o.region}/{o.instance_type}"] += span * o.price_per_hour / 3600
        self.totals.billed_gpu_s += span * node.offer.gpu_count
        node.released_at = t
        del self.nodes[node.node_id]

    def advance(self, t: float) -> list[Replica]:
        """Readiness, moves and drains up to ``t``; returns the replicas whose stop completed."""
        ended = []
        for r in list(self.replicas.values()):
            if r.state == "starting" and r.ready_at <= t:
                r.state = "ready"
                self.ready_samples[r.pool_id].append(r.ready_at - r.placed_at)
                if r.ready_at >= self.start:
                    self.cold_starts[r.pool_id].append(r.ready_at - r.placed_at)
        for r in list(self.replicas.values()):
            if r.state == "ready" and r.replaces is not None:
                original = self.replicas.get(r.replaces)
                r.replaces = None
                if original is not None:
                    self.stop(original, t)
        for r in list(self.replicas.values()):
            if r.state == "stopping" and r.stop_at is not None and r.stop_at <= t:
                self._end(r, r.stop_at)
                ended.append(r)
        return ended

    def sample(self, t: float, dt: float) -> None:
        """Per-step gauges of the fleet as it stands (after the contender's decisions)."""
        if t < self.start:
            return
        gpus = 0
        by_offer: dict[int, list] = {}
        for n in self.nodes.values():
            total = n.offer.gpu_count
            gpus += total
            used = n.used_gpus()
            entry = by_offer.setdefault(id(n.offer), [n.offer, 0])
            entry[1] += used
            if used < total:
                self.totals.idle_gpu_s[f"{used if n.replicas else 'empty'}/{total}"] += (total - used) * dt
                if not n.replicas:
                    why = "empty" if n.consolidated_at is None else "empty-consolidated"
                else:
                    why = ("booting" if n.ready_at > t else "emptying" if any(r.moving for r in n.replicas.values())
                           else "partial")
                self.totals.idle_cost[why] += (total - used) * dt * n.offer.price_per_gpu_hour / 3600
                self.totals.idle_gpu_s_by_cause[why] += (total - used) * dt
        # the floor no packing of these replicas on these shapes avoids: per shape, whole nodes for its GPUs held
        for o, used in by_offer.values():
            self.totals.idle_cost["floor"] += (-used % o.gpu_count) * dt * o.price_per_gpu_hour / 3600
            self.totals.idle_gpu_s_by_cause["floor"] += (-used % o.gpu_count) * dt
        self.totals.peak_nodes = max(self.totals.peak_nodes, len(self.nodes))
        self.totals.peak_gpus = max(self.totals.peak_gpus, gpus)

    def close(self) -> None:
        for node in list(self.nodes.values()):
            self.release(node, self.end)


# ---------------------------------------------------------------- pools as the contenders see them
@dataclass
class PoolRun:
    variant: Variant
    caps: Mapping[str, Capacity]  # GPU type -> capacity
    arrivals: np.ndarray
    queue: PoolQueue
    request_history: list[tuple[float, float]] = field(default_factory=list)
    token_history: list[tuple[float, float]] = field(default_factory=list)
    last_request_at: float | None = None
    utilization: float = 0.0
    state: object = None
    target: int = 0

    @property
    def pool_id(self) -> str:
        return self.variant.pool_id

    def need(self, missing_on_demand: int = 0, replica_tokens_per_s: float | None = None) -> PoolNeed:
        v = self.variant
        return PoolNeed(pool_id=v.pool_id, gpus_per_replica=v.gpus, gpu_memory_gb=v.gpu_memory_gb,
                        gpu_types=tuple(self.caps), missing_on_demand=missing_on_demand,
                        tokens_per_s={g: c.tokens_per_s for g, c in self.caps.items()},
                        replica_tokens_per_s=replica_tokens_per_s, model_path=checkpoint_of(v).key)


@dataclass
class Outcome:
    name: str
    totals: Totals
    requests: int
    within: float
    cold_waits: int
    dropped: float
    per_pool: dict[str, dict]


class Contender:
    name = "?"

    def __init__(self, pools: Sequence[PoolRun], offers: Sequence[Offer], start: float, end: float):
        self.pools = {p.pool_id: p for p in pools}
        self.offers = list(offers)
        self.fleet = Fleet(0.0, end)
        self.start, self.end = start, end
        for p in pools:  # its checkpoint; the GPU-type premium's reference: the cheapest $/h per req/s
            self.fleet.checkpoints[p.pool_id] = checkpoint_of(p.variant)
            per_qps = [o.price_per_gpu_hour * p.variant.gpus / c.qps for g, c in p.caps.items()
                       for o in self.offers if o.gpu_type == g and not o.spot and o.zones
                       and o.gpu_count >= p.variant.gpus]
            if per_qps:
                self.fleet.best_per_qps[p.pool_id] = min(per_qps)

    # -- gauges
    def signals(self, pool: PoolRun, t: float) -> tuple[ReplicaSignal, ...]:
        # as ``controlplane.fleet.autoscaling.observe`` reads a pool: a spare once it serves
        reps = [r for r in self.fleet.by_pool[pool.pool_id].values()
                if r.replaces is None and (not r.spare or r.state == "ready")]
        ready = [r for r in reps if r.state == "ready"]
        rate = sum(r.copies * r.cap.qps for r in ready)
        p95 = pool.queue.ttft_p95(t)
        out = []
        for r in reps:
            running = queued = 0
            kv = 0.0
            if r.state == "ready":
                share = r.copies * r.cap.qps / rate if rate else 0.0
                running = round(min(MAX_RUNNING, r.cap.at(r.cap.in_flight, pool.utilization, 0.0)) * r.copies)
                queued = round(pool.queue.backlog * share)
                kv = min(1.0, running / r.copies * MEAN_TOKENS / r.cap.kv_capacity_tokens)
            out.append(ReplicaSignal(
                replica_id=r.replica_id, node_id=r.node.node_id,
                state={"starting": "starting", "ready": "ready", "stopping": "draining"}[r.state], spot=False,
                num_queue_reqs=queued, num_running_reqs=running, max_running_requests=MAX_RUNNING * r.copies,
                kv_usage=kv, ttft_p95_s=p95 if r.state == "ready" else None, started_at=r.placed_at,
                ready_at=r.ready_at if r.state != "starting" else None, gpus=len(r.gpu_ids), spare=r.spare,
            ))
        return tuple(out)

    def observation(self, pool: PoolRun, t: float) -> PoolObservation:
        ready_any = any(r.state == "ready" for r in self.fleet.by_pool[pool.pool_id].values())
        return PoolObservation(
            now=t, replicas=self.signals(pool, t), request_rate_history=pool.request_history,
            token_rate_history=pool.token_history,
            model_ready_seconds=tuple(self.fleet.ready_samples[pool.pool_id][-50:]),
            last_request_at=pool.last_request_at,
            activation_requested=pool.queue.backlog > 0 and not ready_any,
        )

    # -- serving
    def serve(self, t: float, step: int) -> None:
        for pool in self.pools.values():
            n = int(pool.arrivals[step])
            by_type: dict[str, list] = {}
            for r in self.fleet.by_pool[pool.pool_id].values():
                if r.state == "ready" and r.replaces is None:
                    entry = by_type.setdefault(r.gpu_type, [0, r.cap])
                    entry[0] += r.copies
            res = pool.queue.step(t, DT, n, [(k, c) for k, c in by_type.values()])
            if t >= self.fleet.start:
                self.fleet.totals.ready_qps_s[pool.pool_id] += DT * sum(k * c.qps for k, c in by_type.values())
            pool.utilization = res.utilization
            if n:
                pool.last_request_at = t + DT
            pool.request_history.append((t + DT, n / DT))
            pool.token_history.append((t + DT, n * MEAN_TOKENS / DT))

    def decide(self, t: float) -> None:
        raise NotImplementedError

    def run(self, on_step: Callable[[float, int], None] | None = None) -> Outcome:
        """The day, step by step; ``on_step(t, k)`` sees the fleet after each step is served
        (``bench.fleet.diagnose`` traces it)."""
        steps = round((self.end - self.start) / DT)
        for k in range(steps):
            t = self.start + k * DT
            self.fleet.advance(t)
            self.decide(t)
            self.fleet.sample(t, DT)
            self.serve(t, k)
            if on_step is not None:
                on_step(t, k)
        for pool in self.pools.values():
            pool.queue.close()
        self.fleet.close()
        per_pool = {p.pool_id: {"requests": p.queue.requests, "within": p.queue.within,
                                "cold_waits": p.queue.cold_waits, "dropped": p.queue.dropped}
                    for p in self.pools.values()}
        return Outcome(self.name, self.fleet.totals, sum(p.queue.requests for p in self.pools.values()),
                       sum(p.queue.within for p in self.pools.values()),
                       sum(p.queue.cold_waits for p in self.pools.values()),
                       sum(p.queue.dropped for p in self.pools.values()), per_pool)


# ---------------------------------------------------------------- 1 and 2: Nimbus
class Nimbus(Contender):
    """Per pool ``controlplane.autoscaler.policy.decide``; then the fleet tick of
    ``controlplane.fleet.reconcile`` replayed on the simulated fleet: missing replicas placed by
    ``plan_placement``, surplus ones chosen by ``choose_surplus``, empty nodes released after
    the TTL, underused nodes timed and handed to ``plan_consolidation`` (when enabled)."""

    def __init__(self, pools, offers, start, end, *, consolidation: bool = True,
                 budget: ConsolidationBudget | None = None, config: AutoscalerConfig | None = None,
                 empty_node_ttl_s: float = EMPTY_NODE_TTL_S, spares: bool = True,
                 spare_max_ratio: float = SPARE_MAX_RATIO):
        super().__init__(pools, offers, start, end)
        self.consolidation = consolidation
        self.spares = spares  # controlplane.config.Settings.spare_replicas_enabled
        self.spare_max_ratio = spare_max_ratio
        self.name = ("nimbus" if consolidation else "nimbus-no-consol") + ("" if spares else "-no-spares")
        self.budget = budget or ConsolidationBudget()
        self.config = config or AutoscalerConfig()  # bench-only overrides measure the headroom's cost
        self.empty_node_ttl_s = empty_node_ttl_s
        for p in self.pools.values():
            p.state = AutoscalerState()

    def live(self, pool: PoolRun) -> list[Replica]:
        return [r for r in self.fleet.by_pool[pool.pool_id].values() if r.state != "ended" and not r.spare]

    def replica_tokens_per_s(self, pool: PoolRun, live: Sequence[Replica]) -> float | None:
        """What ``autoscaling.observe`` sizes the pool with: the profile on the GPU types it serves on."""
        types = serving_gpu_types({r.replica_id: r.gpu_type for r in live if r.replaces is None},
                                  [(r.replaces, r.gpu_type) for r in live if r.replaces is not None])
        return profiled_throughput({g: c.tokens_per_s for g, c in pool.caps.items()}, types)

    def spec(self, pool: PoolRun) -> PoolSpec:
        v = pool.variant
        live = self.live(pool)
        return PoolSpec(
            pool_id=v.pool_id, kind=v.kind, min_replicas=v.min_replicas, max_replicas=v.max_replicas,
            ttft_slo_s=v.slo_s, gpus_per_replica=v.gpus, replica_tokens_per_s=self.replica_tokens_per_s(pool, live),
            warm_surplus=has_spares(self.spares, None) and scale_down_keeps_warm(*self.alone(live)),
        )

    @staticmethod
    def alone(live: Sequence[Replica]) -> tuple[int, int]:
        """(ready replicas, those of them with no other wanted replica on their node, spares aside):
        what ``autoscaling._alone_on_their_node`` counts in production."""
        ready = [r for r in live if r.state == "ready"]
        return len(ready), sum(1 for r in ready if not any(
            x is not r and not x.spare and x.state in ("starting", "ready") for x in r.node.replicas.values()))

    def slots(self, node: Node, t: float, *, with_spares: bool = False) -> NodeSlots:
        """The node as ``reconcile.node_slots`` builds it: spares' slots free, but for the view
        that fills slots with spares."""
        hosted = tuple(
            HostedReplica(replica_id=r.replica_id, pool_id=r.pool_id, gpu_ids=r.gpu_ids, ready=r.state == "ready",
                          model_ready_s=r.cap.model_ready_s,
                          moving=r.moving or r.replaces is not None or r.state == "stopping")
            for r in node.replicas.values() if with_spares or not r.spare
        )
        o = node.offer
        return NodeSlots(
            node_id=node.node_id, cloud=o.cloud, region=o.region, zone=node.zone, instance_type=o.instance_type,
            gpu_type=o.gpu_type, gpus_total=o.gpu_count, spot=o.spot, dedicated_tenant_id=None,
            price_per_hour=o.price_per_hour, replicas=hosted, launched=True, ready=node.ready_at <= t,
            underused_since=node.underused_since, gpu_memory_gb=o.gpu_memory_gb,
            cached_models=frozenset(k for k, on_disk in node.weights.items() if on_disk <= t),
        )

    def autoscale(self, t: float) -> None:
        for pool in self.pools.values():
            decision, pool.state = decide(self.spec(pool), self.observation(pool, t), pool.state, self.config)
            pool.target = decision.target_replicas

    def decide(self, t: float) -> None:
        self.autoscale(t)
        self.fleet_tick(t)

    def fleet_tick(self, t: float) -> None:
        fleet = self.fleet
        # size every pool (on-demand only: the market mix is the whole target)
        slots = {nid: self.slots(n, t) for nid, n in fleet.nodes.items()}
        needs, scaling_up = [], set()
        regular = [r for r in fleet.replicas.values() if r.state in ("starting", "ready") and r.replaces is None
                   and not r.spare]
        staying: dict[str, set[str]] = defaultdict(set)  # each node's regular replicas that stay
        for r in regular:
            staying[r.node.node_id].add(r.replica_id)
        changed_on: set[str] = set()  # nodes where a replica became or stopped being a spare
        for pool in self.pools.values():
            ours = [r for r in fleet.by_pool[pool.pool_id].values()
                    if r.state in ("starting", "ready") and r.replaces is None and not r.spare]
            spare = [r for r in fleet.by_pool[pool.pool_id].values() if r.spare and r.state in ("starting", "ready")]
            if pool.target == 0 and spare:  # a pool at zero is off: its spares go too
                for r in spare:
                    fleet.stop(r, t)
                spare = []
            missing = pool.target - len(ours)
            if missing > 0 and spare:
                promoted = promote([(r.replica_id, False, r.state == "ready") for r in spare], 0, missing)
                for rid in promoted:
                    r = fleet.replicas[rid]
                    r.spare = False
                    staying[r.node.node_id].add(rid)
                    changed_on.add(r.node.node_id)
                    if t >= 0:
                        fleet.totals.spares_promoted += 1
                missing -= len(promoted)
            if missing > 0:
                needs.append(pool.need(missing, self.replica_tokens_per_s(pool, self.live(pool))))
                scaling_up.add(pool.pool_id)
            elif missing < 0:
                nodes = [slots[nid] for nid in sorted({r.node.node_id for r in ours})]
                for rid in choose_surplus(pool.pool_id, 0, -missing, nodes):
                    r = fleet.replicas[rid]
                    staying[r.node.node_id].discard(rid)
                    if has_spares(self.spares, None) and keep_as_spare(
                            r.state == "ready", bool(staying[r.node.node_id]), len(spare), pool.target,
                            self.spare_max_ratio):
                        r.spare = True
                        spare.append(r)
                        changed_on.add(r.node.node_id)
                        if t >= 0:
                            fleet.totals.spares_demoted += 1
                    else:
                        fleet.stop(r, t)
        for nid in changed_on:  # placement sees the spares' slots as they are now
            slots[nid] = self.slots(fleet.nodes[nid], t)
        if needs:
            plan = plan_placement(needs, list(slots.values()), self.offers)
            launched = {new.key: fleet.launch(new.offer, new.zones[0] if new.zones else None, t)
                        for new in plan.launches}
            for placed in plan.placed:
                node = launched.get(placed.node_id) or fleet.nodes[placed.node_id]
                self.place(placed.pool_id, node, placed.gpu_ids, t)
            if t >= 0:
                fleet.totals.unplaced += sum(n for _, n, _ in plan.unplaced)
        if has_spares(self.spares, None):
            self.swap_spares(t)
        # nodes: release the empty ones after the TTL (a node holding only spares is empty), time the
        # underused ones
        for node in list(fleet.nodes.values()):
            held = [r for r in node.replicas.values() if not r.spare]
            if held:
                node.empty_since = None
                used = sum(len(r.gpu_ids) for r in held)
                under = node.ready_at <= t and used / node.offer.gpu_count < self.budget.underused_fraction
                if not under:
                    node.underused_since = None
                elif node.underused_since is None:
                    node.underused_since = t
                continue
            node.underused_since = None
            if node.empty_since is None:
                node.empty_since = t
            # reconcile.emptied_by_consolidation: a node a consolidation emptied goes at once
            if t - node.empty_since >= self.empty_node_ttl_s or (RELEASE_CONSOLIDATED and
                                                                 node.consolidated_at is not None):
                if node.replicas:  # reconcile.drain_spares_first: its spares drain, the node goes after
                    for r in list(node.replicas.values()):
                        if r.state != "stopping":
                            fleet.stop(r, t)
                    continue
                fleet.release(node, t)
        if self.consolidation:
            self.consolidate(t, frozenset(scaling_up))
        if has_spares(self.spares, None):
            self.fill_spares(t)

    def place(self, pool_id: str, node: Node, gpu_ids: tuple[int, ...], t: float, *,
              replaces: str | None = None) -> Replica:
        """A replica placed (or a move's copy): the spares on its GPUs stop first, and it waits for them."""
        wait = self.fleet.evict(node, gpu_ids, t)
        r = self.fleet.place(pool_id, node, gpu_ids, self.pools[pool_id].caps[node.offer.gpu_type], t,
                             replaces=replaces)
        r.ready_at += wait
        return r

    def swap_spares(self, t: float) -> None:
        """``reconcile`` does the same with ``spares.plan_swaps``: nodes emptied by promotion."""
        fleet = self.fleet
        nodes = [self.slots(n, t) for n in fleet.nodes.values()]
        spares_on: dict[str, list[tuple[str, str, bool]]] = defaultdict(list)
        for r in fleet.replicas.values():
            if r.spare and r.state in ("starting", "ready"):
                spares_on[r.node.node_id].append((r.replica_id, r.pool_id, r.state == "ready"))
        if not spares_on:
            return
        leaving = {r.node.node_id for r in fleet.replicas.values() if r.moving and r.state != "ended"}
        for swap in plan_swaps(nodes, spares_on, {p.pool_id: p.need() for p in self.pools.values()}, leaving):
            fleet.replicas[swap.spare_id].spare = False
            fleet.replicas[swap.regular_id].spare = True
            if t >= 0:
                fleet.totals.spares_swapped += 1

    def fill_spares(self, t: float) -> None:
        """``reconcile.fill_spares``: spares on the free slots of ready nodes billed for replicas of
        their own and not being emptied (``spares.plan_spares``)."""
        fleet = self.fleet
        pools = {p.pool_id: p.need() for p in self.pools.values()}
        serving: dict[str, float] = defaultdict(float)
        spare: dict[str, float] = defaultdict(float)
        candidates = []
        for node in fleet.nodes.values():
            for r in node.replicas.values():
                if r.state not in ("starting", "ready"):
                    continue
                tps = tokens_per_s(pools[r.pool_id], node.offer.gpu_type)
                if r.spare:
                    spare[r.pool_id] += tps
                elif r.replaces is None:
                    serving[r.pool_id] += tps
            if (node.ready_at <= t and node.consolidated_at is None
                    and not any(r.moving or r.replaces is not None for r in node.replicas.values())
                    and any(not r.spare and r.state != "stopping" for r in node.replicas.values())):
                candidates.append(self.slots(node, t, with_spares=True))
        for s in plan_spares(candidates, pools, serving, spare, max_ratio=self.spare_max_ratio):
            node = fleet.nodes[s.node_id]
            r = fleet.place(s.pool_id, node, s.gpu_ids, self.pools[s.pool_id].caps[node.offer.gpu_type], t)
            r.spare = True
            if t >= 0:
                fleet.totals.spares_placed += 1

    def consolidate(self, t: float, scaling_up: frozenset[str]) -> None:
        fleet = self.fleet
        copies = [r for r in fleet.replicas.values() if r.replaces is not None]
        in_flight: dict[str, int] = defaultdict(int)
        sources = set()
        for c in copies:
            in_flight[c.pool_id] += 1
            if (orig := fleet.replicas.get(c.replaces)) is not None:
                sources.add(orig.node.node_id)
        slots = [self.slots(n, t) for n in fleet.nodes.values()]
        pools = {p.pool_id: p.need() for p in self.pools.values()}
        actions = plan_consolidation(slots, pools, self.offers, t, self.budget, scaling_up=scaling_up,
                                     moves_in_flight=in_flight, nodes_in_flight=len(sources))
        for action in actions:
            targets = {}
            if action.new_node is not None:
                nn = action.new_node
                targets[nn.key] = fleet.launch(nn.offer, nn.zones[0] if nn.zones else None, t)
            for move in action.moves:
                original = fleet.replicas[move.replica_id]
                node = targets.get(move.to_node) or fleet.nodes[move.to_node]
                self.place(move.pool_id, node, move.gpu_ids, t, replaces=original.replica_id)
                original.moving = True
                if t >= 0:
                    fleet.totals.migrations += 1
            source = fleet.nodes[action.node_id]
            source.consolidated_at = t
            for r in [r for r in source.replicas.values() if r.spare and r.state in ("starting", "ready")]:
                fleet.stop(r, t)  # reconcile.consolidate: a source's spares drain while the copies load
            if t >= 0:
                fleet.totals.consolidation_actions[action.kind] += 1


class OracleNimbus(Nimbus):
    """A diagnostic, not a contender: Nimbus's fleet layer (placement, surplus choice, TTL,
    consolidation) driven by an oracle instead of the autoscaler. Each pool's target is the
    replicas its demand needs over the next ``lookahead_s`` (the highest 60-s mean rate in that
    window, at the mean calibrated rate of its current replicas' GPU types, or its best type):
    what a perfect forecaster with no headroom would ask for. It separates what the fleet layer
    costs (fragmentation, GPU types, cold starts) from what the autoscaler's headroom costs."""

    def __init__(self, pools, offers, start, end, *, lookahead_s: float = 300.0,
                 budget: ConsolidationBudget | None = None, empty_node_ttl_s: float = EMPTY_NODE_TTL_S):
        super().__init__(pools, offers, start, end, consolidation=True, budget=budget,
                         empty_node_ttl_s=empty_node_ttl_s)
        self.name = "nimbus-oracle"
        self.rates = {}
        per = round(60.0 / DT)
        ahead = round(lookahead_s / DT)
        for p in self.pools.values():
            a = p.arrivals.astype(float) / DT
            smooth = np.convolve(a, np.ones(per) / per)[per - 1:]  # mean of [k, k + 60 s)
            padded = np.concatenate([smooth, np.zeros(ahead)])
            self.rates[p.pool_id] = np.array([padded[k:k + ahead].max() for k in range(len(a))])

    def autoscale(self, t: float) -> None:
        k = round((t - self.start) / DT)
        for pool in self.pools.values():
            rate = float(self.rates[pool.pool_id][min(k, len(self.rates[pool.pool_id]) - 1)])
            types = [r.gpu_type for r in self.fleet.by_pool[pool.pool_id].values()
                     if r.replaces is None and r.state != "ended" and not r.spare]
            qps = (sum(pool.caps[g].qps for g in types) / len(types) if types
                   else max(c.qps for c in pool.caps.values()))
            floor = 0 if pool.variant.tail else pool.variant.min_replicas
            pool.target = max(floor, math.ceil(rate / qps - 1e-9))


# ---------------------------------------------------------------- 3: SkyServe-style
def cheapest_shape(pool: PoolRun, offers: Sequence[Offer]) -> Offer:
    """SkyPilot's choice for a service's resources: the cheapest VM that fits one copy."""
    v = pool.variant
    fitting = [o for o in offers if not o.spot and o.zones and o.gpu_type in pool.caps and o.gpu_count >= v.gpus
               and o.gpu_memory_gb >= v.gpu_memory_gb]
    return min(fitting, key=lambda o: (o.price_per_hour, -o.gpu_count, o.cloud, o.region, o.instance_type))


class SkyServe(Contender):
    """One SkyServe service per model: each replica its own VM of the cheapest shape that fits one
    copy, filled with data-parallel copies (``gpu_count // gpus`` of them, all counted as
    capacity); the replica count from ``controlplane.autoscaler.baselines.skyserve_decide`` with
    the per-VM target QPS = copies × the calibrated per-copy QPS; targets applied by
    ``bench.autoscale.simulate.follow_target`` as in ``bench.autoscale``."""

    name = "skyserve"

    def __init__(self, pools, offers, start, end, *, qps_factor: float = 1.0):
        """``qps_factor`` < 1 plans each VM for that share of its calibrated QPS (headroom)."""
        super().__init__(pools, offers, start, end)
        if qps_factor != 1.0:
            self.name = f"skyserve-x{qps_factor:g}"
        self.shape = {}
        self.copies = {}
        self.configs = {}
        for p in self.pools.values():
            shape = cheapest_shape(p, self.offers)
            self.shape[p.pool_id] = shape
            self.copies[p.pool_id] = shape.gpu_count // p.variant.gpus
            qps = self.copies[p.pool_id] * p.caps[shape.gpu_type].qps * qps_factor
            self.configs[p.pool_id] = SkyServeConfig(target_qps_per_replica=qps)
            p.state = SkyServeState()
        self.next_decision = -math.inf

    def decide(self, t: float) -> None:
        fleet = self.fleet
        # a VM goes with its replica
        for node in list(fleet.nodes.values()):
            if not node.replicas:
                fleet.release(node, t)
        if t < self.next_decision:
            return
        self.next_decision = t + SkyServeConfig(1.0).decision_interval_s - 1e-6
        for pool in self.pools.values():
            v = pool.variant
            spec = PoolSpec(pool_id=v.pool_id, kind=v.kind, min_replicas=0 if v.tail else v.min_replicas,
                            max_replicas=v.max_replicas, ttft_slo_s=v.slo_s, gpus_per_replica=v.gpus)
            obs = self.observation(pool, t)
            decision, pool.state = skyserve_decide(spec, obs, pool.state, self.configs[v.pool_id])
            launches, drains = follow_target(obs.replicas, decision.target_replicas)
            shape = self.shape[v.pool_id]
            for _ in range(launches):
                node = fleet.launch(shape, None, t)
                fleet.place(v.pool_id, node, tuple(range(shape.gpu_count)), pool.caps[shape.gpu_type], t,
                            copies=self.copies[v.pool_id])
            for rid in drains:
                fleet.stop(fleet.replicas[rid], t)

