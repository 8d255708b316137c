"""The pool autoscaler: a pure function from what a pool looks like now to what to do next.

``decide`` composes small pure pieces, each answering one question:

* ``measure_demand``   how many replicas' worth of work is there now? The token rate (generated
                       tokens weighted by the variant's profile, ``signals.weighted_tokens``)
                       over the per-replica capacity (profiled, times a scale learned from TTFT), and
                       the engines' batch slots and KV pool when no backlog distorts them,
                       plus the backlog only the edges see (their fair queues).
* ``tune_capacity_scale`` / ``cut_capacity_scale``  SLO feedback on that capacity.
* ``reactive_need``    Knative-style stable and panic windows over the demand; a queue that
                       outgrows the pool triggers panic too (queues lead TTFT for LLMs).
* ``backlog_drain_units``  in panic, the replicas that work a burst's queue off within one
                       cold start (the queue is work on top of the arrival rate).
* ``predictive_need``  the forecast peak within one cold start (p90 model-ready time).
* ``slo_breach_need``  one more replica when TTFT breaches the SLO of a settled pool: the
                       edges' client-side p90 when they report it, else the engines' p95.
* ``apply_hysteresis`` up at once with headroom; down only when a hold window agrees.
* ``kind_floor`` / ``clamp_target``  warm floor, scale-to-zero, max replicas, tenant GPU quota.

The answer is how many replicas the pool needs, never which ones: the fleet loop
(``controlplane.fleet``) places them into GPU slots, picks the spot / on-demand market
(``fleet.markets``), chooses which replicas stop on a scale-down and consolidates nodes. A
scale-down never goes below the panic-window need: the target holds instead (see ``decide``).

Every decision carries its reasons and the signals behind them, for the admin API.
"""
from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from controlplane.autoscaler.bursts import added_for_a_burst_now_over, not_held, track_burst
from controlplane.autoscaler.config import AutoscalerConfig
from controlplane.autoscaler.decision import Decision
from controlplane.autoscaler.forecast import Forecast, forecast_peak
from controlplane.autoscaler.signals import (
    AutoscalerState,
    EdgeSignals,
    PoolObservation,
    PoolSpec,
    ReplicaSignal,
)

EPS = 1e-9


# ---------------------------------------------------------------------------------------------
# Demand


ENGINE_TTFT, EDGE_TTFT = "engine_ttft_p95_s", "edge_ttft_p90_s"


@dataclass(frozen=True)
class Demand:
    """Work on the pool right now, in replicas' worth at the planned utilization."""

    engine_units: float  # Σ over ready replicas of the scarcer of batch slots and KV pool, / target
    rate_units: float | None  # recent token rate / effective per-replica capacity
    load_per_replica: float | None  # token rate / profiled capacity / ready replicas
    queue_total: int  # the engines' queues plus the edges' backlog
    ready: int
    token_rate: float | None
    ttft_p95_s: float | None  # worst ready replica
    edge_waiting: int = 0  # requests the edges hold that no replica has taken
    backlog_units: float = 0.0  # edge_waiting in replicas' worth of batch slots, / target
    slo_ttft_s: float | None = None  # what the SLO is judged on (see ``slo_ttft``)
    slo_ttft_source: str | None = None  # EDGE_TTFT or ENGINE_TTFT
    slo_ttft_window_s: float = 0.0  # how far back that TTFT remembers

    @property
    def engine_queue(self) -> int:
        """Requests queued on the engines themselves (the edges' backlog aside)."""
        return self.queue_total - self.edge_waiting

    @property
    def served_units(self) -> float:
        """What the replicas are doing: the engines' gauges or the token rate they serve."""
        return max(self.engine_units, self.rate_units or 0.0)

    @property
    def units(self) -> float:
        # The edges' backlog is work on top of what the engines report: neither their gauges
        # nor the served token rate include requests no replica has taken. As replicas take
        # it, the served share rises by what the backlog loses, so the sum does not run away.
        return self.served_units + self.backlog_units

    @property
    def source(self) -> str:
        """The signal that sized the demand, for the decision's ``acted_on``."""
        if self.backlog_units > 0 and self.backlog_units >= self.served_units:
            return "edge_queue"
        if self.rate_units is not None and self.rate_units >= self.engine_units:
            return "token_rate"
        return "engine_gauges"


