"""bench/fleet/diagnose.py: the burst split and the GPU-hour accounting the README's diagnoses
quote, checked on cases small enough to work out by hand (no calibration, no simulated day)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.autoscale.trace import Burst
from bench.fleet import sim
from bench.fleet.diagnose import SAMPLE_S, Tracer, burst_labels, cost_by_phase
from bench.fleet.fluid import PoolQueue
from bench.fleet.load import PoolLoad, phase_of
from bench.fleet.models import Load, Variant
from bench.fleet.profiles import Capacity
from controlplane.fleet.capacity import Offer

LOADS = (0.2, 0.6, 1.0)
HOUR = SAMPLE_S / 3600


def capacity() -> Capacity:
    return Capacity(pool_id="p", gpu_type="h100", qps=1.0, tokens_per_s=1000.0, output_tokens_per_s=200.0,
                    model_ready_s=40.0, kv_capacity_tokens=100_000, max_running=64, loads=LOADS,
                    within=(1.0, 0.99, 0.96), p95_ttft=(0.3, 0.8, 2.0), p50_ttft=(0.2, 0.4, 1.0),
                    in_flight=(1.0, 3.0, 8.0))


def variant() -> Variant:
    return Variant(pool_id="p", model="llama-3.1-8b", quantization=None, gpus=1, gpu_types=("h100",),
                   gpu_memory_gb=80, kind="warm", load=Load(peak_rps=10, trough_rps=2, bursts=2))


def test_each_burst_is_counted_apart_and_an_overlap_counts_once():
    pool = PoolLoad(variant(), [Burst(2000.0, 100.0, 2.0), Burst(1000.0, 300.0, 2.5), Burst(1200.0, 300.0, 2.0)], [])
    label = burst_labels(pool)
    assert [label(t) for t in (999.0, 1000.0, 1250.0, 1450.0, 1500.0, 2050.0, 9000.0)] == [
        "steady", "burst 0", "burst 0", "burst 1", "after-burst", "burst 2", "steady"]
    q = PoolQueue(2.0, phase_of=label)
    for k in range(100, 110):  # 10 steps inside the first burst, one replica at 0.6 load
        q.step(k * 10.0, 10.0, 6, [(1, capacity())])
    assert q.requests_by_phase["burst 0"] == q.requests == 60
    assert "burst 1" not in q.requests_by_phase


def test_a_minute_of_gpus_splits_into_held_idle_and_what_whole_nodes_leave_over():
    fleet = sim.Fleet(0.0, 3600.0)
    fleet.checkpoints["p"] = sim.checkpoint_of(variant())
    p5 = Offer("aws", "us-east-1", "p5.48xlarge", "h100", 8, 80, False, 55.04, ("us-east-1a",))
    g6e = Offer("aws", "us-east-1", "g6e.12xlarge", "l40s", 4, 48, False, 10.49, ("us-east-1a",))
    node = fleet.launch(p5, None, 0.0)
    regular = fleet.place("p", node, (0, 1), capacity(), 0.0)
    regular.state = "ready"
    spare = fleet.place("p", node, (2,), capacity(), 0.0)
    spare.state, spare.spare = "ready", True
    fleet.place("p", node, (3,), capacity(), 0.0)  # still loading
    ended = fleet.place("p", node, (4,), capacity(), 0.0)
    ended.state = "ended"  # gone: its GPU is idle
    fleet.launch(g6e, None, 0.0)  # an empty node: all idle, and no replica to round up for

    tracer = Tracer(SimpleNamespace(fleet=fleet), {})
    tracer._sample(0.0)
    gpu = tracer.gpu
    assert gpu.billed["h100"] == pytest.approx(8 * HOUR) and gpu.billed["l40s"] == pytest.approx(4 * HOUR)
    assert gpu.held[("h100", "regular")] == pytest.approx(2 * HOUR)
    assert gpu.held[("h100", "spare")] == pytest.approx(1 * HOUR)
    assert gpu.held[("h100", "loading")] == pytest.approx(1 * HOUR)
    assert gpu.idle("h100") == pytest.approx(4 * HOUR) and gpu.idle("l40s") == pytest.approx(4 * HOUR)
    # whole p5s for the 3 GPUs of regular and loading replicas leave 5 over; the spare's GPU is one of them
    assert gpu.floor["h100"] == pytest.approx(5 * HOUR) and gpu.floor["l40s"] == 0
    assert gpu.regular_by_pool == {"p@h100": pytest.approx(2 * HOUR)}
    # the minute's bill: both nodes, whatever they hold
    assert tracer.minute_cost == {0: pytest.approx((55.04 + 10.49) * HOUR)}


def test_each_minute_is_priced_against_the_bound_under_its_most_disruptive_phase():
    first = PoolLoad(variant(), [Burst(120.0, 60.0, 2.0)], [])  # a burst in minute 2
    second = PoolLoad(variant(), [Burst(600.0, 60.0, 2.0)], [])  # one in minute 10
    ours = {m: 10.0 + m for m in range(12)}
    bound = [8.0] * 11  # the bound's plan ends a minute earlier: minute 11 is not priced
    split = cost_by_phase(ours, bound, [phase_of(first, after_s=120.0), phase_of(second, after_s=120.0)])
    # minute 2: first's burst; 3-4: after it; 10: second's burst; the rest steady
    assert split["burst"] == (2, pytest.approx(12.0 + 20.0), pytest.approx(16.0))
    assert split["after-burst"] == (2, pytest.approx(13.0 + 14.0), pytest.approx(16.0))
    steady = [0, 1, 5, 6, 7, 8, 9]
    assert split["steady"] == (7, pytest.approx(sum(10.0 + m for m in steady)), pytest.approx(8.0 * 7))
