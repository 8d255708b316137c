"""Autoscaler executor: database → signals → the pure policy → desired state.

Per pool and per tick: build ``PoolSpec``/``PoolObservation`` from rows the agents and the
usage rollup keep fresh, call ``autoscaler.policy.decide``, then apply the answer:
``desired_replicas`` (replicas, never nodes), the policy's memory, and a stored decision with its
reasons and signals (shown by ``/admin/v1/pools/{id}/decisions``). Where the replicas go, which
ones stop on a scale-down and on which market they run is the fleet tick's to decide
(``controlplane.fleet.reconcile``): one owner per decision.

Each pool is locked with ``FOR UPDATE SKIP LOCKED`` for one short transaction without any
cloud I/O, so two workers never decide for the same pool at once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controlplane.autoscaler import schedule
from controlplane.autoscaler.config import AutoscalerConfig
from controlplane.autoscaler.policy import decide, prewarm_horizon
from controlplane.autoscaler.signals import (
    AutoscalerState,
    EdgeSignals,
    PoolObservation,
    PoolSpec,
    ReplicaSignal,
    weighted_tokens,
)
from controlplane.config import Settings
from controlplane.fleet import spares
from controlplane.fleet.capacity import profiled_throughput, serving_gpu_types
from controlplane.fleet.edge_signals import read_edge_signals, redis_client
from controlplane.models import (
    AutoscalerDecision,
    Node,
    NodeState,
    Pool,
    Quota,
    Replica,
    ReplicaDesiredState,
    ReplicaState,
    UsageMinute,
)
from controlplane.services.edge_snapshot import served_model_name

HISTORY_S = 26 * 3600  # a day for the seasonal forecast, plus the trend window
ACTIVATION_VALID_S = 300.0  # an edge's activation request counts this long
DECISION_RECORD_EVERY_S = 60.0  # "hold" decisions are stored at most this often per pool
# A placed replica its agent has not started yet is capacity on its way, like a starting one.
_REPLICA_STATES = {ReplicaState.pending: "starting", ReplicaState.starting: "starting", ReplicaState.ready: "ready",
                   ReplicaState.draining: "draining"}


def _ts(t: dt.datetime | None) -> float | None:
    return t.timestamp() if t else None


# ---------------------------------------------------------------- signals from metrics (pure)
def histogram_quantile(hist: Mapping | None, q: float) -> float | None:
    """Quantile from one heartbeat's histogram delta (cumulative counts keyed by ``le``)."""
    if not hist or not hist.get("count"):
        return None
    target = q * float(hist["count"])
    bounds = sorted(((float(le), float(c)) for le, c in hist.get("buckets", {}).items()), key=lambda x: x[0])
    for le, cumulative in bounds:
        if cumulative >= target:
            return le if le != float("inf") else None
    return None


def replica_signal(r: Replica, node: Node, gpus: int) -> ReplicaSignal:
    m = r.metrics or {}
    ttft = histogram_quantile((m.get("histograms") or {}).get("time_to_first_token_seconds"), 0.95)
    return ReplicaSignal(
        replica_id=str(r.id),
        node_id=str(r.node_id),
        state=_REPLICA_STATES[r.state],
        spot=node.spot,
        num_queue_reqs=int(m.get("num_queue_reqs") or 0),
        num_running_reqs=int(m.get("num_running_reqs") or 0),
        max_running_requests=int(r.max_running_requests or m.get("max_running_requests") or 1),
        kv_usage=float(m.get("token_usage") or 0.0),
        ttft_p95_s=ttft,
        started_at=_ts(r.started_at) or _ts(r.created_at) or 0.0,
        ready_at=_ts(r.ready_at),
        gpus=gpus,
        spare=bool(r.spare),
    )


def live_rates(replicas: Sequence[Replica], output_token_weight: float | None = None) -> tuple[float, float]:
    """(req/s, weighted tok/s) the engines reported in their last heartbeat: fresher than the
    usage rollup. SGLang counts prompt and generated tokens apart, so they are weighed apart."""
    req = tok = 0.0
    for r in replicas:
        m = r.metrics or {}
        req += float(m.get("num_requests_per_s") or 0.0)
        tok += weighted_tokens(float(m.get("prompt_tokens_per_s") or 0.0),
                               float(m.get("generation_tokens_per_s") or 0.0), output_token_weight)
    return req, tok


