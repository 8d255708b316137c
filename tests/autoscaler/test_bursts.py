"""A burst: the step that answers it, the backlog behind it, and what is left once it has passed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.autoscaler import AutoscalerConfig, AutoscalerState, PoolObservation, decide
from controlplane.autoscaler.policy import Demand, reactive_need
from controlplane.autoscaler.signals import EdgeSignals
from tests.autoscaler.conftest import Driver, MiniPool, make_replica, make_spec

CONFIG = AutoscalerConfig()


def queued_demand(ready: int, queue: int) -> Demand:
    return Demand(engine_units=0.0, rate_units=1.0, load_per_replica=1.0 / ready, queue_total=queue, ready=ready,
                  token_rate=1000.0, ttft_p95_s=None)


def test_a_queue_that_is_not_draining_asks_for_one_more_replica():
    """Three replicas ready on both ticks, and the queue still grew: the rate signal misses
    demand (a throttled GPU, longer outputs than profiled)."""
    need = reactive_need([(0.0, 1.0)], 0.0, queued_demand(3, 400), CONFIG, previous_queue=300, previous_ready=3)
    assert need.queue_step == 4 and need.panic == 4
    assert need.panic_units == 1.0  # the window's demand stays what it measured
    assert need.panic_mode


def test_the_queue_rules_one_more_replica_is_one_even_with_headroom():
    """The rule asks for a count (ready + 1), which the panic headroom used to turn into ready + 2
    or more on every tick it fired."""
    spec = make_spec(replica_tokens_per_s=1000.0, max_replicas=40)
    state = AutoscalerState(target=3, last_queue_total=300, last_ready=3)
    obs = PoolObservation(now=0.0, replicas=tuple(make_replica(i, running=100, queue=140) for i in range(3)),
                          token_rate_history=((0.0, 1000.0),), request_rate_history=((0.0, 1.0),),
                          model_ready_seconds=(1000.0,) * 5)
    decision, _ = decide(spec, obs, state, replace(CONFIG, panic_headroom=0.5))
    assert decision.signals["panic_need"] == 4
    assert decision.target_replicas == 4


def test_a_queue_that_grew_while_replicas_came_up_is_not_judged_on_them():
    """Two replicas ready a tick ago, three now: the new one has not served a tick, so a queue
    that grew meanwhile says nothing about the rate. The rule used to ask for ready + 1 here, the
    moment a burst's replicas arrived (bench/fleet: a pool at 3.85 replicas' worth went to 9)."""
    need = reactive_need([(0.0, 1.0)], 0.0, queued_demand(3, 400), CONFIG, previous_queue=300, previous_ready=2)
    assert need.panic_units == 1.0


def burst_observation(queue_per_replica: int) -> PoolObservation:
    """Two ready replicas of 1000 tok/s, 4000 tok/s arriving (4 replicas' worth: a panic) at
    4 req/s (1000 tokens a request), cold starts of 55 s (pre-warm horizon 60 s)."""
    return PoolObservation(now=0.0, replicas=tuple(make_replica(i, running=100, queue=queue_per_replica)
                                                   for i in range(2)),
                           token_rate_history=((0.0, 4000.0),), request_rate_history=((0.0, 4.0),),
                           model_ready_seconds=(55.0,) * 5)


def test_a_bursts_backlog_is_drained_within_one_cold_start():
    spec = make_spec(replica_tokens_per_s=1000.0, max_replicas=40)
    plain, _ = decide(spec, burst_observation(0), AutoscalerState(), CONFIG)
    backlog, state = decide(spec, burst_observation(300), AutoscalerState(), CONFIG)
    # 600 queued requests of 1000 tokens, drained in 60 s by replicas of 1000 tok/s: 10 more.
    assert backlog.signals["backlog_drain_units"] == pytest.approx(10.0)
    assert plain.signals["backlog_drain_units"] == 0.0
    assert backlog.signals["need_units"] == pytest.approx(14.0)
    assert backlog.target_replicas == 14  # no headroom in panic: the step is sized anew every tick
    assert plain.target_replicas == 4
    assert "backlog_drain" in backlog.signals["acted_on"]
    assert any("drains them within 60s" in r for r in backlog.reasons)
    # The scale-down hold remembers the demand (4 replicas' worth), not the backlog: once
    # drained, it is gone for good.
    assert state.need_samples[-1][1] == pytest.approx(4.0)


def test_the_edges_backlog_is_not_drained_twice():
    """Requests the edges hold are in the demand already (``Demand.backlog_units``)."""
    spec = make_spec(replica_tokens_per_s=1000.0, max_replicas=40)
    obs = burst_observation(0)
    edge = EdgeSignals(edges=1, queue_depth=600, activation_waiting=0, inflight=200, queue_wait_p50_s=3.0,
                       queue_wait_p90_s=5.0, ttft_p90_s=None, ttft_samples=0, rejections={}, window_s=30.0)
    decision, _ = decide(spec, replace(obs, edge=edge), AutoscalerState(), CONFIG)
    assert decision.signals["backlog_drain_units"] == 0.0
    assert decision.signals["edge_backlog_units"] > 0


def scale_steps(targets: list[tuple[float, int]], *, up: bool) -> list[tuple[float, int]]:
    """The (time, new target) of each scale-up (``up``) or scale-down in ``targets``."""
    return [(t, n) for (t, n), (_, before) in zip(targets[1:], targets, strict=False)
            if (n > before if up else n < before)]


def run_burst(burst_s: float) -> tuple[MiniPool, list[tuple[float, int]]]:
    """A pool at 2 replicas' worth, a 3× step for ``burst_s``, then back to 2 for 15 minutes.
    Returns the pool and its targets over time."""
    driver = Driver(make_spec(replica_tokens_per_s=1000.0, max_replicas=40), CONFIG)
    pool = MiniPool(driver, replicas=3, ready_s=60.0)
    targets = []
    end = 600.0 + burst_s + 900.0
    while pool.now < end:
        t = pool.now
        rate = 6000.0 if 600.0 <= t < 600.0 + burst_s else 2000.0
        decision = pool.step(rate / 1000.0 * 50, token_rate_history=((t, rate),))
        targets.append((t, decision.target_replicas))
    return pool, targets


def test_after_a_burst_the_pool_shrinks_to_what_is_left_without_a_staircase():
    """The burst's peak is not held for another hold window once its panic is over: the pool
    goes back to the demand after it (2 replicas' worth, 3 with headroom) as the stable
    window's mean comes down (one or two ticks' scale-downs), not down a staircase of the hold
    window's sliding peak over the next five minutes."""
    _, targets = run_burst(120.0)
    peak = max(n for _, n in targets)
    assert peak >= 7  # the burst was answered
    after = [(t, n) for t, n in targets if t >= 720.0]
    downs = scale_steps(after, up=False)
    t_down = downs[0][0]
    assert downs[-1][1] == 3 and downs[-1][0] - t_down <= CONFIG.stable_window_s, downs
    # Right after the scale-up's cooldown; holding the burst's peak a full hold window after the
    # panic ended (60 s past its last signal) would have kept it until later.
    last_up = scale_steps(targets, up=True)[-1][0]
    assert t_down <= last_up + CONFIG.scale_down_cooldown_s + CONFIG.decision_interval_s


def test_a_burst_that_outlasts_its_panic_keeps_its_replicas():
    """The panic ends a minute after its last signal, while the burst's load may go on: what the
    pool serves now still holds the target, so nothing shrinks under it."""
    _, targets = run_burst(900.0)
    during = [n for t, n in targets if 600.0 + 240.0 <= t < 600.0 + 900.0]
    assert min(during) >= 6  # 6 replicas' worth of load throughout


def test_the_scale_down_hold_does_not_remember_the_forecast():
    """A forecast is made afresh every tick: a rise it still expects is in this tick's need,
    one it no longer expects is not held for a hold window."""
    spec = make_spec(replica_tokens_per_s=1000.0, max_replicas=40)
    history = tuple((float(t), 1000.0 + 4.0 * t) for t in range(0, 901, 10))  # a steady climb
    obs = PoolObservation(now=900.0, replicas=tuple(make_replica(i, running=60) for i in range(5)),
                          token_rate_history=history, model_ready_seconds=(115.0,) * 5)
    decision, state = decide(spec, obs, AutoscalerState(), CONFIG)
    assert "forecast" in decision.signals["acted_on"]
    assert state.need_samples[-1][1] < decision.signals["need_units"]


def test_a_burst_that_outlasts_its_panic_goes_once_it_is_over():
    """Ten minutes of 3× load: the panic ended long before the burst did, so the burst's level
    was held as any load. Once the need is back near where it was, the burst's samples leave the
    hold and the forecast's history: the pool sheds the burst's replicas about one stable window
    after its end, instead of holding its level a hold window more (and the forecast's level
    window longer still). The sample that saw the end (the stable window's mean on its way down,
    2.85 replicas' worth: 4 with the scale-down headroom) is held like any load, so the last
    replica above the load after it (3) goes a hold window later."""
    burst_s = 600.0
    _, targets = run_burst(burst_s)
    end = 600.0 + burst_s
    assert min(n for t, n in targets if end - 120.0 <= t < end) >= 6  # held while it lasted
    after = [(t, n) for t, n in targets if t >= end - 5.0]
    downs = scale_steps(after, up=False)
    t_down, n_down = downs[0]
    assert n_down <= 4 and downs[-1][1] == 3, downs
    assert t_down - end <= CONFIG.stable_window_s + 4 * CONFIG.decision_interval_s
    assert t_down - end < CONFIG.scale_down_hold_s  # the hold window would have kept it this long


def test_replicas_added_for_a_burst_that_is_over_skip_the_cooldown():
    """The cooldown protects a replica that cost a cold start from the next dip; a burst that is
    over is no dip."""
    from controlplane.autoscaler.policy import apply_hysteresis

    samples = [(float(t), 2.0) for t in range(0, 400, 5)]
    cooling = AutoscalerState(target=8, last_scale_up_at=350.0, burst_since=100.0, burst_base=2.0)
    kept, why = apply_hysteresis(2.0, 2.0, 8, samples, 400.0, cooling, False, CONFIG)
    assert kept == 8 and "cooling down" in why
    over = replace(cooling, burst_ended_at=380.0)
    shrunk, why = apply_hysteresis(2.0, 2.0, 8, samples, 400.0, over, False, CONFIG)
    assert shrunk == 3 and why.startswith("scale down")
    # a scale-up after the burst ended is for something else: its cooldown holds
    later = replace(over, last_scale_up_at=390.0)
    assert apply_hysteresis(2.0, 2.0, 8, samples, 400.0, later, False, CONFIG)[0] == 8


def test_a_burst_that_never_comes_back_down_is_a_new_level():
    from controlplane.autoscaler.bursts import track_burst

    state = AutoscalerState(burst_since=0.0, burst_base=2.0)
    samples = [(float(t), 6.0) for t in range(0, 1700, 5)]
    assert track_burst(state, 1700.0, False, False, 6.0, samples, CONFIG) == (0.0, 2.0, None)  # still up
    assert track_burst(state, 1700.0, False, False, 2.5, samples, CONFIG) == (0.0, 2.0, 1700.0)  # back near 2
    assert track_burst(state, CONFIG.burst_max_s + 1.0, False, False, 6.0, samples, CONFIG) == (None, None, None)
    # a panic inside an open burst does not start another: its base stays the level before it
    assert track_burst(state, 900.0, True, True, 6.0, samples, CONFIG) == (0.0, 2.0, None)


def test_the_forecast_leaves_out_a_burst_that_is_over():
    from controlplane.autoscaler.policy import predictive_need

    history = tuple((float(t), 6000.0 if 300 <= t < 900 else 2000.0) for t in range(0, 961, 10))
    obs = PoolObservation(now=960.0, replicas=tuple(make_replica(i, running=60) for i in range(6)),
                          token_rate_history=history, model_ready_seconds=(55.0,) * 5)
    during, _ = predictive_need(obs, 1000.0, 60.0, CONFIG, AutoscalerState(burst_since=300.0, burst_base=2.0))
    after, _ = predictive_need(obs, 1000.0, 60.0, CONFIG,
                               AutoscalerState(burst_since=300.0, burst_base=2.0, burst_ended_at=930.0))
    assert during > 3.0  # the 120-s level window still averages the burst in
    assert after == pytest.approx(2.0)
