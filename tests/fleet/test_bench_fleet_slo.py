"""bench/fleet's SLO accounting: misses by the load's phase, and the bound's own attainment.

These are the numbers behind the bench's "at equal SLO" line, so each piece is checked on a
case small enough to work out by hand."""

from __future__ import annotations

import numpy as np

from bench.autoscale.trace import Burst
from bench.fleet import clairvoyant
from bench.fleet.fluid import PoolQueue
from bench.fleet.load import PoolLoad, phase_of
from bench.fleet.models import Load, Variant
from bench.fleet.profiles import Capacity
from bench.fleet.run import equal_slo_bound, slo_by_phase

LOADS = (0.2, 0.6, 1.0)


def capacity(qps: float = 1.0) -> Capacity:
    return Capacity(pool_id="p", gpu_type="h100", qps=qps, tokens_per_s=qps * 1000, output_tokens_per_s=qps * 200,
                    model_ready_s=40.0, kv_capacity_tokens=100_000, max_running=64, loads=LOADS,
                    within=(1.0, 0.99, 0.96), p95_ttft=(0.3, 0.8, 2.0), p50_ttft=(0.2, 0.4, 1.0),
                    in_flight=(1.0, 3.0, 8.0))


def variant(load: Load) -> Variant:
    return Variant(pool_id="p", model="llama-3.1-8b", quantization=None, gpus=1, gpu_types=("h100",),
                   gpu_memory_gb=80, kind="warm", load=load)


def test_phase_of_tells_a_burst_from_its_aftermath_and_the_steady_day():
    pool = PoolLoad(variant(Load(peak_rps=10, trough_rps=2, bursts=1)), [Burst(1000.0, 300.0, 2.5)], [])
    phase = phase_of(pool, after_s=600.0)
    assert [phase(t) for t in (999.0, 1000.0, 1299.0, 1300.0, 1899.0, 1900.0)] == [
        "steady", "burst", "burst", "after-burst", "after-burst", "steady"]
    tail = PoolLoad(variant(Load(episodes=(1, 2))), [], [])
    assert phase_of(tail)(5.0) == "episode"


def test_the_queue_splits_requests_and_hits_by_phase_and_the_split_adds_up():
    q = PoolQueue(2.0, phase_of=lambda t: "burst" if t >= 100 else "steady")
    servers = [(1, capacity(1.0))]
    for k in range(10):  # steady: 0.6 req/s on a 1 req/s replica, no backlog
        q.step(k * 10.0, 10.0, 6, servers)
    for k in range(10, 20):  # burst: 3 req/s, a backlog that grows past the SLO
        q.step(k * 10.0, 10.0, 30, servers)
    q.close()
    split = slo_by_phase([q])
    assert split["steady"]["requests"] == 60 and split["burst"]["requests"] == 300
    assert sum(d["requests"] for d in split.values()) == q.requests
    assert abs(sum(d["within"] for d in split.values()) - q.within) < 1e-6
    assert split["steady"]["attainment"] > 0.98  # the calibration's 99 % at u = 0.6
    # Served deadline-first, as the edge serves its queue, a burst of three times the capacity
    # keeps about a third of its requests inside the SLO (in arrival order, all but the first
    # few seconds' would miss: each waits as long as the one before it did).
    assert 0.3 < split["burst"]["attainment"] < 0.34


def test_requests_past_their_deadline_are_served_after_the_others_and_stay_out_of_the_gauge():
    q = PoolQueue(2.0)
    servers = [(1, capacity(1.0))]
    q.step(0.0, 10.0, 30, servers)  # 3 req/s on a 1 req/s replica for 10 s: 20 left waiting
    assert q.backlog == 20
    within_before = q.within
    q.step(10.0, 10.0, 5, servers)  # 0.5 req/s: the newcomers go ahead of the late backlog
    assert q.backlog == 20 + 5 - 10  # work-conserving: the replica still served 10
    assert q.within - within_before >= 0.98 * 5  # every newcomer inside the SLO (in arrival order: none)
    # The gauge holds only what was served by its deadline: the late ones restate a backlog the
    # queue depth already reports.
    assert q.ttft_p95(20.0, min_requests=1) <= 2.0
    q.close()
    assert q.dropped == 15  # what still waits at the end is a miss, not lost from the count


def test_the_bound_replayed_through_the_queue_gets_more_within_the_slo_with_more_replicas():
    caps = {"p": {"h100": capacity(1.0)}}
    arrivals = {"p": np.full(12, 9)}  # 0.9 req/s for two minutes, steps of 10 s
    thin = clairvoyant.Bound(plan=[(0, 12, {("p", "h100"): 1})])
    wide = clairvoyant.Bound(plan=[(0, 12, {("p", "h100"): 2})])
    v = {"p": variant(Load(peak_rps=1))}
    q_thin = clairvoyant.attainment(thin, arrivals, 10.0, 0.0, v, caps)["p"]
    q_wide = clairvoyant.attainment(wide, arrivals, 10.0, 0.0, v, caps)["p"]
    assert q_thin.requests == q_wide.requests == 108
    assert q_wide.within / q_wide.requests > q_thin.within / q_thin.requests


def test_the_bound_at_equal_slo_is_interpolated_between_bracketing_factors_and_never_extrapolated():
    bounds = [{"demand_factor": 1.0, "cost": 100.0, "slo_attainment": 0.90},
              {"demand_factor": 1.1, "cost": 120.0, "slo_attainment": 0.98}]
    eq = equal_slo_bound(bounds, 0.94)
    assert abs(eq["cost"] - 110.0) < 1e-9 and abs(eq["demand_factor"] - 1.05) < 1e-9
    assert equal_slo_bound(bounds, 0.99) is None
    assert equal_slo_bound(bounds, 0.85) is None
