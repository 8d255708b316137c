"""Pools whose scale-down surplus the fleet keeps warm as spares (``PoolSpec.warm_surplus``,
``controlplane.fleet.spares``): the policy follows demand closely, since a scale-down there gives
up no warm capacity; elsewhere its hysteresis is unchanged."""

from __future__ import annotations

from dataclasses import replace

from controlplane.autoscaler import AutoscalerConfig, AutoscalerState, PoolObservation, decide
from tests.autoscaler.conftest import Driver, MiniPool, make_spec, pool_at


def falling(warm: bool) -> tuple[float, int]:
    """Load falls from 8.5 to 2.5 replicas' worth of batch slots: when the first replica goes
    (seconds after the drop) and how many are left."""
    driver = Driver(make_spec(max_replicas=40, warm_surplus=warm))
    pool = MiniPool(driver, replicas=10, ready_s=60.0, step_s=5.0)
    for _ in range(120):
        pool.step(load_slots=850)
    drop_at, first = pool.now, None
    for _ in range(240):
        pool.step(load_slots=250)
        if pool.stopped and first is None:
            first = pool.now - pool.step_s - drop_at
    assert first is not None
    return first, pool.active_count()


def test_warm_surplus_follows_a_fall_after_one_cold_start_on_a_new_vm_with_no_headroom():
    config = AutoscalerConfig()
    warm_first, warm_left = falling(True)
    cold_first, cold_left = falling(False)
    assert config.warm_surplus_scale_down_hold_s - config.decision_interval_s <= warm_first < cold_first
    assert cold_first >= config.scale_down_hold_s - config.decision_interval_s
    assert warm_left == 3  # ceil(250 / 85): no headroom, the spares are the headroom
    assert cold_left == 4  # ceil(250 / 85 * 1.1)


def test_warm_surplus_gives_back_what_the_minimum_step_and_headroom_would_hold():
    # 10 replicas, the hold window's peak is 8 replicas' worth: with its 20 % headroom the default
    # keeps all ten; a pool whose surplus stays warm gives two back.
    state = AutoscalerState(target=10, need_samples=tuple((float(t), 8.0) for t in range(-600, 0, 5)),
                            demand_samples=tuple((float(t), 8.0) for t in range(-60, 0, 5)))
    obs = PoolObservation(now=0.0, replicas=pool_at(10, 0.8 * 0.85))
    held, _ = decide(make_spec(max_replicas=40), obs, state)
    shrunk, _ = decide(make_spec(max_replicas=40, warm_surplus=True), obs, state)
    assert held.target_replicas == 10 and any(r.startswith("hold: peak need") for r in held.reasons)
    assert shrunk.target_replicas == 8


def test_the_warm_surplus_config_changes_only_the_hysteresis():
    config = AutoscalerConfig()
    warm = config.for_warm_surplus()
    assert (warm.scale_down_hold_s, warm.scale_down_cooldown_s, warm.scale_down_min_fraction,
            warm.scale_up_headroom, warm.scale_down_headroom) == (180.0, 180.0, 0.0, 0.0, 0.0)
    same = replace(warm, scale_down_hold_s=config.scale_down_hold_s,
                   scale_down_cooldown_s=config.scale_down_cooldown_s,
                   scale_down_min_fraction=config.scale_down_min_fraction,
                   scale_up_headroom=config.scale_up_headroom, scale_down_headroom=config.scale_down_headroom)
    assert same == config  # panic, windows, forecast, SLO feedback: as they were
