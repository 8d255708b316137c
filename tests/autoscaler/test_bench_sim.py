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


# -- the simulated edge: per-replica cap, queue, signals


SMALL = ReplicaProfile(max_running_requests=4)  # a cap that binds at a few req/s


def _static(n: int) -> PolicyRunner:
    return PolicyRunner("static", partial(static_decide, config=StaticConfig(n)), None, 60.0)


def test_the_edge_caps_each_replica_at_its_batch_slots_and_queues_the_rest():
    shape = TraceShape(hours=0.5, peak_rps=0.7, trough_rps=0.7, first_traffic_s=200.0, launch_ramp_s=1.0,
                       launch_surge=0.0, bursts=0)
    trace = make_trace(shape, seed=5)
    sim = PoolSimulation(trace, SMALL, _spec(), seed=1)
    seen = []
    original = sim.observe

    def watch(now, with_edge):
        observation = original(now, with_edge)
        seen.append(max((r.num_running_reqs + r.num_queue_reqs for r in observation.replicas), default=0))
        return observation

    sim.observe = watch
    result = sim.run(_static(1))
    assert max(seen) <= SMALL.max_running_requests  # the engine never holds more than its slots
    assert result.edge_queued > 0 and result.edge_queue_peak > 0  # the excess waited at the edge
    # Client-side TTFT includes the edge's queue; the engine's own TTFT does not.
    assert result.ttft_p95_s > result.engine_ttft_p95_s
    served = [k for k in range(len(trace)) if sim.ttft[k] is not None]
    assert len(served) > 0.9 * len(trace)
    for k in served:
        a = trace.arrivals[k]
        assert sim.edge.dispatched[k] >= a and a + sim.ttft[k] >= sim.edge.dispatched[k]


def test_only_our_policy_reads_the_edge_and_its_decisions_cite_the_backlog():
    shape = TraceShape(hours=0.5, peak_rps=6.0, trough_rps=6.0, first_traffic_s=0.0, launch_ramp_s=1.0,
                       launch_surge=0.0, bursts=0)
    trace = make_trace(shape, seed=2)
    spec = _spec(replica_tokens_per_s=3.5 * trace.mean_tokens())
    seen: list = []

    def spy(spec, obs, state):
        seen.append(obs.edge)
        return decide(spec, obs, state, AutoscalerConfig())

    result = PoolSimulation(trace, SMALL, spec, seed=1).run(PolicyRunner("ours", spy, AutoscalerState(), 5.0,
                                                                         edge_signals=True))
    edges = [e for e in seen if e is not None]
    assert edges and max(e.waiting for e in edges) > 0
    assert any(e.ttft_samples >= 20 and e.ttft_p90_s is not None for e in edges)
    assert any("edge_queue" in d.signals["acted_on"] for _, d in result.decisions)
    sky = []
    PoolSimulation(trace, SMALL, _spec(min_replicas=0), seed=1).run(PolicyRunner(
        "skyserve", lambda s, o, st: (sky.append(o.edge), skyserve_decide(s, o, st, SkyServeConfig(3.5)))[1],
        SkyServeState(), 20.0))
    assert sky and all(e is None for e in sky)  # SkyServe's rule sees the request rate only


def test_flaps_are_scale_downs_undone_within_ten_minutes():
    from bench.autoscale.simulate import count_flaps

    events = [(0.0, 2, 0), (100.0, 0, 1), (500.0, 1, 0), (2000.0, 0, 1), (2700.0, 1, 0)]
    assert count_flaps(events) == 1  # 100 -> 500 is one; 2000 -> 2700 is more than 600 s