# ---------------------------------------------------------------- observation (reads)
@dataclass(frozen=True)
class Observed:
    spec: PoolSpec
    obs: PoolObservation
    state: AutoscalerState
    busy: bool  # a replica reported work in its last heartbeat
    current: int = 0  # the pool's own replicas serving or on their way (spares aside): its size now
    ready: tuple[Replica, ...] = ()  # the pool's own replicas that serve (spares aside)


def _history(session: Session, variant_id: uuid.UUID, now: dt.datetime,
             output_token_weight: float | None = None) -> tuple[list, list, float | None]:
    rows = session.execute(
        select(
            UsageMinute.minute,
            func.sum(UsageMinute.requests),
            func.sum(UsageMinute.prompt_tokens),
            func.sum(UsageMinute.completion_tokens),
        )
        .where(UsageMinute.variant_id == variant_id, UsageMinute.minute >= now - dt.timedelta(seconds=HISTORY_S))
        .group_by(UsageMinute.minute)
        .order_by(UsageMinute.minute)
    ).all()
    # A minute bucket's rate is known once the minute is over: stamp it at its end. As "last
    # request" it counts from its start: live metrics (and pool.last_request_at, written on
    # every busy tick) cover the minute still running. That minute's bucket is left out of the
    # rates: stamped in the future with a partial count, it would put the history out of order
    # (the forecast's windows would drop the live sample appended after it).
    ended = [(m.timestamp() + 60, n, weighted_tokens(float(p or 0), float(c or 0), output_token_weight))
             for m, n, p, c in rows if m.timestamp() + 60 <= now.timestamp()]
    req = [(end, float(n or 0) / 60) for end, n, _ in ended]
    tok = [(end, t / 60) for end, _, t in ended]
    last = rows[-1][0].timestamp() if rows else None
    return req, tok, last


def _tenant_gpus(session: Session, tenant_id: uuid.UUID) -> int:
    """GPUs held by the tenant's dedicated pools: every replica not stopped counts."""
    from controlplane.models import ModelVariant

    n = session.scalar(
        select(func.coalesce(func.sum(ModelVariant.gpu_count), 0))
        .select_from(Replica)
        .join(Pool, Pool.id == Replica.pool_id)
        .join(ModelVariant, ModelVariant.id == Replica.variant_id)
        .where(Pool.dedicated_tenant_id == tenant_id,
               Replica.state.in_([ReplicaState.starting, ReplicaState.ready, ReplicaState.draining]))
    )
    return int(n or 0)


def _gpu_type(node: Node) -> str | None:
    return (node.launch_spec or {}).get("gpu_type")