def replica_utilization(replica: ReplicaSignal, count_queue: bool = False) -> float:
    """Share of one replica in use: the scarcer of batch slots and KV pool.

    Queued requests count only when there is no rate signal to size from: a backlog says
    "too slow now" (it triggers panic), but its length overstates the replicas needed once
    the rate is known (the backlog drains while new replicas are still starting)."""
    slots = replica.num_running_reqs + (replica.num_queue_reqs if count_queue else 0)
    return max(slots / max(1, replica.max_running_requests), replica.kv_usage)


def latest_rate(history: Sequence[tuple[float, float]], now: float, max_age_s: float) -> float | None:
    if not history or now - history[-1][0] > max_age_s:
        return None
    return history[-1][1]


def slo_ttft(edge: EdgeSignals | None, engine_p95_s: float | None,
             config: AutoscalerConfig) -> tuple[float | None, str | None]:
    """The TTFT the SLO is judged on: what clients see at the edges (p90, edge queueing
    included) once enough streamed first tokens back it, else the engines' p95."""
    if edge is not None and edge.ttft_p90_s is not None and edge.ttft_samples >= config.edge_ttft_min_samples:
        return edge.ttft_p90_s, EDGE_TTFT
    if engine_p95_s is not None:
        return engine_p95_s, ENGINE_TTFT
    return None, None


def measure_demand(obs: PoolObservation, capacity_tok_s: float | None, scale: float,
                   config: AutoscalerConfig) -> Demand:
    ready = [r for r in obs.replicas if r.state == "ready"]
    token_rate = latest_rate(obs.token_rate_history, obs.now, config.stable_window_s)
    rate_units = load = None
    if capacity_tok_s and token_rate is not None:
        rate_units = token_rate / (capacity_tok_s * scale)
        load = token_rate / capacity_tok_s / len(ready) if ready else None
    p95s = [r.ttft_p95_s for r in ready if r.ttft_p95_s is not None]
    ttft_p95 = max(p95s) if p95s else None
    # The edges cap each replica at its batch slots and queue the rest: backlog the engines
    # never see. In replicas' worth it is the waiting requests over the ready replicas' slots;
    # with no replica ready there is nothing to size it by (the floor or activation starts one).
    edge_waiting = obs.edge.waiting if obs.edge is not None else 0
    backlog_units = 0.0
    if edge_waiting and ready:
        slots = sum(max(1, r.max_running_requests) for r in ready) / len(ready)
        backlog_units = edge_waiting / slots / config.engine_target_utilization
    queue_total = sum(r.num_queue_reqs for r in ready) + edge_waiting
    # While a backlog is being worked off every replica's batch and KV pool are full whatever
    # the arrival rate, so engine gauges would ask for ready/target replicas, then more, in a
    # loop. With a rate signal the backlog only triggers panic; the rate sizes the step.
    engine_units = 0.0
    if rate_units is None or queue_total == 0:
        engine_units = sum(replica_utilization(r, rate_units is None) for r in ready)
    slo_s, source = slo_ttft(obs.edge, ttft_p95, config)
    # The edges' p90 covers their own window, the engines' p95 the executor's query range.
    window = obs.edge.window_s if source == EDGE_TTFT and obs.edge is not None else config.ttft_window_s
    return Demand(
        engine_units=engine_units / config.engine_target_utilization,
        rate_units=rate_units,
        load_per_replica=load,
        queue_total=queue_total,
        ready=len(ready),
        token_rate=token_rate,
        ttft_p95_s=ttft_p95,
        edge_waiting=edge_waiting,
        backlog_units=backlog_units,
        slo_ttft_s=slo_s,
        slo_ttft_source=source,
        slo_ttft_window_s=window,
    )


def learn_capacity(previous: float | None, obs: PoolObservation, config: AutoscalerConfig) -> float | None:
    """Tokens/s one replica serves, estimated when no profile is given: the token rate over
    the busy share of the ready replicas, once they are busy enough to say anything.
    Rough on purpose; the SLO feedback (``tune_capacity_scale``) corrects it."""
    ready = [r for r in obs.replicas if r.state == "ready"]
    token_rate = latest_rate(obs.token_rate_history, obs.now, config.stable_window_s)
    busy = sum(replica_utilization(r) for r in ready)
    if not token_rate or not ready or busy < 0.3 * len(ready):
        return previous
    observed = token_rate / busy
    return observed if previous is None else 0.8 * previous + 0.2 * observed


