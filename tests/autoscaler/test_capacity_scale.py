"""The learned capacity scale: a breach cuts it, and while the SLO holds it returns to the
profile instead of keeping the pool over-sized for the rest of the day."""

from __future__ import annotations

from controlplane.autoscaler import AutoscalerConfig, AutoscalerState, PoolObservation, decide

from .conftest import make_spec, pool_at

SLO = 2.0
PROFILE = 1000.0  # tok/s one replica serves at the SLO


def run(scale: float, ttft: float, seconds: float, *, rate: float = 3000.0, replicas: int = 4,
        config: AutoscalerConfig | None = None, cuts: tuple[float, ...] = ()) -> list[tuple[float, float, int]]:
    """(t, capacity scale, target) every 5 s for a pool whose load and TTFT stay as given."""
    spec = make_spec(ttft_slo_s=SLO, replica_tokens_per_s=PROFILE)
    state = AutoscalerState(capacity_scale=scale, target=replicas, capacity_cuts=cuts)
    seen = []
    t = 0.0
    while t <= seconds:
        obs = PoolObservation(now=t, replicas=pool_at(replicas, 0.6, ttft=ttft),
                              token_rate_history=[(t, rate)])
        decision, state = decide(spec, obs, state, config)
        seen.append((t, state.capacity_scale, decision.target_replicas))
        t += 5.0
    return seen


def test_a_cut_scale_returns_to_the_profile_while_the_slo_holds():
    # After a breach cut the scale to 0.6, TTFT sits inside the SLO (but above half of it, so the
    # slow growth above the profile never applies): the scale comes back with a 30-min half-life.
    # (The scale-down keeps the scale-up's 10 % here: the pool's size is what is watched, and the
    # default's wider band would hold 6 replicas against the 5 that 3.4 replicas' worth rounds to.)
    config = AutoscalerConfig(scale_down_headroom=AutoscalerConfig().scale_up_headroom)
    seen = run(0.6, ttft=1.6, seconds=3600.0, config=config)
    at = {round(t): s for t, s, _ in seen}
    assert 0.78 <= at[1800] <= 0.82  # half of the 0.4 gap is gone after one half-life
    assert at[3600] >= 0.88
    # ... and the pool's size follows: 3 replicas' worth at 0.6 asked for 5 (6 with the
    # scale-up headroom), at ~0.9 for 4.
    assert seen[0][2] >= 5
    assert seen[-1][2] <= 4


def test_no_recovery_while_the_slo_is_breached():
    seen = run(0.6, ttft=2.6, seconds=600.0)
    assert max(s for _, s, _ in seen) <= 0.6  # breaches only ever cut


def test_recovery_half_life_is_a_setting():
    fast = run(0.6, ttft=1.6, seconds=600.0, config=AutoscalerConfig(capacity_scale_recovery_half_life_s=300.0))
    assert fast[-1][1] >= 0.88
    slow = run(0.6, ttft=1.6, seconds=600.0)
    assert slow[-1][1] < 0.7


def test_repeated_cuts_slow_the_return():
    # Two cuts in the last hours: the profile looks high, so the half-life doubles (60 min).
    seen = run(0.6, ttft=1.6, seconds=1800.0, cuts=(-3600.0, -600.0))
    assert 0.70 <= seen[-1][1] <= 0.73  # 0.6 + 0.4 * (1 - 2 ** -0.5)
    # Cuts older than the memory window (6 h) no longer count.
    seen = run(0.6, ttft=1.6, seconds=1800.0, cuts=(-30000.0, -25000.0))
    assert seen[-1][1] >= 0.78


def test_a_breach_records_its_cut():
    spec = make_spec(ttft_slo_s=SLO, replica_tokens_per_s=PROFILE)
    obs = PoolObservation(now=100.0, replicas=pool_at(4, 0.6, ttft=3.0), token_rate_history=[(100.0, 3000.0)])
    decision, state = decide(spec, obs, AutoscalerState(target=4))
    assert decision.target_replicas > 4
    assert state.capacity_scale < 1.0 and state.capacity_cuts == (100.0,)
    assert AutoscalerState.from_json(state.to_json()) == state


def test_a_breach_adds_one_replica_not_one_plus_headroom():
    """The breach's step is a count (ready + 1): the scale-up headroom goes on measured demand, and
    on this step it used to make two."""
    spec = make_spec(ttft_slo_s=SLO, replica_tokens_per_s=PROFILE)
    obs = PoolObservation(now=100.0, replicas=pool_at(4, 0.6, ttft=3.0), token_rate_history=[(100.0, 3000.0)])
    decision, _ = decide(spec, obs, AutoscalerState(target=4), AutoscalerConfig(scale_up_headroom=0.3))
    assert decision.target_replicas == 5


def test_a_breach_behind_a_backlog_does_not_cut_the_scale():
    """TTFT over a window in which a queue is worked off (a cold start's, a burst's) is the queue's,
    not evidence that a replica serves less than its profile: the pool still gets its step."""
    spec = make_spec(ttft_slo_s=SLO, replica_tokens_per_s=PROFILE)
    queued = pool_at(2, 0.6, ttft=30.0, queue=200)
    obs = PoolObservation(now=100.0, replicas=queued, token_rate_history=[(100.0, 1500.0)])
    decision, state = decide(spec, obs, AutoscalerState(target=2))
    assert decision.target_replicas == 3
    assert state.capacity_scale == 1.0 and state.capacity_cuts == ()