def observe(session: Session, pool: Pool, now: dt.datetime, edge: EdgeSignals | None = None) -> Observed:
    gpus = pool.variant.gpu_count
    every = session.execute(
        select(Replica, Node)
        .join(Node, Node.id == Replica.node_id)
        .where(Replica.pool_id == pool.id, Replica.state.in_(list(_REPLICA_STATES)),
               Node.state.in_([NodeState.pending, NodeState.provisioning, NodeState.booting, NodeState.ready,
                               NodeState.draining]))
    ).all()
    # A consolidation copy is the same replica as its original until it takes over; while it
    # loads it only says which GPU type its original will serve on (``serving_gpu_types``).
    # Spares (``fleet.spares``) do not count toward the pool's size, but a ready one serves: it is
    # capacity the policy sees (its load, its TTFT, a burst it absorbs). One still loading is not.
    rows = [(r, n) for r, n in every if (r.replaces_id is None or r.state == ReplicaState.ready)
            and (not r.spare or r.state == ReplicaState.ready)]
    loading_copies = [(r.replaces_id, _gpu_type(n)) for r, n in every
                      if r.replaces_id is not None and r.state in (ReplicaState.pending, ReplicaState.starting)]
    replicas = [replica_signal(r, n, gpus) for r, n in rows]
    weight = pool.variant.output_token_weight
    req_hist, tok_hist, last_usage = _history(session, pool.variant_id, now, weight)
    live_req, live_tok = live_rates([r for r, _ in rows], weight)
    if rows:
        req_hist.append((now.timestamp(), live_req))
        tok_hist.append((now.timestamp(), live_tok))
    ready_times = session.scalars(
        select(Replica.model_ready_seconds)
        .where(Replica.variant_id == pool.variant_id, Replica.model_ready_seconds.is_not(None))
        .order_by(Replica.created_at.desc())
        .limit(50)
    ).all()
    busy = any(s.num_running_reqs or s.num_queue_reqs for s in replicas) or live_req > 0
    last_request = max(
        (t for t in (_ts(pool.last_request_at), last_usage, now.timestamp() if busy else None) if t is not None),
        default=None,
    )
    activation = pool.activation_requested_at is not None and (
        now - pool.activation_requested_at
    ).total_seconds() < ACTIVATION_VALID_S
    quota = None
    in_use = 0
    if pool.dedicated_tenant_id is not None:
        q = session.get(Quota, pool.dedicated_tenant_id)
        quota = q.max_gpus if q else None
        in_use = _tenant_gpus(session, pool.dedicated_tenant_id) if quota is not None else 0
    spec = PoolSpec(
        pool_id=str(pool.id),
        kind=pool.kind.value,
        min_replicas=pool.min_replicas,
        max_replicas=pool.max_replicas,
        ttft_slo_s=pool.ttft_slo_ms / 1000,
        idle_timeout_s=float(pool.idle_timeout_s),
        gpus_per_replica=gpus,
        tenant_gpu_quota=quota,
        tenant_gpus_in_use=in_use,
        replica_tokens_per_s=profiled_throughput(pool.variant.profiled_tokens_per_s or {},
                                                 serving_gpu_types({r.id: _gpu_type(n) for r, n in rows if not r.spare},
                                                                   loading_copies)),
    )
    obs = PoolObservation(
        now=now.timestamp(),
        replicas=tuple(replicas),
        request_rate_history=req_hist,
        token_rate_history=tok_hist,
        model_ready_seconds=tuple(float(x) for x in ready_times),
        last_request_at=last_request,
        activation_requested=activation,
        edge=edge,
    )
    state = AutoscalerState.from_json(json.dumps(pool.autoscaler_state) if pool.autoscaler_state else None)
    return Observed(spec, obs, state, busy, sum(1 for r in replicas if r.active and not r.spare),
                    tuple(r for r, _ in rows if r.state == ReplicaState.ready and not r.spare))


def _alone_on_their_node(session: Session, replicas: Sequence[Replica]) -> int:
    """How many of ``replicas`` hold their node alone: no other wanted replica there, spares aside."""
    if not replicas:
        return 0
    wanted = session.execute(
        select(Replica.node_id, func.count()).where(
            Replica.node_id.in_({r.node_id for r in replicas}), Replica.spare.is_(False),
            Replica.desired_state == ReplicaDesiredState.running,
            Replica.state.in_([ReplicaState.pending, ReplicaState.starting, ReplicaState.ready]))
        .group_by(Replica.node_id)).all()
    per_node = dict(wanted)
    return sum(1 for r in replicas if per_node.get(r.node_id, 0) <= 1)


# ---------------------------------------------------------------- apply (writes)
def action_of(current: int, target: int) -> str:
    if target > current:
        return "scale_up"
    if target < current:
        return "scale_down"
    return "hold"


def _record(session: Session, pool: Pool, now: dt.datetime, current: int, decision, action: str) -> bool:
    if action == "hold":
        last = session.scalar(
            select(func.max(AutoscalerDecision.created_at)).where(AutoscalerDecision.pool_id == pool.id)
        )
        if last is not None and (now - last).total_seconds() < DECISION_RECORD_EVERY_S:
            return False
    session.add(AutoscalerDecision(
        pool_id=pool.id, created_at=now, current_replicas=current, target_replicas=decision.target_replicas,
        action=action, reasons=list(decision.reasons), signals=json.loads(json.dumps(decision.signals, default=str)),
    ))
    return True