def tune_capacity_scale(scale: float, demand: Demand, slo_s: float, settled: bool, elapsed_s: float,
                        recent_cuts: int, config: AutoscalerConfig) -> float:
    """SLO feedback on how much of the profiled capacity a replica really delivers: grow it
    slowly while a settled pool at its planned load keeps TTFT (``slo_ttft``) well inside the SLO.

    A profile is taken on one replica in isolation; behind a load balancer a pool absorbs
    more before its TTFT suffers. The way back down is ``cut_capacity_scale`` on a breach.

    Below the profile the scale returns to it while the SLO holds, with a half-life of
    ``capacity_scale_recovery_half_life_s``: a breach is one observation against a measured
    profile, often a minute of Poisson noise at full load, and the lesson must not outlive it
    by hours. A cut from 2 ready replicas (to 0.67) used to need TTFT under half the SLO at
    full load to grow back, which a pool run at its SLO capacity never shows: 1.5x the
    replicas for the rest of the day. If the profile really is too high, the breaches come
    back, and each cut within the memory window doubles the half-life (``recent_cuts``), so a
    wrong profile settles low instead of sawing between breaches."""
    load, ttft = demand.load_per_replica, demand.slo_ttft_s
    if load is None or ttft is None or not settled:
        return scale
    if scale < 1.0 and ttft <= slo_s and elapsed_s > 0:
        half_life = config.capacity_scale_recovery_half_life_s * 2 ** max(0, recent_cuts - 1)
        scale = 1.0 - (1.0 - scale) * 0.5 ** (elapsed_s / half_life)
    if ttft < config.capacity_scale_slack * slo_s and load >= 0.9 * scale:
        scale *= 1 + config.capacity_scale_up_step
    return min(config.capacity_scale_max, max(config.capacity_scale_min, scale))


def cut_capacity_scale(scale: float, ready: int, config: AutoscalerConfig) -> float:
    """A breach on a pool that looked big enough: believe one replica less of capacity, so
    the extra replica the breach adds is still wanted once the breach has passed (otherwise
    the next scale-down removes it and the breach comes back)."""
    return max(config.capacity_scale_min, scale * ready / (ready + 1))


# ---------------------------------------------------------------------------------------------
# Reactive: stable and panic windows


@dataclass(frozen=True)
class ReactiveNeed:
    stable_units: float  # replicas' worth of demand, mean over the stable window
    panic_units: float  # the same over the panic window (or the newest sample if higher)
    panic_mode: bool
    # ready + 1 when a queue that is not draining asked for one more replica: a count, not
    # demand, so no headroom goes on top of it (``apply_hysteresis``)
    queue_step: int = 0

    @property
    def stable(self) -> int:
        return replicas_for(self.stable_units)

    @property
    def panic(self) -> int:
        return max(replicas_for(self.panic_units), self.queue_step)


def record(samples: tuple, t: float, value, keep_s: float) -> tuple:
    kept = tuple(s for s in samples if s[0] > t - keep_s and s[0] < t)
    return (*kept, (t, value))


def window_mean(samples: Sequence[tuple[float, float]], now: float, window_s: float) -> float:
    values = [v for t, v in samples if t > now - window_s]
    return sum(values) / len(values) if values else 0.0


def replicas_for(units: float) -> int:
    return max(0, math.ceil(units - EPS))


def backlogged(demand: Demand, config: AutoscalerConfig) -> bool:
    """More requests wait than ``panic_queue_per_replica`` per ready replica: a queue being worked
    off, which triggers panic and explains a TTFT breach."""
    return demand.ready > 0 and demand.queue_total > config.panic_queue_per_replica * demand.ready


def reactive_need(samples: Sequence[tuple[float, float]], now: float, demand: Demand,
                  config: AutoscalerConfig, previous_queue: int | None = None,
                  previous_ready: int | None = None) -> ReactiveNeed:
    stable_units = window_mean(samples, now, config.stable_window_s)
    panic_units = window_mean(samples, now, config.panic_window_s)
    panic = replicas_for(panic_units)
    ready = max(1, demand.ready)
    queued_too_long = backlogged(demand, config)
    queue_step = 0
    if (queued_too_long and previous_queue is not None and demand.queue_total >= previous_queue
            and previous_ready is not None and demand.ready <= previous_ready):
        # A queue that is not draining is demand the rate signal cannot see (a throttled GPU,
        # longer outputs than the learned capacity assumed): it asks for one more replica. A
        # shrinking queue is a burst being worked off, already sized by the rate. So is a queue
        # that grew while replicas were still starting: the ones that just became ready have not
        # served a tick yet. Judged on them, the rule asked for everything ready + 1 the moment a
        # burst's replicas arrived (bench/fleet: a pool at 3.85 replicas' worth went to 9).
        queue_step = demand.ready + 1
        panic = max(panic, queue_step)
    # Knative's rule: the demand itself (not its ceiling) reaches panic_threshold × the ready
    # replicas. With the ceiling, one ready replica panicked on any 10 s mean above 1.0.
    panic_mode = panic > demand.ready and (panic_units >= config.panic_threshold * ready - EPS or queued_too_long)
    return ReactiveNeed(stable_units, panic_units, panic_mode, queue_step)