def test_mix_trace_holds_the_rate_flat_while_prompts_and_outputs_move():
    import numpy as np

    from bench.autoscale.trace import mix_factors, mix_shape

    shape = mix_shape(hours=24.0, rps=2.0)
    trace = make_trace(shape, seed=1)
    arrivals = np.array(trace.arrivals)
    prompts, outputs = np.array(trace.prompts), np.array(trace.outputs)
    hour = (arrivals // 3600).astype(int)
    per_hour = np.bincount(hour, minlength=24)[1:]  # the first hour ramps in
    assert per_hour.max() < 1.25 * per_hour.min()
    business, night, base = (hour >= 10) & (hour < 17), (hour >= 23) | (hour < 5), (hour >= 7) & (hour < 8)
    assert np.median(prompts[business]) > 2.5 * np.median(prompts[base])
    assert np.median(outputs[night]) > 3 * np.median(outputs[base])
    assert np.median(outputs[business]) < 1.3 * np.median(outputs[base])
    assert mix_factors(shape, 12 * 3600.0) == (3.0, 1.0) and mix_factors(shape, 2 * 3600.0) == (1.0, 4.0)


def test_frontier_interpolation_and_ramps():
    import numpy as np

    from bench.autoscale.simulate import RampWindow, score_ramps
    from bench.autoscale.sizing import frontier, interpolate, ramp_windows

    points = [(0.80, 100.0), (0.95, 150.0), (0.90, 160.0), (0.99, 300.0)]
    assert frontier(points) == [(0.80, 100.0), (0.95, 150.0), (0.99, 300.0)]  # (0.90, 160) is beaten
    assert interpolate(points, 0.97) == pytest.approx(225.0)
    assert interpolate(points, 0.999) is None  # no extrapolation

    shape = TraceShape(hours=2.0, peak_rps=4.0, trough_rps=4.0, first_traffic_s=0.0, launch_ramp_s=1.0,
                       launch_surge=0.0, bursts=0)
    need = np.array([1] * 3600 + [3] * 3600)
    ramps = ramp_windows(shape, [], need, settle_s=600.0)
    assert [(r.at, r.need) for r in ramps] == [(3600.0, 3)]
    trace = make_trace(shape, seed=1)
    sim = PoolSimulation(trace, PROFILE, _spec(), seed=1)
    sim.run(_static(4))
    (outcome,) = score_ramps(sim, [RampWindow(3600.0, 3, 3300.0, 4200.0)], need)
    assert outcome.warm and outcome.lead_s is not None and outcome.lead_s > 0
    (short,) = score_ramps(sim, [RampWindow(3600.0, 9, 3300.0, 4200.0)], [9] * 7200)
    assert short.lead_s is None  # four replicas never make nine


def test_capacity_follows_the_mix_and_the_schedule_follows_the_need():
    import numpy as np

    from bench.autoscale.sizing import capacity_curve, mix_grid, need_series, operator_schedule
    from bench.autoscale.trace import mix_shape
    from controlplane.autoscaler import schedule

    shape = mix_shape(hours=24.0, rps=10.0)
    # A made-up calibration (QPS falls as the mix factor grows) is enough to check the curve.
    grid = {f: 4.0 / (f[0] * f[1]) for f in mix_grid(shape)}
    qps = capacity_curve(shape, grid)
    assert qps(np.array([7.5 * 3600]))[0] == pytest.approx(4.0)  # base mix
    assert qps(np.array([13 * 3600]))[0] == pytest.approx(4.0 / 3)  # prompts x3
    assert qps(np.array([2 * 3600]))[0] == pytest.approx(1.0)  # outputs x4
    need = need_series(shape, [], qps, predictable=True)
    assert need[int(7.5 * 3600)] == 3 and need[13 * 3600] == 8 and need[2 * 3600] == 10
    windows = schedule.parse(operator_schedule(need, max_replicas=9))
    assert len(windows) == 24 and max(w.min_replicas for w in windows) == 9  # capped at max_replicas
    noon = next(w for w in windows if w.start_min == 12 * 60)
    assert noon.min_replicas == 8 and noon.end_min == 13 * 60


def test_the_mix_profile_promises_no_point_of_the_mix_more_than_its_calibration():
    """Capacity inside the SLO is convex in the prompt (prefill's share of TTFT grows with it);
    a least-squares line through it overstates the long-prompt end, where the pool must not be
    sized short. The fitted profile is the line scaled down to touch the calibrations from below."""
    from bench.autoscale.sizing import fit_token_profile, grid_shapes, grid_tokens
    from bench.autoscale.trace import mix_shape
    from controlplane.autoscaler.signals import weighted_tokens

    shapes = grid_shapes(mix_shape(hours=24.0))
    # seconds per request: convex in the prompt factor, linear in the output factor
    calibrated = {(p, o): 1 / (0.1 * p**1.5 + 0.12 * o) for (p, o), _ in shapes}
    tokens_per_s, weight = fit_token_profile(shapes, calibrated)
    assert weight > 1.0  # a generated token costs more than a prompt token
    ratios = [tokens_per_s / weighted_tokens(prompt, output, weight) / calibrated[factors]
              for (factors, _), (prompt, output) in zip(shapes, grid_tokens(shapes), strict=True)]
    assert max(ratios) == pytest.approx(1.0)  # touches the calibration where the line was highest
    assert min(ratios) < 0.9  # and understates elsewhere, which the capacity scale grows back