def autoscale_pool(session: Session, pool: Pool, now: dt.datetime, settings: Settings,
                   config: AutoscalerConfig | None = None, edge: EdgeSignals | None = None) -> str:
    seen = observe(session, pool, now, edge)
    config = config or AutoscalerConfig()
    # Where the fleet would keep this pool's scale-down surplus warm as a spare, the policy's
    # hysteresis moves to the fleet (``AutoscalerConfig.for_warm_surplus``).
    # (Asked only of pools that have spares: it costs a query.)
    warm = (spares.has_spares(settings.spare_replicas_enabled, pool.dedicated_tenant_id)
            and spares.scale_down_keeps_warm(len(seen.ready), _alone_on_their_node(session, seen.ready)))
    spec, floor = with_schedule(dataclasses.replace(seen.spec, warm_surplus=warm), pool, seen.obs, config)
    decision, new_state = decide(spec, seen.obs, seen.state, config)
    if floor.window is not None:
        decision = dataclasses.replace(
            decision, reasons=(*decision.reasons, floor.reason()),
            signals={**decision.signals, "scheduled_min_replicas": floor.min_replicas,
                     "schedule_window": floor.window.describe()})
    if pool.variant.output_token_weight is not None:
        # The token rate in the signals is weighted: the decision says by what.
        decision = dataclasses.replace(
            decision, signals={**decision.signals, "output_token_weight": pool.variant.output_token_weight})
    current = seen.current
    pool.desired_replicas = decision.target_replicas
    if seen.busy:
        pool.last_request_at = now
    pool.autoscaler_state = json.loads(new_state.to_json())
    if decision.target_replicas > 0 and pool.activation_requested_at is not None and seen.obs.activation_requested:
        pool.activation_requested_at = None  # served: the pool is coming up
    action = action_of(current, decision.target_replicas)
    _record(session, pool, now, current, decision, action)
    return action


def with_schedule(spec: PoolSpec, pool: Pool, obs: PoolObservation, config: AutoscalerConfig
                  ) -> tuple[PoolSpec, schedule.ScheduledFloor]:
    """The pool's spec with its scheduled floor applied. A window counts from one pre-warm horizon
    (the policy's own: p90 model-ready time plus a tick) before it opens, so its replicas are ready
    when it does; inside a window a scale-to-zero pool stays warm."""
    if not pool.schedule:
        return spec, schedule.ScheduledFloor(0, None)
    floor = schedule.scheduled_floor(schedule.parse(pool.schedule), schedule.zone(pool.schedule_timezone), obs.now,
                                     lead_s=prewarm_horizon(obs, config))
    if floor.window is None or floor.min_replicas <= spec.min_replicas:
        return spec, floor
    return dataclasses.replace(spec, min_replicas=min(floor.min_replicas, spec.max_replicas), kind="warm"), floor


def config_from(settings: Settings) -> AutoscalerConfig:
    """The policy's defaults with the operator's overrides; unknown knobs are an error, not ignored."""
    known = AutoscalerConfig.__dataclass_fields__
    unknown = sorted(set(settings.autoscaler_overrides) - set(known))
    if unknown:
        raise ValueError(f"unknown autoscaler settings: {', '.join(unknown)}")
    return AutoscalerConfig(**settings.autoscaler_overrides)


def autoscale_tick(session: Session, settings: Settings, now: dt.datetime,
                   config: AutoscalerConfig | None = None) -> dict[str, int]:
    config = config or config_from(settings)
    pools = session.scalars(
        select(Pool).where(Pool.paused.is_(False)).order_by(Pool.id).with_for_update(skip_locked=True, of=Pool)
    ).all()
    counts: dict[str, int] = defaultdict(int)
    edges = read_edge_signals(redis_client(settings.redis_url), now, prefix=settings.edge_signals_prefix)
    model_of = {p.id: served_model_name(p.variant.model.name, p.variant.tier) for p in pools}
    sharing = Counter(model_of.values())
    for pool in pools:
        name = model_of[pool.id]
        edge = edge_share(edges.get(name), sharing[name])
        counts[autoscale_pool(session, pool, now, settings, config, edge)] += 1
    return dict(counts)


def edge_share(signals: EdgeSignals | None, pools: int) -> EdgeSignals | None:
    """One pool's share of what the edges report for its served model. The edges count per model;
    when several pools serve one (a shared pool and a tenant's dedicated one), each gets an even
    share of the counts (the latencies are the model's), so the backlog is not grown for twice."""
    if signals is None or pools <= 1:
        return signals
    return dataclasses.replace(
        signals, queue_depth=-(-signals.queue_depth // pools), activation_waiting=-(-signals.activation_waiting // pools),
        inflight=-(-signals.inflight // pools),
        rejections={k: -(-v // pools) for k, v in signals.rejections.items()})