def backlog_drain_units(obs: PoolObservation, demand: Demand, capacity_tok_s: float | None,
                        horizon_s: float, config: AutoscalerConfig) -> float:
    """Replicas' worth that works the engines' queued requests off within one pre-warm horizon.

    A burst's backlog is work on top of the arrival rate: capacity that only matches the rate
    never drains it, and every request behind it waits past the SLO. Replicas added now are
    ready about one horizon from now, so that is the time the backlog gets. The edges' backlog
    is left out: ``measure_demand`` already counts it (``Demand.backlog_units``)."""
    queued = demand.engine_queue
    if queued <= 0 or not capacity_tok_s or demand.token_rate is None or horizon_s <= 0:
        return 0.0
    request_rate = latest_rate(obs.request_rate_history, obs.now, config.stable_window_s)
    if not request_rate:
        return 0.0
    tokens_per_request = demand.token_rate / request_rate
    return queued * tokens_per_request / capacity_tok_s / horizon_s


# ---------------------------------------------------------------------------------------------
# Predictive


def quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    lo = math.floor(position)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (position - lo)


def prewarm_horizon(obs: PoolObservation, config: AutoscalerConfig) -> float:
    ready_time = quantile(obs.model_ready_seconds, config.prewarm_quantile)
    return (ready_time if ready_time is not None else config.default_model_ready_s) + config.decision_interval_s


def _time(point: tuple[float, float]) -> float:
    return point[0]


def predictive_need(obs: PoolObservation, capacity_tok_s: float | None, horizon_s: float,
                    config: AutoscalerConfig, state: AutoscalerState | None = None) -> tuple[float, Forecast | None]:
    """Replicas' worth of the forecast peak token rate within the pre-warm horizon.

    A burst that is over (``track_burst``) is left out of the history the forecast reads: its
    level window would otherwise hold the burst's rate for two minutes after it (the pool
    stepped down that slowly behind it), and its slope would read a rise."""
    if not capacity_tok_s or not obs.token_rate_history:
        return 0.0, None
    history = obs.token_rate_history
    if state is not None and state.burst_since is not None and state.burst_ended_at is not None:
        # Sliced out by time (the history is oldest first), not filtered point by point: the
        # history is the pool's day and more, read every tick for as long as the burst is the last.
        lo = bisect_left(history, state.burst_since, key=_time)
        hi = bisect_right(history, state.burst_ended_at, key=_time)
        if hi > lo:
            history = [*history[:lo], *history[hi:]]
    forecast = forecast_peak(
        history, obs.now, horizon_s, season_s=config.season_s,
        level_window_s=config.forecast_level_window_s, trend_window_s=config.forecast_trend_window_s,
        trend_cap=config.forecast_trend_cap,
    )
    return forecast.peak / capacity_tok_s, forecast


# ---------------------------------------------------------------------------------------------
# Target: SLO feedback, hysteresis, floors and ceilings


def slo_breach_need(demand: Demand, spec: PoolSpec, state: AutoscalerState, now: float,
                    step_interval_s: float, config: AutoscalerConfig) -> int:
    """One more replica while TTFT breaches the SLO on a pool that looks big enough: the edges'
    client-side p90 when they report it (what users get, edge queueing included), else the
    engines' p95 (``slo_ttft``).

    Either covers a recent window (``Demand.slo_ttft_window_s``: the edges' own for their p90,
    ``ttft_window_s`` for the engines'), so it still remembers a backlog (or a cold start) that
    was already acted on: the step waits until the last panic and the last scale-up's replicas
    are a full window behind. Judged on the shorter of the two, a pool scaled down soon after a
    burst read the burst's TTFT as a breach and grew again (tests/e2e/test_autoscaling_scale_down)."""
    ttft = demand.slo_ttft_s
    if ttft is None or ttft <= spec.ttft_slo_s or demand.ready == 0:
        return 0
    if state.last_slo_ttft_s is not None and ttft < 0.98 * state.last_slo_ttft_s:
        return 0  # improving: a backlog is draining, more replicas would arrive after it is gone
    # The window the TTFT covers: the one it was judged on (an edge's may be longer than the
    # executor's query range), never shorter than the configured one.
    window = max(config.ttft_window_s, demand.slo_ttft_window_s)
    if state.panic_until is not None and now < state.panic_until + window:
        return 0
    if state.last_scale_up_at is not None and now - state.last_scale_up_at < step_interval_s + window:
        return 0
    return demand.ready + 1


