"""The benchmark's pool simulation on a short trace: it must account for every request and
GPU-second, and the policies must behave as their rules say."""

from __future__ import annotations

from functools import partial

import pytest

from bench.autoscale.engine import ReplicaProfile
from bench.autoscale.simulate import PolicyRunner, PoolSimulation, follow_target, single_replica_p95
from bench.autoscale.trace import TraceShape, make_trace, poisson_trace
from controlplane.autoscaler import AutoscalerConfig, AutoscalerState, PoolSpec, ReplicaSignal, decide
from controlplane.autoscaler.baselines import (
    SkyServeConfig,
    SkyServeState,
    StaticConfig,
    skyserve_decide,
    static_decide,
)

PROFILE = ReplicaProfile()  # llama-3.1-70b fp8 on 2 x H100, timed by dataplane.sim.timing
SHAPE = TraceShape(hours=1.0, peak_rps=6.0, trough_rps=4.0, first_traffic_s=300.0, launch_ramp_s=300.0, bursts=1)


@pytest.fixture(scope="module")
def trace():
    return make_trace(SHAPE, seed=3)


def _spec(**changes) -> PoolSpec:
    base = dict(pool_id="bench", kind="scale_to_zero", min_replicas=1, max_replicas=16, ttft_slo_s=2.0,
                idle_timeout_s=900.0, gpus_per_replica=2, replica_tokens_per_s=3.5 * 2000)
    base.update(changes)
    return PoolSpec(**base)


def test_single_replica_ttft_grows_with_load():
    light, _ = single_replica_p95(poisson_trace(SHAPE, 1.0, 600, 1), PROFILE)
    heavy, _ = single_replica_p95(poisson_trace(SHAPE, 6.0, 600, 1), PROFILE)
    assert 0 < light < 2.0
    assert heavy > 10 * light  # past the replica's capacity the queue, not prefill, sets TTFT


def test_static_pool_serves_everything_without_cold_waits_after_warmup(trace):
    sim = PoolSimulation(trace, PROFILE, _spec(), seed=1)
    result = sim.run(PolicyRunner("static", partial(static_decide, config=StaticConfig(3)), None, 60.0))
    assert result.requests == len(trace)
    assert result.cold_start_waits == 0  # traffic starts after the 3 replicas are ready
    assert sum(v is not None for v in sim.ttft) == len(trace)  # every request got its first token
    assert result.gpu_hours == pytest.approx(3 * 2 * SHAPE.hours, rel=1e-3)  # launched at the first tick
    assert result.scale_events == 1


def test_policies_on_the_same_trace(trace):
    ours = PoolSimulation(trace, PROFILE, _spec(), seed=1).run(
        PolicyRunner("ours", partial(decide, config=AutoscalerConfig()), AutoscalerState(), 5.0))
    sky_config = SkyServeConfig(target_qps_per_replica=3.5)
    sky = PoolSimulation(trace, PROFILE, _spec(min_replicas=0), seed=1).run(
        PolicyRunner("skyserve", partial(skyserve_decide, config=sky_config), SkyServeState(), 20.0))
    for result in (ours, sky):
        assert result.requests == len(trace)
        # The first requests of a new model wait on a cold start, whoever scales.
        assert result.cold_start_waits > 0
        assert 0 < result.gpu_hours < 16 * 2 * SHAPE.hours
    # Nothing runs before the first request: no GPU-hours for the quiet first 5 minutes.
    assert ours.timeline[0][1] == 0 and sky.timeline[0][1] == 0
    # SkyServe waits 300 s of agreeing decisions before scaling past its first replica.
    first_growth = [t for t, d in sky.decisions if d.target_replicas > 1]
    assert not first_growth or first_growth[0] >= SHAPE.first_traffic_s + 300
    assert ours.slo_attainment >= sky.slo_attainment


def _replica(rid: str, state: str, running: int = 0, started_at: float = 0.0) -> ReplicaSignal:
    return ReplicaSignal(replica_id=rid, node_id=rid, state=state, spot=False, num_running_reqs=running,
                         max_running_requests=100, started_at=started_at)


def test_the_fleet_stand_in_follows_the_target():
    pool = (_replica("busy", "ready", 80), _replica("idle", "ready", 5), _replica("old", "starting", started_at=1.0),
            _replica("new", "starting", started_at=2.0), _replica("gone", "draining"))
    assert follow_target(pool, 6) == (2, [])  # a draining replica is not capacity
    assert follow_target(pool, 4) == (0, [])
    # Surplus: starting replicas first (the newest first), then the least loaded ready one.
    assert follow_target(pool, 3) == (0, ["new"])
    assert follow_target(pool, 1) == (0, ["new", "old", "idle"])
    # A target of zero stops everything that still counts.
    assert follow_target(pool, 0) == (0, ["new", "old", "idle", "busy"])
