"""Tuning knobs of the policy, with the reasons for their defaults."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class AutoscalerConfig:
    # Share of a replica's batch slots / KV pool we plan to use (the profiled token throughput
    # is already "at the SLO", so the rate signal plans for all of it, times the learned scale).
    engine_target_utilization: float = 0.85
    # SLO feedback on the profiled capacity: one replica's worth less on a breach of a pool
    # that looked big enough; slow growth (per tick) while p95 TTFT stays under
    # ``capacity_scale_slack`` × SLO at the planned load. The ceiling is what pooling behind
    # the edge's balancer gave in the simulator: 6 replicas at 1.1× their single-replica SLO
    # rate still kept 98.8% of requests inside the SLO; at 1.15× only 88%.
    capacity_scale_up_step: float = 0.0003
    capacity_scale_slack: float = 0.5
    capacity_scale_min: float = 0.5
    capacity_scale_max: float = 1.1
    # Below 1.0 (after a breach) the scale returns to the profile with this half-life while
    # the SLO holds (``policy.tune_capacity_scale``), doubled for every further cut within the
    # memory window: one breach is likely noise, a breach every hour says the profile is high.
    capacity_scale_recovery_half_life_s: float = 1800.0
    capacity_scale_breach_memory_s: float = 6 * 3600.0
    # Knative KPA windows: the stable window sizes the pool, the panic window catches bursts.
    stable_window_s: float = 60.0
    panic_window_s: float = 10.0
    # Panic when the panic window asks for this multiple of the ready replicas (KPA: 2.0)...
    panic_threshold: float = 2.0
    # ...or when queued requests per ready replica exceed this (queues lead TTFT for LLMs).
    panic_queue_per_replica: float = 8.0
    # After the last panic signal, never scale down for this long.
    panic_hold_s: float = 60.0
    # A burst is over once the need has come back down this share of the way from the burst's
    # level to the one before it; then its samples leave the scale-down hold. One that has not
    # come back within ``burst_max_s`` was a new level, not a burst: it is held as any other.
    burst_end_fraction: float = 0.75
    burst_max_s: float = 1800.0
    # Scale down only to the highest need seen over this window (hysteresis: an oscillating
    # load near a threshold keeps the higher count instead of flapping).
    scale_down_hold_s: float = 300.0
    # A replica that was just added is not drained before this long (it cost a cold start).
    scale_down_cooldown_s: float = 300.0
    # Headroom over the need when growing, and kept when shrinking: a rising load is met in
    # fewer steps, and the band between the two thresholds stops flapping.
    scale_up_headroom: float = 0.1
    # No headroom in panic: the panic step is already sized by the newest sample when it is above the
    # window's mean, plus what drains the burst's backlog within a cold start, and it is sized
    # anew every tick, so a burst still rising gets the next step at once. Headroom on top
    # bought replicas that landed minutes later, after the burst had been measured (bench/fleet,
    # 8 fleet days: 1.218x -> 1.203x the clairvoyant bound at equal SLO, 7 of 8 days cheaper).
    panic_headroom: float = 0.0
    # A scale-down keeps twice the scale-up's headroom: the band between the two thresholds is
    # what stops a flap (a scale-down undone within 10 minutes). At 0.1, a shrink left the pool
    # 10 % above the peak of its hold window, inside the load's own minute-to-minute noise and
    # any small burst's reach (bench/autoscale, 5 day-trace and 4 mix-trace days: 12 flaps; at
    # 0.2: 2, for 0-8 % more GPU-hours).
    scale_down_headroom: float = 0.2
    # Give back at least this share of the pool per scale-down, so a slow decline does not
    # turn into one scale event per replica.
    scale_down_min_fraction: float = 0.2
    # Grow by at least this share of the target when scaling up.
    scale_up_min_fraction: float = 0.0
    # Pre-warm horizon = this quantile of the measured model-ready times (+ one tick).
    prewarm_quantile: float = 0.9
    default_model_ready_s: float = 120.0
    decision_interval_s: float = 5.0
    # Forecast: how far back the recent level and trend look.
    forecast_level_window_s: float = 120.0
    forecast_trend_window_s: float = 900.0
    # A slope is extrapolated by at most this share of the level: the slope of a step (a
    # burst that just began) says nothing about the next minutes.
    forecast_trend_cap: float = 0.25
    season_s: float = 86400.0
    # The window the engines' TTFT p95 covers (Prometheus range of the executor's query).
    ttft_window_s: float = 60.0
    # SLO feedback: while TTFT breaches the SLO, add a replica at most this often.
    slo_breach_step_interval_s: float | None = None  # None: the pool's p90 model-ready time
    # The edges' client-side TTFT p90 replaces the engines' p95 in the SLO feedback once this
    # many streamed first tokens back it (fewer: a p90 of a handful of requests is noise).
    edge_ttft_min_samples: int = 20
    # Where the fleet keeps a scale-down's surplus replicas warm as spares on GPUs that stay billed
    # (``PoolSpec.warm_surplus``, ``controlplane.fleet.spares``). The hold window, the minimum step
    # and the headroom above exist so that a scale-down does not throw away a warm replica the next
    # minutes need. There a scale-down throws away nothing: the replica keeps serving as a spare
    # until placement or consolidation wants its GPUs, and consolidation's settle window is what
    # gives GPUs back. So the policy follows demand closely, holding a scale-down about one cold
    # start on a new VM (boot plus a model load) and adding no headroom of its own: spares are the
    # headroom. bench/fleet measured it with spares: 1-8 % less $ a day, 1.26-1.30x the clairvoyant
    # bound at equal SLO attainment where it was 1.30-1.37x (bench/fleet/README.md).
    warm_surplus_scale_down_hold_s: float = 180.0
    warm_surplus_scale_down_cooldown_s: float = 180.0
    warm_surplus_scale_down_min_fraction: float = 0.0
    warm_surplus_headroom: float = 0.0

    def for_warm_surplus(self) -> AutoscalerConfig:
        """This config as it applies to a pool whose scale-downs keep their replicas warm."""
        return replace(self, scale_down_hold_s=self.warm_surplus_scale_down_hold_s,
                       scale_down_cooldown_s=self.warm_surplus_scale_down_cooldown_s,
                       scale_down_min_fraction=self.warm_surplus_scale_down_min_fraction,
                       scale_up_headroom=self.warm_surplus_headroom, scale_down_headroom=self.warm_surplus_headroom)