def apply_hysteresis(need: float, latest: float, current: int, need_samples: Sequence[tuple[float, float]],
                     now: float, state: AutoscalerState, in_panic: bool,
                     config: AutoscalerConfig, *, measured: float | None = None, step: int = 0) -> tuple[int, str]:
    """Next target from the current one and the need (in replicas' worth, fractional).

    Up as soon as the windowed need passes the target, sized by the newest sample when that
    is higher (a step in load is then met in one step, not followed tick by tick as the
    window's mean catches up), with headroom (``scale_up_headroom``; ``panic_headroom`` in
    panic, none by default). The headroom goes on the ``measured`` demand (``need`` when not
    given), not on a rule's ``step`` (a replica count: one more than are ready), which is met
    exactly. Down only when the highest need of the hold window, plus headroom, frees a
    worthwhile share of the pool; never while panicking, right after a scale-up, or without
    a full hold window of memory. The gap between the thresholds is the hysteresis band."""
    if replicas_for(need) > current:
        headroom = config.panic_headroom if in_panic else config.scale_up_headroom
        sized = need if measured is None else measured
        grown = max(replicas_for(max(sized, latest) * (1 + headroom)), step,
                    current + math.ceil(config.scale_up_min_fraction * current))
        return grown, f"scale up: need {need:.2f} > target {current}"
    if in_panic:
        return current, "panic: no scale-down"
    remembered = not_held(need_samples, now, state, config)
    held = max([v for t, v in remembered if t > now - config.scale_down_hold_s] + [need])
    if replicas_for(held * (1 + config.scale_down_headroom)) >= current:
        return current, f"hold: peak need over {config.scale_down_hold_s:.0f}s is {held:.2f}"
    # The decline has lasted the whole hold window: shrink to what its peak needs, with the
    # headroom. Shrinking to the last minute's level instead put the target inside the noise
    # of the minutes before it (a 5-minute peak of 9.9 replicas' worth, a scale-down to 10, a
    # scale-up at 10.1 three minutes later); the minimum step keeps this to a few events.
    recent = max([v for t, v in remembered if t > now - config.stable_window_s] + [need])
    keep = replicas_for(held * (1 + config.scale_down_headroom))
    seen_since = need_samples[0][0] if need_samples else now
    if now - seen_since < config.scale_down_hold_s - config.decision_interval_s:
        # Too little memory (first ticks, or state lost): a quiet minute is no reason to shrink.
        return current, "hold: not enough history to scale down"
    # The cooldown keeps a replica that cost a cold start from going at the next dip; one added
    # for a burst that is over (``bursts.track_burst``) goes with the burst.
    if (state.last_scale_up_at is not None and now - state.last_scale_up_at < config.scale_down_cooldown_s
            and not added_for_a_burst_now_over(state)):
        return current, "hold: cooling down after scale-up"
    if current - keep < max(1, math.ceil(config.scale_down_min_fraction * current)):
        return current, f"hold: surplus {current - keep} below the minimum scale-down step"
    return keep, (f"scale down: peak need {held:.2f} over {config.scale_down_hold_s:.0f}s, "
                  f"{recent:.2f} over {config.stable_window_s:.0f}s, target {current}")


def is_idle(spec: PoolSpec, obs: PoolObservation) -> bool:
    if obs.activation_requested:
        return False
    if obs.edge is not None and (obs.edge.waiting or obs.edge.inflight):
        return False
    if any(r.num_running_reqs or r.num_queue_reqs for r in obs.replicas):
        return False
    return obs.last_request_at is None or obs.now - obs.last_request_at >= spec.idle_timeout_s


