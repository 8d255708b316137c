"""Pool kinds (warm floor, scale-to-zero) and the predictive pre-warm."""

from __future__ import annotations

import math

from controlplane.autoscaler import AutoscalerConfig, AutoscalerState, PoolObservation, decide
from controlplane.autoscaler.forecast import forecast_peak, seasonal_rise, slope

from .conftest import Driver, make_replica, make_spec, pool_at


def test_scale_to_zero_after_idle_timeout_and_back_on_activation():
    spec = make_spec(kind="scale_to_zero", min_replicas=1, idle_timeout_s=600.0)
    driver = Driver(spec)
    one_idle = pool_at(1, 0.0)
    # Still inside the idle timeout: the replica stays.
    early = driver.tick(PoolObservation(now=500.0, replicas=one_idle, last_request_at=0.0))
    assert early.target_replicas == 1
    # Past the timeout with nothing running: drain to zero.
    late = driver.tick(PoolObservation(now=601.0, replicas=one_idle, last_request_at=0.0))
    assert late.target_replicas == 0
    assert any("scale to zero" in r for r in late.reasons)
    # At zero, nothing happens until the edge asks for activation...
    quiet = driver.tick(PoolObservation(now=900.0, replicas=(), last_request_at=0.0))
    assert quiet.target_replicas == 0
    # ...and then one replica starts at once.
    woken = driver.tick(PoolObservation(now=905.0, replicas=(), last_request_at=904.0, activation_requested=True))
    assert woken.target_replicas == 1
    assert any("activation" in r for r in woken.reasons)


def test_scale_to_zero_waits_for_in_flight_work():
    spec = make_spec(kind="scale_to_zero", idle_timeout_s=60.0)
    busy = (make_replica(0, running=3),)
    decision, _ = decide(spec, PoolObservation(now=1000.0, replicas=busy, last_request_at=0.0), AutoscalerState())
    assert decision.target_replicas >= 1


def test_warm_pool_keeps_its_floor_when_idle():
    spec = make_spec(kind="warm", min_replicas=2)
    driver = Driver(spec)
    decision = None
    for k in range(200):
        decision = driver.tick(PoolObservation(now=5.0 * k, replicas=pool_at(2, 0.0), last_request_at=None))
    assert decision.target_replicas == 2
    assert not driver.changes()


def _daily_history(now: float, ramp_at: float, low: float, high: float, days: int = 1, step: float = 60.0):
    """Token rate that is flat at ``low`` and ramps to ``high`` over 10 minutes at ``ramp_at``
    seconds after each midnight; ``now`` is just before today's ramp."""
    points = []
    t = now - days * 86400 - 3600
    while t <= now:
        into_day = t % 86400
        if into_day < ramp_at:
            v = low
        else:
            v = low + (high - low) * min(1.0, (into_day - ramp_at) / 600)
        points.append((t, v))
        t += step
    return points


def test_forecast_sees_yesterdays_ramp_coming():
    ramp_at = 9 * 3600
    now = 86400 + ramp_at - 200
    history = _daily_history(now, ramp_at, 1000, 9000)
    rise = seasonal_rise(history, now, 400, 86400, 120)
    assert rise is not None and rise > 1500  # 200 s into a 10-minute ramp, smoothed over 2 min
    flat = forecast_peak(history, now, 400)
    assert flat.level == 1000 and flat.peak > 2000
    # Without a season of history the same flat present forecasts no rise.
    short = [(t, v) for t, v in history if t > now - 3600]
    assert forecast_peak(short, now, 400).peak == 1000


def test_trend_extrapolates_a_ramp_in_progress():
    history = [(float(t), 100.0 + 2.0 * t) for t in range(0, 900, 15)]
    assert math.isclose(slope(history), 2.0)
    forecast = forecast_peak(history, 885.0, 300.0)
    assert forecast.peak > forecast.level + 200


def test_prewarm_before_a_predictable_ramp_by_p90_ready_time():
    """Yesterday's ramp at 09:00 makes today's pool grow before 09:00 by at least the p90
    model-ready time, while the current load alone would not scale."""
    ready_times = tuple(float(x) for x in range(100, 300, 10))  # p90 = 272 s
    p90 = 272.0
    capacity = 1000.0  # tok/s per replica
    ramp_at = 9 * 3600
    spec = make_spec(max_replicas=40, replica_tokens_per_s=capacity)
    config = AutoscalerConfig()
    driver = Driver(spec, config)
    first_add_at = None
    start = 86400 + ramp_at - 900
    for k in range(0, 900, 5):
        now = start + k
        history = _daily_history(now, ramp_at, 1800, 9000)
        obs = PoolObservation(now=now, replicas=pool_at(2, 0.6), token_rate_history=history,
                              model_ready_seconds=ready_times)
        decision = driver.tick(obs)
        if decision.target_replicas > 2 and first_add_at is None:
            first_add_at = now
            assert any("pre-warm" in r for r in decision.reasons)
    assert first_add_at is not None
    assert (86400 + ramp_at) - first_add_at >= p90
    # With the same present and no history, nothing would have been added that early.
    cold = Driver(spec, config)
    obs = PoolObservation(now=start, replicas=pool_at(2, 0.6), model_ready_seconds=ready_times)
    assert cold.tick(obs).target_replicas == 2


def test_warm_pool_shrinks_back_to_its_floor_once_the_load_is_gone():
    """The floor is not demand: with the scale-down headroom a floor of 1 counted as need
    rounded up to 2, so a warm pool grown to 2 stayed there even with nothing to serve."""
    config = AutoscalerConfig()
    driver = Driver(make_spec(kind="warm", min_replicas=1, max_replicas=4), config)
    for k in range(20):  # busy: two replicas' worth
        driver.tick(PoolObservation(now=5.0 * k, replicas=pool_at(2, 0.8), last_request_at=5.0 * k))
    assert driver.state.target == 2
    drained_at = decision = None
    for k in range(20, 200):  # idle from here on
        decision = driver.tick(PoolObservation(now=5.0 * k, replicas=pool_at(2, 0.0), last_request_at=95.0))
        if decision.target_replicas < 2:
            drained_at = 5.0 * k
            break
    assert drained_at is not None, decision.reasons
    assert drained_at - 100.0 >= config.scale_down_hold_s - config.decision_interval_s
    assert decision.target_replicas == 1
    assert any(r.startswith("scale down") for r in decision.reasons), decision.reasons
