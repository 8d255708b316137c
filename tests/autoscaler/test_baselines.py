"""The SkyServe-style rule follows SkyServe's documented delays; static stays put."""

from __future__ import annotations

from controlplane.autoscaler import PoolObservation
from controlplane.autoscaler.baselines import (
    SkyServeConfig,
    SkyServeState,
    StaticConfig,
    skyserve_decide,
    static_decide,
)

from .conftest import make_spec, pool_at

CONFIG = SkyServeConfig(target_qps_per_replica=2.0)


def _history(now: float, rps: float) -> list[tuple[float, float]]:
    return [(now - 60 + 5 * k, rps) for k in range(1, 13)]


def _run(spec, state, start: float, seconds: float, rps: float, replicas: int):
    """Evaluate every 20 s; return the time of the first target change and the state."""
    t = start
    while t < start + seconds:
        decision, new_state = skyserve_decide(
            spec, PoolObservation(now=t, replicas=pool_at(replicas, 0.5), request_rate_history=_history(t, rps)),
            state, CONFIG)
        if new_state.target != state.target and state.target is not None:
            return t, new_state, decision
        state = new_state
        t += CONFIG.decision_interval_s
    return None, state, None


def test_skyserve_scales_up_after_300s_and_down_after_1200s():
    spec = make_spec(min_replicas=1, max_replicas=10)
    state = SkyServeState(target=2)
    # 9 req/s at 2 per replica wants 5 replicas: only after 15 agreeing evaluations (300 s).
    changed_at, state, decision = _run(spec, state, 0.0, 1000.0, 9.0, 2)
    assert changed_at == 280.0  # the 15th evaluation, counting from t=0
    assert state.target == 5 and decision.target_replicas == 5
    # Load drops to 1 req/s: down to 1 only after 60 agreeing evaluations (1200 s).
    changed_at, state, decision = _run(spec, state, 2000.0, 3000.0, 1.0, 5)
    assert changed_at == 2000.0 + 1180.0
    assert state.target == 1 and decision.target_replicas == 1


def test_skyserve_scales_from_zero_at_once():
    spec = make_spec(min_replicas=0, max_replicas=10)
    decision, state = skyserve_decide(
        spec, PoolObservation(now=0.0, request_rate_history=_history(0.0, 3.0)), SkyServeState(target=0), CONFIG)
    assert state.target == 2 and decision.target_replicas == 2


def test_skyserve_state_round_trips():
    state = SkyServeState(target=3, upscale_counter=4)
    assert SkyServeState.from_json(state.to_json()) == state


def test_static_pool_keeps_its_size():
    spec = make_spec(max_replicas=10)
    decision, _ = static_decide(spec, PoolObservation(now=0.0, replicas=pool_at(2, 0.1)), None, StaticConfig(4))
    assert decision.target_replicas == 4