def kind_floor(spec: PoolSpec, obs: PoolObservation) -> tuple[int, str | None]:
    """Fewest replicas the pool kind allows now; scale-to-zero may go to 0 once idle."""
    if spec.kind == "warm":
        return spec.min_replicas, None
    if is_idle(spec, obs):
        return 0, f"idle for {spec.idle_timeout_s:.0f}s: scale to zero"
    if obs.activation_requested:
        return max(1, spec.min_replicas), "activation request from the edge"
    return max(1, spec.min_replicas), None


def quota_ceiling(spec: PoolSpec, active: Sequence[ReplicaSignal]) -> int | None:
    """Most active replicas the tenant's GPU quota allows (None: no quota)."""
    if spec.tenant_gpu_quota is None:
        return None
    free_gpus = spec.tenant_gpu_quota - spec.tenant_gpus_in_use
    if free_gpus >= 0:
        return len(active) + free_gpus // spec.gpus_per_replica
    # Over quota already (quota lowered): shed the excess.
    return max(0, len(active) - math.ceil(-free_gpus / spec.gpus_per_replica))


def clamp_target(target: int, floor: int, spec: PoolSpec, active: Sequence[ReplicaSignal]) -> tuple[int, list[str]]:
    reasons = []
    if target < floor:
        target, reasons = floor, [f"floor {floor}"]
    if target > spec.max_replicas:
        target, reasons = spec.max_replicas, [*reasons, f"ceiling max_replicas={spec.max_replicas}"]
    quota = quota_ceiling(spec, active)
    if quota is not None and target > quota:
        target = quota
        reasons.append(f"tenant GPU quota {spec.tenant_gpu_quota} allows {quota} replicas")
    return target, reasons


# ---------------------------------------------------------------------------------------------
# What the decision cites


def edge_queue_reason(edge: EdgeSignals | None, demand: Demand) -> str:
    assert edge is not None
    held = f", {edge.activation_waiting} held for activation" if edge.activation_waiting else ""
    wait = f", queue wait p90 {edge.queue_wait_p90_s:.2f}s" if edge.queue_wait_p90_s is not None else ""
    return (f"edge queue {edge.queue_depth} waiting{held} on {edge.edges} edge(s){wait}: "
            f"+{demand.backlog_units:.2f} replicas' worth on {demand.served_units:.2f} served")


def edge_signal_fields(edge: EdgeSignals | None, demand: Demand) -> dict:
    """The edges' signals as the decision stores them; None where no edge reported."""
    if edge is None:
        return {"edges": 0, "edge_queue": None, "edge_activation_waiting": None, "edge_inflight": None,
                "edge_backlog_units": 0.0, "edge_queue_wait_p50_s": None, "edge_queue_wait_p90_s": None,
                "edge_ttft_p90_s": None, "edge_ttft_samples": 0, "edge_rejections": {}}
    return {
        "edges": edge.edges,
        "edge_queue": edge.queue_depth,
        "edge_activation_waiting": edge.activation_waiting,
        "edge_inflight": edge.inflight,
        "edge_backlog_units": round(demand.backlog_units, 3),
        "edge_queue_wait_p50_s": edge.queue_wait_p50_s,
        "edge_queue_wait_p90_s": edge.queue_wait_p90_s,
        "edge_ttft_p90_s": edge.ttft_p90_s,
        "edge_ttft_samples": edge.ttft_samples,
        "edge_rejections": dict(edge.rejections),
    }


def acted_on(demand: Demand, reactive: ReactiveNeed, predicted: float, breach: int, panic_units: float,
             in_panic: bool, need: float, drain: float = 0.0) -> list[str]:
    """Names of the signals the need came from: the window or rule that set it, and the demand
    signal behind the windows (an edge backlog is always named when there is one)."""
    names = []
    if breach and breach >= need - EPS:
        names.append(f"slo_breach:{demand.slo_ttft_source}")
    if predicted > reactive.stable_units and predicted >= need - EPS:
        names.append("forecast")
    if in_panic and panic_units >= need - EPS:
        names.append("panic_window")
        if drain and demand.units + drain >= need - EPS:
            names.append("backlog_drain")
    if not names:
        names.append("stable_window")
    names.append(demand.source)
    if demand.edge_waiting and "edge_queue" not in names:
        names.append("edge_queue")
    return names


# ---------------------------------------------------------------------------------------------
# The policy


def decide(spec: PoolSpec, obs: PoolObservation, state: AutoscalerState,
           config: AutoscalerConfig | None = None) -> tuple[Decision, AutoscalerState]:
    config = config or AutoscalerConfig()
    if spec.warm_surplus:
        config = config.for_warm_surplus()
    now = obs.now
    active = [r for r in obs.replicas if r.active]
    ready = [r for r in active if r.state == "ready"]

    learned = state.tokens_per_replica_s if spec.replica_tokens_per_s else learn_capacity(
        state.tokens_per_replica_s, obs, config)
    profiled = spec.replica_tokens_per_s or learned
    demand = measure_demand(obs, profiled, state.capacity_scale, config)
    # Learn only from a settled pool: no cold start under way, no panic in the last minute.
    settled = len(ready) == len(active) and not (state.panic_until is not None and now < state.panic_until)
    elapsed = now - state.demand_samples[-1][0] if state.demand_samples else 0.0
    cuts = tuple(t for t in state.capacity_cuts if t > now - config.capacity_scale_breach_memory_s)
    scale = tune_capacity_scale(state.capacity_scale, demand, spec.ttft_slo_s, settled, elapsed, len(cuts), config)
    capacity = profiled * scale if profiled else None

    keep_s = max(config.stable_window_s, config.panic_window_s)
    demand_samples = record(state.demand_samples, now, demand.units, keep_s)
    reactive = reactive_need(demand_samples, now, demand, config, state.last_queue_total, state.last_ready)
    horizon = prewarm_horizon(obs, config)
    predicted, forecast = predictive_need(obs, capacity, horizon, config, state)
    # While the panic rule fires, the step also drains the queue behind the burst.
    drain = backlog_drain_units(obs, demand, capacity, horizon, config) if reactive.panic_mode else 0.0
    panic_until, panic_since = state.panic_until, state.panic_since
    panic_began = False
    if reactive.panic_mode:
        if panic_until is None or now >= panic_until:
            panic_since = now
            panic_began = True
        panic_until = now + config.panic_hold_s
    in_panic = panic_until is not None and now < panic_until

    # The SLO step is for a pool that looks big enough yet misses its SLO; while a backlog
    # is worked off or replicas are starting, TTFT is high for reasons already acted on.
    breach = 0
    if settled and not in_panic:
        breach = slo_breach_need(demand, spec, state, now, config.slo_breach_step_interval_s or horizon, config)

    # A breach says the profile is high only where no backlog explains it: TTFT over a window in
    # which a queue is being worked off is the queue's (a cold start's, a burst's), and a cut
    # from 1-2 ready replicas (to 0.5-0.67) held a pool a third bigger for hours after it
    # (bench/fleet: a 70B pool's first cold start of the day).
    if breach and profiled and not backlogged(demand, config):
        scale = cut_capacity_scale(scale, demand.ready, config)
        capacity = profiled * scale
        cuts = (*cuts, now)

    panic_units = reactive.panic_units if in_panic else 0.0
    # The SLO and queue rules ask for one replica more than are ready: a count, which the
    # headroom must not turn into two (it did, on every breach of a pool with headroom and on
    # every stalled queue in panic).
    step = max(breach, reactive.queue_step if in_panic else 0)
    # The hold window remembers demand that may come back, not a backlog that is gone once
    # drained: the drain sizes this step but is not recorded for the scale-down hold. Nor is
    # the forecast: it is made afresh every tick, so a rise it still expects is in this tick's
    # need, and one it no longer expects (the trend of a burst that has ended) is not held.
    held_need = max(reactive.stable_units, float(step), panic_units)
    if drain:
        panic_units = max(panic_units, demand.units + drain)
    measured = max(reactive.stable_units, predicted, panic_units)  # demand, which headroom sizes
    need = max(measured, float(step))
    reasons = []
    edge = obs.edge
    if demand.edge_waiting:
        reasons.append(edge_queue_reason(edge, demand))
    if edge is not None and edge.capacity_rejections:
        turned = ", ".join(f"{n} {reason}" for reason, n in sorted(edge.rejections.items()) if reason.startswith("503/"))
        reasons.append(f"edge rejected {edge.capacity_rejections} for capacity over {edge.window_s:.0f}s ({turned})")
    if reactive.panic_mode:
        queued = f"{demand.queue_total} queued"
        if demand.edge_waiting:
            queued += f" ({demand.edge_waiting} at the edge)"
        reasons.append(f"panic: {reactive.panic} replicas needed over {config.panic_window_s:.0f}s "
                       f"with {demand.ready} ready and {queued}")
    if drain:
        reasons.append(f"backlog: {demand.engine_queue} queued on the engines, "
                       f"+{drain:.2f} replicas' worth drains them within {horizon:.0f}s")
    if replicas_for(predicted) > reactive.stable:
        reasons.append(f"pre-warm: forecast peak {forecast.peak:.0f} tok/s within {horizon:.0f}s "
                       f"needs {predicted:.2f}")
    if breach:
        label = "edge TTFT p90" if demand.slo_ttft_source == EDGE_TTFT else "engine TTFT p95"
        reasons.append(f"{label} {demand.slo_ttft_s:.2f}s > SLO {spec.ttft_slo_s:.2f}s")

    floor, floor_reason = kind_floor(spec, obs)
    # Keep more than the hold window: the "enough history" test must not depend on how evenly
    # beat spaced the ticks (with 10 s ticks a 300 s window never held 295 s of samples).
    # The need is recorded without the floor: the scale-down headroom is for demand, and a
    # floor of m with headroom rounds up to m + 1, so a warm pool could never shrink back to
    # its min_replicas. ``clamp_target`` applies the floor.
    need_samples = record(state.need_samples, now, held_need, config.scale_down_hold_s * 1.5)
    burst_since, burst_base, burst_ended_at = track_burst(state, now, panic_began, in_panic, held_need,
                                                          need_samples, config)
    if burst_ended_at == now and burst_base is not None:
        reasons.append(f"burst over: need {held_need:.2f} is back near the {burst_base:.2f} before it")
    if floor == 0 and floor_reason is not None:
        target, why = 0, floor_reason
    else:
        current = state.target if state.target is not None else sum(1 for r in active if not r.spare)
        target, why = apply_hysteresis(need, demand.units, current, need_samples, now, state, in_panic, config,
                                       measured=measured, step=step)
        if target < current and reactive.panic > target:
            # Never shrink below what the panic window needs: the replicas the fleet would stop
            # are still wanted. Hold, and shrink in one go once the burst has passed.
            target, why = current, f"hold: panic-window need {reactive.panic} above the scale-down target {target}"
        if floor_reason:
            reasons.append(floor_reason)
    reasons.append(why)
    target, clamp_reasons = clamp_target(target, floor, spec, active)
    reasons += clamp_reasons

    new_state = state.evolve(
        demand_samples=demand_samples,
        need_samples=need_samples,
        target=target,
        panic_until=panic_until,
        panic_since=panic_since,
        burst_since=burst_since,
        burst_base=burst_base,
        burst_ended_at=burst_ended_at,
        last_scale_up_at=now if target > (state.target or 0) else state.last_scale_up_at,
        last_scale_down_at=now if state.target is not None and target < state.target else state.last_scale_down_at,
        tokens_per_replica_s=learned,
        capacity_scale=scale,
        capacity_cuts=cuts,
        last_slo_ttft_s=demand.slo_ttft_s,
        last_queue_total=demand.queue_total,
        last_ready=demand.ready,
    )
    signals = {
        "active": len(active),
        "ready": len(ready),
        "engine_units": round(demand.engine_units, 3),
        "rate_units": None if demand.rate_units is None else round(demand.rate_units, 3),
        "queue_total": demand.queue_total,
        "engine_queue": demand.engine_queue,
        "token_rate": demand.token_rate,
        "ttft_p95_s": demand.ttft_p95_s,
        "slo_ttft_s": demand.slo_ttft_s,
        "slo_ttft_source": demand.slo_ttft_source,
        **edge_signal_fields(edge, demand),
        "stable_need": reactive.stable,
        "panic_need": reactive.panic,
        "panic": in_panic,
        "need_units": round(need, 3),
        "predicted_need": replicas_for(predicted),
        "forecast_peak_tok_s": None if forecast is None else round(forecast.peak, 1),
        "prewarm_horizon_s": round(horizon, 1),
        "capacity_tok_s": None if capacity is None else round(capacity, 1),
        "capacity_scale": round(scale, 3),
        # whose hysteresis holds scale-downs: the fleet's (surplus kept warm as spares) or the policy's
        "warm_surplus": spec.warm_surplus,
        "scale_down_hold_s": config.scale_down_hold_s,
        "backlog_drain_units": round(drain, 3),
        "acted_on": acted_on(demand, reactive, predicted, breach, max(panic_units, float(reactive.queue_step)),
                             in_panic, need, drain),
    }
    decision = Decision(target, tuple(reasons), signals)
    return decision, new_state
